"""The vllm-ascend main (model runner V2) drop-in: ``FunctionalAscendPCPManager`` over a stand-in.

No vllm and no vllm-ascend: the class is built by
``make_functional_ascend_manager`` over ``vllm_standin`` (vLLM's and
vllm-ascend's names) and driven by the vLLM lockstep driver against the slow
oracle, extended with what vllm-ascend's ``AscendPCPManager`` adds to the local
batch (``seq_lens_np``, ``attn_state``, local draft counts) computed here in
plain Python.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import vllm_standin as standin
from oracle_vllm import OracleManager
from vllm_lockstep import Backend, Case, run_lockstep

from pcp_fn.adapters.vllm_ascend import AscendApi, make_functional_ascend_manager
from pcp_fn.adapters.vllm_manager import VllmApi

Mode = standin.CUDAGraphMode

API = SimpleNamespace(
    InputBatch=standin.AscendInputBatch,
    InputBuffers=standin.AscendInputBuffers,
    CUDAGraphMode=Mode,
    BatchExecutionDescriptor=standin.BatchExecutionDescriptor,
    PAD_SLOT_ID=standin.PAD_SLOT_ID,
    get_pcp_group=standin.get_pcp_group,
)

AscendManager = make_functional_ascend_manager(
    VllmApi(
        PCPManager=standin.PCPManager,
        InputBuffers=standin.InputBuffers,
        CUDAGraphMode=Mode,
        PAD_SLOT_ID=standin.PAD_SLOT_ID,
        get_pcp_group=standin.get_pcp_group,
    ),
    AscendApi(
        AscendInputBuffers=standin.AscendInputBuffers,
        build_attn_state=standin.build_attn_state,
        get_pp_group=standin.get_pp_group,
    ),
)
StandinAscendManager = type(
    "StandinAscendManager", (AscendManager,), {"graph_backend": None, "check_host_syncs": True}
)


def vllm_config(mode=Mode.FULL, **overrides):
    parallel = SimpleNamespace(prefill_context_parallel_size=2, data_parallel_size=1)
    model = SimpleNamespace(is_encoder_decoder=False, hf_text_config=SimpleNamespace())
    config = SimpleNamespace(
        parallel_config=parallel,
        model_config=model,
        lora_config=None,
        speculative_config=None,
        compilation_config=SimpleNamespace(cudagraph_mode=mode),
    )
    for key, value in overrides.items():
        obj, _, attr = key.rpartition("__")
        setattr(getattr(config, obj) if obj else config, attr, value)
    return config


def _from_desc(kw: dict) -> dict:
    """The vLLM-shaped constructor arguments of the lockstep driver, as vllm-ascend's runner passes
    them (no ``shard_decode_requests``: vllm-ascend's base replicates decodes)."""
    assert kw.pop("shard_decode_requests") is False
    return {**kw, "req_states": object()}


class LockstepAscend(StandinAscendManager):
    """The driver calls ``partition_batch(batch, desc)``: the runner's arguments from the descriptor."""

    def partition_batch(self, input_batch, desc=None, padded_num_reqs=None):
        if not isinstance(desc, standin.BatchExecutionDescriptor):
            return super().partition_batch(input_batch, desc, padded_num_reqs)
        tokens = None if desc.cg_mode == Mode.NONE else desc.num_tokens
        reqs = desc.num_reqs if desc.cg_mode == Mode.FULL else None
        return super().partition_batch(input_batch, tokens, reqs)


def make_adapter(**kw):
    manager = LockstepAscend(**_from_desc(kw))
    manager.vllm_config = vllm_config(Mode.FULL)
    return manager


class AscendOracle(OracleManager):
    """The oracle's local batch plus vllm-ascend's additions, in plain Python."""

    def __init__(self, **kw):
        super().__init__(API, **kw)
        self._slots = self._slots.to(kw["block_tables"].slot_mappings.dtype)

    def partition_batch(self, g, desc):
        local = super().partition_batch(g, desc)
        n, padded = local.num_reqs, local.num_reqs_after_padding
        seq = [int(c) + int(s) for c, s in zip(local.num_computed_tokens_np, local.num_scheduled_tokens)]
        seq_np = np.array(seq + [0] * (padded - n) if padded > n else seq, dtype=np.int32)
        valid = local.num_scheduled_tokens
        changes = dict(seq_lens_np=seq_np)
        if g.num_draft_tokens:
            by_id = dict(zip(g.req_ids, (int(d) for d in g.num_draft_tokens_per_req)))
            drafts = np.array([by_id[r] for r in local.req_ids], dtype=np.int32)
            changes.update(num_draft_tokens=int(sum(drafts.tolist())), num_draft_tokens_per_req=drafts)
            valid = valid - drafts
        changes["attn_state"] = standin.build_attn_state(
            None, np.array(seq, np.int32), n, local.num_scheduled_tokens, valid
        )
        self.local = dataclasses.replace(local, **changes)
        return self.local


def ascend_backend() -> Backend:
    oracle = lambda **kw: AscendOracle(**kw)  # noqa: E731
    return Backend(
        name="ascend-standin",
        api=API,
        block_tables_cls=standin.AscendBlockTables,
        make_reference=oracle,
        make_adapter=make_adapter,
        make_oracle=oracle,
        reference_takes_full_mixed=True,
        group=standin.PCP_GROUP,
    )


CASES = [
    Case(P=2, shard=False, spec=1),
    Case(P=3, shard=False, seed=2),
    Case(P=4, shard=False, dcp=2, interleave=2, spec=2, seed=3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"P{c.P}-dcp{c.dcp}-spec{c.spec}")
def test_lockstep_against_oracle(case):
    summary = run_lockstep(ascend_backend(), case)
    assert summary.steps >= 12 and summary.mixed and summary.decode_only and summary.tail
    assert set(summary.modes) == {"NONE", "PIECEWISE", "FULL"}, summary.modes
    assert {"seq_lens_np", "attn_state", "num_draft_tokens_per_req"} <= summary.fields


def _manager(P=2, rank=0, R=4, T=16, mode=Mode.FULL_DECODE_ONLY):
    bt = standin.AscendBlockTables([4], R, T, [8], torch.device("cpu"))
    m = StandinAscendManager(P, rank, torch.device("cpu"), None, R, T, bt)
    m.vllm_config = vllm_config(mode)
    return m, bt


def _decode_batch(n, padded_tokens, padded_reqs, drafts=None):
    sched = np.full(n, 1 if drafts is None else 1 + drafts, np.int32)
    computed = np.arange(5, 5 + n, dtype=np.int32)
    total = int(sched.sum())
    qsl = np.full(padded_reqs + 1, total, np.int32)
    qsl[0] = 0
    np.cumsum(sched, out=qsl[1 : n + 1])
    seq = np.zeros(padded_reqs, np.int32)
    seq[:n] = computed + sched
    pos = np.concatenate([np.arange(c, c + s) for c, s in zip(computed, sched)])
    pos = np.pad(pos, (0, padded_tokens - total))
    idx = torch.arange(n)
    return standin.AscendInputBatch(
        req_ids=[f"r{i}" for i in range(n)],
        num_reqs=n,
        num_reqs_after_padding=padded_reqs,
        idx_mapping=idx,
        idx_mapping_np=np.arange(n, dtype=np.intp),
        expanded_idx_mapping=idx,
        expanded_local_pos=torch.zeros(n, dtype=torch.int32),
        num_scheduled_tokens=sched,
        num_tokens=total,
        num_tokens_after_padding=padded_tokens,
        num_draft_tokens=0 if drafts is None else drafts * n,
        num_draft_tokens_per_req=None if drafts is None else np.full(n, drafts, np.int32),
        query_start_loc=torch.from_numpy(qsl),
        query_start_loc_np=qsl,
        seq_lens=torch.from_numpy(seq),
        seq_lens_cpu_upper_bound=torch.from_numpy(seq.copy()),
        dcp_local_seq_lens=None,
        num_computed_tokens_np=computed,
        prefill_len_np=np.full(n, 3, np.int32),
        num_computed_prefill_tokens_np=np.full(n, 3, np.int32),
        is_prefilling_np=np.zeros(n, np.bool_),
        has_prefill=False,
        decode_graph_eligible=True,
        input_ids=torch.arange(padded_tokens, dtype=torch.int32),
        positions=torch.from_numpy(pos.astype(np.int64)),
        is_padding=torch.arange(padded_tokens) >= total,
        logits_indices=torch.from_numpy(qsl[1 : n + 1] - 1),
        cu_num_logits=torch.arange(n + 1, dtype=torch.int32),
        cu_num_logits_np=np.arange(n + 1, dtype=np.int32),
        has_structured_output_reqs=False,
        prompt_lens=None,
    )


def test_full_decode_only_pads_requests_to_the_token_count():
    m, _ = _manager()
    seq_buf = m.input_buffers.seq_lens_np
    g = _decode_batch(3, padded_tokens=8, padded_reqs=4)
    local = m.partition_batch(g, padded_num_tokens=8, padded_num_reqs=4)
    assert (local.num_reqs, local.num_reqs_after_padding, local.num_tokens_after_padding) == (3, 8, 8)
    assert local.seq_lens_np.tolist() == [6, 7, 8, 0, 0, 0, 0, 0]
    assert np.shares_memory(local.seq_lens_np, seq_buf)
    assert local.seq_lens.tolist() == [6, 7, 8, 0, 0, 0, 0, 0]
    assert local.query_start_loc_np.tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3]
    assert local.attn_state is standin.AscendAttentionState.DecodeOnly
    assert m.input_buffers.query_start_loc.shape == (2 * 4 + 1,)  # vLLM's size, not the FIA slot
    # with drafts the request rows keep the request extent; draft counts and state follow
    m2, _ = _manager()
    g = _decode_batch(3, padded_tokens=8, padded_reqs=4, drafts=1)
    local = m2.partition_batch(g, padded_num_tokens=8, padded_num_reqs=4)
    assert (local.num_reqs_after_padding, local.num_draft_tokens) == (4, 3)
    assert local.num_draft_tokens_per_req.tolist() == [1, 1, 1]
    assert local.seq_lens_np.tolist() == [7, 8, 9, 0]
    assert local.attn_state is standin.AscendAttentionState.SpecDecoding


def test_slot_mappings_in_the_block_tables_dtype_and_constructor():
    m, bt = _manager()
    bufs = m.persistent_buffers()
    assert bufs["global_slot_mappings"].dtype == bufs["gathered_slot_mappings"].dtype == torch.int32
    assert bt.slot_mappings.dtype == torch.int32 and m.req_states is None
    assert m.shard_decode_requests is False
    with pytest.raises(RuntimeError, match="no batch was partitioned"):
        m.global_batch  # noqa: B018


def test_draft_tokens_on_a_prefill_are_refused():
    m, _ = _manager()
    g = _decode_batch(2, 4, 2, drafts=1)
    g = dataclasses.replace(g, is_prefilling_np=np.array([True, False]))
    with pytest.raises(NotImplementedError, match="draft tokens on prefill"):
        m.partition_batch(g)


def test_pipeline_stage_and_broadcast():
    m, _ = _manager()
    h = torch.randn(4, 3)
    standin.PP_GROUP.is_last_rank = False
    try:
        assert not m.is_last_pp_rank
        assert m.restore_hidden_states(h) is h
    finally:
        standin.PP_GROUP.is_last_rank = True
    assert m.is_last_pp_rank
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    assert m.broadcast_replicated_hidden_states(a, b, 3, False) == (a, b)
    group = standin.PCP_GROUP
    group.broadcast_from = [torch.ones(3, 3), torch.zeros(3, 3)]
    last, hidden = m.broadcast_replicated_hidden_states(a, a, 3, True)
    assert last is hidden and torch.equal(last, torch.ones(3, 3))
    last, hidden = m.broadcast_replicated_hidden_states(a, b, 3, True)
    assert last is not hidden and torch.equal(hidden, torch.ones(3, 3))


REJECTED = [
    ({"model_config__is_encoder_decoder": True}, False, "encoder-decoder"),
    ({}, True, "MM"),
    ({"lora_config": object()}, False, "LoRA"),
    ({"speculative_config": SimpleNamespace(method="ngram", draft_sample_method="greedy")}, False, "ngram"),
    ({"speculative_config": SimpleNamespace(method="mtp", draft_sample_method="random")}, False, "greedy"),
    ({"parallel_config__data_parallel_size": 2}, False, "data parallel"),
    ({"model_config__hf_text_config": SimpleNamespace(index_topk=8)}, False, "sparse MLA"),
]


@pytest.mark.parametrize("overrides,mm,match", REJECTED, ids=lambda x: x if isinstance(x, str) else None)
def test_validate_config_rejections(overrides, mm, match):
    with pytest.raises(NotImplementedError, match=match):
        StandinAscendManager.validate_config(vllm_config(Mode.FULL, **overrides), mm)


def test_validate_config_accepts_full_and_decode_only():
    for mode in (Mode.NONE, Mode.PIECEWISE, Mode.FULL, Mode.FULL_DECODE_ONLY):
        StandinAscendManager.validate_config(vllm_config(mode), False)
    with pytest.raises(NotImplementedError, match="FULL_AND_PIECEWISE"):
        StandinAscendManager.validate_config(vllm_config(Mode.FULL_AND_PIECEWISE), False)
    StandinAscendManager.validate_config(
        vllm_config(Mode.FULL_DECODE_ONLY, parallel_config__data_parallel_size=2), False
    )
    spec = SimpleNamespace(method="eagle3", draft_sample_method="greedy")
    StandinAscendManager.validate_config(vllm_config(Mode.FULL, speculative_config=spec), False)
    # PCP off: nothing is checked (as vllm-ascend)
    StandinAscendManager.validate_config(
        vllm_config(Mode.FULL, parallel_config__prefill_context_parallel_size=1, lora_config=object()), True
    )
    # vllm-ascend's manager does not refuse DCP or PP with PCP: neither does this one
    StandinAscendManager.validate_config(vllm_config(Mode.FULL), False)


def test_the_real_class_is_built_lazily():
    import pcp_fn.adapters.vllm_ascend as va

    assert "FunctionalAscendPCPManager" in va.__all__
    with pytest.raises(AttributeError):
        va.NotAName  # noqa: B018
