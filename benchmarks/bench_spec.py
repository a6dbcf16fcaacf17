"""The spec-decode step: eager and compiled medians, kernel and aten op counts, the host boundary.

    python benchmarks/bench_spec.py [--iters 200] [--no-compile] [--no-inductor-counts]
                                    [--max-model-len 1024] [--dcp 2] [--hybrid] [--markdown PATH]

Batch (the reference batches' sizes, docs/performance.md): ``P = 4``, rank 0, ``R = 256``, ``T = 8192``, two
spec tokens (MTP), 256 decodes of 3 tokens (1 + 2 drafts) with 500 computed
tokens and a 100-token prompt, a ``[256, max_model_len]`` token table and a
paged block table (128-token blocks) as the MTP ``slot_fn``. It times

- ``spec_step``: :func:`pcp_fn.step` + scheduler-order ids / positions / MTP
  slot layout + local ids + spec-decode indices (no CP attention mask: DCP is 1
  here; ``--dcp 2`` adds it);
- ``spec_step (async)``: the same with the previous step's sampled and draft
  tokens written back (``repair_full_input_ids``);
- the post-forward drafter prep: ``first_pass_inputs`` + ``mtp_drafting_inputs``;

eager and inductor-compiled, on one thread, and counts for each its
kernel-launching aten ops (dispatched ops minus views: what an eager graph
replays as kernels) as a GPU/NPU dispatches them (``dev``: counted on meta
tensors, which take the device code paths) and as the CPU does (``cpu``),
inductor's CPU kernels (generated fused kernels + aten fallbacks, as
``fused+fallback``) and all aten ops, on this batch and on a second batch of
the same bucket with another composition (decodes of 1-3 tokens, random draft
counts, one prefill): the counts must be equal. ``--hybrid`` times the
hybrid-attention layout (``hybrid_attn=True``) instead of DualChunkSwap.

It also times the spec host boundary, ``make_spec_batch`` (numpy arrays in, as
a runner has them, with the token table's shape and the slot mapping; one
packed copy, staged on a GPU/NPU), beside ``make_batch`` of the same arrays,
on this batch and on the reference mixed batches B (P=4, 64 decodes + fresh
prefills of 2048 and 1000 tokens) and C (P=8, 255 decodes + one 4096-token
prefill), all paths interleaved. The tables are printed (``--markdown PATH`` writes them to a
markdown fragment too: ``benchmarks/_common.py``).
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
import torch.utils._pytree as pytree

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _common import (  # noqa: E402
    Tables,
    add_markdown_option,
    cpu_options,
    inductor_kernels,
    median_us,
    reference_batches,
    spread,
    timings_us,
)

import pcp_fn  # noqa: E402
from pcp_fn.core.entry import entry_op  # noqa: E402
from pcp_fn.graph import count_kernels  # noqa: E402
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


def on_meta(tree):
    """The same arguments on the meta device: ops take their GPU/NPU code paths there."""
    return pytree.tree_map(lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, tree)


def spec_step_with(blocks):
    """``spec_step`` with the paged ``slot_fn`` over ``blocks`` (on the device of the arguments)."""
    return entry_op(functools.partial(pcp_fn.spec_step, slot_fn=functools.partial(paged_slots, blocks)))


def host_boundary(args):
    """Medians [p10-p90] of ``make_spec_batch`` and ``make_batch`` (numpy in), interleaved."""
    table = torch.empty(R, T, dtype=torch.int32)  # wide enough for every batch; only its shape is read
    spec_batch = ([3] * R, [500] * R, [100] * R, [2] * R)
    cases = {"spec batch": (P, spec_batch)}
    for name, (p, arrays) in reference_batches().items():
        if name != "A":
            cases[name] = (p, (*arrays, [0] * len(arrays[0])))
    paths = {}
    for name, (p, arrays) in cases.items():
        cfg = pcp_fn.PCPConfig(p, 0, R, T, num_spec_tokens=K, dcp_size=args.dcp, hybrid_attn=args.hybrid)
        sched, comp, prompt, drafts = (np.asarray(x, dtype=np.int64) for x in arrays)
        slots = np.arange(int(sched.sum()), dtype=np.int64)
        paths[(name, "make_spec_batch")] = functools.partial(
            pcp_fn.make_spec_batch, cfg, sched, comp, prompt, drafts, token_ids=table, slot_mapping=slots
        )
        paths[(name, "make_batch")] = functools.partial(
            pcp_fn.make_batch, cfg, sched, comp, prompt, slot_mapping=slots
        )
    samples = {key: [] for key in paths}
    for _ in range(10):
        for key, fn in paths.items():
            samples[key] += timings_us(fn, max(1, args.iters // 2), warmup=5)
    return {key: spread(v) for key, v in samples.items()}


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
    ap.add_argument("--no-inductor-counts", action="store_true", help="skip inductor's kernel counts")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--dcp", type=int, default=1)
    ap.add_argument("--hybrid", action="store_true", help="the hybrid-attention layout (hybrid_attn=True)")
    add_markdown_option(ap)
    args = ap.parse_args()
    tables = Tables(args.markdown)
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64

    cfg = pcp_fn.PCPConfig(P, 0, R, T, num_spec_tokens=K, dcp_size=args.dcp, hybrid_attn=args.hybrid)
    state = pcp_fn.init_state(cfg)
    table = torch.randint(1, 50_000, (R, args.max_model_len), dtype=torch.int32)
    blocks = torch.randperm(R * (args.max_model_len // BLOCK + 1)).reshape(R, -1).to(torch.int32)
    step = spec_step_with(blocks)
    step_on_meta = spec_step_with(blocks.to("meta"))

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
    on_device = {"spec_step": step_on_meta, "spec_step (async)": step_on_meta, "drafter prep": drafter_prep}
    main_args = dict(zip(ops, inputs(*main_batch)))
    other_args = dict(zip(ops, inputs(*other_batch)))

    print(
        f"spec-decode step ({'hybrid attention' if args.hybrid else 'DualChunkSwap'}): "
        f"P={P}, dcp={args.dcp}, R={R}, T={T}, {K} spec tokens, 256 decodes of 3 tokens, "
        f"bucket {b}, F_b={token_rows(cfg, b)}, S_b={sampled_rows(cfg, b)}, M_b={mtp_rows(cfg, b)}, "
        f"token table [{R}, {args.max_model_len}]"
    )
    rows = []
    same = True
    for name, fn in ops.items():
        fargs = main_args[name]
        eager = median_us(lambda fn=fn, fargs=fargs: fn(*fargs), args.iters)
        compiled = float("nan")
        if not args.no_compile:
            cfn = torch.compile(own_code(fn), fullgraph=True, dynamic=False, options=cpu_options(fargs))
            cfn(*fargs)
            compiled = median_us(lambda cfn=cfn, fargs=fargs: cfn(*fargs), args.iters)
        counts = [
            (
                count_kernels(on_device[name], *on_meta(a)),
                count_kernels(fn, *a),
                pcp_fn.count_aten_ops(fn, *a),
            )
            for a in (fargs, other_args[name])
        ]
        same &= counts[0] == counts[1]
        ind = "" if args.no_inductor_counts else "{}+{}".format(*inductor_kernels(own_code(fn), *fargs))
        (dev, cpu, aten), (dev2, cpu2, aten2) = counts
        compiled_us = "" if args.no_compile else f"{compiled:.1f}"
        rows.append([name, f"{eager:.1f}", compiled_us, dev, cpu, ind, aten, dev2, cpu2, aten2])
    tables.table(
        "ops (median us, eager and inductor-compiled), kernel-launching aten ops on a GPU/NPU (dev) and on "
        "the CPU, inductor's CPU kernels (fused+fallback), all aten ops; the same counts on a batch of "
        "another composition in the same bucket",
        ["op", "eager us", "compiled us", "dev", "cpu", "inductor", "aten ops", "other: dev", "other: cpu"]
        + ["other: aten ops"],
        rows,
    )
    depend = "do not depend" if same else "DEPEND"
    tables.note(f"Kernel and aten op counts {depend} on the batch composition.")
    tables.table(
        "host boundary (numpy in; us, median [p10-p90], interleaved)",
        ["batch", "boundary", "us"],
        [[name, path, text] for (name, path), text in host_boundary(args).items()],
    )
    tables.write()


if __name__ == "__main__":
    main()
