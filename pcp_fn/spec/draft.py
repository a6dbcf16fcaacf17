"""Inputs of the drafter's first pass under PCP: its token ids and hidden states back on this rank's rows.

After the target model, the hidden states are all-gathered and restored to
the padded request order (``[P*L_b, H]``: a decode's ``n`` tokens ``P`` times,
rank-major; a prefill padded to a multiple of ``2P``). The drafter runs on the
same split as the target, so each local row takes:

- a decode token ``j`` of request ``i``: restored row ``padded_start[i] + j``
  (rank 0's copy), input id ``full[token_start[i] + j]``;
- a prefill row at padded offset ``o`` (head chunk ``r`` or tail chunk
  ``2P-1-r``): restored row ``padded_start[i] + o``, input id
  ``full[token_start[i] + o]`` when ``o < n`` else 0 (the seed pads with 0).

That is exactly :func:`pcp_fn.layout.local_rows`' (request, offset) of every
local row, so the selection is two gathers, no loop over requests.
"""

from __future__ import annotations

import torch

from ..core.buckets import Bucket
from ..core.pytree import pytree_dataclass
from ..core.ragged import ragged_index
from ..dcs.batch import token_rows
from ..dcs.layout import LocalRows, RequestGeometry, local_rows
from ..dcs.state import PCPState
from ._shared import bucket_of, check_rows, geometry, take


def _check_hidden(state: PCPState, bucket: Bucket, hidden: torch.Tensor) -> None:
    rows = state.config.pcp_size * bucket.num_tokens
    if hidden.dim() < 1 or hidden.shape[0] != rows:
        raise ValueError(
            f"hidden_states must be the restored [P * L_b, ...] = [{rows}, ...] buffer, "
            f"got shape {tuple(hidden.shape)}"
        )


def _sources(
    geo: RequestGeometry, rows: LocalRows, full_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, restored_row)`` of each local row (0 / row 0 on padding rows)."""
    req, off = rows.request, rows.position
    real = rows.valid & (off < take(geo.num_scheduled, req))
    ids = take(full_ids, take(geo.token_start, req) + off)
    ids = torch.where(real, ids, torch.zeros_like(ids))
    restored = torch.where(rows.valid, take(geo.padded_start, req) + off, 0)
    return ids, restored


def decode_hidden_states(
    state: PCPState, hidden_states: torch.Tensor, *, bucket: Bucket | None = None
) -> tuple[PCPState, torch.Tensor]:
    """Drop the PCP decode replication: the decode tokens' rows of the restored hidden states.

    Seed ``get_spec_decode_decode_hidden_states``: decode token ``j`` of
    request ``i`` is restored row ``query_start[i] * P + j`` (rank 0's copy).
    ``P = 2``, decodes of 2 and 1 tokens: restored rows ``[0, 1, 4]``.

    Args:
        hidden_states: ``[P * L_b, ...]`` restored hidden states.

    Returns ``[L_b, ...]``: rows ``[:num_decode_tokens]`` the decode tokens in
    order, the rest copies of row 0.
    """
    bucket = bucket_of(state, bucket)
    _check_hidden(state, bucket, hidden_states)
    geo, real = geometry(state, bucket)
    decode = torch.where(real & state.is_decode[: bucket.num_reqs], geo.num_scheduled, 0)
    rows = ragged_index(decode, bucket.num_tokens)
    index = torch.where(rows.valid, take(geo.padded_start, rows.segment) + rows.offset, 0)
    return state, hidden_states.index_select(0, index)


@pytree_dataclass
class DraftSplit:
    """This rank's share of the prefill requests' draft inputs.

    Seed ``_split_spec_decode_pcp_prefill_input``.

    Prefill ``k`` is request ``num_decode_reqs + k``.

    Fields:
        input_ids: ``[L_b]`` ids of this rank's prefill rows, head then tail
            chunk per request, pads 0; 0 past ``num_tokens``.
        hidden_states: ``[L_b, ...]`` their restored hidden states (row 0 past ``num_tokens``).
        num_tokens: 0-d int64, this rank's prefill rows.
        max_query_len: 0-d int64, the largest ``seq_lens`` entry (0 without prefills).
        seq_lens: ``[R_b]`` int32 rows of prefill ``k`` on this rank (0 past the prefills).
        cu_num_tokens: ``[R_b + 1]`` int32 ``[0, cumsum(seq_lens)]``.
        num_reqs: 0-d int64, prefill requests.
    """

    input_ids: torch.Tensor
    hidden_states: torch.Tensor
    num_tokens: torch.Tensor
    max_query_len: torch.Tensor
    seq_lens: torch.Tensor
    cu_num_tokens: torch.Tensor
    num_reqs: torch.Tensor


def split_prefill_for_draft(
    state: PCPState,
    input_ids_full: torch.Tensor,
    hidden_states: torch.Tensor,
    *,
    bucket: Bucket | None = None,
) -> tuple[PCPState, DraftSplit]:
    """Pad each prefill to ``2P`` chunks and keep this rank's head and tail chunks.

    Seed ``_split_spec_decode_pcp_prefill_input`` (not the hybrid-attention
    variant). ``P = 2``, rank 0, one prefill of 5 tokens ``[a, b, c, d, e]``
    (padded to 8, chunks of 2): ``input_ids [a, b, 0, 0]``, hidden rows
    ``[0, 1, 6, 7]`` of the prefill region, ``seq_lens [4]``.

    Args:
        input_ids_full: ``[F_b]`` the whole batch's ids in scheduler order (the
            seed is handed the prefill part, ``input_ids[num_decode_tokens:]``).
        hidden_states: ``[P * L_b, ...]`` the whole restored buffer (the seed:
            its prefill part, from row ``num_decode_tokens * P``).
    """
    cfg = state.config
    bucket = bucket_of(state, bucket)
    Rb, Lb = bucket.num_reqs, bucket.num_tokens
    check_rows("input_ids_full", input_ids_full, token_rows(cfg, bucket))
    _check_hidden(state, bucket, hidden_states)
    geo, real = geometry(state, bucket)
    is_decode = state.is_decode[:Rb]
    prefill = real & ~is_decode
    num_decode_reqs = is_decode.sum()
    num_decode_tokens = torch.where(is_decode, geo.num_scheduled, 0).sum()
    mine = local_rows(geo, state.pcp_rank, cfg.pcp_size, Lb)
    ids, restored = _sources(geo, mine, input_ids_full)

    # the prefill rows are the local rows after the decode tokens (decodes come first, one row per token)
    k = torch.arange(Lb, device=ids.device)
    num_tokens = torch.where(prefill, geo.local, 0).sum()
    keep = k < num_tokens
    at = (k + num_decode_tokens).clamp(max=Lb - 1)
    ids = torch.where(keep, ids[at], torch.zeros_like(ids))
    restored = torch.where(keep, restored[at], 0)

    # prefill k is request num_decode_reqs + k
    j = torch.arange(Rb, device=ids.device)
    lens = torch.where(j + num_decode_reqs < state.num_reqs, take(geo.local, j + num_decode_reqs), 0)
    out = DraftSplit(
        input_ids=ids,
        hidden_states=hidden_states.index_select(0, restored),
        num_tokens=num_tokens,
        max_query_len=lens.max(),
        seq_lens=lens.to(torch.int32),
        cu_num_tokens=torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]).to(torch.int32),
        num_reqs=prefill.sum(),
    )
    return state, out


@pytree_dataclass
class FirstPassInputs:
    """PCP-adjusted inputs of the first draft pass (seed ``PCPSpecDecodeFirstPassInputs`` + metadata).

    Fields (``L_b`` rows; at ``P = 1`` the inputs pass through unchanged):
        num_tokens: 0-d int64 rows of this pass (this rank's local tokens).
        input_ids: ``[L_b]`` decode ids then this rank's prefill rows.
        positions: ``[L_b]`` the target positions, unchanged (the seed slices them).
        hidden_states: ``[L_b, ...]`` decode tokens' then prefill rows' hidden states.
        token_indices_to_sample: ``[R_b]`` restored rows to sample: a decode's
            ``logits_indices[token_indices_to_sample[i]]``, a prefill's entry
            of the last ``num_prefill_reqs`` logits indices.
        query_start_loc: ``[R_b + 1]`` int32 query starts of this pass (decode
            tokens, then this rank's prefill rows; the total past ``num_reqs``).
        seq_lens: ``[R_b]`` the given ``seq_lens`` with prefills replaced by
            their local row counts (``None`` when none given).
        max_query_len: 0-d int64, ``max(decode_threshold, largest prefill
            share)`` with prefills (the seed's); without, the largest decode
            query (the seed leaves the metadata's own value).
        decode_query_lens: ``[R_b]`` int32 scheduled tokens of the decodes
            (seed ``long_seq_args[0]``, ``query_lens_pcp_full[:num_decode_reqs]``).
        ori_token_indices_to_sample: ``[R_b]`` the input indices (``long_seq_args[1]``).
    """

    num_tokens: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden_states: torch.Tensor
    token_indices_to_sample: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor | None
    max_query_len: torch.Tensor
    decode_query_lens: torch.Tensor
    ori_token_indices_to_sample: torch.Tensor


def first_pass_inputs(
    state: PCPState,
    input_ids_full: torch.Tensor,
    positions: torch.Tensor,
    hidden_states: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    logits_indices: torch.Tensor,
    num_logits: torch.Tensor | int,
    *,
    seq_lens: torch.Tensor | None = None,
    bucket: Bucket | None = None,
) -> tuple[PCPState, FirstPassInputs]:
    """The drafter's first-pass inputs on this rank (seed ``prepare_spec_decode_first_pass_inputs``).

    ``P = 2``, rank 0, a decode of 2 tokens ``[a, b]`` and a prefill of 5
    ``[c, d, e, f, g]`` (padded to 8): ``input_ids [a, b, c, d, 0, 0]``,
    hidden rows ``[0, 1, 4, 5, 10, 11]`` of the restored buffer,
    ``query_start_loc [0, 2, 6]``, prefill ``seq_lens 4``.

    Args:
        input_ids_full: ``[F_b]`` drafter ids in scheduler order (``FullInputs.input_ids``).
        positions: ``[L_b]`` target positions (``StepOutputs.positions``).
        hidden_states: ``[P * L_b, ...]`` restored target hidden states.
        token_indices_to_sample: ``[R_b]`` the drafter's indices (first
            ``num_reqs`` real): for decodes, entries of ``logits_indices``.
        logits_indices: ``[S]`` the step's logits indices
            (``SpecDecodeIndices.logits_indices``, or ``get_logits_indices``),
            ``num_logits`` of them real.
        seq_lens: optional ``[R_b]`` drafter sequence lengths to adjust.
    """
    cfg = state.config
    bucket = bucket_of(state, bucket)
    Rb, Lb, P = bucket.num_reqs, bucket.num_tokens, cfg.pcp_size
    check_rows("input_ids_full", input_ids_full, token_rows(cfg, bucket))
    check_rows("positions", positions, Lb)
    _check_hidden(state, bucket, hidden_states)
    check_rows("token_indices_to_sample", token_indices_to_sample, Rb)
    check_rows("logits_indices", logits_indices, 1, at_least=True)
    if seq_lens is not None:
        check_rows("seq_lens", seq_lens, Rb)
    geo, real = geometry(state, bucket)
    is_decode = state.is_decode[:Rb] & real
    prefill = real & ~is_decode
    decode_lens = torch.where(is_decode, geo.num_scheduled, 0).to(torch.int32)
    tis = token_indices_to_sample
    if P == 1:  # nothing is split: the seed hands everything back as it came
        return state, FirstPassInputs(
            num_tokens=geo.token_start[-1],
            input_ids=input_ids_full,
            positions=positions,
            hidden_states=hidden_states,
            token_indices_to_sample=tis,
            query_start_loc=geo.token_start.to(torch.int32),
            seq_lens=seq_lens,
            max_query_len=torch.where(real, geo.num_scheduled, 0).max(),
            decode_query_lens=decode_lens,
            ori_token_indices_to_sample=tis,
        )

    mine = local_rows(geo, state.pcp_rank, P, Lb)
    ids, restored = _sources(geo, mine, input_ids_full)
    # decodes: logits_indices[tis]; prefill i (one of the last num_prefill entries):
    # logits_indices[num_logits - num_prefill + (i - num_decode)] = logits_indices[num_logits - num_reqs + i]
    i = torch.arange(Rb, device=ids.device)
    from_decode = take(logits_indices, tis.to(torch.int64))
    from_prefill = take(logits_indices, num_logits - state.num_reqs + i)
    new_tis = torch.where(is_decode, from_decode, torch.where(prefill, from_prefill, tis))
    largest_prefill = torch.where(prefill, geo.local, 0).max()
    max_query_len = torch.where(
        prefill.any(),
        largest_prefill.clamp(min=cfg.decode_threshold),
        torch.where(is_decode, geo.num_scheduled, 0).max(),
    )
    out = FirstPassInputs(
        num_tokens=geo.local_start[-1],
        input_ids=ids,
        positions=positions,
        hidden_states=hidden_states.index_select(0, restored),
        token_indices_to_sample=new_tis.to(tis.dtype),
        query_start_loc=geo.local_start.to(torch.int32),
        seq_lens=None if seq_lens is None else torch.where(prefill, geo.local.to(seq_lens.dtype), seq_lens),
        max_query_len=max_query_len,
        decode_query_lens=decode_lens,
        ori_token_indices_to_sample=tis,
    )
    return state, out
