"""The DualChunkSwap token layout: ``update_tokens`` and the index maps it implies.

With ``P`` ranks, a prefill of ``n`` tokens is padded to a multiple of ``2P`` and
cut into ``2P`` chunks of ``c`` tokens; rank ``r`` owns the head chunk ``r`` and
the tail chunk ``2P-1-r``, so every rank gets the same causal-attention work.
A decode is not split: every rank holds all its ``n`` tokens. Worked example
(vllm-ascend's docstring), scheduled tokens ``[1, 5, 8]``, ``P = 2``, request 0 a
decode::

    request                 0 (decode)   1 (n=5 -> 8, c=2)       2 (n=8, c=2)
    gathered (padded) rows  d d          0 1 2 3 4 . . .         0 1 2 3 4 5 6 7
    chunks                  r0 r1        [0 1|2 3|4 .|. .]       [0 1|2 3|4 5|6 7]
                                         r0  r1  r1  r0           r0  r1  r1  r0
    rank 0 positions        0            0 1 6 7                 0 1 6 7
    rank 1 positions        0            2 3 4 5                 2 3 4 5
    pcp_tokens (per rank)   1            4                       4
    num_pads                1            3                       0

After the model, each rank's local rows are all-gathered rank-major
(``[rank0 rows | rank1 rows]``) and ``restore_index`` puts them back in padded
request order: ``[0, 9, 1, 2, 10, 11, 12, 13, 3, 4, 5, 6, 14, 15, 16, 17, 7, 8]``
(with ``L = 9`` rows per rank). ``unpad_mask`` marks the real rows of that
order; in the decode region it is token-strided (every P-th row), vllm-ascend's
convention that attention backends rely on.

Every function is fixed-shape: per-request tensors have the bucket's request
rows, per-token tensors its local (``L_b``) or gathered (``P * L_b``) rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..core.pytree import pytree_dataclass
from ..core.ragged import expand_runs, offsets
from .batch import SchedulerBatch, classify_decodes
from .config import PCPConfig
from .state import PCPState


class RequestGeometry(NamedTuple):
    """Per-request sizes of the layout; ``[n]`` int64 (``*_start``: ``[n + 1]``), ``replicated`` bool."""

    num_scheduled: torch.Tensor  # tokens before the split
    replicated: torch.Tensor  # every rank holds the whole request (decodes; all when P == 1)
    num_padded: torch.Tensor  # rows in the gathered, padded order: n*P (replicated) or ceil(n/2P)*2P
    local: torch.Tensor  # rows on each rank: num_padded // P  (vllm-ascend's pcp_tokens)
    chunk: torch.Tensor  # rows per chunk: n (replicated) or local // 2
    token_start: torch.Tensor  # first scheduler-order token of each request, then the total
    padded_start: torch.Tensor  # first padded-order row of each request, then the total
    local_start: torch.Tensor  # first local row of each request, then the total


def request_geometry(
    config: PCPConfig, num_scheduled: torch.Tensor, is_decode: torch.Tensor
) -> RequestGeometry:
    P = config.pcp_size
    n = num_scheduled.to(torch.int64)
    replicated = is_decode | (P == 1)
    m = config.pad_multiple
    num_padded = torch.where(replicated, n * P, (n + m - 1) // m * m)
    local = num_padded // P
    chunk = torch.where(replicated, n, local // 2)
    starts = offsets(torch.stack([n, num_padded, local]))  # one scan for the three
    return RequestGeometry(n, replicated, num_padded, local, chunk, starts[0], starts[1], starts[2])


class LocalRows(NamedTuple):
    """This rank's ``num_rows`` local rows."""

    request: torch.Tensor  # int64 request of the row (0 on padding rows)
    position: torch.Tensor  # int64 offset inside the request's scheduled tokens (0 on padding rows)
    valid: torch.Tensor  # bool, False on the padding tail


def local_rows(geo: RequestGeometry, rank: int | torch.Tensor, P: int, num_rows: int) -> LocalRows:
    """Request and position of each of ``rank``'s local rows.

    A request's local rows are two runs: the head (the whole request for a
    decode) and the tail. Inside a run the position grows with the row, so it
    is ``row + shift`` with one shift per run: head rows read chunk ``rank``
    (``rank*c + j``), tail rows chunk ``2P-1-rank`` (``(2P-1-rank)*c + j``), a
    decode's rows ``0 .. n-1``. ``rank`` may be an int or a 0-d tensor.
    """
    rep, n, c = geo.replicated, geo.num_scheduled, geo.chunk
    start = geo.local_start
    head = torch.where(rep, n, c)
    head_shift = torch.where(rep, 0, rank * c) - start[:-1]
    tail_shift = (2 * P - 1 - rank) * c - (start[:-1] + head)
    ids = torch.arange(n.shape[-1], dtype=torch.int64, device=n.device)
    interleave = lambda a, b: torch.stack([a, b], dim=-1).flatten(-2)  # noqa: E731  [head0, tail0, head1, ...]
    values = torch.stack([interleave(head_shift, tail_shift), interleave(ids, ids)])
    shift, request = expand_runs(interleave(start[:-1], start[:-1] + head), values, num_rows)
    row = torch.arange(num_rows, dtype=torch.int64, device=n.device)
    valid = row < start[-1]
    return LocalRows(torch.where(valid, request, 0), torch.where(valid, row + shift, 0), valid)


class GatheredOrder(NamedTuple):
    """Maps over the ``P * L_b`` rows of the gathered, padded request order."""

    restore_index: torch.Tensor  # int64 gathered row of each padded-order row (0 past the end)
    unpad_mask: torch.Tensor  # bool: the row is a real token (decode region token-strided)
    token: torch.Tensor  # int64 scheduler-order index of a real row (0 elsewhere)


def gathered_order(geo: RequestGeometry, P: int, rows_per_rank: int) -> GatheredOrder:
    """Restore index, unpad mask and token of every padded-order row.

    A request's padded rows are ``2P`` chunks (runs) laid end to end; chunk
    ``k`` comes whole from one rank's local buffer: a replicated request's
    chunk ``k < P`` is rank ``k``'s copy (chunks ``>= P`` are empty); a split
    request's chunk ``k < P`` is rank ``k``'s head, chunk ``k >= P`` rank
    ``2P-1-k``'s tail. Rank ``r``'s local row ``l`` is gathered row
    ``r * rows_per_rank + l``, so inside a chunk ``restore = row + shift``.
    Real rows: a prefill's first ``n`` rows; in the decode region (the first
    ``P * num_decode_tokens`` rows, decodes come first) every ``P``-th row,
    decode token ``t`` at row ``t * P`` (vllm-ascend's token-strided convention).
    """
    size = P * rows_per_rank
    rep, n, c = geo.replicated[:, None], geo.num_scheduled[:, None], geo.chunk[:, None]
    padded_start = geo.padded_start
    ps = padded_start[:-1, None]
    k = torch.arange(2 * P, dtype=torch.int64, device=n.device)
    head = rep | (k < P)
    chunk_start = ps + torch.where(rep, k.clamp(max=P) * n, k * c)
    rank = torch.where(head, k, 2 * P - 1 - k)
    gathered_start = rank * rows_per_rank + geo.local_start[:-1, None] + torch.where(head, 0, c)
    token_shift = geo.token_start[:-1, None] - ps
    values = torch.stack(torch.broadcast_tensors(gathered_start - chunk_start, token_shift, ps + n))
    shift, token_shift, real_end = expand_runs(chunk_start.flatten(), values.flatten(-2), size)

    row = torch.arange(size, dtype=torch.int64, device=n.device)
    valid = row < padded_start[-1]
    decode_region = row < P * torch.where(geo.replicated, geo.num_scheduled, 0).sum()
    mask = valid & torch.where(decode_region, row % P == 0, row < real_end)
    token = torch.where(decode_region, row // P, row + token_shift)
    return GatheredOrder(
        restore_index=torch.where(valid, row + shift, 0),
        unpad_mask=mask,
        token=torch.where(mask, token, 0),
    )


@pytree_dataclass
class TokenLayout:
    """What ``update_tokens`` returns for one rank (``R_b``, ``L_b`` from the batch's bucket).

    Fields:
        pcp_tokens: ``[R_b]`` int32 tokens of each request on this rank
            (vllm-ascend ``update_tokens_for_pcp(...)[0]``); 0 past ``num_reqs``.
        positions: ``[L_b]`` int64 offset of each local token inside its
            request's scheduled tokens (vllm-ascend ``[1]``); 0 on padding rows.
        request_index: ``[L_b]`` int64 request of each local token (the
            runner's ``req_indices``); 0 on padding rows.
        num_tokens: 0-d int64 local tokens on this rank (``sum(pcp_tokens)``).
        num_pads: ``[R_b]`` int64 pads per request (vllm-ascend ``num_pcp_pads``).
        is_decode: ``[R_b]`` bool decode requests (a prefix).
        num_decode_reqs, num_decode_tokens: 0-d int64.
        unpad_mask: ``[P*L_b]`` bool real rows of the padded gathered order
            (vllm-ascend ``pcp_unpad_mask``). Its decode region is token-strided, the
            vllm-ascend's convention for the KV slot mapping: decode token ``t`` is
            row ``t*P``. That row is the restored copy of the same token only
            when decodes have one token each; with speculative tokens, read
            decode hidden states through ``restore_index``/logits indices.
        restore_index: ``[P*L_b]`` int64 gathered row of each padded-order row
            (vllm-ascend ``pcp_allgather_restore_idx``); 0 past ``P * num_tokens``.
    """

    pcp_tokens: torch.Tensor
    positions: torch.Tensor
    request_index: torch.Tensor
    num_tokens: torch.Tensor
    num_pads: torch.Tensor
    is_decode: torch.Tensor
    num_decode_reqs: torch.Tensor
    num_decode_tokens: torch.Tensor
    unpad_mask: torch.Tensor
    restore_index: torch.Tensor


def _to_capacity(x: torch.Tensor, rows: int) -> torch.Tensor:
    return F.pad(x, (0, rows - x.shape[0]))


class LayoutUpdate(NamedTuple):
    """What a layout's ``build`` returns: the next state, the public layout, and the
    intermediate maps ``step`` reuses instead of rebuilding them."""

    state: PCPState
    layout: TokenLayout
    geometry: RequestGeometry  # [R_b] rows (DCS: the FA layers' geometry in the hybrid layout)
    slot_token: torch.Tensor  # [P*L_b] scheduler-order token of each real DCS padded row
    local_valid: torch.Tensor  # [L_b] real local rows
    local_start: torch.Tensor  # [R_b + 1] first local row of each request, then the total


def batch_is_decode(config: PCPConfig, batch: SchedulerBatch) -> torch.Tensor:
    """``[R_b]`` bool decode requests of ``batch`` (vllm-ascend ``classify_decode_request_mask``)."""
    return classify_decodes(config, batch.num_scheduled, batch.num_computed, batch.num_prompt)


def next_state(state: PCPState, batch: SchedulerBatch, is_decode: torch.Tensor) -> PCPState:
    """The state recording ``batch``: its bucket, request count and per-request record at ``[R]``.

    Of ``state`` only the entry fields (rank, constants) are kept.
    """
    R = state.config.max_num_reqs
    return PCPState(
        config=state.config,
        bucket=batch.bucket,
        rank=state.rank,
        num_reqs=batch.num_reqs.to(torch.int64),
        num_scheduled=_to_capacity(batch.num_scheduled, R),
        is_decode=_to_capacity(is_decode, R),
        constants=state.constants,
    )


def build(state: PCPState, batch: SchedulerBatch) -> LayoutUpdate:
    """The DualChunkSwap layout of ``batch`` for ``state``'s rank (see :class:`TokenLayout`)."""
    cfg = state.config
    P, Lb = cfg.pcp_size, batch.bucket.num_tokens
    is_decode = batch_is_decode(cfg, batch)
    geo = request_geometry(cfg, batch.num_scheduled, is_decode)
    mine = local_rows(geo, state.pcp_rank, P, Lb)
    order = gathered_order(geo, P, Lb)
    layout = TokenLayout(
        pcp_tokens=geo.local.to(torch.int32),
        positions=mine.position,
        request_index=mine.request,
        num_tokens=geo.local.sum(),
        num_pads=geo.num_padded - geo.num_scheduled,
        is_decode=is_decode,
        num_decode_reqs=is_decode.sum(),
        num_decode_tokens=torch.where(is_decode, geo.num_scheduled, 0).sum(),
        unpad_mask=order.unpad_mask,
        restore_index=order.restore_index,
    )
    return LayoutUpdate(
        next_state(state, batch, is_decode), layout, geo, order.token, mine.valid, geo.local_start
    )


def state_geometry(state: PCPState) -> RequestGeometry:
    """Geometry of the state's last update at its bucket's ``R_b`` request rows."""
    Rb = state.bucket.num_reqs
    return request_geometry(state.config, state.num_scheduled[:Rb], state.is_decode[:Rb])


def state_order(state: PCPState) -> GatheredOrder:
    """The gathered order of the state's last update at its bucket's ``P * L_b`` rows."""
    return gathered_order(state_geometry(state), state.config.pcp_size, state.bucket.num_tokens)


def logits_from_geometry(config: PCPConfig, geo: RequestGeometry, num_reqs: torch.Tensor) -> torch.Tensor:
    """``[R_b]`` int64: last real token of each request in the padded order, 0 past ``num_reqs``.

    vllm-ascend ``PCPManager.get_logits_indices``: ``cumsum(pcp_tokens) * P - num_pads - 1``.
    """
    last = (geo.padded_start[:-1] + geo.num_scheduled - 1).clamp(min=0)
    real = torch.arange(last.shape[0], device=last.device) < num_reqs
    return torch.where(real, last, 0)


def restore_index(state: PCPState) -> torch.Tensor:
    """``[P*L_b]`` int64: gathered row of each padded-order row (``TokenLayout.restore_index``)."""
    return state_order(state).restore_index


# -- what the spec-decode (MTP) prep reads of the layout (pcp_fn.spec, through pcp_fn.layouts.layout_of) --
def state_local_rows(state: PCPState) -> LocalRows:
    """This rank's ``[L_b]`` local rows of the state's last update (``TokenLayout.request_index`` /
    ``positions``): request and offset inside the request's padded tokens, ``valid`` False past them."""
    cfg = state.config
    return local_rows(state_geometry(state), state.pcp_rank, cfg.pcp_size, state.bucket.num_tokens)


def state_local_start(state: PCPState) -> torch.Tensor:
    """``[R_b + 1]`` int64: first local row of each request on this rank, then the total.

    ``StepOutputs.query_start_loc``: ``[0, cumsum(pcp_tokens)]``, the runner's ``cu_num_tokens``
    with a leading 0. ``P = 2``, tokens ``[1, 5, 8]`` (request 0 a decode): ``[0, 1, 5, 9]``.
    """
    return state_geometry(state).local_start


class RestoredSpans(NamedTuple):
    """Where each request's rows sit in what ``restore_hidden_states`` returns; ``[R_b]`` int64 each."""

    start: torch.Tensor  # row of the request's first token (rank 0's copy for a decode)
    length: torch.Tensor  # rows from ``start`` that are the request's: its tokens, then any pads


def restored_spans(state: PCPState) -> RestoredSpans:
    """The padded order: request ``i`` starts at ``padded_start[i]``; a decode's first ``n`` rows are
    rank 0's copy of its tokens, a prefill's ``num_padded`` rows its tokens then its pads.

    So request ``i``'s last token is row ``start + n - 1``: the runner's PCP-adjusted cumulative
    count ``cu_num_scheduled_tokens * P - num_pcp_pads`` minus one (vllm-ascend
    ``_calc_spec_decode_metadata``). ``P = 2``, tokens ``[1, 5, 8]`` (request 0 a decode):
    ``start [0, 2, 10]``, ``length [1, 8, 8]``.
    """
    geo = state_geometry(state)
    length = torch.where(geo.replicated, geo.num_scheduled, geo.num_padded)
    return RestoredSpans(geo.padded_start[:-1], length)


def first_pass_rows(state: PCPState) -> LocalRows:
    """``[L_b]`` rows of the MTP drafter's first pass on this rank: request and offset inside the
    request's padded tokens (``offset >= n``: a pad), decode tokens first, ``valid`` False past them.

    In this layout the drafter runs on the target's split, so these are the local rows
    (:func:`state_local_rows`): each prefill's head and tail chunks (vllm-ascend
    ``_split_spec_decode_pcp_prefill_input``). Each request has ``pcp_tokens`` rows starting at
    :func:`state_local_start`.
    """
    return state_local_rows(state)
