"""The MRV2 global batch's staging layout: what `make_batch` copies and a captured graph reads.

The per-request arrays of a [`GlobalBatch`][pcp_fn.mrv2.GlobalBatch] in one int32
buffer ([`pcp_fn.core.packing.PackedRequests`][]), `R = max_num_reqs`:

    [ num_scheduled | num_computed | prefill_len | is_prefilling | idx_mapping | num_reqs ]
         [R]            [R]           [R]          [R] (0 / 1)       [R]          1 word

[`pcp_fn.mrv2.make_batch`][] packs it on the host;
[`pcp_fn.mrv2.unpack_batch`][] (inside a graph) gives the batch over it. An
adapter that stages its own buffer (`pcp_fn.adapters.vllm.graphs`) packs the
same layout with its own scalars after these ([`REQUESTS`][pcp_fn.mrv2.REQUESTS]
`.with_scalars(...)`).
"""

from __future__ import annotations

from ..core.packing import PackedRequests

REQUESTS = PackedRequests(
    rows=("num_scheduled", "num_computed", "prefill_len", "is_prefilling", "idx_mapping"),
    scalars=("num_reqs",),
)
"""The global batch's per-request rows and its request count."""
