"""The scheduler-order ("full", pre-PCP-split) inputs the MTP drafter needs.

Under PCP each rank's model inputs are split, but the drafter shifts the
*original* token sequence, so vllm-ascend records it before the split
(`generate_pcp_mtp_input`): the input ids of every scheduled token in
scheduler order, their query start locations, and (MTP with `k >= 2` spec
tokens) a padded KV slot mapping for each request's tokens plus `k - 1`
extra draft positions. `repair_full_input_ids` patches those ids with the
previous step's sampled and draft tokens under async scheduling;
`rebuild_spec_positions` recomputes the positions once async scheduling has
corrected `num_computed_tokens`.

Slots are the caller's: the block table is not PCP bookkeeping. Pass
`slot_fn(request, position) -> slot` (any fixed-shape torch function, e.g.
a paged block-table lookup) to get `mtp_slot_mapping`; without it the MTP
layout (request and position of every MTP row) is returned for the caller to
map.

Nothing here depends on the layout (DualChunkSwap or hybrid) but the local
rows of [`rebuild_spec_positions`][pcp_fn.rebuild_spec_positions], which it asks the layout for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..core.buckets import Bucket
from ..core.checks import check_int_tensor
from ..core.pytree import pytree_dataclass
from ..core.ragged import segment_of, segments_of, take
from ..protocol.batch import token_rows
from ..protocol.config import PCPConfig
from ..protocol.layout import layout_of
from ..protocol.state import PCPState
from .inputs import StateView, check_rows, mtp_extra_tokens, mtp_rows, state_view

SlotFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@pytree_dataclass
class MTPLayout:
    """Every request's scheduled tokens followed by `k - 1` extra MTP draft positions (`M_b` rows).

    Attributes:
        request: `[M_b]` int64 request of each MTP row (0 past `num_tokens`).
        positions: `[M_b]` int64 absolute position `num_computed + offset` (0 past).
        num_tokens: 0-d int64, real rows (`sum(num_scheduled) + num_reqs * (k - 1)`).
        slot_mapping: `[M_b * P]` int32 vllm-ascend's `mtp_slot_pad`: MTP row `t`'s
            slot at `t * P`, every other entry `pad_slot_id`; `None`
            without a `slot_fn` (whose slots, integers, must be below `2**31`: device
            data, not read on the host).
    """

    request: torch.Tensor
    positions: torch.Tensor
    num_tokens: torch.Tensor
    slot_mapping: torch.Tensor | None


class ScheduledRows(NamedTuple):
    """Request and absolute position of each scheduler-order row (`F_b`) and MTP row (`M_b`)."""

    request: torch.Tensor  # [F_b] int64 (0 past the real rows)
    positions: torch.Tensor  # [F_b] int64 num_computed[request] + offset (0 past)
    valid: torch.Tensor  # [F_b] bool
    mtp: MTPLayout | None  # the MTP rows (slot_mapping None), None when num_spec_tokens < 2
    mtp_valid: torch.Tensor | None  # [M_b] bool, the real MTP rows


def scheduled_rows(
    cfg: PCPConfig, bucket: Bucket, view: StateView, num_computed: torch.Tensor
) -> ScheduledRows:
    """The scheduler-order rows and the MTP rows of a batch: one table of per-request shifts, painted
    onto both row sets (one search each: one histogram on the CPU).

    Request `i`'s tokens are rows `token_start[i] ..`, its MTP rows (its tokens, then
    `k - 1` extras) start at `token_start[i] + (k - 1) * i` (the requests are a prefix); inside
    either run the position grows with the row, so `position = row + shift` with one shift per
    request and row set.
    """
    geo, real = view
    F_rows = token_rows(cfg, bucket)
    extra = mtp_extra_tokens(cfg)
    ts = geo.token_start
    shift = num_computed - ts[:-1]  # int64 (token_start is)
    channels = [shift, geo.request_ids]
    if extra == 0:
        slot = torch.arange(F_rows, dtype=torch.int64, device=ts.device)
        table = torch.stack(channels)
        segment = segment_of(ts[1:-1], slot)
    else:
        M = mtp_rows(cfg, bucket)  # >= F_b: the scheduler-order slots are a prefix of the MTP ones
        slot = torch.arange(M, dtype=torch.int64, device=ts.device)
        # every real request adds `extra` rows; real is a prefix: cumsum(real) = min(i + 1, num_reqs)
        mtp_end = torch.add(ts[1:], torch.cumsum(real, 0), alpha=extra)
        table = torch.stack([*channels, torch.add(shift, geo.request_ids, alpha=-extra)])
        segment, mtp_segment = segments_of((ts[1:-1], slot[:F_rows]), (mtp_end[:-1], slot))
    valid = slot[:F_rows] < ts[-1]
    masked = table[:2].index_select(1, segment) * valid
    positions = torch.addcmul(masked[0], slot[:F_rows], valid)
    mtp = mtp_valid = None
    if extra > 0:
        mtp_valid = slot < mtp_end[-1]
        mtp_masked = table[1:].index_select(1, mtp_segment) * mtp_valid
        mtp = MTPLayout(
            request=mtp_masked[0],
            positions=torch.addcmul(mtp_masked[1], slot, mtp_valid),
            num_tokens=mtp_end[-1],
            slot_mapping=None,
        )
    return ScheduledRows(masked[1], positions, valid, mtp, mtp_valid)


def mtp_slots(cfg: PCPConfig, rows: ScheduledRows, slot_fn: SlotFn | None) -> MTPLayout | None:
    """The MTP layout of `rows` with its padded slot mapping (`slot_fn` of every MTP row), or
    without one when there is no `slot_fn`."""
    mtp, valid = rows.mtp, rows.mtp_valid
    if mtp is None or slot_fn is None:
        return mtp
    M, P = mtp.request.shape[0], cfg.pcp_size
    got = slot_fn(mtp.request, mtp.positions)
    if not isinstance(got, torch.Tensor):
        raise TypeError(f"slot_fn must return a tensor of [{M}] slots, got {type(got).__name__}")
    if got.shape != (M,):
        raise ValueError(f"slot_fn must return [{M}] slots (one per MTP row), got {tuple(got.shape)}")
    if got.is_floating_point() or got.is_complex() or got.dtype == torch.bool:  # no silent truncation
        raise TypeError(f"slot_fn must return integer slots, got {got.dtype}")
    got = torch.where(valid, got.to(torch.int32), cfg.pad_slot_id)
    # token-strided, like the decode region of the padded slot mapping: row t at t * P
    slots = F.pad(got[:, None], (0, P - 1), value=cfg.pad_slot_id).reshape(M * P) if P > 1 else got
    return MTPLayout(mtp.request, mtp.positions, mtp.num_tokens, slot_mapping=slots)


@pytree_dataclass
class FullInputs:
    """Scheduler-order inputs of the drafter (`F_b`, `M_b`: see [`pcp_fn.spec.inputs`][]).

    Attributes:
        input_ids: `[F_b]` token ids of the scheduled tokens in scheduler
            order (vllm-ascend `input_ids_pcp_full`); 0 past `num_tokens`.
        positions: `[F_b]` int64 absolute positions (vllm-ascend `positions_pcp_full`).
        query_start_loc: `[R_b + 1]` int32 (vllm-ascend `query_start_loc_pcp_full`):
            `[0, cumsum(num_scheduled)]` then `-1` past `num_reqs`.
        num_tokens: 0-d int64, `sum(num_scheduled)`.
        mtp: the [`MTPLayout`][pcp_fn.spec.MTPLayout], or `None` when `num_spec_tokens < 2`.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    num_tokens: torch.Tensor
    mtp: MTPLayout | None


def full_query_start_loc(view: StateView) -> torch.Tensor:
    """`[R_b + 1]` int32 `[0, cumsum(num_scheduled)]`, then -1 past `num_reqs`."""
    past = F.pad(~view.real, (1, 0))  # entry k is past the requests when k > num_reqs
    return view.geo.token_start.masked_fill(past, -1).to(torch.int32)


def full_input_ids(
    state: PCPState,
    token_ids: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    *,
    slot_fn: SlotFn | None = None,
) -> tuple[PCPState, FullInputs]:
    """Scheduler-order input ids, positions and query starts, and the MTP slot layout.

    vllm-ascend `generate_pcp_mtp_input`: token `j` of request `i` is
    `token_ids[i, num_computed[i] + j]`. vllm-ascend's test, `P = 2`, one
    spec token, computed `[6, 8, 0, 0]`, scheduled `[2, 2, 8, 7]`:

        input_ids        [88907, 0, 342, 0, 0, 671, 8749, 294, 3702, 4106, 344, 88907,
                          0, 671, 5335, 1469, 7539, 305, 6397]
        query_start_loc  [0, 2, 4, 12, 19]

    With `k >= 2` spec tokens each request also owns `k - 1` MTP rows
    after its tokens (positions continuing from its last one); `slot_fn`
    maps them to KV slots, spread token-strided into `mtp.slot_mapping`
    (vllm-ascend `mtp_slot_pad`). vllm-ascend builds those only for
    decode-only batches (or DCP prefills); here they are always built (fixed
    shape) and equal vllm-ascend's whenever it builds them.

    Args:
        state: after [`pcp_fn.update_tokens`][pcp_fn.update_tokens.update_tokens] of the batch; the outputs
            have its bucket's sizes.
        token_ids: `[rows, max_model_len]` the request token table (row =
            request index). Its shape is static, its contents are not read on
            the host: [`make_spec_batch`][pcp_fn.make_spec_batch] (`token_ids=`) checks that it
            is wide enough for the batch, and [`spec_step`][pcp_fn.spec_step] refuses a
            table narrower than the one checked. Called on its own, a position
            past the table's width reads its last column.
        num_computed_tokens: `[R_b]` (`batch.num_computed`).
        slot_fn: `slot_fn(request [M_b], position [M_b]) -> [M_b]` slots.
    """
    Rb = state.bucket.num_reqs
    check_rows("num_computed_tokens", num_computed_tokens, Rb, "R_b, one per request row", integer=True)
    check_token_ids(token_ids)
    return state, full_inputs(state, state_view(state), token_ids, num_computed_tokens, slot_fn)


def check_token_ids(token_ids: object) -> None:
    if not isinstance(token_ids, torch.Tensor) or token_ids.dim() != 2 or 0 in token_ids.shape:
        shape = tuple(token_ids.shape) if isinstance(token_ids, torch.Tensor) else type(token_ids).__name__
        raise ValueError(f"token_ids must be a [num_rows, max_model_len] table (non-empty), got {shape}")
    check_int_tensor("token_ids", token_ids)  # a float table would hand the model float "ids"


def full_inputs(
    state: PCPState,
    view: StateView,
    token_ids: torch.Tensor,
    num_computed: torch.Tensor,
    slot_fn: SlotFn | None,
    table_checked: bool = False,
) -> FullInputs:
    """[`full_input_ids`][pcp_fn.full_input_ids] (inputs checked) on the state's
    [`StateView`][pcp_fn.spec.inputs.StateView].

    `table_checked`: the host checked the table against the batch (`spec_step`:
    `make_spec_batch(..., token_ids=)`, and a table at least that large), so every real token
    lies inside it and no read needs clamping (the rows past them read position 0 of row 0).
    """
    cfg, bucket = state.config, state.bucket
    rows = scheduled_rows(cfg, bucket, view, num_computed)
    num_rows, width = token_ids.shape
    request, positions = rows.request, rows.positions
    if not table_checked:  # a read past the table reads its last row / column
        request = request if num_rows >= bucket.num_reqs else request.clamp(max=num_rows - 1)
        positions = positions.clamp(max=width - 1)
    flat = torch.add(positions, request, alpha=width)
    return FullInputs(
        input_ids=token_ids.reshape(-1).index_select(0, flat) * rows.valid,
        positions=rows.positions,
        query_start_loc=full_query_start_loc(view),
        num_tokens=view.geo.token_start[-1],
        mtp=mtp_slots(cfg, rows, slot_fn),
    )


def repair_full_input_ids(
    state: PCPState,
    input_ids_full: torch.Tensor,
    prev_sampled_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor | None,
    prev_positions: torch.Tensor,
) -> tuple[PCPState, torch.Tensor]:
    """Async scheduling: write last step's sampled and draft tokens into the full input ids.

    vllm-ascend `_update_input_ids_pcp_full_ids` (the `prev_positions` device
    branch). A request carried over from the previous step
    (`prev_positions[i] >= 0`) gets `prev_sampled_token_ids[prev, 0]` at
    its first unverified token (`query_end - 1 - drafts`, `drafts = n - 1`
    for a decode, 0 for a prefill) and, after it, its `drafts` (at most
    `num_spec_tokens`) tokens `draft_token_ids.flatten()[prev * k + j]`.
    `P = 2`, one spec token, decodes of 2 tokens at full rows `[0, 1]` and
    `[2, 3]`, `prev_positions [1, -1]`, sampled `[[7], [9]]`, drafts
    `[[70], [90]]`: ids `[a, b, c, d] -> [9, 90, c, d]`.

    Args:
        input_ids_full: `[F_b]` (`FullInputs.input_ids`).
        prev_sampled_token_ids: `[prev_reqs, >= 1]`.
        draft_token_ids: `[prev_reqs, k]` the previous step's drafts
            (`k = num_spec_tokens`), or `None` (sampled tokens only).
        prev_positions: `[R_b]` each request's row in the previous step, or -1.

    Returns `[F_b]` repaired ids (the input is not modified). Indices into
    the previous step's tensors are clamped in range. A request with no
    scheduled token is never written (vllm-ascend would write into the
    previous request's last token).
    """
    rows = token_rows(state.config, state.bucket)
    check_rows("input_ids_full", input_ids_full, rows, "F_b, the bucket's scheduler-order tokens")
    check_rows("prev_positions", prev_positions, state.bucket.num_reqs, "R_b, one per request row")
    check_previous_tokens(state.config, prev_sampled_token_ids, draft_token_ids)
    out = repaired_ids(
        state, state_view(state), input_ids_full, prev_sampled_token_ids, draft_token_ids, prev_positions
    )
    return state, out


def check_previous_tokens(config: PCPConfig, prev_sampled_token_ids: object, draft_token_ids: object) -> None:
    """The previous step's tokens [`repair_full_input_ids`][pcp_fn.repair_full_input_ids] reads have
    the shapes it needs."""
    k = config.num_spec_tokens
    if not isinstance(prev_sampled_token_ids, torch.Tensor) or prev_sampled_token_ids.dim() != 2:
        raise ValueError(
            "prev_sampled_token_ids must be [prev_reqs, num_sampled], "
            f"got {tuple(getattr(prev_sampled_token_ids, 'shape', ()))}"
        )
    if prev_sampled_token_ids.shape[0] < 1 or prev_sampled_token_ids.shape[1] < 1:
        raise ValueError(
            "prev_sampled_token_ids must have at least one row and one column, "
            f"got {tuple(prev_sampled_token_ids.shape)}"
        )
    if draft_token_ids is not None and (
        not isinstance(draft_token_ids, torch.Tensor)
        or draft_token_ids.dim() != 2
        or draft_token_ids.shape[1] != k
        or draft_token_ids.shape[0] < 1
    ):
        raise ValueError(
            f"draft_token_ids must be [prev_reqs >= 1, num_spec_tokens={k}] or None, "
            f"got {tuple(getattr(draft_token_ids, 'shape', ()))}"
        )


def repaired_ids(
    state: PCPState,
    view: StateView,
    input_ids_full: torch.Tensor,
    prev_sampled_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor | None,
    prev_positions: torch.Tensor,
) -> torch.Tensor:
    """[`repair_full_input_ids`][pcp_fn.repair_full_input_ids] (inputs checked) on the state's
    [`StateView`][pcp_fn.spec.inputs.StateView].

    One `[R_b, 1 + k]` grid of writes: column `c` of request `i` writes full row
    `sample[i] + c` (the sampled token, then its drafts), kept when the request is carried
    over and `c <= drafts[i]`; the rest go to a trash row past the end.
    """
    cfg, Rb = state.config, state.bucket.num_reqs
    F_rows = token_rows(cfg, state.bucket)
    geo, real = view
    n = geo.num_scheduled
    k = cfg.num_spec_tokens if draft_token_ids is not None else 0
    # a decode's drafts are its tokens but the first (at most k: a decode has at most 1 + k tokens)
    drafts = (n - 1) * state.is_decode[:Rb]
    carried = (prev_positions >= 0) & (n > 0) & real
    last = torch.where(carried, drafts, -1)  # last column written, -1: none
    column = torch.arange(-1, k, device=n.device)  # c - 1: the sampled token is at query_end - 1 - drafts
    dst = (geo.token_start[1:] - drafts)[:, None] + column
    dst = dst.masked_fill(column >= last[:, None], F_rows)
    sampled_rows = prev_sampled_token_ids.shape[0]
    safe = prev_positions.clamp(0, sampled_rows - 1)
    if k == 0:
        src = prev_sampled_token_ids[:, :1].index_select(0, safe)
    elif draft_token_ids.shape[0] == sampled_rows:
        src = torch.cat([prev_sampled_token_ids[:, :1], draft_token_ids], 1).index_select(0, safe)
    else:  # tables of other lengths: each read clamped into its own table
        j = torch.arange(k, device=n.device)
        drafted = take(draft_token_ids.reshape(-1), safe[:, None].to(torch.int64) * k + j)
        src = torch.cat([prev_sampled_token_ids[:, 0].index_select(0, safe)[:, None], drafted], 1)
    # writes go to distinct rows (each request's own); the rest land in a trash row past the end
    out = F.pad(input_ids_full, (0, 1)).scatter(0, dst.reshape(-1), src.to(input_ids_full.dtype).reshape(-1))
    return out[:F_rows]


@pytree_dataclass
class RebuiltPositions:
    """Positions recomputed from corrected `num_computed_tokens` (async spec decode).

    Attributes:
        positions: `[L_b]` int64 this rank's local absolute positions (0 on padding rows).
        positions_full: `[F_b]` int64 scheduler-order absolute positions.
        query_start_loc_full: `[R_b + 1]` int32 scheduler-order query starts
            (what vllm-ascend hands the block table with `positions_full`).
        mtp: the [`MTPLayout`][pcp_fn.spec.MTPLayout] at the corrected positions, or `None`
            when `num_spec_tokens < 2`.
    """

    positions: torch.Tensor
    positions_full: torch.Tensor
    query_start_loc_full: torch.Tensor
    mtp: MTPLayout | None


def rebuild_spec_positions(
    state: PCPState,
    num_computed_tokens: torch.Tensor,
    *,
    slot_fn: SlotFn | None = None,
) -> tuple[PCPState, RebuiltPositions]:
    """Local, full and MTP positions from the corrected `num_computed_tokens`.

    The device branch of vllm-ascend's `rebuild_async_spec_decode_inputs`
    (decode-only batches): `positions = num_computed[request] + offset` for
    this rank's local rows (offsets from the PCP split, the layout's:
    DualChunkSwap or linear; at `P = 1` the query positions), the same for
    every scheduler-order token, and the MTP rows (`num_scheduled + k - 1`
    per request) with their slots. `P = 2`, decodes of 2 tokens, corrected
    computed `[10, 4]`: positions `[10, 11, 4, 5]` (local and full alike:
    decodes are not split).

    Args:
        num_computed_tokens: `[R_b]` corrected counts (device).
        slot_fn: as for [`full_input_ids`][pcp_fn.full_input_ids].
    """
    cfg, bucket = state.config, state.bucket
    check_rows(
        "num_computed_tokens", num_computed_tokens, bucket.num_reqs, "R_b, one per request row", integer=True
    )
    view = state_view(state)
    rows = scheduled_rows(cfg, bucket, view, num_computed_tokens)
    mine = layout_of(cfg).state_local_rows(state, geometry=view.geo)
    out = RebuiltPositions(
        positions=(num_computed_tokens.index_select(0, mine.request) + mine.position) * mine.valid,
        positions_full=rows.positions,
        query_start_loc_full=full_query_start_loc(view),
        mtp=mtp_slots(cfg, rows, slot_fn),
    )
    return state, out
