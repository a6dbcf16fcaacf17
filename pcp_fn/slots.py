"""Paged-KV slot mapping for the gathered, padded token order."""

from __future__ import annotations

import torch

from .core.ragged import masked_gather
from .protocol.batch import check_token_input
from .protocol.layout import layout_of
from .protocol.state import PCPState, check_state


def padded_slot_mapping(state: PCPState, slot_mapping: torch.Tensor) -> tuple[PCPState, torch.Tensor]:
    """Spread the scheduler-order slot mapping over the padded gathered rows.

    vllm-ascend `PCPManager.get_padded_slot_mapping`: a `[P * L_b]` buffer
    filled with `pad_slot_id` whose real rows (`unpad_mask`) take
    `slot_mapping` in order. Decode rows are token-strided: decode token
    `t`'s slot is at row `t * P`. `P = 2`, tokens `[1, 5, 8]`, slots
    `s0 .. s13`:

        [s0, -1, s1, s2, s3, s4, s5, -1, -1, -1, s6, ..., s13]

    Args:
        slot_mapping: `[F_b]` slots of the batch's tokens in scheduler order,
            padded to the bucket's token rows (`SchedulerBatch.pad_tokens` /
            `make_batch(..., slot_mapping=...)` pad it on the host).

    Returns `[P * L_b]` in `slot_mapping`'s dtype.

    With `config.hybrid_attn` the KV cache is written in the DualChunkSwap
    order of the FA layers, so the result is the same (vllm-ascend's hybrid
    branch fills `sum(num_scheduled_tokens_padded) * P` rows by the same mask).
    Any other layout: its [`pcp_fn.Layout.gathered_order`][pcp_fn.Layout] (`"mrv2"` and a
    [`pcp_fn.PartitionLayout`][]: token `t`'s slot at row `t`).
    """
    check_state(state, "padded_slot_mapping")
    check_token_input("slot_mapping", slot_mapping, state.config, state.bucket, state.device)
    order = layout_of(state.config).gathered_order(state)  # the rows the layout writes to the KV cache
    return state, masked_gather(slot_mapping, order.token, order.unpad_mask, state.config.pad_slot_id)
