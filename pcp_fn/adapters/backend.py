"""What every adapter's graphs share: the backend switch, the ladder of buckets, the package cache.

One configuration switch for every drop-in (vLLM's `FunctionalPCPManager`,
vllm-ascend's `FunctionalDCSManager` and `FunctionalAscendPCPManager`):

- `PCP_FN_GRAPH_BACKEND` ([`default_graph_backend`][pcp_fn.adapters.backend.default_graph_backend],
  resolved per device by [`resolve_graph_backend`][pcp_fn.adapters.backend.resolve_graph_backend]):
  `auto` (default) captures device graphs on CUDA / NPU and makes plain calls on the CPU; `aoti`
  loads AOTInductor packages; `none` makes plain calls; anything else is a `torch.compile`
  backend on the CPU (device graphs on CUDA / NPU);
- `PCP_FN_CACHE_DIR` ([`package_cache_dir`][pcp_fn.adapters.backend.package_cache_dir]): where
  `aoti` packages are cached, each named by everything it depends on
  ([`package_name`][pcp_fn.adapters.backend.package_name]).

Every graph is made at the manager's construction, one per rung of
[`graph_ladder`][pcp_fn.adapters.backend.graph_ladder], never at a step;
[`GraphStats`][pcp_fn.adapters.backend.GraphStats] counts what was made.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Sequence

import torch

from ..core.buckets import Bucket, normalise_buckets

AUTO = "auto"

SMALLEST_BUCKET = 16
"""The smallest rung of the default ladder: below it a graph costs the same, so it serves all."""


def default_graph_backend() -> str:
    """`$PCP_FN_GRAPH_BACKEND` (default `auto`): see
    [`resolve_graph_backend`][pcp_fn.adapters.backend.resolve_graph_backend]."""
    return os.environ.get("PCP_FN_GRAPH_BACKEND", AUTO)


def resolve_graph_backend(value: str | None, device: torch.device) -> str | None:
    """The bookkeeping backend for `device`: `None` means plain calls (nothing compiled).

    `auto`: device graphs on CUDA / NPU (captured at construction: no compile),
    plain calls on the CPU, where a compile costs seconds per graph at start-up
    for well under a millisecond a step (README, "Run it in a real vLLM
    engine"). `none`: plain calls. `aoti`: AOTInductor packages, cached on
    disk ([`package_cache_dir`][pcp_fn.adapters.backend.package_cache_dir]). Anything else: a `torch.compile`
    backend on the CPU (device graphs on CUDA / NPU).
    """
    if value is None or value.lower() == "none":
        return None
    if value.lower() == AUTO:
        return None if device.type == "cpu" else "inductor"
    return value


def package_cache_dir() -> str:
    """Where `aoti` packages are cached: `$PCP_FN_CACHE_DIR`, else `~/.cache/pcp_fn/aoti`."""
    return os.environ.get("PCP_FN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "pcp_fn", "aoti"
    )


@functools.cache
def source_digest() -> str:
    """SHA-256 of pcp_fn's Python sources (a cached package is stale once any of them changes)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def package_name(prefix: str, *key: object) -> str:
    """`prefix_<digest>.pt2`: an AOTInductor package file named by `key` (the config, the
    bucket, the device type...), torch's version and pcp_fn's sources."""
    text = "\n".join((*map(repr, key), torch.__version__, source_digest()))
    return f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:24]}.pt2"


@dataclasses.dataclass
class GraphStats:
    """What a manager's graphs did: `prepared` graphs made up front in `prepare_seconds`
    (`loaded` of them AOTInductor packages found in the disk cache, not compiled); `steps`
    steps; `fallbacks` steps run eagerly because their bucket had no prepared graph (each
    bucket logged once)."""

    prepared: int = 0
    loaded: int = 0
    prepare_seconds: float = 0.0
    steps: int = 0
    fallbacks: int = 0


def graph_ladder(
    max_local_reqs: int, max_local_tokens: int, token_sizes: Sequence[int] | None = None
) -> tuple[Bucket, ...]:
    """The buckets an adapter prepares: one per token size, rows growing with tokens.

    `token_sizes` (default: powers of two from
    [`SMALLEST_BUCKET`][pcp_fn.adapters.backend.SMALLEST_BUCKET]) end with the capacity `T`; each
    gives `Bucket(min(Lb, 2R), Lb)`, plus `Bucket(2R, T)` when `2R > T` (a FULL descriptor may pad
    rows past `T`):

        2R = 8, T = 100   ->  (8, 16) (8, 32) (8, 64) (8, 100)
        2R = 512, T = 64  ->  (16, 16) (32, 32) (64, 64) (512, 64)
    """
    if token_sizes is None:
        token_sizes = [s for s in (SMALLEST_BUCKET << k for k in range(64)) if s < max_local_tokens]
    sizes = normalise_buckets("token_sizes", token_sizes, max_local_tokens)
    ladder = [Bucket(min(t, max_local_reqs), t) for t in sizes]
    if max_local_reqs > max_local_tokens:
        ladder.append(Bucket(max_local_reqs, max_local_tokens))
    return tuple(ladder)


def capture_ladder(capture_sizes: Sequence[int] | None, max_local_tokens: int) -> tuple[int, ...] | None:
    """Token sizes of a ladder that holds an engine's CUDA-graph capture sizes: each size up
    to `T`, then powers of two to `T` (`None` without sizes: the default ladder):

        capture_ladder([1, 2, 4, 8, 16, 24, 32], 128)  ->  (1, 2, 4, 8, 16, 24, 32, 64)

    (`graph_ladder` adds `T` itself.) vLLM pads a batch's local tokens to a capture
    size; a rung of exactly that size replays it without padding it again.
    """
    sizes = sorted({int(s) for s in capture_sizes or () if 0 < int(s) <= max_local_tokens})
    if not sizes:
        return None
    top, T = sizes[-1], max_local_tokens
    return (*sizes, *(1 << k for k in range(top.bit_length(), T.bit_length()) if (1 << k) < T))
