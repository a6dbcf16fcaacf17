"""``pcp-fn``: simulate PCP scheduling, record traces, replay them, compare layouts.

pcp-fn simulate                          # a synthetic workload at P=4, every rank, checked
pcp-fn record trace.jsonl [--force]      # the same, written as a trace (never overwrites unless told)
pcp-fn replay trace.jsonl [--expect D]   # replay through the pure step; prints the SHA-256 digest
pcp-fn compare trace.jsonl --plot a.png  # every layout's per-rank cost at P = 2..8 (trace optional)

Exit status: 0 on success, 1 when ``replay --expect`` meets another digest, 2 on bad input
(a malformed trace, a bad flag, a file that cannot be read or written: one line on stderr, no
traceback), 130 / 143 when interrupted (SIGINT / SIGTERM; ``record`` leaves no file behind).
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
from collections.abc import Callable, Sequence

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
from .compare import compare_layouts, format_table, plot, serving_layouts
from .engine import Runner, ScheduledStep, synthetic_requests
from .trace import Terminated, TraceError, TraceStep, read_trace, replay, write_trace


def _progress(iterable, total: int, enabled: bool, desc: str):
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:  # the cli extra is not installed: run without a bar
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit="step", leave=False, file=sys.stderr, disable=None)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(":")) if ":" in text else (int(text), int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or LO:HI, got {text!r}") from None
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return lo, hi


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--pcp-size", "-P", type=_positive, default=4, help="PCP ranks (default 4)")
    g.add_argument("--requests", type=_positive, default=24, help="number of requests (default 24)")
    g.add_argument(
        "--prompt-len", type=_range, default=(1, 2000), help="prompt length N or LO:HI (default 1:2000)"
    )
    g.add_argument(
        "--output-len", type=_range, default=(1, 32), help="tokens to generate, N or LO:HI (default 1:32)"
    )
    g.add_argument(
        "--arrival-every", type=_non_negative, default=2, help="mean steps between arrivals (default 2)"
    )
    g.add_argument("--max-num-reqs", type=_positive, default=16, help="requests per step, R (default 16)")
    g.add_argument(
        "--max-num-tokens", type=_positive, default=1024, help="token budget per step, T (default 1024)"
    )
    g.add_argument(
        "--spec-tokens", type=_non_negative, default=0, help="speculative tokens per decode (default 0)"
    )
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--max-steps", type=_positive, default=10_000, help="stop after this many steps")


def _simulate_schedule(args: argparse.Namespace):
    lo, hi = args.prompt_len
    config = PCPConfig(
        args.pcp_size, 0, args.max_num_reqs, args.max_num_tokens, num_spec_tokens=args.spec_tokens
    )
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


def _schedule(args: argparse.Namespace, runner: Runner, desc: str):
    """The simulated steps, with a progress bar on long runs."""
    for _ in _progress(range(args.max_steps), args.max_steps, not args.no_progress, desc):
        if runner.scheduler.idle:
            return
        rec = runner.step()
        if rec is not None:
            yield rec


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
        print("no steps were scheduled")
        return 1
    if not args.quiet:
        _print_steps(rows)
    _print_summary(args, P, rows, eager_us)
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
    """Eager and compiled (``fullgraph=True``, ``args.backend``) step time on the steps of the
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
    """Wall time of ``fn(*args)`` for each ``args`` of ``calls``, in microseconds."""
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
    config, runner = _simulate_schedule(args)
    steps = (
        TraceStep(r.sched.num_scheduled, r.sched.num_computed, r.sched.num_prompt, tuple(r.slot_mapping))
        for r in _schedule(args, runner, "record")
    )
    try:
        count = write_trace(args.out, config, steps, overwrite=args.force)
    except FileExistsError:
        raise FileExistsError(f"{args.out} appeared while recording; pass --force to overwrite it") from None
    print(f"wrote {count} steps to {args.out}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    ranks = None if args.rank is None else [args.rank]
    result = replay(args.trace, mode=args.mode, ranks=ranks, backend=args.backend)
    print(f"{result.digest}  {args.trace} ({len(result.outputs)} steps, mode {args.mode})")
    if args.expect is not None and result.digest != args.expect:
        print(f"pcp-fn replay: digest mismatch: expected {args.expect}, got {result.digest}", file=sys.stderr)
        return 1
    return 0


def _load_layouts(paths: Sequence[str]) -> None:
    """Run each Python file once (as a module named after it): its layouts register themselves."""
    for path in paths:
        name = os.path.splitext(os.path.basename(path))[0]
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"--load {path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # by name: torch.compile reads a layout's source through its module
        spec.loader.exec_module(module)


def cmd_compare(args: argparse.Namespace) -> int:
    _load_layouts(args.load)
    if args.trace is not None:
        trace = read_trace(args.trace)
        cfg, steps = trace.config, list(trace.steps)
        source = f"{args.trace} ({len(steps)} steps)"
    else:
        cfg, runner = _simulate_schedule(args)
        steps = [
            TraceStep(r.sched.num_scheduled, r.sched.num_computed, r.sched.num_prompt)
            for r in _schedule(args, runner, "schedule")
        ]
        source = f"a simulated workload ({args.requests} requests, {len(steps)} steps, seed {args.seed})"
    if args.layouts:
        layouts = args.layouts.split(",")
    else:  # every registered layout that serves the workload's config
        layouts = serving_layouts(
            available_layouts(), cfg.max_num_reqs, cfg.max_num_tokens, cfg.num_spec_tokens
        )
    lo, hi = args.pcp_sizes
    costs = compare_layouts(
        steps, layouts, range(lo, hi + 1), cfg.max_num_reqs, cfg.max_num_tokens, cfg.num_spec_tokens
    )
    print(f"layouts on {source}, R={cfg.max_num_reqs}, T={cfg.max_num_tokens}; summed over the steps")
    print(format_table(costs))
    if args.plot:
        plot(costs, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _digest(text: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise argparse.ArgumentTypeError(f"expected a SHA-256 digest (64 hex digits), got {text!r}")
    return text.lower()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pcp-fn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"pcp_fn {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "simulate",
        help="run a synthetic workload on every rank and check it",
        description="Run a synthetic scheduler (arrivals, chunked prefill, decodes) through "
        "pcp_fn.step on every rank, check that restore puts every token back, and print a "
        "per-step table and a summary.",
    )
    _add_workload_flags(sim)
    sim.add_argument("--quiet", action="store_true", help="summary only, no per-step table")
    sim.add_argument("--no-compile", action="store_true", help="skip the compiled timing (saves the compile)")
    sim.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled timing")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim.set_defaults(func=cmd_simulate)

    rec = sub.add_parser(
        "record",
        help="write a simulated schedule as a trace (JSON Lines)",
        description="Simulate like `simulate` and write the schedule as a trace.",
    )
    rec.add_argument("out", help="trace file to write")
    rec.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    _add_workload_flags(rec)
    rec.add_argument("--no-progress", action="store_true", help="no progress bar")
    rec.set_defaults(func=cmd_record)

    rep = sub.add_parser(
        "replay",
        help="replay a trace through the pure step and print its digest",
        description="Replay a trace on every rank (or one) and print the SHA-256 digest of all "
        "outputs; equal digests mean bit-identical outputs.",
    )
    rep.add_argument("trace", help="trace file (JSON Lines)")
    rep.add_argument(
        "--mode",
        choices=["eager", "compiled", "captured"],
        default="eager",
        help="how to run the step (default eager)",
    )
    rep.add_argument("--backend", default="inductor", help="torch.compile backend for compiled/captured")
    rep.add_argument("--rank", type=_non_negative, default=None, help="replay one rank only (default: all)")
    rep.add_argument(
        "--expect",
        type=_digest,
        default=None,
        metavar="DIGEST",
        help="exit with status 1 unless the digest is DIGEST",
    )
    rep.set_defaults(func=cmd_replay)

    cmp_ = sub.add_parser(
        "compare",
        help="compare the layouts' per-rank tokens, work, padding and gathered rows",
        description="For a trace (or a simulated workload), every layout's per-rank tokens, causal "
        "attention work (key-query pairs), padding rows and gathered rows at each P, summed over "
        "the steps, as a table (and a figure with --plot).",
    )
    cmp_.add_argument("trace", nargs="?", default=None, help="trace file (default: simulate a workload)")
    cmp_.add_argument(
        "--layouts", default=None, help="comma-separated layout names (default: all registered)"
    )
    cmp_.add_argument("--pcp-sizes", type=_range, default=(2, 8), help="P values, N or LO:HI (default 2:8)")
    cmp_.add_argument("--plot", default=None, metavar="PNG", help="also write a figure (needs matplotlib)")
    cmp_.add_argument(
        "--load", action="append", default=[], metavar="FILE", help="a Python file registering layouts"
    )
    _add_workload_flags(cmp_)
    cmp_.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmp_.set_defaults(func=cmd_compare)
    return p


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
    except (TraceError, ValueError, OSError) as e:
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
