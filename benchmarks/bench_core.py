"""Core op, host boundary and composed-step timings on the reference batches.

    taskset -c 1 python benchmarks/bench_core.py [--iters 300] [--backends eager,compile,aoti]
                                                 [--batches A,B,C] [--reference PATH] [--per-octave N]
                                                 [--markdown PATH]

For each batch (R=256, T=8192, hidden 128, rank 0):

    A  P=4  256 decodes of 1 token
    B  P=4  64 decodes + fresh prefills of 2048 and 1000 tokens
    C  P=8  255 decodes + one fresh 4096-token prefill

it prints, on one thread:

- ``make_batch`` (the host boundary, with the slot mapping): median us [p10-p90];
- every op (``update_tokens``, ``get_logits_indices``, ``padded_slot_mapping``,
  ``restore_hidden_states``, ``step``, ``attention_metadata`` and the composed
  step): eager median us, its kernel-launching aten ops (dispatched ops minus
  views: what an eager graph replays as kernels) as a GPU/NPU dispatches them
  (``dev``: counted on meta tensors, which take the device code paths) and as
  the CPU does (``cpu``: ``segment_of`` counts ends with a histogram there,
  three more kernels per search), and inductor's CPU kernels for it (fused
  generated kernels + aten fallbacks, as ``fused+fallback``);
- ``step`` and the composed step with the restore of a ``[P*L_b, 128]``
  all-gathered buffer, two ways: op by op (``update_tokens ->
  get_logits_indices -> padded_slot_mapping -> restore_hidden_states``, the
  consumers rebuilding their maps from the state) and as a runner does it
  (the captured ``step``, then the hidden states gathered through its
  ``restore_index``: one ``index_select`` into a persistent buffer; a runner's
  forward and all-gather sit between the two, so they are never one graph), through
  each backend of ``pcp_fn.graph.capture``: ``eager`` (a direct call),
  ``compile`` (``torch.compile``'s wrapper) and ``aoti`` (AOTInductor, one
  package per bucket); all paths and the reference are timed in interleaved
  rounds, so load on the machine hits them alike;
- when the vllm-ascend reference is found (``--reference``, or ``tools/reference.py``),
  its host path for the same composed step, timed in the same run (``PCPManager``
  init_batch_info, update_tokens_for_pcp, get_logits_indices,
  get_padded_slot_mapping, get_restore_hidden_states), and each backend's ratio
  to it.

It prints them as tables (``--markdown PATH`` writes them to a markdown fragment, headed by the
date, machine, load, torch version and command: ``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile

import numpy as np
import torch
import torch.utils._pytree as pytree
from _common import (
    H,
    R,
    T,
    Tables,
    add_markdown_option,
    inductor_kernels,
    reference_batches,
    reference_loader_or_none,
    spread,
    timings_us,
)

import pcp_fn
from pcp_fn.core.buckets import geometric_buckets
from pcp_fn.core.entry import entry_op
from pcp_fn.graph import count_kernels


@entry_op
def composed(state, batch, gathered):
    """The foundation issue's composed step, op by op: update -> logits -> slots -> restore."""
    state, layout = pcp_fn.update_tokens(state, batch)
    state, logits = pcp_fn.get_logits_indices(state)
    state, sm = pcp_fn.padded_slot_mapping(state, batch.slot_mapping)
    state, hidden = pcp_fn.restore_hidden_states(state, gathered)
    return state, layout, logits, sm, hidden


def step_and_restore(step_call, state, batch, gathered, hidden):
    """The same step as a runner composes it: ``step`` (update, logits, slots in one pass; eager or
    captured, ``step_call``), then the hidden-state restore through the step's own restore index
    (the all-gathered ``gathered``) into the runner's persistent ``hidden`` buffer."""
    state, out = step_call(state, batch)
    return state, out, torch.index_select(gathered, 0, out.layout.restore_index, out=hidden)


def on_meta(tree):
    """The same arguments on the meta device: ops take their GPU/NPU code paths there."""
    return pytree.tree_map(lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, tree)


def interleaved(paths, iters, rounds=10):
    """``name -> samples (us)``: every path timed in ``rounds`` interleaved rounds."""
    samples = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            samples[name] += timings_us(fn, max(1, iters // rounds), warmup=3)
    return samples


def reference_host_path(P, sched, comp, prompt, reference_path):
    """``(with_restore, bookkeeping)`` callables of the vllm-ascend host path, or ``None``."""
    reference_loader = reference_loader_or_none(reference_path)
    if reference_loader is None:
        return None
    m = reference_loader.make_manager(P, 0, R, T)
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
    reference_loader.PCP_GROUP.gathered = torch.randn(N * P, H)

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

    return with_restore, bookkeeping


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--backends", default="eager,compile,aoti", help="of step and the composed step")
    ap.add_argument("--batches", default="A,B,C")
    ap.add_argument("--no-inductor-counts", action="store_true", help="skip inductor's kernel counts")
    ap.add_argument("--reference", default=None, help="path of the vllm-ascend pcp_utils reference")
    ap.add_argument(
        "--per-octave",
        type=int,
        default=1,
        help="token buckets per doubling (core.buckets.geometric_buckets; 1: powers of two, the default)",
    )
    add_markdown_option(ap)
    args = ap.parse_args()
    tables = Tables(args.markdown)
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    backends = [b for b in args.backends.split(",") if b]
    package_dir = tempfile.mkdtemp(prefix="pcp_fn_aoti_")
    summary = []
    host_rows, op_rows, path_rows = [], [], []
    for name, (P, (sched, comp, prompt)) in reference_batches().items():
        if name not in args.batches.split(","):
            continue
        cfg = pcp_fn.PCPConfig(P, 0, R, T)
        if args.per_octave != 1:
            ladder = geometric_buckets(cfg.max_local_tokens, args.per_octave)
            cfg = pcp_fn.PCPConfig(P, 0, R, T, token_buckets=ladder)
        state = pcp_fn.init_state(cfg)
        slot_list = np.arange(sum(sched), dtype=np.int64)
        batch = pcp_fn.make_batch(cfg, sched, comp, prompt, slot_mapping=slot_list)
        Lb = batch.bucket.num_tokens
        gathered = torch.randn(P * Lb, H)
        updated, _ = pcp_fn.update_tokens(state, batch)
        print(f"\nbatch {name}: P={P}, {len(sched)} requests, bucket {batch.bucket}, G_b={P * Lb}")
        as_numpy = [np.asarray(x) for x in (sched, comp, prompt)]
        host = {
            "make_batch": functools.partial(
                pcp_fn.make_batch, cfg, sched, comp, prompt, slot_mapping=slot_list
            ),
            "make_batch (numpy in)": functools.partial(
                pcp_fn.make_batch, cfg, *as_numpy, slot_mapping=slot_list
            ),
        }
        for label, fn in host.items():
            host_rows.append([name, label, spread(timings_us(fn, args.iters))])
        make_us = statistics.median(timings_us(host["make_batch (numpy in)"], args.iters))

        ops = {
            "update_tokens": (pcp_fn.update_tokens, (state, batch)),
            "get_logits_indices": (pcp_fn.get_logits_indices, (updated,)),
            "padded_slot_mapping": (pcp_fn.padded_slot_mapping, (updated, batch.slot_mapping)),
            "restore_hidden_states": (pcp_fn.restore_hidden_states, (updated, gathered)),
            "attention_metadata": (pcp_fn.attention_metadata, (state, batch)),
            "attention_runs": (pcp_fn.attention_runs, (updated,)),
            "step": (pcp_fn.step, (state, batch)),
            "composed step": (composed, (state, batch, gathered)),
        }
        kernels = {}
        for op, (fn, fargs) in ops.items():
            eager = spread(timings_us(lambda fn=fn, fargs=fargs: fn(*fargs), args.iters))
            kernels[op] = (count_kernels(fn, *on_meta(fargs)), count_kernels(fn, *fargs))
            fused = op in ("update_tokens", "attention_metadata", "step", "composed step")
            ind = (
                "" if args.no_inductor_counts or not fused else "{}+{}".format(*inductor_kernels(fn, *fargs))
            )
            op_rows.append([name, op, eager, kernels[op][0], kernels[op][1], ind])
        torch._dynamo.reset()

        ref = reference_host_path(P, sched, comp, prompt, args.reference)
        paths = {}
        for op in ("step", "composed step"):
            fn, fargs = ops[op]
            for backend in backends:
                if backend == "eager":
                    call = fn
                else:
                    extra = {"package_dir": package_dir} if backend == "aoti" else {}
                    kind = "inductor" if backend == "compile" else backend
                    call = pcp_fn.graph.capture(fn, *fargs, backend=kind, **extra)
                paths[(op, backend)] = functools.partial(call, *fargs)
                if op == "step":
                    paths[("step + restore", backend)] = functools.partial(
                        step_and_restore, call, state, batch, gathered, torch.empty_like(gathered)
                    )
        if ref is not None:
            paths[("reference", "with restore")], paths[("reference", "bookkeeping")] = ref
        timed = interleaved(paths, args.iters)
        for (op, backend), samples in timed.items():
            ratio = ""
            if ref is not None and op != "reference":
                key = "bookkeeping" if op == "step" else "with restore"
                ratio = f"{statistics.median(samples) / statistics.median(timed[('reference', key)]):.2f}"
            path_rows.append([name, f"{op} / {backend}", spread(samples), ratio])
        summary.append((name, kernels, make_us, {k: statistics.median(v) for k, v in timed.items()}))

    tables.table("host boundaries (us, median [p10-p90])", ["batch", "boundary", "us"], host_rows)
    tables.table(
        "ops: eager us (median [p10-p90]), kernel-launching aten ops on a GPU/NPU (dev) and on the CPU, "
        "inductor's CPU kernels (fused+fallback)",
        ["batch", "op", "eager us", "dev", "cpu", "inductor"],
        op_rows,
    )
    tables.table(
        "paths, timed in interleaved rounds (us, median [p10-p90]), and the ratio to the reference "
        "(step: to its bookkeeping; the others: to its path with the restore)",
        ["batch", "path", "us", "/ reference"],
        path_rows,
    )
    rows = []
    for name, kernels, make_us, med in summary:
        both = [a + b for a, b in zip(kernels["update_tokens"], kernels["attention_metadata"])]
        ref = med.get(("reference", "with restore"))
        cells = [name, f"{make_us:.1f}", "{} / {}".format(*kernels["step"]), "{} / {}".format(*both)]
        for op in ("composed step", "step + restore"):
            for backend in backends:
                us = med[(op, backend)]
                cells.append(f"{us:.0f}" + (f" ({us / ref:.2f}x)" if ref else ""))
        rows.append([*cells, f"{ref:.0f}" if ref else ""])
    tables.table(
        "summary (medians, us, the ratio to the reference's path with the restore in brackets; "
        "kernels on a GPU/NPU / on the CPU)",
        ["batch", "make_batch (numpy in)", "step kernels", "update_tokens + attention_metadata kernels"]
        + [f"{op}: {backend}" for op in ("composed step", "step + restore") for backend in backends]
        + ["reference"],
        rows,
    )
    counts = {tuple(k.values()) for _, k, _, _ in summary}
    tables.note(f"Kernel counts {'the same' if len(counts) == 1 else 'NOT the same'} for every batch.")
    tables.write()


if __name__ == "__main__":
    main()
