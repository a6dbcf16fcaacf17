"""The scheduler-order ("full", pre-PCP-split) inputs the MTP drafter needs.

Under PCP each rank's model inputs are split, but the drafter shifts the
*original* token sequence, so vllm-ascend records it before the split
(``generate_pcp_mtp_input``): the input ids of every scheduled token in
scheduler order, their query start locations, and (MTP with ``k >= 2`` spec
tokens) a padded KV slot mapping for each request's tokens plus ``k - 1``
extra draft positions. ``repair_full_input_ids`` patches those ids with the
previous step's sampled and draft tokens under async scheduling;
``rebuild_spec_positions`` recomputes the positions once async scheduling has
corrected ``num_computed_tokens``.

Slots are the caller's: the block table is not PCP bookkeeping. Pass
``slot_fn(request, position) -> slot`` (any fixed-shape torch function, e.g.
a paged block-table lookup) to get ``mtp_slot_mapping``; without it the MTP
layout (request and position of every MTP row) is returned for the caller to
map.

Nothing here depends on the layout (DualChunkSwap or hybrid) but the local
rows of :func:`rebuild_spec_positions`, which it asks the layout for.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..core.buckets import Bucket
from ..core.pytree import pytree_dataclass
from ..core.ragged import ragged_index, take
from ..dcs.batch import token_rows
from ..dcs.config import PCPConfig
from ..dcs.layout import RequestGeometry, state_geometry
from ..dcs.state import PCPState
from ..layouts import layout_of
from .inputs import check_rows, mtp_extra_tokens, mtp_rows, real_requests

SlotFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@pytree_dataclass
class MTPLayout:
    """Every request's scheduled tokens followed by ``k - 1`` extra MTP draft positions (``M_b`` rows).

    Fields:
        request: ``[M_b]`` int64 request of each MTP row (0 past ``num_tokens``).
        positions: ``[M_b]`` int64 absolute position ``num_computed + offset`` (0 past).
        num_tokens: 0-d int64, real rows (``sum(num_scheduled) + num_reqs * (k - 1)``).
        slot_mapping: ``[M_b * P]`` vllm-ascend's ``mtp_slot_pad``: MTP row ``t``'s
            slot at ``t * P``, every other entry ``pad_slot_id``; ``None``
            without a ``slot_fn``.
    """

    request: torch.Tensor
    positions: torch.Tensor
    num_tokens: torch.Tensor
    slot_mapping: torch.Tensor | None


def mtp_layout(
    cfg: PCPConfig,
    bucket: Bucket,
    geo: RequestGeometry,
    real: torch.Tensor,
    num_computed: torch.Tensor,
    slot_fn: SlotFn | None,
) -> MTPLayout | None:
    """The MTP rows of a batch (``None`` when ``num_spec_tokens < 2``: vllm-ascend builds none)."""
    extra = mtp_extra_tokens(cfg)
    if extra == 0:
        return None
    M = mtp_rows(cfg, bucket)
    lens = torch.where(real, geo.num_scheduled + extra, 0)
    rows = ragged_index(lens, M)
    positions = torch.where(rows.valid, take(num_computed, rows.segment) + rows.offset, 0)
    request = torch.where(rows.valid, rows.segment, 0)
    slots = None
    if slot_fn is not None:
        P = cfg.pcp_size
        got = slot_fn(request, positions)
        if got.shape != (M,):
            raise ValueError(f"slot_fn must return [{M}] slots (one per MTP row), got {tuple(got.shape)}")
        got = got.to(torch.int32)
        pad = torch.full_like(got, cfg.pad_slot_id)
        # token-strided, like the decode region of the padded slot mapping: row t at t * P
        spread = torch.cat([torch.where(rows.valid, got, pad)[:, None], pad[:, None].expand(M, P - 1)], 1)
        slots = spread.reshape(M * P)
    return MTPLayout(request=request, positions=positions, num_tokens=lens.sum(), slot_mapping=slots)


@pytree_dataclass
class FullInputs:
    """Scheduler-order inputs of the drafter (``F_b``, ``M_b``: see :mod:`pcp_fn.spec.inputs`).

    Fields:
        input_ids: ``[F_b]`` token ids of the scheduled tokens in scheduler
            order (vllm-ascend ``input_ids_pcp_full``); 0 past ``num_tokens``.
        positions: ``[F_b]`` int64 absolute positions (vllm-ascend ``positions_pcp_full``).
        query_start_loc: ``[R_b + 1]`` int32 (vllm-ascend ``query_start_loc_pcp_full``):
            ``[0, cumsum(num_scheduled)]`` then ``-1`` past ``num_reqs``.
        num_tokens: 0-d int64, ``sum(num_scheduled)``.
        mtp: the :class:`MTPLayout`, or ``None`` when ``num_spec_tokens < 2``.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    num_tokens: torch.Tensor
    mtp: MTPLayout | None


def _full_positions(geo: RequestGeometry, num_computed: torch.Tensor, rows: int):
    idx = ragged_index(geo.num_scheduled, rows)
    positions = torch.where(idx.valid, take(num_computed, idx.segment) + idx.offset, 0)
    return idx, positions


def _full_query_start_loc(geo: RequestGeometry, num_reqs: torch.Tensor) -> torch.Tensor:
    k = torch.arange(geo.token_start.shape[0], device=num_reqs.device)
    return torch.where(k <= num_reqs, geo.token_start, -1).to(torch.int32)


def full_input_ids(
    state: PCPState,
    token_ids: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    *,
    slot_fn: SlotFn | None = None,
) -> tuple[PCPState, FullInputs]:
    """Scheduler-order input ids, positions and query starts, and the MTP slot layout.

    vllm-ascend ``generate_pcp_mtp_input``: token ``j`` of request ``i`` is
    ``token_ids[i, num_computed[i] + j]``. vllm-ascend's test, ``P = 2``, one
    spec token, computed ``[6, 8, 0, 0]``, scheduled ``[2, 2, 8, 7]``::

        input_ids        [88907, 0, 342, 0, 0, 671, 8749, 294, 3702, 4106, 344, 88907,
                          0, 671, 5335, 1469, 7539, 305, 6397]
        query_start_loc  [0, 2, 4, 12, 19]

    With ``k >= 2`` spec tokens each request also owns ``k - 1`` MTP rows
    after its tokens (positions continuing from its last one); ``slot_fn``
    maps them to KV slots, spread token-strided into ``mtp.slot_mapping``
    (vllm-ascend ``mtp_slot_pad``). vllm-ascend builds those only for
    decode-only batches (or DCP prefills); here they are always built (fixed
    shape) and equal vllm-ascend's whenever it builds them.

    Args:
        state: after :func:`pcp_fn.update_tokens` of the batch; the outputs
            have its bucket's sizes.
        token_ids: ``[rows, max_model_len]`` the request token table (row =
            request index). Its shape is static, its contents are not read on
            the host: :func:`make_spec_batch` (``token_ids=``) checks that it
            is wide enough for the batch, and :func:`spec_step` refuses a
            table narrower than the one checked. Called on its own, a position
            past the table's width reads its last column.
        num_computed_tokens: ``[R_b]`` (``batch.num_computed``).
        slot_fn: ``slot_fn(request [M_b], position [M_b]) -> [M_b]`` slots.
    """
    cfg, bucket = state.config, state.bucket
    check_rows("num_computed_tokens", num_computed_tokens, bucket.num_reqs, "R_b, one per request row")
    if not isinstance(token_ids, torch.Tensor) or token_ids.dim() != 2 or 0 in token_ids.shape:
        shape = tuple(token_ids.shape) if isinstance(token_ids, torch.Tensor) else type(token_ids).__name__
        raise ValueError(f"token_ids must be a [num_rows, max_model_len] table (non-empty), got {shape}")
    geo = state_geometry(state)
    computed = num_computed_tokens.to(torch.int64)
    idx, positions = _full_positions(geo, computed, token_rows(cfg, bucket))
    rows, width = token_ids.shape
    flat = idx.segment.clamp(max=rows - 1) * width + positions.clamp(max=width - 1)
    ids = token_ids.reshape(-1)[flat]
    out = FullInputs(
        input_ids=torch.where(idx.valid, ids, torch.zeros_like(ids)),
        positions=positions,
        query_start_loc=_full_query_start_loc(geo, state.num_reqs),
        num_tokens=geo.token_start[-1],
        mtp=mtp_layout(cfg, bucket, geo, real_requests(state), computed, slot_fn),
    )
    return state, out


def repair_full_input_ids(
    state: PCPState,
    input_ids_full: torch.Tensor,
    prev_sampled_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor | None,
    prev_positions: torch.Tensor,
) -> tuple[PCPState, torch.Tensor]:
    """Async scheduling: write last step's sampled and draft tokens into the full input ids.

    vllm-ascend ``_update_input_ids_pcp_full_ids`` (the ``prev_positions`` device
    branch). A request carried over from the previous step
    (``prev_positions[i] >= 0``) gets ``prev_sampled_token_ids[prev, 0]`` at
    its first unverified token (``query_end - 1 - drafts``, ``drafts = n - 1``
    for a decode, 0 for a prefill) and, after it, its ``drafts`` (at most
    ``num_spec_tokens``) tokens ``draft_token_ids.flatten()[prev * k + j]``.
    ``P = 2``, one spec token, decodes of 2 tokens at full rows ``[0, 1]`` and
    ``[2, 3]``, ``prev_positions [1, -1]``, sampled ``[[7], [9]]``, drafts
    ``[[70], [90]]``: ids ``[a, b, c, d] -> [9, 90, c, d]``.

    Args:
        input_ids_full: ``[F_b]`` (``FullInputs.input_ids``).
        prev_sampled_token_ids: ``[prev_reqs, >= 1]``.
        draft_token_ids: ``[prev_reqs, k]`` the previous step's drafts
            (``k = num_spec_tokens``), or ``None`` (sampled tokens only).
        prev_positions: ``[R_b]`` each request's row in the previous step, or -1.

    Returns ``[F_b]`` repaired ids (the input is not modified). Indices into
    the previous step's tensors are clamped in range. A request with no
    scheduled token is never written (vllm-ascend would write into the
    previous request's last token).
    """
    cfg, bucket = state.config, state.bucket
    Rb, F_rows = bucket.num_reqs, token_rows(cfg, bucket)
    k = cfg.num_spec_tokens
    check_rows("input_ids_full", input_ids_full, F_rows, "F_b, the bucket's scheduler-order tokens")
    check_rows("prev_positions", prev_positions, Rb, "R_b, one per request row")
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
    geo = state_geometry(state)
    n = geo.num_scheduled
    drafts = torch.where(state.is_decode[:Rb], (n - 1).clamp(min=0), 0)
    sample = geo.token_start[1:] - 1 - drafts
    prev = prev_positions.to(torch.int64)
    common = (prev >= 0) & real_requests(state) & (n > 0)
    safe = prev.clamp(0, prev_sampled_token_ids.shape[0] - 1)
    dtype = input_ids_full.dtype

    dst = [torch.where(common, sample, F_rows)]
    src = [prev_sampled_token_ids[safe, 0].to(dtype)]
    if draft_token_ids is not None and k > 0:
        j = torch.arange(k, device=prev.device)
        spec = common[:, None] & (j < drafts.clamp(max=k)[:, None])
        dst.append(torch.where(spec, sample[:, None] + 1 + j, F_rows).reshape(-1))
        src.append(take(draft_token_ids.reshape(-1), safe[:, None] * k + j).to(dtype).reshape(-1))
    # writes go to distinct rows (each request's own); the rest land in a trash row past the end
    out = F.pad(input_ids_full, (0, 1)).scatter(0, torch.cat(dst), torch.cat(src))
    return state, out[:F_rows]


@pytree_dataclass
class RebuiltPositions:
    """Positions recomputed from corrected ``num_computed_tokens`` (async spec decode).

    Fields:
        positions: ``[L_b]`` int64 this rank's local absolute positions (0 on padding rows).
        positions_full: ``[F_b]`` int64 scheduler-order absolute positions.
        query_start_loc_full: ``[R_b + 1]`` int32 scheduler-order query starts
            (what vllm-ascend hands the block table with ``positions_full``).
        mtp: the :class:`MTPLayout` at the corrected positions, or ``None``
            when ``num_spec_tokens < 2``.
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
    """Local, full and MTP positions from the corrected ``num_computed_tokens``.

    The device branch of vllm-ascend's ``rebuild_async_spec_decode_inputs``
    (decode-only batches): ``positions = num_computed[request] + offset`` for
    this rank's local rows (offsets from the PCP split, the layout's:
    DualChunkSwap or linear; at ``P = 1`` the query positions), the same for
    every scheduler-order token, and the MTP rows (``num_scheduled + k - 1``
    per request) with their slots. ``P = 2``, decodes of 2 tokens, corrected
    computed ``[10, 4]``: positions ``[10, 11, 4, 5]`` (local and full alike:
    decodes are not split).

    Args:
        num_computed_tokens: ``[R_b]`` corrected counts (device).
        slot_fn: as for :func:`full_input_ids`.
    """
    cfg, bucket = state.config, state.bucket
    check_rows("num_computed_tokens", num_computed_tokens, bucket.num_reqs, "R_b, one per request row")
    geo = state_geometry(state)
    computed = num_computed_tokens.to(torch.int64)
    mine = layout_of(cfg).state_local_rows(state)
    _, positions_full = _full_positions(geo, computed, token_rows(cfg, bucket))
    out = RebuiltPositions(
        positions=torch.where(mine.valid, take(computed, mine.request) + mine.position, 0),
        positions_full=positions_full,
        query_start_loc_full=_full_query_start_loc(geo, state.num_reqs),
        mtp=mtp_layout(cfg, bucket, geo, real_requests(state), computed, slot_fn),
    )
    return state, out
