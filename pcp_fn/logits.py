"""Logits indices: which row of the restored hidden states each request samples from."""

from __future__ import annotations

import torch

from .hybrid import hybrid_logits
from .layout import RequestGeometry, state_geometry
from .state import PCPState


def logits_from_geometry(geo: RequestGeometry, num_reqs: torch.Tensor, rows: int) -> torch.Tensor:
    """``[rows]`` int64: last real token of each request in the padded order, 0 past ``num_reqs``."""
    last = (geo.padded_start[:-1] + geo.num_scheduled - 1).clamp(min=0)
    real = torch.arange(last.shape[0], device=last.device) < num_reqs
    return torch.where(real, last, 0)[:rows]


def get_logits_indices(state: PCPState, num_reqs: int | None = None) -> tuple[PCPState, torch.Tensor]:
    """``[num_reqs]`` int64 rows of ``restore_hidden_states`` to take logits from.

    Seed ``get_logits_indices``: ``cumsum(pcp_tokens) * P - num_pads - 1``, i.e.
    the last real token of each request in the padded order (rank 0's copy for
    a decode). ``P = 2``, tokens ``[1, 5, 8]`` -> ``[0, 6, 17]``.

    With ``config.hybrid_attn``: the seed's ``tokens_original`` form,
    ``cumsum(n + (P - 1) * is_decode) - 1`` over the original scheduled tokens,
    rows of the FA-order hidden states that :func:`pcp_fn.restore_hidden_states`
    returns. ``P = 2``, tokens ``[1, 1, 3, 5]`` (two decodes) -> ``[1, 3, 6, 11]``.
    With speculative tokens configured the FA order's decodes are rank-major,
    and for several decodes this formula (kept from the seed) does not land on
    the request's own row; the runner samples those through
    :func:`pcp_fn.adjust_cu_num_scheduled_tokens` instead.

    Args:
        num_reqs: static output length (the bucket's request rows); default
            ``max_num_reqs``. Rows past the batch's requests hold 0, and a
            request with no scheduled token (nothing to sample) is clamped to 0.
    """
    cfg = state.config
    rows = cfg.max_num_reqs if num_reqs is None else num_reqs
    if cfg.hybrid_attn:
        return state, hybrid_logits(state.num_scheduled, state.is_decode, state.num_reqs, cfg.pcp_size, rows)
    return state, logits_from_geometry(state_geometry(state), state.num_reqs, rows)
