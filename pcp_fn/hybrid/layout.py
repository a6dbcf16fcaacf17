"""The hybrid-attention layout (`config.hybrid_attn`, e.g. qwen3-next / qwen3.5).

A hybrid model has linear-attention (FLA / GDN) layers and full-attention (FA)
layers. The linear layers need each request's tokens *contiguous* on a rank, so
a prefill of `n` tokens is split linearly: rank `q` holds `n // P + (q < n % P)`
consecutive tokens (`_get_cp_local_seq_lens` with interleave 1). The FA layers
keep the DualChunkSwap (DCS) layout of [`pcp_fn.dcs.layout`][]. The index maps here
move hidden states between the two around every FA layer. Decodes are not
split (every rank holds all their tokens) and come first on every rank.

Worked example (vllm-ascend's own test), `P = 2`, two fresh prefills `[3, 5]`:

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

Fixed shapes: per-token outputs have the bucket's `L_b` local rows or
`P * L_b` gathered rows. `L_b` holds the DCS local count `N_dcs`, which
bounds `M` and every rank's linear count (see [`pcp_fn.protocol.config`][]). Rank
buffers in a gathered tensor are the fixed `[L_b]` local buffers, so indices
into gathered buffers read `rank * L_b + row` where vllm-ascend reads
`rank * M + row` (enter) or `rank * (N_dcs - D) + row` (exit); with `L_b`
equal to those sizes they are vllm-ascend's, value for value.

Decode order in the FA input (from vllm-ascend): without speculative tokens
(`num_spec_tokens == 0`) token-major, `[t0r0, t0r1, ..., t1r0, ...]`; with
them (vllm-ascend's `speculative_config` set) rank-major,
`[r0: t0 .. t(D-1), r1: ...]`. vllm-ascend's token-major branch counts decode
*requests*; here it counts decode *tokens*, the same whenever every decode has
one token (the only case that branch handles: a zero-token decode makes vllm-ascend
raise in `_build_fa_padding_restore_idx`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..core.pytree import pytree_dataclass
from ..core.ragged import arange_of, segment_of, segments_of
from ..core.rank import select_rank
from ..dcs.geometry import request_geometry
from ..dcs.layout import PaintedSegments, gathered_segments, paint_gathered
from ..protocol.batch import SchedulerBatch, batch_is_decode
from ..protocol.config import PCPConfig
from ..protocol.rows import GatheredOrder, LayoutUpdate, LocalRows, RequestGeometry, TokenLayout
from ..protocol.state import PCPState, next_state


class LinearRuns(NamedTuple):
    """The linear split of every request as runs of rows, from two scans; int64.

    `m` runs of the compact FA input: `n * P` (request `i`, rank `q`) runs, request-major,
    preceded with speculative tokens configured by `P` rank-major decode runs (`m = (n + 1) * P`).
    """

    counts: torch.Tensor  # [n, P] prefill tokens of every rank (0 for decodes)
    rows: torch.Tensor  # [n, P] linear rows of every request on every rank: counts, or n for a decode
    starts: torch.Tensor  # [n + 1, P] first linear row of every request on every rank, then the total
    fa_end: torch.Tensor  # [m] end of every run of the compact FA input (the last: its length)
    fa_shift: torch.Tensor  # [m] gathered linear row minus compact FA row inside every run


def linear_runs(
    config: PCPConfig,
    geo: RequestGeometry,
    is_decode: torch.Tensor,
    rows_per_rank: int,
    constants: dict[str, torch.Tensor],
) -> LinearRuns:
    """The linear split of the requests of `geo` and the runs of the compact FA input.

    Rank `q` holds `ceil((n - q) / P)` tokens of a prefill of `n` (`n // P + (q < n % P)`).
    Without speculative tokens every decode has at most one token (the decode threshold), so its
    `P` replicated rows in the token-major decode region are `P` runs of (at most) one row, one
    per rank: run `(i, q)` of every request, decode or prefill, is rank `q`'s rows of request
    `i` and starts, in the FA input, after every earlier run (request-major). With them the decode
    region is `P` rank-major runs of `D` rows. Inside a run the gathered row
    `q * rows_per_rank + linear row` grows with the FA row: one shift per run.
    `constants`: `state.constants` (its chunk ranks give `0 .. P-1` and `P-1 .. 0`).
    """
    P = config.pcp_size
    n = geo.num_scheduled
    decode_len = geo.own.replicated_len if P > 1 else n * is_decode  # replicated == decode when P > 1
    chunk_rank = constants["dcs_chunks"][2]  # [0 .. P-1, P-1 .. 0]
    counts = ((n - decode_len)[:, None] + chunk_rank[P:]) // P  # (n + P-1 - q) // P
    rows = counts + decode_len[:, None]
    ends = torch.cumsum(rows, 0)  # decodes come first: a prefill's rows start after every decode's
    starts = F.pad(ends, (0, 0, 1, 0))
    if config.num_spec_tokens > 0:
        decode = geo.num_decode_tokens.expand(1, P)  # rank q's decode rows end at D
        lengths, gathered_end = torch.cat([decode, counts]), torch.cat([decode, ends])
    else:
        lengths, gathered_end = rows, ends
    fa_end = torch.cumsum(lengths.flatten(), 0)
    # gathered end minus FA end: the same shift as at the run's start
    fa_shift = torch.add(gathered_end, chunk_rank[:P], alpha=rows_per_rank).flatten() - fa_end
    return LinearRuns(counts, rows, starts, fa_end, fa_shift)


def paint_enter_fa(runs: LinearRuns, run: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`enter_fa_restore_idx` of the compact FA rows `k` (`arange`) from each row's run: gathered
    linear row, 0 past `fa_len`."""
    return (k + runs.fa_shift.index_select(0, run)) * (k < runs.fa_end[-1])


def enter_fa_rows(runs: LinearRuns, size: int, *, arange: torch.Tensor | None = None) -> torch.Tensor:
    """`[size]` int64 `enter_fa_restore_idx` with one search of the run ends (`arange`: a shared
    int64 arange, [`pcp_fn.core.ragged.arange_of`][])."""
    k = arange_of(size, runs.fa_end.device, arange)
    return paint_enter_fa(runs, segment_of(runs.fa_end[:-1], k), k)


class LinearLocal(NamedTuple):
    """This rank's linear rows; `exit_rows` `[2 L_b]`: padding rows past the bucket (0) let a reader
    shift by up to `L_b` rows without a clamp."""

    rows: LocalRows  # request, position, validity and absolute position of the local rows
    exit_rows: torch.Tensor  # row of the all-gathered DCS prefill queries holding the row's token


def linear_segments(
    runs: LinearRuns,
    geo: RequestGeometry,
    rank: int | torch.Tensor,
    num_computed: torch.Tensor | None,
    rows_per_rank: int,
    constants: dict[str, torch.Tensor],
) -> tuple[PaintedSegments, torch.Tensor]:
    """The `2P n` segments of this rank's linear rows and their start per request (`[n + 1]`).

    Rank `r` holds tokens `[o, o + rows)` of request `i` (`o`: the earlier ranks' counts), at
    local rows from `start[i]`: position `row + o - start[i]`. Split at the DCS chunk
    boundaries (chunk `k`: tokens `[k c, (k + 1) c)`, `c = geo.own.chunk`), a request's rows are
    `2P` segments; in chunk `k` a token sits at DCS prefill row
    `local_start - D + o - k c (+ c for a tail)` of the chunk's rank (`dcs_chunks`: rank and
    `beta_k`), so the exit row also grows with the row. Channels: `[position shift, (absolute
    position shift: num_computed [n] added, when given), exit shift, request]`.
    """
    P = runs.counts.shape[1]
    upto, _, chunk_rank, beta = constants["dcs_chunks"].unbind(0)
    if isinstance(rank, int):
        before = runs.counts[:, :rank].sum(1)
    else:
        before = (runs.counts * (chunk_rank[:P] < rank)).sum(1)
    start = select_rank(runs.starts, rank, dim=1)
    lag = start[:-1] - before  # row - position
    shift = before - start[:-1]
    chunk = geo.own.chunk[:, None]
    ends = torch.clamp(torch.addcmul(lag[:, None], chunk, upto), min=start[:-1, None], max=start[1:, None])
    base = (geo.local_start[:-1] + shift - geo.num_decode_tokens)[:, None]
    exit_shift = torch.addcmul(torch.add(base, chunk_rank, alpha=rows_per_rank), beta, chunk)
    absolute = [] if num_computed is None else [(shift + num_computed)[:, None]]
    columns = (shift[:, None], *absolute, exit_shift, geo.request_ids[:, None])
    table = torch.stack(torch.broadcast_tensors(*columns)).flatten(1)  # [4 (3 without num_computed), 2P n]
    return PaintedSegments(ends.flatten(), table), start


def paint_linear(
    segments: PaintedSegments,
    start: torch.Tensor,
    segment: torch.Tensor,
    row: torch.Tensor,
    rows_per_rank: int,
) -> LinearLocal:
    """[`LinearLocal`][pcp_fn.hybrid.layout.LinearLocal] from the linear segments and each row's
    segment (`row`: `arange(2 L_b)`, or `arange(L_b)` for a reader of the local rows alone;
    `absolute` where the segments have it)."""
    Lb = rows_per_rank
    painted = segments.table.index_select(1, segment)
    valid = row < start[-1]
    masked = painted * valid  # request (0 on padding rows), shifts
    shifted = torch.addcmul(masked[:-1], row, valid)
    absolute = shifted[1, :Lb] if shifted.shape[0] > 2 else None
    local = LocalRows(masked[-1, :Lb], shifted[0, :Lb], valid[:Lb], absolute)
    return LinearLocal(local, shifted[-1])


def query_segments(
    geo: RequestGeometry, rank: int | torch.Tensor, P: int, constants: dict[str, torch.Tensor]
) -> PaintedSegments:
    """The `2n` DCS local segments of this rank (head, tail: [`pcp_fn.dcs.layout.local_rows`][]),
    one channel: local row minus DCS padded row, relative to the prefill region (`+ P * D`).

    In a segment the padded row is `row + padded_start - local_start + c * (chunks before)`.
    """
    le, c = geo.local_start[1:], geo.own.prefill_chunk
    ends = torch.stack([le - c, le], -1).flatten()
    lag = torch.add(geo.own.local_less_padded_start[:-1], geo.num_decode_tokens, alpha=P)[:, None]
    table = torch.addcmul(lag, c[:, None], select_rank(constants["dcs_ranks"], rank), value=-1)
    return PaintedSegments(ends, table.reshape(1, -1))


def paint_queries(
    geo: RequestGeometry, segments: PaintedSegments, segment: torch.Tensor, row: torch.Tensor
) -> torch.Tensor:
    """DCS padded-order row (less `P * D`) of each of this rank's DCS local rows `row` (`arange`),
    0 past `N_dcs`."""
    return (row - segments.table[0].index_select(0, segment)) * (row < geo.local_start[-1])


def fa_padding_restore_index(
    order: GatheredOrder, D: torch.Tensor, fa_len: torch.Tensor, P: int, *, arange: torch.Tensor | None = None
) -> torch.Tensor:
    """`[G]` int64: compact FA-input row of each DCS padded-order row.

    vllm-ascend `_build_fa_padding_restore_idx`.

    Decode region (first `P * D` rows): the identity. Prefill region: a real
    row takes its token's compact row `P * D + (token - D)`; a pad row, and
    every row past `P * N_dcs`, takes `fa_len` (one past the compact rows:
    the consumer appends one zero row there). Where vllm-ascend returns `None`
    (no prefill pads) this is the identity on `[:P * N_dcs]`.
    """
    g = arange_of(order.unpad_mask.shape[0], D.device, arange)
    real = torch.where(order.unpad_mask, torch.add(order.token, D, alpha=P - 1), fa_len)
    return torch.where(g < P * D, g, real)


@pytree_dataclass
@dataclasses.dataclass(frozen=True)  # explicit: a subclass would otherwise reuse TokenLayout's fields
class HybridLayout(TokenLayout):
    """What `update_tokens` returns when `config.hybrid_attn` (`R_b`, `L_b` from the bucket).

    The [`TokenLayout`][pcp_fn.TokenLayout] fields keep their meaning, with the linear split
    for the local rows:

    - `pcp_tokens` `[R_b]` int32: linear tokens of each request on this
      rank (decodes: all `n`); vllm-ascend's `update_tokens_for_pcp(...)[0]`.
    - `positions`, `request_index` `[L_b]`: of the linear local rows
      (vllm-ascend `[1]`); `num_tokens`: their count (vllm-ascend `total_num_scheduled_tokens`).
    - `num_pads`, `unpad_mask`, `restore_index`: of the DCS layout the FA
      layers use (identical to the non-hybrid ones).

    Its own fields are 0-d int64 unless said otherwise.

    Attributes:
        pcp_tokens_padded: `[R_b]` int32 DCS tokens of each request on each
            rank (vllm-ascend `num_scheduled_tokens_padded`: the FA query lengths).
        num_tokens_padded: `N_dcs = sum(pcp_tokens_padded)` (vllm-ascend
            `num_actual_tokens_pcp_padded // P`).
        max_num_tokens_across_pcp: `M`, linear rows of the fullest rank;
            every rank's linear rows are padded to it before the all-gather.
        pcp_padded_tokens_fla: `M - num_tokens`, this rank's padding to `M`.
        total_pcp_padding_tokens_fla: `P * (M - D) - prefill tokens`.
        enter_fa_restore_idx: `[P*L_b]` gathered linear row of each compact
            FA-input row; length `enter_fa_len`, 0 past it.
        enter_fa_len: `P * D + prefill tokens` (vllm-ascend's `actual_qkv_len`).
        fa_padding_restore_idx: `[P*L_b]` compact FA-input row of each DCS
            padded-order row; pads hold `enter_fa_len`; length `P * N_dcs`.
        fa_query_idx: `[L_b]` this rank's prefill queries in the DCS padded
            prefill order; length `fa_query_len = N_dcs - D`, 0 past it.
        exit_fa_scatter_idx: `[L_b]` row of the all-gathered FA prefill
            queries (`rank * L_b + query`) for each local linear prefill
            token; length `exit_fa_len = num_tokens - D`, 0 past it.
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
    """The hybrid layout of `batch` for `state`'s rank (see [`HybridLayout`][pcp_fn.HybridLayout])."""
    cfg = state.config
    P, Lb, rank = cfg.pcp_size, batch.bucket.num_tokens, state.pcp_rank
    is_decode = batch_is_decode(cfg, batch)
    # one arange serves every index map below (P * L_b gathered rows, 2 L_b local rows, R_b request ids)
    size = max(batch.bucket.num_reqs, P * Lb, 2 * Lb)
    ids = torch.arange(size, dtype=torch.int64, device=is_decode.device)
    geo = request_geometry(cfg, batch.num_scheduled, is_decode, state.constants, arange=ids)
    runs = linear_runs(cfg, geo, is_decode, Lb, state.constants)
    linear, start = linear_segments(runs, geo, rank, batch.num_computed, Lb, state.constants)
    chunks = gathered_segments(geo, Lb, state.constants)
    queries = query_segments(geo, rank, P, state.constants)
    padded_row, row = ids[: P * Lb], ids[: 2 * Lb]
    chunk, run, linear_segment, query = segments_of(  # one histogram on the CPU
        (chunks.ends[:-1], padded_row),
        (runs.fa_end[:-1], padded_row),
        (linear.ends[:-1], row),
        (queries.ends[:-1], row),
    )
    order = paint_gathered(cfg, geo, chunks, chunk, padded_row)
    lin = paint_linear(linear, start, linear_segment, row, Lb)
    query_rows = paint_queries(geo, queries, query, row)
    D, M, fa_len = geo.num_decode_tokens, runs.starts[-1, 0], runs.fa_end[-1]  # rank 0 holds the most
    num_tokens = start[-1]
    N_dcs = geo.local_start[-1]
    # the prefill rows follow the D decode rows: row j of both prefill maps reads local row j + D
    prefill_row = ids[:Lb] + D  # D <= L_b: inside the 2 L_b rows, 0 past the local ones
    layout = HybridLayout(
        pcp_tokens=select_rank(runs.rows, rank, dim=1).to(torch.int32),
        positions=lin.rows.position,
        request_index=lin.rows.request,
        num_tokens=num_tokens,
        num_pads=geo.own.num_pads,
        is_decode=is_decode,
        num_decode_reqs=geo.num_decode_reqs,
        num_decode_tokens=D,
        unpad_mask=order.unpad_mask,
        restore_index=order.restore_index,
        pcp_tokens_padded=geo.local.to(torch.int32),
        num_tokens_padded=N_dcs,
        max_num_tokens_across_pcp=M,
        pcp_padded_tokens_fla=M - num_tokens,
        total_pcp_padding_tokens_fla=P * M - fa_len,
        enter_fa_restore_idx=paint_enter_fa(runs, run, padded_row),
        enter_fa_len=fa_len,
        fa_padding_restore_idx=fa_padding_restore_index(order, D, fa_len, P, arange=ids),
        fa_query_idx=query_rows.index_select(0, prefill_row),
        fa_query_len=N_dcs - D,
        exit_fa_scatter_idx=lin.exit_rows.index_select(0, prefill_row),
        exit_fa_len=num_tokens - D,
    )
    assert lin.rows.absolute is not None
    return LayoutUpdate(
        next_state(state, batch, is_decode),
        layout,
        geo,
        lin.rows.absolute,
        order.token,
        start,
    )
