"""The simulator beside the library: a small serving engine, a tiny paged-attention
model, JSONL traces with deterministic replay, and the ``pcp-fn`` command.

``import pcp_fn`` does not import this package; it builds on the public API:

- :mod:`.engine`: chunked-prefill scheduler, paged blocks, the per-rank runner;
- :mod:`.tiny_model`: a two-layer float64 decoder wired the way a PCP runner wires it;
- :mod:`.trace`: ``write_trace`` / ``read_trace`` / ``replay`` (a SHA-256 digest);
- :mod:`.cli`: ``pcp-fn simulate | record | replay``.
"""

from .trace import read_trace, replay, write_trace

__all__ = ["read_trace", "replay", "write_trace"]
