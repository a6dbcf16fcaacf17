"""The vLLM drop-in on a GPU: host time per step, device time per step, the kernels a step runs.

    python benchmarks/bench_adapter_device.py [--device cuda] [--iters 200] [--batches ABCD] [--markdown PATH]

For a machine without vLLM (the GPU machines this project is lent have none):
``FunctionalPCPManager`` built over the test stand-in of the vLLM classes it
touches (``tests/vllm_standin.py``: vLLM 0.32.0's ``InputBatch`` and
``InputBuffers``, field for field), with its default graph backend (``auto``:
on CUDA every rung of the graph ladder captured in a CUDA graph while the
manager is constructed). One step is :func:`bench_vllm.one_step`, what vLLM's
``GPUModelRunner.execute_model`` asks of the manager:
``get_num_tokens_for_dispatch`` + ``partition_batch`` + ``prepare_attn`` +
``restore_for_sampling`` (``hidden [Lp, 128]``; ``[Lp, 1]`` on the CPU). The batches are
``bench_vllm.py``'s A-D (rank 0, ``R = 256``, ``T = 8192``); the block
tables are a stub on the device whose kernels cost nothing (vLLM's are one
Triton launch each, the same for either manager).

Per batch, medians of ``--iters`` steps:

- ``host us``: wall time until the step's calls return. The device work is
  queued, not waited for (the step is sync-free; the device is synchronised
  between steps, outside the timing): what a step costs the host, the figure
  ``bench_vllm.py`` measures on the CPU against vLLM's manager.
- ``device us``: CUDA events around the step: the staging copies, the graph
  replay, the slot-mapping and restore gathers.
- ``kernels``: CUDA kernels the profiler sees in one step (the graph's kernels
  counted one by one where the profiler can see into graphs).
- the host time by phase (:func:`bench_vllm.phased_step`);
- ``recording host us``: the host time of the same step on the same manager recording its
  schedule (the recorder of a manager built with ``record_schedule=``,
  ``pcp_fn.adapters.recording``; its feeder thread and writer process running meanwhile),
  timed in turn with the unrecorded step, and the ratio of the two.

Without a GPU (``--device cpu``) the same runs with the graph replay replaced
by nothing (:func:`bench_vllm.graph_replayed`), the host time ``bench_vllm.py``
reports; the device columns are empty. ``--markdown PATH`` writes the table to a markdown
fragment too (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import bench_vllm  # noqa: E402
import vllm_standin as standin  # noqa: E402
from _common import R, T, Tables, add_markdown_option  # noqa: E402
from vllm_lockstep import GlobalStep, make_global_batch  # noqa: E402

from pcp_fn.adapters.vllm import VllmApi, make_functional_manager  # noqa: E402
from pcp_fn.adapters.vllm.graphs import HostSegments  # noqa: E402

H = 128
PHASES = ("dispatch", "check", "plan", "stage", "fields", "batch", "attn", "restore")


def descriptor(P: int, sched: list[int], comp: list[int], plen: list[int]) -> Any:
    """The descriptor ``bench_vllm.py`` gives the batch (:func:`bench_vllm.dispatched`), its
    largest rank from the host twin (vLLM's ``get_num_tokens_for_dispatch`` is not here)."""
    host = HostSegments(
        P, 0, shard_decode_requests=True, dcp_size=1, dcp_rank=0, cp_kv_cache_interleave_size=1
    )
    prefilling = np.minimum(comp, plen) < np.array(plen)
    widest = int(host.segments(np.array(sched, np.int32), prefilling).per_rank_num_tokens.max())
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    return bench_vllm.dispatched(Mode, Desc, widest, len(sched), bool(prefilling.any()))


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--batches", default="ABCD", help="which of bench_vllm.py's batches")
    add_markdown_option(parser)
    args = parser.parse_args()
    tables = Tables(args.markdown)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.set_num_threads(1)
    api = SimpleNamespace(InputBatch=standin.InputBatch)
    Manager = make_functional_manager(VllmApi(**standin.vllm_api_fields()))
    group = standin.PCP_GROUP
    if cuda:
        tables.versions["GPU"] = torch.cuda.get_device_name()
    title = (
        f"FunctionalPCPManager over the vLLM stand-in on {device} "
        f"({'' if cuda else 'no GPU: graph replays replaced by nothing; '}graph backend "
        f"{Manager.graph_backend!r}); R={R}, T={T}, rank 0, median of {args.iters} steps"
    )
    rows = []
    scratch = tempfile.mkdtemp(prefix="bench_adapter_device-")  # the recordings, removed at the end
    for name, (P, (sched, comp, plen)) in bench_vllm.batches().items():
        if name not in args.batches:
            continue
        n = len(sched)
        step = GlobalStep(
            list(range(n)), list(range(n)), sched, comp, plen, [0] * n, [[1] * s for s in sched]
        )
        desc = descriptor(P, sched, comp, plen)
        g = make_global_batch(api, step, desc, list(range(n)), device)
        width = H if cuda else 1  # the CPU's host view: its gathers cost ~0 (bench_vllm.py's table 2)
        hidden = [torch.randn(desc.num_tokens, width, device=device) for _ in range(P)]
        group.stage(hidden)
        kw = dict(pcp_world_size=P, pcp_rank=0, device=device, shard_decode_requests=True)
        kw.update(max_num_reqs=R, max_num_tokens=T)
        t0 = time.perf_counter()
        manager = Manager(**kw, block_tables=bench_vllm.StubBlockTables(device))
        made = time.perf_counter() - t0
        recorder = Manager(  # its recorder records the steps of `manager`: one instance, with and without
            **kw,
            block_tables=bench_vllm.StubBlockTables(device),
            record_schedule=os.path.join(scratch, f"{name}.jsonl"),
        ).bookkeeper.recorder
        one_of = functools.partial(bench_vllm.one_step, global_batch=g, desc=desc, hidden=hidden[0])
        one = functools.partial(bench_vllm.recorded_step, manager, None, one_of)
        one_recorded = functools.partial(bench_vllm.recorded_step, manager, recorder, one_of)
        host_us, device_us, recorded_us, kernels = [], [], [], None
        with torch.inference_mode():
            if not cuda:  # the host path alone (bench_vllm.py's table 2)
                step_of = functools.partial(bench_vllm.one_step, global_batch=g, desc=desc, hidden=hidden[0])
                bench_vllm.graph_replayed(manager, step_of)
            for _ in range(10):
                one()
                one_recorded()
            sync = torch.cuda.synchronize if cuda else (lambda: None)
            sync()
            bench_vllm.PHASES.clear()
            for _ in range(args.iters):
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                t0 = time.perf_counter_ns()
                one()
                host_us.append((time.perf_counter_ns() - t0) / 1e3)
                if cuda:
                    end.record()
                    end.synchronize()
                    device_us.append(start.elapsed_time(end) * 1e3)
                manager.bookkeeper.recorder = None
                bench_vllm.phased_step(manager, g, desc, hidden[0])
                sync()
                t0 = time.perf_counter_ns()
                one_recorded()
                recorded_us.append((time.perf_counter_ns() - t0) / 1e3)
                sync()
            if cuda:
                from torch.profiler import ProfilerActivity, profile

                try:
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        one()
                        sync()
                    cuda_kind = torch.autograd.DeviceType.CUDA
                    kernels = sum(1 for e in prof.events() if e.device_type == cuda_kind)
                except Exception as e:  # a profiler that cannot see here: say so, do not fail
                    print(f"  (profiler: {type(e).__name__}: {e})")
        recorder.close()
        stopped = recorder.stats.stopped
        if stopped is not None:
            print(f"  (batch {name}: the recording stopped: {stopped})")
        stats = manager.graph_stats
        phases = " / ".join(f"{k} {median_us(bench_vllm.PHASES[k]) / 1e3:.1f}" for k in PHASES)
        print(f"batch {name} done", flush=True)
        device_median = f"{median_us(device_us):.1f}" if device_us else None
        rows.append(
            [name, P, f"{desc.cg_mode.name}({desc.num_tokens})", f"{stats.prepared} ({made:.1f})"]
            + [f"{median_us(host_us):.1f}", device_median, kernels, phases]
            + [f"{median_us(recorded_us):.1f}", f"{median_us(recorded_us) / median_us(host_us):.3f}"]
        )
        assert stats.fallbacks == 0, f"{name}: a step ran without its graph ({stats})"
        group.clear()
    tables.table(
        title,
        ["batch", "P", "descriptor", "graphs made (s)", "host us", "device us", "kernels"]
        + ["host by phase (us)", "recording host us", "recording / host"],
        rows,
    )
    shutil.rmtree(scratch)
    tables.write()


if __name__ == "__main__":
    main()
