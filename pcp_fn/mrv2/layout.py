"""The MRV2 segment layout on the device: ``build_layout`` and the state that carries it.

Every rank's rows are *segments* of global requests (vLLM ``RankSegment``),
``P`` ranks, ``2P`` chunks of ``c = ceil(n / 2P)`` tokens per split prefill
(vLLM ``PCPManager._iter_rank_chunks``):

- a prefill is split: rank ``q`` takes chunk ``q`` (head) and chunk
  ``2P-1-q`` (tail), each cut at the request's end (no padding), an empty
  chunk dropped;
- a decode (not prefilling) is replicated on every rank, or, with
  ``shard_decode_requests``, given whole to rank ``ordinal % P`` where
  ``ordinal`` counts the non-empty replicated requests before it;
- with ``dcp_size > 1`` a prefill too short to fill all ``2P`` chunks
  (``(2P-1) * c >= n``) is replicated as well (``PCPManager.replicated_requests``);
- a request with no scheduled token has no segment;
- each rank orders its segments decodes (non-prefilling) first, then
  prefills, by request, head before tail (``PCPManager._reorder_segments``).

``P = 2``, global batch ``[A B C D E F G]`` = one prefill of 7 tokens (``c = 2``)::

    rank 0 / rank 1:    [A B G] / [C D E F]
    padded gathered:    [A B G _ | C D E F]          (Lp = 4)
    hidden_restore_idx: [0, 1, 4, 5, 6, 7, 2]         global = gathered[hidden_restore_idx]
    padded_gather_idx:  [0, 1, 6, 0, 2, 3, 4, 5]      padded_gathered = global[padded_gather_idx]
    kv write mask:      [T, T, T, F, T, T, T, T]

A replicated row is written to the KV cache (and read back by
``hidden_restore_idx``) from rank 0's copy only; a sharded decode from its owner.

All ranks' segment tables are ``[P, 2R]`` (sorted request, head/tail): the
layout needs every rank, the local batch one row of it.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch

from ..core.buckets import Bucket
from ..core.entry import entry_op
from ..core.pytree import pytree_dataclass, static_field
from ..core.ragged import expand_runs, offsets, scatter_to
from ..core.rank import rank_leaf
from .batch import GlobalBatch, check_global_batch, make_batch, token_rows
from .config import MRV2Config


@pytree_dataclass
class MRV2Layout:
    """The gathered-row maps of one step (``Lp`` local rows per rank, ``F_b = min(T, P * Lp)``).

    Fields:
        per_rank_num_tokens: ``[P]`` int64 real local tokens of every rank.
        num_tokens: 0-d int64 real global tokens (``sum(num_scheduled)``).
        hidden_restore_idx: ``[F_b]`` int64 gathered row of each global token
            (the writing copy); 0 past ``num_tokens``.
        padded_gather_idx: ``[P*Lp]`` int64 global token of each gathered row;
            0 on padding rows (vLLM's zeros).
        gathered_kv_write_mask: ``[P*Lp]`` bool, the row writes the KV cache.

    The sizes come with the data: ``Lp`` is :attr:`padded_num_tokens` (read
    off the static shapes), and the state holding the layout carries the
    bucket it was built for.
    """

    per_rank_num_tokens: torch.Tensor
    num_tokens: torch.Tensor
    hidden_restore_idx: torch.Tensor
    padded_gather_idx: torch.Tensor
    gathered_kv_write_mask: torch.Tensor

    @property
    def padded_num_tokens(self) -> int:
        """``Lp``, local rows per rank (static: from the shapes)."""
        return self.padded_gather_idx.shape[0] // self.per_rank_num_tokens.shape[0]


@pytree_dataclass
class MRV2State:
    """State of one rank of the MRV2 layout: a fixed tree structure.

    Fields:
        config: static :class:`MRV2Config`.
        bucket: static :class:`pcp_fn.Bucket` of the last layout (of the
            empty layout at the smallest bucket for a fresh state): the
            shapes the consumer ops take and return.
        rank: ``None`` (the rank is ``config.pcp_rank``, static) or a 0-d int64
            tensor (rank as data: one graph serves every rank).
        layout: the :class:`MRV2Layout` of the last ``build_layout`` /
            ``partition_batch`` (for a fresh state, the layout of an empty
            batch at the smallest bucket: no token, every row padding).

    ``build_layout`` and ``partition_batch`` are entry ops
    (:mod:`pcp_fn.core.entry`): of the state they read only ``config`` and the
    fields in ``ENTRY_FIELDS``, so the state returned by any step may be fed to
    the graph of any bucket.
    """

    ENTRY_FIELDS: ClassVar[tuple[str, ...]] = ("rank",)

    config: MRV2Config = static_field()
    bucket: Bucket = static_field()
    rank: torch.Tensor | None
    layout: MRV2Layout

    @property
    def pcp_rank(self) -> int | torch.Tensor:
        """The rank: the static int, or the 0-d tensor when the rank is data."""
        return self.config.pcp_rank if self.rank is None else self.rank

    @property
    def device(self) -> torch.device:
        return self.layout.per_rank_num_tokens.device


def init_state(
    config: MRV2Config,
    device: torch.device | str | None = None,
    *,
    rank: torch.Tensor | int | None = None,
) -> MRV2State:
    """A state holding the layout of an empty batch at the smallest configured bucket.

    ``rank=None`` keeps the rank static (``config.pcp_rank``); an int, numpy
    integer or 0-d integer tensor (checked against ``pcp_size`` here) makes it
    a tensor leaf on ``device`` (``config.pcp_rank`` is then ignored by the
    ops). The empty layout is a real one (built by the same code as every
    other): consumers given the fresh state return its bucket's shapes, with
    padding values only. ``P = 2``, default buckets: ``Bucket(1, 1)``,
    ``padded_gather_idx [0, 0]``, write mask ``[F, F]``, ``hidden_restore_idx [0, 0]``.
    """
    if not isinstance(config, MRV2Config):
        raise TypeError(f"config must be an MRV2Config, got {type(config).__name__}")
    device = torch.device(device) if device is not None else torch.device("cpu")
    leaf = rank_leaf(config.pcp_size, rank, device)
    smallest = Bucket(config.request_buckets[0], config.token_buckets[0])
    empty = make_batch(config, [], [], [], bucket=smallest, device=device)
    return MRV2State(config=config, bucket=smallest, rank=leaf, layout=build(config, empty).layout)


def check_state(state: object, op: str) -> MRV2State:
    """``state`` is an :class:`MRV2State` (``TypeError`` naming ``op`` otherwise)."""
    if not isinstance(state, MRV2State):
        raise TypeError(f"{op}: state must be an mrv2.MRV2State, got {type(state).__name__}")
    return state


class Segments(NamedTuple):
    """Every rank's segments, ``[P, 2R]`` int64 in each rank's local order
    (sorted request ``j``, head at ``2j``, tail at ``2j + 1``)."""

    request: torch.Tensor  # global batch row of the segment
    offset: torch.Tensor  # first token inside the request
    length: torch.Tensor  # tokens (0: no segment)
    global_start: torch.Tensor  # first global (scheduler-order) token
    local_start: torch.Tensor  # first local row on its rank
    written: torch.Tensor  # bool: this copy writes the KV cache


def _stable_partition(first: torch.Tensor) -> torch.Tensor:
    """``[n]`` order listing the rows where ``first`` holds, then the others, each in row order."""
    a = first.to(torch.int64)
    before = torch.cumsum(a, 0) - a  # rows of the first group before this one
    others_before = torch.arange(a.shape[0], device=a.device) - before
    dest = torch.where(first, before, a.sum() + others_before)
    rows = torch.arange(a.shape[0], device=a.device)
    return scatter_to(dest, torch.ones_like(first), rows, a.shape[0])


def segments(config: MRV2Config, batch: GlobalBatch) -> Segments:
    """All ranks' segments of ``batch`` (module docstring for the rules)."""
    P, C = config.pcp_size, config.num_chunks
    n = batch.num_scheduled.to(torch.int64)
    prefilling = batch.is_prefilling
    token_start = offsets(n)[:-1]
    c = (n + C - 1) // C
    replicated = ~prefilling
    if config.dcp_size > 1:
        replicated = replicated | ((C - 1) * c >= n)
    live = replicated & (n > 0)
    ordinal = torch.cumsum(live.to(torch.int64), 0) - live.to(torch.int64)

    # Local order: non-prefilling rows first, then prefilling, each by row.
    order = _stable_partition(~prefilling)
    n, c, replicated = n[order], c[order], replicated[order]
    token_start, owner = token_start[order], ordinal[order] % P

    q = torch.arange(P, dtype=torch.int64, device=n.device)[:, None]
    head_off = torch.where(replicated, 0, q * c)
    tail_off = (C - 1 - q) * c
    if config.shard_decode_requests:
        rep_len = torch.where(q == owner, n, 0)
    else:
        rep_len = n.expand(P, -1)
    # a chunk is cut at the request's end: min(max(n - offset, 0), c)
    head_len = torch.where(replicated, rep_len, torch.minimum((n - head_off).clamp(min=0), c))
    tail_len = torch.where(replicated, 0, torch.minimum((n - tail_off).clamp(min=0), c))
    if config.shard_decode_requests:  # a sharded request lives on its owner only: every copy writes
        written = torch.ones_like(head_len, dtype=torch.bool)
    else:  # rank 0's copy of a replicated request writes
        written = ~replicated | (q == 0)

    pair = lambda a, b: torch.stack(torch.broadcast_tensors(a, b), dim=-1).flatten(-2)  # noqa: E731
    offset = pair(head_off, tail_off)
    length = pair(head_len, tail_len)
    return Segments(
        request=pair(order, order).expand(P, -1),
        offset=offset,
        length=length,
        global_start=pair(token_start, token_start) + offset,
        local_start=torch.cumsum(length, 1) - length,
        written=pair(written, written),
    )


class Built(NamedTuple):
    layout: MRV2Layout
    segments: Segments


def build(config: MRV2Config, batch: GlobalBatch) -> Built:
    """The layout of ``batch`` at its bucket (``Lp = batch.bucket.num_tokens``) and the
    segment tables it came from. ``batch`` must already be checked against ``config``."""
    P, Lp = config.pcp_size, batch.bucket.num_tokens
    seg = segments(config, batch)
    per_rank = seg.length.sum(1)

    # Paint the P*Lp gathered rows run by run: global token = row + shift.
    q = torch.arange(P, dtype=torch.int64, device=per_rank.device)[:, None]
    starts = q * Lp + seg.local_start
    values = torch.stack([seg.global_start - starts, seg.written.to(torch.int64)])
    shift, written = expand_runs(starts.flatten(), values.flatten(1), P * Lp)
    row = torch.arange(P * Lp, dtype=torch.int64, device=per_rank.device)
    valid = (row % Lp) < per_rank[row // Lp]
    gather = torch.where(valid, row + shift, 0)
    write = valid & (written > 0)
    layout = MRV2Layout(
        per_rank_num_tokens=per_rank,
        num_tokens=batch.num_scheduled.to(torch.int64).sum(),
        # every global token has exactly one writing copy: invert gather on the written rows
        hidden_restore_idx=scatter_to(gather, write, row, token_rows(config, batch.bucket)),
        padded_gather_idx=gather,
        gathered_kv_write_mask=write,
    )
    return Built(layout, seg)


@entry_op
def build_layout(state: MRV2State, batch: GlobalBatch) -> tuple[MRV2State, MRV2Layout]:
    """Every rank's rows of ``batch`` in a padded gathered buffer (vLLM ``PCPManager._build_batch_layout``).

    ``Lp`` (vLLM's ``padded_num_tokens``) is ``batch.bucket.num_tokens``,
    which :func:`pcp_fn.mrv2.make_batch` checked holds the largest rank-local
    batch; to pad further, pass ``make_batch(..., bucket=...)``.

    ``P = 2``, three one-token decodes, bucket ``(4, 4)``: per-rank tokens
    ``[3, 3]``, ``hidden_restore_idx [0, 1, 2]`` (then zeros), ``padded_gather_idx
    [0, 1, 2, 0, 0, 1, 2, 0]``, write mask ``[T, T, T, F, F, F, F, F]``; with
    ``shard_decode_requests``: ``[2, 1]``, ``[0, 4, 1]``,
    ``[0, 2, 0, 0, 1, 0, 0, 0]``, ``[T, T, F, F, T, F, F, F]``.

    An entry op: reads only ``state.config`` (the layout covers every rank)
    and returns the state with the new layout and bucket.

    Raises:
        TypeError: ``state`` / ``batch`` of the wrong type.
        ValueError: ``batch`` built for another config, its bucket past
            the capacities, or its leaves of the wrong rows.
    """
    check_state(state, "build_layout")
    check_global_batch(state.config, batch, "batch")
    built = build(state.config, batch)
    new = MRV2State(config=state.config, bucket=batch.bucket, rank=state.rank, layout=built.layout)
    return new, built.layout
