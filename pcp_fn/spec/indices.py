"""Which rows are sampled in a spec-decode step (the runner's `_calc_spec_decode_metadata`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.pytree import pytree_dataclass
from ..core.ragged import segment_of
from ..protocol.layout import layout_of
from ..protocol.state import PCPState
from .inputs import StateView, check_rows, draft_rows, sampled_rows, state_view


@pytree_dataclass
class SpecDecodeIndices:
    """Sampling indices of a spec-decode step (`S_b`, `D_b`: see [`pcp_fn.spec.inputs`][]).

    Fields (indices int64, cumulative counts int32; rows past the real ones 0
    unless said otherwise):
        logits_indices: `[S_b]` rows of the restored hidden states
            (`restore_hidden_states`: the padded order, or the FA order under
            hybrid attention) to take logits from: each request's last
            `drafts + 1` real tokens (rank 0's copy for a decode). The
            runner's `spec_decode_metadata.logits_indices` (PCP-adjusted when
            `P > 1`).
        local_logits_indices: `[S_b]` the same tokens as rows of this
            rank's local buffer (the runner's logits indices before the PCP
            adjustment, used to read `draft_token_ids`).
        target_logits_indices: `[D_b]` entry of `logits_indices` holding
            the target logits of each draft token.
        bonus_logits_indices: `[R_b]` entry of `logits_indices` of each
            request's bonus token (`cu_num_sampled_tokens - 1`).
        cu_num_draft_tokens: `[R_b]` inclusive cumsum of the draft counts
            (past `num_reqs`: the total).
        cu_num_sampled_tokens: `[R_b]` inclusive cumsum of `drafts + 1`
            (past `num_reqs`: the total).
        draft_token_ids: `[D_b]` the draft tokens, read from the local input ids.
        num_draft_tokens: `[R_b]` int32, the draft counts (0 past `num_reqs`).
        num_sampled: 0-d int64, real rows of `logits_indices`.
        num_drafts: 0-d int64, real rows of `target_logits_indices` / `draft_token_ids`.
    """

    logits_indices: torch.Tensor
    local_logits_indices: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    cu_num_draft_tokens: torch.Tensor
    cu_num_sampled_tokens: torch.Tensor
    draft_token_ids: torch.Tensor
    num_draft_tokens: torch.Tensor
    num_sampled: torch.Tensor
    num_drafts: torch.Tensor


def spec_decode_indices(
    state: PCPState, num_draft_tokens: torch.Tensor, input_ids: torch.Tensor
) -> tuple[PCPState, SpecDecodeIndices]:
    """Logits / target / bonus indices and draft token ids of a spec-decode step.

    The runner's `_calc_spec_decode_metadata(num_draft_tokens,
    cu_num_scheduled_tokens, num_pcp_pads)`: request `i` samples its last
    `s_i = drafts_i + 1` tokens. In this rank's local order (the runner's
    `cu_num_scheduled_tokens` is the cumsum of the local `pcp_tokens`) they
    end at `local_start[i+1]`; in the restored order at the PCP-adjusted
    cumulative count, which the layout gives ([`pcp_fn.layout_of`][]
    `.restored_spans`: `start + n`): `cu * P - num_pcp_pads` in the
    DualChunkSwap padded order, vllm-ascend `adjust_cu_num_scheduled_tokens_for_pcp`
    in the hybrid FA order. Example, the runner's comment (`P = 1`,
    `cu_num_scheduled_tokens [4, 104, 107, 207, 209]`, drafts `[3, 0, 2, 0, 1]`):

        logits_indices         [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
        target_logits_indices  [0, 1, 2, 5, 6, 9]
        bonus_logits_indices   [3, 4, 7, 8, 10]
        cu_num_draft_tokens    [3, 3, 5, 5, 6]

    With `P = 2` (request 0 a decode, the rest prefills) the same batch
    gives `logits_indices [0, 1, 2, 3, 107, 108, 109, 110, 211, 212, 213]`.
    Hybrid attention, `P = 2`, one spec token: fresh prefills `[3, 5]`
    give `[2, 7]`; decodes `[2, 2]` (one draft each) then a prefill of 7
    give `[0, 1, 2, 3, 14]`.

    Args:
        state: after [`pcp_fn.update_tokens`][pcp_fn.update_tokens.update_tokens] (or `step`) of the batch;
            the outputs have its bucket's sizes.
        num_draft_tokens: `[R_b]` draft counts ([`SpecInputs`][pcp_fn.SpecInputs], validated
            by [`make_spec_batch`][pcp_fn.make_spec_batch]).
        input_ids: `[L_b]` this rank's local input ids.

    A request with no scheduled token is not sampled by a real runner; where
    vllm-ascend's index would be `-1` (first request empty) it is 0 here.
    """
    Rb, Lb = state.bucket.num_reqs, state.bucket.num_tokens
    check_rows("num_draft_tokens", num_draft_tokens, Rb, "R_b, one per request row")
    check_rows("input_ids", input_ids, Lb, "L_b, this rank's local rows")
    return state, sampling_indices(state, state_view(state), num_draft_tokens, input_ids)


def sampling_indices(
    state: PCPState,
    view: StateView,
    num_draft_tokens: torch.Tensor,
    input_ids: torch.Tensor,
    local_start: torch.Tensor | None = None,
) -> SpecDecodeIndices:
    """[`spec_decode_indices`][pcp_fn.spec_decode_indices] (inputs checked) on the state's
    [`StateView`][pcp_fn.spec.inputs.StateView]; `local_start`: the layout's `state_local_start`
    when the caller has it (`spec_step`).

    Both index sets are runs per request: request `i`'s sampled slots `cu_s[i] - s_i + j`
    (`j < s_i`) hold `end[i] - s_i + j` for `end` its local or restored end, i.e.
    `slot + (end - cu_s)[i]`; its draft slots `cu_d[i] - d_i + j` target sampled slot
    `cu_s[i] - s_i + j = slot + i` and read local row `local_end[i] - d_i + j`. So one
    scan gives both cumulative counts, and one search over both slot sets (sampled slots
    `[0, S_b)`, draft slots from `S_b`) paints every index from one `[2, 2 R_b + 2]`
    table; a run's pad column (past the real slots of each set) paints values that clamp to 0.
    """
    cfg, bucket = state.config, state.bucket
    Rb = bucket.num_reqs
    S, D = sampled_rows(cfg, bucket), draft_rows(cfg, bucket)
    layout = layout_of(cfg)
    geo, real = view
    if local_start is None:
        local_start = layout.state_local_start(state, geometry=geo)
    restored_end = layout.restored_spans(state, geometry=geo).start + geo.num_scheduled
    local_end = local_start[1:]
    drafts = num_draft_tokens * real
    sampled = drafts + real
    cu = torch.cumsum(torch.stack([sampled, drafts]), 1, dtype=torch.int64)  # the one scan: [cu_s, cu_d]
    device = cu.device
    # run ends of the two slot sets laid end to end: sampled [cu_s, S_b], drafts S_b + [cu_d, S_b]
    ends = F.pad(cu, (0, 1), value=S) + torch.arange(0, 2 * S, S, device=device)[:, None]
    # value - slot, per channel (local / restored for sampled slots, target / local row + 1 for drafts)
    base = torch.stack([local_end, geo.request_ids + cu[1], restored_end, local_end + 1]).view(2, 2, Rb)
    table = F.pad(base - ends[:, :Rb], (0, 1), value=-2 * S).view(2, 2 * Rb + 2)
    slot = torch.arange(2 * S, dtype=torch.int64, device=device)
    painted = table.index_select(1, segment_of(ends.view(-1), slot))
    values = (painted + slot).clamp(min=0)
    # the draft token is the next sampled token's input id (the runner's input_ids[logits][target + 1]);
    # a zero row in front serves the slots past the drafts (their index clamps to 0)
    draft_ids = F.pad(input_ids, (1, 0)).index_select(0, values[1, S : S + D])
    cu32 = cu.to(torch.int32)
    return SpecDecodeIndices(
        logits_indices=values[1, :S],
        local_logits_indices=values[0, :S],
        target_logits_indices=values[0, S : S + D],
        bonus_logits_indices=(cu[0] - 1) * real,
        cu_num_draft_tokens=cu32[1],
        cu_num_sampled_tokens=cu32[0],
        draft_token_ids=draft_ids,
        num_draft_tokens=drafts.to(torch.int32),
        num_sampled=cu[0, -1],
        num_drafts=cu[1, -1],
    )
