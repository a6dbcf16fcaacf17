"""`spec_step`: a decode step with speculative tokens as one pure function (one graph per bucket).

    batch, spec = make_spec_batch(cfg, sched, computed, prompt, num_draft_tokens,
                                  token_ids=table, slot_mapping=slots)
    state, out = spec_step(state, batch, spec, table)
    # forward on out.input_ids / out.step.positions / out.step.slot_mapping,
    # restore, sample at out.indices.logits_indices; the drafter reads out.full.

It is [`pcp_fn.step`][pcp_fn.step.step] (left as it is) plus everything the spec-decode
path prepares before the forward: the scheduler-order ids and positions
(repaired with the previous step's tokens under async scheduling), this rank's
local input ids, the spec-decode sampling indices and the MTP attention mask.
Every output shape derives from `(config, batch.bucket)` and the token
table's static shape. Like `step` it is an entry op
([`pcp_fn.core.entry`][]): of the incoming state it reads only the config and
the entry fields, so a state from any step replays the graph of any bucket.
"""

from __future__ import annotations

import torch

from ..core.entry import entry_op
from ..core.pytree import pytree_dataclass
from ..protocol.batch import SchedulerBatch
from ..protocol.state import PCPState, check_batch
from ..step import StepOutputs, step_update
from .full import (
    FullInputs,
    SlotFn,
    check_previous_tokens,
    check_token_ids,
    full_inputs,
    repaired_ids,
)
from .indices import SpecDecodeIndices, sampling_indices
from .inputs import SpecInputs, check_rows, state_view
from .mtp import MTPAttentionMask, attention_mask


@pytree_dataclass
class PrevStep:
    """The previous step's device outputs that async scheduling feeds back.

    Attributes:
        sampled_token_ids: `[prev_reqs, >= 1]` sampled tokens (column 0 read).
        draft_token_ids: `[prev_reqs, k]` draft tokens, or `None`.
        positions: `[R_b]` each request's row in the previous step, -1 if new.
    """

    sampled_token_ids: torch.Tensor
    draft_token_ids: torch.Tensor | None
    positions: torch.Tensor


@pytree_dataclass
class SpecStepOutputs:
    """Everything a rank needs for the forward of a spec-decode step.

    Attributes:
        step: [`pcp_fn.StepOutputs`][] (layout, positions, slot mapping; its
            `logits_indices` are the non-spec ones, sample at
            `indices.logits_indices` instead).
        input_ids: `[L_b]` this rank's local input ids (0 on pad rows).
        full: [`FullInputs`][pcp_fn.spec.FullInputs] scheduler-order ids / positions / MTP layout.
        indices: [`SpecDecodeIndices`][pcp_fn.spec.SpecDecodeIndices].
        attention_mask: [`MTPAttentionMask`][pcp_fn.spec.MTPAttentionMask] over the token table's
            width, or `None` without context parallelism (`P * dcp == 1`)
            or without spec tokens.
    """

    step: StepOutputs
    input_ids: torch.Tensor
    full: FullInputs
    indices: SpecDecodeIndices
    attention_mask: MTPAttentionMask | None


def _check_token_table(spec: SpecInputs, token_ids: torch.Tensor) -> None:
    """`token_ids` is at least as large as the table [`make_spec_batch`][pcp_fn.make_spec_batch]
    checked the batch against."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"token_ids must be a tensor, got {type(token_ids).__name__}")
    if spec.token_ids_shape is None:
        raise ValueError(
            "spec_step reads the token table: build the spec inputs with "
            "make_spec_batch(..., token_ids=table) so that the table is checked against the batch"
        )
    rows, width = spec.token_ids_shape
    if token_ids.dim() != 2 or token_ids.shape[0] < rows or token_ids.shape[1] < width:
        raise ValueError(
            f"token_ids must be a [num_rows >= {rows}, max_model_len >= {width}] table (the one "
            f"make_spec_batch checked the batch against), got shape {tuple(token_ids.shape)}: a narrower "
            "table would be read past its end"
        )


@entry_op
def spec_step(
    state: PCPState,
    batch: SchedulerBatch,
    spec: SpecInputs,
    token_ids: torch.Tensor,
    prev: PrevStep | None = None,
    *,
    slot_mapping: torch.Tensor | None = None,
    slot_fn: SlotFn | None = None,
) -> tuple[PCPState, SpecStepOutputs]:
    """One spec-decode step's PCP bookkeeping for this rank.

    Args:
        state: any state of the batch's config (only its config and entry
            fields are read).
        batch: the [`SchedulerBatch`][pcp_fn.SchedulerBatch] from
            [`make_spec_batch`][pcp_fn.make_spec_batch] (its bucket: the outputs' sizes).
        spec: the [`SpecInputs`][pcp_fn.SpecInputs] from the same
            [`make_spec_batch`][pcp_fn.make_spec_batch] call.
        token_ids: `[rows, max_model_len]` the request token table; at least
            as large as the one given to `make_spec_batch(..., token_ids=...)`
            (a narrower table is a `ValueError`, never a truncated read).
        prev: the previous step's tokens (async scheduling), or `None`.
        slot_mapping: `[F_b]` KV slots in scheduler order, padded to the
            bucket; default `batch.slot_mapping` (`make_spec_batch(...,
            slot_mapping=...)`), as for [`pcp_fn.step`][pcp_fn.step.step].
        slot_fn: maps MTP rows to KV slots (see [`full_input_ids`][pcp_fn.full_input_ids]).

    `P = 2`, one spec token, two decodes of 2 tokens (one draft each):
    `indices.logits_indices [0, 1, 4, 5]`, `input_ids` the two requests'
    tokens, `full.query_start_loc [0, 2, 4]` (hybrid attention:
    `logits_indices [0, 1, 2, 3]`, rank 0's rows of the FA order).
    """
    check_batch(state, batch)
    if not isinstance(spec, SpecInputs):
        raise TypeError(f"spec must be SpecInputs (make_spec_batch), got {type(spec).__name__}")
    check_rows("spec.num_draft_tokens", spec.num_draft_tokens, batch.bucket.num_reqs, "R_b, the batch's")
    _check_token_table(spec, token_ids)
    check_token_ids(token_ids)
    if prev is not None:
        check_rows("prev.positions", prev.positions, batch.bucket.num_reqs, "R_b, the batch's")
        check_previous_tokens(state.config, prev.sampled_token_ids, prev.draft_token_ids)
    cfg = state.config
    up, out = step_update(state, batch, slot_mapping)
    # from here on `state` records this batch (its bucket): the consumer ops read it, and the
    # step's own geometry (the state's: not rebuilt)
    state = up.state
    view = state_view(state, up.geometry)
    full = full_inputs(state, view, token_ids, batch.num_computed, slot_fn, table_checked=True)
    if prev is not None:
        ids = repaired_ids(
            state, view, full.input_ids, prev.sampled_token_ids, prev.draft_token_ids, prev.positions
        )
        full = FullInputs(ids, full.positions, full.query_start_loc, full.num_tokens, full.mtp)
    # local ids: a local row at offset o < n of request i is scheduler-order token token_start[i] + o
    layout = out.layout
    request, offset = layout.request_index, layout.positions
    start_and_len = torch.stack([view.geo.token_start[:-1], view.geo.num_scheduled]).index_select(1, request)
    real = (offset < start_and_len[1]) & (
        torch.arange(batch.bucket.num_tokens, device=offset.device) < layout.num_tokens
    )
    local_ids = full.input_ids.index_select(0, (start_and_len[0] + offset) * real) * real
    indices = sampling_indices(state, view, spec.num_draft_tokens, local_ids, local_start=up.local_start)
    mask = None
    if cfg.pcp_size * cfg.dcp_size > 1 and cfg.num_spec_tokens > 0:
        mask = attention_mask(state, view, batch.num_computed, token_ids.shape[1])
    return state, SpecStepOutputs(
        step=out, input_ids=local_ids, full=full, indices=indices, attention_mask=mask
    )
