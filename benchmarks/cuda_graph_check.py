"""The device check for graph capture: capture ``pcp_fn.step`` in a CUDA (or NPU) graph and replay.

    python benchmarks/cuda_graph_check.py [--device cuda] [--batches 100]

R=256, T=8192, P=4, rank 0. Builds ``--batches`` random mixed batches (decodes,
fresh and chunked prefills), all in the capacity bucket, captures the step once
under ``set_sync_debug_mode("error")``, replays every batch, checks each
replay against eager bit for bit, and prints the median replay and eager
microseconds (device-synchronised). Then the same per natural bucket, with
graphs captured on first use. Exits non-zero on any mismatch or sync.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.utils._pytree as pytree

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pcp_fn
from pcp_fn.core.entry import entry_op

R, T, P = 256, 8192, 4


def random_batch(cfg, rng, device, bucket=None):
    n_dec = int(rng.integers(0, 200))
    sched = [int(x) for x in rng.integers(1, 2, n_dec)]
    comp = [int(x) for x in rng.integers(1, 4000, n_dec)]
    prompt = [int(rng.integers(0, c + 1)) for c in comp]
    budget = T - sum(sched)
    for _ in range(int(rng.integers(0 if n_dec else 1, 8))):
        if budget < 1 or len(sched) >= R:
            break
        n = int(rng.integers(1, max(2, budget // 2)))
        budget -= n
        chunked = bool(rng.integers(0, 2))
        c = int(rng.integers(1, 3000)) if chunked else 0
        sched.append(n)
        comp.append(c)
        prompt.append(c + n + (1 if chunked else 0))
    slots = np.arange(sum(sched), dtype=np.int64)  # scheduler-order KV slots, padded by make_batch
    return pcp_fn.make_batch(cfg, sched, comp, prompt, device, bucket=bucket, slot_mapping=slots)


@entry_op
def full_step(state, batch):
    """The step a runner captures: ``step`` (layout, logits, slots, restore index) and the
    attention index metadata of the same batch."""
    state, out = pcp_fn.step(state, batch)
    _, meta = pcp_fn.attention_metadata(state, batch)
    return state, out, meta


def replay_kernels(fn, device):
    """CUDA kernels the profiler sees in one call of ``fn`` (a graph replay: its kernels and the
    copies into its static inputs), or ``None`` where the profiler cannot tell."""
    if device.type != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as e:  # a profiler that cannot trace graphs here: say so, do not fail the check
        print(f"  (profiler: {type(e).__name__}: {e})")
        return None


def timed(fn, device, iters=1):
    sync = torch.cuda.synchronize if device.type == "cuda" else getattr(torch, device.type).synchronize
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        out = fn()
    sync()
    return out, (time.perf_counter() - t0) * 1e6 / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=int, default=100)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "npu":
        import torch_npu  # noqa: F401
    cfg = pcp_fn.PCPConfig(P, 0, R, T)
    state = pcp_fn.init_state(cfg, device)
    rng = np.random.default_rng(0)
    batches = [random_batch(cfg, rng, device, bucket=cfg.capacity) for _ in range(args.batches)]
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    captured = pcp_fn.graph.capture(pcp_fn.step, state, batches[0])
    replay_us, eager_us, mismatches = [], [], 0
    for b in batches:
        got, us = timed(lambda b=b: captured(state, b), device)
        got = pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, got)
        replay_us.append(us)
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
        ref, us = timed(lambda b=b: pcp_fn.step(state, b), device)
        eager_us.append(us)
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        same = all(
            (x is None and y is None) or torch.equal(x, y)
            for x, y in zip(pytree.tree_leaves(got), pytree.tree_leaves(ref))
        )
        mismatches += not same
    print(f"capacity bucket {cfg.capacity}: {len(batches)} batches, {mismatches} mismatches")
    replay_med, eager_med = statistics.median(replay_us), statistics.median(eager_us)
    print(f"  replay median {replay_med:.1f} us, eager median {eager_med:.1f} us")
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode(0)
    kernels = pcp_fn.graph.count_kernels(pcp_fn.step, state, batches[0])
    seen = replay_kernels(lambda: captured(state, batches[0]), device)
    print(f"  step: {kernels} kernel-launching aten ops per call; profiler, one replay: {seen} CUDA events")
    whole = pcp_fn.graph.capture(full_step, state, batches[0])
    whole_us = [timed(lambda b=b: whole(state, b), device)[1] for b in batches]
    kernels = pcp_fn.graph.count_kernels(full_step, state, batches[0])
    seen = replay_kernels(lambda: whole(state, batches[0]), device)
    print(
        f"  step + attention_metadata: replay median {statistics.median(whole_us):.1f} us, "
        f"{kernels} kernel-launching aten ops per call; profiler, one replay: {seen} CUDA events"
    )
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")

    natural = [random_batch(cfg, rng, device) for _ in range(args.batches)]
    lazily = pcp_fn.graph.Captured(pcp_fn.step)
    per_bucket: dict = {}
    for b in natural:
        lazily(state, b)  # first use captures
        got, us = timed(lambda b=b: lazily(state, b), device)
        per_bucket.setdefault(b.bucket, []).append(us)
        ref = pcp_fn.step(state, b)
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
        same = all(
            (x is None and y is None) or torch.equal(x, y)
            for x, y in zip(pytree.tree_leaves(got), pytree.tree_leaves(ref))
        )
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        mismatches += not same
    for bucket, us in sorted(per_bucket.items(), key=lambda kv: (kv[0].num_reqs, kv[0].num_tokens)):
        name = f"{bucket.num_reqs}x{bucket.num_tokens}"
        print(f"  bucket {name}: {len(us)} replays, median {statistics.median(us):.1f} us")
    print(f"{len(lazily)} graphs captured on first use; total mismatches {mismatches}")
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode(0)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
