"""The host (numpy) twin of the MRV2 segment rules: O(P * R) integer arithmetic, no per-token work.

The device layout (:mod:`pcp_fn.mrv2.layout`) builds every per-token index;
a serving engine still needs a few *host* values each step before anything
runs on the device: every rank's token and row counts (to pick a graph
bucket, vLLM ``get_num_tokens_for_dispatch``) and this rank's segments (the
request ids, query start locations and sequence-length upper bounds the
attention builders read on the host). This module computes them from the
scheduler's per-request arrays with the same rules, vectorised over requests:

- a prefill of ``n`` tokens is cut into ``2P`` chunks of ``c = ceil(n / 2P)``,
  rank ``q`` takes chunk ``q`` (head) and ``2P-1-q`` (tail), each cut at the
  request's end, an empty chunk dropped;
- a decode (not prefilling), or with ``dcp_size > 1`` a prefill too short to
  fill all ``2P`` chunks, is replicated on every rank, or with
  ``shard_decode_requests`` given whole to rank ``ordinal % P``;
- each rank lists its segments decodes first, then prefills, by request, head
  before tail.

``P = 2``, scheduled ``[3, 8]``, request 1 prefilling, rank 1::

    >>> cfg = MRV2Config(pcp_size=2, pcp_rank=1, max_num_reqs=4, max_num_tokens=16)
    >>> seg = local_segments(cfg, 1, np.array([3, 8]), np.array([False, True]))
    >>> seg.request.tolist(), seg.offset.tolist(), seg.length.tolist()
    ([0, 1, 1], [0, 2, 4], [3, 2, 2])
    >>> seg.per_rank_num_tokens.tolist(), seg.per_rank_num_reqs.tolist()
    ([7, 7], [3, 3])
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .config import MRV2Config


class LocalSegments(NamedTuple):
    """One rank's segments in its local order, plus every rank's counts.

    Fields:
        request: ``[S]`` intp global batch row of each segment.
        offset: ``[S]`` int64 first token of the segment inside its request.
        length: ``[S]`` int64 tokens of the segment (all ``> 0``).
        per_rank_num_tokens: ``[P]`` int64 local tokens of every rank.
        per_rank_num_reqs: ``[P]`` int64 local segments of every rank.
    """

    request: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    per_rank_num_tokens: np.ndarray
    per_rank_num_reqs: np.ndarray


def local_segments(
    config: MRV2Config, rank: int, num_scheduled: np.ndarray, is_prefilling: np.ndarray
) -> LocalSegments:
    """Rank ``rank``'s segments (vLLM ``PCPManager._get_rank_segments``) and every rank's counts.

    ``num_scheduled`` ``[R]`` ints, ``is_prefilling`` ``[R]`` bools, scheduler
    order. Replicated requests cost ``O(R)``; only split prefills are expanded
    over the ``P`` ranks (``[P, S]``), so a decode-only step stays a few numpy
    calls.
    """
    # ufuncs and their methods, not the Python-level wrappers (clip, stack, sum): each call counts
    P, C = config.pcp_size, config.num_chunks
    n = np.asarray(num_scheduled)
    if n.dtype != np.int64:
        n = n.astype(np.int64)
    prefilling = np.asarray(is_prefilling, dtype=np.bool_)
    live = n > 0
    replicated = ~prefilling
    if config.dcp_size > 1:  # a prefill whose last chunk would be empty
        replicated |= (C - 1) * ((n + C - 1) // C) >= n
    rep = np.logical_and(replicated, live).nonzero()[0]  # non-empty replicated requests, in order
    split = np.greater(live, replicated).nonzero()[0]  # non-empty split prefills
    k = rep.size
    if config.shard_decode_requests:  # round-robin: the j-th replicated request goes to rank j % P
        per_rank = np.zeros(-(-k // P) * P, dtype=np.int64)
        per_rank[:k] = n[rep]
        tokens = np.add.reduce(per_rank.reshape(-1, P), axis=0)
        rows = np.array([k // P + (q < k % P) for q in range(P)], dtype=np.int64)
        mine = rep[rank::P]
    else:
        tokens = np.full(P, np.add.reduce(n[rep]), dtype=np.int64)
        rows = np.full(P, k, dtype=np.int64)
        mine = rep
    request, offset, length = mine, np.zeros(mine.size, np.int64), n[mine]
    if split.size:
        ns = n[split]
        chunk = (ns + C - 1) // C
        q = np.arange(P, dtype=np.int64)[:, None]
        head = np.minimum(np.maximum(ns - q * chunk, 0), chunk)  # [P, S]: chunk q, cut at the end
        tail = np.minimum(np.maximum(ns - (C - 1 - q) * chunk, 0), chunk)  # chunk 2P-1-q
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


def counts(
    config: MRV2Config, num_scheduled: np.ndarray, is_prefilling: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``([P], [P])``: local tokens and local segments (request rows) of every rank."""
    seg = local_segments(config, 0, num_scheduled, is_prefilling)
    return seg.per_rank_num_tokens, seg.per_rank_num_reqs


def dcp_rank0_seq_lens(seq_lens: np.ndarray, dcp_size: int, interleave: int) -> np.ndarray:
    """``[n]``: KV tokens DCP rank 0 holds of each sequence when blocks of ``interleave``
    tokens are dealt round-robin over ``dcp_size`` ranks (the largest shard; vLLM
    ``get_dcp_local_seq_lens(seq_lens, dcp_size, 0, interleave)``)."""
    s = np.asarray(seq_lens, dtype=np.int64)
    span = dcp_size * interleave
    return (s // span) * interleave + np.minimum(s % span, interleave)
