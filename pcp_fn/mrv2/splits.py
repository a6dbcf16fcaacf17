"""How a split prefill is cut over the ranks: at most two contiguous runs of it per rank.

vLLM model runner V2's attention reads each local request row as one contiguous,
ascending run of one request (its positions are `seq_len - query_len + j`), and its
input buffers hold `2 * max_num_reqs` local rows: a rank may hold at most two runs of
each request. Every partition of that shape is served by the same machinery (the
device layout [`pcp_fn.mrv2.layout`][], the host twin [`pcp_fn.mrv2.host`][], the
vLLM drop-in); a [`PrefillSplit`][pcp_fn.mrv2.splits.PrefillSplit] says which runs.
Three are built in, `P = 2`, a fresh prefill of `n = 10` tokens:

    head-tail (vLLM's)   2P chunks of c = ceil(n / 2P) = 3: rank q holds chunks q and 2P-1-q
                         rank 0: [0 1 2] [9]        rank 1: [3 4 5] [6 7 8]
    round-robin          the same chunks dealt in turn: rank q holds chunks q and P+q
                         rank 0: [0 1 2] [6 7 8]    rank 1: [3 4 5] [9]
    cost-balanced        one run per rank, cut where the causal work reaches q/P of the
                         request's (module docstring of CostBalanced)
                         rank 0: [0 .. 5]           rank 1: [6 7 8 9]

Each rule works on Python ints, numpy arrays (the host twin) and tensors (the device
layout, captured) alike: `runs(n, k, rank, P)` takes the scheduled tokens `n` and the
tokens already in the KV cache `k` (`[R]`, or broadcastable), a rank (an int, or an
array / tensor broadcastable against `n`: `[P, 1]` gives every rank's at once) and
returns `(first, length)`, each of `n`'s shape broadcast with `rank`'s plus a trailing
`2`: the offset inside the request and the tokens of the rank's two runs (a run of
length 0 is no run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import torch

from .chunks import chunk_length, chunk_size


def _pair(a: Any, b: Any) -> Any:
    """`[..., 2]`: `a` and `b` (broadcast) stacked last."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.stack(torch.broadcast_tensors(a, b), -1)
    a, b = np.broadcast_arrays(a, b)
    return np.stack([a, b], -1)


def _expand(x: Any) -> Any:
    """`x[..., None]` of an array or tensor (an int is itself)."""
    return x[..., None] if isinstance(x, (torch.Tensor, np.ndarray)) else x


@dataclasses.dataclass(frozen=True)
class PrefillSplit:
    """A split prefill's runs on each rank (subclass and implement `runs`; the built-ins below).

    Instances are frozen and compared by value: a split is part of the static
    [`MRV2Config`][pcp_fn.MRV2Config] that compiled graphs specialise on.

    Attributes:
        name: what the split is called (the layout registry's name of its layout).
        reads_context: the runs depend on `k`, the tokens already in the KV cache. vLLM's
            runner asks for the dispatch size (`get_num_tokens_for_dispatch`) before it
            hands the contexts over: such a split answers
            [`widest_without_context`][pcp_fn.mrv2.splits.PrefillSplit.widest_without_context].
    """

    name: ClassVar[str] = ""
    reads_context: ClassVar[bool] = False

    def runs(self, n: Any, k: Any, rank: Any, P: int) -> tuple[Any, Any]:
        """`(first, length)` `[..., 2]` of rank `rank`'s runs of prefills of `n` tokens behind `k`."""
        raise NotImplementedError

    def widest_without_context(self, n: np.ndarray, P: int) -> np.ndarray:
        """`[S]` the most tokens any rank can hold of each prefill `n [S]`, whatever its context.

        Read only for a split that [`reads_context`][pcp_fn.mrv2.splits.PrefillSplit] (the others
        are counted exactly). By default the whole prefill, a bound for every split; a split
        that reads the context overrides it with a tighter one (the padding it saves).
        """
        return np.asarray(n, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class ChunkSplit(PrefillSplit):
    """A split into `2P` chunks of `c = ceil(n / 2P)` tokens, each cut at the request's end: rank
    `q` holds the two chunks [`held`][pcp_fn.mrv2.splits.ChunkSplit.held] names. The device layout
    builds such a split from the chunk indices alone (one fused multiply-add a run)."""

    def held(self, rank: Any, P: int) -> tuple[Any, Any]:
        """The two chunks rank `rank` holds (`rank` an int, array or tensor; the results alike)."""
        raise NotImplementedError

    def runs(self, n: Any, k: Any, rank: Any, P: int) -> tuple[Any, Any]:
        c = chunk_size(n, 2 * P)
        a, b = self.held(rank, P)
        first = _pair(a * c, b * c)
        return first, chunk_length(_expand(n) - first, _expand(c))


@dataclasses.dataclass(frozen=True)
class HeadTail(ChunkSplit):
    """vLLM's `PCPManager._iter_rank_chunks`: rank `q` holds chunk `q` (head) and chunk `2P-1-q`
    (tail). Both ends of the causal triangle on every rank: the work evens out."""

    name: ClassVar[str] = "head-tail"

    def held(self, rank: Any, P: int) -> tuple[Any, Any]:
        return rank, (2 * P - 1) - rank


@dataclasses.dataclass(frozen=True)
class RoundRobin(ChunkSplit):
    """The `2P` chunks dealt in turn: rank `q` holds chunks `q` and `P+q` (a round-robin split in
    two rounds, as SGLang's context parallelism deals chunks; dealt token by token it would put
    one request row per token on a rank, past vLLM's `2 * max_num_reqs` rows). The later round
    costs more causal work than the earlier one, so the last rank does the most."""

    name: ClassVar[str] = "round-robin"

    def held(self, rank: Any, P: int) -> tuple[Any, Any]:
        return rank, rank + P


def work(b: Any, k: Any) -> Any:
    """Key-query pairs of a request's first `b` tokens behind `k` cached ones:
    `b * k + b * (b + 1) / 2` (token `j` attends `k + j + 1` keys)."""
    return b * k + b * (b + 1) // 2


def balanced_bound(n: Any, k: Any, q: Any, P: int) -> Any:
    """`b_q = max { b in [0, n] : P * W(b) <= q * W(n) }` (int64; `W` is [`work`][pcp_fn.mrv2.splits.work]).

    A float square root guesses it, one step either way makes it exact. Exact while
    `P * (n + k)^2` fits int64 (a request of up to ~2^29 tokens at `P = 8`).
    """
    xp = torch if isinstance(n, torch.Tensor) else np
    if xp is torch:
        n, k = n.to(torch.int64), k.to(torch.int64)
        q = q.to(torch.int64) if isinstance(q, torch.Tensor) else q
        a = k.to(torch.float64)
    else:
        n, k = np.asarray(n, np.int64), np.asarray(k, np.int64)
        a = k.astype(np.float64)
    target = work(n, k) * q  # compare P * W(b) with q * W(n): no division, no rounding
    # the root of b^2/2 + (k + 1/2) b = q W(n) / P, rationalised (no cancellation for small q)
    w2 = 2.0 * target / P
    guess = xp.floor(w2 / (a + 0.5 + xp.sqrt((a + 0.5) ** 2 + w2)))
    b = guess.to(torch.int64) if xp is torch else guess.astype(np.int64)
    b = xp.minimum(xp.maximum(b, xp.zeros_like(b)), n)
    b = xp.where((work(b + 1, k) * P <= target) & (b < n), b + 1, b)  # the guess is within one of b_q
    return xp.where(work(b, k) * P > target, b - 1, b)


@dataclasses.dataclass(frozen=True)
class CostBalanced(PrefillSplit):
    """One contiguous run per rank, cut where the causal attention work reaches `q/P`:
    rank `q` holds tokens `[b_q, b_{q+1})` ([`balanced_bound`][pcp_fn.mrv2.splits.balanced_bound]).

    A fresh prefill (`k = 0`) gets `b_q ~ n * sqrt(q / P)`: at `P = 4` a 256-token prompt
    splits `[127, 53, 41, 35]` tokens, the work within 3%; a chunk behind a long context
    (`k >> n`) tends to equal token counts. One run per rank per request (half of
    head-tail's rows), no pad.
    """

    name: ClassVar[str] = "cost-balanced"
    reads_context: ClassVar[bool] = True

    def runs(self, n: Any, k: Any, rank: Any, P: int) -> tuple[Any, Any]:
        if isinstance(rank, (torch.Tensor, np.ndarray)):  # both cuts in one pass: half the kernels
            xp = torch if isinstance(rank, torch.Tensor) else np
            lead = (1,) * max(getattr(n, "ndim", 0) - rank.ndim, 0)  # [2, ...]: the pair apart from n's dims
            both = xp.stack([rank, rank + 1]).reshape(2, *lead, *rank.shape)
            begin, end = balanced_bound(n, k, both, P)
        else:
            begin, end = balanced_bound(n, k, rank, P), balanced_bound(n, k, rank + 1, P)
        if isinstance(n, torch.Tensor):
            begin, end = begin.to(n.dtype), end.to(n.dtype)
        return _pair(begin, end), _pair(end - begin, end * 0)

    def widest_without_context(self, n: np.ndarray, P: int) -> np.ndarray:
        """`min(n, b_1 + 1)` with `b_1` rank 0's cut at `k = 0`.

        Let `x_q` solve `P * W(x) = q * W(n)` over the reals, so `b_q = floor(x_q)` and a run
        is `b_{q+1} - b_q < x_{q+1} - x_q + 1`. `W` is convex, so equal steps of work cost
        ever fewer tokens: `x_{q+1} - x_q <= x_1`. And `W(x) / W(n)` grows with `k` for
        `x < n` (its derivative in `k` has the sign of `x n (n - x) / 2`), so `x_1` shrinks:
        no run exceeds `floor(x_1(k = 0)) + 1`.
        """
        n = np.asarray(n, dtype=np.int64)
        return np.minimum(n, balanced_bound(n, np.zeros_like(n), 1, P) + 1)


HEAD_TAIL = HeadTail()
"""vLLM's split ([`HeadTail`][pcp_fn.mrv2.splits.HeadTail]), the default of [`pcp_fn.MRV2Config`][]."""
ROUND_ROBIN = RoundRobin()
"""The `"round-robin"` layout's split ([`RoundRobin`][pcp_fn.mrv2.splits.RoundRobin])."""
COST_BALANCED = CostBalanced()
"""The `"cost-balanced"` layout's split ([`CostBalanced`][pcp_fn.mrv2.splits.CostBalanced])."""
