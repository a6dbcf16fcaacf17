"""Rank as data: compute every rank's view of a step in one call.

With the rank a 0-d tensor leaf of the state (``init_state(cfg, rank=0)``),
every rank traces the identical graph, and ``torch.func.vmap`` over the rank
gives all ``P`` ranks' outputs at once (each leaf gains a leading ``[P]`` dim)::

    state, out = all_ranks(pcp_fn.step, init_state(cfg, rank=0), batch, slots)
    out.positions          # [P, L_b]: row r is rank r's positions
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .state import PCPState


def all_ranks(fn: Callable[..., Any], state: PCPState, *args: Any) -> Any:
    """``fn(state_for_rank_r, *args)`` for every rank ``r``, stacked on a new leading dim."""
    ranks = torch.arange(state.config.pcp_size, dtype=torch.int64, device=state.device)
    return torch.func.vmap(lambda r: fn(dataclasses.replace(state, rank=r), *args))(ranks)
