"""Graph buckets: the static sizes every output shape derives from.

A [`Bucket`][pcp_fn.Bucket] is a pair (request rows, local token rows per rank). A
config carries the allowed sizes of each (default: powers of two, then the
capacity); the host boundary picks the smallest pair that holds a batch, like
a CUDA-graph capture size:

    request_buckets (1, 2, 4, 8)   token_buckets (1, 2, 4, 8, 16, 24)
    batch: 3 requests, 9 local tokens  ->  Bucket(num_reqs=4, num_tokens=16)
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Iterable

from .checks import check_int


@dataclasses.dataclass(frozen=True)
class Bucket:
    """A graph bucket: request rows `[num_reqs]` and local token rows `[num_tokens]`.

    The gathered buffer of a bucket has `pcp_size * num_tokens` rows.
    """

    num_reqs: int
    num_tokens: int

    def __post_init__(self) -> None:
        check_int("Bucket.num_reqs", self.num_reqs, 1)
        check_int("Bucket.num_tokens", self.num_tokens, 1)

    def holds(self, other: Bucket) -> bool:
        """Every dimension of `other` fits in this bucket."""
        return other.num_reqs <= self.num_reqs and other.num_tokens <= self.num_tokens


def powers_of_two_then(cap: int) -> tuple[int, ...]:
    """`(1, 2, 4, ..., cap)`: the default bucket sizes up to a capacity."""
    sizes = []
    size = 1
    while size < cap:
        sizes.append(size)
        size *= 2
    sizes.append(cap)
    return tuple(sizes)


def geometric_buckets(cap: int, per_octave: int = 1) -> tuple[int, ...]:
    """Bucket sizes up to `cap` with `per_octave` sizes in each doubling, then `cap`.

    Size `ceil(2**k * (1 + j / per_octave))` for `j < per_octave`, so a batch of `n`
    rows gets a bucket below `n * (1 + 1 / per_octave) + 1`;
    `per_octave=1` is [`powers_of_two_then`][pcp_fn.core.buckets.powers_of_two_then]. Each size is
    one graph per request bucket: `per_octave` times the graphs for a finer fit (less padding to
    compute and to restore):

        geometric_buckets(24, 2)   ->  (1, 2, 3, 4, 6, 8, 12, 16, 24)
        geometric_buckets(40, 4)   ->  (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40)
    """
    check_int("cap", cap, 1)
    check_int("per_octave", per_octave, 1)
    sizes = set()
    base = 1
    while base < cap:
        for j in range(per_octave):
            size = base - (-base * j // per_octave)
            if size < cap:
                sizes.add(size)
        base *= 2
    return (*sorted(sizes), cap)


def normalise_buckets(name: str, sizes: Iterable[int] | None, cap: int) -> tuple[int, ...]:
    """Sorted distinct bucket sizes, each in `[1, cap]`, ending with `cap`.

    `None` gives [`powers_of_two_then`][pcp_fn.core.buckets.powers_of_two_then]. The capacity is
    always a bucket, so only a batch beyond it is an error.
    """
    if sizes is None:
        return powers_of_two_then(cap)
    if isinstance(sizes, str | bytes) or not isinstance(sizes, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(sizes).__name__} {sizes!r}")
    out = []
    for s in sizes:
        check_int(f"{name} entry", s, 1)
        if s > cap:
            raise ValueError(f"{name} size {s} exceeds the capacity {cap}")
        out.append(s)
    out = sorted(set(out))
    if not out or out[-1] != cap:
        out.append(cap)
    return tuple(out)


def smallest_bucket(
    request_buckets: tuple[int, ...], token_buckets: tuple[int, ...], reqs: int, tokens: int
) -> Bucket:
    """The smallest configured [`Bucket`][pcp_fn.Bucket] holding `reqs` and `tokens` (both within
    capacity)."""
    return _bucket(
        request_buckets[bisect.bisect_left(request_buckets, reqs)],
        token_buckets[bisect.bisect_left(token_buckets, tokens)],
    )


@functools.lru_cache(maxsize=4096)
def _bucket(num_reqs: int, num_tokens: int) -> Bucket:
    """One [`Bucket`][pcp_fn.Bucket] object per size pair (checked once; a host boundary picks one a step)."""
    return Bucket(num_reqs, num_tokens)
