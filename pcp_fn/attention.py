"""Attention index metadata: the seed's ``generate_pcp_metadata`` as one fixed-shape op.

For a prefill split DualChunkSwap-style, rank ``r`` holds two query chunks of
each prefill request: the head chunk ``h = r`` and the tail chunk
``t = 2P-1-r``. After the K/V all-gather every rank holds the request's whole
padded K/V (``2P`` chunks of ``c = local_len // 2`` rows). Causal attention of a
query chunk ``k`` then splits into the K/V rows strictly before chunk ``k``
(no mask needed) and chunk ``k`` itself (causal mask). The metadata lists those
rows, request after request, in the prefill part of the batch (decodes are
skipped: offsets start at the first prefill). ``P = 2``, rank 0, one fresh
prefill of 8 tokens (``local_len = 4``, ``c = 2``, ``h = 0``, ``t = 3``)::

    local query rows        0 1 | 2 3          q_head_idx [0, 1]   q_tail_idx [2, 3]
    gathered K/V chunks     [0 1|2 3|4 5|6 7]
    head: nomask []         mask [0, 1]
    tail: nomask [0..5]     mask [6, 7]
    kv_tail_proj_idx [0..7] (every K/V row the tail chunk attends to)
    kv_with_q_head_attn_idx_in_tail [0, 1]   kv_with_q_tail_attn_idx_in_tail [0..7]
    q_full_idx [0, 1, 2, 3] (argsort of head ++ tail: back to the local query order)

Every index tensor is a run of consecutive integers per request, so the whole
metadata is a handful of index kernels: one ``expand_runs`` per run layout
(``pcp_fn.ragged``), one cumulative sum for the per-request lengths.
"""

from __future__ import annotations

import dataclasses

import torch

from .batch import SchedulerBatch
from .layout import classify_decodes, gathered_order, request_geometry
from .pytree import pytree_dataclass
from .ragged import expand_runs, masked_gather, offsets
from .seqlens import cp_local_seq_lens
from .state import PCPState


@pytree_dataclass
class PaddedIndex:
    """An index tensor padded to a static capacity, with its real length.

    Fields:
        index: ``[cap]`` int32; ``index[:length]`` is the seed's tensor, the
            rest is 0 (an in-range row whenever the indexed tensor is non-empty).
        length: 0-d int64, the seed tensor's ``numel()``.
    """

    index: torch.Tensor
    length: torch.Tensor


@pytree_dataclass
class AttentionMetadata:
    """Per-step PCP attention metadata of one rank (seed ``AscendPrefillContextParallelMetadata``).

    Shapes derive from ``(config, bucket)`` only: ``R_b`` request rows, ``L_b``
    local token rows, ``C_b = L_b // 2`` chunk rows. ``None`` fields are absent
    statically (``P == 1``).

    Always present:
        num_computed_tokens_of_pcp_dcp: ``[R_b, P, D]`` int32, context tokens
            held by each (pcp, dcp) rank; context = computed + scheduled for a
            decode (or ``decode_seq_lens``), computed for a prefill; 0 past
            ``num_reqs``.
        num_actual_tokens_pcp_padded: 0-d int64, ``P * num_tokens``.
        pcp_unpad_mask: ``[P*L_b]`` bool, the layout's unpad mask (False past
            ``P * num_tokens``).
        pcp_allgather_restore_idx: ``[P*L_b]`` int64, the layout's restore
            index (addresses fixed ``[L_b]`` rank buffers; see README).
        query_lens_pcp_full: ``[R_b]`` int32 scheduled tokens before the split.
        max_query_len_pcp_full: 0-d int32, their max.
        num_decode_reqs, num_prefill_reqs: 0-d int64; ``num_prefill_reqs`` is
            the length of every per-request vector below.

    ``P > 1`` only, index tensors (:class:`PaddedIndex`, int32, into the
    prefill part: local query rows from the first prefill token, gathered K/V
    rows from the first prefill's padded K/V), with capacities
    (rank-independent, so every rank has the same shapes):
        q_head_idx, q_tail_idx: ``[C_b]``.
        q_full_idx: ``[2*C_b]``.
        kv_with_q_head_nomask_idx: ``[(P-1)*C_b]``; kv_with_q_head_mask_idx: ``[C_b]``.
        kv_with_q_tail_nomask_idx: ``[(2P-1)*C_b]``; kv_with_q_tail_mask_idx: ``[C_b]``.
        kv_tail_proj_idx, kv_with_q_tail_attn_idx_in_tail: ``[2P*C_b]``.
        kv_with_q_head_attn_idx_in_tail: ``[P*C_b]``.
    (The real lengths are ``C``, ``2C``, ``h*C``, ``t*C``, ``(t+1)*C`` and
    ``(h+1)*C`` with ``C = sum of c <= C_b`` because ``2C <= L_b``.)

    ``P > 1`` only, per-request vectors ``[R_b]`` int32, entry ``j`` for the
    ``j``-th prefill request (the seed's lists, which skip decodes):
        attn_chunk_seqlens: ``c``; 0 past ``num_prefill_reqs``.
        attn_mask_seqlens, head_attn_nomask_seqlens, tail_attn_nomask_seqlens,
        head_actual_seq_lengths_kv, tail_actual_seq_lengths_kv: inclusive
            cumulative sums of ``c``, ``h*c``, ``t*c``, ``(h+1)*c``,
            ``(t+1)*c``; past ``num_prefill_reqs`` they repeat the total (empty
            requests).

    Not here: the hybrid-attention fields (``pcp_exit_fa_scatter_idx``,
    ``pcp_fa_query_idx``, ``pcp_enter_fa_restore_idx``,
    ``pcp_fa_padding_restore_idx``, ``max_num_tokens_across_pcp``,
    ``pcp_padded_tokens_fla``, ``total_num_scheduled_tokens``) belong to the
    hybrid layout; the speculative-decode ``dcp_mtp_attn_mask`` is not part of
    this op.
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


def _ranges(lengths: torch.Tensor, firsts: torch.Tensor, cap: int) -> torch.Tensor:
    """``[k, cap]``: run ``i`` (``lengths[i]`` slots) counts up from ``firsts[:, i]``; 0 past the end.

    ``lengths [2, 0, 3]``, ``firsts [[5, 9, 0]]``, ``cap 6`` -> ``[[5, 6, 0, 1, 2, 0]]``
    (the seed's ``extend(range(first, first + length))`` per request).
    """
    starts = offsets(lengths)
    slot = torch.arange(cap, dtype=torch.int64, device=lengths.device)
    values = expand_runs(starts[:-1], firsts - starts[:-1], cap) + slot
    return torch.where(slot < starts[-1], values, 0).to(torch.int32)


def _padded(index: torch.Tensor, length: torch.Tensor) -> PaddedIndex:
    return PaddedIndex(index=index, length=length.to(torch.int64))


def attention_metadata(
    state: PCPState,
    batch: SchedulerBatch,
    *,
    decode_seq_lens: torch.Tensor | None = None,
) -> tuple[PCPState, AttentionMetadata]:
    """The rank's attention index metadata for ``batch`` (seed ``generate_pcp_metadata``).

    Reads only ``state.config`` and ``state.rank``; the state passes through
    unchanged. On the real rows every field equals the seed's for the same
    step (the runner passes the post-split local query lengths, which this op
    derives from the batch itself).

    Args:
        decode_seq_lens: ``[R_b]`` optional context lengths of the decodes (the
            seed's ``fixed_decode_seq_lens_cpu`` under async speculative
            decoding); default ``num_computed + num_scheduled``.

    Example, ``P = 4``, rank 3, fresh prefills ``[8, 12]`` (local lengths
    ``[2, 4]``, ``c = [1, 2]``, ``h = 3``, ``t = 4``)::

        q_head_idx        [0, 2, 3]            q_tail_idx [1, 4, 5]
        q_full_idx        [0, 3, 1, 2, 4, 5]
        kv_tail_proj_idx  [0..4] ++ [8..17]    (range(kv_off, kv_off + c*(t+1)), kv_off = 0, 8)
        kv_with_q_head_attn_idx_in_tail  [0..3] ++ [5..12]
        head_actual_seq_lengths_kv [4, 12]     tail_actual_seq_lengths_kv [5, 15]
    """
    cfg = state.config
    if cfg.hybrid_attn:
        raise NotImplementedError("attention_metadata: the hybrid-attention layout is not implemented yet")
    P, D = cfg.pcp_size, cfg.dcp_size
    Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
    is_decode = classify_decodes(cfg, batch)
    geo = request_geometry(cfg, batch.num_scheduled, is_decode)
    order = gathered_order(geo, P, Lb)

    computed = batch.num_computed
    decode_context = computed + batch.num_scheduled if decode_seq_lens is None else decode_seq_lens
    context = torch.where(is_decode, decode_context.to(computed.dtype), computed)
    num_decode_reqs = is_decode.sum()
    meta = AttentionMetadata(
        num_computed_tokens_of_pcp_dcp=cp_local_seq_lens(context, P, D, cfg.cp_kv_cache_interleave_size),
        num_actual_tokens_pcp_padded=P * geo.local.sum(),
        pcp_unpad_mask=order.unpad_mask,
        pcp_allgather_restore_idx=order.restore_index,
        query_lens_pcp_full=batch.num_scheduled,
        max_query_len_pcp_full=batch.num_scheduled.max(),
        num_decode_reqs=num_decode_reqs,
        num_prefill_reqs=batch.num_reqs.to(torch.int64) - num_decode_reqs,
    )
    if P == 1:
        return state, meta

    h = state.pcp_rank
    t = 2 * P - 1 - h
    Cb = Lb // 2
    # Decodes take no part: give them empty chunks, and every offset starts at the first prefill.
    c = torch.where(geo.replicated, 0, geo.local // 2)
    q_off = 2 * offsets(c)[:-1]
    kv_off = P * q_off
    total = c.sum()

    # Four index tensors share one run layout: c rows per request.
    q_head, q_tail, kv_head_mask, kv_tail_mask = _ranges(
        c, torch.stack([q_off, q_off + c, kv_off + h * c, kv_off + t * c]), Cb
    )
    # Tail projection: the K/V rows the tail chunk sees; the "in tail" indices address it.
    tail_proj, tail_in_tail = _ranges(
        (t + 1) * c, torch.stack([kv_off, (t + 1) * offsets(c)[:-1]]), 2 * P * Cb
    )
    head_in_tail = _ranges((h + 1) * c, ((t + 1) * offsets(c)[:-1])[None], P * Cb)[0]
    head_nomask = _ranges(h * c, kv_off[None], (P - 1) * Cb)[0]
    tail_nomask = _ranges(t * c, kv_off[None], (2 * P - 1) * Cb)[0]
    # q_full_idx = argsort(q_head ++ q_tail): local row p of request i at head offset j comes
    # from slot c_before + j, at tail offset j from slot total + c_before + j. Two runs per
    # request (head, tail), each "row + shift".
    c_before = offsets(c)[:-1]
    interleave = lambda a, b: torch.stack(torch.broadcast_tensors(a, b), dim=-1).flatten(-2)  # noqa: E731
    shift = expand_runs(
        interleave(q_off, q_off + c), interleave(c_before - q_off, total + c_before - q_off - c), 2 * Cb
    )
    row = torch.arange(2 * Cb, dtype=torch.int64, device=c.device)
    q_full = torch.where(row < 2 * total, row + shift, 0).to(torch.int32)

    # Per-request vectors: entry j is the j-th prefill (request num_decode_reqs + j).
    req = num_decode_reqs + torch.arange(Rb, dtype=torch.int64, device=c.device)
    cum = torch.cumsum(c, 0)[req.clamp(max=Rb - 1)]  # past the end: the total (empty requests)
    as_i32 = lambda x: x.to(torch.int32)  # noqa: E731
    return state, dataclasses.replace(
        meta,
        q_head_idx=_padded(q_head, total),
        q_tail_idx=_padded(q_tail, total),
        q_full_idx=_padded(q_full, 2 * total),
        kv_with_q_head_nomask_idx=_padded(head_nomask, h * total),
        kv_with_q_head_mask_idx=_padded(kv_head_mask, total),
        kv_with_q_tail_nomask_idx=_padded(tail_nomask, t * total),
        kv_with_q_tail_mask_idx=_padded(kv_tail_mask, total),
        kv_tail_proj_idx=_padded(tail_proj, (t + 1) * total),
        kv_with_q_head_attn_idx_in_tail=_padded(head_in_tail, (h + 1) * total),
        kv_with_q_tail_attn_idx_in_tail=_padded(tail_in_tail, (t + 1) * total),
        attn_chunk_seqlens=as_i32(masked_gather(c, req, req < Rb, 0)),
        attn_mask_seqlens=as_i32(cum),
        head_attn_nomask_seqlens=as_i32(h * cum),
        tail_attn_nomask_seqlens=as_i32(t * cum),
        head_actual_seq_lengths_kv=as_i32((h + 1) * cum),
        tail_actual_seq_lengths_kv=as_i32((t + 1) * cum),
    )
