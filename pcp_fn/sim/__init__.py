"""The simulator beside the library: a small serving engine, a tiny paged-attention
model, JSONL traces with deterministic replay, and the `pcp-fn` command.

`import pcp_fn` does not import this package; it builds on the public API:

- [`pcp_fn.sim.engine`][]: chunked-prefill scheduler, paged blocks, the per-rank runner
  (every step checks that all ranks run the same batch);
- [`pcp_fn.sim.tiny_model`][]: a two-layer float64 decoder wired the way a PCP runner wires it;
- [`pcp_fn.sim.mrv2_path`][]: the runner's MRV2 layout, the only module calling [`pcp_fn.mrv2`][];
- [`pcp_fn.sim.trace`][]: `write_trace` / `read_trace` / `replay` (a SHA-256 digest; one
  graph per bucket in the compiled and captured modes), `replay_digest` and
  `stream_trace` (the digest, a trace read, in memory bounded by one step), `check_replay` (a
  recorded trace as a regression test); an engine's recorded traces
  ([`pcp_fn.adapters.recording`][]) replay through `pcp_fn.mrv2`;
- [`pcp_fn.sim.compare`][]: every layout's per-rank costs under a workload's config (table, figure,
  CSV, JSON);
- [`pcp_fn.sim.show`][]: which rank holds which token of one batch, under any layout (text, figure);
- [`pcp_fn.sim.outputs`][]: the commands' output paths, checked before any work;
- [`pcp_fn.sim.cli`][]: `pcp-fn simulate | record | replay | compare | show`.

Per-token inputs enter bucket-shaped through the host boundary
(`make_batch(..., slot_mapping=...)`), so a compiled step sees one shape per bucket.
"""

from .trace import check_replay, read_trace, replay, replay_digest, stream_trace, write_trace

__all__ = ["check_replay", "read_trace", "replay", "replay_digest", "stream_trace", "write_trace"]
