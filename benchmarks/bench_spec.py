"""The spec-decode step: eager and compiled medians, aten op counts.

    python benchmarks/bench_spec.py [--iters 200] [--no-compile] [--max-model-len 1024] [--dcp 2] [--hybrid]

Batch (DESIGN.md §7 sizes): ``P = 4``, rank 0, ``R = 256``, ``T = 8192``, two
spec tokens (MTP), 256 decodes of 3 tokens (1 + 2 drafts) with 500 computed
tokens and a 100-token prompt, a ``[256, max_model_len]`` token table and a
paged block table (128-token blocks) as the MTP ``slot_fn``. It times

- ``spec_step``: :func:`pcp_fn.step` + scheduler-order ids / positions / MTP
  slot layout + local ids + spec-decode indices (no CP attention mask: DCP is 1
  here; ``--dcp 2`` adds it);
- ``spec_step (async)``: the same with the previous step's sampled and draft
  tokens written back (``repair_full_input_ids``);
- the post-forward drafter prep: ``first_pass_inputs`` + ``mtp_drafting_inputs``;

eager and inductor-compiled, on one thread, and counts the aten ops of each
on this batch and on a second batch of the same bucket with another
composition (decodes of 1-3 tokens, random draft counts, one prefill): the
counts must be equal. ``--hybrid`` times the hybrid-attention layout
(``hybrid_attn=True``) instead of DualChunkSwap.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import types

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _common import median_us  # noqa: E402

import pcp_fn  # noqa: E402
from pcp_fn.core.entry import entry_op  # noqa: E402
from pcp_fn.spec import PrevStep, mtp_rows, sampled_rows, token_rows  # noqa: E402

P, R, T, H, K, BLOCK = 4, 256, 8192, 128, 2, 128


def paged_slots(block_table: torch.Tensor, request: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``block_table[request, position // BLOCK] * BLOCK + position % BLOCK`` (fixed shape)."""
    width = block_table.shape[1]
    flat = request * width + (position // BLOCK).clamp(max=width - 1)
    return block_table.reshape(-1)[flat] * BLOCK + position % BLOCK


def own_code(fn):
    """``fn`` behind a trampoline with a code object of its own (one Dynamo cache per op)."""

    def trampoline(*args):
        return fn(*args)

    return types.FunctionType(
        trampoline.__code__.replace(), trampoline.__globals__, "own", None, trampoline.__closure__
    )


def batches(cfg, table):
    main = ([3] * R, [500] * R, [100] * R, [2] * R)
    rng = random.Random(0)
    sched = [rng.randint(1, 3) for _ in range(R - 1)]
    other = (
        sched + [64],
        [rng.randint(1, 800) for _ in range(R - 1)] + [0],
        [1] * (R - 1) + [64],
        [rng.randint(0, n - 1) for n in sched] + [0],
    )
    slots = lambda sched: np.arange(sum(sched), dtype=np.int64)  # noqa: E731  (scheduler-order KV slots)
    a = pcp_fn.make_spec_batch(cfg, *main, token_ids=table, slot_mapping=slots(main[0]))
    b = pcp_fn.make_spec_batch(cfg, *other, token_ids=table, slot_mapping=slots(other[0]), bucket=a[0].bucket)
    return a, b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-compile", action="store_true", help="skip the inductor timings")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--dcp", type=int, default=1)
    ap.add_argument("--hybrid", action="store_true", help="the hybrid-attention layout (hybrid_attn=True)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64

    cfg = pcp_fn.PCPConfig(P, 0, R, T, num_spec_tokens=K, dcp_size=args.dcp, hybrid_attn=args.hybrid)
    state = pcp_fn.init_state(cfg)
    table = torch.randint(1, 50_000, (R, args.max_model_len), dtype=torch.int32)
    blocks = torch.randperm(R * (args.max_model_len // BLOCK + 1)).reshape(R, -1).to(torch.int32)
    slot_fn = functools.partial(paged_slots, blocks)
    step = entry_op(functools.partial(pcp_fn.spec_step, slot_fn=slot_fn))

    def inputs(batch, spec):
        b = batch.bucket
        Rb, Lb = b.num_reqs, b.num_tokens
        updated, _ = pcp_fn.update_tokens(state, batch)
        prev = PrevStep(
            torch.randint(1, 50_000, (R, 1)), torch.randint(1, 50_000, (R, K)), torch.arange(Rb) % R
        )
        gen = torch.Generator().manual_seed(1)
        post = (
            updated,
            torch.randint(1, 50_000, (token_rows(cfg, b),), generator=gen),
            torch.randint(0, 900, (Lb,), generator=gen),
            torch.randn(P * Lb, H, generator=gen),
            torch.randint(0, 3, (Rb,), generator=gen),
            torch.randint(0, P * Lb, (sampled_rows(cfg, b),), generator=gen),
            torch.tensor(3 * Rb),
            torch.randint(1, 900, (Rb,), dtype=torch.int32, generator=gen),
            torch.randint(0, 9999, (mtp_rows(cfg, b) * P,), dtype=torch.int32, generator=gen),
        )
        return (
            (state, batch, spec, table),
            (state, batch, spec, table, prev),
            post,
        )

    def drafter_prep(st, full_ids, positions, hidden, tis, logits, num_logits, seq_lens, mtp_slots):
        st, fp = pcp_fn.first_pass_inputs(
            st, full_ids, positions, hidden, tis, logits, num_logits, seq_lens=seq_lens
        )
        st, mtp = pcp_fn.mtp_drafting_inputs(st, tis, seq_lens, mtp_slots)
        return st, fp, mtp

    main_batch, other_batch = batches(cfg, table)
    b = main_batch[0].bucket
    ops = {"spec_step": step, "spec_step (async)": step, "drafter prep": drafter_prep}
    main_args = dict(zip(ops, inputs(*main_batch)))
    other_args = dict(zip(ops, inputs(*other_batch)))

    print(
        f"spec-decode step ({'hybrid attention' if args.hybrid else 'DualChunkSwap'}): "
        f"P={P}, dcp={args.dcp}, R={R}, T={T}, {K} spec tokens, 256 decodes of 3 tokens, "
        f"bucket {b}, F_b={token_rows(cfg, b)}, S_b={sampled_rows(cfg, b)}, M_b={mtp_rows(cfg, b)}, "
        f"token table [{R}, {args.max_model_len}]"
    )
    print(f"  {'op':22s} {'eager us':>10s} {'compiled us':>12s} {'aten ops':>9s} {'other batch':>12s}")
    same = True
    for name, fn in ops.items():
        fargs = main_args[name]
        eager = median_us(lambda fn=fn, fargs=fargs: fn(*fargs), args.iters)
        compiled = float("nan")
        if not args.no_compile:
            cfn = torch.compile(own_code(fn), fullgraph=True, dynamic=False)
            cfn(*fargs)
            compiled = median_us(lambda cfn=cfn, fargs=fargs: cfn(*fargs), args.iters)
        count = pcp_fn.count_aten_ops(fn, *fargs)
        other = pcp_fn.count_aten_ops(fn, *other_args[name])
        same &= count == other
        print(f"  {name:22s} {eager:10.1f} {compiled:12.1f} {count:9d} {other:12d}")
    print(f"aten op counts {'do not depend' if same else 'DEPEND'} on the batch composition")


if __name__ == "__main__":
    main()
