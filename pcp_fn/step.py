"""``step``: the whole PCP bookkeeping of one model step as one pure function.

    state, out = step(state, batch, slot_mapping)
    # forward: embed input ids at out.positions, write K/V through out.slot_mapping,
    # all-gather hidden states, restore with out.layout.restore_index, sample at
    # out.logits_indices.

It composes update_tokens -> absolute positions -> logits indices -> padded
slot mapping; every output shape derives from ``(state.config, batch.bucket)``,
so ``torch.compile(step, fullgraph=True, dynamic=False)`` makes one graph per
bucket and ``pcp_fn.graph.capture(step, ...)`` one CUDA/ACL graph per bucket.
"""

from __future__ import annotations

import torch

from .batch import SchedulerBatch
from .hybrid import hybrid_logits
from .layout import TokenLayout, _update
from .logits import logits_from_geometry
from .pytree import pytree_dataclass
from .ragged import masked_gather
from .state import PCPState


@pytree_dataclass
class StepOutputs:
    """Everything a model runner needs for the forward of one rank.

    Fields (``R_b``, ``L_b`` from the batch's bucket, ``G_b = P * L_b``):
        layout: the :class:`TokenLayout` (per-request counts, position offsets,
            request of each row, unpad mask, restore index); a
            :class:`pcp_fn.hybrid.HybridLayout` when ``config.hybrid_attn``.
        positions: ``[L_b]`` int64 absolute positions
            (``num_computed[request] + offset``); 0 on padding rows.
        query_start_loc: ``[R_b + 1]`` int32 start of each request's local
            rows (the linear rows when hybrid); entries past the requests
            equal ``num_tokens``.
        logits_indices: ``[R_b]`` int64 rows of the restored hidden states to
            sample from (see :func:`pcp_fn.get_logits_indices`; the hybrid
            form when ``config.hybrid_attn``).
        slot_mapping: ``[G_b]`` the padded KV slot mapping (see
            :func:`pcp_fn.padded_slot_mapping`; the DCS one in both layouts).
    """

    layout: TokenLayout
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    logits_indices: torch.Tensor
    slot_mapping: torch.Tensor


def step(state: PCPState, batch: SchedulerBatch, slot_mapping: torch.Tensor) -> tuple[PCPState, StepOutputs]:
    """One step's PCP bookkeeping for this rank.

    Args:
        state: any state of the config (only its config and rank are read).
        batch: from :func:`pcp_fn.make_batch`.
        slot_mapping: ``[S]`` KV slots of the batch's tokens in scheduler order
            (computed from the pre-split positions; ``S >= 1``, extra entries
            ignored).
    """
    cfg = state.config
    up = _update(state, batch)
    layout = up.layout
    absolute = batch.num_computed.to(torch.int64)[layout.request_index] + layout.positions
    Rb = batch.bucket.num_reqs
    if cfg.hybrid_attn:
        logits = hybrid_logits(batch.num_scheduled, layout.is_decode, batch.num_reqs, cfg.pcp_size, Rb)
    else:
        logits = logits_from_geometry(up.geometry, batch.num_reqs, Rb)
    out = StepOutputs(
        layout=layout,
        positions=torch.where(up.local_valid, absolute, 0),
        query_start_loc=up.local_start.to(torch.int32),
        logits_indices=logits,
        slot_mapping=masked_gather(slot_mapping, up.slot_token, layout.unpad_mask, state.config.pad_slot_id),
    )
    return up.state, out
