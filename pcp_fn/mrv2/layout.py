"""The MRV2 segment layout on the device: `build_layout` and the state that carries it.

Every rank's rows are *segments* of global requests (vLLM `RankSegment`),
`P` ranks, `2P` chunks of `c = ceil(n / 2P)` tokens per split prefill
(vLLM `PCPManager._iter_rank_chunks`):

- a prefill is split: rank `q` takes chunk `q` (head) and chunk
  `2P-1-q` (tail), each cut at the request's end (no padding), an empty
  chunk dropped;
- a decode (not prefilling) is replicated on every rank, or, with
  `shard_decode_requests`, given whole to rank `ordinal % P` where
  `ordinal` counts the non-empty replicated requests before it;
- with `dcp_size > 1` a prefill too short to fill all `2P` chunks
  (`(2P-1) * c >= n`) is replicated as well (`PCPManager.replicated_requests`);
- a request with no scheduled token has no segment;
- each rank orders its segments decodes (non-prefilling) first, then
  prefills, by request, head before tail (`PCPManager._reorder_segments`).

`P = 2`, global batch `[A B C D E F G]` = one prefill of 7 tokens (`c = 2`):

    rank 0 / rank 1:    [A B G] / [C D E F]
    padded gathered:    [A B G _ | C D E F]          (Lp = 4)
    hidden_restore_idx: [0, 1, 4, 5, 6, 7, 2]         global = gathered[hidden_restore_idx]
    padded_gather_idx:  [0, 1, 6, 0, 2, 3, 4, 5]      padded_gathered = global[padded_gather_idx]
    kv write mask:      [T, T, T, F, T, T, T, T]

A replicated row is written to the KV cache (and read back by
`hidden_restore_idx`) from rank 0's copy only; a sharded decode from its owner.

The chunk and replication rules are [`pcp_fn.mrv2.chunks`][]'. Every rank's segments are
computed at once, in wide `[P, 2, R, 2]` tables
(rank, group, request, head/tail), and compacted into each rank's local order
by one prefix sum and one scatter ([`segments`][pcp_fn.mrv2.layout.segments]): the layout needs every
rank, the local batch one row of it.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F

from ..core.buckets import Bucket
from ..core.checks import check_device
from ..core.entry import entry_op
from ..core.pytree import pytree_dataclass, static_field
from ..core.ragged import offsets, scatter_to, segment_of
from ..core.rank import rank_leaf
from .batch import GlobalBatch, check_global_batch, make_batch, token_rows
from .chunks import chunk_length, chunk_size, splits
from .config import MRV2Config
from .splits import ChunkSplit, HeadTail, PrefillSplit


@pytree_dataclass
class MRV2Layout:
    """The gathered-row maps of one step (`Lp` local rows per rank, `F_b = min(T, P * Lp)`).

    Attributes:
        per_rank_num_tokens: `[P]` int64 real local tokens of every rank.
        num_tokens: 0-d int64 real global tokens (`sum(num_scheduled)`).
        hidden_restore_idx: `[F_b]` int64 gathered row of each global token
            (the writing copy); 0 past `num_tokens`.
        padded_gather_idx: `[P*Lp]` int64 global token of each gathered row;
            0 on padding rows (vLLM's zeros).
        gathered_kv_write_mask: `[P*Lp]` bool, the row writes the KV cache.

    The sizes come with the data: `Lp` is
    [`padded_num_tokens`][pcp_fn.mrv2.MRV2Layout.padded_num_tokens] (read off the static shapes),
    and the state holding the layout carries the bucket it was built for.
    """

    per_rank_num_tokens: torch.Tensor
    num_tokens: torch.Tensor
    hidden_restore_idx: torch.Tensor
    padded_gather_idx: torch.Tensor
    gathered_kv_write_mask: torch.Tensor

    @property
    def padded_num_tokens(self) -> int:
        """`Lp`, local rows per rank (static: from the shapes)."""
        return self.padded_gather_idx.shape[0] // self.per_rank_num_tokens.shape[0]


@pytree_dataclass
class MRV2State:
    """State of one rank of the MRV2 layout: a fixed tree structure.

    Attributes:
        config: static [`MRV2Config`][pcp_fn.MRV2Config].
        bucket: static [`pcp_fn.Bucket`][] of the last layout (of the
            empty layout at the smallest bucket for a fresh state): the
            shapes the consumer ops take and return.
        rank: `None` (the rank is `config.pcp_rank`, static) or a 0-d int64
            tensor (rank as data: one graph serves every rank).
        layout: the [`MRV2Layout`][pcp_fn.mrv2.MRV2Layout] of the last `build_layout` /
            `partition_batch` (for a fresh state, the layout of an empty
            batch at the smallest bucket: no token, every row padding).

    `build_layout` and `partition_batch` are entry ops
    ([`pcp_fn.core.entry`][]): of the state they read only `config` and the
    fields in `ENTRY_FIELDS`, so the state returned by any step may be fed to
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

    `rank=None` keeps the rank static (`config.pcp_rank`); an int, numpy
    integer or 0-d integer tensor (checked against `pcp_size` here) makes it
    a tensor leaf on `device` (`config.pcp_rank` is then ignored by the
    ops). The empty layout is a real one (built by the same code as every
    other): consumers given the fresh state return its bucket's shapes, with
    padding values only. `P = 2`, default buckets: `Bucket(1, 1)`,
    `padded_gather_idx [0, 0]`, write mask `[F, F]`, `hidden_restore_idx [0, 0]`.
    """
    if not isinstance(config, MRV2Config):
        raise TypeError(f"config must be an MRV2Config, got {type(config).__name__}")
    device = torch.device(device) if device is not None else torch.device("cpu")
    check_device("device", device)  # a missing GPU named here, not in a torch internal
    leaf = rank_leaf(config.pcp_size, rank, device)
    smallest = Bucket(config.request_buckets[0], config.token_buckets[0])
    empty = make_batch(config, [], [], [], bucket=smallest, device=device)
    return MRV2State(config=config, bucket=smallest, rank=leaf, layout=build(config, empty).layout)


def check_state(state: object, op: str) -> MRV2State:
    """`state` is an [`MRV2State`][pcp_fn.mrv2.MRV2State] (`TypeError` naming `op` otherwise)."""
    if not isinstance(state, MRV2State):
        raise TypeError(f"{op}: state must be an mrv2.MRV2State, got {type(state).__name__}")
    return state


class Segments(NamedTuple):
    """Every rank's segments in its local order: `[P, Rl]` each, row `k` is the rank's
    `k`-th local request row (views of one int32 table, see [`segments`][pcp_fn.mrv2.layout.segments]).

    Rows past a rank's segments hold 0, except row 0 of a rank without any: the
    placeholder of global row 0 (vLLM's `PCPManager.partition_batch`), with
    request 0's `start`, `prefill_len`, `idx_mapping` and `request_len`
    and no token.
    """

    start: torch.Tensor  # host start position: num_computed + first token inside the request
    prefill_len: torch.Tensor  # the request's prompt length
    idx_mapping: torch.Tensor  # the request's state index
    request: torch.Tensor  # global batch row
    global_start: torch.Tensor  # first global (scheduler-order) token
    written: torch.Tensor  # 1: this copy writes the KV cache
    request_len: torch.Tensor  # num_computed + num_scheduled of the whole request
    length: torch.Tensor  # tokens


class Compacted(NamedTuple):
    """[`segments`][pcp_fn.mrv2.layout.segments]' result."""

    table: torch.Tensor  # [8, P, Rl + 1] int32: the Segments channels, then one empty row per rank
    count: torch.Tensor  # [P] int64 segments (local request rows) of each rank
    ids: torch.Tensor  # int32 arange(max(2, P, R, Rl + 1)), shared by the callers


def segments(config: MRV2Config, batch: GlobalBatch) -> Compacted:
    """Every rank's segments of `batch` compacted in its local order (module docstring for
    the rules): [`Segments`][pcp_fn.mrv2.layout.Segments] channels `[8, P, Rl]`, then one empty row per rank.

    Every (rank, request, run) slot is a run of the request: of a chunk split (vLLM's head and
    tail, round-robin) a chunk cut at the request's end (`_chunk_runs`), of another split its
    rule's runs (`_split_runs`); a replicated request is one run of all its tokens on its ranks,
    the second slot empty. One prefix
    sum over `[P, group, R, head/tail]` (non-prefilling requests first) numbers the
    non-empty slots in local order, and one scatter compacts every channel (row 0 of the
    scatter is a trash row for the empty slots; a batch has at most `2R` rows a rank,
    and [`pcp_fn.mrv2.make_batch`][] checked that `Rl` holds them).
    """
    P, R, Rl = config.pcp_size, config.max_num_reqs, batch.bucket.num_reqs
    n, prefilling = batch.num_scheduled, batch.is_prefilling
    ids = torch.arange(max(2, P, R, Rl + 1), dtype=torch.int32, device=n.device)
    group, q = ids[:2], ids[:P, None, None]  # group: also the replicated chunks [head, tail]
    rule = config.split
    if isinstance(rule, ChunkSplit):
        rest, length, split = _chunk_runs(config, rule, n, prefilling, q, group)
    else:
        rest, length, split = _split_runs(config, rule, batch, q)
    if config.shard_decode_requests:  # a sharded request lives on its owner only: every copy writes
        written = torch.ones((), dtype=torch.bool, device=n.device)
    else:  # rank 0's copy of a replicated request writes
        written = split[:, None] | (q == 0)
    request_len = batch.num_computed + n
    token_end = torch.cumsum(n, 0, dtype=torch.int32)
    channels = (
        request_len[:, None] - rest,  # start: num_computed + the chunk's offset
        batch.prefill_len[:, None],
        batch.idx_mapping[:, None],
        ids[:R, None],  # request
        token_end[:, None] - rest,  # global start
        written,
        request_len[:, None],
        length,
    )
    K = len(channels)
    table = torch.stack(torch.broadcast_tensors(*channels)).to(torch.int32).view(K, P, 2 * R)

    # local row (1-based; 0: empty) of each slot: one prefix sum over [P, group, R, 2] (the
    # channels are not laid out per group too: that would save the where, at twice the data)
    nonempty = length > 0
    grouped = nonempty[:, None] & (prefilling[:, None] == group[:, None, None])  # [P, 2, R, 2]
    numbered = torch.cumsum(grouped.view(P, 4 * R), 1).view(P, 2, R, 2)
    row = torch.where(prefilling[:, None], numbered[:, 1], numbered[:, 0]) * nonempty
    # rank 0's head slot of request 0 is the placeholder (start = num_computed[0]), without its length
    target = F.pad(table[:-1, 0, :1], (1, 2 * R, 0, 1))  # [K, 2R + 2]: trash, placeholder, 0 ..
    index = row.view(1, P, 2 * R).expand(K, -1, -1)
    compact = target[:, None].expand(-1, P, -1).scatter(2, index, table)
    return Compacted(compact[:, :, 1 : Rl + 2], numbered[:, -1, -1, -1], ids)


def _chunk_runs(
    config: MRV2Config,
    rule: ChunkSplit,
    n: torch.Tensor,
    prefilling: torch.Tensor,
    q: torch.Tensor,
    group: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(rest, length [P, R, 2], split [R])` of a chunk split: every (rank, request, run) slot is a
    chunk `k` of `size` tokens cut at the request's end, `length = clamp(n - k * size, 0, size)`;
    a split prefill's chunks are the rule's ([`ChunkSplit.held`][pcp_fn.mrv2.splits.ChunkSplit.held])
    of `ceil(n / 2P)`, a replicated request takes `size = n` and chunk 0 on its ranks, chunk 1
    (empty) elsewhere."""
    P = config.pcp_size
    c = chunk_size(n, config.num_chunks)
    split = splits(config, n, prefilling, c) if isinstance(rule, HeadTail) else prefilling
    rep_chunk = group
    if config.shard_decode_requests:  # the j-th non-empty replicated request lives on rank j % P only
        ordinal = torch.cumsum((n > 0) > split, 0, dtype=torch.int32) - 1
        rep_chunk = (q != ordinal[:, None] % P) | group.bool()  # [P, R, 2]
    split_chunk = torch.stack(rule.held(q, P), -1).view(P, 1, 2)
    chunk = torch.where(split[:, None], split_chunk, rep_chunk)  # [P, R, 2]
    size = torch.where(split, c, n)[:, None]
    rest = torch.addcmul(n[:, None], chunk, size, value=-1)  # tokens from the chunk's start on
    return rest, chunk_length(rest, size), split


def _split_runs(
    config: MRV2Config, rule: PrefillSplit, batch: GlobalBatch, q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(rest, length [P, R, 2], split [R])` of any other split: its runs
    ([`PrefillSplit.runs`][pcp_fn.mrv2.splits.PrefillSplit.runs]) for the prefills (under no DCP
    all are split), one run of all its tokens for a replicated request on its ranks."""
    P, n, split = config.pcp_size, batch.num_scheduled, batch.is_prefilling
    first, split_length = rule.runs(n, batch.num_computed, q[:, 0], P)  # [P, R, 2]
    whole = torch.stack([n, torch.zeros_like(n)], -1)  # [R, 2]
    if config.shard_decode_requests:  # the j-th non-empty replicated request lives on rank j % P only
        ordinal = torch.cumsum((n > 0) > split, 0, dtype=torch.int32) - 1
        whole = whole * (q == ordinal[:, None] % P)  # [P, R, 2]
    first = first * split[:, None]
    return n[:, None] - first, torch.where(split[:, None], split_length, whole), split


class Built(NamedTuple):
    layout: MRV2Layout
    table: torch.Tensor  # [8, P, Rl] int32: every rank's Segments channels (one tensor, one select)
    count: torch.Tensor  # [P] int64 local request rows of each rank (0: only the placeholder)
    query_start_loc: torch.Tensor  # [P, Rl + 1] int64 first local row of each segment, then the total
    valid: torch.Tensor  # [P*Lp] bool, the gathered row holds a token
    ids: torch.Tensor  # int32 arange of at least Rl + 1


def build(config: MRV2Config, batch: GlobalBatch) -> Built:
    """The layout of `batch` at its bucket (`Lp = batch.bucket.num_tokens`) and the
    segment tables it came from. `batch` must already be checked against `config`.

    The gathered rows are painted segment by segment: rank `q`'s local rows start at
    gathered row `q * Lp`, one search of the `P * (Rl + 1)` segment starts (each
    rank's empty last row starts at its end) finds the last segment starting at or
    before each row, and one gather reads its global-token shift, written flag and
    length (0: the row is padding).
    """
    P, Lp, Rl = config.pcp_size, batch.bucket.num_tokens, batch.bucket.num_reqs
    table, count, ids = segments(config, batch)
    seg = Segments(*table)
    qsl = offsets(seg.length[:, :Rl])  # [P, Rl + 1] int64
    row = torch.arange(P * Lp, dtype=torch.int64, device=qsl.device)
    starts = torch.add(qsl, row[:P, None], alpha=Lp)  # gathered row of each segment start (Lp >= 1)
    paint = torch.stack([seg.global_start - starts, seg.written, seg.length]).view(3, -1)
    painted = paint.index_select(1, segment_of(starts.view(-1)[1:], row))
    write, valid = (painted[1:] > 0).unbind(0)
    gather = (row + painted[0]) * valid
    layout = MRV2Layout(
        per_rank_num_tokens=qsl[:, -1],
        num_tokens=batch.num_scheduled.sum(dtype=torch.int64),
        # every global token has exactly one writing copy: invert gather on the written rows
        hidden_restore_idx=scatter_to(gather, write, row, token_rows(config, batch.bucket)),
        padded_gather_idx=gather,
        gathered_kv_write_mask=write,
    )
    return Built(layout, table[:, :, :Rl], count, qsl, valid, ids)


@entry_op
def build_layout(state: MRV2State, batch: GlobalBatch) -> tuple[MRV2State, MRV2Layout]:
    """Every rank's rows of `batch` in a padded gathered buffer (vLLM `PCPManager._build_batch_layout`).

    `Lp` (vLLM's `padded_num_tokens`) is `batch.bucket.num_tokens`,
    which [`pcp_fn.mrv2.make_batch`][] checked holds the largest rank-local
    batch; to pad further, pass `make_batch(..., bucket=...)`.

    `P = 2`, three one-token decodes, bucket `(4, 4)`: per-rank tokens
    `[3, 3]`, `hidden_restore_idx [0, 1, 2]` (then zeros), `padded_gather_idx
    [0, 1, 2, 0, 0, 1, 2, 0]`, write mask `[T, T, T, F, F, F, F, F]`; with
    `shard_decode_requests`: `[2, 1]`, `[0, 4, 1]`,
    `[0, 2, 0, 0, 1, 0, 0, 0]`, `[T, T, F, F, T, F, F, F]`.

    An entry op: reads only `state.config` (the layout covers every rank)
    and returns the state with the new layout and bucket.

    Raises:
        TypeError: `state` / `batch` of the wrong type.
        ValueError: `batch` built for another config, its bucket past
            the capacities, or its leaves of the wrong rows.
    """
    check_state(state, "build_layout")
    check_global_batch(state.config, batch, "batch")
    built = build(state.config, batch)
    new = MRV2State(config=state.config, bucket=batch.bucket, rank=state.rank, layout=built.layout)
    return new, built.layout
