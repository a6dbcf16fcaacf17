"""Putting the all-gathered hidden states back in request order."""

from __future__ import annotations

import torch

from .hybrid import state_enter_fa_restore_index
from .layout import gathered_order, state_geometry
from .state import PCPState


def restore_hidden_states(state: PCPState, gathered: torch.Tensor) -> tuple[PCPState, torch.Tensor]:
    """Reorder all-gathered hidden states into the padded request order.

    Args:
        gathered: ``[P * L_b, ...]``, the P ranks' fixed-size ``[L_b, ...]``
            local buffers stacked rank-major (what ``all_gather`` of the local
            buffer yields).

    Returns ``[P * L_b, ...]``; rows ``[:P * num_tokens]`` equal the seed's
    ``get_restore_hidden_states`` row for row (so logits indices index it), the
    rest repeat row 0.

    With ``config.hybrid_attn`` each rank's buffer holds its linear rows
    (``layout.num_tokens`` of them, decodes first) and anything after them.
    The seed pads every rank's rows to ``max_num_tokens_across_pcp`` (``M``)
    before the all-gather; here the fixed ``[L_b]`` buffer already is that
    padding (``L_b >= M``), so rank ``q``'s row ``l`` is read at ``q * L_b + l``
    instead of ``q * M + l``. The result is in the compact FA order (decode
    rows, then prefill tokens in scheduler order): rows ``[:enter_fa_len]``
    equal the seed's restored rows, the rest repeat row 0.
    """
    P = state.config.pcp_size
    if gathered.dim() < 1 or gathered.shape[0] % P:
        raise ValueError(
            f"gathered must stack {P} equal rank buffers along dim 0, got shape {tuple(gathered.shape)}"
        )
    if state.config.hybrid_attn:
        index = state_enter_fa_restore_index(state, gathered.shape[0] // P)
    else:
        index = gathered_order(state_geometry(state), P, gathered.shape[0] // P).restore_index
    return state, gathered.index_select(0, index)
