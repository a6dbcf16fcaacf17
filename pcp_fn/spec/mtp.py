"""MTP drafting steps under context parallelism: slots, attention mask, sequence lengths, graph padding.

Context parallelism (`C = pcp * dcp` ranks) deals each request's KV out
round-robin in blocks of `I = cp_kv_cache_interleave_size` tokens, so a
rank holds `local_len(n)` of a request's first `n` tokens
([`pcp_fn.cp_local_seq_lens`][]). Every function here reads that, the
scheduler order of the state's last update and the MTP slot layout of
[`pcp_fn.spec.full_input_ids`][pcp_fn.full_input_ids]; none depends on the token layout
(DualChunkSwap or hybrid: the FA layers' KV is dealt the same way).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.checks import check_int_tensor
from ..core.pytree import pytree_dataclass
from ..core.rank import select_rank
from ..core.seqlens import cp_local_seq_lens
from ..protocol.state import PCPState
from .inputs import StateView, check_rows, mtp_rows, state_view


def my_cp_lens(state: PCPState, seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(all, mine)`: [`pcp_fn.cp_local_seq_lens`][] of `seq_lens` and this rank's entry.

    `all` is `[..., P, dcp]`, `mine` is `[...]`; the rank may be data (a 0-d tensor).
    """
    cfg = state.config
    lens = cp_local_seq_lens(seq_lens, cfg.pcp_size, cfg.dcp_size, cfg.cp_kv_cache_interleave_size)
    return lens, select_rank(lens.select(-1, cfg.dcp_rank), state.pcp_rank, dim=-1)


def _check_mtp_slots(state: PCPState, mtp_slot_mapping: torch.Tensor) -> None:
    rows = mtp_rows(state.config, state.bucket) * state.config.pcp_size
    check_rows("mtp_slot_mapping", mtp_slot_mapping, rows, "M_b * P, MTPLayout.slot_mapping")


@pytree_dataclass
class MTPSlotInputs:
    """What [`mtp_slot_inputs`][pcp_fn.mtp_slot_inputs] returns.

    Attributes:
        slot_indices: `[R_b * P]` int64 entries of `slot_mapping` holding the
            KV slot of each request's last accepted token, one per PCP rank
            (request `i`'s at `i*P .. i*P + P-1`); 0 past `num_reqs`.
        slot_mapping: the padded MTP slot mapping (`MTPLayout.slot_mapping`).
    """

    slot_indices: torch.Tensor
    slot_mapping: torch.Tensor


def mtp_slot_inputs(
    state: PCPState,
    token_indices_to_sample: torch.Tensor,
    mtp_slot_mapping: torch.Tensor,
    *,
    num_reqs: torch.Tensor | int | None = None,
    num_speculative_tokens: int | None = None,
) -> tuple[PCPState, MTPSlotInputs]:
    """Where each draft request's next MTP token writes its KV.

    vllm-ascend `_get_spec_decode_mtp_slot_inputs`.

    Request `i`'s MTP rows start at `query_start[i] + i * (k - 1)`; its
    last accepted token is offset `accepted - 1` (`accepted = query_len -
    rejected`, `rejected = query_end - token_indices_to_sample - 1`); the
    slot mapping is token-strided by `P`:

        slot_indices[i*P + r] = (query_start[i] + i*(k-1) + accepted[i] - 1) * P + r

    `P = 2`, `k = 2`, decodes of 3 tokens, `token_indices_to_sample
    [1, 5]` (two and three accepted): `[2, 3, 12, 13]`.

    Args:
        token_indices_to_sample: `[R_b]` scheduler-order index of each
            request's last accepted token (the drafter's `prepare_inputs_padded`).
        mtp_slot_mapping: `[M_b * P]` from [`full_input_ids`][pcp_fn.full_input_ids]
            (`FullInputs.mtp.slot_mapping`).
        num_reqs: requests that draft (default: the batch's).
        num_speculative_tokens: `k` (default `config.num_spec_tokens`).
    """
    cfg = state.config
    Rb, P = state.bucket.num_reqs, cfg.pcp_size
    check_rows("token_indices_to_sample", token_indices_to_sample, Rb, "R_b, one per request row")
    _check_mtp_slots(state, mtp_slot_mapping)
    k = cfg.num_spec_tokens if num_speculative_tokens is None else num_speculative_tokens
    used = state.num_reqs if num_reqs is None else num_reqs
    return state, MTPSlotInputs(
        slot_indices=slot_indices(token_indices_to_sample, k, P, used), slot_mapping=mtp_slot_mapping
    )


def slot_indices(
    token_indices_to_sample: torch.Tensor, k: int, P: int, num_reqs: torch.Tensor | int
) -> torch.Tensor:
    """`[R_b * P]` int64 [`MTPSlotInputs.slot_indices`][pcp_fn.spec.MTPSlotInputs].

    `query_start + accepted - 1` is `token_indices_to_sample` itself (`accepted - 1 =
    tis - (query_end - query_len)`), so request `i`'s rows are `(tis[i] + i*(k-1)) * P + r`:
    nothing of the layout is read.
    """
    Rb = token_indices_to_sample.shape[0]
    i = torch.arange(Rb, device=token_indices_to_sample.device)
    row = torch.add(token_indices_to_sample, i, alpha=k - 1)  # int64 (i is)
    rank = torch.arange(P, device=row.device)
    return (torch.add(rank, row[:, None], alpha=P) * (i < num_reqs)[:, None]).reshape(Rb * P)


@pytree_dataclass
class MTPDraftingInputs:
    """vllm-ascend `PCPSpecDecodeMTPInputs` (it returns `None` where `active` is False).

    Attributes:
        active: 0-d bool: a decode-only batch (or a DCP prefill batch at `P = 1`).
        num_reqs: 0-d int64 requests with slot indices (the decodes, or all for a DCP prefill).
        seq_lens: `[R_b]` the drafter's sequence lengths, as given.
        slot_indices: as [`MTPSlotInputs`][pcp_fn.spec.MTPSlotInputs]'s.
        slot_mapping: as [`MTPSlotInputs`][pcp_fn.spec.MTPSlotInputs]'s.
    """

    active: torch.Tensor
    num_reqs: torch.Tensor
    seq_lens: torch.Tensor
    slot_indices: torch.Tensor
    slot_mapping: torch.Tensor


def mtp_drafting_inputs(
    state: PCPState,
    token_indices_to_sample: torch.Tensor,
    seq_lens: torch.Tensor,
    mtp_slot_mapping: torch.Tensor,
    *,
    is_prefill_batch: torch.Tensor | bool | None = None,
    num_speculative_tokens: int | None = None,
) -> tuple[PCPState, MTPDraftingInputs | None]:
    """MTP drafting metadata (vllm-ascend `prepare_spec_decode_mtp_drafting_inputs`).

    `None` (static) when `k <= 1`. Otherwise `active` says whether
    vllm-ascend would build it: a batch of decodes only, or a prefill batch under
    DCP alone (`P = 1`, `dcp > 1`: then every request gets slot indices).
    `P = 2`, `k = 2`, two decodes of 3 tokens: `active True`,
    `num_reqs 2`, slot indices as in [`mtp_slot_inputs`][pcp_fn.mtp_slot_inputs].

    Args:
        token_indices_to_sample: `[R_b]`, as for [`mtp_slot_inputs`][pcp_fn.mtp_slot_inputs].
        seq_lens: `[R_b]` the drafter's attention `seq_lens`.
        mtp_slot_mapping: `[M_b * P]`, as for [`mtp_slot_inputs`][pcp_fn.mtp_slot_inputs].
        is_prefill_batch: the runner's flag; default: the batch has a
            request that is not a decode.
    """
    cfg = state.config
    k = cfg.num_spec_tokens if num_speculative_tokens is None else num_speculative_tokens
    if k <= 1:
        return state, None
    Rb = state.bucket.num_reqs
    check_rows("token_indices_to_sample", token_indices_to_sample, Rb, "R_b, one per request row")
    check_rows("seq_lens", seq_lens, Rb, "R_b, one per request row")
    _check_mtp_slots(state, mtp_slot_mapping)
    # is_decode is False past num_reqs (PCPState: the decodes of the last update, a prefix)
    num_decode = state.is_decode[:Rb].sum()
    if is_prefill_batch is None:
        decode_batch = num_decode >= state.num_reqs
    elif isinstance(is_prefill_batch, bool):  # a static flag: a fill kernel, no host-to-device copy
        decode_batch = torch.full((), not is_prefill_batch, dtype=torch.bool, device=num_decode.device)
    else:
        decode_batch = ~is_prefill_batch.to(torch.bool)
    active = (num_decode > 0) & decode_batch
    num_reqs = num_decode
    if cfg.pcp_size == 1 and cfg.dcp_size > 1:  # a prefill batch under DCP alone: every request drafts
        active = active | ~decode_batch
        num_reqs = torch.where(decode_batch, num_decode, state.num_reqs)
    slots = MTPSlotInputs(slot_indices(token_indices_to_sample, k, cfg.pcp_size, num_reqs), mtp_slot_mapping)
    out = MTPDraftingInputs(
        active=active,
        num_reqs=num_reqs,
        seq_lens=seq_lens,
        slot_indices=slots.slot_indices,
        slot_mapping=slots.slot_mapping,
    )
    return state, out


@pytree_dataclass
class MTPAttentionMask:
    """What [`mtp_attention_mask`][pcp_fn.mtp_attention_mask] returns.

    Attributes:
        mask: `[R_b, decode_threshold, num_cols]` bool, True where attention is
            blocked; rows of requests that are not decodes all False.
        num_rows: 0-d int64 rows the runner exposes (vllm-ascend `mask_n`:
            the decodes, or all requests when there is none).
    """

    mask: torch.Tensor
    num_rows: torch.Tensor


def mtp_attention_mask(
    state: PCPState,
    num_computed_tokens: torch.Tensor,
    num_cols: int,
) -> tuple[PCPState, MTPAttentionMask]:
    """Causal mask of each decode's spec queries over this rank's local KV (True = blocked).

    vllm-ascend `generate_mtp_attention_mask_for_decode`, interleave-aware: query
    `q` of a decode with history `h` and `n` scheduled tokens sees local
    KV index `k` iff `k <= local_len(h + q + 1) - 1`, where
    `local_len(x) = x // I // C * I + clip(x - (x // I // C * I) * C - c * I, 0, I)`
    counts this rank's (`c`) tokens among the first `x`. Entries outside the
    request's queries (`q >= n`) and local KV (`k >= local_len(h + n)`) are
    False, and so is a query that sees no local key at all (vllm-ascend's
    `k_upper >= 0` guard). For `I = 1` this is vllm-ascend's formula; for
    `I > 1` the corrected one (vllm-ascend's ignores the interleave).

    `C = 2` (rank 0), `I = 1`, `h = 5`, `n = 3`: local KV holds
    tokens 0, 2, 4, 6 (`k < 4`); query 0 (token 5) sees `k <= 2`, query 1
    (token 6) all, query 2 (token 7) all:

        [[F, F, F, T, ...], [F, F, F, F, ...], [F, F, F, F, ...]]

    Args:
        num_computed_tokens: `[R_b]` history of each request (`batch.num_computed`).
        num_cols: the mask's static KV width, the model's `max_model_len`
            (vllm-ascend's width; a request's local KV never exceeds it); keys
            past it are dropped. Not a row count: the rows are the state's
            bucket's.
    """
    Rb = state.bucket.num_reqs
    check_rows("num_computed_tokens", num_computed_tokens, Rb, "R_b, one per request row", integer=True)
    if isinstance(num_cols, bool) or not isinstance(num_cols, int) or num_cols < 1:
        raise ValueError(f"num_cols must be a positive int, got {num_cols!r}")
    return state, attention_mask(state, state_view(state), num_computed_tokens, num_cols)


def rank_local_lens(state: PCPState, seq_lens: torch.Tensor) -> torch.Tensor:
    """This rank's entry of [`pcp_fn.cp_local_seq_lens`][] (`my_cp_lens(state, seq_lens)[1]`),
    computed for this rank alone: `seq_lens`' shape, int64."""
    cfg = state.config
    C, I = cfg.pcp_size * cfg.dcp_size, cfg.cp_kv_cache_interleave_size
    c = state.pcp_rank * cfg.dcp_size + cfg.dcp_rank  # this rank's place among the C (int or 0-d tensor)
    if I == 1:  # rank c holds the tokens t < s with t % C == c: ceil((s - c) / C), 0 when s <= c
        return (seq_lens + (C - 1 - c)) // C
    rounds = seq_lens // (C * I)  # full rounds of C blocks, then rank c's share of the partial round
    return torch.add(torch.add(seq_lens - c * I, rounds, alpha=-C * I).clamp(0, I), rounds, alpha=I)


@pytree_dataclass
class MTPBlockedKeys:
    """The MTP attention mask's True entries, sparse
    ([`mtp_blocked_keys`][pcp_fn.spec.mtp_blocked_keys]).

    Attributes:
        cell: `[R_b, thr, thr - 1]` int64 flat index into a `[R_b, thr, num_cols]` mask of each
            key a decode's spec query may be blocked from (its later spec tokens held on this
            rank).
        blocked: `[R_b, thr, thr - 1]` bool, whether it is (its `cell` then True in the mask).
        num_rows: as [`MTPAttentionMask`][pcp_fn.spec.MTPAttentionMask]'s.
    """

    cell: torch.Tensor
    blocked: torch.Tensor
    num_rows: torch.Tensor


def mtp_blocked_keys(
    state: PCPState,
    num_computed_tokens: torch.Tensor,
    num_cols: int,
) -> tuple[PCPState, MTPBlockedKeys]:
    """[`mtp_attention_mask`][pcp_fn.mtp_attention_mask]'s True entries, `R_b * thr * (thr - 1)` of
    them at most: what a caller keeping its own `[R, thr, num_cols]` mask buffer writes after
    zeroing the decodes' rows (vllm-ascend's buffer), instead of moving the whole mask
    (`R * thr * num_cols` bools).

    A `cell` that is not `blocked` lies in column 0 of its row, which no mask ever blocks
    (every blocked key lies past a key the query sees), so writing `blocked` at every `cell`
    is exact. Arguments as [`mtp_attention_mask`][pcp_fn.mtp_attention_mask].
    """
    Rb = state.bucket.num_reqs
    check_rows("num_computed_tokens", num_computed_tokens, Rb, "R_b, one per request row", integer=True)
    if isinstance(num_cols, bool) or not isinstance(num_cols, int) or num_cols < 1:
        raise ValueError(f"num_cols must be a positive int, got {num_cols!r}")
    return state, blocked_keys(state, state_view(state), num_computed_tokens, num_cols)


def blocked_keys(
    state: PCPState, view: StateView, num_computed: torch.Tensor, num_cols: int
) -> MTPBlockedKeys:
    """[`mtp_blocked_keys`][pcp_fn.spec.mtp_blocked_keys] (inputs checked) on the state's
    [`StateView`][pcp_fn.spec.inputs.StateView]."""
    col, end, row_start, num_rows = _blocked_intervals(state, view, num_computed, num_cols)
    blocked = col < end[:, :, None]
    return MTPBlockedKeys(cell=row_start + col.masked_fill(~blocked, 0), blocked=blocked, num_rows=num_rows)


def _blocked_intervals(
    state: PCPState, view: StateView, num_computed: torch.Tensor, num_cols: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(col [R_b, thr, thr - 1], end [R_b, thr], row_start [R_b, thr, 1], num_rows)`: query `q`
    of row `i` blocks the keys `col[i, q] < end[i, q]`; its row starts at flat `row_start`."""
    cfg = state.config
    Rb, T = state.bucket.num_reqs, cfg.decode_threshold
    geo, real = view
    decode = state.is_decode[:Rb] & real
    q = torch.arange(1, T + 1, device=num_computed.device)  # query q - 1 sees the first h + q tokens
    seen = rank_local_lens(state, num_computed[:, None] + q)  # [R_b, T] local keys query q sees
    held = rank_local_lens(state, num_computed + geo.num_scheduled)  # [R_b] local keys of the request
    # The blocked keys of query q form one interval [seen, held) of at most n - 1 - q < thr keys
    # (the request's local keys among its later spec tokens; empty for q >= n, where seen >= held).
    # So the mask is all zeros but R_b * thr * (thr - 1) entries: write those by index into a zero
    # buffer (a trash slot takes the rest) instead of comparing every one of the R_b * thr * num_cols
    # entries. A query that sees no local key blocks nothing (vllm-ascend's guard), nor does a row
    # that is not a decode: their interval ends at 0.
    end = (held.clamp(max=num_cols) * decode)[:, None] * (seen >= 1)  # [R_b, thr]
    col = seen[:, :, None] + torch.arange(max(T - 1, 0), device=q.device)  # [R_b, thr, thr - 1]
    row_start = torch.arange(0, Rb * T * num_cols, num_cols, device=q.device).view(Rb, T, 1)
    num_decode = decode.sum()
    return col, end, row_start, torch.where(num_decode > 0, num_decode, state.num_reqs)


def attention_mask(
    state: PCPState, view: StateView, num_computed: torch.Tensor, num_cols: int
) -> MTPAttentionMask:
    """[`mtp_attention_mask`][pcp_fn.mtp_attention_mask] (inputs checked) on the state's
    [`StateView`][pcp_fn.spec.inputs.StateView]."""
    Rb, T = state.bucket.num_reqs, state.config.decode_threshold
    col, end, row_start, num_rows = _blocked_intervals(state, view, num_computed, num_cols)
    size = Rb * T * num_cols
    cell = (row_start + col).masked_fill(col >= end[:, :, None], size)
    # a bool buffer filled directly (no int8 -> bool view: torch 2.10's vmap has no rule for it)
    flat = torch.zeros(size + 1, dtype=torch.bool, device=col.device).index_fill(0, cell.view(-1), True)
    mask = flat[:size].reshape(Rb, T, num_cols)
    return MTPAttentionMask(mask=mask, num_rows=num_rows)


def mask_restore_index_for_graph(
    state: PCPState, restore_index: torch.Tensor
) -> tuple[PCPState, torch.Tensor]:
    """Zero the restore-index rows a padded draft batch never uses.

    vllm-ascend `mask_spec_decode_restore_idx_for_graph`.

    A graph-padded draft batch gives every request `decode_threshold` tokens
    replicated on `P` ranks: `P * thr` rows per request, of which only the
    first `thr` (rank 0's copy) are read. Row `j` is kept iff
    `j % (P * thr) < thr`. `P = 2`, `thr = 2`: `[0, 1, 2, 3, 4, 5, 6, 7]
    -> [0, 1, 0, 0, 4, 5, 0, 0]`. Returns a new tensor (vllm-ascend writes
    its buffer in place).

    Args:
        restore_index: `[P * L_b]` (`TokenLayout.restore_index` of the
            draft batch's state: the state's bucket).
    """
    cfg = state.config
    rows = cfg.pcp_size * state.bucket.num_tokens
    check_rows("restore_index", restore_index, rows, "P * L_b, the state's gathered rows")
    row = torch.arange(restore_index.shape[0], device=restore_index.device)
    drop = row % (cfg.pcp_size * cfg.decode_threshold) >= cfg.decode_threshold
    return state, torch.where(drop, torch.zeros_like(restore_index), restore_index)


@pytree_dataclass
class DraftingSeqLens:
    """What [`drafting_cp_seq_lens`][pcp_fn.drafting_cp_seq_lens] returns.

    Attributes:
        cp_seq_len: `[R_b]` this rank's KV length of each request (vllm-ascend `cp_seq_len`).
        num_computed_tokens_of_pcp_dcp: `[R_b, P, dcp]` every rank's (vllm-ascend's
            non-MLA metadata).
    """

    cp_seq_len: torch.Tensor
    num_computed_tokens_of_pcp_dcp: torch.Tensor


def drafting_cp_seq_lens(
    state: PCPState, seq_lens: torch.Tensor, draft_index: int | torch.Tensor
) -> tuple[PCPState, DraftingSeqLens]:
    """Per-rank KV lengths at draft step `draft_index`.

    vllm-ascend `update_spec_decode_drafting_cp_metadata`.

    Draft step `d` has written `d + 1` more tokens: `cp_local_seq_lens(seq_lens
    + d + 1)`. `P = 2`, `I = 1`, `seq_lens [5]`, `d = 0`: `[[3], [3]]`
    on the two ranks; rank 1's `cp_seq_len [3]`.

    The sum is formed in int64 (a length at the int32 limit plus the drafts does not wrap), the
    shares come back in `seq_lens`' dtype: exact whenever a rank's share fits it (always for an
    int32 length under context parallelism, `C >= 2`: a share is at most half the length).

    Args:
        seq_lens: `[R_b]` integer, the drafter's sequence lengths (the state's bucket).
        draft_index: int or 0-d integer tensor.
    """
    check_rows("seq_lens", seq_lens, state.bucket.num_reqs, "R_b, one per request row", integer=True)
    check_draft_index(draft_index)
    lens, mine = my_cp_lens(state, seq_lens.to(torch.int64) + draft_index + 1)
    dtype = seq_lens.dtype
    return state, DraftingSeqLens(cp_seq_len=mine.to(dtype), num_computed_tokens_of_pcp_dcp=lens.to(dtype))


def check_draft_index(draft_index: object) -> None:
    """A draft step is an int or a 0-d integer tensor (its value is device data: not read)."""
    if isinstance(draft_index, torch.Tensor):
        check_int_tensor("draft_index", draft_index, (), "a 0-d draft step")
    elif isinstance(draft_index, bool) or not isinstance(draft_index, int | np.integer):
        kind = type(draft_index).__name__
        raise TypeError(f"draft_index must be an int or a 0-d integer tensor, got {kind}")
