"""Attention index metadata: vllm-ascend's `generate_pcp_metadata` as one fixed-shape op.

For a prefill split DualChunkSwap-style, rank `r` holds two query chunks of
each prefill request: the head chunk `h = r` and the tail chunk
`t = 2P-1-r`. After the K/V all-gather every rank holds the request's whole
padded K/V (`2P` chunks of `c = local_len // 2` rows). Causal attention of a
query chunk `k` then splits into the K/V rows strictly before chunk `k`
(no mask needed) and chunk `k` itself (causal mask). The metadata lists those
rows, request after request, in the prefill part of the batch (decodes are
skipped: offsets start at the first prefill). `P = 2`, rank 0, one fresh
prefill of 8 tokens (`local_len = 4`, `c = 2`, `h = 0`, `t = 3`):

    local query rows        0 1 | 2 3          q_head_idx [0, 1]   q_tail_idx [2, 3]
    gathered K/V chunks     [0 1|2 3|4 5|6 7]
    head: nomask []         mask [0, 1]
    tail: nomask [0..5]     mask [6, 7]
    kv_tail_proj_idx [0..7] (every K/V row the tail chunk attends to)
    kv_with_q_head_attn_idx_in_tail [0, 1]   kv_with_q_tail_attn_idx_in_tail [0..7]
    q_full_idx [0, 1, 2, 3] (argsort of head ++ tail: back to the local query order)

Every index tensor is one or two runs of consecutive integers per request, so
the whole metadata is a handful of index kernels: ONE `expand_runs`
(`pcp_fn.core.ragged`) paints all ten index tensors laid end to end in one buffer,
one scan of the chunk sizes gives every offset and per-request length.
vllm-ascend builds the same lists with Python loops over every token.

Differences from vllm-ascend (all forced by fixed shapes or by the device):

- index tensors are padded to a static capacity ([`PaddedIndex`][pcp_fn.PaddedIndex]: the
  vllm-ascend's tensor is `index[:length]`, the rest 0);
- the per-request lengths vllm-ascend returns as Python lists
  (`attn_mask_seqlens`... via `.tolist()`) are `[R_b]` int32 device
  tensors, padded past the prefills with the running total (empty requests);
- `pcp_allgather_restore_idx` is the layout's, addressing fixed `[L_b]`
  rank buffers (`rank * L_b + row`; vllm-ascend's `rank * num_tokens + row`,
  identical when the bucket is exact);
- at `P == 1` (DCP only) the head/tail fields are `None` as in vllm-ascend,
  whose `pcp_unpad_mask` is then empty; here it is the identity layout's;
- names drop vllm-ascend's `_tensor` / `_cpu` suffixes;
- the hybrid-attention fields live in the step's `HybridLayout` and the
  speculative-decode `dcp_mtp_attn_mask` in `pcp_fn.spec` (see
  [`AttentionMetadata`][pcp_fn.AttentionMetadata]).
"""

from __future__ import annotations

import dataclasses

import torch

from ..core.checks import INT32_MAX, check_int_tensor
from ..core.entry import entry_op
from ..core.pytree import pytree_dataclass
from ..core.ragged import segment_of
from ..core.rank import select_rank
from ..core.seqlens import cp_local_seq_lens
from ..protocol.batch import SchedulerBatch, classify_decodes
from ..protocol.rows import RequestGeometry
from ..protocol.state import PCPState, check_batch
from .attention_tables import range_tables
from .geometry import request_geometry
from .layout import padded_order


@pytree_dataclass
class PaddedIndex:
    """An index tensor padded to a static capacity, with its real length.

    Attributes:
        index: `[cap]` int32; `index[:length]` is vllm-ascend's tensor, the
            rest is 0 (an in-range row whenever the indexed tensor is non-empty).
        length: 0-d int64, vllm-ascend's tensor's `numel()`.
    """

    index: torch.Tensor
    length: torch.Tensor


@pytree_dataclass
class AttentionMetadata:
    """Per-step PCP attention metadata of one rank (vllm-ascend `AscendPrefillContextParallelMetadata`).

    Shapes derive from `(config, bucket)` only: `R_b` request rows, `L_b`
    local token rows, `C_b = L_b // 2` chunk rows. `None` fields are absent
    statically (`P == 1`): the first eight fields are always present, the rest only
    when `P > 1`. Of those, the index tensors ([`PaddedIndex`][pcp_fn.PaddedIndex], int32,
    `q_head_idx` to `kv_with_q_tail_attn_idx_in_tail`) index into the prefill part: local
    query rows from the first prefill token, gathered K/V rows from the first prefill's
    padded K/V; their capacities are rank-independent, so every rank has the same shapes
    (the real lengths are `C`, `2C`, `h*C`, `t*C`, `(t+1)*C` and `(h+1)*C` with
    `C = sum of c <= C_b` because `2C <= L_b`). The per-request vectors (from
    `attn_chunk_seqlens` on) are `[R_b]` int32, entry `j` for the `j`-th prefill request
    (vllm-ascend's lists, which skip decodes).

    Attributes:
        num_computed_tokens_of_pcp_dcp: `[R_b, P, D]` int32, context tokens
            held by each (pcp, dcp) rank; context = computed + scheduled for a
            decode (or `decode_seq_lens`), computed for a prefill; 0 past
            `num_reqs`.
        num_actual_tokens_pcp_padded: 0-d int64, `P * num_tokens`.
        pcp_unpad_mask: `[P*L_b]` bool, the layout's unpad mask (False past
            `P * num_tokens`).
        pcp_allgather_restore_idx: `[P*L_b]` int64, the layout's restore
            index (addresses fixed `[L_b]` rank buffers: docs/concepts.md, DualChunkSwap).
        query_lens_pcp_full: `[R_b]` int32 scheduled tokens before the split.
        max_query_len_pcp_full: 0-d int32, their max.
        num_decode_reqs: 0-d int64.
        num_prefill_reqs: 0-d int64, the length of every per-request vector below.
        q_head_idx: `[C_b]` (`P > 1` only, as every field below).
        q_tail_idx: `[C_b]`.
        q_full_idx: `[2*C_b]`.
        kv_with_q_head_nomask_idx: `[(P-1)*C_b]`.
        kv_with_q_head_mask_idx: `[C_b]`.
        kv_with_q_tail_nomask_idx: `[(2P-1)*C_b]`.
        kv_with_q_tail_mask_idx: `[C_b]`.
        kv_tail_proj_idx: `[2P*C_b]`.
        kv_with_q_head_attn_idx_in_tail: `[P*C_b]`.
        kv_with_q_tail_attn_idx_in_tail: `[2P*C_b]`.
        attn_chunk_seqlens: `c`; 0 past `num_prefill_reqs`.
        attn_mask_seqlens: the inclusive cumulative sum of `c`; past `num_prefill_reqs` it
            repeats the total (empty requests), as do the four below.
        head_attn_nomask_seqlens: the inclusive cumulative sum of `h*c`.
        tail_attn_nomask_seqlens: the inclusive cumulative sum of `t*c`.
        head_actual_seq_lengths_kv: the inclusive cumulative sum of `(h+1)*c`.
        tail_actual_seq_lengths_kv: the inclusive cumulative sum of `(t+1)*c`.

    With `config.hybrid_attn` every field here is the DualChunkSwap one the
    full-attention layers use, as in vllm-ascend; vllm-ascend's hybrid fields
    (`pcp_exit_fa_scatter_idx`, `pcp_fa_query_idx`,
    `pcp_enter_fa_restore_idx`, `pcp_fa_padding_restore_idx`,
    `max_num_tokens_across_pcp`, `total_num_scheduled_tokens`,
    `pcp_padded_tokens_fla`) are the [`pcp_fn.HybridLayout`][] that
    `update_tokens` returns for the same step.

    The speculative-decode `dcp_mtp_attn_mask` is
    [`pcp_fn.spec.mtp_attention_mask`][pcp_fn.mtp_attention_mask].
    """

    num_computed_tokens_of_pcp_dcp: torch.Tensor
    num_actual_tokens_pcp_padded: torch.Tensor
    pcp_unpad_mask: torch.Tensor
    pcp_allgather_restore_idx: torch.Tensor
    query_lens_pcp_full: torch.Tensor
    max_query_len_pcp_full: torch.Tensor
    num_decode_reqs: torch.Tensor
    num_prefill_reqs: torch.Tensor
    q_head_idx: PaddedIndex | None = None
    q_tail_idx: PaddedIndex | None = None
    q_full_idx: PaddedIndex | None = None
    kv_with_q_head_nomask_idx: PaddedIndex | None = None
    kv_with_q_head_mask_idx: PaddedIndex | None = None
    kv_with_q_tail_nomask_idx: PaddedIndex | None = None
    kv_with_q_tail_mask_idx: PaddedIndex | None = None
    kv_tail_proj_idx: PaddedIndex | None = None
    kv_with_q_head_attn_idx_in_tail: PaddedIndex | None = None
    kv_with_q_tail_attn_idx_in_tail: PaddedIndex | None = None
    attn_chunk_seqlens: torch.Tensor | None = None
    attn_mask_seqlens: torch.Tensor | None = None
    head_attn_nomask_seqlens: torch.Tensor | None = None
    tail_attn_nomask_seqlens: torch.Tensor | None = None
    head_actual_seq_lengths_kv: torch.Tensor | None = None
    tail_actual_seq_lengths_kv: torch.Tensor | None = None


# The index tensors, in buffer order. Each is one or two ranges per prefill request, all of
# them linear in (c_before, c, total) with coefficients linear in the rank h (t = 2P-1-h).
_INDEX_NAMES = (
    "q_head_idx",
    "q_tail_idx",
    "kv_with_q_head_nomask_idx",
    "kv_with_q_head_mask_idx",
    "kv_with_q_tail_nomask_idx",
    "kv_with_q_tail_mask_idx",
    "kv_tail_proj_idx",
    "kv_with_q_head_attn_idx_in_tail",
    "kv_with_q_tail_attn_idx_in_tail",
    "q_full_idx",
)

# vllm-ascend's AscendPrefillContextParallelMetadata field of each index tensor (it adds
# `_tensor` to every name but `q_full_idx`): the one map adapters and checks read.
VLLM_ASCEND_INDEX_FIELDS = {name: name if name == "q_full_idx" else f"{name}_tensor" for name in _INDEX_NAMES}


def _index_tensors(P: int, Cb: int, geo: RequestGeometry, runs: torch.Tensor) -> dict[str, PaddedIndex]:
    """Every index tensor, painted into one `[sum(caps) * C_b]` buffer by one binary search.

    The tensors lie end to end; request `i` of tensor `k` is three runs
    (`[10, R_b, 3]`) whose start and shift are linear in
    `(b, c, total, C_b)` (`runs`, this rank's multipliers from
    `state.constants`): four fused multiply-adds give them all. Runs are
    non-decreasing through the buffer and the first starts at slot 0; a slot
    holds `slot + shift` of the last run starting at or before it, and the
    closing runs turn every tail into padding (negative, clamped to 0).
    """
    caps = [k * Cb for k in range_tables(P)[0]]
    size = sum(caps)
    b, c = geo.own.prefill_chunk_start[:-1, None], geo.own.prefill_chunk[:, None]  # decodes: c = 0
    total = geo.own.prefill_chunk_start[-1]
    by_b, by_c, by_total, by_cb = runs.unbind(0)  # each [2, 10, 1, 3]: (start, shift)
    both = torch.addcmul(torch.addcmul(torch.addcmul(by_cb * Cb, by_total, total), by_b, b), by_c, c)
    starts, shifts = both.flatten(1).unbind(0)  # [10 * R_b * 3] each
    slot = torch.arange(size, dtype=torch.int64, device=c.device)
    run = segment_of(starts[1:], slot)  # starts[0] == 0: the run holding each slot
    painted = (slot + shifts.index_select(0, run)).clamp(min=0).to(torch.int32)
    lengths = total * by_c[0, :, 0, 2]  # each tensor ends where its last request closes: c-multiple
    return {
        name: PaddedIndex(index=x, length=lengths[k])
        for k, (name, x) in enumerate(zip(_INDEX_NAMES, painted.split(caps)))
    }


@entry_op
def attention_metadata(
    state: PCPState,
    batch: SchedulerBatch,
    *,
    decode_seq_lens: torch.Tensor | None = None,
) -> tuple[PCPState, AttentionMetadata]:
    """The rank's attention index metadata for `batch` (vllm-ascend `generate_pcp_metadata`).

    Reads only `state.config` and `state.rank`; the state passes through
    unchanged. On the real rows every field equals vllm-ascend's for the same
    step (the runner passes the post-split local query lengths, which this op
    derives from the batch itself).

    Args:
        decode_seq_lens: `[R_b]` optional context lengths of the decodes (the
            vllm-ascend's `fixed_decode_seq_lens_cpu` under async speculative
            decoding); default `num_computed + num_scheduled`. Its type, integer
            dtype and shape are checked (`TypeError` / `ValueError`); its values
            are device data, never read on the host: lengths in `[0, INT32_MAX]` are
            the caller's contract (a negative one holds no token:
            [`pcp_fn.cp_local_seq_lens`][]).

    Raises:
        ValueError: a config whose layout is not DualChunkSwap's, or a bucket whose
            `P * L_b` gathered rows pass the int32 index tensors (static, no sync).

    Example, `P = 4`, rank 3, fresh prefills `[8, 12]` (local lengths
    `[2, 4]`, `c = [1, 2]`, `h = 3`, `t = 4`):

        q_head_idx        [0, 2, 3]            q_tail_idx [1, 4, 5]
        q_full_idx        [0, 3, 1, 2, 4, 5]
        kv_tail_proj_idx  [0..4] ++ [8..17]    (range(kv_off, kv_off + c*(t+1)), kv_off = 0, 8)
        kv_with_q_head_attn_idx_in_tail  [0..3] ++ [5..12]
        head_actual_seq_lengths_kv [4, 12]     tail_actual_seq_lengths_kv [5, 15]
    """
    _check_inputs(state, batch, decode_seq_lens)
    cfg = state.config
    P, D = cfg.pcp_size, cfg.dcp_size
    Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
    is_decode = classify_decodes(cfg, batch.num_scheduled, batch.num_computed, batch.num_prompt)
    geo = request_geometry(cfg, batch.num_scheduled, is_decode, state.constants)
    order = padded_order(cfg, geo, Lb, state.constants)

    computed = batch.num_computed
    if decode_seq_lens is None:  # a decode's context: computed + scheduled (<= INT32_MAX: make_batch)
        context = torch.addcmul(computed, batch.num_scheduled, is_decode)
    else:  # in the wider dtype: an int64 length is split before the int32 cast, never wrapped first
        context = torch.where(is_decode, decode_seq_lens, computed)
    lens = cp_local_seq_lens(context, P, D, cfg.cp_kv_cache_interleave_size)  # exact at INT32_MAX
    meta = AttentionMetadata(
        num_computed_tokens_of_pcp_dcp=lens.to(torch.int32),
        num_actual_tokens_pcp_padded=geo.own.padded_start[-1],
        pcp_unpad_mask=order.unpad_mask,
        pcp_allgather_restore_idx=order.restore_index,
        query_lens_pcp_full=batch.num_scheduled,
        max_query_len_pcp_full=batch.num_scheduled.max(),
        num_decode_reqs=geo.num_decode_reqs,
        num_prefill_reqs=batch.num_reqs - geo.num_decode_reqs,
    )
    if P == 1:
        return state, meta

    # Decodes take no part: their chunk is 0, so every offset starts at the first prefill.
    rank = state.pcp_rank
    index = _index_tensors(P, Lb // 2, geo, select_rank(state.constants["attn_runs"], rank))
    sums = _prefill_seqlens(state, geo, Rb)
    return state, dataclasses.replace(
        meta,
        **index,
        attn_chunk_seqlens=sums[0],
        attn_mask_seqlens=sums[1],
        head_attn_nomask_seqlens=sums[2],
        tail_attn_nomask_seqlens=sums[3],
        head_actual_seq_lengths_kv=sums[4],
        tail_actual_seq_lengths_kv=sums[5],
    )


def _check_inputs(state: PCPState, batch: SchedulerBatch, decode_seq_lens: torch.Tensor | None) -> None:
    """[`attention_metadata`][pcp_fn.attention_metadata]'s static checks: the state and the batch of
    one config, of a DualChunkSwap layout, a bucket its int32 outputs can address,
    `decode_seq_lens [R_b]` integers."""
    check_batch(state, batch)
    cfg = state.config
    if cfg.layout_name not in ("dcs", "hybrid"):  # the chunk rules below are DualChunkSwap's
        raise ValueError(
            f"attention_metadata follows the DualChunkSwap chunks; the {cfg.layout_name!r} layout "
            "builds its own attention metadata"
        )
    P, Rb, Lb = cfg.pcp_size, batch.bucket.num_reqs, batch.bucket.num_tokens
    if P * Lb > INT32_MAX:  # the int32 index tensors and lengths count up to P * L_b rows
        raise ValueError(
            f"attention_metadata's int32 index tensors address the bucket's P * L_b = {P} * {Lb} gathered "
            f"rows, past the int32 limit {INT32_MAX} (vllm-ascend's metadata is int32 too): a batch this "
            "large has no attention metadata"
        )
    if decode_seq_lens is not None:  # a wrong shape would broadcast or fail inside torch.where
        check_int_tensor("decode_seq_lens", decode_seq_lens, (Rb,), "R_b, one per request row of the batch")


def _prefill_seqlens(state: PCPState, geo: RequestGeometry, Rb: int) -> torch.Tensor:
    """`[6, R_b]` int32 per-request lengths of the rank's prefill chunks, in the order
    `attn_chunk_seqlens`, `attn_mask_seqlens`, `head_attn_nomask_seqlens`,
    `tail_attn_nomask_seqlens`, `head_actual_seq_lengths_kv`, `tail_actual_seq_lengths_kv`
    (vllm-ascend `generate_pcp_metadata`'s lists).

    Entry `j` is the `j`-th prefill (request `num_decode_reqs + j`): each length is a
    rank-dependent mix (`attn_sums`) of the prefill-chunk prefix sums before and through it;
    past the prefills, the total (empty requests).
    """
    entry = (geo.request_ids + geo.num_decode_reqs + state.constants["attn_pair"]).clamp(max=Rb)
    before, through = geo.own.prefill_chunk_start.index_select(0, entry.flatten()).view(2, Rb)
    scale_before, scale_through = select_rank(state.constants["attn_sums"], state.pcp_rank)[:, :, None]
    return torch.addcmul(scale_before * before, scale_through, through).to(torch.int32)
