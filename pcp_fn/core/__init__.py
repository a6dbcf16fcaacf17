"""Layout-independent building blocks every layout package uses.

- [`pcp_fn.core.pytree`][]: frozen dataclass pytrees (static fields in the tree structure).
- [`pcp_fn.core.ragged`][]: the ragged-to-fixed-shape index primitives, the only index tricks.
- [`pcp_fn.core.buckets`][]: [`Bucket`][pcp_fn.Bucket] and the choice of the smallest one that holds a batch.
- [`pcp_fn.core.checks`][]: host-side validation of configs and per-request integer arrays.
- [`pcp_fn.core.rank`][]: the rank as a static int or as data (a 0-d tensor leaf), one way.
- [`pcp_fn.core.seqlens`][]: per-rank KV lengths under context parallelism.
- [`pcp_fn.core.entry`][]: the marker for ops that start a step (read only config and rank).

Nothing here knows a layout; the layout packages ([`pcp_fn.dcs`][],
[`pcp_fn.hybrid`][], [`pcp_fn.mrv2`][]) build on it.
"""

from .buckets import Bucket

__all__ = ["Bucket"]
