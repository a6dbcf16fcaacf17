"""What every benchmark shares: the DESIGN.md §7 reference batches, the timer, kernel counts."""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the repository's pcp_fn, installed or not

R, T, H = 256, 8192, 128  # max_num_reqs, max_num_tokens, hidden size


def reference_batches() -> dict[str, tuple[int, tuple[list[int], list[int], list[int]]]]:
    """``name -> (P, (num_scheduled, num_computed, num_prompt))``: decodes have 500 computed
    tokens and a 100-token prompt, prefills start from 0."""

    def decodes(k: int) -> tuple[list[int], list[int], list[int]]:
        return [1] * k, [500] * k, [100] * k

    a = decodes(256)
    b = decodes(64)
    b = (b[0] + [2048, 1000], b[1] + [0, 0], b[2] + [2048, 1000])
    c = decodes(255)
    c = (c[0] + [4096], c[1] + [0], c[2] + [4096])
    return {"A": (4, a), "B": (4, b), "C": (8, c)}


def timings_us(fn: Callable[[], object], iters: int, warmup: int = 10) -> list[float]:
    """Wall time of ``fn()`` in microseconds, ``iters`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return samples


def median_us(fn: Callable[[], object], iters: int, warmup: int = 10) -> float:
    """Median wall time of ``fn()`` in microseconds over ``iters`` calls, after ``warmup``."""
    return statistics.median(timings_us(fn, iters, warmup))


def spread(samples: list[float]) -> str:
    """``median [p10-p90]`` of timings, in microseconds."""
    q = statistics.quantiles(samples, n=10)
    return f"{statistics.median(samples):.1f} [{q[0]:.0f}-{q[-1]:.0f}]"


FALLBACK = r"^\s+(?:\w+ = )?(?:torch\.ops\.)?(?:aten|extern_kernels)\.\w+"  # a call inductor did not fuse


def inductor_kernels(fn: Callable[..., object], *args: object) -> tuple[int, int]:
    """``(fused, fallback)`` kernels a fresh ``torch.compile(fn)`` calls per step on this device:
    inductor's generated (fused) kernels and the aten ops it falls back to (scans, scatters)."""
    import torch
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=False)
    _, codes = run_and_get_code(compiled, *args)
    fused = fallback = 0
    for code in codes:
        body = code[code.index("def call(") :]
        fused += len(re.findall(r"^\s+(?:cpp|triton)_\w+\(", body, re.M))
        fallback += len(re.findall(FALLBACK, body, re.M))
    return fused, fallback


def reference_loader_or_none(reference_path: str | None):
    """``tools/reference_loader`` when the vllm-ascend reference is reachable (``--reference PATH``, or
    found by ``tools/reference.py``), else ``None``: the benchmarks then skip the reference timings."""
    if reference_path:
        os.environ["PCP_FN_REF_VLLM_ASCEND_PCP_UTILS"] = reference_path
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    try:
        import reference_loader
    except ImportError:
        return None
    return reference_loader if reference_loader.reference_file() is not None else None


def cpu_options(args: tuple) -> dict:
    """The inductor options ``pcp_fn.graph.capture`` compiles ``args``' graph with on the CPU
    (scalar C++ for index maps alone), for a direct ``torch.compile`` to measure the same code."""
    import torch

    import pcp_fn

    return pcp_fn.graph.inductor_options(args, torch.device("cpu"))


def print_wall_table(
    rows: list[tuple[str, int, str, dict[str, float]]], cols: list[str], mode: str, width: int
) -> None:
    """Per batch ``(name, P, mode, medians)``: each column's microseconds and its ratio to the
    first column (the reference), ``mode`` the heading of the ``width``-wide mode column."""
    ref = cols[0]
    print(
        f"{'batch':5} {'P':>2} {mode:>{width}} | "
        + " ".join(f"{c:>8}" for c in cols)
        + " | "
        + " ".join(f"{c + '/' + ref:>12}" for c in cols[1:])
    )
    for name, P, m, t in rows:
        print(
            f"{name:5} {P:>2} {m:>{width}} | "
            + " ".join(f"{t[c]:8.0f}" for c in cols)
            + " | "
            + " ".join(f"{t[c] / t[ref]:12.2f}" for c in cols[1:])
        )
