"""The DualChunkSwap token layout: `update_tokens` and the index maps it implies.

With `P` ranks, a prefill of `n` tokens is padded to a multiple of `2P` and
cut into `2P` chunks of `c` tokens; rank `r` owns the head chunk `r` and
the tail chunk `2P-1-r`, so every rank gets the same causal-attention work.
A decode is not split: every rank holds all its `n` tokens. Worked example
(vllm-ascend's docstring), scheduled tokens `[1, 5, 8]`, `P = 2`, request 0 a
decode:

    request                 0 (decode)   1 (n=5 -> 8, c=2)       2 (n=8, c=2)
    gathered (padded) rows  d d          0 1 2 3 4 . . .         0 1 2 3 4 5 6 7
    chunks                  r0 r1        [0 1|2 3|4 .|. .]       [0 1|2 3|4 5|6 7]
                                         r0  r1  r1  r0           r0  r1  r1  r0
    rank 0 positions        0            0 1 6 7                 0 1 6 7
    rank 1 positions        0            2 3 4 5                 2 3 4 5
    pcp_tokens (per rank)   1            4                       4
    num_pads                1            3                       0

After the model, each rank's local rows are all-gathered rank-major
(`[rank0 rows | rank1 rows]`) and `restore_index` puts them back in padded
request order: `[0, 9, 1, 2, 10, 11, 12, 13, 3, 4, 5, 6, 14, 15, 16, 17, 7, 8]`
(with `L = 9` rows per rank). `unpad_mask` marks the real rows of that
order; in the decode region it is token-strided (every P-th row), vllm-ascend's
convention that attention backends rely on.

Every function is fixed-shape: per-request tensors have the bucket's request
rows, per-token tensors its local (`L_b`) or gathered (`P * L_b`) rows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..core.ragged import arange_of, segment_of, segments_of
from ..core.rank import select_rank
from ..protocol.batch import SchedulerBatch, batch_is_decode
from ..protocol.config import PCPConfig, two_chunk_bound
from ..protocol.rows import (
    GatheredOrder,
    LayoutUpdate,
    LocalRows,
    RequestGeometry,
    RestoredSpans,
    TokenLayout,
)
from ..protocol.state import PCPState, next_state
from .attention_tables import attention_constants
from .geometry import request_geometry
from .layout_tables import layout_constants


class PaintedSegments(NamedTuple):
    """Back-to-back segments of a row set and what each one paints (`ends[:-1]`: the
    last segment also takes the padding rows past `ends[-1]`)."""

    ends: torch.Tensor  # [m] non-decreasing
    table: torch.Tensor  # [C, m] channels painted on every row of the segment


def local_segments(
    geo: RequestGeometry,
    rank: int | torch.Tensor,
    P: int,
    *,
    constants: dict[str, torch.Tensor] | None = None,
    num_computed: torch.Tensor | None = None,
) -> PaintedSegments:
    """The `2 R_b` local segments of `rank` (each request's head, then tail): channels
    `[position shift, (absolute position shift,) request]`."""
    ls, cs = geo.local_start[:-1, None], geo.own.prefill_chunk[:, None]
    if constants is not None:
        shift = cs * select_rank(constants["dcs_ranks"], rank) - ls
    else:
        shift = torch.stack([cs * rank, cs * (2 * P - 2 - rank)], -1).squeeze(1) - ls
    ends = torch.stack([geo.local_start[:-1] + geo.own.chunk, geo.local_start[1:]], -1)
    ids = geo.request_ids[:, None].expand(-1, 2)
    channels = [shift] if num_computed is None else [shift, shift + num_computed[:, None]]
    return PaintedSegments(ends.flatten(), torch.stack([*channels, ids]).flatten(1))


def paint_local(
    geo: RequestGeometry, segments: PaintedSegments, segment: torch.Tensor, row: torch.Tensor
) -> LocalRows:
    """[`LocalRows`][pcp_fn.LocalRows] from the local segments and each row's segment (`row`: `arange`)."""
    painted = segments.table.index_select(1, segment)
    valid = row < geo.local_start[-1]
    masked = painted * valid  # request (0 on padding rows), position shifts
    positions = torch.addcmul(masked[:-1], row, valid)
    absolute = positions[1] if positions.shape[0] > 1 else None
    return LocalRows(masked[-1], positions[0], valid, absolute)


def local_rows(
    geo: RequestGeometry,
    rank: int | torch.Tensor,
    P: int,
    num_rows: int,
    *,
    constants: dict[str, torch.Tensor] | None = None,
    num_computed: torch.Tensor | None = None,
    arange: torch.Tensor | None = None,
) -> LocalRows:
    """Request and position of each of `rank`'s local rows.

    A request's local rows are two segments: the head (the whole request for a
    decode) and the tail. Inside a segment the position grows with the row, so
    it is `row + shift` with one shift per segment: head rows read chunk
    `rank` (`rank*c + j`), tail rows chunk `2P-1-rank` (`(2P-1-rank)*c + j`),
    a decode's rows `0 .. n-1`. `rank` may be an int or a 0-d tensor.

    One search of the `2R_b` segment ends paints every row
    ([`pcp_fn.core.ragged.segment_of`][]). `constants` (`state.constants`)
    saves building the rank's chunk multipliers; `num_computed` `[R_b]` adds
    the `absolute` positions (`num_computed[request] + position`); `arange`
    a shared int64 arange for the rows ([`pcp_fn.core.ragged.arange_of`][]).
    """
    segments = local_segments(geo, rank, P, constants=constants, num_computed=num_computed)
    row = arange_of(num_rows, geo.local_start.device, arange)
    return paint_local(geo, segments, segment_of(segments.ends[:-1], row), row)


def gathered_segments(
    geo: RequestGeometry, rows_per_rank: int, constants: dict[str, torch.Tensor]
) -> PaintedSegments:
    """The `2P R_b` chunks of the padded order: channels `[restore shift, pads before
    the request, its token end]` (see [`gathered_order`][pcp_fn.dcs.gathered_order])."""
    upto, upto_copies, chunk_rank, beta = constants["dcs_chunks"].unbind(0)
    ps, chunk = geo.own.padded_start[:-1, None], geo.own.chunk[:, None]
    ends = torch.addcmul(ps, torch.where(geo.replicated[:, None], upto_copies, upto), chunk)
    shift = torch.addcmul(
        torch.add(geo.own.local_less_padded_start[:-1, None], chunk_rank, alpha=rows_per_rank), beta, chunk
    )
    columns = torch.broadcast_tensors(shift, geo.own.pads_start[:-1, None], geo.token_start[1:, None])
    return PaintedSegments(ends.flatten(), torch.stack(columns).flatten(1))


def paint_gathered(
    config: PCPConfig,
    geo: RequestGeometry,
    segments: PaintedSegments,
    segment: torch.Tensor,
    row: torch.Tensor,
) -> GatheredOrder:
    """[`GatheredOrder`][pcp_fn.GatheredOrder] from the chunks and each padded row's chunk (`row`:
    `arange`)."""
    P = config.pcp_size
    painted = segments.table.index_select(1, segment)
    valid = row < geo.own.padded_start[-1]
    token = row - painted[1]
    mask = token < painted[2]
    if config.num_spec_tokens > 0:
        decode = row < P * geo.num_decode_tokens
        mask = torch.where(decode, row % P == 0, mask)
        token = torch.where(decode, row // P, token)
    return GatheredOrder(restore_index=(row + painted[0]) * valid, unpad_mask=mask, token=token)


def padded_order(
    config: PCPConfig,
    geo: RequestGeometry,
    rows_per_rank: int,
    constants: dict[str, torch.Tensor],
    *,
    arange: torch.Tensor | None = None,
) -> GatheredOrder:
    """Restore index, unpad mask and token of every padded-order row.

    A request's padded rows are `2P` chunks laid end to end; chunk `k` comes
    whole from one rank's local buffer: a replicated request's chunk `k < P`
    is rank `k`'s copy (chunks `>= P` are empty); a split request's chunk
    `k < P` is rank `k`'s head, chunk `k >= P` rank `2P-1-k`'s tail.
    Rank `q`'s local row `l` is gathered row `q * rows_per_rank + l`, so
    inside a chunk `restore = row + shift`: one `[R_b, 2P]` table of chunk
    ends and shifts (the chunk multipliers come from `constants`,
    `state.constants`), one search per row. Real rows: a request's
    first `n` rows, token `row - pads_start`; with speculative tokens
    configured the decode region (the first `P * num_decode_tokens` rows,
    decodes come first) is token-strided instead: every `P`-th row, decode
    token `t` at row `t * P` (vllm-ascend's convention; without them every
    decode has at most one token and both rules agree). `token` is left
    unmasked: every reader masks it with `unpad_mask`. `arange`: a shared int64
    arange for the rows ([`pcp_fn.core.ragged.arange_of`][]).
    """
    segments = gathered_segments(geo, rows_per_rank, constants)
    row = arange_of(config.pcp_size * rows_per_rank, geo.local_start.device, arange)
    return paint_gathered(config, geo, segments, segment_of(segments.ends[:-1], row), row)


def build(state: PCPState, batch: SchedulerBatch) -> LayoutUpdate:
    """The DualChunkSwap layout of `batch` for `state`'s rank (see [`TokenLayout`][pcp_fn.TokenLayout])."""
    cfg = state.config
    P, Lb = cfg.pcp_size, batch.bucket.num_tokens
    is_decode = batch_is_decode(cfg, batch)
    # one arange serves the request ids, the local rows and the padded rows
    ids = torch.arange(max(batch.bucket.num_reqs, P * Lb), dtype=torch.int64, device=is_decode.device)
    padded_row, row = ids[: P * Lb], ids[:Lb]
    geo = request_geometry(cfg, batch.num_scheduled, is_decode, state.constants, arange=ids)
    local = local_segments(geo, state.pcp_rank, P, constants=state.constants, num_computed=batch.num_computed)
    chunks = gathered_segments(geo, Lb, state.constants)
    local_segment, chunk = segments_of((local.ends[:-1], row), (chunks.ends[:-1], padded_row))
    mine = paint_local(geo, local, local_segment, row)
    order = paint_gathered(cfg, geo, chunks, chunk, padded_row)
    layout = TokenLayout.of(geo, mine, order, is_decode, geo.own.num_pads)
    assert mine.absolute is not None
    return LayoutUpdate(
        next_state(state, batch, is_decode), layout, geo, mine.absolute, order.token, geo.local_start
    )


def state_geometry(state: PCPState) -> RequestGeometry:
    """Geometry of the state's last update at its bucket's `R_b` request rows."""
    Rb = state.bucket.num_reqs
    return request_geometry(state.config, state.num_scheduled[:Rb], state.is_decode[:Rb], state.constants)


def gathered_order(state: PCPState) -> GatheredOrder:
    """The padded order of the state's last update at its bucket's `P * L_b` rows."""
    return padded_order(state.config, state_geometry(state), state.bucket.num_tokens, state.constants)


def logits_from_geometry(config: PCPConfig, geo: RequestGeometry, num_reqs: torch.Tensor) -> torch.Tensor:
    """`[R_b]` int64: last real token of each request in the padded order, 0 past `num_reqs`.

    vllm-ascend `PCPManager.get_logits_indices`: `cumsum(pcp_tokens) * P - num_pads - 1`.
    """
    # rows past num_reqs schedule nothing (n = 0): (n - 1) + padded_start * real is -1 there
    real = geo.request_ids < num_reqs
    return torch.addcmul(geo.num_scheduled - 1, geo.own.padded_start[:-1], real).clamp(min=0)


def restore_index(state: PCPState) -> torch.Tensor:
    """`[P*L_b]` int64: gathered row of each padded-order row (`TokenLayout.restore_index`)."""
    return gathered_order(state).restore_index


# -- what the spec-decode (MTP) prep reads of the layout (pcp_fn.spec, through pcp_fn.layout_of) --
# Each takes the state's geometry when the caller already has it (`geometry=state_geometry(state)`,
# or the step's own): the spec ops read several of these maps, and rebuilding the geometry for each
# would repeat its scan.
def state_local_rows(state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
    """This rank's `[L_b]` local rows of the state's last update (`TokenLayout.request_index` /
    `positions`): request and offset inside the request's padded tokens, `valid` False past them."""
    cfg = state.config
    geo = state_geometry(state) if geometry is None else geometry
    return local_rows(geo, state.pcp_rank, cfg.pcp_size, state.bucket.num_tokens, constants=state.constants)


def state_local_start(state: PCPState, *, geometry: RequestGeometry | None = None) -> torch.Tensor:
    """`[R_b + 1]` int64: first local row of each request on this rank, then the total.

    `StepOutputs.query_start_loc`: `[0, cumsum(pcp_tokens)]`, the runner's `cu_num_tokens`
    with a leading 0. `P = 2`, tokens `[1, 5, 8]` (request 0 a decode): `[0, 1, 5, 9]`.
    """
    return (state_geometry(state) if geometry is None else geometry).local_start


def restored_spans(state: PCPState, *, geometry: RequestGeometry | None = None) -> RestoredSpans:
    """The padded order: request `i` starts at `padded_start[i]`; a decode's first `n` rows are
    rank 0's copy of its tokens, a prefill's `num_padded` rows its tokens then its pads.

    So request `i`'s last token is row `start + n - 1`: the runner's PCP-adjusted cumulative
    count `cu_num_scheduled_tokens * P - num_pcp_pads` minus one (vllm-ascend
    `_calc_spec_decode_metadata`). `P = 2`, tokens `[1, 5, 8]` (request 0 a decode):
    `start [0, 2, 10]`, `length [1, 8, 8]`.
    """
    geo = state_geometry(state) if geometry is None else geometry
    length = torch.where(geo.replicated, geo.num_scheduled, geo.own.num_padded)
    return RestoredSpans(geo.own.padded_start[:-1], length)


def first_pass_rows(state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
    """`[L_b]` rows of the MTP drafter's first pass on this rank: request and offset inside the
    request's padded tokens (`offset >= n`: a pad), decode tokens first, `valid` False past them.

    In this layout the drafter runs on the target's split, so these are the local rows
    ([`state_local_rows`][pcp_fn.dcs.state_local_rows]): each prefill's head and tail chunks (vllm-ascend
    `_split_spec_decode_pcp_prefill_input`). Each request has `pcp_tokens` rows starting at
    [`state_local_start`][pcp_fn.dcs.state_local_start].
    """
    return state_local_rows(state, geometry=geometry)


# -- the rest of the "dcs" Layout (pcp_fn.dcs.LAYOUT binds this module's functions) ---------------
def num_local_tokens(
    config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int, num_computed: np.ndarray
) -> int:
    """Host: every rank's local rows (the bucket choice), exactly: decodes whole, a prefill's
    `n` as `2 * ceil(n / 2P)` ([`pcp_fn.protocol.config.two_chunk_bound`][])."""
    return two_chunk_bound(config, num_scheduled, num_decodes)


def constants(config: PCPConfig) -> dict[str, list]:
    """The config-only tables `init_state` puts on the device: the chunk multipliers and size
    coefficients ([`pcp_fn.dcs.layout_tables`][]) and the attention index runs
    ([`pcp_fn.dcs.attention_tables`][])."""
    return {**layout_constants(config.pcp_size), **attention_constants(config.pcp_size)}
