"""`step`: the whole PCP bookkeeping of one model step as one pure function.

    state, out = step(state, batch, slot_mapping)
    # forward: embed input ids at out.positions, write K/V through out.slot_mapping,
    # all-gather hidden states, restore with out.layout.restore_index, sample at
    # out.logits_indices.

It composes update_tokens -> absolute positions -> logits indices -> padded
slot mapping; every output shape derives from `(state.config, batch.bucket)`,
so `torch.compile(step, fullgraph=True, dynamic=False)` makes one graph per
bucket and `pcp_fn.graph.capture(step, ...)` one CUDA/ACL graph per bucket.
"""

from __future__ import annotations

import torch

from .core.entry import entry_op
from .core.pytree import pytree_dataclass
from .core.ragged import masked_gather
from .protocol.batch import SchedulerBatch, check_token_input
from .protocol.layout import layout_of
from .protocol.rows import LayoutUpdate, TokenLayout
from .protocol.state import PCPState, check_batch


@pytree_dataclass
class StepOutputs:
    """Everything a model runner needs for the forward of one rank.

    Sizes: `R_b`, `L_b` from the batch's bucket, `G_b = P * L_b`.

    Attributes:
        layout: the [`TokenLayout`][pcp_fn.TokenLayout] (per-request counts, position offsets,
            request of each row, unpad mask, restore index) of the config's
            [`pcp_fn.Layout`][]; a [`pcp_fn.hybrid.HybridLayout`][pcp_fn.HybridLayout] when
            `config.hybrid_attn`.
        positions: `[L_b]` int64 absolute positions
            (`num_computed[request] + offset`); 0 on padding rows.
        query_start_loc: `[R_b + 1]` int32 start of each request's local
            rows (the linear rows when hybrid); entries past the requests
            equal `num_tokens`.
        logits_indices: `[R_b]` int64 rows of the restored hidden states to
            sample from (see [`pcp_fn.get_logits_indices`][]; the hybrid
            form when `config.hybrid_attn`).
        slot_mapping: `[G_b]` the padded KV slot mapping (see
            [`pcp_fn.padded_slot_mapping`][]; the DCS one in both layouts).
    """

    layout: TokenLayout
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    logits_indices: torch.Tensor
    slot_mapping: torch.Tensor


@entry_op
def step(
    state: PCPState, batch: SchedulerBatch, slot_mapping: torch.Tensor | None = None
) -> tuple[PCPState, StepOutputs]:
    """One step's PCP bookkeeping for this rank.

    Args:
        state: any state of the batch's config (only its config and rank are
            read: [`pcp_fn.core.entry`][]).
        batch: from [`pcp_fn.make_batch`][].
        slot_mapping: `[F_b]` KV slots of the batch's tokens in scheduler
            order, padded to the bucket (see [`pcp_fn.padded_slot_mapping`][]);
            default `batch.slot_mapping` (`make_batch(..., slot_mapping=...)`).
    """
    up, out = step_update(state, batch, slot_mapping)
    return up.state, out


def step_update(
    state: PCPState, batch: SchedulerBatch, slot_mapping: torch.Tensor | None = None
) -> tuple[LayoutUpdate, StepOutputs]:
    """[`step`][pcp_fn.step.step], with the layout update it was built from (the next state and the batch's
    request geometry) for the ops that compose `step` and read the geometry (`spec_step`)."""
    check_batch(state, batch)
    if slot_mapping is None:
        slot_mapping = batch.slot_mapping
        if slot_mapping is None:
            raise ValueError(
                "step needs the KV slot mapping: build the batch with make_batch(..., slot_mapping=...) "
                "or pass slot_mapping"
            )
    cfg = state.config
    check_token_input("slot_mapping", slot_mapping, cfg, batch.bucket, batch.num_scheduled.device)
    layout_ops = layout_of(cfg)
    up = layout_ops.build(state, batch)
    layout = up.layout
    out = StepOutputs(
        layout=layout,
        positions=up.positions,
        query_start_loc=up.local_start.to(torch.int32),
        logits_indices=layout_ops.logits_from_geometry(cfg, up.geometry, batch.num_reqs),
        slot_mapping=masked_gather(slot_mapping, up.slot_token, layout.unpad_mask, cfg.pad_slot_id),
    )
    return up, out
