"""Which rows are sampled in a spec-decode step (the runner's ``_calc_spec_decode_metadata``)."""

from __future__ import annotations

import torch

from ..core.pytree import pytree_dataclass
from ..core.ragged import ragged_index, take
from ..dcs.layout import state_geometry
from ..dcs.state import PCPState
from ..layouts import layout_of
from .inputs import check_rows, draft_rows, real_requests, sampled_rows


@pytree_dataclass
class SpecDecodeIndices:
    """Sampling indices of a spec-decode step (``S_b``, ``D_b``: see :mod:`pcp_fn.spec.inputs`).

    Fields (indices int64, cumulative counts int32; rows past the real ones 0
    unless said otherwise):
        logits_indices: ``[S_b]`` rows of the restored hidden states
            (``restore_hidden_states``: the padded order, or the FA order under
            hybrid attention) to take logits from: each request's last
            ``drafts + 1`` real tokens (rank 0's copy for a decode). The
            runner's ``spec_decode_metadata.logits_indices`` (PCP-adjusted when
            ``P > 1``).
        local_logits_indices: ``[S_b]`` the same tokens as rows of this
            rank's local buffer (the runner's logits indices before the PCP
            adjustment, used to read ``draft_token_ids``).
        target_logits_indices: ``[D_b]`` entry of ``logits_indices`` holding
            the target logits of each draft token.
        bonus_logits_indices: ``[R_b]`` entry of ``logits_indices`` of each
            request's bonus token (``cu_num_sampled_tokens - 1``).
        cu_num_draft_tokens: ``[R_b]`` inclusive cumsum of the draft counts
            (past ``num_reqs``: the total).
        cu_num_sampled_tokens: ``[R_b]`` inclusive cumsum of ``drafts + 1``
            (past ``num_reqs``: the total).
        draft_token_ids: ``[D_b]`` the draft tokens, read from the local input ids.
        num_draft_tokens: ``[R_b]`` int32, the draft counts (0 past ``num_reqs``).
        num_sampled: 0-d int64, real rows of ``logits_indices``.
        num_drafts: 0-d int64, real rows of ``target_logits_indices`` / ``draft_token_ids``.
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

    The runner's ``_calc_spec_decode_metadata(num_draft_tokens,
    cu_num_scheduled_tokens, num_pcp_pads)``: request ``i`` samples its last
    ``s_i = drafts_i + 1`` tokens. In this rank's local order (the runner's
    ``cu_num_scheduled_tokens`` is the cumsum of the local ``pcp_tokens``) they
    end at ``local_start[i+1]``; in the restored order at the PCP-adjusted
    cumulative count, which the layout gives (:func:`pcp_fn.layouts.layout_of`
    ``.restored_spans``: ``start + n``): ``cu * P - num_pcp_pads`` in the
    DualChunkSwap padded order, vllm-ascend ``adjust_cu_num_scheduled_tokens_for_pcp``
    in the hybrid FA order. Example, the runner's comment (``P = 1``,
    ``cu_num_scheduled_tokens [4, 104, 107, 207, 209]``, drafts ``[3, 0, 2, 0, 1]``)::

        logits_indices         [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
        target_logits_indices  [0, 1, 2, 5, 6, 9]
        bonus_logits_indices   [3, 4, 7, 8, 10]
        cu_num_draft_tokens    [3, 3, 5, 5, 6]

    With ``P = 2`` (request 0 a decode, the rest prefills) the same batch
    gives ``logits_indices [0, 1, 2, 3, 107, 108, 109, 110, 211, 212, 213]``.
    Hybrid attention, ``P = 2``, one spec token: fresh prefills ``[3, 5]``
    give ``[2, 7]``; decodes ``[2, 2]`` (one draft each) then a prefill of 7
    give ``[0, 1, 2, 3, 14]``.

    Args:
        state: after :func:`pcp_fn.update_tokens` (or ``step``) of the batch;
            the outputs have its bucket's sizes.
        num_draft_tokens: ``[R_b]`` draft counts (:class:`SpecInputs`, validated
            by :func:`make_spec_batch`).
        input_ids: ``[L_b]`` this rank's local input ids.

    A request with no scheduled token is not sampled by a real runner; where
    vllm-ascend's index would be ``-1`` (first request empty) it is 0 here.
    """
    cfg, bucket = state.config, state.bucket
    Rb, Lb = bucket.num_reqs, bucket.num_tokens
    check_rows("num_draft_tokens", num_draft_tokens, Rb, "R_b, one per request row")
    check_rows("input_ids", input_ids, Lb, "L_b, this rank's local rows")
    layout = layout_of(cfg)
    n = state_geometry(state).num_scheduled
    local_start = layout.state_local_start(state)
    spans = layout.restored_spans(state)
    real = real_requests(state)
    drafts = torch.where(real, num_draft_tokens.to(torch.int64), 0)
    sampled = torch.where(real, drafts + 1, 0)
    cu_sampled = torch.cumsum(sampled, 0)

    # sampled slots: request i's j-th sampled token is its (n - s + j)-th token
    rows = ragged_index(sampled, sampled_rows(cfg, bucket))
    first = lambda end: take(end - sampled, rows.segment) + rows.offset  # noqa: E731
    local = first(local_start[1:])
    restored = first(spans.start + n)
    local = torch.where(rows.valid, local.clamp(min=0), 0)
    restored = torch.where(rows.valid, restored.clamp(min=0), 0)

    # draft slots: draft k of request i targets sampled slot (cu_sampled - s)[i] + k
    drows = ragged_index(drafts, draft_rows(cfg, bucket))
    target = take(cu_sampled - sampled, drows.segment) + drows.offset
    target = torch.where(drows.valid, target, 0)
    # the draft token is the next sampled token's input id (the runner's input_ids[logits][target + 1])
    draft_ids = take(input_ids, take(local, target + 1))
    draft_ids = torch.where(drows.valid, draft_ids, torch.zeros_like(draft_ids))

    out = SpecDecodeIndices(
        logits_indices=restored,
        local_logits_indices=local,
        target_logits_indices=target,
        bonus_logits_indices=torch.where(real, cu_sampled - 1, 0),
        cu_num_draft_tokens=torch.cumsum(drafts, 0).to(torch.int32),
        cu_num_sampled_tokens=cu_sampled.to(torch.int32),
        draft_token_ids=draft_ids,
        num_draft_tokens=drafts.to(torch.int32),
        num_sampled=sampled.sum(),
        num_drafts=drafts.sum(),
    )
    return state, out
