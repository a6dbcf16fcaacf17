"""Capture tools: one graph per bucket, `torch.export`, and the checks that keep ops capturable.

    captured = pcp_fn.graph.capture(pcp_fn.step, state, batch, slot_mapping)
    state, out = captured(state, next_batch, next_slot_mapping)   # replay

- [`pcp_fn.graph.capture`][]: [`capture`][pcp_fn.graph.capture.capture] /
  [`Captured`][pcp_fn.graph.Captured] (CUDA graph, NPU graph, or `torch.compile` per bucket on the
  CPU); [`compile_per_bucket`][pcp_fn.graph.compile_per_bucket] (`torch.compile`, one graph per
  bucket on any device, within Dynamo's default recompile limit);
  [`inductor_options`][pcp_fn.graph.inductor_options] (scalar C++ for CPU graphs of index maps
  alone).
- [`pcp_fn.graph.export`][]: [`export`][pcp_fn.graph.export.export] (`torch.export` with no symbolic shape).
- [`pcp_fn.graph.sync`][]: [`no_host_syncs`][pcp_fn.no_host_syncs],
  [`assert_no_host_syncs`][pcp_fn.assert_no_host_syncs] (a dispatch mode that fails on host syncs
  and host data inside an op) and [`count_aten_ops`][pcp_fn.count_aten_ops],
  [`count_kernels`][pcp_fn.graph.count_kernels] (the same minus view ops).
"""

from .capture import Captured, CaptureError, capture, compile_per_bucket, inductor_options
from .export import export
from .sync import (
    HostSyncError,
    OpCounter,
    assert_no_host_syncs,
    count_aten_ops,
    count_kernels,
    is_view_op,
    no_host_syncs,
)

__all__ = [
    "CaptureError",
    "Captured",
    "HostSyncError",
    "OpCounter",
    "assert_no_host_syncs",
    "capture",
    "compile_per_bucket",
    "count_aten_ops",
    "count_kernels",
    "export",
    "inductor_options",
    "is_view_op",
    "no_host_syncs",
]
