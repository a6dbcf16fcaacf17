"""Lockstep differential: FunctionalDCSManager against vllm-ascend 0.23's PCPManager, in runner order.

Development only (needs the reference files: ``reference.py`` finds them, or
says which environment variable to set). Run:

    python tools/check_dcs_manager_against_reference.py [steps_per_config]

For every configuration in CONFIGS and every (pcp rank, dcp rank), it builds
the reference ``PCPManager`` (vllm-ascend ``pcp_utils.py``, with the stand-ins
of reference_loader.py and check_spec_against_reference.py) and ``FunctionalDCSManager`` with the same
constructor arguments, drives each with its own simulated ``model_runner_v1``
(tests/ascend_runner.py: the runner's call order, each runner feeding its
manager its own earlier outputs; the spec-decode logits come from the real
``_calc_spec_decode_metadata`` of vllm-ascend's ``model_runner_v1.py``) over the same schedule, and
compares every observation field by field. The adapter runs with
``check_syncs=True`` (its device path under ``pcp_fn.no_host_syncs``).

Documented deviations (DEVIATIONS below) are compared against the slow
oracle instead of the reference; the counts say how often each applied.
"""

from __future__ import annotations

import collections
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "adapters"))  # test_vllm_ascend_adapter

from reference import FILES, reference_path  # noqa: E402

_missing = [
    name for name, prefix in FILES.items() if prefix not in (None, "001") and reference_path(name) is None
]
if _missing:
    sys.exit(f"reference files not found: {_missing} (see tools/reference.py)")

import check_spec_against_reference as spec_tool  # noqa: E402  (stand-ins, the reference module, the runner's CALC)
import reference_loader  # noqa: E402
import test_vllm_ascend_adapter as adapter_tests  # noqa: E402  (the real-step twin of a dummy run)
from ascend_runner import (  # noqa: E402
    Kinds,
    SimConfig,
    SimRunner,
    correct_optimistic_seq_lens_cpu,
    schedule,
    slot_of,
)
from oracle_spec import oracle_mtp_mask  # noqa: E402

from pcp_fn.adapters.vllm_ascend.v1 import FunctionalDCSManager  # noqa: E402


class _Metadata:
    """Stand-in for vllm_ascend.attention.utils.AscendPrefillContextParallelMetadata (used by both)."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


reference_loader._module("vllm_ascend.attention.utils", AscendPrefillContextParallelMetadata=_Metadata)
sys.modules["vllm_ascend.spec_decode.utils"].correct_optimistic_seq_lens_cpu = correct_optimistic_seq_lens_cpu
spec_tool.REFERENCE_MOD.correct_optimistic_seq_lens_cpu = correct_optimistic_seq_lens_cpu
REF_CLASS = reference_loader.load_pcp_manager_class()

CONFIGS = [
    SimConfig("mixed P2", pcp=2),
    SimConfig("mixed P4, 2 KV cache groups", pcp=4, kv_groups=2),
    SimConfig("decode-heavy P3", pcp=3, max_prompt=6, max_new=(8, 20)),
    SimConfig("mixed P8 long prompts", pcp=8, R=8, T=256, max_prompt=120, max_model_len=512),
    SimConfig("spec k=1 P2", pcp=2, spec=1),
    SimConfig("spec k=2 P2 (MTP slots)", pcp=2, spec=2, max_prompt=12, max_new=(6, 14)),
    SimConfig("spec k=3 P4 DCP2", pcp=4, dcp=2, spec=3, T=128),
    SimConfig("spec k=2 P2 DCP2 interleave 4", pcp=2, dcp=2, spec=2, interleave=4),
    SimConfig("DCP2 only (P1) k=2", pcp=1, dcp=2, spec=2),
    SimConfig("hybrid P2", pcp=2, hybrid=True),
    SimConfig("hybrid P4 k=1", pcp=4, hybrid=True, spec=1),
    SimConfig("hybrid P2 k=2 DCP2", pcp=2, dcp=2, hybrid=True, spec=2),
    SimConfig("async k=2 P2", pcp=2, spec=2, async_sched=True, max_prompt=12, max_new=(6, 14)),
    SimConfig("async k=1 P4 DCP2 interleave 2", pcp=4, dcp=2, spec=1, async_sched=True, interleave=2),
    SimConfig("async k=3 P2 decode-heavy", pcp=2, spec=3, async_sched=True, max_prompt=6, max_new=(10, 20)),
    SimConfig("multimodal P2", pcp=2, multimodal=True),
    SimConfig("multimodal P4 k=1", pcp=4, spec=1, multimodal=True),
]

DEVIATIONS = {
    "mtp mask, interleave > 1": "the reference's MTP mask ignores cp_kv_cache_interleave_size; "
    "ours is interleave-aware (compared with oracle_spec.oracle_mtp_mask)",
    "dummy run: reference raises": "the reference's get_padded_slot_mapping in a _dummy_run between "
    "steps scatters the dummy's slots with the last update's unpad mask: a shape mismatch "
    "(RuntimeError) whenever their sizes differ; ours uses the dummy batch's layout",
    "dummy run: padded slot mapping": "the reference's (when it does not raise) comes from the last "
    "update's mask; ours from the dummy batch's layout",
    "dummy run: buffer field": "a _dummy_run's unpad mask, restore index and hybrid index fields: the "
    "reference's hold what its last update_tokens_for_pcp left in its buffers; ours the dummy batch's "
    "own layout (checked against the real step of that batch); the index tensors and lists (from "
    "query_lens: the dummy's counts as local rows) and num_actual_tokens_pcp_padded equal the reference's",
    "dummy run: a decode after a prefill": "stale dummy-run counts classify a request after a prefill "
    "as a decode: the reference counts it among the decodes its index lists skip; ours makes it a "
    "prefill",
    "async device rebuild, k >= 2: main-model slots": "the reference calls the block table's "
    "compute_slot_mapping, then compute_slot_mapping_draft on device tensors, which overwrites "
    "slot_mapping.gpu: the runner's padded slot mapping gets the MTP layout; ours keeps the main "
    "model's slots (both checked against the slots they hold)",
}
COUNT: collections.Counter = collections.Counter()
#: A _dummy_run's metadata fields read from the buffers of the last update (vllm-ascend's) or of the
#: dummy batch's own step (ours)
DUMMY_BUFFER_FIELDS = {
    "pcp_unpad_mask",
    "pcp_allgather_restore_idx",
    "pcp_padded_tokens_fla",
    "pcp_exit_fa_scatter_idx",
    "pcp_fa_query_idx",
    "pcp_enter_fa_restore_idx",
    "pcp_fa_padding_restore_idx",
    "max_num_tokens_across_pcp",
    "total_num_scheduled_tokens",
}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            a = torch.as_tensor(np.asarray(a))
            b = torch.as_tensor(np.asarray(b))
            return a.shape == b.shape and torch.equal(a.to(torch.int64), b.to(torch.int64))
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _describe(a) -> str:
    if isinstance(a, (torch.Tensor, np.ndarray)):
        return f"{type(a).__name__}{tuple(a.shape)} {a.dtype} {np.asarray(a).tolist()}"
    return repr(a)


MASK_BUFFERS: dict = {}  # (config, pcp rank, dcp rank) -> the modelled [R][1 + k][cols] mask buffer


def _mask_check(cfg, hist, sched, rank, dcp_rank, ref, ours, nd, ctx) -> None:
    """The MTP attention mask: against the reference with interleave 1 (every row, the rows the
    reference did not recompute included); with interleave > 1 against a model of the reference's
    buffer (rows [:nd] rewritten only when some decode's last token reaches the rank) holding the
    oracle's interleave-aware rows."""
    thr, cols = 1 + cfg.spec, ours.shape[2]
    C, c, interleave = cfg.pcp * cfg.dcp, rank * cfg.dcp + dcp_rank, cfg.interleave
    n = len(sched)
    key = (cfg.name, rank, dcp_rank)
    buf = MASK_BUFFERS.setdefault(key, [[[False] * cols for _ in range(thr)] for _ in range(cfg.R)])
    if nd and any(hist[i] + sched[i] - 1 >= c for i in range(nd)):
        buf[:nd] = [oracle_mtp_mask(hist[i], sched[i], thr, cols, C, c, interleave) for i in range(nd)]
    model = torch.tensor(buf[: nd if nd else n], dtype=torch.bool).reshape(ours.shape)
    assert torch.equal(ours, model), f"{ctx}: MTP mask differs from the modelled buffer"
    if interleave > 1 and not torch.equal(ours, ref):
        COUNT["deviation: " + "mtp mask, interleave > 1"] += 1
    else:
        assert torch.equal(ours, ref), f"{ctx}: MTP mask differs from the reference"
        COUNT["field matches"] += 1


def _slots_check(cfg, st, ref, ours, ctx) -> None:
    """A decode-only step's padded slot mapping after the device rebuild with k >= 2: the reference
    holds the MTP layout's first slots (each request's tokens and k - 1 extra positions), ours the
    main model's (the corrected positions); every P-th row, -1 between."""
    P, n, comp = cfg.pcp, len(st.sched), st.true_comp
    main = [slot_of(i, comp[i] + j) for i in range(n) for j in range(st.sched[i])]
    mtp = [slot_of(i, comp[i] + j) for i in range(n) for j in range(st.sched[i] + cfg.spec - 1)]

    def padded(slots):
        rows = [-1] * ours.shape[0]
        for t, v in enumerate(slots[: len(main)]):
            rows[t * P] = v
        return rows

    assert ours.tolist() == padded(main), f"{ctx}: padded slot mapping (ours) is not the main model's"
    assert ref.tolist() == padded(mtp), f"{ctx}: padded slot mapping (reference) is not the MTP layout"
    if main != mtp[: len(main)]:
        COUNT["deviation: " + "async device rebuild, k >= 2: main-model slots"] += 1
    else:
        COUNT["field matches"] += 1


def compare(cfg, st, rank, dcp_rank, ref_obs, our_obs) -> None:
    ctx = f"[{cfg.name}] step {st.index} rank {rank}/{dcp_rank}"
    assert ref_obs.keys() == our_obs.keys(), f"{ctx}: observed {set(ref_obs) ^ set(our_obs)} on one side only"
    for key in ref_obs:
        ref, ours = ref_obs[key], our_obs[key]
        if (
            key.startswith("padded_slot_mapping.")
            and cfg.spec >= 2
            and our_obs.get("rebuild.result") == (True, True)
        ):
            _slots_check(cfg, st, ref, ours, ctx)
            continue
        if key == "metadata" and ref is not None:
            assert ours is not None and ref.keys() == ours.keys(), (
                f"{ctx}: metadata fields {ref.keys() ^ ours.keys()}"
            )
            for field in ref:
                if field == "dcp_mtp_attn_mask" and ref[field] is not None:
                    hist = st.true_comp if cfg.async_sched and st.index % 2 else st.comp
                    nd = our_obs["num_decode_reqs"]
                    _mask_check(cfg, hist, st.sched, rank, dcp_rank, ref[field], ours[field], nd, ctx)
                    continue
                assert _equal(ref[field], ours[field]), (
                    f"{ctx}: metadata.{field}\n ref  {_describe(ref[field])}\n ours {_describe(ours[field])}"
                )
                COUNT["field matches"] += 1
            continue
        assert _equal(ref, ours), f"{ctx}: {key}\n ref  {_describe(ref)}\n ours {_describe(ours)}"
        COUNT["field matches"] += 1


def cover(cfg: SimConfig, st, obs) -> None:
    """Count the paths a (step, rank) pair exercised."""
    paths = {
        "decode-only steps": all(st.is_decode),
        "mixed steps (decodes and prefills)": any(st.is_decode) and not all(st.is_decode),
        "steps with draft tokens": any(st.drafts),
        "steps with rejected drafts": any(st.rejected),
        "async repair (device, prev_positions)": st.prev is not None and st.index % 2 == 0 and cfg.spec > 0,
        "async repair (host req-id maps)": st.prev is not None and st.index % 2 == 1 and cfg.spec > 0,
        "async rebuild, device branch": obs.get("rebuild.result") == (True, True),
        "async rebuild, host branch": obs.get("rebuild.result") == (True, False),
        "MTP slot mapping built": obs.get("mtp_slot_pad") is not None,
        "MTP drafting inputs (not None)": obs.get("mtp_drafting") is not None,
        "first pass with prefills": "first_pass" in obs and obs["num_prefill_reqs"] > 0,
        "hybrid fa_padding_restore_idx set": (obs.get("metadata") or {}).get("pcp_fa_padding_restore_idx")
        is not None,
        "multimodal scheduler output localized": obs.get("mm.restore_state") is not None,
    }
    for name, hit in paths.items():
        COUNT["path: " + name] += bool(hit)


def _calc(runner, num_draft, cu, pads):
    """The real runner's ``_calc_spec_decode_metadata`` (vllm-ascend ``model_runner_v1.py``) on a stand-in."""
    arange = runner.arange_np
    stub = SimpleNamespace(
        pcp_size=runner.P,
        pcp_manager=runner.m,
        _get_cumsum_and_arange=spec_tool._vllm_cumsum_and_arange(arange),
        _arange_scratch=np.zeros(arange.shape[0], dtype=np.int64),
        arange_np=arange,
        input_ids=SimpleNamespace(gpu=torch.arange(4096, dtype=torch.int32) * 5 + 1),
        device="cpu",
    )
    return spec_tool.CALC(stub, num_draft, cu, pads)


def _dummies(cfg, st, rank, dcp_rank, ref_runner, our_runner, twin) -> None:
    """The runner's ``_dummy_run``s before step ``st`` on both managers, compared where the reference
    runs; ours also against the real step of the dummy batch (field by field, on ``twin``)."""
    for num_tokens, uniform, capturing in SimRunner.dummy_plan(cfg, st.index):
        ctx = f"[{cfg.name}] dummy run {num_tokens} before step {st.index} rank {rank}/{dcp_rank}"
        reference_loader.PCP_GROUP.all_gather = our_runner.gather
        ours = our_runner.dummy_run(num_tokens, uniform, capturing)
        reference_loader.PCP_GROUP.all_gather = ref_runner.gather
        try:
            ref = ref_runner.dummy_run(num_tokens, uniform, capturing)
        except RuntimeError as e:
            assert "shape mismatch" in str(e), f"{ctx}: {e}"
            COUNT["deviation: " + "dummy run: reference raises"] += 1
            ref = ref_runner.dummy_run(num_tokens, uniform, capturing, slot_mappings=False)
            ours = {k: v for k, v in ours.items() if not k.startswith("padded_slot_mapping.")}
        counts = ours["counts"].tolist()
        n = len(counts)
        comp = our_runner.num_computed[:n].tolist()
        real = adapter_tests._metadata_step(
            twin, counts, comp, our_runner.num_prompt[:n].tolist(), cfg.R, ours["fixed"]
        )
        nd = ours["num_decode_reqs"]
        if real is not None:
            real = {k: _clone(v) for k, v in vars(real).items()}
            adapter_tests._same_fields(ours["metadata"], real, ctx, counts, nd, cfg.pcp, rank)
        assert ref.keys() == ours.keys(), f"{ctx}: observed {set(ref) ^ set(ours)} on one side only"
        for key in ref:
            if key == "metadata" and ref[key] is not None:
                a, b = ref[key], ours[key]
                assert a.keys() == b.keys(), f"{ctx}: metadata fields {a.keys() ^ b.keys()}"
                late_decode = ref["num_decode_reqs"] != nd
                for field in a:
                    if field == "dcp_mtp_attn_mask" and a[field] is not None:
                        fixed = ours["fixed"]
                        hist = [f - c for f, c in zip(fixed.tolist(), counts)] if fixed is not None else comp
                        _mask_check(cfg, hist, counts, rank, dcp_rank, a[field], b[field], nd, ctx)
                    elif _same(a[field], b[field]):
                        COUNT["field matches"] += 1
                    elif field in DUMMY_BUFFER_FIELDS:
                        COUNT["deviation: " + "dummy run: buffer field"] += 1
                    elif late_decode and field in adapter_tests.DUMMY_QUERY_FIELDS:
                        COUNT["deviation: " + "dummy run: a decode after a prefill"] += 1
                    else:
                        ref_s, our_s = _describe(a[field]), _describe(b[field])
                        raise AssertionError(f"{ctx}: metadata.{field}\n ref  {ref_s}\n ours {our_s}")
            elif key.startswith("padded_slot_mapping.") and not _same(ref[key], ours[key]):
                COUNT["deviation: " + "dummy run: padded slot mapping"] += 1
            elif key == "num_decode_reqs" and ref[key] != ours[key]:
                COUNT["deviation: " + "dummy run: a decode after a prefill"] += 1
            else:
                assert _equal(ref[key], ours[key]), f"{ctx}: {key}"
                COUNT["field matches"] += 1
        COUNT["dummy runs"] += 1


def _same(a, b) -> bool:
    """:func:`_equal`, False where the two cannot be compared (a tensor against ``None``)."""
    if (a is None) != (b is None):
        return False
    return _equal(a, b)


def _clone(v):
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def run_config(cfg: SimConfig, num_steps: int, seed: int) -> None:
    steps = schedule(cfg, num_steps, seed)
    kinds = Kinds(mla_spec=spec_tool._MLASpec(), sfa_builder=spec_tool._SFABuilder())
    for rank in range(cfg.pcp):
        for dcp_rank in range(cfg.dcp):
            args = cfg.manager_args(rank, dcp_rank)
            ref_runner = SimRunner(REF_CLASS(*args), cfg, rank, dcp_rank, _calc, kinds)
            ours = FunctionalDCSManager(*args, check_syncs=True)
            our_runner = SimRunner(ours, cfg, rank, dcp_rank, _calc, kinds)
            twin = FunctionalDCSManager(*args)  # runs the real step of each dummy batch
            ptrs = {k: v.data_ptr() for k, v in ours._buffers.step.items()}
            for st in steps:
                _dummies(cfg, st, rank, dcp_rank, ref_runner, our_runner, twin)
                reference_loader.PCP_GROUP.all_gather = ref_runner.gather
                ref_obs = ref_runner.step(st)
                reference_loader.PCP_GROUP.all_gather = our_runner.gather
                our_obs = our_runner.step(st)
                compare(cfg, st, rank, dcp_rank, ref_obs, our_obs)
                cover(cfg, st, our_obs)
                COUNT["manager steps"] += 1
            assert ptrs == {k: v.data_ptr() for k, v in ours._buffers.step.items()}, "a buffer moved"
    COUNT["configs"] += 1
    COUNT["schedule steps"] += len(steps)
    print(f"  {cfg.name:34s} {len(steps):3d} steps x {cfg.pcp * cfg.dcp} ranks: equal", flush=True)


if __name__ == "__main__":
    per_config = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    torch.manual_seed(0)
    for i, cfg in enumerate(CONFIGS):
        run_config(cfg, per_config, seed=1000 + i)
    print(
        f"FunctionalDCSManager == vllm-ascend PCPManager: {COUNT['configs']} configs, "
        f"{COUNT['schedule steps']} scheduled steps, {COUNT['manager steps']} (step, rank) pairs, "
        f"{COUNT['field matches']} fields equal, {COUNT['dummy runs']} dummy runs"
    )
    print("paths exercised ((step, rank) pairs):")
    for name in sorted(k for k in COUNT if k.startswith("path: ")):
        print(f"  {COUNT[name]:5d}  {name[6:]}")
    for name, why in DEVIATIONS.items():
        print(f"  deviation applied {COUNT['deviation: ' + name]:5d}x  {name}: {why}")
