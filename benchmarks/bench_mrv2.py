"""MRV2 layout timings on the DESIGN.md reference batches: ``build_layout``, ``partition_batch``
and ``restore_hidden_states``.

    python benchmarks/bench_mrv2.py [--iters 200] [--no-compile] [--shard] [--no-reference]

For each batch (R=256, T=8192, rank 0; decodes have 500 computed tokens and a
100-token prompt, prefills start from 0):

    A  P=4  256 decodes of 1 token
    B  P=4  64 decodes + fresh prefills of 2048 and 1000 tokens
    C  P=8  255 decodes + one fresh 4096-token prefill

in the smallest bucket that holds it, it prints the median microseconds of
``build_layout``, of ``partition_batch`` (which builds the layout and the
local batch) and of ``restore_hidden_states`` (``[P*Lp, 128] -> [F_b, 128]``,
``F_b = min(T, P*Lp)``), eager and inductor-compiled on the CPU, on one
thread, and the number of aten ops each dispatches. The entry ops are given
the state of the previous batch's step (another bucket), as a serving loop
would: they read only its config and rank. The op count is checked against a
batch of another composition (prefills only) in the same bucket: it must not
change. When vLLM's ``pcp_manager.py`` is found (``tools/check_mrv2_against_seed.py``),
its host ``PCPManager.partition_batch`` is timed for the same step too.
"""

from __future__ import annotations

import argparse
import os
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _common import H, R, T, median_us, reference_batches  # noqa: E402

from pcp_fn import count_aten_ops, mrv2  # noqa: E402


def other_composition(cfg, bucket):
    """Prefills only, in the same bucket: the op count must not change."""
    sched = [max(1, bucket.num_tokens // 2)]
    return mrv2.make_batch(cfg, sched, [0], sched, bucket=bucket)


def reference_partition(P, shard, sched, comp, plen, bucket, iters):
    """Median us of vLLM's host ``PCPManager.partition_batch``, or None without its file."""
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    sys.argv = sys.argv[:1]
    try:
        import check_mrv2_against_seed as ref
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
    gb = ref.seed_global_batch(case, total)
    desc = types.SimpleNamespace(
        cg_mode=ref.CUDAGraphMode.PIECEWISE, num_tokens=bucket.num_tokens, num_reqs=None
    )
    return median_us(lambda: mgr.partition_batch(gb, desc), iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-compile", action="store_true", help="skip the inductor timings")
    ap.add_argument("--shard", action="store_true", help="shard decodes round-robin instead of replicating")
    ap.add_argument("--no-reference", action="store_true", help="do not time vLLM's host path")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    previous = {}  # P -> the state of the previous batch's step (another bucket)
    for name, (P, (sched, comp, plen)) in reference_batches().items():
        cfg = mrv2.MRV2Config(P, 0, R, T, shard_decode_requests=args.shard)
        entry_state = previous.get(P, mrv2.init_state(cfg))
        batch = mrv2.make_batch(cfg, sched, comp, plen)
        bucket = batch.bucket
        state, _ = mrv2.partition_batch(entry_state, batch)
        previous[P] = state
        gathered = torch.randn(P * bucket.num_tokens, H)
        F = mrv2.token_rows(cfg, bucket)
        G = P * bucket.num_tokens
        print(f"\nbatch {name}: P={P}, {len(sched)} requests, bucket {bucket}, G={G}, F_b={F}")
        print(f"  {'op':22s} {'eager us':>10s} {'compiled us':>12s} {'aten ops':>9s}")
        ops = {
            "build_layout": (mrv2.build_layout, (entry_state, batch)),
            "partition_batch": (mrv2.partition_batch, (entry_state, batch)),
            "restore_hidden_states": (mrv2.restore_hidden_states, (state, gathered)),
        }
        other_batch = other_composition(cfg, bucket)
        other_state, _ = mrv2.partition_batch(entry_state, other_batch)
        others = {
            "build_layout": (entry_state, other_batch),
            "partition_batch": (entry_state, other_batch),
            "restore_hidden_states": (other_state, gathered),
        }
        for op, (fn, fargs) in ops.items():
            eager = median_us(lambda fn=fn, a=fargs: fn(*a), args.iters)
            compiled = float("nan")
            if not args.no_compile:
                cfn = torch.compile(fn, fullgraph=True, dynamic=False)
                cfn(*fargs)
                compiled = median_us(lambda cfn=cfn, a=fargs: cfn(*a), args.iters)
            count = count_aten_ops(fn, *fargs)
            other = count_aten_ops(fn, *others[op])
            assert count == other, f"{op}: {count} aten ops, {other} for another composition"
            print(f"  {op:22s} {eager:10.1f} {compiled:12.1f} {count:9d}")
        ref_us = (
            None
            if args.no_reference
            else reference_partition(P, args.shard, sched, comp, plen, bucket, args.iters)
        )
        if ref_us is not None:
            print(f"  {'vLLM host partition':22s} {ref_us:10.1f}")


if __name__ == "__main__":
    main()
