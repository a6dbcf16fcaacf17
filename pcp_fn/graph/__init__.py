"""Capture tools: one graph per bucket, ``torch.export``, and the checks that keep ops capturable.

    captured = pcp_fn.graph.capture(pcp_fn.step, state, batch, slot_mapping)
    state, out = captured(state, next_batch, next_slot_mapping)   # replay

- :mod:`.capture`: :func:`capture` / :class:`Captured` (CUDA graph, NPU graph,
  or ``torch.compile`` per bucket on the CPU); :func:`compile_per_bucket`
  (``torch.compile``, one graph per bucket on any device, within Dynamo's
  default recompile limit); :func:`inductor_options` (scalar C++ for CPU graphs
  of index maps alone).
- :mod:`.export`: :func:`export` (``torch.export`` with no symbolic shape).
- :mod:`.sync`: :func:`no_host_syncs`, :func:`assert_no_host_syncs` (a
  dispatch mode that fails on host syncs and host data inside an op) and
  :func:`count_aten_ops`, :func:`count_kernels` (the same minus view ops).
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
