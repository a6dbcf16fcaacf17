"""attention_metadata timings against the reference's host generate_pcp_metadata.

    python benchmarks/bench_attention.py [--iters 200] [--no-compile] [--reference PATH]
                                         [--markdown PATH]

Batches (rank 0, max_num_reqs R = 256):

    a  P=4, T=8192   64 decodes (500 computed, 100-token prompt) + fresh prefills of 2048 and 1000
    b  P=8, T=16384  one fresh 16384-token prefill

For each it prints the median microseconds of ``pcp_fn.attention_metadata``
eager, through ``torch.compile`` and through ``graph.capture(backend="aoti")``
on the CPU (one thread), its kernel-launching aten ops as a GPU/NPU dispatches
them (``dev``, counted on meta tensors) and as the CPU does (``cpu``), and
inductor's CPU kernels (``fused+fallback``); and, when the vllm-ascend
reference is found (``--reference``, or ``tools/reference.py``), the median of its
host ``generate_pcp_metadata`` for the same step (after ``init_batch_info`` +
``update_tokens_for_pcp``, as the runner calls it) with each path's ratio to it.
Issue 5's targets: compiled <= 0.1x the reference for (a), <= 0.05x for (b). The tables are
printed (``--markdown PATH`` writes them to a markdown fragment too: ``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _common import (  # noqa: E402
    R,
    Tables,
    add_markdown_option,
    cpu_options,
    inductor_kernels,
    median_us,
    reference_loader_or_none,
)
from bench_core import on_meta  # noqa: E402

import pcp_fn  # noqa: E402
from pcp_fn.graph import count_kernels  # noqa: E402

TARGETS = {"a": 0.1, "b": 0.05}


def batches():
    dec = 64
    a = ([1] * dec + [2048, 1000], [500] * dec + [0, 0], [100] * dec + [2048, 1000])
    b = ([16384], [0], [16384])
    return {"a": (4, 8192, a), "b": (8, 16384, b)}


def reference_generate_pcp_metadata(P, T, sched, comp, prompt, iters, reference_path):
    """Median us of the reference's generate_pcp_metadata, or None without the reference file."""
    reference_loader = reference_loader_or_none(reference_path)
    if reference_loader is None:
        return None

    class _Metadata:  # stand-in for vllm_ascend.attention.utils.AscendPrefillContextParallelMetadata
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    reference_loader._module("vllm_ascend.attention")
    reference_loader._module("vllm_ascend.attention.utils", AscendPrefillContextParallelMetadata=_Metadata)
    m = reference_loader.make_manager(P, 0, R, T)
    sched = np.asarray(sched, np.int32)
    comp = np.asarray(comp, np.int32)
    prompt = np.asarray(prompt, np.int32)
    n = sched.size
    m.init_batch_info(sched, n, comp, prompt)
    arange = np.arange(T * P + 2 * P * R, dtype=np.int64)
    local, _ = m.update_tokens_for_pcp(sched.copy(), arange)
    local = np.asarray(local, np.int32).copy()  # the runner's num_scheduled_tokens after the split
    query_lens = torch.from_numpy(local)
    input_batch = SimpleNamespace(num_computed_tokens_cpu=comp)
    block_table = torch.zeros((n, 1), dtype=torch.int32)
    total = int(local.sum())

    def run():
        m.generate_pcp_metadata(total, query_lens, input_batch, local, block_table, n, n)

    return median_us(run, iters)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-compile", action="store_true", help="skip the inductor timings")
    ap.add_argument(
        "--reference", default=None, help="path of the vllm-ascend pcp_utils reference (the host path)"
    )
    add_markdown_option(ap)
    args = ap.parse_args()
    tables = Tables(args.markdown)
    torch.set_num_threads(1)
    kernel_rows, rows = [], []
    for name, (P, T, (sched, comp, prompt)) in batches().items():
        cfg = pcp_fn.PCPConfig(P, 0, R, T)
        state = pcp_fn.init_state(cfg)
        batch = pcp_fn.make_batch(cfg, sched, comp, prompt)
        op = pcp_fn.attention_metadata
        paths = {"eager": op}
        if not args.no_compile:
            torch._dynamo.reset()
            options = cpu_options((state, batch))
            paths["compile"] = torch.compile(op, fullgraph=True, dynamic=False, options=options)
            paths["aoti"] = pcp_fn.graph.capture(op, state, batch, backend="aoti")
        dev, cpu = count_kernels(op, *on_meta((state, batch))), count_kernels(op, state, batch)
        fused = "" if args.no_compile else "{}+{}".format(*inductor_kernels(op, state, batch))
        print(f"batch {name}: P={P}, T={T}, {len(sched)} requests, bucket {batch.bucket}", flush=True)
        kernel_rows.append([name, P, T, len(sched), dev, cpu, fused])
        reference_us = reference_generate_pcp_metadata(P, T, sched, comp, prompt, args.iters, args.reference)
        for label, fn in paths.items():
            us = median_us(lambda fn=fn, state=state, batch=batch: fn(state, batch), args.iters)
            ratio = "" if reference_us is None else f"{us / reference_us:.3f}"
            rows.append([name, label, f"{us:.1f}", ratio])
        if reference_us is not None:
            rows.append([name, "reference generate_pcp_metadata", f"{reference_us:.1f}", None])
    tables.table(
        "attention_metadata's kernel-launching aten ops on a GPU/NPU (dev) and on the CPU, inductor's CPU "
        "kernels (fused+fallback)",
        ["batch", "P", "T", "requests", "dev", "cpu", "inductor"],
        kernel_rows,
    )
    tables.table(
        "attention_metadata (median us) and its ratio to vllm-ascend's host generate_pcp_metadata "
        f"(targets for compiled: a <= {TARGETS['a']}, b <= {TARGETS['b']})",
        ["batch", "path", "us", "/ reference"],
        rows,
    )
    tables.write()


if __name__ == "__main__":
    main()
