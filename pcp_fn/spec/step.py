"""``spec_step``: a decode step with speculative tokens as one pure function (one graph per bucket).

    batch, spec = make_spec_batch(cfg, sched, computed, prompt, num_draft_tokens, token_ids=table)
    state, out = spec_step(state, batch, slot_mapping, spec, table)
    # forward on out.input_ids / out.step.positions / out.step.slot_mapping,
    # restore, sample at out.indices.logits_indices; the drafter reads out.full.

It is :func:`pcp_fn.step` (left as it is) plus everything the spec-decode
path prepares before the forward: the scheduler-order ids and positions
(repaired with the previous step's tokens under async scheduling), this rank's
local input ids, the spec-decode sampling indices and the MTP attention mask.
Every output shape derives from ``(config, bucket)`` and the token table's
static shape.
"""

from __future__ import annotations

import torch

from ..core.pytree import pytree_dataclass
from ..dcs.batch import SchedulerBatch
from ..dcs.state import PCPState
from ..step import StepOutputs, step
from ._shared import geometry, take
from .full import FullInputs, SlotFn, full_input_ids, repair_full_input_ids
from .indices import SpecDecodeIndices, spec_decode_indices
from .inputs import SpecInputs
from .mtp import MTPAttentionMask, mtp_attention_mask


@pytree_dataclass
class PrevStep:
    """The previous step's device outputs that async scheduling feeds back.

    Fields:
        sampled_token_ids: ``[prev_reqs, >= 1]`` sampled tokens (column 0 read).
        draft_token_ids: ``[prev_reqs, k]`` draft tokens, or ``None``.
        positions: ``[R_b]`` each request's row in the previous step, -1 if new.
    """

    sampled_token_ids: torch.Tensor
    draft_token_ids: torch.Tensor | None
    positions: torch.Tensor


@pytree_dataclass
class SpecStepOutputs:
    """Everything a rank needs for the forward of a spec-decode step.

    Fields:
        step: :class:`pcp_fn.StepOutputs` (layout, positions, slot mapping; its
            ``logits_indices`` are the non-spec ones, sample at
            ``indices.logits_indices`` instead).
        input_ids: ``[L_b]`` this rank's local input ids (0 on pad rows).
        full: :class:`FullInputs` scheduler-order ids / positions / MTP layout.
        indices: :class:`SpecDecodeIndices`.
        attention_mask: :class:`MTPAttentionMask` over the token table's
            width, or ``None`` without context parallelism (``P * dcp == 1``)
            or without spec tokens.
    """

    step: StepOutputs
    input_ids: torch.Tensor
    full: FullInputs
    indices: SpecDecodeIndices
    attention_mask: MTPAttentionMask | None


def spec_step(
    state: PCPState,
    batch: SchedulerBatch,
    slot_mapping: torch.Tensor,
    spec: SpecInputs,
    token_ids: torch.Tensor,
    prev: PrevStep | None = None,
    *,
    slot_fn: SlotFn | None = None,
) -> tuple[PCPState, SpecStepOutputs]:
    """One spec-decode step's PCP bookkeeping for this rank.

    Args:
        state, batch, slot_mapping: as for :func:`pcp_fn.step` (``batch`` from
            :func:`make_spec_batch`).
        spec: the draft counts (:func:`make_spec_batch`).
        token_ids: ``[rows, max_model_len]`` the request token table.
        prev: the previous step's tokens (async scheduling), or ``None``.
        slot_fn: maps MTP rows to KV slots (see :func:`full_input_ids`).

    ``P = 2``, one spec token, two decodes of 2 tokens (one draft each):
    ``indices.logits_indices [0, 1, 4, 5]``, ``input_ids`` the two requests'
    tokens, ``full.query_start_loc [0, 2, 4]``.
    """
    cfg = state.config
    bucket = batch.bucket
    state, out = step(state, batch, slot_mapping)
    state, full = full_input_ids(state, token_ids, batch.num_computed, bucket=bucket, slot_fn=slot_fn)
    if prev is not None:
        state, ids = repair_full_input_ids(
            state, full.input_ids, prev.sampled_token_ids, prev.draft_token_ids, prev.positions, bucket=bucket
        )
        full = FullInputs(
            input_ids=ids,
            positions=full.positions,
            query_start_loc=full.query_start_loc,
            num_tokens=full.num_tokens,
            mtp=full.mtp,
        )
    # local ids: a local row at offset o < n of request i is scheduler-order token token_start[i] + o
    geo, _ = geometry(state, bucket)
    layout = out.layout
    request, offset = layout.request_index, layout.positions
    real = (torch.arange(bucket.num_tokens, device=offset.device) < layout.num_tokens) & (
        offset < take(geo.num_scheduled, request)
    )
    local_ids = take(full.input_ids, take(geo.token_start, request) + offset)
    local_ids = torch.where(real, local_ids, torch.zeros_like(local_ids))
    state, indices = spec_decode_indices(state, spec.num_draft_tokens, local_ids, bucket=bucket)
    mask = None
    if cfg.pcp_size * cfg.dcp_size > 1 and cfg.num_spec_tokens > 0:
        state, mask = mtp_attention_mask(state, batch.num_computed, token_ids.shape[1], bucket=bucket)
    return state, SpecStepOutputs(
        step=out, input_ids=local_ids, full=full, indices=indices, attention_mask=mask
    )
