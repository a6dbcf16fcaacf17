"""MRV2 layout timings and kernel counts on the reference batches (docs/performance.md): the host boundary
``make_batch``, ``build_layout``, ``partition_batch`` and the consumers that restore or map
the gathered rows.

    taskset -c 1 python benchmarks/bench_mrv2.py [--iters 200] [--no-compile] [--no-inductor-counts]
                                                 [--shard] [--no-reference] [--batches A,B,C]
                                                 [--split head-tail|round-robin|cost-balanced]
                                                 [--markdown PATH]

For each batch (R=256, T=8192, rank 0; decodes have 500 computed tokens and a
100-token prompt, prefills start from 0):

    A  P=4  256 decodes of 1 token
    B  P=4  64 decodes + fresh prefills of 2048 and 1000 tokens
    C  P=8  255 decodes + one fresh 4096-token prefill

in the smallest bucket that holds it, it prints, on one thread:

- ``make_batch`` (the host boundary) from Python lists and from numpy arrays:
  median us [p10-p90];
- every op (``build_layout``, ``partition_batch``, ``restore_hidden_states`` of a
  ``[P*Lp, 128]`` all-gathered buffer, ``restore_for_sampling`` with one auxiliary
  buffer, ``gathered_slot_mappings`` of two KV-cache groups): eager and
  inductor-compiled median us, its kernel-launching aten ops (dispatched ops
  minus views: what an eager graph replays as kernels) as a GPU/NPU dispatches
  them (``dev``: counted on meta tensors, which take the device code paths) and as
  the CPU does (``cpu``: ``segment_of`` counts ends with a histogram there), and
  inductor's CPU kernels for the entry ops (fused generated kernels + aten
  fallbacks, as ``fused+fallback``).

The entry ops are given the state of the previous batch's step (another
bucket), as a serving loop would: they read only its config and rank. Every
kernel count is checked against batches of other compositions in the same
bucket (prefills only, decodes only, one decode and one prefill): it must not
change. When vLLM's ``pcp_manager.py`` is found (``tools/check_mrv2_against_reference.py``),
its host ``PCPManager.partition_batch`` is timed for the same step too. The tables are printed
(``--markdown PATH`` writes them to a markdown fragment too: ``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import types

import numpy as np
import torch
import torch.utils._pytree as pytree

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _common import (  # noqa: E402
    H,
    R,
    T,
    Tables,
    add_markdown_option,
    cpu_options,
    inductor_kernels,
    median_us,
    reference_batches,
    spread,
    timings_us,
)

from pcp_fn import mrv2  # noqa: E402
from pcp_fn.graph import count_kernels  # noqa: E402


def on_meta(tree):
    """The same arguments on the meta device: ops take their GPU/NPU code paths there."""
    return pytree.tree_map(lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, tree)


def other_compositions(cfg, bucket):
    """Batches of other compositions in the same bucket: the kernel counts must not change."""
    Rl, Lp = bucket.num_reqs, bucket.num_tokens
    k = max(1, min(Rl, Lp, cfg.max_num_reqs) // 2)
    prefill = max(1, Lp // 2)
    return {
        "prefills only": mrv2.make_batch(cfg, [prefill], [0], [prefill], bucket=bucket),
        "decodes only": mrv2.make_batch(cfg, [1] * k, [500] * k, [100] * k, bucket=bucket),
        "decode + prefill": mrv2.make_batch(cfg, [1, prefill - 1], [7, 0], [3, prefill - 1], bucket=bucket),
    }


def op_table(state, batch, entry_state, P, Lp):
    """``name -> (fn, args)`` of the timed ops for ``batch`` (``state``: after its partition)."""
    F = mrv2.token_rows(batch.config, batch.bucket)
    gathered = torch.randn(P * Lp, H)
    return {
        "build_layout": (mrv2.build_layout, (entry_state, batch)),
        "partition_batch": (mrv2.partition_batch, (entry_state, batch)),
        "restore_hidden_states": (mrv2.restore_hidden_states, (state, gathered)),
        "restore_for_sampling": (mrv2.restore_for_sampling, (state, gathered, [gathered])),
        "gathered_slot_mappings": (
            mrv2.gathered_slot_mappings,
            (state, torch.arange(2 * F, dtype=torch.int64).view(2, F)),
        ),
    }


def reference_partition(P, shard, sched, comp, plen, bucket, iters):
    """Median us of vLLM's host ``PCPManager.partition_batch``, or None without its file."""
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    sys.argv = sys.argv[:1]
    try:
        import check_mrv2_against_reference as ref
    except (ImportError, FileNotFoundError):
        return None
    total = sum(sched)
    first = np.cumsum([0, *sched]).tolist()
    prefilling = [c < p for c, p in zip(comp, plen)]
    case = dict(
        sched=sched,
        computed=comp,
        prefill_len=plen,
        prefilling=prefilling,
        idx_mapping=list(range(len(sched))),
        input_ids=[0] * total,
        positions=[c + t for c, n in zip(comp, sched) for t in range(n)],
        first=first,
    )
    mgr = ref.PCPManager(P, 0, torch.device("cpu"), shard, max_num_reqs=R, max_num_tokens=T)
    gb = ref.reference_global_batch(case, total)
    desc = types.SimpleNamespace(
        cg_mode=ref.CUDAGraphMode.PIECEWISE, num_tokens=bucket.num_tokens, num_reqs=None
    )
    return median_us(lambda: mgr.partition_batch(gb, desc), iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-compile", action="store_true", help="skip the inductor timings")
    ap.add_argument("--no-inductor-counts", action="store_true", help="skip inductor's kernel counts")
    ap.add_argument("--shard", action="store_true", help="shard decodes round-robin instead of replicating")
    ap.add_argument("--no-reference", action="store_true", help="do not time vLLM's host path")
    ap.add_argument("--batches", default="A,B,C")
    splits = {s.name: s for s in (mrv2.HEAD_TAIL, mrv2.ROUND_ROBIN, mrv2.COST_BALANCED)}
    ap.add_argument(
        "--split", choices=sorted(splits), default="head-tail", help="the prefill split (vLLM's: head-tail)"
    )
    add_markdown_option(ap)
    args = ap.parse_args()
    tables = Tables(args.markdown)
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    previous = {}  # P -> the state of the previous batch's step (another bucket)
    summary = []
    host_rows, op_rows = [], []
    for name, (P, (sched, comp, plen)) in reference_batches().items():
        if name not in args.batches.split(","):
            continue
        cfg = mrv2.MRV2Config(P, 0, R, T, shard_decode_requests=args.shard, split=splits[args.split])
        entry_state = previous.get(P, mrv2.init_state(cfg))
        batch = mrv2.make_batch(cfg, sched, comp, plen)
        bucket = batch.bucket
        Lp = bucket.num_tokens
        state, _ = mrv2.partition_batch(entry_state, batch)
        previous[P] = state
        print(
            f"\nbatch {name}: P={P}, {len(sched)} requests, bucket {bucket}, "
            f"G={P * Lp}, F_b={mrv2.token_rows(cfg, bucket)}"
        )
        as_numpy = [np.asarray(x) for x in (sched, comp, plen)]
        host = {
            "make_batch (lists in)": functools.partial(mrv2.make_batch, cfg, sched, comp, plen),
            "make_batch (numpy in)": functools.partial(mrv2.make_batch, cfg, *as_numpy),
        }
        host_us = {}
        for label, fn in host.items():
            samples = timings_us(fn, max(args.iters, 1000))
            host_us[label] = statistics.median(samples)
            host_rows.append([name, label, spread(samples)])

        ops = op_table(state, batch, entry_state, P, Lp)
        others = []
        for other in other_compositions(cfg, bucket).values():
            other_state, _ = mrv2.partition_batch(entry_state, other)
            others.append(op_table(other_state, other, entry_state, P, Lp))
        kernels = {}
        for op, (fn, fargs) in ops.items():
            eager = median_us(lambda fn=fn, a=fargs: fn(*a), args.iters)
            compiled = float("nan")
            if not args.no_compile:
                cfn = torch.compile(fn, fullgraph=True, dynamic=False, options=cpu_options(fargs))
                cfn(*fargs)
                compiled = median_us(lambda cfn=cfn, a=fargs: cfn(*a), args.iters)
            count = (count_kernels(fn, *on_meta(fargs)), count_kernels(fn, *fargs))
            for table in others:  # constant across compositions, on both code paths
                ofn, oargs = table[op]
                other = (count_kernels(ofn, *on_meta(oargs)), count_kernels(ofn, *oargs))
                assert other == count, f"{op}: {count} kernels, {other} for another composition"
            kernels[op] = count
            ind = ""
            if not args.no_inductor_counts and op in ("build_layout", "partition_batch"):
                ind = "{}+{}".format(*inductor_kernels(fn, *fargs))
            compiled_us = "" if args.no_compile else f"{compiled:.1f}"
            op_rows.append([name, op, f"{eager:.1f}", compiled_us, count[0], count[1], ind])
        torch._dynamo.reset()
        ref_us = (
            None
            if args.no_reference
            else reference_partition(P, args.shard, sched, comp, plen, bucket, args.iters)
        )
        if ref_us is not None:
            op_rows.append([name, "vLLM's host partition_batch", f"{ref_us:.1f}", None, None, None, None])
        summary.append((name, host_us, kernels))

    tables.table("host boundary mrv2.make_batch (us, median [p10-p90])", ["batch", "input", "us"], host_rows)
    tables.table(
        "ops (median us, eager and inductor-compiled), kernel-launching aten ops on a GPU/NPU (dev) and "
        "on the CPU, inductor's CPU kernels (fused+fallback); vLLM's host partition_batch for the same step",
        ["batch", "op", "eager us", "compiled us", "dev", "cpu", "inductor"],
        op_rows,
    )
    ops = list(summary[0][2]) if summary else []
    tables.table(
        "summary (medians, us; kernels on a GPU/NPU / on the CPU)",
        ["batch", "make_batch (numpy in)", "make_batch (lists in)", *(f"{op} kernels" for op in ops)],
        [
            [
                name,
                f"{host_us['make_batch (numpy in)']:.1f}",
                f"{host_us['make_batch (lists in)']:.1f}",
                *("{} / {}".format(*kernels[op]) for op in ops),
            ]
            for name, host_us, kernels in summary
        ],
    )
    counts = {tuple(k.values()) for _, _, k in summary}
    tables.note(
        f"Kernel counts {'the same' if len(counts) == 1 else 'NOT the same'} for every batch "
        "(and for three other compositions in each bucket)."
    )
    tables.write()


if __name__ == "__main__":
    main()
