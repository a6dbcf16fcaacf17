"""Inputs of the drafter's first pass under PCP: its token ids and hidden states back on this rank's rows.

After the target model, the hidden states are all-gathered and restored
(`[P*L_b, ...]`, what `restore_hidden_states` returns: the padded request
order, or under hybrid attention the FA order). The drafter's first pass runs
on this rank's rows, which the layout gives ([`pcp_fn.layout_of`][]):
`first_pass_rows` (request `i`, offset `o` inside its padded tokens, the
decode tokens first) and `restored_spans` (where request `i`'s rows start
in the restored buffer, and how many of them there are). Each row then takes:

- input id `full[token_start[i] + o]` when `o < n` else 0 (a pad);
- hidden state: restored row `start[i] + o` when `o < length[i]`, else 0.

DualChunkSwap: the rows are the target's local rows (a prefill's head chunk
`r` and tail chunk `2P-1-r` of its `2P`-padded tokens, vllm-ascend
`_split_spec_decode_pcp_prefill_input`), and a prefill's padded rows,
pads included, are in the restored buffer. Hybrid: a prefill's rows are the
linear slice `[r*k, (r+1)*k)` of its padded tokens (vllm-ascend
`_split_spec_decode_pcp_prefill_input_hybrid`), the FA order has no pads,
so pads take zeros. Either way two gathers, no loop over requests.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.pytree import pytree_dataclass
from ..core.ragged import masked_gather, ragged_index, take
from ..protocol.batch import token_rows
from ..protocol.layout import layout_of
from ..protocol.rows import RequestGeometry
from ..protocol.state import PCPState
from .inputs import check_rows, real_requests, sampled_rows, state_view


@pytree_dataclass
class DraftSplit:
    """This rank's share of the prefill requests' inputs for the MTP drafter's first pass.

    vllm-ascend `_split_spec_decode_pcp_prefill_input` (and its `_hybrid` variant)
    return these six values as a tuple, plus `num_reqs`;
    [`split_prefill_for_draft`][pcp_fn.split_prefill_for_draft] returns them for either layout.

    Fields have `K = R_b` prefill rows.

    Attributes:
        num_tokens: 0-d int64 rows of this rank (`sum(seq_lens)`).
        input_ids: `[L_b]` ids (input dtype), each prefill's rows back to back, pads 0;
            0 past `num_tokens`.
        hidden_states: `[L_b, ...]` their hidden states (input dtype); 0 past `num_tokens`.
        max_query_len: 0-d int64 `max(seq_lens)` (0 without prefills).
        seq_lens: `[K]` int32 rows of each prefill on this rank (`2 * ceil(n / 2P)`;
            0 for an empty request and past the prefills).
        cu_num_tokens: `[K + 1]` int64 `[0, cumsum(seq_lens)]`.
        num_reqs: 0-d int64 prefill requests.
    """

    num_tokens: torch.Tensor
    input_ids: torch.Tensor
    hidden_states: torch.Tensor
    max_query_len: torch.Tensor
    seq_lens: torch.Tensor
    cu_num_tokens: torch.Tensor
    num_reqs: torch.Tensor


def _check_hidden(state: PCPState, hidden: torch.Tensor) -> None:
    rows = state.config.pcp_size * state.bucket.num_tokens
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden_states must be a tensor, got {type(hidden).__name__}")
    if hidden.dim() < 1 or hidden.shape[0] != rows:
        raise ValueError(
            f"hidden_states must be the restored [P * L_b, ...] = [{rows}, ...] buffer, "
            f"got shape {tuple(hidden.shape)}"
        )


class _Sources(NamedTuple):
    index: torch.Tensor  # [2, L_b] int64 full-id row / restored hidden row of each row (0 where none)
    held: torch.Tensor  # [2, L_b] bool the row has an input id (not a pad) / a restored hidden state


def _sources(state: PCPState, geo: RequestGeometry) -> _Sources:
    """Where each first-pass row (the layout's `first_pass_rows`) reads its input id and its
    restored hidden state (`restored_spans`): one gather of the per-request `(limit, start)` of
    both; a row at offset `o` reads `start + o` if `o < limit`."""
    layout = layout_of(state.config)
    spans, rows = layout.restored_spans(state, geometry=geo), layout.first_pass_rows(state, geometry=geo)
    per_request = torch.stack([geo.num_scheduled, spans.length, geo.token_start[:-1], spans.start])
    limit, start = per_request.index_select(1, rows.request).view(2, 2, -1).unbind(0)
    held = (rows.position < limit) & rows.valid
    return _Sources((start + rows.position) * held, held)


def _take_ids(ids: torch.Tensor, index: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """`ids[index]` where `held`, else 0 (`index` in range)."""
    return ids.index_select(0, index) * held


def _take_hidden(hidden: torch.Tensor, index: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """`hidden[index]` where `held`, else 0 (a select, not a product: exact for any value)."""
    rows = hidden.index_select(0, index)
    return torch.where(held.view(-1, *[1] * (rows.dim() - 1)), rows, 0)


def decode_hidden_states(state: PCPState, hidden_states: torch.Tensor) -> tuple[PCPState, torch.Tensor]:
    """Drop the PCP decode replication: the decode tokens' rows of the restored hidden states.

    vllm-ascend `get_spec_decode_decode_hidden_states`: decode token `j` of
    request `i` is restored row `query_start[i] * P + j` (rank 0's copy);
    under hybrid attention (spec tokens configured: rank-major decodes) the
    first `num_decode_tokens` rows. The layout's `restored_spans` gives
    both. `P = 2`, decodes of 2 and 1 tokens: restored rows `[0, 1, 4]`
    (hybrid: `[0, 1, 2]`).

    Args:
        hidden_states: `[P * L_b, ...]` restored hidden states (the state's bucket).

    Returns `[L_b, ...]`: rows `[:num_decode_tokens]` the decode tokens in
    order, the rest 0. Without spec tokens a hybrid config's decodes are
    token-major (rank 0's copy of decode token `t` at row `t * P`), and so
    are the rows read here; vllm-ascend's hybrid branch assumes the rank-major
    order, which it only builds with spec tokens.
    """
    _check_hidden(state, hidden_states)
    Lb = state.bucket.num_tokens
    spans = layout_of(state.config).restored_spans(state)
    decode = torch.where(real_requests(state) & state.is_decode[: state.bucket.num_reqs], spans.length, 0)
    rows = ragged_index(decode, Lb)
    index = take(spans.start, rows.segment) + rows.offset
    return state, masked_gather(hidden_states, index, rows.valid, 0)


def split_prefill_for_draft(
    state: PCPState, input_ids_full: torch.Tensor, hidden_states: torch.Tensor
) -> tuple[PCPState, DraftSplit]:
    """This rank's share of every prefill's drafter inputs, by the layout's split.

    vllm-ascend `_split_spec_decode_pcp_prefill_input`: DualChunkSwap pads
    each prefill to `2P` chunks and keeps this rank's head and tail chunks;
    under hybrid attention (its `_hybrid` variant, also
    `_split_spec_decode_pcp_prefill_input_hybrid`) the rank takes the
    linear slice `[r*k, (r+1)*k)` of the padded prefill, `k = padded / P`.
    `P = 2`, rank 0, one prefill of 5 tokens `[a, b, c, d, e]` (padded to
    8): `input_ids [a, b, 0, 0]` from prefill rows `[0, 1, 6, 7]`
    (hybrid: `[a, b, c, d]` from rows `[0, 1, 2, 3]`), `seq_lens [4]`.

    Args:
        input_ids_full: `[F_b]` the whole batch's ids in scheduler order
            (vllm-ascend is handed the prefill part, `input_ids[num_decode_tokens:]`).
        hidden_states: `[P * L_b, ...]` the whole restored buffer
            (vllm-ascend: its prefill part, from row `num_decode_tokens * P`).

    Returns a [`DraftSplit`][pcp_fn.DraftSplit] with `K = R_b` (prefill `k` is request
    `num_decode_reqs + k`).
    """
    cfg, bucket = state.config, state.bucket
    Rb, Lb = bucket.num_reqs, bucket.num_tokens
    check_rows(
        "input_ids_full", input_ids_full, token_rows(cfg, bucket), "F_b, the bucket's scheduler-order tokens"
    )
    _check_hidden(state, hidden_states)
    geo, real = state_view(state)
    is_decode = state.is_decode[:Rb]
    prefill = real & ~is_decode
    num_decode_reqs = is_decode.sum()
    num_decode_tokens = torch.where(is_decode, geo.num_scheduled, 0).sum()
    src = _sources(state, geo)

    # the prefill rows are the first-pass rows after the decode tokens (decodes come first, one row per token)
    k = torch.arange(Lb, device=geo.num_scheduled.device)
    num_tokens = torch.where(prefill, geo.local, 0).sum()
    at = (k + num_decode_tokens).clamp(max=Lb - 1)
    held = src.held.index_select(1, at) & (k < num_tokens)
    index = src.index.index_select(1, at)

    # prefill k is request num_decode_reqs + k
    j = torch.arange(Rb, device=k.device)
    lens = torch.where(j + num_decode_reqs < state.num_reqs, take(geo.local, j + num_decode_reqs), 0)
    out = DraftSplit(
        num_tokens=num_tokens,
        input_ids=_take_ids(input_ids_full, index[0], held[0]),
        hidden_states=_take_hidden(hidden_states, index[1], held[1]),
        max_query_len=lens.max(),
        seq_lens=lens.to(torch.int32),
        cu_num_tokens=torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]),
        num_reqs=prefill.sum(),
    )
    return state, out


@pytree_dataclass
class FirstPassInputs:
    """PCP-adjusted inputs of the first draft pass (vllm-ascend `PCPSpecDecodeFirstPassInputs` + metadata).

    Fields have `L_b` rows; at `P = 1` the inputs pass through unchanged.

    Attributes:
        num_tokens: 0-d int64 rows of this pass (this rank's first-pass rows).
        input_ids: `[L_b]` decode ids then this rank's prefill rows (0 on pads and past them).
        positions: `[L_b]` the target positions, unchanged (vllm-ascend slices them).
        hidden_states: `[L_b, ...]` decode tokens' then prefill rows' hidden
            states (0 past them, and on a hybrid prefill's pads).
        token_indices_to_sample: `[R_b]` restored rows to sample: a decode's
            `logits_indices[token_indices_to_sample[i]]`, a prefill's entry
            of the last `num_prefill_reqs` logits indices.
        query_start_loc: `[R_b + 1]` int32 query starts of this pass (decode
            tokens, then this rank's prefill rows; the total past `num_reqs`).
        seq_lens: `[R_b]` the given `seq_lens` with prefills replaced by
            their row counts on this rank (`None` when none given).
        max_query_len: 0-d int64, `max(decode_threshold, largest prefill
            share)` with prefills (vllm-ascend's); without, the largest decode
            query (vllm-ascend leaves the metadata's own value).
        decode_query_lens: `[R_b]` int32 scheduled tokens of the decodes
            (vllm-ascend `long_seq_args[0]`, `query_lens_pcp_full[:num_decode_reqs]`).
        ori_token_indices_to_sample: `[R_b]` the input indices (`long_seq_args[1]`).
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


def _check_first_pass_inputs(
    state: PCPState,
    input_ids_full: torch.Tensor,
    positions: torch.Tensor,
    hidden_states: torch.Tensor,
    token_indices_to_sample: torch.Tensor,
    logits_indices: torch.Tensor,
    seq_lens: torch.Tensor | None,
) -> None:
    """The static checks of [`first_pass_inputs`][pcp_fn.first_pass_inputs]' arguments (their rows
    for the state's bucket), in argument order; nothing is read."""
    cfg, bucket = state.config, state.bucket
    Rb, Lb = bucket.num_reqs, bucket.num_tokens
    check_rows(
        "input_ids_full", input_ids_full, token_rows(cfg, bucket), "F_b, the bucket's scheduler-order tokens"
    )
    check_rows("positions", positions, Lb, "L_b, this rank's local rows")
    _check_hidden(state, hidden_states)
    check_rows("token_indices_to_sample", token_indices_to_sample, Rb, "R_b, one per request row")
    S = sampled_rows(cfg, bucket)
    if (
        not isinstance(logits_indices, torch.Tensor)
        or logits_indices.dim() != 1
        or logits_indices.shape[0] not in (S, Rb)
    ):
        raise ValueError(
            f"logits_indices must have {S} rows (S_b, SpecDecodeIndices.logits_indices) or {Rb} "
            f"(R_b, get_logits_indices), got shape {tuple(getattr(logits_indices, 'shape', ()))}"
        )
    if seq_lens is not None:
        check_rows("seq_lens", seq_lens, Rb, "R_b, one per request row")


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
) -> tuple[PCPState, FirstPassInputs]:
    """The drafter's first-pass inputs on this rank (vllm-ascend `prepare_spec_decode_first_pass_inputs`).

    `P = 2`, rank 0, a decode of 2 tokens `[a, b]` and a prefill of 5
    `[c, d, e, f, g]` (padded to 8): `input_ids [a, b, c, d, 0, 0]`,
    hidden rows `[0, 1, 4, 5, 10, 11]` of the restored buffer,
    `query_start_loc [0, 2, 6]`, prefill `seq_lens 4`. Hybrid attention
    (one spec token): `input_ids [a, b, c, d, e, f]`, hidden rows
    `[0, 1, 4, 5, 6, 7]` of the FA order (decode rows `0 .. 3`, prefill
    tokens from row 4).

    Args:
        input_ids_full: `[F_b]` drafter ids in scheduler order (`FullInputs.input_ids`).
        positions: `[L_b]` target positions (`StepOutputs.positions`).
        hidden_states: `[P * L_b, ...]` restored target hidden states.
        token_indices_to_sample: `[R_b]` the drafter's indices (first
            `num_reqs` real): for decodes, entries of `logits_indices`.
        logits_indices: the step's logits indices: `[S_b]`
            (`SpecDecodeIndices.logits_indices`) or `[R_b]`
            (`get_logits_indices`), `num_logits` of them real.
        seq_lens: optional `[R_b]` drafter sequence lengths to adjust.
    """
    _check_first_pass_inputs(
        state, input_ids_full, positions, hidden_states, token_indices_to_sample, logits_indices, seq_lens
    )
    cfg, Rb, P = state.config, state.bucket.num_reqs, state.config.pcp_size
    geo, real = state_view(state)
    is_decode = state.is_decode[:Rb] & real
    prefill = real ^ is_decode  # real & ~is_decode (is_decode is real)
    decode_lens = geo.num_scheduled * is_decode
    tis = token_indices_to_sample
    if P == 1:  # nothing is split: vllm-ascend hands everything back as it came
        return state, FirstPassInputs(
            num_tokens=geo.token_start[-1],
            input_ids=input_ids_full,
            positions=positions,
            hidden_states=hidden_states,
            token_indices_to_sample=tis,
            query_start_loc=geo.token_start.to(torch.int32),
            seq_lens=seq_lens,
            max_query_len=(geo.num_scheduled * real).max(),
            decode_query_lens=decode_lens.to(torch.int32),
            ori_token_indices_to_sample=tis,
        )

    src = _sources(state, geo)
    # decodes: logits_indices[tis]; prefill i (one of the last num_prefill entries):
    # logits_indices[num_logits - num_prefill + (i - num_decode)] = logits_indices[num_logits - num_reqs + i]
    entry = torch.where(is_decode, tis, geo.request_ids + (num_logits - state.num_reqs))
    new_tis = torch.where(real, take(logits_indices, entry), tis)
    max_query_len = torch.where(
        prefill.any(),
        (geo.local * prefill).max().clamp(min=cfg.decode_threshold),
        decode_lens.max(),
    )
    out = FirstPassInputs(
        num_tokens=geo.local_start[-1],
        input_ids=_take_ids(input_ids_full, src.index[0], src.held[0]),
        positions=positions,
        hidden_states=_take_hidden(hidden_states, src.index[1], src.held[1]),
        token_indices_to_sample=new_tis.to(tis.dtype),
        query_start_loc=geo.local_start.to(torch.int32),
        seq_lens=None if seq_lens is None else torch.where(prefill, geo.local.to(seq_lens.dtype), seq_lens),
        max_query_len=max_query_len,
        decode_query_lens=decode_lens.to(torch.int32),
        ori_token_indices_to_sample=tis,
    )
    return state, out
