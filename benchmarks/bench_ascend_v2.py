"""Host time per step of vllm-ascend main's V2 ``AscendPCPManager`` against ``FunctionalAscendPCPManager``.

    PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER=/path/vllm_ascend_v2_pcp_manager.txt \\
        .vllm-venv/bin/python benchmarks/bench_ascend_v2.py [--iters 300] [--no-aoti] [--classes A,B,C,D,E]
                                                             [--markdown PATH]

The reference, vllm-ascend main's ``vllm_ascend/worker/v2/pcp_manager.py``, is
not in the repository: without ``PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER``
(``tools/reference.py``) this prints that it is skipped and exits 0. It is
loaded as ``tools/check_ascend_v2_manager_against_reference.py`` loads it
(``load_reference``): executed over vLLM 0.32.0's real ``PCPManager``, the
stand-ins replacing only framework plumbing. Run it with the vLLM venv.

One step is what vllm-ascend's V2 runner asks of the manager around one forward,
under ``torch.inference_mode``: ``get_num_tokens_for_dispatch(num_scheduled_tokens,
is_prefilling_np)`` (the runner's graph dispatch), ``partition_batch(input_batch,
padded_num_tokens, padded_num_reqs)``, ``prepare_attn(local)`` (its ``prepare_slot_mappings``),
``build_attention_context(local, block_tables, slot_mappings)`` (the model
state's attention metadata reads it) and ``restore_for_sampling(hidden, None)``.
The config's ``cudagraph_mode`` is ``FULL_DECODE_ONLY`` (the only full mode
vllm-ascend's PCP accepts): a decode-only batch is padded to the smallest
power-of-two graph holding it, with vllm-ascend's FIA query padding; a mixed
batch runs eager (``padded_num_tokens=None``). Decodes are replicated on every
rank (vllm-ascend's base). Rank 0, ``R = 256``, ``T = 8192``, one thread; the
all-gather is the check tool's one-process group (it returns the ranks' rows at
once); the block tables are ``bench_vllm``'s stub (their kernels are the same
for both managers, so the figures are the managers' own work) with
vllm-ascend's int32 slot mappings; ``build_attn_state`` is vllm-ascend's
arithmetic (two numpy tests), the same function for both. Batches are
``bench_vllm``'s A-D and one more:

    A  P=4  256 decodes of 1 token                      FULL_DECODE_ONLY(256)
    B  P=4  64 decodes + fresh prefills of 2048 and 1000 tokens   eager
    C  P=8  255 decodes + one fresh 4096-token prefill            eager
    D  P=4  16 decodes of 1 token                       FULL_DECODE_ONLY(16)
    E  P=4  200 decodes of 1 token                      FULL_DECODE_ONLY(256): padded to the graph

Before timing, each class's step is run once by every column and checked equal
to the reference's (the local batch's every field, block tables, slot
mappings, the attention context, the restored rows).

Table 1, the CPU as the device (wall time, ``H = 128``): the reference; the
adapter with plain calls (``graph_backend = None``); the adapter under
``PCP_FN_GRAPH_BACKEND=aoti`` (AOTInductor packages made or loaded at
construction, cached under ``$PCP_FN_CACHE_DIR``; ``--no-aoti`` skips them).

Table 2, host time (``H = 1``): the reference against the adapter with its
graph replay counted as nothing (``bench_vllm.graph_replayed``: on an NPU it is
one graph launch reading the staging buffers in place); ``new`` is the same
step with the adapter's schedule memos emptied first (a schedule never seen
before); then the adapter's step by phase (us): ``dispatch``
(``get_num_tokens_for_dispatch``), the vLLM adapter's ``partition_batch`` phases
(``check``, ``plan``, ``stage``, ``fields``, ``batch``: see ``bench_vllm.py``),
``ascend`` (what the drop-in adds to ``partition_batch``: the graph padding,
``seq_lens_np``, ``attn_state``),
``attn`` (``prepare_attn``), ``ctx`` (``build_attention_context``) and
``restore``. Every column's calls are interleaved (``bench_vllm.interleaved_medians``). ``--markdown PATH``
writes both tables to a markdown fragment too (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import warnings
from types import SimpleNamespace
from typing import Any

try:
    import numpy as np
    import torch
except ImportError:  # main() says the benchmark is skipped, and why
    np = torch = None  # type: ignore[assignment]

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

from _common import Tables, add_markdown_option, wall_table  # noqa: E402
from reference import reference_path  # noqa: E402

REF = "vllm_ascend_v2_pcp_manager"
PHASES = ("dispatch", "check", "plan", "stage", "fields", "batch", "ascend", "attn", "ctx", "restore")


def attn_state_of(vllm_config, seq_lens_np, num_reqs, num_scheduled_tokens, num_valid_tokens) -> str:
    """vllm-ascend's ``build_attn_state`` arithmetic for a generating model (its enum as a name)."""
    if np.array_equal(seq_lens_np[:num_reqs], num_scheduled_tokens):
        return "PrefillNoCache"
    if np.all(num_scheduled_tokens == 1):
        return "DecodeOnly"
    return "ChunkedPrefill"


_ATTN_STATE = [attn_state_of]


def build_attn_state(*args: Any) -> Any:
    """The ``build_attn_state`` both managers call: the lockstep's record of its arguments for the
    equality check, vllm-ascend's arithmetic (:func:`attn_state_of`) for the timings."""
    return _ATTN_STATE[0](*args)


def batches() -> dict[str, tuple[int, tuple[list[int], list[int], list[int]]]]:
    import bench_vllm

    out = bench_vllm.batches()
    out["E"] = (4, ([1] * 200, [500] * 200, [100] * 200))
    return out


def phased_class(adapter: type) -> tuple[type, list[tuple[str, int]]]:
    """``adapter`` with a timestamp at the entry and exit of each of the vLLM adapter's
    ``partition_batch`` phases (into the returned list)."""
    marks: list[tuple[str, int]] = []
    clock = time.perf_counter_ns

    class PhasedBookkeeper(adapter.bookkeeper_cls):  # type: ignore[misc,name-defined]
        def check(self, g):
            marks.append(("check", clock()))
            return super().check(g)

        def plan(self, *args):
            marks.append(("plan", clock()))
            out = super().plan(*args)
            marks.append(("stage", clock()))
            return out

        def host_fields(self, *args):
            marks.append(("fields", clock()))
            return super().host_fields(*args)

        def local_batch(self, *args):
            marks.append(("batch", clock()))
            out = super().local_batch(*args)
            marks.append(("batch end", clock()))
            return out

    return type("Phased", (adapter,), {"bookkeeper_cls": PhasedBookkeeper}), marks


def one_step(m: Any, g: Any, tokens: int | None, reqs: int | None, hidden: torch.Tensor) -> Any:
    """What vllm-ascend's V2 runner asks of the manager around one forward."""
    dispatch = m.get_num_tokens_for_dispatch(g.num_scheduled_tokens, g.is_prefilling_np)
    local = m.partition_batch(g, tokens, reqs)
    block_tables, slot_mappings = m.prepare_attn(local)
    context = m.build_attention_context(local, block_tables, slot_mappings)
    restored = m.restore_for_sampling(hidden, None)
    return local, block_tables, slot_mappings, context, restored, dispatch


def phased_step(m: Any, marks: list, out: dict, g: Any, tokens: int | None, reqs: int | None, hidden) -> None:
    """:func:`one_step` of a :func:`phased_class` manager, its phases (ns) appended to ``out``."""
    clock = time.perf_counter_ns
    marks.clear()
    td = clock()
    m.get_num_tokens_for_dispatch(g.num_scheduled_tokens, g.is_prefilling_np)
    t0 = clock()
    local = m.partition_batch(g, tokens, reqs)
    t1 = clock()
    block_tables, slot_mappings = m.prepare_attn(local)
    t2 = clock()
    m.build_attention_context(local, block_tables, slot_mappings)
    t3 = clock()
    m.restore_for_sampling(hidden, None)
    t4 = clock()
    at = dict(marks)
    spans = {
        "dispatch": t0 - td,
        "check": at["plan"] - at["check"],
        "plan": at["stage"] - at["plan"],
        "stage": at["fields"] - at["stage"],
        "fields": at["batch"] - at["fields"],
        "batch": at["batch end"] - at["batch"],
        "ascend": (at["check"] - t0) + (t1 - at["batch end"]),
        "attn": t2 - t1,
        "ctx": t3 - t2,
        "restore": t4 - t3,
    }
    for k, v in spans.items():
        out.setdefault(k, []).append(v)


def check_same(what: str, ref: tuple, ours: tuple, g: Any) -> None:
    """One step's outputs of the adapter equal the reference's (``one_step``'s tuple), compared
    as the V2 lockstep compares them."""
    from ascend_v2_lockstep import Compare, Summary

    cmp = Compare(Summary())
    r_local, r_bt, r_sl, r_ctx, r_out, r_dispatch = ref
    a_local, a_bt, a_sl, a_ctx, a_out, a_dispatch = ours
    assert r_dispatch == a_dispatch, f"{what} get_num_tokens_for_dispatch: {r_dispatch} != {a_dispatch}"
    cmp.batch(f"{what} local", r_local, a_local)
    cmp.same(f"{what} block_tables", r_bt, a_bt)
    cmp.same(f"{what} slot_mappings", r_sl, a_sl)
    cmp.context(f"{what} context", r_ctx, a_ctx, g)
    cmp.same(f"{what} restored", r_out[0], a_out[0])
    assert r_out[2] is g and a_out[2] is g, f"{what} restore's batch"


def bench_vllm_step(sched: list[int], comp: list[int], plen: list[int]) -> Any:
    """The scheduler's step of ``bench_vllm``'s batches (token ids all 1, no drafts)."""
    from vllm_lockstep import GlobalStep

    n = len(sched)
    return GlobalStep(list(range(n)), list(range(n)), sched, comp, plen, [0] * n, [[1] * s for s in sched])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--classes", default="A,B,C,D,E")
    parser.add_argument(
        "--no-aoti",
        action="store_true",
        help="skip the PCP_FN_GRAPH_BACKEND=aoti column (~150 s a config cold)",
    )
    add_markdown_option(parser)
    args = parser.parse_args()
    tables = Tables(args.markdown)

    if reference_path(REF) is None:
        print(
            "bench_ascend_v2: skipped: vllm-ascend main's vllm_ascend/worker/v2/pcp_manager.py is not "
            "reachable (it is kept outside the repository: set PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER to "
            "a file whose first line is that path and the rest its source; tools/reference.py)"
        )
        return 0
    try:
        import vllm
    except ImportError as e:
        print(f"bench_ascend_v2: skipped: vLLM 0.32.0 is not importable ({e}); run it with the vLLM venv")
        return 0
    tables.versions["vLLM"] = vllm.__version__
    torch.set_num_threads(1)
    # torch's pytree, loading the AOTInductor packages: not ours to act on
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)

    import ascend_v2_lockstep as lockstep
    import bench_vllm
    import check_ascend_v2_manager_against_reference as check

    from pcp_fn.adapters.vllm import VllmApi
    from pcp_fn.adapters.vllm_ascend import AscendApi, make_functional_ascend_manager

    mod, path = check.load_reference()
    mod.build_attn_state = build_attn_state  # the reference's module global; the adapter gets the same
    Mode = check.CUDAGraphMode
    api = SimpleNamespace(InputBatch=check.AscendInputBatch)

    def drop_in() -> type:
        """``FunctionalAscendPCPManager`` over vLLM 0.32.0 (its graph backend: the environment's)."""
        return make_functional_ascend_manager(
            VllmApi(
                PCPManager=check.vllm_pcp.PCPManager,
                InputBuffers=check.InputBuffers,
                CUDAGraphMode=Mode,
                PAD_SLOT_ID=check.PAD_SLOT_ID,
                get_pcp_group=lambda: check.GROUP,
            ),
            AscendApi(
                AscendInputBuffers=check.AscendInputBuffers,
                build_attn_state=build_attn_state,
                get_pp_group=lambda: check.PP,
                AttentionContext=mod.AscendPCPAttentionContext,
            ),
        )

    plain = type("Plain", (drop_in(),), {"graph_backend": None})
    aoti = None
    if not args.no_aoti:
        before = os.environ.get("PCP_FN_GRAPH_BACKEND")
        os.environ["PCP_FN_GRAPH_BACKEND"] = "aoti"  # the switch every drop-in reads
        try:
            aoti = drop_in()
        finally:
            if before is None:
                del os.environ["PCP_FN_GRAPH_BACKEND"]
            else:
                os.environ["PCP_FN_GRAPH_BACKEND"] = before
        assert aoti.graph_backend == "aoti"
    Phased, marks = phased_class(plain)
    config = lockstep.vllm_config(Mode.FULL_DECODE_ONLY)

    class AscendStubBlockTables(bench_vllm.StubBlockTables):
        """``bench_vllm``'s stub with vllm-ascend's int32 slot mappings; without ``out`` the
        gather returns the runner's own tables (``build_attention_context``)."""

        def __init__(self) -> None:
            super().__init__()
            self.slot_mappings = self.slot_mappings.to(torch.int32)

        def gather_block_tables(self, idx_mapping, num_reqs_padded, out=None, out_ptrs=None):
            return tuple(t[:num_reqs_padded] for t in (out or self.input_block_tables))

    def make(cls: type, P: int) -> Any:
        m = cls(
            pcp_world_size=P,
            pcp_rank=0,
            device=torch.device("cpu"),
            req_states=None,
            max_num_reqs=bench_vllm.R,
            max_num_tokens=bench_vllm.T,
            block_tables=AscendStubBlockTables(),
        )
        m.vllm_config = config
        return m

    print(f"reference: {path} (executed over vLLM 0.32.0's PCPManager)")
    print(
        f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); "
        f"R={bench_vllm.R}, T={bench_vllm.T}, rank 0, replicated decodes, one thread, median us of "
        f"{args.iters} interleaved steps",
        flush=True,
    )
    rows1, rows2, notes = [], [], []
    chosen = args.classes.split(",")
    for name, (P, (sched, comp, plen)) in batches().items():
        if name not in chosen:
            continue
        n = len(sched)
        step = bench_vllm_step(sched, comp, plen)
        prefilling = np.minimum(comp, plen) < np.array(plen)
        total = sum(sched)
        if prefilling.any():  # FULL_DECODE_ONLY: a mixed batch runs eager
            shape = (None, total, None, None, "eager")
        else:  # the smallest power-of-two graph holding the decodes, one request a token
            cap = 1 << max(total - 1, 0).bit_length()
            shape = (cap, cap, cap, 1, "full")
        tokens, reqs = shape[0], shape[2]
        g = lockstep.ascend_global_batch(api, step, list(range(n)), shape, n, torch.device("cpu"))
        mode = f"FULL_DECODE_ONLY({tokens})" if tokens else "eager"

        ref = make(mod.AscendPCPManager, P)
        Lp = ref.partition_batch(g, tokens, reqs).num_tokens_after_padding
        wide = [torch.randn(Lp, bench_vllm.H) for _ in range(P)]
        narrow = [torch.randn(Lp, 1) for _ in range(P)]  # host view: the gathers cost ~0
        check.GROUP.stage(wide)
        check.GROUP.stage(narrow)
        step_of = functools.partial(one_step, g=g, tokens=tokens, reqs=reqs, hidden=wide[0])
        host_step_of = functools.partial(one_step, g=g, tokens=tokens, reqs=reqs, hidden=narrow[0])
        with torch.inference_mode():
            managers = {"ref": ref, "eager": make(plain, P)}
            if aoti is not None:
                t0 = time.perf_counter()
                managers["aoti"] = fast = make(aoti, P)  # every graph of the ladder, made or loaded
                notes.append(
                    f"{name}: {fast.graph_stats.prepared} aoti graphs ready in "
                    f"{time.perf_counter() - t0:.1f} s ({fast.graph_stats.loaded} loaded from the cache)"
                )
            host = bench_vllm.graph_replayed(make(plain, P), host_step_of)
            fresh = bench_vllm.graph_replayed(make(plain, P), host_step_of)
            phased = bench_vllm.graph_replayed(make(Phased, P), host_step_of)
            # the equality check, with the lockstep's record of build_attn_state's arguments
            ref._global_batch_slot_mappings.zero_()  # the stub writes no slots: both buffers zeroed
            _ATTN_STATE[0] = lockstep.build_attn_state
            try:
                want = one_step(ref, g, tokens, reqs, wide[0])
                for col, m in managers.items():
                    if m is not ref:
                        check_same(f"{name} {col}", want, step_of(m), g)
                want = one_step(ref, g, tokens, reqs, narrow[0])
                for col, m in (("host", host), ("new", fresh), ("phases", phased)):
                    check_same(f"{name} {col}", want, host_step_of(m), g)
            finally:
                _ATTN_STATE[0] = attn_state_of

            wall = {col: functools.partial(step_of, m) for col, m in managers.items()}
            rows1.append((name, P, mode, bench_vllm.interleaved_medians(wall, args.iters)))
            phases: dict[str, list[int]] = {}
            fns = {
                "ref": functools.partial(host_step_of, ref),
                "adapter": functools.partial(host_step_of, host),
                "new": functools.partial(bench_vllm.new_schedule_step, fresh, host_step_of),
                "phases": functools.partial(phased_step, phased, marks, phases, g, tokens, reqs, narrow[0]),
            }
            t = bench_vllm.interleaved_medians(fns, args.iters)
            t.update({k: float(np.median(v[10:])) / 1e3 for k, v in phases.items()})
            rows2.append((name, P, mode, t))

    cols = ["ref", "eager"] + (["aoti"] if aoti is not None else [])
    tables.table(
        f"1. the CPU as the device, H={bench_vllm.H}: wall time per step (us), ratios to the reference",
        *wall_table(rows1, cols, "graph"),
    )
    tables.table(
        "2. host time per step (us), H=1, the adapter's graph replay counted as nothing; its phases (us)",
        ["batch", "P", "graph", "ref us", "adapter us", "adapter / ref", "new us", "new / ref"]
        + [f"{p} us" for p in PHASES],
        [
            [name, P, mode, f"{t['ref']:.0f}", f"{t['adapter']:.0f}", f"{t['adapter'] / t['ref']:.2f}"]
            + [f"{t['new']:.0f}", f"{t['new'] / t['ref']:.2f}"]
            + [f"{t[p]:.1f}" for p in PHASES]
            for name, P, mode, t in rows2
        ],
    )
    if notes:
        tables.note("; ".join(notes) + ".")
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tables.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
