"""Host time per step of vllm-ascend 0.23's ``PCPManager`` against ``FunctionalDCSManager``.

    python benchmarks/bench_ascend.py [--iters 60] [--pcp 2,4,8] [--spec 0,1] [--classes decode,mixed]
                                      [--no-aoti] [--no-phases] [--reference PATH]
                                      [--host-only] [--markdown PATH]

Needs the reference ``vllm_ascend/worker/pcp_utils.py`` (``tools/reference.py`` finds
it, or ``--reference PATH``); without it the benchmark says so and exits. One step is
what ``model_runner_v1.py`` asks of the manager around one forward, in its order
(rank 0, ``R = 256``, ``T = 8192``, one thread):

    init_batch_info -> update_tokens_for_pcp -> logits -> get_padded_slot_mapping
    -> generate_pcp_metadata -> get_restore_hidden_states

"logits" is ``get_logits_indices`` without draft tokens; with them (MTP) the runner
builds its spec-decode logits itself from ``num_pcp_pads_cpu``, so the step reads
that attribute; "slots" reads ``total_num_sampled_tokens_pcp`` and
``num_pcp_pads_cpu`` (the runner sizes the slot mapping it passes by them) before
``get_padded_slot_mapping``. The all-gather is a stand-in returning the ranks' rows at once;
the metadata class is a plain attribute holder for both managers. Batches, for
each ``P`` and ``k`` draft tokens (``k = 0``: no speculative config):

    decode  256 decodes of 1 + k tokens (500 computed, 100-token prompt), every step
    mixed   64 such decodes + fresh prefills of 2048 and 1000 tokens, then of 2032
            and 1000, in turn (a serving engine's prefill chunks change from step to
            step: no mixed step has the previous one's counts)

Columns (median us per step, every column timed in interleaved rounds, so a
change in the machine's load hits them alike): the reference; the adapter with
plain eager calls; the adapter with ``PCP_FN_GRAPH_BACKEND=aoti`` (AOTInductor
packages made at construction, cached in ``$PCP_FN_CACHE_DIR``) -- the CPU as
the device, hidden size 128; then host time: the reference and the adapter at
hidden size 1 (so no restore gather counts), the adapter with its device graphs
replaced by what a device replay costs the host besides the launch (nothing for
the step and slot-mapping graphs, which read their persistent staging in place;
the copy of the MTP mask graph's input into its static buffer); ``host/ref``:
the last two's ratio. Before timing, one step of every adapter column is checked equal to the
reference's (every return value and metadata field). Per-phase medians follow
the table (``--no-phases`` to skip them). ``--markdown PATH`` writes the tables to a markdown
fragment too (``benchmarks/_common.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from _common import R, T, Tables, add_markdown_option, reference_loader_or_none  # noqa: E402

H = 128
MAX_MODEL_LEN = 4096  # the MTP attention mask's width
PHASES = ("init", "update", "logits", "slots", "metadata", "restore")


class _Metadata:
    """Stand-in for ``vllm_ascend.attention.utils.AscendPrefillContextParallelMetadata`` (both managers)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def batches(kind: str, k: int) -> list[tuple[list[int], list[int], list[int]]]:
    """``(num_scheduled, num_computed, num_prompt)`` of each step of a batch class with ``k`` draft
    tokens, the steps taken in turn: a steady decode batch repeats; a mixed step's prefill chunks
    change from step to step (two splits in turn, their local counts different at every ``P``),
    so that no mixed step repeats the previous one's counts, as in serving."""
    q = 1 + k
    if kind == "decode":
        return [([q] * 256, [500] * 256, [100] * 256)]
    return [
        ([q] * 64 + [first, 1000], [500] * 64 + [0, 0], [100] * 64 + [first, 1000]) for first in (2048, 2032)
    ]


def vllm_config(k: int) -> SimpleNamespace:
    spec = SimpleNamespace(num_speculative_tokens=k) if k else None
    return SimpleNamespace(
        speculative_config=spec,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=T, max_num_seqs=R),
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(model_type="llama"), max_model_len=MAX_MODEL_LEN
        ),
        parallel_config=SimpleNamespace(cp_kv_cache_interleave_size=1),
        _pd_recompute=False,
    )


class Inputs:
    """What the runner hands the manager in one step of a batch (``hidden`` columns of hidden states)."""

    def __init__(
        self, P: int, k: int, sched: list[int], comp: list[int], prompt: list[int], hidden: int
    ) -> None:
        n = len(sched)
        self.n = n
        self.sched = np.array(sched, dtype=np.int32)  # the runner's num_scheduled_tokens[:num_reqs]
        self.comp = np.zeros(R, dtype=np.int32)
        self.comp[:n] = comp
        self.prompt = np.zeros(R, dtype=np.int32)
        self.prompt[:n] = prompt
        self.arange = np.arange(T * P + 2 * P * R, dtype=np.int64)
        self.input_batch = SimpleNamespace(num_computed_tokens_cpu=self.comp)
        self.block_table = torch.zeros(n, 4, dtype=torch.int32)
        self.slots = torch.arange(int(self.sched.sum()), dtype=torch.int32) * 3 + 1
        # the local counts (the reference's, the same on every rank for these batches)
        local = np.where(self.sched <= 1 + k, self.sched, -(-self.sched // (2 * P)) * 2)
        self.local = local.astype(np.int32)
        self.cu = np.cumsum(self.local)
        self.N = int(self.local.sum())
        self.N_padded = -(-self.N // 8) * 8  # the graph runtime's padding
        self.query_lens = torch.from_numpy(self.local)
        self.hidden = torch.arange(self.N_padded * hidden, dtype=torch.float32).reshape(-1, hidden)
        self.gathered = torch.arange(P * self.N * hidden, dtype=torch.float32).reshape(-1, hidden) * 7


class Step:
    """One manager's steps over the inputs of a batch class, in turn (timed per phase)."""

    def __init__(
        self, manager: Any, k: int, inputs: list[Inputs], gather: Callable[[torch.Tensor], None]
    ) -> None:
        self.m, self.k, self.inputs, self.gather = manager, k, inputs, gather
        self.next = 0  # the inputs of the next step
        self.times: dict[str, list[int]] = {p: [] for p in (*PHASES, "total")}

    @property
    def hidden(self) -> int:
        return self.inputs[0].hidden.shape[1]

    def run(self, record: bool = True) -> dict[str, Any]:
        m, t, x = self.m, time.perf_counter_ns, self.inputs[self.next]
        self.next = (self.next + 1) % len(self.inputs)
        t0 = t()
        m.init_batch_info(x.sched, x.n, x.comp, x.prompt)
        t1 = t()
        tokens, positions = m.update_tokens_for_pcp(x.sched, x.arange)
        t2 = t()
        logits = m.get_logits_indices(x.cu, x.n) if not self.k else m.num_pcp_pads_cpu[: x.n]
        t3 = t()
        m.total_num_sampled_tokens_pcp, m.num_pcp_pads_cpu[: x.n]  # the runner sizes its slot view
        slots = m.get_padded_slot_mapping(x.N, x.N_padded, x.slots, 0)
        t4 = t()
        meta, _ = m.generate_pcp_metadata(x.N, x.query_lens, x.input_batch, x.local, x.block_table, x.n, x.n)
        t5 = t()
        self.gather(x.gathered)
        restored = m.get_restore_hidden_states(x.hidden)
        t6 = t()
        if record:
            stamps = (t0, t1, t2, t3, t4, t5, t6)
            for name, a, b in zip(PHASES, stamps, stamps[1:]):
                self.times[name].append(b - a)
            self.times["total"].append(t6 - t0)
        return dict(
            tokens=tokens, positions=positions, logits=logits, slots=slots, meta=meta, restored=restored
        )

    def median(self, phase: str = "total") -> float:
        return float(np.median(self.times[phase])) / 1e3


def _values(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    return x


def snapshot(out: dict[str, Any]) -> dict[str, Any]:
    """A copy of a step's outputs that later steps (which rewrite the managers' buffers) leave alone."""

    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, np.ndarray):
            return x.copy()
        return x

    snap = {k: copy(v) for k, v in out.items() if k != "meta"}
    snap["meta"] = SimpleNamespace(**{k: copy(v) for k, v in vars(out["meta"]).items()})
    return snap


def _equal(a: Any, b: Any) -> bool:
    a, b = _values(a), _values(b)
    if isinstance(a, (torch.Tensor, np.ndarray)) or isinstance(b, (torch.Tensor, np.ndarray)):
        a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
        return a.shape == b.shape and torch.equal(a.to(torch.float64), b.to(torch.float64))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def check_equal(ref: dict[str, Any], ours: dict[str, Any], what: str) -> None:
    """Every return value and every metadata field of the reference's step, equal in ours."""
    for key in ("tokens", "positions", "logits", "slots", "restored"):
        assert _equal(ref[key], ours[key]), f"{what}: {key} differs from the reference"
    rm, om = vars(ref["meta"]), vars(ours["meta"])
    missing = set(rm) - set(om)
    assert not missing, f"{what}: metadata lacks {sorted(missing)}"
    for field, value in rm.items():
        assert _equal(value, om[field]), f"{what}: metadata.{field} differs from the reference"


def graph_replayed(manager: Any) -> Any:
    """``manager`` (plain calls) with each device function's call replaced by what a device graph
    replay costs the host besides the launch: nothing for a graph that reads its persistent
    staging inputs in place (``_ops.IN_PLACE``: the step and the slot mappings), else the copies
    of its staging inputs into the graph's static buffers (the MTP mask; ``pcp_fn.graph.capture``
    on CUDA/NPU). Replaces the graphs' ``runtime.invoke``. The first call of each function and
    bucket runs it (writing the persistent buffers the later ones leave as they are); call
    ``manager.new_batch()`` before another batch, so that its first calls run too. (Steps of
    other counts at the same bucket then read the outputs of the last real run: their host
    work costs the same.)"""
    from pcp_fn.adapters.runtime import GraphCall

    runtime = manager._graphs.runtime
    invoke, statics = runtime.invoke, {}

    def replay(call: GraphCall, bound: Callable[[], Any]) -> None:
        dst = statics.get(call)
        if dst is None:
            statics[call] = [x.clone() for x in call.staged]
            invoke(call, bound)
        elif not call.in_place:
            torch._foreach_copy_(dst, list(call.staged))

    runtime.invoke = replay
    manager.new_batch = statics.clear
    return manager


class Group:
    """The PCP group's all-gather: returns the rows staged for the step (every rank's at once)."""

    rows: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        assert self.rows is not None
        return self.rows


def _us(med: dict[str, float], name: str) -> str | None:
    """Column ``name``'s median, or an empty cell for a column not run."""
    return f"{med[name]:.0f}" if name in med else None


def _ratio(med: dict[str, float], a: str, b: str) -> str | None:
    return f"{med[a] / med[b]:.2f}" if a in med and b in med else None


def run_config(
    loader: Any, P: int, k: int, kinds: list[str], iters: int, aoti: bool, device_columns: bool = True
) -> tuple[list[list[str]], list[list[str]], str]:
    """The table rows and per-phase rows of every batch class at ``P`` ranks and ``k`` drafts, and
    what making the ``aoti`` graphs took ("" without them)."""
    from pcp_fn.adapters.vllm_ascend.v1 import FunctionalDCSManager

    margs = (P, 0, 1, 0, T * P + 2 * P * R, R, torch.device("cpu"), vllm_config(k), False)
    ref = loader.make_manager(P, 0, R, T, num_spec_tokens=k, max_model_len=MAX_MODEL_LEN)

    def ours(**kw: Any) -> Any:
        m = FunctionalDCSManager(*margs, all_gather=Group(), **kw)
        m.initialize_slot_mapping()
        return m

    managers = {"ref": ref, "eager": ours(capture=False)} if device_columns else {}
    made = ""
    if aoti and device_columns:
        # the ladder's rungs this benchmark's steps need (and the capacity's, always there): the
        # others would be compiled for nothing; a step gets the bucket it gets with every rung
        sizes = {
            max(16, 1 << (max(len(v[0]), Inputs(P, k, *v, 1).N) - 1).bit_length())
            for kind in kinds
            for v in batches(kind, k)
        }
        t0, before = time.perf_counter(), os.environ.get("PCP_FN_GRAPH_BACKEND")
        os.environ["PCP_FN_GRAPH_BACKEND"] = "aoti"  # the switch every drop-in reads
        try:
            managers["aoti"] = m = ours(token_buckets=sorted(sizes))
        finally:
            if before is None:
                del os.environ["PCP_FN_GRAPH_BACKEND"]
            else:
                os.environ["PCP_FN_GRAPH_BACKEND"] = before
        stats = m.graph_stats
        made = (
            f"P={P} k={k}: {stats.prepared} aoti graphs at construction, {stats.loaded} loaded from the "
            f"cache, {time.perf_counter() - t0:.0f} s"
        )
    managers["ref host"] = ref
    managers["host"] = graph_replayed(ours(capture=False))

    def gather_of(m: Any) -> Callable[[torch.Tensor], None]:
        group = loader.PCP_GROUP if m is ref else m._all_gather
        attr = "gathered" if m is ref else "rows"
        return lambda rows: setattr(group, attr, rows)

    lines, phase_lines = [], []
    for kind in kinds:
        variants = batches(kind, k)
        steps = {
            name: Step(m, k, [Inputs(P, k, *v, 1 if "host" in name else H) for v in variants], gather_of(m))
            for name, m in managers.items()
        }
        for j in range(len(variants)):  # every step of the class checked against the reference's
            ref_out = {}  # by hidden size
            for st in steps.values():
                if st.m is ref:
                    st.next = j
                    ref_out[st.hidden] = snapshot(st.run(record=False))
            for name, st in steps.items():
                if st.m is not ref:
                    getattr(st.m, "new_batch", lambda: None)()
                    st.next = j
                    st.run(record=False)  # the first call (a replayed graph's runs for real)
                    st.next = j
                    got = st.run(record=False)
                    check_equal(ref_out[st.hidden], got, f"{kind} P={P} k={k} {name} step {j}")
        # a replayed graph leaves its buffers as its last real run wrote them: make that the step
        # with the fewest local tokens, whose indices are in range for every step of the class
        smallest = min(range(len(variants)), key=lambda j: next(iter(steps.values())).inputs[j].N)
        for st in steps.values():
            if hasattr(st.m, "new_batch"):
                st.m.new_batch()
                st.next = smallest
                st.run(record=False)
            st.next = 0
        for i in range(10 + iters):
            for st in steps.values():
                st.run(record=i >= 10)
        med = {name: st.median() for name, st in steps.items()}
        lines.append(
            [kind, P, k, _us(med, "ref"), _us(med, "eager"), _us(med, "aoti"), _ratio(med, "aoti", "ref")]
            + [_us(med, "ref host"), _us(med, "host"), _ratio(med, "host", "ref host")]
        )
        for name, st in steps.items():
            phase_lines.append([kind, P, k, name, *(f"{st.median(p):.1f}" for p in PHASES)])
    return lines, phase_lines, made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--pcp", default="2,4,8")
    ap.add_argument("--spec", default="0,1", help="draft tokens per decode (0: no speculative config)")
    ap.add_argument("--classes", default="decode,mixed")
    ap.add_argument("--no-aoti", action="store_true", help="skip the AOTInductor column")
    ap.add_argument("--no-phases", action="store_true", help="skip the per-phase medians")
    ap.add_argument("--host-only", action="store_true", help="only the host-time columns")
    ap.add_argument("--reference", default=None, help="path of the vllm-ascend pcp_utils reference")
    add_markdown_option(ap)
    args = ap.parse_args()
    tables = Tables(args.markdown)
    torch.set_num_threads(1)

    loader = reference_loader_or_none(args.reference)
    if loader is None:
        print(
            "bench_ascend: the vllm-ascend 0.23 pcp_utils.py reference is not reachable "
            "(tools/reference.py: PCP_FN_REF_VLLM_ASCEND_PCP_UTILS); nothing to compare against"
        )
        return
    loader._module("vllm_ascend.attention")
    loader._module("vllm_ascend.attention.utils", AscendPrefillContextParallelMetadata=_Metadata)

    print(f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    print(
        f"R={R}, T={T}, rank 0, median us per step over {args.iters} steps; "
        f"CPU as the device: H={H}; host: H=1, device graph replays copying what they copy on a device",
        flush=True,
    )
    rows, phase_lines, made = [], [], []
    for P in (int(x) for x in args.pcp.split(",")):
        for k in (int(x) for x in args.spec.split(",")):
            kinds = args.classes.split(",")
            lines, phases, note = run_config(
                loader, P, k, kinds, args.iters, not args.no_aoti, not args.host_only
            )
            print(f"P={P} k={k} done", flush=True)
            rows += lines
            phase_lines += phases
            made += [note] if note else []
    tables.table(
        f"median us per step: the CPU as the device (H={H}): the reference, the adapter's plain calls and "
        "its aoti graphs; host time (H=1, device graph replays copying what they copy on a device)",
        ["class", "P", "k", "ref us", "eager us", "aoti us", "aoti / ref", "ref (host) us"]
        + ["adapter (host) us", "host / ref"],
        rows,
    )
    if made:
        tables.note("; ".join(made) + ".")
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.no_phases:
        tables.table(
            "per phase, median us",
            ["class", "P", "k", "column", *(f"{p} us" for p in PHASES)],
            phase_lines,
        )
    tables.write()
    from reference import reference_path  # tools/ (on the path once the reference loader is)

    v2 = reference_path("vllm_ascend_v2_pcp_manager")
    why = "" if v2 else " (its reference is not reachable: PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER)"
    print(
        "\nFunctionalAscendPCPManager against vllm-ascend's V2 AscendPCPManager: "
        f"benchmarks/bench_ascend_v2.py{why}"
    )


if __name__ == "__main__":
    main()
