"""The vLLM release contracts (``pcp_fn.adapters.vllm.contract``) without vLLM: version policy,
detection, and the 0.33+ contract (late block tables, the gathered MoE mask) in lockstep with
the oracle over the stand-in. The real releases: ``tests/adapters/test_vllm_adapter.py`` in CI's stages."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch
import vllm_standin as standin
from oracle_vllm import OracleManager
from test_vllm_adapter import STANDIN_API, _check_summary, standin_backend
from vllm_lockstep import Backend, Case, run_lockstep

from pcp_fn.adapters.vllm import VllmApi, make_functional_manager
from pcp_fn.adapters.vllm import contract as vc


@pytest.mark.parametrize(
    ("version", "series"),
    [
        ("0.32.0", "0.32"),
        ("0.32.0+cpu", "0.32"),
        ("0.33.1.dev4+gabc", "0.33"),
        ("0.34.0", "0.34"),
        ("0.35.0", "0.35"),
        ("1.0.0", "1.0"),
        ("garbage", None),
    ],
)
def test_version_series_and_policy(version, series):
    assert vc.vllm_series(version) == series
    reason = vc.unsupported_reason(version)
    if series in vc.SUPPORTED_SERIES:
        assert reason is None
    else:  # names the installed and the supported versions
        assert version in reason and all(f"{s}.x" in reason for s in vc.SUPPORTED_SERIES)


_Base032, _Base033, _Base034 = standin.PCPManager, standin.PCPManager033, standin.PCPManager034
_Metadata = standin.PCPBatchMetadata


def test_detect_reads_what_the_release_provides():
    bare, with_meta = types.SimpleNamespace(), types.SimpleNamespace(PCPBatchMetadata=_Metadata)
    assert vc.detect(standin.PCPManager030, bare) is vc.VLLM_0_30
    assert vc.detect(_Base032, bare) is vc.VLLM_0_32
    dev = vc.detect(_Base033, bare)
    assert (dev.name, dev.moe_mask, dev.batch_metadata) == ("0.33-dev", True, None)
    assert vc.detect(_Base033, with_meta).name == "0.33"
    assert vc.detect(_Base034, with_meta).name == "0.34"
    assert hasattr(vc.detect(_Base033, bare).methods, "prepare_inputs_for_capture_or_profile")
    assert not hasattr(vc.VLLM_0_32.methods, "prepare_inputs_for_capture_or_profile")

    class Odd(_Base032):  # set_block_tables without the MoE flag: no release has that
        def set_block_tables(self, block_tables):
            pass

    with pytest.raises(ValueError, match="not checked against"):
        vc.detect(Odd, bare)


def _late_manager(base: type = _Base033, backend: str | None = None) -> type:
    """The drop-in over a stand-in base with vLLM 0.33's late block tables and MoE mask (the
    stand-in's InputBatch keeps 0.32's metadata field: the contract of vLLM main before 0.33)."""

    class Base(base, standin.PCPManager):
        pass

    contract = vc.detect(Base, types.SimpleNamespace())
    cls = make_functional_manager(VllmApi(**standin.vllm_api_fields(PCPManager=Base, contract=contract)))
    return type("LateManager", (cls,), {"graph_backend": backend, "check_host_syncs": backend is None})


@pytest.mark.parametrize("moe", [True, False])
@pytest.mark.parametrize("backend", [None, "eager"])
def test_late_block_tables_and_moe_mask_in_lockstep_with_the_oracle(moe, backend):
    adapter = _late_manager(backend=backend)
    backend_ = standin_backend(adapter, adapter.vllm_api.contract)
    case = Case(P=3, shard=True, spec=1, moe=moe, seed=5, max_steps=14 if backend else 30)
    summary = run_lockstep(backend_, case)
    if backend is None:
        _check_summary(summary, case)
    assert summary.steps and summary.dummies and summary.drafts


def test_moe_mask_is_the_gathered_rank_major_padding():
    """P = 2, scheduled [3, 5] fresh prefills (padded to 4 and 8, 2P chunks): rank 0 holds 1 + 2 +
    ... tokens; the mask marks row q * Lp + l padding when l >= rank q's tokens."""
    adapter = _late_manager()
    bt = standin.BlockTables([4], 4, 32, [8], torch.device("cpu"))
    m = adapter(2, 0, "cpu", True, 4, 32, None, moe_gathers_tokens=True)
    assert m.get_dummy_slot_mappings(4).shape[0] == 0  # no block tables yet: no KV-cache groups
    m.set_block_tables(bt)
    assert m.get_dummy_slot_mappings(4).shape == (1, 8)
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    sched = np.array([3, 5], np.int32)
    g = standin.InputBatch.make_dummy(2, 8, m.input_buffers)
    g = dataclasses.replace(
        g,
        num_scheduled_tokens=sched,
        num_computed_tokens_np=np.zeros(2, np.int32),
        prefill_len_np=sched.copy(),
        is_prefilling_np=np.array([True, True]),
        idx_mapping_np=np.arange(2, dtype=np.int64),
        num_tokens=8,
    )
    per_rank = [m.get_num_tokens_for_dispatch(sched, g.is_prefilling_np)] * 2
    desc = Desc(cg_mode=Mode.PIECEWISE, num_tokens=per_rank[0] + 2, num_reqs=None)
    local = m.partition_batch(g, desc)
    Lp = desc.num_tokens
    tokens = [adapter(2, q, "cpu", True, 4, 32, bt).partition_batch(g, desc).num_tokens for q in range(2)]
    want = torch.tensor([l >= tokens[q] for q in range(2) for l in range(Lp)])
    assert torch.equal(local.is_padding, want)
    assert local.is_padding.data_ptr() == m.persistent_buffers()["moe_is_padding"].data_ptr()
    # capture masks go through the same buffer, repeated per rank
    staged = m.prepare_inputs_for_capture_or_profile(standin.InputBatch.make_dummy(1, 4, m.input_buffers))
    assert staged.is_padding.shape == (8,)


def test_moe_mask_needs_only_the_token_capacity():
    """Like vLLM's, a manager given ``max_num_tokens`` but no request capacity (a draft model's
    speculator in vLLM's tests) still expands a draft run's mask to the ``[P * n]`` MoE rows."""
    adapter = _late_manager()
    m = adapter(2, 0, "cpu", True, max_num_tokens=4, moe_gathers_tokens=True)
    mask = torch.tensor([False, False, False, True])
    buffers = types.SimpleNamespace(is_padding=mask)
    inputs, gathered = m.get_draft_input_buffers(buffers, 4)
    assert inputs is buffers
    assert torch.equal(gathered, torch.cat([mask, mask]))
    with pytest.raises(ValueError, match="the mask has 5 rows; max_num_tokens is 4"):  # no room for it
        m.moe_is_padding(torch.zeros(5, dtype=torch.bool))
    off = adapter(2, 0, "cpu", True, max_num_tokens=4)
    assert torch.equal(off.get_draft_input_buffers(buffers, 4)[1], mask)


def test_moe_flag_refused_by_a_032_contract():
    with pytest.raises(ValueError, match="no MoE routing mask"):
        make_functional_manager(VllmApi(**standin.vllm_api_fields()))(
            2, 0, "cpu", True, 4, 32, None, moe_gathers_tokens=True
        )


def test_set_block_tables_follows_their_cp_interleave():
    """vLLM 0.33+ takes ``cp_interleave`` from the block tables attached later: a different one
    rebuilds the bookkeeping, and the steps equal a manager built with it from the start."""
    adapter = _late_manager()
    kw = dict(pcp_world_size=2, pcp_rank=1, device="cpu", shard_decode_requests=False)
    kw.update(max_num_reqs=4, max_num_tokens=32, dcp_world_size=2, dcp_rank=1)
    bt = standin.BlockTables([4], 4, 32, [8], torch.device("cpu"), cp_size=2, cp_rank=1, cp_interleave=2)
    late = adapter(**kw, cp_interleave=1)
    late.set_block_tables(bt)
    assert late.cp_interleave == 2
    direct = adapter(**kw, cp_interleave=2)
    direct.set_block_tables(bt)
    Mode, Desc = standin.CUDAGraphMode, standin.BatchExecutionDescriptor
    sched = np.array([1, 9], np.int32)
    g = standin.InputBatch.make_dummy(2, 10, late.input_buffers)
    g = dataclasses.replace(
        g,
        num_scheduled_tokens=sched,
        num_computed_tokens_np=np.array([13, 0], np.int32),
        prefill_len_np=np.array([5, 9], np.int32),
        is_prefilling_np=np.array([False, True]),
        idx_mapping_np=np.arange(2, dtype=np.int64),
        num_tokens=10,
    )
    desc = Desc(
        cg_mode=Mode.NONE,
        num_tokens=late.get_num_tokens_for_dispatch(sched, g.is_prefilling_np),
        num_reqs=None,
    )
    a, b = late.partition_batch(g, desc), direct.partition_batch(g, desc)
    for f in ("num_tokens", "num_reqs", "dcp_local_seq_lens_cpu_upper_bound", "seq_lens", "positions"):
        x, y = getattr(a, f), getattr(b, f)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, f
    assert torch.equal(late.prepare_attn(a)[1], direct.prepare_attn(b)[1])


# --------------------------------------------------------------------------- vLLM 0.30


def _manager_030(backend: str | None = None) -> type:
    """The drop-in over the stand-in of vLLM 0.30's base (decodes replicated, padded sizes)."""
    base = standin.PCPManager030
    contract = vc.detect(base, types.SimpleNamespace())
    api = VllmApi(**standin.vllm_api_fields(PCPManager=base, contract=contract))
    cls = make_functional_manager(api)
    return type("Manager030", (cls,), {"graph_backend": backend, "check_host_syncs": backend is None})


API_030 = types.SimpleNamespace(**{**vars(STANDIN_API), "InputBatch": standin.InputBatch030})


@pytest.mark.parametrize(
    "case",
    [
        Case(P=2, shard=False, spec=1),
        Case(P=4, shard=False, dcp=4, interleave=2, seed=3),
        Case(P=8, shard=False, seed=6, T=64),
    ],
    ids=lambda c: f"P{c.P}-dcp{c.dcp}",
)
def test_vllm_030_contract_in_lockstep_with_the_oracle(case):
    """vLLM 0.30's form (no decode sharding, ``partition_batch`` of the padded sizes, a 2-tuple
    ``restore_for_sampling``, a batch without the 0.32 graph fields, unbounded FULL captures) over
    the oracle, every mode, every rank."""
    adapter = _manager_030()
    oracle = lambda **kw: OracleManager(API_030, shard_decode_requests=False, **kw)  # noqa: E731
    backend = Backend(
        name="standin-0.30",
        api=API_030,
        block_tables_cls=standin.BlockTables,
        make_reference=oracle,
        make_adapter=lambda **kw: adapter(**kw),
        make_oracle=oracle,
        reference_takes_full_mixed=True,
        group=standin.PCP_GROUP,
        contract=adapter.vllm_api.contract,
    )
    summary = run_lockstep(backend, case)
    _check_summary(summary, case)
    assert "decode_graph_eligible" not in summary.fields and "max_seq_len_np" not in summary.fields


def test_vllm_030_form_of_the_methods():
    """The signatures vLLM 0.30's runner calls, its padded sizes checked by name, and a prepared draft
    kept by a prepare of another batch (vLLM 0.30's ``prepare_draft_prefill`` returns early)."""
    adapter = _manager_030()
    m = adapter(2, 0, "cpu", 4, 32, standin.BlockTables([4], 4, 32, [8], torch.device("cpu")))
    assert not hasattr(m, "shard_decode_requests")
    with pytest.raises(TypeError):
        adapter(2, 0, "cpu", shard_decode_requests=False)  # vLLM 0.30's constructor has no such argument
    sched = np.array([1, 7], np.int32)
    g = standin.InputBatch030.make_dummy(2, 8, m.input_buffers)
    g = dataclasses.replace(
        g,
        num_scheduled_tokens=sched,
        num_computed_tokens_np=np.array([9, 0], np.int32),
        prefill_len_np=np.array([4, 7], np.int32),
        is_prefilling_np=np.array([False, True]),
        idx_mapping_np=np.arange(2, dtype=np.int64),
        num_tokens=8,
    )
    for bad, match in (
        (dict(padded_num_tokens=8.0), "padded_num_tokens must be an int"),
        (dict(padded_num_tokens=-1), "padded_num_tokens"),
        (dict(padded_num_tokens=8, padded_num_reqs=0), "padded_num_reqs"),
        (dict(padded_num_reqs=4), "padded_num_reqs needs padded_num_tokens"),
    ):
        with pytest.raises((ValueError, TypeError), match=match):
            m.partition_batch(g, **bad)
    # the 7-token prefill's 2P chunks [2, 2, 2, 1]: rank 0 holds 1 + 2 + 1 tokens, rank 1 1 + 2 + 2 (the
    # decode replicated), so rank 0's 4 padded to the largest rank's 5
    local = m.partition_batch(g)
    assert (local.num_tokens, local.num_tokens_after_padding, local.num_reqs) == (4, 5, 3)
    assert m.partition_batch(g, padded_num_tokens=8).num_tokens_after_padding == 8
    full = m.partition_batch(g, padded_num_tokens=8, padded_num_reqs=3)
    assert (full.num_reqs, full.num_reqs_after_padding) == (3, 3)
    # a mixed FULL graph capped at max_num_reqs = 4 holds a rank's split-prefill rows, min(8, 2 * 4)
    assert m.partition_batch(g, padded_num_tokens=8, padded_num_reqs=4).num_reqs_after_padding == 8
    assert m.partition_batch(g, 8) is not full  # the same sizes, one descriptor object: a new batch
    group = standin.PCP_GROUP
    group.clear()
    hidden = [torch.zeros(8, 2) for _ in range(2)]
    group.stage(hidden)
    restored, batch = m.restore_for_sampling(hidden[0])
    assert batch is g and restored.shape == (8, 2)
    m.prepare_draft_prefill(g, g.input_ids + 1)
    prepared = m.draft_prefill_batch
    assert prepared is not None
    m.prepare_draft_prefill(dataclasses.replace(g), g.input_ids)  # another batch: kept (vLLM 0.30)
    assert m.draft_prefill_batch is prepared


# --------------------------------------------------------------------------- the contract canary

_Sig032, _Sig034 = standin.SignaturesPCPManager032, standin.SignaturesPCPManager034
_build032, _build034 = standin.maybe_build_pcp_manager_032, standin.maybe_build_pcp_manager_034


class _Sig033(_Sig034):
    sync_drafts = None  # (0.34's addition)


def _drifted_build(vllm_config, device, supports_mm_inputs, block_tables=None, cls=standin.PCPManager):
    """A later vLLM's maybe_build_pcp_manager: a new keyword for the manager class."""
    return cls(
        pcp_world_size=2,
        pcp_rank=0,
        device=device,
        shard_decode_requests=True,
        max_num_reqs=1,
        max_num_tokens=1,
        block_tables=block_tables,
        dcp_world_size=1,
        dcp_rank=0,
        cp_interleave=1,
        moe_gathers_tokens=False,
        req_states=None,
    )


class _Drifted(_Sig034):
    """A build of vLLM main after 0.34.0: a changed method, a new one, a removed one."""

    moe_is_padding = None

    def sync_drafts(self, draft_tokens, idx_mapping, draft_logits, num_drafts): ...

    def prepare_moe_inputs(self, input_batch): ...


@pytest.mark.parametrize(
    ("version", "cls", "build"),
    [
        ("0.30.0", standin.SignaturesPCPManager030, standin.maybe_build_pcp_manager_030),
        ("0.32.0+cpu", _Sig032, _build032),
        ("0.33.0", _Sig033, _build034),
        ("0.34.0", _Sig034, _build034),
        ("0.34.1.dev5+gabc", _Sig034, _build034),  # a main build that left the contract alone
    ],
)
def test_canary_accepts_each_release_contract(version, cls, build):
    assert vc.check_installed(version, cls, build, environ={}) is None
    assert vc.public_api(cls) == vc.RELEASE_APIS[vc.vllm_series(version)].methods


def test_canary_refuses_a_drifted_build_naming_each_difference():
    """vLLM main after 0.34.0 versions itself 0.34.1.devN: a PCPManager whose public methods or
    maybe_build_pcp_manager differ from 0.34.0's is refused, every difference named."""
    message = vc.check_installed("0.34.1.dev7+g1234", _Drifted, _drifted_build, environ={})
    for expected in (
        "vLLM 0.34.1.dev7+g1234 differs",
        "PCPManager.sync_drafts is (self, draft_tokens, idx_mapping, draft_logits, num_drafts) "
        "(vLLM 0.34.0: (self, draft_tokens, idx_mapping, draft_logits))",
        "PCPManager.prepare_moe_inputs (self, input_batch): a public method vLLM 0.34.0 does not have",
        "PCPManager.moe_is_padding is missing (vLLM 0.34.0: (self, is_padding))",
        "new: ['req_states'], gone: []",
        "PCP_FN_ALLOW_UNKNOWN_VLLM=1",
    ):
        assert expected in message, (expected, message)
    # a main build between 0.32 and 0.33 (versioned 0.32.1.devN) with 0.33's names: not 0.32's contract
    message = vc.check_installed("0.32.1.dev3", _Sig033, _build034, environ={})
    assert "PCPManager.set_block_tables (self, block_tables): a public method vLLM 0.32.0" in message
    assert "maybe_build_pcp_manager is (vllm_config, device, supports_mm_inputs, block_tables=None" in message
    # an unsupported series: the version policy's message
    assert "supports vLLM 0.30.x, 0.32.x, 0.33.x, 0.34.x" in vc.check_installed(
        "0.35.0", _Sig034, _build034, environ={}
    )


def test_canary_opt_in_serves_with_a_logged_warning(caplog):
    with caplog.at_level("WARNING", logger="pcp_fn.adapters.vllm"):
        assert (
            vc.check_installed("0.34.1.dev7", _Drifted, _drifted_build, {vc.ALLOW_UNKNOWN_ENV: "1"}) is None
        )
    (record,) = caplog.records
    assert "PCPManager.sync_drafts" in record.getMessage() and "serving it anyway" in record.getMessage()
    for value in ("0", "true", ""):  # only "1" opts in
        assert vc.check_installed("0.34.1.dev7", _Drifted, _drifted_build, {vc.ALLOW_UNKNOWN_ENV: value})


def test_canary_names_an_unreadable_build_function():
    namespace: dict = {}
    exec(
        "def maybe_build_pcp_manager(vllm_config, device, supports_mm_inputs, block_tables, cls=None): pass",
        namespace,
    )
    built = namespace["maybe_build_pcp_manager"]
    message = vc.check_installed("0.32.0", _Sig032, built, environ={})
    assert "source is unavailable" in message and "cls=None" in message
