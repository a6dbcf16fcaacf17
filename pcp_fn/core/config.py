"""`RankConfig`: the fields every layout's configuration of one PCP rank shares.

[`pcp_fn.PCPConfig`][] (the Layout protocol's config) and [`pcp_fn.MRV2Config`][]
(vLLM model runner V2's own API) are both frozen dataclasses over this base: one
spelling of each shared field, one validation, one bucket choice. Plain, hashable
Python: the static half of every pytree, so `torch.compile`, `torch.export` and
`graph.capture` specialise on it.

A subclass says what its capacities are
([`RankConfig.max_local_reqs`][pcp_fn.core.config.RankConfig.max_local_reqs],
[`RankConfig.max_local_tokens`][pcp_fn.core.config.RankConfig.max_local_tokens]: the largest bucket)
and how it names them in an error
([`RankConfig.CAPACITY_NAMES`][pcp_fn.core.config.RankConfig.CAPACITY_NAMES]); its own fields are
keyword-only and come after these.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .buckets import Bucket, normalise_buckets, smallest_bucket
from .checks import INT32_MAX, check_bool, check_int

SHARED_INTS: dict[str, int] = dict(
    pcp_size=1,
    pcp_rank=0,
    max_num_reqs=1,
    max_num_tokens=1,
    dcp_size=1,
    dcp_rank=0,
    pad_slot_id=-(2**31),
    cp_kv_cache_interleave_size=1,
)
"""The shared integer fields and their minimum (each at most int32)."""


@dataclasses.dataclass(frozen=True)
class RankConfig:
    """Static configuration of one rank (`pcp_rank` of `pcp_size`).

    Args:
        pcp_size: `P`, prefill context-parallel ranks.
        pcp_rank: this rank, `0 <= pcp_rank < P` (or give the rank as a 0-d tensor to
            the config's `init_state`: rank as data).
        max_num_reqs: `R`, requests per step.
        max_num_tokens: `T`, scheduled tokens per step (all requests).
        dcp_size: decode context-parallel ranks (the KV split); default 1.
        dcp_rank: this DCP rank, `0 <= dcp_rank < dcp_size`; default 0.
        cp_kv_cache_interleave_size: tokens per KV interleave block; default 1.
        pad_slot_id: the KV slot of rows that must not write the cache; default -1.
        request_buckets: allowed request-row bucket sizes; default `None`: powers of
            two, then the capacity ([`pcp_fn.core.buckets.geometric_buckets`][] makes
            finer ladders).
        token_buckets: allowed local-token bucket sizes per rank; default `None`, as above.
    """

    pcp_size: int
    pcp_rank: int
    max_num_reqs: int
    max_num_tokens: int
    dcp_size: int = dataclasses.field(default=1, kw_only=True)
    dcp_rank: int = dataclasses.field(default=0, kw_only=True)
    cp_kv_cache_interleave_size: int = dataclasses.field(default=1, kw_only=True)
    pad_slot_id: int = dataclasses.field(default=-1, kw_only=True)
    request_buckets: tuple[int, ...] | None = dataclasses.field(default=None, kw_only=True)
    token_buckets: tuple[int, ...] | None = dataclasses.field(default=None, kw_only=True)

    CAPACITY_NAMES: ClassVar[tuple[str, str, str]] = (
        "requests",
        "max_num_reqs={}",
        "the local capacity L={}",
    )
    """How a subclass's errors name its request rows, its request capacity and its token capacity (`{}`: the
    value)."""
    OWN_INTS: ClassVar[dict[str, int]] = {}
    """A subclass's own integer fields and their minimum, its boolean flags (validated after the
    shared ones, in this order)."""
    OWN_FLAGS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name, minimum in {**SHARED_INTS, **self.OWN_INTS}.items():
            check_int(name, getattr(self, name), minimum, INT32_MAX)
        for size, rank in (("pcp_size", "pcp_rank"), ("dcp_size", "dcp_rank")):
            if getattr(self, rank) >= getattr(self, size):
                raise ValueError(f"{rank} must be < {size}={getattr(self, size)}, got {getattr(self, rank)}")
        for flag in self.OWN_FLAGS:
            check_bool(flag, getattr(self, flag))

    def _normalise_buckets(self) -> None:
        """Normalise the bucket lists in place once (frozen), so equal configs hash equal."""
        for name, cap in (("request_buckets", self.max_local_reqs), ("token_buckets", self.max_local_tokens)):
            object.__setattr__(self, name, normalise_buckets(name, getattr(self, name), cap))

    # -- what a subclass defines -------------------------------------------------------
    @property
    def max_local_reqs(self) -> int:
        """Request rows of the largest bucket."""
        raise NotImplementedError

    @property
    def max_local_tokens(self) -> int:
        """Local token rows per rank of the largest bucket."""
        raise NotImplementedError

    # -- buckets ----------------------------------------------------------------------
    @property
    def capacity(self) -> Bucket:
        """The largest bucket."""
        return Bucket(self.max_local_reqs, self.max_local_tokens)

    def bucket_for(self, num_reqs: int, num_local_tokens: int) -> Bucket:
        """Smallest configured bucket holding `num_reqs` request rows and `num_local_tokens`
        local tokens; `ValueError` naming the capacity a batch exceeds."""
        rows, reqs, tokens = self.CAPACITY_NAMES
        if num_reqs > self.max_local_reqs:
            raise ValueError(f"{num_reqs} {rows} exceed {reqs.format(self.max_local_reqs)}")
        if num_local_tokens > self.max_local_tokens:
            raise ValueError(f"{num_local_tokens} local tokens exceed {tokens.format(self.max_local_tokens)}")
        return smallest_bucket(self.request_buckets, self.token_buckets, num_reqs, num_local_tokens)

    def buckets(self) -> list[Bucket]:
        """Every configured bucket (for capturing up front)."""
        return [Bucket(r, t) for r in self.request_buckets for t in self.token_buckets]
