"""The hybrid layout's consumer ops: logits rows, the FA-entry restore, spec-decode re-alignment.

They read the record of the state's last update (``PCPState``) at its bucket's
sizes, like the DualChunkSwap ones in :mod:`pcp_fn.dcs.layout`.
"""

from __future__ import annotations

import torch

from ..dcs.config import PCPConfig
from ..dcs.layout import RequestGeometry
from ..dcs.state import PCPState
from .layout import enter_fa_restore_index, linear_split


def logits_from_geometry(config: PCPConfig, geo: RequestGeometry, num_reqs: torch.Tensor) -> torch.Tensor:
    """``[R_b]`` int64: ``cumsum(n + (P-1)*decode) - 1``.

    vllm-ascend ``PCPManager.get_logits_indices`` with ``tokens_original``:
    rows of the FA-order restored hidden states. Each decode counts ``P - 1``
    extra rows even when it has no token (as vllm-ascend counts them). 0 past
    ``num_reqs``; a leading request with no token is clamped to 0. ``P = 2``,
    tokens ``[1, 1, 3, 5]`` (two decodes) -> ``[1, 3, 6, 11]``.
    """
    rows = geo.num_scheduled + torch.where(geo.replicated, config.pcp_size - 1, 0)
    last = (torch.cumsum(rows, 0) - 1).clamp(min=0)
    real = torch.arange(rows.shape[0], device=rows.device) < num_reqs
    return torch.where(real, last, 0)


def restore_index(state: PCPState) -> torch.Tensor:
    """``[P*L_b]`` int64: the state's ``enter_fa_restore_idx`` (rank-independent)."""
    cfg, Rb = state.config, state.bucket.num_reqs
    split = linear_split(cfg.pcp_size, state.num_scheduled[:Rb], state.is_decode[:Rb], 0)
    return enter_fa_restore_index(split, cfg.pcp_size, state.bucket.num_tokens, cfg.num_spec_tokens > 0)


def adjust_cu_num_scheduled_tokens(
    state: PCPState, cu_num_scheduled_tokens: torch.Tensor
) -> tuple[PCPState, torch.Tensor]:
    """Re-align cumulative scheduled tokens to the FA-order restored rows.

    vllm-ascend ``adjust_cu_num_scheduled_tokens_for_pcp``.

    For spec-decode logits indices under the hybrid layout. Decode rows are
    returned unchanged; prefill request ``i`` ends at
    ``P * cu[num_decode_reqs - 1] + (prefill tokens up to i)``, which is the
    vllm-ascend's ``(cu[D-1] + cumsum(pcp_tokens)) * P - cumsum(pads)``. ``P = 2``,
    tokens ``[1, 1, 3, 5]`` (two decodes), ``cu [1, 2, 5, 10]`` -> ``[1, 2, 7, 12]``.

    Args:
        cu_num_scheduled_tokens: ``[R_b]`` cumulative tokens of the requests of
            the state's last update (its bucket's request rows), as the runner
            has them. Rows past ``num_reqs`` are returned unchanged.

    Returns ``[R_b]`` in the input's dtype.
    """
    cu = cu_num_scheduled_tokens
    k = state.bucket.num_reqs
    if cu.dim() != 1 or cu.shape[0] != k:
        raise ValueError(
            f"cu_num_scheduled_tokens must be [{k}] (the state's bucket request rows), "
            f"got shape {tuple(cu.shape)}"
        )
    P = state.config.pcp_size
    n = state.num_scheduled[:k].to(torch.int64)
    dec = state.is_decode[:k]
    prefill = ~dec & (torch.arange(k, device=cu.device) < state.num_reqs)
    num_dec = state.is_decode.sum()
    last_decode = (num_dec - 1).clamp(min=0, max=k - 1).reshape(1)
    base = torch.where(num_dec > 0, cu.index_select(0, last_decode)[0].to(torch.int64), 0)
    adjusted = P * base + torch.cumsum(torch.where(prefill, n, 0), 0)
    return state, torch.where(prefill, adjusted, cu.to(torch.int64)).to(cu.dtype)
