"""The DualChunkSwap scheduler batch's staging layout: what an adapter stages and a captured graph reads.

The per-request arrays of a [`SchedulerBatch`][pcp_fn.SchedulerBatch] in one int32
buffer ([`pcp_fn.core.packing.PackedRequests`][]), `R = max_num_reqs`:

    [ num_scheduled | num_computed | num_prompt | num_reqs ]
         [R]            [R]           [R]         1 word

Rows past the requests are zero. `num_prompt` is the prompt count the device
batch sees (vllm-ascend's `HostLayout.device_prompt`: the runner's prompt
lengths, but for a late decode of a dummy run, staged as `num_computed + 2`).
vllm-ascend's device graphs (`pcp_fn.adapters.vllm_ascend.v1._ops.DeviceGraphs`)
pack it on the host each step; `_ops.unpack_batch` (inside a graph) gives the
batch of a bucket over it.
"""

from __future__ import annotations

from ..core.packing import PackedRequests

REQUESTS = PackedRequests(rows=("num_scheduled", "num_computed", "num_prompt"), scalars=("num_reqs",))
"""The scheduler batch's per-request rows and its request count."""
