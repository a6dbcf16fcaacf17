"""vLLM model runner V2's chunk and replication rules, written once (`PCPManager._iter_rank_chunks`,
`replicated_requests`).

Every function works on Python ints, numpy arrays (the host twin, [`pcp_fn.mrv2.host`][])
and tensors (the device layout, [`pcp_fn.mrv2.layout`][], and the facade layout,
[`pcp_fn.mrv2.facade`][]) alike. `P` ranks, `C = 2P` chunks:

- a split prefill of `n` tokens is cut into `C` chunks of `c = ceil(n / C)`
  ([`chunk_size`][pcp_fn.mrv2.chunks.chunk_size]); rank `q` holds chunk `q` (head) and chunk `C-1-q`
  (tail), each cut at the request's end ([`chunk_length`][pcp_fn.mrv2.chunks.chunk_length]: no
  padding, an empty chunk dropped);
- a prefill is split unless `dcp_size > 1` and it is too short to fill all `C` chunks
  (`(C-1) * c >= n`): then it is replicated like a decode ([`splits`][pcp_fn.mrv2.chunks.splits]).

`P = 2`, `n = 7`: `c = 2`, chunks `[0 1 | 2 3 | 4 5 | 6]`, rank 0 holds tokens
`0 1 6`, rank 1 `2 3 4 5`.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import numpy as np
import torch

N = TypeVar("N", int, np.ndarray, torch.Tensor)


class ChunkRule(Protocol):
    """What the rules read of a config (an [`pcp_fn.MRV2Config`][] or a [`pcp_fn.PCPConfig`][])."""

    @property
    def pcp_size(self) -> int: ...

    @property
    def dcp_size(self) -> int: ...


def chunk_size(n: N, num_chunks: int) -> N:
    """`ceil(n / num_chunks)`: tokens per chunk of a split prefill of `n >= 0`.

    On int32 counts (the device batch's) as `(n - 1) // num_chunks + 1`, which cannot wrap where
    `n + num_chunks - 1` can (a prefill near `INT32_MAX`); equal for every `n >= 0`.
    """
    if getattr(n, "dtype", None) in (torch.int32, np.int32):
        return (n - 1) // num_chunks + 1
    return (n + (num_chunks - 1)) // num_chunks


def splits(config: ChunkRule, n: Any, prefilling: Any, c: Any = None) -> Any:
    """The requests split into chunks: the prefilling ones, but under DCP only those whose last
    chunk is non-empty (vLLM `replicated_requests` holds the others). `c`: their
    [`chunk_size`][pcp_fn.mrv2.chunks.chunk_size], when the caller has it."""
    if config.dcp_size == 1:
        return prefilling
    C = 2 * config.pcp_size
    c = chunk_size(n, C) if c is None else c
    return prefilling & ((C - 1) * c < n)


def chunk_length(rest: N, size: Any) -> N:
    """Tokens of a chunk of `size` whose request has `rest` tokens from the chunk's start on
    (`n - first`): `min(max(rest, 0), size)`, the chunk cut at the request's end."""
    if isinstance(rest, torch.Tensor):
        return torch.minimum(rest.clamp(min=0), size)
    if isinstance(rest, np.ndarray):
        return np.minimum(np.maximum(rest, 0), size)
    return min(max(rest, 0), size)
