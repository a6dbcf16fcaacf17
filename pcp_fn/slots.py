"""Paged-KV slot mapping for the gathered, padded token order."""

from __future__ import annotations

import torch

from .layout import gathered_order, state_geometry
from .ragged import masked_gather
from .state import PCPState


def padded_slot_mapping(
    state: PCPState, slot_mapping: torch.Tensor, num_tokens: int | None = None
) -> tuple[PCPState, torch.Tensor]:
    """Spread the scheduler-order slot mapping over the padded gathered rows.

    Seed ``get_padded_slot_mapping``: a ``[P * num_tokens]`` buffer filled with
    ``pad_slot_id`` whose real rows (``unpad_mask``) take ``slot_mapping`` in
    order. Decode rows are token-strided: decode token ``t``'s slot is at row
    ``t * P``. ``P = 2``, tokens ``[1, 5, 8]``, slots ``s0 .. s13``::

        [s0, -1, s1, s2, s3, s4, s5, -1, -1, -1, s6, ..., s13]

    Args:
        slot_mapping: ``[S]`` slots of the batch's tokens in scheduler order
            (the first ``sum(num_scheduled)`` entries are read; any ``S >= 1``).
        num_tokens: static local rows per rank of the output (the bucket's
            ``L_b``, the seed's ``num_tokens_padded``); default ``L``.

    Returns ``[P * num_tokens]`` in ``slot_mapping``'s dtype.

    With ``config.hybrid_attn`` the KV cache is written in the DualChunkSwap
    order of the FA layers, so the result is the same (the seed's hybrid
    branch fills ``sum(num_scheduled_tokens_padded) * P`` rows by the same mask).
    """
    cfg = state.config
    rows_per_rank = cfg.max_local_tokens if num_tokens is None else num_tokens
    order = gathered_order(state_geometry(state), cfg.pcp_size, rows_per_rank)
    return state, masked_gather(slot_mapping, order.token, order.unpad_mask, cfg.pad_slot_id)
