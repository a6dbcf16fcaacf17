"""What every benchmark shares: the reference batches (docs/performance.md), the timer, kernel counts,
and the one way a benchmark prints its tables and writes them as markdown (``--markdown PATH``)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # the repository's pcp_fn, installed or not

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


def wall_table(
    rows: list[tuple[str, int, str, dict[str, float]]], cols: list[str], mode: str
) -> tuple[list[str], list[list[str]]]:
    """``(columns, rows)`` for :meth:`Tables.table` of per-batch ``(name, P, mode, medians)``: each
    column's microseconds and its ratio to the first column (the reference), ``mode`` the heading
    of the mode column."""
    ref = cols[0]
    columns = ["batch", "P", mode, *(f"{c} us" for c in cols), *(f"{c} / {ref}" for c in cols[1:])]
    out = [
        [name, str(P), m, *(f"{t[c]:.0f}" for c in cols), *(f"{t[c] / t[ref]:.2f}" for c in cols[1:])]
        for name, P, m, t in rows
    ]
    return columns, out


# ---------------------------------------------------------------- tables, printed and as markdown
# the environment that changes what a benchmark measures: written before the command when set
COMMAND_ENV = (
    "PCP_FN_GRAPH_BACKEND",
    "PCP_FN_REF_VLLM_ASCEND_PCP_UTILS",
    "PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER",
    "VLLM_TARGET_DEVICE",
)


def add_markdown_option(parser: argparse.ArgumentParser) -> None:
    """``--markdown PATH``: the benchmark's tables also written to ``PATH`` (see :class:`Tables`)."""
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        default=None,
        help="also write the tables to PATH as a markdown fragment headed by the date, the machine, "
        "its load, the torch version and this command (what docs/performance.md includes)",
    )


def _portable(arg: str) -> str:
    """``arg`` without this machine's absolute paths: a path inside the repository relative to its
    root, one outside it as ``/path/to/NAME``."""
    if "=" in arg and arg.startswith("-"):
        flag, value = arg.split("=", 1)
        return f"{flag}={_portable(value)}"
    if not (os.path.isabs(arg) or (os.sep in arg and os.path.exists(os.path.dirname(arg) or "."))):
        return arg
    full = os.path.abspath(arg)
    if full == ROOT or full.startswith(ROOT + os.sep):
        return os.path.relpath(full, ROOT)
    return "/path/to/" + os.path.basename(full)


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran this benchmark, as run from the repository's root: ``python
    benchmarks/bench_x.py ARGS``, after the :data:`COMMAND_ENV` variables that were set and
    ``taskset -c CPUS`` when it ran on fewer CPUs than the machine has; no absolute path of this
    machine in it."""
    argv = list(sys.argv if argv is None else argv)
    words = [f"{k}={_portable(os.environ[k])}" for k in COMMAND_ENV if os.environ.get(k)]
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if cpus and len(cpus) < (os.cpu_count() or len(cpus)):
        words += ["taskset", "-c", ",".join(map(str, cpus))]
    script = os.path.relpath(os.path.abspath(argv[0]), ROOT)
    return shlex.join([*words, "python", script, *(_portable(a) for a in argv[1:])])


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def format_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """``rows`` under ``columns`` as the lines of a markdown table, each column padded to its widest
    cell (so it reads the same printed): ``None`` is an empty cell, ``|`` in a cell is escaped."""
    cells = [[str(c) for c in columns]]
    cells += [["" if c is None else str(c).replace("|", "\\|") for c in row] for row in rows]
    for row in cells:
        assert len(row) == len(columns), f"{len(row)} cells under {len(columns)} columns: {row}"
    width = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, width)) + " |"  # noqa: E731
    return [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in width) + "|", *map(line, cells[1:])]


def drop_empty_columns(
    columns: Sequence[str], rows: Sequence[Sequence[object]]
) -> tuple[list[str], list[list[object]], list[str]]:
    """``(columns, rows, dropped)``: ``columns`` and ``rows`` without the columns whose every cell
    is ``None`` or ``""``, and the names of those columns (none dropped from a table without rows)."""
    for row in rows:
        assert len(row) == len(columns), f"{len(row)} cells under {len(columns)} columns: {row}"
    empty = lambda c: c is None or c == ""  # noqa: E731
    keep = [i for i in range(len(columns)) if not rows or not all(empty(row[i]) for row in rows)]
    dropped = [str(columns[i]) for i in range(len(columns)) if i not in keep]
    return [columns[i] for i in keep], [[row[i] for i in keep] for row in rows], dropped


class Tables:
    """The tables a benchmark prints, one formatter for all of them (:func:`format_table`); with
    ``--markdown PATH`` (:func:`add_markdown_option`) :meth:`write` also writes them to ``PATH`` as
    one markdown fragment, headed by one line: the date (UTC), the machine (CPU model, core count,
    the load average at the start and at the end), the torch version (and ``versions``, e.g.
    vLLM's), and the command that produced it (:func:`command_line`)."""

    def __init__(self, markdown: str | None, versions: dict[str, str] | None = None) -> None:
        self.path = markdown
        self.versions = dict(versions or {})
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.load_start = os.getloadavg()[0]
        self.command = command_line()  # now: a benchmark may rewrite sys.argv for a tool it imports
        self.blocks: list[str] = []

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """Print ``rows`` under ``columns`` (a markdown table) after ``title``; kept for :meth:`write`.

        A column empty in every row (``None`` or ``""``: what a flag such as ``--no-compile`` left
        unmeasured) is left out, and the title names it, so no table has a column of blanks."""
        columns, rows, dropped = drop_empty_columns(columns, rows)
        if dropped:
            title += f" (not measured in this run: {', '.join(dropped)})"
        lines = format_table(columns, rows)
        print(f"\n{title}\n" + "\n".join(lines), flush=True)
        self.blocks.append(f"*{title}*\n\n" + "\n".join(lines))

    def note(self, text: str) -> None:
        """Print ``text``; kept for :meth:`write` as a paragraph after the tables so far."""
        print(text, flush=True)
        self.blocks.append(text)

    def heading(self) -> str:
        """The fragment's first line: date, machine and load, versions, command."""
        import torch

        cores = os.cpu_count()
        used = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
        machine = f"{cpu_model()}, {cores} cores" + (f" ({used} used)" if used != cores else "")
        versions = {"torch": torch.__version__, **self.versions}
        fields = [
            f"**date** {self.started:%Y-%m-%d %H:%M} UTC",
            f"**machine** {machine}",
            f"**load average** {self.load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
            *(f"**{name}** {version}" for name, version in versions.items()),
            f"**command** `{self.command}`",
        ]
        return " · ".join(fields)

    def write(self) -> None:
        """Write the fragment to the ``--markdown`` path (nothing without one)."""
        if not self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "w") as f:
            f.write("\n\n".join([self.heading(), *self.blocks]) + "\n")
        print(f"markdown: {self.path}")
