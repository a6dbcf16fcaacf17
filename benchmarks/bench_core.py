"""Core op and composed-step timings on the DESIGN.md reference batches.

    python benchmarks/bench_core.py [--iters 200] [--no-compile] [--seed PATH]

For each batch (R=256, T=8192, hidden 128, rank 0):

    A  P=4  256 decodes of 1 token
    B  P=4  64 decodes + fresh prefills of 2048 and 1000 tokens
    C  P=8  255 decodes + one fresh 4096-token prefill

it prints the median microseconds of every op and of the composed step
(update_tokens -> logits indices -> padded slot mapping -> restore of a
``[P*L_b, 128]`` all-gathered buffer), eager and inductor-compiled on the CPU,
on one thread, and the number of aten ops the composed step dispatches. When
the seed file is found (``--seed``, or found by ``tools/reference.py``), it
also times the seed's host path for the same step (the numpy ``PCPManager``
calls: init_batch_info, update_tokens_for_pcp, get_logits_indices,
get_padded_slot_mapping, get_restore_hidden_states) and prints the ratio.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _common import H, R, T, median_us, reference_batches, seed_loader_or_none

import pcp_fn


def composed(state, batch, slots, gathered):
    """The foundation issue's composed step: update -> logits -> slots -> restore."""
    state, layout = pcp_fn.update_tokens(state, batch)
    state, logits = pcp_fn.get_logits_indices(state, batch.bucket.num_reqs)
    state, sm = pcp_fn.padded_slot_mapping(state, slots, batch.bucket.num_tokens)
    state, hidden = pcp_fn.restore_hidden_states(state, gathered)
    return state, layout, logits, sm, hidden


def seed_host_path(P, sched, comp, prompt, iters, seed_path):
    seed_loader = seed_loader_or_none(seed_path)
    if seed_loader is None:
        return None
    m = seed_loader.make_manager(P, 0, R, T)
    sched = np.asarray(sched, np.int32)
    comp = np.asarray(comp, np.int32)
    prompt = np.asarray(prompt, np.int32)
    n = sched.size
    arange = np.arange(T * P + 2 * P * R, dtype=np.int64)
    slot_mapping = torch.arange(int(sched.sum()), dtype=torch.int32)
    probe = m.update_tokens_for_pcp  # the local count, to size the hidden buffers
    m.init_batch_info(sched, n, comp, prompt)
    N = int(np.asarray(probe(sched.copy(), arange)[0]).sum())
    local = torch.randn(N, H)
    seed_loader.PCP_GROUP.gathered = torch.randn(N * P, H)

    def bookkeeping():
        s = sched.copy()
        m.init_batch_info(s, n, comp, prompt)
        pcp_tokens, _ = m.update_tokens_for_pcp(s[:n], arange)
        cu = np.cumsum(pcp_tokens)
        m.get_logits_indices(cu, n)
        m.num_actual_tokens_pcp_padded = N * P
        m.get_padded_slot_mapping(N, N, slot_mapping, 0)

    def with_restore():
        bookkeeping()
        m.get_restore_hidden_states(local)

    return median_us(with_restore, iters), median_us(bookkeeping, iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-compile", action="store_true", help="skip the inductor timings")
    ap.add_argument("--seed", default=None, help="path of seed 000 (the host path to compare with)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    rows = []
    for name, (P, (sched, comp, prompt)) in reference_batches().items():
        cfg = pcp_fn.PCPConfig(P, 0, R, T)
        state = pcp_fn.init_state(cfg)
        batch = pcp_fn.make_batch(cfg, sched, comp, prompt)
        Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
        slots = torch.arange(T, dtype=torch.int32)
        gathered = torch.randn(P * Lb, H)
        updated, _ = pcp_fn.update_tokens(state, batch)
        ops = {
            "update_tokens": (pcp_fn.update_tokens, (state, batch)),
            "get_logits_indices": (lambda s, Rb=Rb: pcp_fn.get_logits_indices(s, Rb), (updated,)),
            "padded_slot_mapping": (
                lambda s, m, Lb=Lb: pcp_fn.padded_slot_mapping(s, m, Lb),
                (updated, slots),
            ),
            "restore_hidden_states": (pcp_fn.restore_hidden_states, (updated, gathered)),
            "composed step": (composed, (state, batch, slots, gathered)),
            "pcp_fn.step": (pcp_fn.step, (state, batch, slots)),
        }
        print(f"\nbatch {name}: P={P}, {len(sched)} requests, bucket {batch.bucket}, G_b={P * Lb}")
        print(f"  {'op':24s} {'eager us':>10s} {'compiled us':>12s}")
        result = {}
        for op, (fn, fargs) in ops.items():
            eager = median_us(lambda fn=fn, fargs=fargs: fn(*fargs), args.iters)
            compiled = float("nan")
            if not args.no_compile:
                cfn = torch.compile(fn, fullgraph=True, dynamic=False)
                cfn(*fargs)
                compiled = median_us(lambda cfn=cfn, fargs=fargs: cfn(*fargs), args.iters)
            result[op] = (eager, compiled)
            print(f"  {op:24s} {eager:10.1f} {compiled:12.1f}")
        count = pcp_fn.count_aten_ops(composed, state, batch, slots, gathered)
        step_count = pcp_fn.count_aten_ops(pcp_fn.step, state, batch, slots)
        print(f"  aten ops: composed step {count}, pcp_fn.step {step_count}")
        seed = seed_host_path(P, sched, comp, prompt, args.iters, args.seed)
        seed_us = None
        if seed is not None:
            seed_us, seed_books = seed
            ratio = result["composed step"][1] / seed_us
            print(f"  seed host path (same step): {seed_us:.1f} us; compiled composed / seed = {ratio:.2f}")
            ratio = result["pcp_fn.step"][1] / seed_books
            print(
                f"  seed host bookkeeping only (no hidden restore): {seed_books:.1f} us; "
                f"compiled pcp_fn.step / seed = {ratio:.2f}"
            )
        rows.append((name, count, result, seed_us))
    counts = {c for _, c, _, _ in rows}
    print(
        f"\ncomposed-step aten op count is {'the same' if len(counts) == 1 else 'NOT the same'} "
        f"for all batches: {sorted(counts)}"
    )


if __name__ == "__main__":
    main()
