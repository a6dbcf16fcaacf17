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


class ChunkTable(NamedTuple):
    """Every rank's head and tail piece of every request, ``[P, R]`` int64 each
    (a replicated or sharded request is one head piece at offset 0)."""

    head_offset: np.ndarray
    head_length: np.ndarray
    tail_offset: np.ndarray
    tail_length: np.ndarray


def chunk_table(config: MRV2Config, num_scheduled: np.ndarray, is_prefilling: np.ndarray) -> ChunkTable:
    """``[P, R]`` head/tail offsets and lengths of every request on every rank.

    ``num_scheduled`` ``[R]`` ints, ``is_prefilling`` ``[R]`` bools (scheduler order).
    """
    P, C = config.pcp_size, config.num_chunks
    n = np.asarray(num_scheduled, dtype=np.int64)
    chunk = -(-n // C)
    replicated = ~np.asarray(is_prefilling, dtype=np.bool_)
    if config.dcp_size > 1:  # a prefill whose last chunk would be empty
        replicated = replicated | ((C - 1) * chunk >= n)
    q = np.arange(P, dtype=np.int64)[:, None]
    if config.shard_decode_requests:
        live = replicated & (n > 0)
        owner = (np.cumsum(live) - live) % P  # ordinal among the non-empty replicated requests
        rep_len = np.where(q == owner, n, 0)
    else:
        rep_len = np.broadcast_to(n, (P, n.size))
    head_off = np.where(replicated, 0, q * chunk)
    tail_off = np.where(replicated, 0, (C - 1 - q) * chunk)
    head_len = np.where(replicated, rep_len, np.clip(n - head_off, 0, chunk))
    tail_len = np.where(replicated, 0, np.clip(n - tail_off, 0, chunk))
    return ChunkTable(head_off, head_len, tail_off, tail_len)


def counts(table: ChunkTable) -> tuple[np.ndarray, np.ndarray]:
    """``([P], [P])``: local tokens and local segments (request rows) of every rank."""
    tokens = (table.head_length + table.tail_length).sum(axis=1)
    rows = (table.head_length > 0).sum(axis=1) + (table.tail_length > 0).sum(axis=1)
    return tokens, rows


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
    """Rank ``rank``'s segments (vLLM ``PCPManager._get_rank_segments``) without a loop over requests."""
    table = chunk_table(config, num_scheduled, is_prefilling)
    tokens, rows = counts(table)
    # non-prefilling requests first, each group by request; head (2j) before tail (2j + 1)
    order = np.argsort(np.asarray(is_prefilling, dtype=np.bool_), kind="stable")
    offset = np.stack([table.head_offset[rank, order], table.tail_offset[rank, order]], axis=1).ravel()
    length = np.stack([table.head_length[rank, order], table.tail_length[rank, order]], axis=1).ravel()
    keep = length > 0
    return LocalSegments(np.repeat(order, 2)[keep], offset[keep], length[keep], tokens, rows)


def dcp_rank0_seq_lens(seq_lens: np.ndarray, dcp_size: int, interleave: int) -> np.ndarray:
    """``[n]``: KV tokens DCP rank 0 holds of each sequence when blocks of ``interleave``
    tokens are dealt round-robin over ``dcp_size`` ranks (the largest shard; vLLM
    ``get_dcp_local_seq_lens(seq_lens, dcp_size, 0, interleave)``)."""
    s = np.asarray(seq_lens, dtype=np.int64)
    span = dcp_size * interleave
    return (s // span) * interleave + np.minimum(s % span, interleave)
