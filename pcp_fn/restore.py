"""Putting the all-gathered hidden states back in request order."""

from __future__ import annotations

import torch

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
    """
    P = state.config.pcp_size
    if gathered.dim() < 1 or gathered.shape[0] % P:
        raise ValueError(
            f"gathered must stack {P} equal rank buffers along dim 0, got shape {tuple(gathered.shape)}"
        )
    index = gathered_order(state_geometry(state), P, gathered.shape[0] // P).restore_index
    return state, gathered.index_select(0, index)
