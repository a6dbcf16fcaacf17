"""Host time per step of vLLM's MRV2 ``PCPManager`` against ``pcp_fn``'s ``FunctionalPCPManager``.

    python benchmarks/bench_vllm.py [--iters 100] [--replicated] [--no-compile]

Run it where vLLM 0.32.0 is importable (``tools/make_vllm_venv.sh``). One step
is what the model runner calls around the forward:
``partition_batch(global_batch, batch_desc)`` + ``prepare_attn(local)`` +
``restore_for_sampling(hidden, None)`` (``hidden [Lp, 128]`` float32; the
all-gather is a stand-in that returns the ranks' rows at once). The block
tables are a stub that returns its persistent views (vLLM's are one Triton
launch each, the same for both managers), so the figures are the managers'
own work. Rank 0, ``R = 256``, ``T = 8192``, one thread, median of ``--iters``:

    A  P=4  256 decodes of 1 token                      (decode-only)
    B  P=4  64 decodes + fresh prefills of 2048 and 1000 tokens
    C  P=8  255 decodes + one fresh 4096-token prefill
    D  P=4  16 decodes of 1 token                       (a small decode-only batch)

Decode-only batches run with a FULL descriptor, mixed ones PIECEWISE (what
vLLM's dispatcher picks under ``FULL_AND_PIECEWISE``), each padded to the
smallest power of two holding it. Decodes are sharded over the ranks (vLLM's
default without DCP) unless ``--replicated``.

Columns: vLLM's manager; the adapter with plain eager calls (``graph_backend
= None``); the adapter with the bookkeeping compiled by inductor (the CPU
stand-in for graph capture: one compile per bucket, first; its local batch is
checked equal to the eager one's); and the adapter's host part alone (numpy
twin, staging, the copies of the graph's inputs into its static buffers, the
host fields and the local ``InputBatch``, the slot-mapping conversion and the
restore), which is what a step costs the host on a GPU, where the rest is one
graph launch (not counted) and the kernels of the slot mappings and restore.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import R, T, reference_batches  # noqa: E402

H = 128


class StubBlockTables:
    """``BlockTables`` whose kernels cost nothing: the persistent views, untouched."""

    num_kv_cache_groups = 1
    cp_interleave = 1

    def __init__(self) -> None:
        self.input_block_tables = [torch.zeros(R, 64, dtype=torch.int32)]
        self.slot_mappings = torch.zeros(1, T, dtype=torch.int64)  # its dtype sizes the manager's buffers

    def gather_block_tables(self, idx_mapping, num_reqs_padded, out=None, out_ptrs=None):
        return tuple(t[:num_reqs_padded] for t in out)

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out=None):
        return out[:, :num_tokens_padded]


def batches() -> dict[str, tuple[int, tuple[list[int], list[int], list[int]]]]:
    out = dict(reference_batches())
    out["D"] = (4, ([1] * 16, [500] * 16, [100] * 16))
    return out


def one_step(manager: Any, global_batch: Any, desc: Any, hidden: torch.Tensor) -> None:
    """What the model runner asks of the manager around one forward."""
    local = manager.partition_batch(global_batch, desc)
    manager.prepare_attn(local)
    manager.restore_for_sampling(hidden, None)


def graph_replayed(manager: Any, step: Any) -> Any:
    """``manager`` with its bookkeeping graph replaced by what a device graph replay costs the
    host besides the launch: the copies of the graph's inputs into its static buffers
    (``pcp_fn.graph.capture`` on CUDA/NPU), then the outputs of the first run (which wrote the
    persistent buffers). What is left is the host path (numpy twin, staging, host fields, the
    local ``InputBatch``, slot mappings, restores)."""
    run, seen = manager._fn_pcp._run, {}
    manager._fn_pcp._run = lambda g: seen.setdefault("out", run(g))
    step(manager)
    statics: dict[int, list[torch.Tensor]] = {}

    def replay(g: Any) -> Any:
        dst = statics.get(id(g))
        if dst is None:
            dst = statics[id(g)] = [a.clone() for a in g.args]
        torch._foreach_copy_(dst, list(g.args))
        return seen["out"]

    manager._fn_pcp._run = replay
    return manager


def same_local_batch(a: Any, b: Any) -> None:
    """Two managers' local batches hold the same values (the compiled one checked against eager)."""
    for name, x in vars(a).items():
        y = getattr(b, name)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), name
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y), name


def interleaved_medians(fns: dict[str, Any], iters: int, warmup: int = 10) -> dict[str, float]:
    """Median microseconds of each ``fn()``, the calls interleaved so that a change in the machine's
    load (it is shared) hits every column alike."""
    samples: dict[str, list[int]] = {k: [] for k in fns}
    for i in range(warmup + iters):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            if i >= warmup:
                samples[name].append(time.perf_counter_ns() - t0)
    return {k: float(np.median(v)) / 1e3 for k, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--replicated", action="store_true", help="replicate decodes on every rank")
    parser.add_argument("--no-compile", action="store_true", help="skip the inductor column")
    args = parser.parse_args()
    torch.set_num_threads(1)

    try:
        from vllm.config.compilation import CUDAGraphMode
        from vllm.distributed import parallel_state
        from vllm.v1.worker.gpu import pcp_manager as vllm_pcp
        from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
        from vllm.v1.worker.gpu.input_batch import InputBatch
    except ImportError as e:
        sys.exit(f"bench_vllm needs vLLM 0.32.0 (tools/make_vllm_venv.sh): {e}")
    import vllm_standin
    from vllm_lockstep import GlobalStep, make_global_batch

    from pcp_fn.adapters.vllm import FunctionalPCPManager

    group = vllm_standin.FakePCPGroup()
    vllm_pcp.get_pcp_group = lambda: group
    parallel_state.get_pcp_group = lambda: group
    api = SimpleNamespace(InputBatch=InputBatch)
    shard = not args.replicated
    plain = type("Plain", (FunctionalPCPManager,), {"graph_backend": None})
    compiled = type("Compiled", (FunctionalPCPManager,), {"graph_backend": "inductor"})

    print(
        f"one step = partition_batch + prepare_attn + restore_for_sampling; R={R}, T={T}, H={H}, rank 0, "
        f"{'sharded' if shard else 'replicated'} decodes; median us over {args.iters} steps"
    )
    head = f"{'batch':5} {'P':>2} {'desc':>15} | {'vLLM':>6} {'eager':>6} {'inductor':>8} "
    head += f"| {'vLLM':>6} {'adapter':>7} {'adapter/vLLM':>12}"
    print(f"{'':25}| CPU as the device, H={H:<13}| host time (H=1, graph replayed)")
    print(head)
    for name, (P, (sched, comp, plen)) in batches().items():
        n = len(sched)
        step = GlobalStep(
            list(range(n)), list(range(n)), sched, comp, plen, [0] * n, [[1] * s for s in sched]
        )
        kw = dict(pcp_world_size=P, pcp_rank=0, device=torch.device("cpu"), shard_decode_requests=shard)
        kw.update(max_num_reqs=R, max_num_tokens=T, block_tables=StubBlockTables())
        ref = vllm_pcp.PCPManager(**kw)
        prefilling = np.minimum(comp, plen) < np.array(plen)
        widest = ref.get_num_tokens_for_dispatch(np.array(sched, np.int32), prefilling)
        size = 1 << max(widest - 1, 0).bit_length()
        if prefilling.any():
            desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=size, num_reqs=None)
        else:  # a FULL graph must hold the global requests: min(size, R) >= n
            size = max(size, 1 << max(n - 1, 0).bit_length())
            desc = BatchExecutionDescriptor(
                cg_mode=CUDAGraphMode.FULL, num_tokens=size, num_reqs=min(size, R)
            )
        g = make_global_batch(api, step, desc, list(range(n)), torch.device("cpu"))
        wide = [torch.randn(desc.num_tokens, H) for _ in range(P)]
        narrow = [torch.randn(desc.num_tokens, 1) for _ in range(P)]  # host view: the gathers cost ~0
        group.stage(wide)
        group.stage(narrow)
        step_of = functools.partial(one_step, global_batch=g, desc=desc, hidden=wide[0])
        host_step_of = functools.partial(one_step, global_batch=g, desc=desc, hidden=narrow[0])
        fns = {"vLLM": functools.partial(step_of, ref), "eager": functools.partial(step_of, plain(**kw))}
        fns["vLLM host"] = functools.partial(host_step_of, ref)
        fns["host"] = functools.partial(host_step_of, graph_replayed(plain(**kw), host_step_of))
        compile_s = float("nan")
        if not args.no_compile:
            fast = compiled(**kw)
            fns["inductor"] = functools.partial(step_of, fast)
            t0 = time.perf_counter()
            fns["inductor"]()  # compiles this bucket
            compile_s = time.perf_counter() - t0
            same_local_batch(fast.partition_batch(g, desc), plain(**kw).partition_batch(g, desc))
        timings = interleaved_medians(fns, args.iters)
        timings.setdefault("inductor", float("nan"))
        t = timings
        mode = f"{desc.cg_mode.name}({desc.num_tokens})"
        line = f"{name:5} {P:>2} {mode:>15} | {t['vLLM']:6.0f} {t['eager']:6.0f} {t['inductor']:8.0f} "
        line += f"| {t['vLLM host']:6.0f} {t['host']:7.0f} {t['host'] / t['vLLM host']:12.2f}"
        if not args.no_compile:
            line += f"   (inductor compile {compile_s:.0f} s)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
