"""The hybrid-attention layout (``config.hybrid_attn``, e.g. qwen3-next / qwen3.5).

A hybrid model has linear-attention (FLA / GDN) layers and full-attention (FA)
layers. The linear layers need each request's tokens *contiguous* on a rank, so
a prefill of ``n`` tokens is split linearly: rank ``q`` holds ``n // P + (q < n % P)``
consecutive tokens (``_get_cp_local_seq_lens`` with interleave 1). The FA layers
keep the DualChunkSwap (DCS) layout of :mod:`pcp_fn.dcs.layout`. The index maps here
move hidden states between the two around every FA layer. Decodes are not
split (every rank holds all their tokens) and come first on every rank.

Worked example (vllm-ascend's own test), ``P = 2``, two fresh prefills ``[3, 5]``::

    request                   0 (n=3)          1 (n=5)
    linear split              r0: t0 t1        r0: t0 t1 t2
                              r1: t2           r1: t3 t4
    rank 0 linear rows        [0 1 | 0 1 2]    pcp_tokens [2, 3], positions [0, 1, 0, 1, 2]
    rank 1 linear rows        [2 | 3 4]        pcp_tokens [1, 2], positions [2, 3, 4]
    max_num_tokens_across_pcp M = 5            every rank pads its linear rows to M

    FA input (compact order: decodes, then prefill tokens in scheduler order)
      = gathered[enter_fa_restore_idx]; gathered = all_gather of the M-row buffers:
      [0, 1, 5, 2, 3, 4, 6, 7]          (vllm-ascend's: rank 1's rows start at M = 5;
                                         pcp_fn's at L_b, see "Fixed shapes")
    DCS padded order (requests padded to 2P = 4, 4 and 8 rows, 3 pads)
      = fa_input_with_a_zero_row[fa_padding_restore_idx]:
      [0, 1, 2, 8, 3, 4, 5, 6, 7, 8, 8, 8]   (8 = the pad row)
    this rank's FA queries in the DCS prefill order: fa_query_idx [0, 3, 4, 5, 10, 11]
    back to the linear rows: exit_fa_scatter_idx [0, 6, 2, 3, 8] (rows of the
      all-gathered FA outputs, each rank's DCS prefill queries, 6 per rank)

Fixed shapes: per-token outputs have the bucket's ``L_b`` local rows or
``P * L_b`` gathered rows. ``L_b`` holds the DCS local count ``N_dcs``, which
bounds ``M`` and every rank's linear count (see :mod:`pcp_fn.dcs.config`). Rank
buffers in a gathered tensor are the fixed ``[L_b]`` local buffers, so indices
into gathered buffers read ``rank * L_b + row`` where vllm-ascend reads
``rank * M + row`` (enter) or ``rank * (N_dcs - D) + row`` (exit); with ``L_b``
equal to those sizes they are vllm-ascend's, value for value.

Decode order in the FA input (from vllm-ascend): without speculative tokens
(``num_spec_tokens == 0``) token-major, ``[t0r0, t0r1, ..., t1r0, ...]``; with
them (vllm-ascend's ``speculative_config`` set) rank-major,
``[r0: t0 .. t(D-1), r1: ...]``. vllm-ascend's token-major branch counts decode
*requests*; here it counts decode *tokens*, the same whenever every decode has
one token (the only case that branch handles: a zero-token decode makes vllm-ascend
raise in ``_build_fa_padding_restore_idx``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from ..core.pytree import pytree_dataclass
from ..core.ragged import arange_of, expand_runs, offsets, take
from ..dcs.batch import SchedulerBatch
from ..dcs.layout import (
    GatheredOrder,
    LayoutUpdate,
    LocalRows,
    RequestGeometry,
    TokenLayout,
    batch_is_decode,
    gathered_order,
    local_rows,
    next_state,
    request_geometry,
)
from ..dcs.state import PCPState


class LinearSplit(NamedTuple):
    """Per-request sizes of the linear split; ``[n]`` int64 unless said otherwise."""

    counts: torch.Tensor  # [n, P] prefill tokens of every rank (0 for decodes)
    local: torch.Tensor  # tokens on this rank: n for a decode, counts[:, rank] for a prefill
    offset: torch.Tensor  # first token of the request this rank holds (0 for decodes)
    local_start: torch.Tensor  # [n + 1] first local linear row of each request, then the total
    num_decode_tokens: torch.Tensor  # 0-d D
    max_tokens: torch.Tensor  # 0-d M = D + sum(counts[:, 0]): rank 0 holds the most
    fa_len: torch.Tensor  # 0-d rows of the compact FA input: P * D + prefill tokens


def linear_split(
    P: int,
    num_scheduled: torch.Tensor,
    is_decode: torch.Tensor,
    rank: int | torch.Tensor,
    *,
    arange: torch.Tensor | None = None,
) -> LinearSplit:
    """Linear split of every prefill over ``P`` ranks; ``rank`` an int or a 0-d tensor.

    ``P = 2``, ``[1, 3, 5]`` with request 0 a decode, rank 1:
    ``counts [[0, 0], [2, 1], [3, 2]]``, ``local [1, 1, 2]``, ``offset [0, 2, 3]``.
    """
    n = num_scheduled.to(torch.int64)  # a no-op given the geometry's int64 counts
    base = n // P
    rem = n - base * P
    q = arange_of(P, n.device, arange)
    counts = (base[:, None] + (q < rem[:, None])).masked_fill(is_decode[:, None], 0)
    local = torch.where(is_decode, n, base + (rem > rank))
    before = torch.minimum(rem, rank) if isinstance(rank, torch.Tensor) else rem.clamp(max=rank)
    offset = (rank * base + before).masked_fill(is_decode, 0)
    D = (n * is_decode).sum()
    return LinearSplit(
        counts=counts,
        local=local,
        offset=offset,
        local_start=offsets(local),
        num_decode_tokens=D,
        max_tokens=D + counts[:, 0].sum(),  # rank 0 holds the most
        fa_len=(P - 1) * D + n.sum(),
    )


def linear_rows(split: LinearSplit, num_rows: int, *, arange: torch.Tensor | None = None) -> LocalRows:
    """Request and position (offset inside the scheduled tokens) of each local linear row.

    One run per request: row ``local_start[i] + j`` is token ``offset[i] + j``. ``arange``: a
    shared int64 arange (:func:`pcp_fn.core.ragged.arange_of`).
    """
    start = split.local_start
    ids = arange_of(split.local.shape[-1], start.device, arange)
    shift, request = expand_runs(
        start[:-1], torch.stack([split.offset - start[:-1], ids]), num_rows, arange=arange
    )
    row = arange_of(num_rows, start.device, arange)
    valid = row < start[-1]
    return LocalRows(request * valid, (row + shift) * valid, valid)


def enter_fa_restore_index(
    split: LinearSplit, P: int, rows_per_rank: int, spec_decode: bool, *, arange: torch.Tensor | None = None
) -> torch.Tensor:
    """``[P * rows_per_rank]`` int64: gathered linear row of each compact FA-input row.

    Compact FA order: the ``P * D`` replicated decode rows (token-major, or
    rank-major when ``spec_decode``), then every prefill token in scheduler
    order. Rank ``q``'s local linear row ``l`` is gathered row
    ``q * rows_per_rank + l``; a prefill's tokens held by one rank form a run
    in which the gathered row grows with the FA row. 0 past ``fa_len``.
    """
    size = P * rows_per_rank
    D, counts = split.num_decode_tokens, split.counts
    dev = counts.device
    k = arange_of(size, dev, arange)
    if spec_decode:
        rank = k // D.clamp(min=1)
        decode_row = rank * rows_per_rank + (k - rank * D)
    else:
        decode_row = (k % P) * rows_per_rank + k // P
    # runs (request i, rank q), request-major: the linear split keeps a request's tokens in rank order
    run_len = counts.flatten()
    run_start = P * D + offsets(run_len)[:-1]
    before = torch.cumsum(counts, 0) - counts  # [n, P] rank q's rows of earlier requests (contiguous)
    q = arange_of(P, dev, arange)
    gathered_start = q * rows_per_rank + D + before
    prefill_row = k + expand_runs(run_start, gathered_start.flatten() - run_start, size, arange=arange)
    return torch.where(k < P * D, decode_row, prefill_row * (k < split.fa_len))


def fa_padding_restore_index(
    order: GatheredOrder, split: LinearSplit, P: int, *, arange: torch.Tensor | None = None
) -> torch.Tensor:
    """``[G]`` int64: compact FA-input row of each DCS padded-order row.

    vllm-ascend ``_build_fa_padding_restore_idx``.

    Decode region (first ``P * D`` rows): the identity. Prefill region: a real
    row takes its token's compact row ``P * D + (token - D)``; a pad row, and
    every row past ``P * N_dcs``, takes ``fa_len`` (one past the compact rows:
    the consumer appends one zero row there). Where vllm-ascend returns ``None``
    (no prefill pads) this is the identity on ``[:P * N_dcs]``.
    """
    D = split.num_decode_tokens
    g = arange_of(order.unpad_mask.shape[0], D.device, arange)
    real = torch.where(order.unpad_mask, order.token + (P - 1) * D, split.fa_len)
    return torch.where(g < P * D, g, real)


def _shifted(
    values: torch.Tensor, shift: torch.Tensor, length: torch.Tensor, arange: torch.Tensor | None
) -> torch.Tensor:
    """``out[j] = values[j + shift]`` for ``j < length``, 0 elsewhere (``[cap]`` -> ``[cap]``)."""
    j = arange_of(values.shape[0], values.device, arange)
    return take(values, j + shift) * (j < length)


def fa_query_index(
    geo: RequestGeometry,
    dcs: LocalRows,
    D: torch.Tensor,
    num_tokens_padded: torch.Tensor,
    P: int,
    *,
    arange: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[L_b]`` int64: DCS padded-order row (relative to the prefill region) of this rank's prefill queries.

    This rank's DCS local rows after its ``D`` decode rows, i.e. vllm-ascend's
    ``get_current_rank_positions(padded_start, rank)[D:] - P * D``; length
    ``N_dcs - D``, 0 past it.
    """
    padded_row = geo.padded_start[dcs.request] + dcs.position - P * D
    return _shifted(padded_row, D, num_tokens_padded - D, arange)


def exit_fa_scatter_index(
    geo: RequestGeometry,
    lin: LocalRows,
    split: LinearSplit,
    P: int,
    rows_per_rank: int,
    *,
    arange: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[L_b]`` int64: row of the all-gathered DCS prefill queries holding each local linear prefill token.

    Token ``o`` of a prefill sits in DCS chunk ``k = o // c``, owned by rank
    ``k`` (head, ``k < P``) or ``2P-1-k`` (tail), at that rank's DCS prefill row
    ``local_start - D + (o - k*c)`` (head) or ``... + c + (o - k*c)`` (tail).
    Rank ``q``'s prefill queries are gathered at ``q * rows_per_rank``. Length
    ``num_tokens - D`` (this rank's linear prefill tokens), 0 past it.
    """
    D = split.num_decode_tokens
    req, o = lin.request, lin.position
    c = geo.chunk[req].clamp(min=1)
    k = o // c
    head = k < P
    owner = torch.where(head, k, 2 * P - 1 - k)
    within = o - k * c + c.masked_fill(head, 0)
    row = owner * rows_per_rank + geo.local_start[req] - D + within
    return _shifted(row, D, split.local_start[-1] - D, arange)


@pytree_dataclass
@dataclasses.dataclass(frozen=True)  # explicit: a subclass would otherwise reuse TokenLayout's fields
class HybridLayout(TokenLayout):
    """What ``update_tokens`` returns when ``config.hybrid_attn`` (``R_b``, ``L_b`` from the bucket).

    The :class:`TokenLayout` fields keep their meaning, with the linear split
    for the local rows:

    - ``pcp_tokens`` ``[R_b]`` int32: linear tokens of each request on this
      rank (decodes: all ``n``); vllm-ascend's ``update_tokens_for_pcp(...)[0]``.
    - ``positions``, ``request_index`` ``[L_b]``: of the linear local rows
      (vllm-ascend ``[1]``); ``num_tokens``: their count (vllm-ascend ``total_num_scheduled_tokens``).
    - ``num_pads``, ``unpad_mask``, ``restore_index``: of the DCS layout the FA
      layers use (identical to the non-hybrid ones).

    Hybrid-only fields (0-d int64 unless said otherwise):
        pcp_tokens_padded: ``[R_b]`` int32 DCS tokens of each request on each
            rank (vllm-ascend ``num_scheduled_tokens_padded``: the FA query lengths).
        num_tokens_padded: ``N_dcs = sum(pcp_tokens_padded)`` (vllm-ascend
            ``num_actual_tokens_pcp_padded // P``).
        max_num_tokens_across_pcp: ``M``, linear rows of the fullest rank;
            every rank's linear rows are padded to it before the all-gather.
        pcp_padded_tokens_fla: ``M - num_tokens``, this rank's padding to ``M``.
        total_pcp_padding_tokens_fla: ``P * (M - D) - prefill tokens``.
        enter_fa_restore_idx: ``[P*L_b]`` gathered linear row of each compact
            FA-input row; length ``enter_fa_len``, 0 past it.
        enter_fa_len: ``P * D + prefill tokens`` (vllm-ascend's ``actual_qkv_len``).
        fa_padding_restore_idx: ``[P*L_b]`` compact FA-input row of each DCS
            padded-order row; pads hold ``enter_fa_len``; length ``P * N_dcs``.
        fa_query_idx: ``[L_b]`` this rank's prefill queries in the DCS padded
            prefill order; length ``fa_query_len = N_dcs - D``, 0 past it.
        exit_fa_scatter_idx: ``[L_b]`` row of the all-gathered FA prefill
            queries (``rank * L_b + query``) for each local linear prefill
            token; length ``exit_fa_len = num_tokens - D``, 0 past it.
    """

    pcp_tokens_padded: torch.Tensor
    num_tokens_padded: torch.Tensor
    max_num_tokens_across_pcp: torch.Tensor
    pcp_padded_tokens_fla: torch.Tensor
    total_pcp_padding_tokens_fla: torch.Tensor
    enter_fa_restore_idx: torch.Tensor
    enter_fa_len: torch.Tensor
    fa_padding_restore_idx: torch.Tensor
    fa_query_idx: torch.Tensor
    fa_query_len: torch.Tensor
    exit_fa_scatter_idx: torch.Tensor
    exit_fa_len: torch.Tensor


def build(state: PCPState, batch: SchedulerBatch) -> LayoutUpdate:
    """The hybrid layout of ``batch`` for ``state``'s rank (see :class:`HybridLayout`)."""
    cfg = state.config
    P, Lb, rank = cfg.pcp_size, batch.bucket.num_tokens, state.pcp_rank
    is_decode = batch_is_decode(cfg, batch)
    # one arange serves every index map below (P * L_b rows at most, R_b request ids)
    ids = torch.arange(max(batch.bucket.num_reqs, P * Lb), dtype=torch.int64, device=is_decode.device)
    geo = request_geometry(cfg, batch.num_scheduled, is_decode, state.constants, arange=ids)
    order = gathered_order(cfg, geo, Lb, state.constants, arange=ids)
    split = linear_split(P, geo.num_scheduled, is_decode, rank, arange=ids)
    lin = linear_rows(split, Lb, arange=ids)
    dcs = local_rows(geo, rank, P, Lb, constants=state.constants, arange=ids)
    D, M = split.num_decode_tokens, split.max_tokens
    num_tokens = split.local_start[-1]
    N_dcs = geo.local_start[-1]
    layout = HybridLayout(
        pcp_tokens=split.local.to(torch.int32),
        positions=lin.position,
        request_index=lin.request,
        num_tokens=num_tokens,
        num_pads=geo.num_pads,
        is_decode=is_decode,
        num_decode_reqs=geo.num_decode_reqs,
        num_decode_tokens=D,
        unpad_mask=order.unpad_mask,
        restore_index=order.restore_index,
        pcp_tokens_padded=geo.local.to(torch.int32),
        num_tokens_padded=N_dcs,
        max_num_tokens_across_pcp=M,
        pcp_padded_tokens_fla=M - num_tokens,
        total_pcp_padding_tokens_fla=P * M - split.fa_len,
        enter_fa_restore_idx=enter_fa_restore_index(split, P, Lb, cfg.num_spec_tokens > 0, arange=ids),
        enter_fa_len=split.fa_len,
        fa_padding_restore_idx=fa_padding_restore_index(order, split, P, arange=ids),
        fa_query_idx=fa_query_index(geo, dcs, D, N_dcs, P, arange=ids),
        fa_query_len=N_dcs - D,
        exit_fa_scatter_idx=exit_fa_scatter_index(geo, lin, split, P, Lb, arange=ids),
        exit_fa_len=num_tokens - D,
    )
    positions = take(batch.num_computed, lin.request) + lin.position  # int64 (the positions' dtype)
    return LayoutUpdate(
        next_state(state, batch, is_decode),
        layout,
        geo,
        positions * lin.valid,
        order.token,
        split.local_start,
    )
