"""The rank, static or as data, in one place.

A state's rank is either `None` (the static `config.pcp_rank`: each rank
traces its own graph) or a 0-d int64 tensor leaf (rank as data: every rank
traces the identical graph, and `torch.func.vmap` maps over it):

    state = init_state(cfg, rank=0)                       # rank as data
    state, out = all_ranks(pcp_fn.step, state, batch, slots)
    out.positions                                         # [P, L_b]: row r is rank r's

Ops never read a tensor rank on the host; they select with [`select_rank`][pcp_fn.core.rank.select_rank].
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

import torch


def rank_leaf(pcp_size: int, rank: object, device: torch.device) -> torch.Tensor | None:
    """Validate `rank` (host boundary) and return the state's rank leaf.

    `None` keeps the rank static. An int, a numpy integer or a 0-d integer
    tensor must lie in `[0, pcp_size)`; a tensor is read once here, at
    `init_state` (never inside an op), and must not be a meta tensor.
    """
    if rank is None:
        return None
    if isinstance(rank, torch.Tensor):
        if rank.dim() != 0:
            raise ValueError(f"rank must be a 0-d tensor or an int, got shape {tuple(rank.shape)}")
        if rank.dtype.is_floating_point or rank.dtype.is_complex or rank.dtype == torch.bool:
            raise TypeError(f"rank must be an integer tensor, got dtype {rank.dtype}")
        if rank.device.type == "meta":
            raise ValueError("rank is a meta tensor: init_state needs its value to check it")
        value = int(rank.item())  # host boundary: checked once, never inside an op
    elif isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError(f"rank must be an int or a 0-d integer tensor, got {type(rank).__name__} {rank!r}")
    else:
        value = int(rank)
    if not 0 <= value < pcp_size:
        raise ValueError(f"rank must be in [0, pcp_size={pcp_size}), got {value}")
    return torch.tensor(value, dtype=torch.int64, device=device)


def select_rank(table: torch.Tensor, rank: int | torch.Tensor, dim: int = 0) -> torch.Tensor:
    """`table.select(dim, rank)` for a static rank or a 0-d tensor one.

    Indexing by a 0-d tensor would read it on the host (`.item()`), so a
    tensor rank goes through `index_select`.
    """
    if isinstance(rank, int):
        return table.select(dim, rank)
    return table.index_select(dim, rank.reshape(1)).squeeze(dim)


def all_ranks(fn: Callable[..., Any], state: Any, *args: Any) -> Any:
    """`fn(state_for_rank_r, *args)` for every rank `r`, stacked on a new leading dim.

    `state` is any layout state with a `config` and a `rank` field (its
    own rank is ignored).
    """
    ranks = torch.arange(state.config.pcp_size, dtype=torch.int64, device=_device_of(state))
    return torch.func.vmap(lambda r: fn(dataclasses.replace(state, rank=r), *args))(ranks)


def _device_of(state: Any) -> torch.device:
    leaves = [x for x in torch.utils._pytree.tree_leaves(state) if isinstance(x, torch.Tensor)]
    return leaves[0].device if leaves else torch.device("cpu")
