"""Layout-independent building blocks every layout package uses.

- :mod:`.pytree`: frozen dataclass pytrees (static fields in the tree structure).
- :mod:`.ragged`: the ragged-to-fixed-shape index primitives, the only index tricks.
- :mod:`.buckets`: :class:`Bucket` and the choice of the smallest one that holds a batch.
- :mod:`.checks`: host-side validation of configs and per-request integer arrays.
- :mod:`.rank`: the rank as a static int or as data (a 0-d tensor leaf), one way.
- :mod:`.seqlens`: per-rank KV lengths under context parallelism.
- :mod:`.entry`: the marker for ops that start a step (read only config and rank).

Nothing here knows a layout; the layout packages (:mod:`pcp_fn.dcs`,
:mod:`pcp_fn.hybrid`, :mod:`pcp_fn.mrv2`) build on it.
"""

from .buckets import Bucket

__all__ = ["Bucket"]
