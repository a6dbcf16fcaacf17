"""The host (numpy) twin of the MRV2 segment rules: O(P * R) integer arithmetic, no per-token work.

The device layout ([`pcp_fn.mrv2.layout`][]) builds every per-token index, by the same
rules ([`pcp_fn.mrv2.chunks`][]);
a serving engine still needs a few *host* values each step before anything
runs on the device: every rank's token and row counts (to pick a graph
bucket, vLLM `get_num_tokens_for_dispatch`) and this rank's segments (the
request ids, query start locations and sequence-length upper bounds the
attention builders read on the host). This module computes them from the
scheduler's per-request arrays with the same rules, vectorised over requests:

- a prefill of `n` tokens is cut into `2P` chunks of `c = ceil(n / 2P)`,
  rank `q` takes chunk `q` (head) and `2P-1-q` (tail), each cut at the
  request's end, an empty chunk dropped;
- a decode (not prefilling), or with `dcp_size > 1` a prefill too short to
  fill all `2P` chunks, is replicated on every rank, or with
  `shard_decode_requests` given whole to rank `ordinal % P`;
- each rank lists its segments decodes first, then prefills, by request, head
  before tail.

`P = 2`, scheduled `[3, 8]`, request 1 prefilling, rank 1:

    >>> cfg = MRV2Config(pcp_size=2, pcp_rank=1, max_num_reqs=4, max_num_tokens=16)
    >>> seg = local_segments(cfg, 1, np.array([3, 8]), np.array([False, True]))
    >>> seg.request.tolist(), seg.offset.tolist(), seg.length.tolist()
    ([0, 1, 1], [0, 2, 4], [3, 2, 2])
    >>> seg.per_rank_num_tokens.tolist(), seg.per_rank_num_reqs.tolist()
    ([7, 7], [3, 3])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import chunks
from .config import MRV2Config
from .splits import HeadTail


class LocalSegments(NamedTuple):
    """One rank's segments in its local order, plus every rank's counts.

    Attributes:
        request: `[S]` intp global batch row of each segment.
        offset: `[S]` int64 first token of the segment inside its request.
        length: `[S]` int64 tokens of the segment (all `> 0`).
        per_rank_num_tokens: `[P]` int64 local tokens of every rank.
        per_rank_num_reqs: `[P]` int64 local segments of every rank.
    """

    request: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    per_rank_num_tokens: np.ndarray
    per_rank_num_reqs: np.ndarray


_NONE = np.zeros(0, dtype=np.intp)  # no request (read only)
_NONE.flags.writeable = False


def local_segments(
    config: MRV2Config,
    rank: int,
    num_scheduled: np.ndarray,
    is_prefilling: np.ndarray,
    num_computed: np.ndarray | None = None,
) -> LocalSegments:
    """Rank `rank`'s segments (vLLM `PCPManager._get_rank_segments`) and every rank's counts.

    `num_scheduled` `[R]` ints, `is_prefilling` `[R]` bools, scheduler
    order; `num_computed` `[R]` ints, read only by a split that
    [`reads_context`][pcp_fn.mrv2.splits.PrefillSplit] (required then). vLLM's head and tail
    chunks: up to `FEW_REQUESTS` requests, one pass over Python integers
    (`_local_segments_few`); beyond, numpy: replicated requests cost
    `O(R)`, only split prefills are expanded over the `P` ranks (`[P, S]`),
    so a decode-only step stays a few numpy calls. Another split: numpy.
    """
    if not isinstance(config.split, HeadTail):
        return _local_runs(config, rank, num_scheduled, is_prefilling, num_computed)
    if len(num_scheduled) <= FEW_REQUESTS:
        return _local_segments_few(config, rank, num_scheduled, is_prefilling)
    # ufuncs and their methods, not the Python-level wrappers (clip, stack, sum): each call counts
    P, C = config.pcp_size, config.num_chunks
    n = np.asarray(num_scheduled)
    if n.dtype != np.int64:
        n = n.astype(np.int64)
    prefilling = np.asarray(is_prefilling, dtype=np.bool_)
    splits = chunks.splits(config, n, prefilling)  # a prefill whose last chunk would be empty: replicated
    if np.count_nonzero(splits):
        live = n > 0
        rep = np.greater(live, splits).nonzero()[0]  # non-empty replicated requests, in order
        split = np.logical_and(live, splits).nonzero()[0]  # non-empty split prefills
    else:  # no split prefill (a decode-only step): every non-empty request is replicated
        rep, split = n.nonzero()[0], _NONE
    k = rep.size
    if config.shard_decode_requests:  # round-robin: the j-th replicated request goes to rank j % P
        per_rank = np.zeros(-(-k // P) * P, dtype=np.int64)
        per_rank[:k] = n[rep]
        tokens = np.add.reduce(per_rank.reshape(-1, P), axis=0)
        rows = np.full(P, k // P, dtype=np.int64)
        rows[: k % P] += 1
        mine = rep[rank::P]
    else:
        tokens = np.full(P, np.add.reduce(n[rep]), dtype=np.int64)
        rows = np.full(P, k, dtype=np.int64)
        mine = rep
    request, offset, length = mine, np.zeros(mine.size, np.int64), n[mine]
    if split.size and split.size <= FEW_PREFILLS:  # a few prefills: Python integers, ~8 numpy calls
        ns = n[split]
        split_tokens, split_rows = _split_counts(config, ns)
        tokens, rows = tokens + split_tokens, rows + split_rows
        reqs, offs, lens = [], [], []
        for i, m in zip(split.tolist(), ns.tolist()):
            _add_rank_chunks(rank, C, i, m, chunks.chunk_size(m, C), reqs, offs, lens)
        request = np.concatenate((request, np.array(reqs, dtype=np.intp)))
        offset = np.concatenate((offset, np.array(offs, dtype=np.int64)))
        length = np.concatenate((length, np.array(lens, dtype=np.int64)))
    elif split.size:
        ns = n[split]
        chunk = chunks.chunk_size(ns, C)
        q = np.arange(P, dtype=np.int64)[:, None]
        head = chunks.chunk_length(ns - q * chunk, chunk)  # [P, S]: chunk q, cut at the end
        tail = chunks.chunk_length(ns - (C - 1 - q) * chunk, chunk)  # chunk 2P-1-q
        tokens = tokens + np.add.reduce(head + tail, axis=1)
        rows = rows + np.add.reduce(head > 0, axis=1) + np.add.reduce(tail > 0, axis=1)
        # this rank: head (chunk rank) before tail (chunk 2P-1-rank), by request
        s_len = np.empty(2 * split.size, dtype=np.int64)
        s_len[0::2], s_len[1::2] = head[rank], tail[rank]
        s_off = np.empty(2 * split.size, dtype=np.int64)
        s_off[0::2], s_off[1::2] = rank * chunk, (C - 1 - rank) * chunk
        keep = s_len > 0
        request = np.concatenate([request, np.repeat(split, 2)[keep]])
        offset = np.concatenate([offset, s_off[keep]])
        length = np.concatenate([length, s_len[keep]])
    if config.dcp_size > 1:  # replicated short prefills sit among the prefills, by request
        order = np.argsort(prefilling[request] * (2 * n.size + 2) + request, kind="stable")
        request, offset, length = request[order], offset[order], length[order]
    return LocalSegments(request, offset, length, tokens, rows)


# Up to this many requests, `local_segments` walks them as Python integers: a numpy call
# costs 5-15 us right after other work (cold caches), about what 20-50 requests cost in Python.
# Measured on the vLLM drop-in's benchmark batches (2-core EPYC, after a vLLM step): 16 decodes
# 52 -> 27 us, 64 decodes + 2 prefills 131 -> 61 us, 255 decodes + 1 prefill 164 -> 117 us;
# 256 decodes alone (numpy's cheapest case) 83 -> 94 us.
FEW_REQUESTS = 256


def _local_segments_few(
    config: MRV2Config, rank: int, num_scheduled: np.ndarray, is_prefilling: np.ndarray
) -> LocalSegments:
    """[`local_segments`][pcp_fn.mrv2.host.local_segments] for a few requests: the same rules, one
    pass over Python ints.

    Decodes (and, with DCP, short prefills) are replicated, or dealt round-robin with
    `shard_decode_requests`; a split prefill's `2P` chunks are counted on every rank
    and this rank's head and tail listed. Local order: the replicated requests not
    prefilling, then the prefills (split or, with DCP, replicated), by request.
    """
    P, C = config.pcp_size, config.num_chunks
    dcp, shard = config.dcp_size > 1, config.shard_decode_requests
    tokens, rows = [0] * P, [0] * P
    everywhere = everywhere_rows = 0  # replicated on every rank
    req: list[int] = []  # the decodes this rank holds, in order
    off: list[int] = []
    length: list[int] = []
    p_req: list[int] = []  # then its prefill segments, by request (head before tail)
    p_off: list[int] = []
    p_len: list[int] = []
    dealt = 0  # replicated requests dealt so far (shard_decode_requests)
    prefilling = np.asarray(is_prefilling, dtype=np.bool_).tolist()
    for i, (m, p) in enumerate(zip(np.asarray(num_scheduled).tolist(), prefilling)):
        if m <= 0:  # an empty request has no segment (a negative count is the caller's check)
            continue
        if p:
            c = chunks.chunk_size(m, C)
            if dcp and not chunks.splits(config, m, True, c):  # its last chunk would be empty: replicated
                everywhere += m
                everywhere_rows += 1
                p_req.append(i)
                p_off.append(0)
                p_len.append(m)
                continue
            _add_split_prefill(P, m, c, tokens, rows)
            _add_rank_chunks(rank, C, i, m, c, p_req, p_off, p_len)
            continue
        if shard:  # the j-th replicated request goes to rank j % P
            q = dealt % P
            dealt += 1
            tokens[q] += m
            rows[q] += 1
            if q != rank:
                continue
        else:
            everywhere += m
            everywhere_rows += 1
        req.append(i)
        off.append(0)
        length.append(m)
    if everywhere_rows:
        tokens = [t + everywhere for t in tokens]
        rows = [r + everywhere_rows for r in rows]
    return LocalSegments(
        np.array(req + p_req, dtype=np.intp),
        np.array(off + p_off, dtype=np.int64),
        np.array(length + p_len, dtype=np.int64),
        np.array(tokens, dtype=np.int64),
        np.array(rows, dtype=np.int64),
    )


def counts(
    config: MRV2Config,
    num_scheduled: np.ndarray,
    is_prefilling: np.ndarray,
    num_computed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`([P], [P])` int64: local tokens and local segments (request rows) of every rank.

    The counts of [`local_segments`][pcp_fn.mrv2.host.local_segments] without listing any rank's segments:
    replicated requests are counted as a whole, only the split prefills are cut.
    """
    if not isinstance(config.split, HeadTail):
        seg = _local_runs(config, 0, num_scheduled, is_prefilling, num_computed)
        return seg.per_rank_num_tokens, seg.per_rank_num_reqs
    n = np.asarray(num_scheduled)
    split = _split(config, n, np.asarray(is_prefilling, dtype=np.bool_))
    ns = n[split]
    if config.shard_decode_requests:
        tokens, rows = _sharded(config, n[np.greater(n > 0, split)])
    else:  # every rank holds every non-empty replicated request
        P = config.pcp_size
        tokens = np.full(P, np.add.reduce(n, dtype=np.int64) - np.add.reduce(ns, dtype=np.int64))
        rows = np.full(P, np.count_nonzero(n) - np.count_nonzero(ns), dtype=np.int64)
    if ns.size:
        split_tokens, split_rows = _split_counts(config, ns)
        tokens, rows = tokens + np.asarray(split_tokens), rows + np.asarray(split_rows)
    return tokens, rows


def largest_rank(
    config: MRV2Config,
    num_scheduled: np.ndarray,
    is_prefilling: np.ndarray,
    total: int,
    num_computed: np.ndarray | None = None,
) -> tuple[int, int]:
    """`(tokens, rows)`: the most local tokens and the most local request rows of any rank
    ([`counts`][pcp_fn.mrv2.host.counts]' maxima; `total = sum(num_scheduled)`), what the host
    boundary needs to pick a bucket: a few numpy calls on `[R]`, then the split prefills one by one
    (or as `[2P, S]` when there are many).

    A split that reads the context, given no `num_computed`: a bound on every context
    ([`widest_without_context`][pcp_fn.mrv2.splits.PrefillSplit.widest_without_context], two
    rows for each split prefill), what vLLM's `get_num_tokens_for_dispatch` can answer."""
    if not isinstance(config.split, HeadTail):
        if num_computed is None and config.split.reads_context:
            return _widest_without_context(config, num_scheduled, is_prefilling)
        tokens, rows = counts(config, num_scheduled, is_prefilling, num_computed)
        return int(tokens.max()), int(rows.max())
    n = num_scheduled
    split = _split(config, n, is_prefilling)
    ns = n[split]
    if config.shard_decode_requests:
        tokens, rows = _sharded(config, n[np.greater(n > 0, split)])
        if ns.size:
            split_tokens, split_rows = _split_counts(config, ns)
            tokens, rows = tokens + split_tokens, rows + split_rows
        return int(tokens.max()), int(rows.max())
    rows = np.count_nonzero(n) - np.count_nonzero(ns)  # replicated: on every rank
    if not ns.size:
        return total, rows
    split_tokens, split_rows = _split_counts(config, ns)
    # every split token is on exactly one rank: the replicated ones are total - sum(split_tokens)
    return total - sum(split_tokens) + max(split_tokens), rows + max(split_rows)


def _split(config: MRV2Config, n: np.ndarray, prefilling: np.ndarray) -> np.ndarray:
    """`[R]` bool: the request is a split prefill (or an empty prefill: it counts for nothing)."""
    return chunks.splits(config, n, prefilling)  # under DCP a prefill whose last chunk would be empty is not


def _sharded(config: MRV2Config, replicated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`([P], [P])` tokens and rows of the non-empty replicated requests (in order) dealt
    round-robin: the `j`-th goes to rank `j % P`."""
    P, k = config.pcp_size, replicated.size
    per_rank = np.zeros(-(-k // P) * P, dtype=np.int64)
    per_rank[:k] = replicated
    return np.add.reduce(per_rank.reshape(-1, P), axis=0), k // P + (np.arange(P) < k % P)


def _add_split_prefill(P: int, n: int, c: int, tokens: list[int], rows: list[int]) -> None:
    """Add the `2P` chunks of `c` tokens of a split prefill of `n > 0` tokens to every
    rank's `tokens` and `rows`: `f = n // c` full chunks, then `r = n - f * c` (chunk
    `f`, when `r > 0`); rank `q` holds chunks `q` and `2P-1-q`."""
    C = 2 * P
    full, rest = divmod(n, c)
    for q in range(P):
        held = (q < full) + (C - 1 - q < full)  # full chunks among its head and tail
        tokens[q] += held * c
        rows[q] += held
    if rest:  # the partial chunk's rank
        q = full if full < P else C - 1 - full
        tokens[q] += rest
        rows[q] += 1


def _add_rank_chunks(
    rank: int, C: int, i: int, n: int, c: int, reqs: list[int], offs: list[int], lens: list[int]
) -> None:
    """Append rank `rank`'s head (chunk `rank`) and tail (chunk `C-1-rank`) of request
    `i`, a split prefill of `n` tokens in chunks of `c`, to its segments (each cut at the
    request's end, an empty one dropped)."""
    for first in (rank * c, (C - 1 - rank) * c):
        size = chunks.chunk_length(n - first, c)
        if size:
            reqs.append(i)
            offs.append(first)
            lens.append(size)


_CHUNKS: dict[int, np.ndarray] = {}
FEW_PREFILLS = 16  # up to this many split prefills, Python integers beat numpy's per-call cost


def _split_counts(config: MRV2Config, ns: np.ndarray) -> tuple[Any, Any]:
    """`([P], [P])` tokens and rows the split prefills `ns [S]` put on every rank (lists of
    ints for a few prefills, int64 arrays for many).

    A prefill of `n` tokens is `f = n // c` full chunks of `c = ceil(n / 2P)`, then
    `r = n - f * c` (chunk `f`, when `r > 0`); rank `q` holds chunks `q` and `2P-1-q`.
    """
    P, C = config.pcp_size, config.num_chunks
    if ns.size <= FEW_PREFILLS:
        tokens, rows = [0] * P, [0] * P
        for n in ns.tolist():
            if n:  # an empty prefill has no chunk
                _add_split_prefill(P, n, chunks.chunk_size(n, C), tokens, rows)
        return tokens, rows
    held = _CHUNKS.get(P)
    if held is None:  # [2P, 1]: rank q's head chunk q, then its tail chunk 2P-1-q
        q = np.arange(P, dtype=np.int64)
        held = _CHUNKS[P] = np.concatenate([q, C - 1 - q])[:, None]
    size = chunks.chunk_size(ns, C)
    lengths = chunks.chunk_length(ns - held * size, size)  # [2P, S]: cut at the end
    tokens = np.add.reduce(lengths, axis=1)
    rows = np.add.reduce(lengths > 0, axis=1)
    return tokens[:P] + tokens[P:], rows[:P] + rows[P:]


def dcp_rank0_seq_lens(seq_lens: np.ndarray, dcp_size: int, interleave: int) -> np.ndarray:
    """`[n]`: KV tokens DCP rank 0 holds of each sequence when blocks of `interleave`
    tokens are dealt round-robin over `dcp_size` ranks (the largest shard; vLLM
    `get_dcp_local_seq_lens(seq_lens, dcp_size, 0, interleave)`)."""
    s = np.asarray(seq_lens, dtype=np.int64)
    span = dcp_size * interleave
    return (s // span) * interleave + np.minimum(s % span, interleave)


def _replicated_counts(
    config: MRV2Config, n: np.ndarray, rep: np.ndarray, rank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`([P] tokens, [P] rows, this rank's requests)` of the non-empty replicated requests
    `rep` (in order): on every rank, or dealt round-robin with `shard_decode_requests`."""
    if config.shard_decode_requests:
        tokens, rows = _sharded(config, n[rep])
        return tokens, rows, rep[rank :: config.pcp_size]
    P = config.pcp_size
    return np.full(P, n[rep].sum(), dtype=np.int64), np.full(P, rep.size, dtype=np.int64), rep


def _context(split: Any, num_computed: np.ndarray | None, size: int) -> np.ndarray:
    if num_computed is not None:
        return np.asarray(num_computed, dtype=np.int64)
    if split.reads_context:
        raise ValueError(f"the {split.name!r} split reads num_computed: pass it")
    return np.zeros(size, dtype=np.int64)


def _local_runs(
    config: MRV2Config,
    rank: int,
    num_scheduled: np.ndarray,
    is_prefilling: np.ndarray,
    num_computed: np.ndarray | None,
) -> LocalSegments:
    """[`local_segments`][pcp_fn.mrv2.host.local_segments] of a split other than head-tail (no DCP:
    every prefill is split): `[P, S, 2]` runs of the `S` prefills from the split's rule, this
    rank's listed after its replicated requests, by request, first run first."""
    P = config.pcp_size
    n = np.asarray(num_scheduled, dtype=np.int64)
    k = _context(config.split, num_computed, n.size)
    split, rep = _split_and_replicated(n, is_prefilling)
    tokens, rows, request = _replicated_counts(config, n, rep, rank)
    offset, length = np.zeros(request.size, np.int64), n[request]
    if split.size:
        q = np.arange(P, dtype=np.int64)[:, None]
        first, size = config.split.runs(n[split], k[split], q, P)  # [P, S, 2]
        tokens = tokens + size.sum((1, 2))
        rows = rows + np.count_nonzero(size, axis=(1, 2))
        mine, keep = first[rank].reshape(-1), size[rank].reshape(-1) > 0
        request = np.concatenate([request, np.repeat(split, 2)[keep]])
        offset = np.concatenate([offset, mine[keep]])
        length = np.concatenate([length, size[rank].reshape(-1)[keep]])
    return LocalSegments(request.astype(np.intp), offset, length, tokens, rows)


def _widest_without_context(
    config: MRV2Config, num_scheduled: np.ndarray, is_prefilling: np.ndarray
) -> tuple[int, int]:
    """`(tokens, rows)` no rank exceeds whatever the contexts (module docstring of `largest_rank`)."""
    n = np.asarray(num_scheduled, dtype=np.int64)
    split, rep = _split_and_replicated(n, is_prefilling)
    tokens, rows, _ = _replicated_counts(config, n, rep, 0)
    widest = config.split.widest_without_context(n[split], config.pcp_size)
    return int(tokens.max() + widest.sum()), int(rows.max() + 2 * split.size)


def _split_and_replicated(n: np.ndarray, is_prefilling: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-empty prefills (split: no DCP here) and the non-empty others (replicated or
    dealt), as row indices in order."""
    live = n > 0
    split = np.logical_and(live, is_prefilling).nonzero()[0]
    return split, np.logical_and(live, np.logical_not(is_prefilling)).nonzero()[0]
