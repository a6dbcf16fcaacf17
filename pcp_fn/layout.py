"""The DualChunkSwap token layout: ``update_tokens`` and the index maps it implies.

With ``P`` ranks, a prefill of ``n`` tokens is padded to a multiple of ``2P`` and
cut into ``2P`` chunks of ``c`` tokens; rank ``r`` owns the head chunk ``r`` and
the tail chunk ``2P-1-r``, so every rank gets the same causal-attention work.
A decode is not split: every rank holds all its ``n`` tokens. Worked example
(the seed's docstring), scheduled tokens ``[1, 5, 8]``, ``P = 2``, request 0 a
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
order; in the decode region it is token-strided (every P-th row), the seed's
convention that attention backends rely on.

Every function is fixed-shape: per-request tensors have the bucket's request
rows, per-token tensors its local (``L_b``) or gathered (``P * L_b``) rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .batch import SchedulerBatch
from .config import PCPConfig
from .pytree import pytree_dataclass
from .ragged import offsets, ragged_index
from .state import PCPState


class RequestGeometry(NamedTuple):
    """Per-request sizes of the layout; all ``[n]`` int64 except ``replicated``."""

    num_scheduled: torch.Tensor  # tokens before the split
    replicated: torch.Tensor  # bool: every rank holds the whole request (decodes; all when P == 1)
    num_padded: torch.Tensor  # rows in the gathered, padded order: n*P (replicated) or ceil(n/2P)*2P
    local: torch.Tensor  # rows on each rank: num_padded // P  (the seed's pcp_tokens)
    chunk: torch.Tensor  # rows per chunk: n (replicated) or local // 2


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
    return RequestGeometry(n, replicated, num_padded, local, chunk)


def classify_decodes(config: PCPConfig, batch: SchedulerBatch) -> torch.Tensor:
    """``[R_b]`` bool: has context, at most ``decode_threshold`` tokens, prompt done.

    The seed's ``classify_decode_request_mask``; empty padding rows are prefills.
    """
    computed, prompt = batch.num_computed, batch.num_prompt
    done = computed >= prompt
    if config.pd_decode_recompute:
        done = done | (computed == prompt - 1)
    return (computed > 0) & (batch.num_scheduled <= config.decode_threshold) & done


def local_rows(
    geo: RequestGeometry, rank: int | torch.Tensor, P: int, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Request, position and validity of each of this rank's ``num_rows`` local rows.

    Position is the offset inside the request's scheduled tokens. Decodes:
    ``0 .. n-1``. Prefills: head chunk ``rank*c + j``, then tail chunk
    ``(2P-1-rank)*c + j``. Padding rows: request 0, position 0, valid False.
    Returns ``(request [num_rows] int64, position [num_rows] int64, valid [num_rows] bool)``.
    """
    idx = ragged_index(geo.local, num_rows)
    c = geo.chunk[idx.segment]
    u = idx.offset
    head = torch.where(geo.replicated[idx.segment], u, rank * c + u)
    tail = (2 * P - 1 - rank) * c + (u - c)
    pos = torch.where(u < c, head, tail)
    return torch.where(idx.valid, idx.segment, 0), torch.where(idx.valid, pos, 0), idx.valid


def unpad_source(geo: RequestGeometry, P: int, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of the gathered, padded order: is it a real token, and which one.

    Returns ``(unpad_mask [num_rows] bool, token [num_rows] int64)``. Prefill
    rows are real below ``n``; decode rows are real every ``P``-th row
    (token-strided, as in the seed), so decode token ``t`` sits at row ``t*P``.
    ``token`` is the scheduler-order index of a real row (what compacting the
    mask would count), in closed form: decode row ``o`` is the request's token
    ``o // P``.
    """
    idx = ragged_index(geo.num_padded, num_rows)
    i, o = idx.segment, idx.offset
    rep = geo.replicated[i]
    mask = idx.valid & torch.where(rep, o % P == 0, o < geo.num_scheduled[i])
    token = offsets(geo.num_scheduled)[i] + torch.where(rep, o // P, o)
    return mask, token


def restore_index(geo: RequestGeometry, P: int, rows_per_rank: int) -> torch.Tensor:
    """``[P * rows_per_rank]`` int64: gathered row of each padded-order row.

    The gathered buffer is the ranks' local buffers stacked rank-major, so local
    row ``l`` of rank ``r`` is row ``r * rows_per_rank + l``. Row ``o`` of a
    request falls in chunk ``k = o // c``: a replicated request's chunk ``k`` is
    rank ``k``'s copy; a split request's chunk ``k < P`` is rank ``k``'s head,
    chunk ``k >= P`` is rank ``2P-1-k``'s tail (local rows after the head).
    Padding rows: 0.
    """
    idx = ragged_index(geo.num_padded, P * rows_per_rank)
    i, o = idx.segment, idx.offset
    c = geo.chunk[i].clamp(min=1)
    k, j = o // c, o % c
    head = geo.replicated[i] | (k < P)
    rank = torch.where(head, k, 2 * P - 1 - k)
    local = offsets(geo.local)[i] + torch.where(head, j, c + j)
    return torch.where(idx.valid, rank * rows_per_rank + local, 0)


@pytree_dataclass
class TokenLayout:
    """What ``update_tokens`` returns for one rank (``R_b``, ``L_b`` from the batch's bucket).

    Fields:
        pcp_tokens: ``[R_b]`` int32 tokens of each request on this rank
            (seed ``update_tokens_for_pcp(...)[0]``); 0 past ``num_reqs``.
        positions: ``[L_b]`` int64 offset of each local token inside its
            request's scheduled tokens (seed ``[1]``); 0 on padding rows.
        request_index: ``[L_b]`` int64 request of each local token (the
            runner's ``req_indices``); 0 on padding rows.
        num_tokens: 0-d int64 local tokens on this rank (``sum(pcp_tokens)``).
        num_pads: ``[R_b]`` int64 pads per request (seed ``num_pcp_pads``).
        is_decode: ``[R_b]`` bool decode requests (a prefix).
        num_decode_reqs, num_decode_tokens: 0-d int64.
        unpad_mask: ``[P*L_b]`` bool real rows of the padded gathered order.
        restore_index: ``[P*L_b]`` int64 gathered row of each padded-order row
            (seed ``pcp_allgather_restore_idx``); 0 past ``P * num_tokens``.
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


class _Update(NamedTuple):
    state: PCPState
    layout: TokenLayout
    geometry: RequestGeometry  # [R_b] rows
    slot_token: torch.Tensor  # [P*L_b] scheduler-order token of each real padded row
    local_valid: torch.Tensor  # [L_b] real local rows


def _update(state: PCPState, batch: SchedulerBatch) -> _Update:
    cfg = state.config
    if cfg.hybrid_attn:
        raise NotImplementedError("update_tokens: the hybrid-attention layout is not implemented yet")
    P, Lb = cfg.pcp_size, batch.bucket.num_tokens
    is_decode = classify_decodes(cfg, batch)
    geo = request_geometry(cfg, batch.num_scheduled, is_decode)
    request, positions, valid = local_rows(geo, state.pcp_rank, P, Lb)
    mask, token = unpad_source(geo, P, P * Lb)
    layout = TokenLayout(
        pcp_tokens=geo.local.to(torch.int32),
        positions=positions,
        request_index=request,
        num_tokens=geo.local.sum(),
        num_pads=geo.num_padded - geo.num_scheduled,
        is_decode=is_decode,
        num_decode_reqs=is_decode.sum(),
        num_decode_tokens=torch.where(is_decode, geo.num_scheduled, 0).sum(),
        unpad_mask=mask,
        restore_index=restore_index(geo, P, Lb),
    )
    R = cfg.max_num_reqs
    new_state = PCPState(
        config=cfg,
        rank=state.rank,
        num_reqs=batch.num_reqs.to(torch.int64),
        num_scheduled=_to_capacity(batch.num_scheduled, R),
        is_decode=_to_capacity(is_decode, R),
    )
    return _Update(new_state, layout, geo, token, valid)


def update_tokens(state: PCPState, batch: SchedulerBatch) -> tuple[PCPState, TokenLayout]:
    """Split the batch's tokens across ranks (seed ``init_batch_info`` + ``update_tokens_for_pcp``).

    Reads only ``state.config`` and ``state.rank`` from the incoming state, so
    the result does not depend on earlier steps. Example, ``P = 2``, tokens
    ``[1, 5, 8]`` (request 0 a decode): rank 0 gets ``pcp_tokens [1, 4, 4]`` and
    positions ``[0, 0, 1, 6, 7, 0, 1, 6, 7]``; rank 1 ``[0, 2, 3, 4, 5, 2, 3, 4, 5]``.
    """
    up = _update(state, batch)
    return up.state, up.layout


def state_geometry(state: PCPState) -> RequestGeometry:
    """Geometry of the state's last update at capacity (``[R]`` rows)."""
    return request_geometry(state.config, state.num_scheduled, state.is_decode)
