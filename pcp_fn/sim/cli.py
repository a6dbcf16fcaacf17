"""pcp-fn: simulate PCP scheduling, record traces, replay them, compare layouts, show one batch.

pcp-fn simulate                          # a synthetic workload at P=4, every rank, checked
pcp-fn record trace.jsonl [--force]      # the same, written as a trace (never overwrites unless told)
pcp-fn replay trace.jsonl [--expect D]   # replay through the pure step; prints the SHA-256 digest
pcp-fn compare trace.jsonl --plot a.png  # every layout's per-rank cost at P = 2..8 (trace optional)
pcp-fn show --layout mrv2                # which rank holds which token of one batch (the README's)

Exit status: 0 on success, 1 when replay --expect meets another digest, 2 on bad input
(a malformed trace, a bad flag, a file that cannot be read or written, a --load file that
fails or registers no layout: one line on stderr, no traceback), 130 / 143 when interrupted
(SIGINT / SIGTERM; record leaves no file behind).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from .. import (
    Bucket,
    PCPConfig,
    PCPState,
    SchedulerBatch,
    StepOutputs,
    __version__,
    available_layouts,
    init_state,
    make_batch,
    step,
)
from ..adapters.vllm.against import SPLIT_FIELDS, compare_with_vllm
from ..adapters.vllm_ascend.v2.against import compare_with_vllm_ascend
from . import compare, show
from .compare import LayoutFailed, compare_config, describe, format_refusals, format_table
from .engine import Runner, ScheduledStep, StepRecord, synthetic_requests
from .outputs import check_distinct, check_output_path, check_plot_path
from .trace import (
    LIMITS,
    Terminated,
    TraceError,
    TraceStep,
    check_gathered_rows,
    replay_digest,
    stream_trace,
    write_trace,
)

DEFAULT_BACKEND = "inductor"

FLAG_LIMITS = {
    "--pcp-size": LIMITS["pcp_size"],
    "--pcp-sizes": LIMITS["pcp_size"],
    "--max-num-reqs": LIMITS["max_num_reqs"],
    "--max-num-tokens": LIMITS["max_num_tokens"],
    "--spec-tokens": LIMITS["max_num_tokens"],
    "--requests": 1 << 16,
    "--prompt-len": 1 << 20,
    "--output-len": 1 << 20,
    "--arrival-every": 1 << 10,
    "--max-steps": 1 << 24,
    "--rank": LIMITS["pcp_size"] - 1,
    # show's batch: a picture, not a workload
    "--scheduled": show.MAX_TOKENS,
    "--computed": 1 << 30,
    "--prompt": 1 << 30,
}
"""The largest value of each numeric flag, checked before anything is allocated: the trace
header's [`pcp_fn.sim.trace.LIMITS`][] for the config (a recorded trace must replay), the
simulator's own for the workload."""

MAX_WORKLOAD_TOKENS = 1 << 24
"""Most tokens the simulated requests may hold together, `--requests` times the longest
prompt plus the longest output (every request's tokens and KV blocks are kept in memory)."""


def _progress_bar(total: int, enabled: bool, desc: str) -> Any:
    """A bar over the workload's `total` requests, known before the first step (a bar over
    `--max-steps` counted to 10000 on a run of 386 steps), or None: no bar asked for, or
    tqdm (the cli extra) not installed."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the cli extra is not installed: run without a bar
        return None
    return tqdm(total=total, desc=desc, unit="req", leave=False, file=sys.stderr, disable=None)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each option that takes a value ends its help with its default,
    `(default: X)`, unless the help says it already (a default that is no plain value: all
    registered layouts, no figure)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # `is`: a default of 0 is a value to show (0 == False)
        none = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if "(default" in text or none or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (`pcp-fn compare: error: ...`), no usage block,
    and every default in its help (`_HelpFormatter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Python 3.11's argparse drops a value of "--" (--seed=--) and hands the flag [],
        # unchecked: the flag's own type names it instead
        if arg_strings == ["--"] and action.option_strings and action.nargs is None:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _integer(text: str) -> int:
    digits = text.strip().lstrip("+-")
    if digits.isdigit() and len(digits) > 30:  # never converted: no flag takes it (and int() caps at 4300)
        raise argparse.ArgumentTypeError(f"{len(digits)}-digit integer {text[:12]}... is out of range")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None


def _bounded(flag: str, lo: int) -> Callable[[str], int]:
    """An argparse type: an integer in `[lo, FLAG_LIMITS[flag]]`."""
    hi = FLAG_LIMITS[flag]

    def parse(text: str) -> int:
        value = _integer(text)
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        if value > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi} (the limit of {flag}), got {value}")
        return value

    return parse


def _non_negative(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _span(flag: str) -> Callable[[str], tuple[int, int]]:
    """An argparse type: `N` or `LO:HI` with `1 <= LO <= HI <= FLAG_LIMITS[flag]`."""
    limit = FLAG_LIMITS[flag]

    def parse(text: str) -> tuple[int, int]:
        parts = text.split(":")
        if len(parts) > 2:
            raise argparse.ArgumentTypeError(f"expected N or LO:HI, got {text[:40]!r}")
        try:
            lo, hi = (_integer(parts[0]), _integer(parts[-1]))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected N or LO:HI, got {text[:40]!r}") from None
        if lo < 1 or hi < lo:
            raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
        if hi > limit:
            raise argparse.ArgumentTypeError(f"must be <= {limit} (the limit of {flag}), got {text!r}")
        return lo, hi

    return parse


def _counts(flag: str, lo: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: comma-separated integers, each in `[lo, FLAG_LIMITS[flag]]`."""
    one = _bounded(flag, lo)

    def parse(text: str) -> tuple[int, ...]:
        parts = text.split(",")
        if len(parts) > FLAG_LIMITS[flag]:
            raise argparse.ArgumentTypeError(f"{len(parts)} values; at most {FLAG_LIMITS[flag]}")
        try:
            return tuple(one(part) for part in parts)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers ({e}), got {text[:40]!r}"
            ) from None

    return parse


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--pcp-size", "-P", type=_bounded("--pcp-size", 1), default=4, metavar="P", help="PCP ranks"
    )
    g.add_argument(
        "--requests", type=_bounded("--requests", 1), default=24, metavar="N", help="number of requests"
    )
    g.add_argument(
        "--prompt-len", type=_span("--prompt-len"), default="1:2000", metavar="N|LO:HI", help="prompt length"
    )
    g.add_argument(
        "--output-len",
        type=_span("--output-len"),
        default="1:32",
        metavar="N|LO:HI",
        help="tokens to generate",
    )
    g.add_argument(
        "--arrival-every",
        type=_bounded("--arrival-every", 0),
        default=2,
        metavar="N",
        help="mean steps between arrivals",
    )
    g.add_argument(
        "--max-num-reqs",
        type=_bounded("--max-num-reqs", 1),
        default=16,
        metavar="R",
        help="requests per step, R",
    )
    g.add_argument(
        "--max-num-tokens",
        type=_bounded("--max-num-tokens", 1),
        default=1024,
        metavar="T",
        help="token budget per step, T",
    )
    g.add_argument(
        "--spec-tokens",
        type=_bounded("--spec-tokens", 0),
        default=0,
        metavar="N",
        help="speculative tokens per decode",
    )
    g.add_argument("--seed", type=_non_negative, default=0, metavar="N", help="random seed")
    g.add_argument(
        "--max-steps",
        type=_bounded("--max-steps", 1),
        default=10_000,
        metavar="N",
        help="stop after this many steps (the run says so)",
    )


def _simulate_schedule(args: argparse.Namespace) -> tuple[PCPConfig, Runner]:
    lo, hi = args.prompt_len
    tokens = args.requests * (hi + args.output_len[1])
    if tokens > MAX_WORKLOAD_TOKENS:
        raise ValueError(
            f"--requests {args.requests} of up to --prompt-len {hi} + --output-len {args.output_len[1]} "
            f"tokens make {tokens} tokens; the simulator holds at most {MAX_WORKLOAD_TOKENS}"
        )
    config = PCPConfig(
        args.pcp_size, 0, args.max_num_reqs, args.max_num_tokens, num_spec_tokens=args.spec_tokens
    )
    try:  # the same limit as a trace's header: what is recorded replays
        check_gathered_rows(config)
    except ValueError as e:
        raise ValueError(
            f"--pcp-size {args.pcp_size}, --max-num-tokens {args.max_num_tokens}, --max-num-reqs "
            f"{args.max_num_reqs}: {e}"
        ) from None
    requests = synthetic_requests(
        args.requests,
        min_prompt=lo,
        max_prompt=hi,
        max_new_tokens=args.output_len,
        arrival_every=args.arrival_every,
        seed=args.seed,
    )
    runner = Runner(
        config,
        requests,
        seed=args.seed,
        max_model_len=hi + args.output_len[1] + 8,
        num_blocks=(hi + args.output_len[1] + 8) * args.requests,
    )
    return config, runner


def _schedule(args: argparse.Namespace, runner: Runner, desc: str) -> Iterator[StepRecord]:
    """The simulated steps, with a progress bar of the finished requests on long runs."""
    bar = _progress_bar(args.requests, not args.no_progress, desc)
    shown = 0
    try:
        for index in range(args.max_steps):
            if runner.scheduler.idle:
                return
            rec = runner.step()
            if bar is not None:
                done = len(runner.scheduler.done)
                bar.set_postfix_str(f"step {index + 1}", refresh=False)
                bar.update(done - shown)
                shown = done
            if rec is not None:
                yield rec
    finally:
        if bar is not None:
            bar.close()


def _cut_short(args: argparse.Namespace, runner: Runner) -> str:
    """`""` when the workload ran to its end, else a note that `--max-steps` cut it short."""
    left = len(runner.scheduler.pending) + len(runner.scheduler.running)
    if not left:
        return ""
    return f"stopped at --max-steps {args.max_steps} with {left} of {args.requests} requests unfinished"


def _check_restore(config: PCPConfig, outs, batch) -> None:
    """Every rank's local rows, encoded as (request, absolute position), must come back in order."""
    P, Lb = config.pcp_size, batch.bucket.num_tokens
    local = torch.full((P, Lb, 2), -1, dtype=torch.int64)
    for r, out in enumerate(outs):
        n = int(out.layout.num_tokens)
        local[r, :n, 0] = out.layout.request_index[:n]
        local[r, :n, 1] = out.positions[:n]
    lay = outs[0].layout
    restored = local.reshape(P * Lb, 2)[lay.restore_index]
    sched = batch.num_scheduled.tolist()
    comp = batch.num_computed.tolist()
    n_reqs = int(batch.num_reqs)
    rows = P * int(lay.num_tokens)
    # prefill rows through the unpad mask; decode rows are rank 0's copies (first n of each request)
    expected, got = [], []
    start = 0
    for i in range(n_reqs):
        n = sched[i]
        expected += [(i, comp[i] + j) for j in range(n)]
        padded = n * P if bool(lay.is_decode[i]) or P == 1 else (lay.num_pads[i].item() + n)
        got += [tuple(x) for x in restored[start : start + n].tolist()]
        start += padded
    if start != rows or got != expected:
        raise AssertionError("restore did not put every token back")


def cmd_simulate(args: argparse.Namespace) -> int:
    if not args.no_compile or args.backend != DEFAULT_BACKEND:
        _check_backend(args.backend)
    config, runner = _simulate_schedule(args)
    P = config.pcp_size
    # every rank's state carries its rank as data: one batch (and one graph per bucket) serves all
    states = [init_state(config, rank=r) for r in range(P)]
    rows, eager_us, buckets = [], [], {}
    for rec in _schedule(args, runner, "simulate"):
        s = rec.sched
        batch = make_batch(
            config, s.num_scheduled, s.num_computed, s.num_prompt, slot_mapping=rec.slot_mapping
        )
        outs = []
        t0 = time.perf_counter()
        for r in range(P):
            states[r], out = step(states[r], batch)
            outs.append(out)
        eager_us.append((time.perf_counter() - t0) * 1e6 / P)
        _check_restore(config, outs, batch)
        buckets.setdefault(batch.bucket, []).append((states[0], batch))
        rows.append(_step_row(P, s, batch, outs))
    if not rows:
        raise ValueError(f"no step was scheduled in --max-steps {args.max_steps} steps (no request arrived)")
    if not args.quiet:
        _print_steps(rows)
    _print_summary(args, P, rows, eager_us)
    note = _cut_short(args, runner)
    if note:
        print(f"  note: {note}")
    if not args.no_compile:
        _time_busiest_bucket(args, buckets)
    return 0


def _step_row(P: int, s: ScheduledStep, batch: SchedulerBatch, outs: list[StepOutputs]) -> dict:
    """One simulated step's line of the table: its requests, tokens, local rows and bucket, the
    pad and replicated rows, and every rank's attention work."""
    n = int(outs[0].layout.num_tokens)
    # attention work of a rank: keys its real query rows see (causal: absolute position + 1)
    work = []
    for out in outs:
        m = out.layout.positions[:n] < torch.as_tensor(s.num_scheduled)[out.layout.request_index[:n]]
        work.append(int(((out.positions[:n] + 1) * m).sum()))
    n_dec = int(outs[0].layout.num_decode_reqs)
    dec_tokens = int(outs[0].layout.num_decode_tokens)
    return dict(
        step=s.index,
        dec=n_dec,
        pre=len(s.req_ids) - n_dec,
        tokens=s.num_tokens,
        local=n,
        bucket=f"{batch.bucket.num_reqs}x{batch.bucket.num_tokens}",
        replicas=(P - 1) * dec_tokens,
        pad=P * n - s.num_tokens - (P - 1) * dec_tokens,
        work=work,
    )


def _print_steps(rows: list[dict]) -> None:
    """The per-step table."""
    print(
        f"{'step':>5} {'dec':>4} {'pre':>4} {'tokens':>7} {'local/rank':>10} {'bucket':>10} "
        f"{'pad rows':>8} {'attn work min..max':>20}  restore"
    )
    for row in rows:
        print(
            f"{row['step']:>5} {row['dec']:>4} {row['pre']:>4} {row['tokens']:>7} {row['local']:>10} "
            f"{row['bucket']:>10} {row['pad']:>8} {min(row['work']):>9}..{max(row['work']):<9}  ok"
        )


def _print_summary(args: argparse.Namespace, P: int, rows: list[dict], eager_us: list[float]) -> None:
    """Totals over the run: tokens per rank, padding and replication, attention balance, step time."""
    total_tokens = sum(r["tokens"] for r in rows)
    total_local = sum(r["local"] for r in rows)
    work = np.array([r["work"] for r in rows]).sum(0)
    print(f"\nsummary: P={P}, {len(rows)} steps, {args.requests} requests, {total_tokens} scheduled tokens")
    share = total_local / max(total_tokens, 1)
    print(f"  tokens per rank:        {total_local} (every rank; {share:.3f} of the batch)")
    pad = sum(r["pad"] for r in rows)
    replicas = sum(r["replicas"] for r in rows)
    pad_pct = 100 * pad / max(total_tokens, 1)
    print(
        f"  padding overhead:       {pad} prefill pad rows ({pad_pct:.1f}% of the real tokens), "
        f"plus {replicas} replicated decode rows"
    )
    print(
        f"  attention work per rank: {', '.join(str(int(w)) for w in work)} keys "
        f"(max/min = {work.max() / max(work.min(), 1):.3f})"
    )
    print(f"  restore check:          every token of every step came back in order on all {P} ranks")
    print(f"  step time, eager:       median {statistics.median(eager_us):.0f} us per rank")


def _time_busiest_bucket(
    args: argparse.Namespace, buckets: dict[Bucket, list[tuple[PCPState, SchedulerBatch]]]
) -> None:
    """Eager and compiled (`fullgraph=True`, `args.backend`) step time on the steps of the
    bucket most steps used."""
    bucket, samples = max(buckets.items(), key=lambda kv: len(kv[1]))
    compiled = torch.compile(step, fullgraph=True, dynamic=False, backend=args.backend)
    print(
        f"  compiling the busiest bucket {bucket.num_reqs}x{bucket.num_tokens} ({args.backend}) ...",
        flush=True,
    )
    compiled(*samples[0])
    calls = samples * max(1, 50 // len(samples))
    times = _call_times_us(compiled, calls)
    eager_b = _call_times_us(step, calls)
    name = f"{bucket.num_reqs}x{bucket.num_tokens}"
    print(
        f"  step time, bucket {name}: eager {statistics.median(eager_b):.0f} us, "
        f"compiled {statistics.median(times):.0f} us (median, {len(times)} calls)"
    )


def _call_times_us(fn: Callable[..., object], calls: list[tuple]) -> list[float]:
    """Wall time of `fn(*args)` for each `args` of `calls`, in microseconds."""
    times = []
    for args_ in calls:
        t0 = time.perf_counter()
        fn(*args_)
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def cmd_record(args: argparse.Namespace) -> int:
    if os.path.isdir(args.out):
        raise IsADirectoryError(f"{args.out} is a directory")
    if os.path.lexists(args.out) and not args.force:
        raise FileExistsError(f"{args.out} exists; pass --force to overwrite it")
    check_output_path(args.out)  # its folder, before the simulation
    config, runner = _simulate_schedule(args)
    steps = (
        TraceStep(r.sched.num_scheduled, r.sched.num_computed, r.sched.num_prompt, tuple(r.slot_mapping))
        for r in _schedule(args, runner, "record")
    )
    try:
        count = write_trace(args.out, config, steps, overwrite=args.force)
    except FileExistsError:
        raise FileExistsError(f"{args.out} appeared while recording; pass --force to overwrite it") from None
    note = _cut_short(args, runner)
    print(f"wrote {count} steps to {args.out}" + (f" ({note})" if note else ""))
    return 0


def _check_backend(name: str) -> None:
    """`ValueError` unless `name` is a `torch.compile` backend (before anything runs)."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend

    try:
        lookup_backend(name)
    except torch._dynamo.exc.InvalidBackend:
        known = ", ".join(["eager", "aot_eager", *torch._dynamo.list_backends()])
        raise ValueError(
            f"--backend {name!r} is not a torch.compile backend (known: {known}; all of them: "
            "torch._dynamo.list_backends(exclude_tags=()))"
        ) from None


def cmd_replay(args: argparse.Namespace) -> int:
    if args.mode != "eager" or args.backend != DEFAULT_BACKEND:
        _check_backend(args.backend)
    ranks = None if args.rank is None else [args.rank]
    # the digest alone, one step in memory at a time: a long trace replays in bounded memory
    result = replay_digest(args.trace, mode=args.mode, ranks=ranks, backend=args.backend)
    recorded = ""
    if result.engine is not None:  # an engine's recording: replayed through the drop-in's layout
        e = result.engine
        recorded = f"; recorded by {e.name} {e.version}'s {e.manager}, replayed through {result.through}"
    print(f"{result.digest}  {args.trace} ({result.num_steps} steps, mode {args.mode}{recorded})")
    if args.expect is not None and result.digest != args.expect:
        print(f"pcp-fn replay: digest mismatch: expected {args.expect}, got {result.digest}", file=sys.stderr)
        return 1
    if args.against is not None:
        return _replay_against(args, ranks)
    return 0


def _replay_against(args: argparse.Namespace, ranks: list[int] | None) -> int:
    """`--against vllm` / `--against vllm-ascend`: the trace's steps through the engine's own manager
    (vLLM's `PCPManager`, vllm-ascend's `AscendPCPManager`) and the drop-in; the first step, rank and
    field where they differ (exit status 1), or none."""
    if args.against == "vllm-ascend":
        try:
            found = compare_with_vllm_ascend(args.trace, ranks=ranks)
        except ImportError as e:
            raise ValueError(f"--against vllm-ascend needs vllm-ascend 0.30.0rc2 importable: {e}") from None
        who = f"vllm-ascend {found.version}'s AscendPCPManager"
        where = f"{found.steps} steps x {len(found.ranks)} ranks, {len(found.fields)} fields"
    else:
        try:
            found = compare_with_vllm(args.trace, ranks=ranks)
        except ImportError as e:
            raise ValueError(f"--against vllm needs vLLM 0.32, 0.33 or 0.34 importable: {e}") from None
        who = f"vLLM {found.version}'s PCPManager"
        where = (
            f"{found.steps} steps x {len(found.ranks)} ranks, {len(found.fields)} fields of partition_batch"
        )
        if found.fields == SPLIT_FIELDS:  # another split: compared on what it must keep
            where = f"{found.steps} steps x {len(found.ranks)} ranks, {', '.join(SPLIT_FIELDS[1:])}"
    if found.difference is None:
        print(f"against {who}: no difference ({where})")
        return 0
    print(f"pcp-fn replay: against {who}: {found.difference}", file=sys.stderr)
    return 1


def _load_layouts(paths: Sequence[str]) -> None:
    """Run each Python file once, as a module of its own: its layouts register themselves.

    The module's name is new (`pcp_fn_load_<n>_<stem>`), never one already imported (a
    `json.py`, a second `mylayout.py` from another folder), and it stays in
    `sys.modules` (torch.compile reads a layout's source through its module). A file that
    fails, exits, or registers no new layout is an error naming it."""
    seen: set[str] = set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:  # the same file twice: it has registered its layouts already
            continue
        seen.add(real)
        try:
            with open(path, "rb"):  # missing, a folder, unreadable: named with the flag
                pass
        except OSError as e:
            raise type(e)(e.errno, e.strerror, f"--load {path}") from None
        stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        name = f"pcp_fn_load_{len(seen)}_{stem}"
        while name in sys.modules:
            name += "_"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"--load {path}: not a Python file (.py)")
        before = set(available_layouts())
        _exec_layout_file(path, name, spec)
        if not set(available_layouts()) - before:
            del sys.modules[name]
            raise ValueError(
                f"--load {path}: registered no new layout (it must call pcp_fn.register_layout "
                f"with a name not registered yet; registered: {sorted(before)})"
            )


def _exec_layout_file(path: str, name: str, spec: importlib.machinery.ModuleSpec) -> None:
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]  # checked by the caller
    except SyntaxError as e:
        del sys.modules[name]
        where = "" if e.lineno is None else f"line {e.lineno}: "
        raise ValueError(f"--load {path}: {where}SyntaxError: {e.msg}") from None
    except SystemExit as e:  # the file's own sys.exit must not end the command with its status
        del sys.modules[name]
        raise ValueError(f"--load {path}: the file called sys.exit({e.code!r})") from None
    except Exception as e:
        del sys.modules[name]
        raise ValueError(f"--load {path}: {type(e).__name__}: {e}") from None


def _layout_names(text: str | None) -> list[str] | None:
    """`--layouts`' names (None: every registered layout); an empty or repeated name is an error."""
    if text is None:
        return None
    names = text.split(",")
    if "" in names:
        raise ValueError(f"--layouts {text!r}: an empty layout name")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--layouts {text!r}: {repeated[0]!r} is named twice")
    return names


def _compare_workload(args: argparse.Namespace) -> tuple[PCPConfig, list[TraceStep], str]:
    """The config, steps and description of `compare`'s workload: the trace, or a simulation."""
    if args.trace is not None:
        with stream_trace(args.trace) as (cfg, trace_steps):
            # the costs read the counts (and an engine's prefill flags, to put its decodes first)
            # only: a step's slot mapping is not kept
            steps = [
                TraceStep(s.num_scheduled, s.num_computed, s.num_prompt, is_prefilling=s.is_prefilling)
                for s in trace_steps
            ]
        return cfg, steps, f"{args.trace} ({len(steps)} steps)"
    cfg, runner = _simulate_schedule(args)
    steps = [
        TraceStep(r.sched.num_scheduled, r.sched.num_computed, r.sched.num_prompt)
        for r in _schedule(args, runner, "schedule")
    ]
    note = _cut_short(args, runner)
    source = f"{args.requests} requests, {len(steps)} steps, seed {args.seed}" + (f"; {note}" if note else "")
    return cfg, steps, f"a simulated workload ({source})"


def _compare_outputs(args: argparse.Namespace) -> None:
    """Before any work: the figure's and the tables' paths (folder, format, matplotlib), none
    of them the trace or each other."""
    if args.plot:
        check_plot_path(args.plot)
    for flag, path in (("--csv", args.csv), ("--json", args.json)):
        if path:
            check_output_path(path, flag)
    check_distinct([("TRACE", args.trace), ("--plot", args.plot), ("--csv", args.csv), ("--json", args.json)])


def cmd_compare(args: argparse.Namespace) -> int:
    _compare_outputs(args)
    names = _layout_names(args.layouts)
    _load_layouts(args.load)
    cfg, steps, source = _compare_workload(args)
    lo, hi = args.pcp_sizes
    # every layout under the workload's config (spec tokens, DCP, PD recompute...); a layout
    # that refuses it, at some P or all, is listed after the table, never costed otherwise
    costs, refused = compare_config(
        steps, available_layouts() if names is None else names, range(lo, hi + 1), cfg
    )
    if not costs:
        raise ValueError(f"no layout serves the workload's config: {'; '.join(format_refusals(refused))}")
    print(describe(source, cfg))
    print(format_table(costs))
    for line in format_refusals(refused):
        print(f"not costed: {line}")
    if args.plot:
        compare.plot(costs, args.plot, caption=describe(source, cfg))
        print(f"wrote {args.plot}")
    if args.csv:
        compare.write_csv(costs, args.csv)
        print(f"wrote {args.csv}")
    if args.json:
        compare.write_json(costs, refused, source, cfg, args.json)
        print(f"wrote {args.json}")
    return 0


def _show_batch(args: argparse.Namespace) -> tuple[tuple[int, ...], ...]:
    """`show`'s batch: the flags given, the README's batch for those not given (with the
    default `--scheduled`), else no tokens computed and prompts that the chunk ends."""
    readme_scheduled, readme_computed, readme_prompt = show.README_BATCH
    scheduled = readme_scheduled if args.scheduled is None else args.scheduled
    computed = args.computed
    if computed is None:
        computed = readme_computed if args.scheduled is None else (0,) * len(scheduled)
    prompt = args.prompt
    if prompt is None and args.scheduled is None and args.computed is None:
        prompt = readme_prompt
    elif prompt is None:
        prompt = tuple(k + n for k, n in zip(computed, scheduled))
    show.check_batch_counts(scheduled, computed, prompt)
    return scheduled, computed, prompt


def cmd_show(args: argparse.Namespace) -> int:
    if args.plot:
        check_plot_path(args.plot)  # before any work: the folder, the format, matplotlib
    _load_layouts(args.load)
    if args.layout not in available_layouts():
        raise ValueError(
            f"--layout {args.layout!r}: unknown layout; registered: {sorted(available_layouts())}"
        )
    scheduled, computed, prompt = _show_batch(args)
    where = f"layout {args.layout!r} at P={args.pcp_size}"
    try:
        own = show.ownership(args.layout, args.pcp_size, scheduled, computed, prompt, args.spec_tokens)
    except ValueError as e:  # the config or the batch refused: make_batch's, the layout's words
        raise ValueError(f"{where}: {e}") from None
    except Exception as e:  # a researcher's layout code: name it, keep the cause
        raise LayoutFailed(f"{where} failed: {type(e).__name__}: {e}") from e
    print(show.format_ownership(own))
    if args.plot:
        show.plot(own, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _digest(text: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise argparse.ArgumentTypeError(f"expected a SHA-256 digest (64 hex digits), got {text!r}")
    return text.lower()


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pcp-fn", description=__doc__)
    p.add_argument("--version", action="version", version=f"pcp_fn {__version__}")
    # each subparser a _Parser too: one-line errors, every default in its help
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_simulate(sub)
    _add_record(sub)
    _add_replay(sub)
    _add_compare(sub)
    _add_show(sub)
    return p


def _add_simulate(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser(
        "simulate",
        help="run a synthetic workload on every rank and check it",
        description="Run a synthetic scheduler (arrivals, chunked prefill, decodes) through\n"
        "pcp_fn.step on every rank, check that restore puts every token back, and print a\n"
        "per-step table and a summary.",
    )
    _add_workload_flags(sim)
    sim.add_argument("--quiet", action="store_true", help="summary only, no per-step table")
    sim.add_argument("--no-compile", action="store_true", help="skip the compiled timing (saves the compile)")
    sim.add_argument(
        "--backend",
        default=DEFAULT_BACKEND,
        metavar="NAME",
        help="torch.compile backend of the compiled timing",
    )
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim.set_defaults(func=cmd_simulate)


def _add_record(sub: argparse._SubParsersAction) -> None:
    rec = sub.add_parser(
        "record",
        help="write a simulated schedule as a trace (JSON Lines)",
        description="Simulate like pcp-fn simulate and write the schedule as a trace (OUT is\n"
        "checked before the simulation; never overwritten without --force).",
    )
    rec.add_argument("out", metavar="OUT", help="trace file to write")
    rec.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    _add_workload_flags(rec)
    rec.add_argument("--no-progress", action="store_true", help="no progress bar")
    rec.set_defaults(func=cmd_record)


def _add_replay(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser(
        "replay",
        help="replay a trace through the pure step and print its digest",
        description="Replay a trace on every rank (or one) and print the SHA-256 digest of all\n"
        "outputs; equal digests mean bit-identical outputs.",
    )
    rep.add_argument("trace", metavar="TRACE", help="trace file (JSON Lines)")
    rep.add_argument(
        "--mode", choices=["eager", "compiled", "captured"], default="eager", help="how to run the step"
    )
    rep.add_argument(
        "--backend",
        default=DEFAULT_BACKEND,
        metavar="NAME",
        help="torch.compile backend for compiled/captured",
    )
    rep.add_argument(
        "--rank",
        type=_bounded("--rank", 0),
        default=None,
        metavar="R",
        help="replay one rank only (default: all)",
    )
    rep.add_argument(
        "--expect",
        type=_digest,
        default=None,
        metavar="DIGEST",
        help="exit with status 1 unless the digest is DIGEST (default: no check)",
    )
    rep.add_argument(
        "--against",
        choices=["vllm", "vllm-ascend"],
        default=None,
        help="also run the installed engine's own manager (vLLM's PCPManager, vllm-ascend 0.30's "
        "AscendPCPManager) and the drop-in on a recorded engine trace's steps, and name the first step "
        "and field where they differ (exit status 1) (default: not run)",
    )
    rep.set_defaults(func=cmd_replay)


def _add_compare(sub: argparse._SubParsersAction) -> None:
    cmp_ = sub.add_parser(
        "compare",
        help="compare the layouts' per-rank tokens, work, padding and gathered rows",
        description="For a trace (or a simulated workload), every layout's per-rank tokens,\n"
        "causal attention work (key-query pairs), padding rows and gathered rows at each P,\n"
        "summed over the steps, as a table (and a figure with --plot, CSV with --csv, JSON\n"
        "with --json; their paths are checked before any work).",
    )
    cmp_.add_argument(
        "trace", nargs="?", default=None, metavar="TRACE", help="trace file (default: simulate a workload)"
    )
    cmp_.add_argument(
        "--layouts",
        default=None,
        metavar="A,B",
        help="comma-separated layout names (default: all registered)",
    )
    cmp_.add_argument(
        "--pcp-sizes", type=_span("--pcp-sizes"), default="2:8", metavar="N|LO:HI", help="the P values"
    )
    cmp_.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="also draw the table against P, in the format of FILE's extension (.png, .svg...; "
        "needs matplotlib) (default: no figure)",
    )
    cmp_.add_argument(
        "--csv", default=None, metavar="FILE", help="also write the table as CSV (default: none)"
    )
    cmp_.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="also write the table as JSON, per-rank values and refusals included (default: none)",
    )
    _add_load(cmp_)
    _add_workload_flags(cmp_)
    cmp_.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmp_.set_defaults(func=cmd_compare)


def _add_load(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="FILE",
        help="a Python file registering layouts; repeatable (default: none)",
    )


def _add_show(sub: argparse._SubParsersAction) -> None:
    sh = sub.add_parser(
        "show",
        help="draw which rank holds which token of one batch, under any layout",
        description="Draw one batch under a layout, read off every rank's pcp_fn.step and the\n"
        "restore: per request its gathered rows in the restored (padded) order, the rank\n"
        "each chunk is read from, each rank's local tokens and positions, then the restored\n"
        "order and the logits rows. The defaults draw the README's picture: DualChunkSwap at\n"
        "P=2, scheduled 1,5,8, request 0 a decode.",
    )
    sh.add_argument("--layout", default="dcs", metavar="NAME", help="a registered layout (see --load)")
    _add_load(sh)
    sh.add_argument(
        "--pcp-size", "-P", type=_bounded("--pcp-size", 1), default=2, metavar="P", help="PCP ranks"
    )
    sh.add_argument(
        "--scheduled",
        type=_counts("--scheduled", 1),
        default=None,
        metavar="N,N,...",
        help="tokens scheduled per request, decodes first (default: 1,5,8)",
    )
    sh.add_argument(
        "--computed",
        type=_counts("--computed", 0),
        default=None,
        metavar="K,K,...",
        help="tokens already computed per request (default: 3,0,0 with the default --scheduled, else 0 each)",
    )
    sh.add_argument(
        "--prompt",
        type=_counts("--prompt", 1),
        default=None,
        metavar="N,N,...",
        help="prompt tokens per request; a request that has computed them all is a decode (default: "
        "3,5,8 with the default --scheduled and --computed, else computed + scheduled: prefills "
        "ending their prompt)",
    )
    sh.add_argument(
        "--spec-tokens",
        type=_bounded("--spec-tokens", 0),
        default=0,
        metavar="N",
        help="speculative tokens per decode",
    )
    sh.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="also draw it as a figure, in the format of FILE's extension (needs matplotlib) "
        "(default: no figure)",
    )
    sh.set_defaults(func=cmd_show)


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        return args.func(args)
    except (TraceError, ValueError, OSError, LayoutFailed) as e:
        print(f"pcp-fn {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pcp-fn {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"pcp-fn {args.command}: terminated", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return " ".join(str(e).split())


if __name__ == "__main__":
    sys.exit(main())
