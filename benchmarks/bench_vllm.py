"""Host time per step of vLLM's MRV2 ``PCPManager`` against ``pcp_fn``'s ``FunctionalPCPManager``.

    python benchmarks/bench_vllm.py [--iters 200] [--replicated] [--moe] [--backend aoti|inductor|none]
                                    [--markdown PATH]

Run it where vLLM is importable (``tools/make_vllm_venv.sh [VENV] [VERSION]``; 0.33.0 / 0.34.0
with ``VLLM_TARGET_DEVICE=cpu``; ``--moe``: both managers with ``moe_gathers_tokens=True``). One step
is what the model runner calls around the forward, under ``torch.inference_mode``
like vLLM's engine (``GPUModelRunner.execute_model``):
``get_num_tokens_for_dispatch(num_scheduled_tokens, is_prefilling_np)`` (to pick
the CUDA graph) + ``partition_batch(global_batch, batch_desc)`` +
``prepare_attn(local)`` + ``restore_for_sampling(hidden, None)`` (``hidden
[Lp, 128]`` float32; the all-gather is a stand-in that returns the ranks' rows
at once). The block tables are a stub that returns its persistent views
(vLLM's are one Triton launch each, the same for both managers), so the
figures are the managers' own work. Rank 0, ``R = 256``, ``T = 8192``, one
thread, medians of ``--iters`` steps, every column's calls interleaved:

    A  P=4  256 decodes of 1 token                      (decode-only)
    B  P=4  64 decodes + fresh prefills of 2048 and 1000 tokens
    C  P=8  255 decodes + one fresh 4096-token prefill
    D  P=4  16 decodes of 1 token                       (a small decode-only batch)

Decode-only batches run with a FULL descriptor, mixed ones PIECEWISE (what
vLLM's dispatcher picks under ``FULL_AND_PIECEWISE``), each padded to the
smallest power of two holding it. Decodes are sharded over the ranks (vLLM's
default without DCP) unless ``--replicated``.

Table 1, the CPU as the device (wall time, ``H = 128``): vLLM's manager; the
adapter with plain eager calls (``graph_backend = None``); the adapter with
``--backend``'s graphs (``aoti``: AOTInductor packages, cached in
``$PCP_FN_CACHE_DIR``, made once per bucket first; its local batch is checked
equal to the eager one's).

Table 2, host time (``H = 1``, so the device work is ~0): vLLM's manager
against the adapter with its graph replay replaced by nothing (on CUDA/NPU it
is one graph launch, not counted, reading the staging buffers in place:
``capture(persistent_inputs=True)``), what a step costs the host on a GPU; and
the adapter's host time by phase: ``dispatch`` (``get_num_tokens_for_dispatch``),
``check`` (the global batch's arrays), ``plan`` (the numpy twin's segments, vLLM's
padded sizes, the step's plan), ``stage`` (staging the per-request arrays, checking
their values, the token ids / positions copies, and the replay call), ``fields``
(the local batch's host fields), ``batch`` (the local ``InputBatch``), ``attn``
(``prepare_attn``: the block tables' stub, the slot-mapping kernel) and
``restore`` (the restore gather).
The phases are timestamps inside one more step run phase by phase among
the others (:func:`phased_step`), so they sum to about the step. The adapter
keeps what a step's schedule decides (the twin, the plan, some host fields)
per distinct schedule; every step here repeats its batch, like a busy
server's decode steps, and ``new`` is the same step with those memos emptied
first (a schedule never seen before: its dispatch computes the twin, which its
partition then reuses). ``recording`` is the adapter recording every step's schedule
(``record_schedule``, ``pcp_fn.adapters.recording``: the arrays copied and queued; its feeder
thread frames them meanwhile and its writer process turns them into JSON lines, as in a server:
``--writer-cpu N`` puts that process on CPU ``N``), timed on the ``adapter``'s own manager with
and without its recorder, so the two differ by the recording alone. ``--markdown PATH``
writes both tables to a markdown fragment too (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
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

from _common import R, T, Tables, add_markdown_option, reference_batches, wall_table  # noqa: E402

H = 128


class StubBlockTables:
    """``BlockTables`` whose kernels cost nothing: the persistent views, untouched."""

    num_kv_cache_groups = 1
    cp_interleave = 1

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.input_block_tables = [torch.zeros(R, 64, dtype=torch.int32, device=device)]
        # its dtype sizes the manager's buffers
        self.slot_mappings = torch.zeros(1, T, dtype=torch.int64, device=device)

    def gather_block_tables(self, idx_mapping, num_reqs_padded, out=None, out_ptrs=None):
        return tuple(t[:num_reqs_padded] for t in out)

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out=None):
        return out[:, :num_tokens_padded]


def batches() -> dict[str, tuple[int, tuple[list[int], list[int], list[int]]]]:
    out = dict(reference_batches())
    out["D"] = (4, ([1] * 16, [500] * 16, [100] * 16))
    return out


def dispatched(Mode: Any, Desc: Any, widest: int, num_reqs: int, prefilling: bool) -> Any:
    """The descriptor vLLM's dispatcher picks under ``FULL_AND_PIECEWISE`` for a batch whose
    largest rank holds ``widest`` tokens: PIECEWISE for a mixed batch, FULL for a decode-only one
    (whose graph must also hold the ``num_reqs`` global requests), padded to a power of two."""
    size = 1 << max(widest - 1, 0).bit_length()
    if prefilling:
        return Desc(cg_mode=Mode.PIECEWISE, num_tokens=size, num_reqs=None)
    size = max(size, 1 << max(num_reqs - 1, 0).bit_length())
    return Desc(cg_mode=Mode.FULL, num_tokens=size, num_reqs=min(size, R))


def one_step(manager: Any, global_batch: Any, desc: Any, hidden: torch.Tensor) -> None:
    """What the model runner asks of the manager around one forward."""
    manager.get_num_tokens_for_dispatch(global_batch.num_scheduled_tokens, global_batch.is_prefilling_np)
    local = manager.partition_batch(global_batch, desc)
    manager.prepare_attn(local)
    manager.restore_for_sampling(hidden, None)


def graph_replayed(manager: Any, step: Any) -> Any:
    """``manager`` (plain calls) with its bookkeeping graphs replaced by what a device graph
    replay costs the host besides its launch: nothing (the graphs read the staging buffers in
    place, ``capture(persistent_inputs=True)``). One real step first writes the persistent
    buffers the replays would. What is left is the host path (numpy twin, staging, host fields,
    the local ``InputBatch``, slot mappings, restores)."""
    step(manager)
    manager.bookkeeper.graphs.runtime.invoke = _no_replay
    return manager


def _no_replay(call: Any, bound: Any) -> None:
    return None


def recorded_step(manager: Any, recorder: Any, step: Any) -> None:
    """``step(manager)`` with ``recorder`` recording its schedule (``None``: not recorded)."""
    manager.bookkeeper.recorder = recorder
    step(manager)


PHASES: dict[str, list[int]] = {}


def new_schedule_step(manager: Any, step: Any) -> None:
    """``step(manager)`` as if its schedule were new: the schedule cache's ``shapes`` and
    ``segments`` tables emptied first, so the host twin, the plan lookup and the shape's host
    fields run again (the views of the buffers by size stay: a new schedule of known sizes)."""
    manager.schedule_cache.forget("shapes", "segments")
    step(manager)


def phased_step(manager: Any, g: Any, desc: Any, hidden: torch.Tensor) -> None:
    """:func:`one_step` of the adapter, its phases called one after the other (what
    ``partition_batch`` calls) with a timestamp between each two, into :data:`PHASES` (ns)."""
    clock, bookkeeper = time.perf_counter_ns, manager.bookkeeper
    td = clock()
    manager.get_num_tokens_for_dispatch(g.num_scheduled_tokens, g.is_prefilling_np)
    t0 = clock()
    arrays = bookkeeper.check(g)
    t1 = clock()
    shape = bookkeeper.plan(arrays[0], arrays[3], desc)
    t2 = clock()
    bookkeeper.graphs.partition(arrays, g.input_ids, g.positions, shape.total, shape.plan)
    t3 = clock()
    fields = bookkeeper.host_fields(g, shape, arrays)
    t4 = clock()
    local = bookkeeper.local_batch(g, fields, shape.fixed)
    t5 = clock()
    manager.prepare_attn(local)
    t6 = clock()
    manager.restore_for_sampling(hidden, None)
    t7 = clock()
    for name, a, b in zip(
        ("dispatch", "check", "plan", "stage", "fields", "batch", "attn", "restore"),
        (td, t0, t1, t2, t3, t4, t5, t6),
        (t0, t1, t2, t3, t4, t5, t6, t7),
    ):
        PHASES.setdefault(name, []).append(b - a)


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
    load (it is shared) hits every column alike, each round in a new random order (seeded): a call
    right after a call of the same code finds the caches warm, so no column may always follow
    the same one (the adapter's ``new`` column, always right after its repeat column, read ~4%
    low against the repeat on the V2 drop-in's batch D)."""
    samples: dict[str, list[int]] = {k: [] for k in fns}
    order = list(fns.items())
    rng = random.Random(0)
    for i in range(warmup + iters):
        rng.shuffle(order)
        for name, fn in order:
            t0 = time.perf_counter_ns()
            fn()
            if i >= warmup:
                samples[name].append(time.perf_counter_ns() - t0)
    return {k: float(np.median(v)) / 1e3 for k, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--replicated", action="store_true", help="replicate decodes on every rank")
    parser.add_argument(
        "--moe",
        action="store_true",
        help="moe_gathers_tokens=True (vLLM 0.33+: the gathered MoE padding mask)",
    )
    parser.add_argument(
        "--backend",
        default="aoti",
        help="the adapter's graphs in table 1: aoti (default), inductor, or none to skip the column",
    )
    parser.add_argument(
        "--writer-cpu",
        type=int,
        default=None,
        help="run the recording's writer process on this CPU (default: the CPUs this process may use)",
    )
    add_markdown_option(parser)
    args = parser.parse_args()
    tables = Tables(args.markdown)
    torch.set_num_threads(1)

    try:
        import vllm
        from vllm.config.compilation import CUDAGraphMode
        from vllm.distributed import parallel_state
        from vllm.v1.worker.gpu import pcp_manager as vllm_pcp
        from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
        from vllm.v1.worker.gpu.input_batch import InputBatch
    except ImportError as e:
        sys.exit(f"bench_vllm needs vLLM (tools/make_vllm_venv.sh): {e}")
    tables.versions["vLLM"] = vllm.__version__
    import vllm_standin
    from vllm_lockstep import GlobalStep, make_global_batch

    from pcp_fn.adapters.vllm import FunctionalPCPManager

    group = vllm_standin.FakePCPGroup()
    vllm_pcp.get_pcp_group = lambda: group
    parallel_state.get_pcp_group = lambda: group
    api = SimpleNamespace(InputBatch=InputBatch)
    shard = not args.replicated
    backend = None if args.backend.lower() == "none" else args.backend
    plain = type("Plain", (FunctionalPCPManager,), {"graph_backend": None})
    graphs = type("Graphs", (FunctionalPCPManager,), {"graph_backend": backend})

    load = os.getloadavg()[0]
    print(
        f"one step = get_num_tokens_for_dispatch + partition_batch + prepare_attn + restore_for_sampling "
        f"under inference_mode; R={R}, "
        f"T={T}, rank 0, {'sharded' if shard else 'replicated'} decodes; median us of {args.iters} "
        f"interleaved steps; load average {load:.2f} at the start, {os.cpu_count()} CPUs"
    )
    rows1, rows2, notes = [], [], []
    scratch = tempfile.mkdtemp(prefix="bench_vllm-")  # the recordings, removed at the end
    phases = ("dispatch", "check", "plan", "stage", "fields", "batch", "attn", "restore")
    for name, (P, (sched, comp, plen)) in batches().items():
        n = len(sched)
        step = GlobalStep(
            list(range(n)), list(range(n)), sched, comp, plen, [0] * n, [[1] * s for s in sched]
        )
        kw = dict(pcp_world_size=P, pcp_rank=0, device=torch.device("cpu"), shard_decode_requests=shard)
        kw.update(max_num_reqs=R, max_num_tokens=T, block_tables=StubBlockTables())
        if args.moe:
            kw["moe_gathers_tokens"] = True
        ref = vllm_pcp.PCPManager(**kw)
        prefilling = np.minimum(comp, plen) < np.array(plen)
        widest = ref.get_num_tokens_for_dispatch(np.array(sched, np.int32), prefilling)
        desc = dispatched(CUDAGraphMode, BatchExecutionDescriptor, widest, n, bool(prefilling.any()))
        g = make_global_batch(api, step, desc, list(range(n)), torch.device("cpu"))
        wide = [torch.randn(desc.num_tokens, H) for _ in range(P)]
        narrow = [torch.randn(desc.num_tokens, 1) for _ in range(P)]  # host view: the gathers cost ~0
        group.stage(wide)
        group.stage(narrow)
        mode = f"{desc.cg_mode.name}({desc.num_tokens})"
        with torch.inference_mode():
            step_of = functools.partial(one_step, global_batch=g, desc=desc, hidden=wide[0])
            host_step_of = functools.partial(one_step, global_batch=g, desc=desc, hidden=narrow[0])
            eager = plain(**kw)
            wall = {"vLLM": functools.partial(step_of, ref), "eager": functools.partial(step_of, eager)}
            if backend is not None:
                t0 = time.perf_counter()
                fast = graphs(**kw)  # every graph of the ladder, made (or loaded) at construction
                notes.append(
                    f"{name}: {fast.graph_stats.prepared} {backend} graphs ready in "
                    f"{time.perf_counter() - t0:.1f} s ({fast.graph_stats.loaded} loaded)"
                )
                same_local_batch(fast.partition_batch(g, desc), eager.partition_batch(g, desc))
                wall[backend] = functools.partial(step_of, fast)
            t = interleaved_medians(wall, args.iters)
            rows1.append((name, P, mode, t))

            host = graph_replayed(plain(**kw), host_step_of)
            fresh = graph_replayed(plain(**kw), host_step_of)
            trace = os.path.join(scratch, f"{name}.jsonl")
            # the recorder of a manager built to record; its steps are the host manager's, with and
            # without it: one instance's buffers and memos, so only the recording differs
            recorder = plain(**kw, record_schedule=trace).bookkeeper.recorder
            if args.writer_cpu is not None:  # a server's writer runs beside the serving thread
                os.sched_setaffinity(recorder.writer_pid, {args.writer_cpu})
            fns = {
                "vLLM": functools.partial(host_step_of, ref),
                "adapter": functools.partial(recorded_step, host, None, host_step_of),
                "recording": functools.partial(recorded_step, host, recorder, host_step_of),
                "new": functools.partial(new_schedule_step, fresh, host_step_of),
                "vLLM dispatch": functools.partial(
                    ref.get_num_tokens_for_dispatch, g.num_scheduled_tokens, g.is_prefilling_np
                ),
                "vLLM partition": functools.partial(ref.partition_batch, g, desc),
                "phases": functools.partial(phased_step, host, g, desc, narrow[0]),
            }
            PHASES.clear()
            rows2.append((name, P, mode, interleaved_medians(fns, args.iters)))
            recorder.close()
            if recorder.stats.stopped is not None:
                notes.append(f"{name}: the recording stopped: {recorder.stats.stopped}")
            rows2[-1][3].update({k: float(np.median(v[10:])) / 1e3 for k, v in PHASES.items()})

    cols = ["vLLM", "eager"] + ([backend] if backend else [])
    tables.table(
        f"1. the CPU as the device, H={H}: wall time per step (us), and the ratio to vLLM's",
        *wall_table(rows1, cols, "descriptor"),
    )
    tables.table(
        "2. host time per step (us), H=1, the adapter's graph replay not counted; the adapter's phases "
        "(us, the repeated step); vLLM's own get_num_tokens_for_dispatch and partition_batch",
        ["batch", "P", "descriptor", "vLLM us", "adapter us", "adapter / vLLM", "new us", "new / vLLM"]
        + ["recording us", "recording / adapter"]
        + [f"{p} us" for p in phases]
        + ["vLLM dispatch us", "vLLM partition us"],
        [
            [name, P, mode, f"{t['vLLM']:.0f}", f"{t['adapter']:.0f}", f"{t['adapter'] / t['vLLM']:.2f}"]
            + [f"{t['new']:.0f}", f"{t['new'] / t['vLLM']:.2f}"]
            + [f"{t['recording']:.0f}", f"{t['recording'] / t['adapter']:.3f}"]
            + [f"{t[p]:.1f}" for p in phases]
            + [f"{t['vLLM dispatch']:.0f}", f"{t['vLLM partition']:.0f}"]
            for name, P, mode, t in rows2
        ],
    )
    if notes:
        tables.note("; ".join(notes) + ".")
    shutil.rmtree(scratch)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    tables.write()


if __name__ == "__main__":
    main()
