"""The vllm-ascend main (model runner V2) drop-in: ``FunctionalAscendPCPManager`` over a stand-in.

No vllm and no vllm-ascend: the class is built by
``make_functional_ascend_manager`` over ``vllm_standin`` (vLLM's and
vllm-ascend's names) and driven by the V2 lockstep driver
(``ascend_v2_lockstep``: the V2 runner's call order, every method) against
:class:`AscendOracle`: the slow MRV2 oracle (``oracle_vllm`` / ``oracle_mrv2``)
plus what vllm-ascend's ``AscendPCPManager`` adds, in plain Python. The same
driver runs against vllm-ascend's own class in
``tools/check_ascend_v2_manager_against_reference.py`` (vLLM 0.32.0 and the
reference source needed: a tool, since tests read nothing outside the repository).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import vllm_standin as standin
from ascend_v2_lockstep import AscendBackend, PPGroup, PrefixGroup, build_attn_state, run_ascend_lockstep
from oracle_vllm import OracleManager
from vllm_lockstep import Case

from pcp_fn.adapters.vllm import VllmApi
from pcp_fn.adapters.vllm.contract import detect
from pcp_fn.adapters.vllm_ascend import AscendApi, PCPAttentionContext, make_functional_ascend_manager

Mode = standin.CUDAGraphMode
GROUP = PrefixGroup()
PP = PPGroup()

API = SimpleNamespace(
    InputBatch=standin.AscendInputBatch,
    InputBuffers=standin.AscendInputBuffers,
    CUDAGraphMode=Mode,
    BatchExecutionDescriptor=standin.BatchExecutionDescriptor,
    PAD_SLOT_ID=standin.PAD_SLOT_ID,
    get_pcp_group=lambda: GROUP,
)


def ascend_manager(
    build_state=standin.build_attn_state, group=standin.get_pcp_group, pp=standin.get_pp_group
):
    cls = make_functional_ascend_manager(
        VllmApi(**standin.vllm_api_fields(get_pcp_group=group)),
        AscendApi(
            AscendInputBuffers=standin.AscendInputBuffers, build_attn_state=build_state, get_pp_group=pp
        ),
    )
    return type("StandinAscendManager", (cls,), {"graph_backend": None, "check_host_syncs": True})


StandinAscendManager = ascend_manager()
LockstepAscendManager = ascend_manager(build_attn_state, lambda: GROUP, lambda: PP)


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


# --------------------------------------------------------------------------- the oracle


class AscendOracle(OracleManager):
    """vllm-ascend's ``AscendPCPManager`` in plain Python: the slow MRV2 oracle's local batch
    (decodes replicated) plus the Ascend additions. Values only: fresh tensors every call."""

    vllm_config = None

    def __init__(self, req_states=None, api=API, **kw):
        super().__init__(api, shard_decode_requests=False, **kw)
        self.pcp_world_size, self.pcp_rank = self.P, self.rank
        self.dcp_world_size, self.dcp_rank = self.dcp, kw.get("dcp_rank", 0)
        self.input_buffers = standin.AscendInputBuffers(2 * self.R, self.T, self.device)
        self.input_buffers.query_start_loc = self.input_buffers.query_start_loc[:-1]
        self.restore_idx: list[int] = []
        self.Lp = 0

    def set_block_tables(self, block_tables):
        super().set_block_tables(block_tables)
        self.cp_interleave = self.interleave
        if block_tables is not None:  # slot mappings in the block tables' dtype
            self._slots = self._slots.to(block_tables.slot_mappings.dtype)

    @property
    def is_last_pp_rank(self):
        return PP.is_last_rank

    def partition_batch(self, g, padded_num_tokens=None, padded_num_reqs=None):
        Mode = self.api.CUDAGraphMode  # the stand-in's, or the installed vLLM's
        pf = [bool(x) for x in g.is_prefilling_np]
        decode_only, spec = not any(pf), g.num_draft_tokens > 0
        if spec and any(int(d) for d, p in zip(g.num_draft_tokens_per_req, pf) if p):
            raise NotImplementedError("draft tokens on prefill")
        if padded_num_reqs is not None and not decode_only:
            desc = SimpleNamespace(cg_mode=Mode.FULL, num_tokens=padded_num_tokens, num_reqs=padded_num_reqs)
        elif spec or padded_num_tokens is None:
            desc = SimpleNamespace(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None)
        else:
            desc = SimpleNamespace(cg_mode=Mode.PIECEWISE, num_tokens=padded_num_tokens, num_reqs=None)
        local = super().partition_batch(g, desc)
        self.Lp = local.num_tokens_after_padding
        n, num_local, total = local.num_reqs, local.num_tokens, g.num_tokens
        rows = int(g.query_start_loc_np[-1])
        self.restore_idx = list(self.layout.hidden_restore_idx) + [0] * (rows - total)
        changes = {}
        if spec:  # padding rows of the layout read global token 0
            ids = local.input_ids.tolist()
            ids[num_local:] = [int(g.input_ids[0])] * (len(ids) - num_local)
            local.input_ids.copy_(torch.tensor(ids, dtype=torch.int32))
            by_id = dict(zip(g.req_ids, (int(d) for d in g.num_draft_tokens_per_req)))
            drafts = np.array([by_id[r] for r in local.req_ids], dtype=np.int32)
            changes.update(num_draft_tokens=int(sum(drafts.tolist())), num_draft_tokens_per_req=drafts)
        G = g.num_tokens_after_padding
        fdo = self.vllm_config.compilation_config.cudagraph_mode == Mode.FULL_DECODE_ONLY
        graph_reqs = G if decode_only and fdo and not spec else g.num_reqs_after_padding
        if decode_only and (G > local.num_tokens_after_padding or graph_reqs > local.num_reqs_after_padding):
            qsl = [int(x) for x in g.query_start_loc_np[: graph_reqs + 1]]
            pad_t = lambda t, v: torch.tensor(t.tolist()[:num_local] + [v] * (G - num_local), dtype=t.dtype)  # noqa: E731
            upper = local.seq_lens_cpu_upper_bound.tolist()[:n] + [0] * (graph_reqs - n)
            changes.update(
                num_reqs_after_padding=graph_reqs,
                num_tokens_after_padding=G,
                query_start_loc=torch.tensor(qsl, dtype=torch.int32),
                query_start_loc_np=np.array(qsl, dtype=np.int32),
                seq_lens=torch.tensor(
                    local.seq_lens.tolist()[:n] + [0] * (graph_reqs - n), dtype=torch.int32
                ),
                seq_lens_cpu_upper_bound=torch.tensor(upper, dtype=torch.int32),
                dcp_local_seq_lens=None,
                input_ids=pad_t(local.input_ids, 0),
                positions=pad_t(local.positions, 0),
                is_padding=torch.tensor([False] * num_local + [True] * (G - num_local)),
            )
        padded = changes.get("num_reqs_after_padding", local.num_reqs_after_padding)
        seq = [int(c) + int(s) for c, s in zip(local.num_computed_tokens_np, local.num_scheduled_tokens)]
        changes["seq_lens_np"] = np.array(seq + [0] * (padded - n), dtype=np.int32)
        valid = local.num_scheduled_tokens
        if spec:
            valid = valid - changes["num_draft_tokens_per_req"]
        changes["attn_state"] = build_attn_state(
            self.vllm_config, np.array(seq, np.int32), n, local.num_scheduled_tokens, valid
        )
        if spec or "num_tokens_after_padding" in changes:
            return dataclasses.replace(local, **changes)
        for k, v in changes.items():
            setattr(local, k, v)
        return local

    def prepare_attn(self, local):
        tables, slots = super().prepare_attn(local)
        g = self.global_batch
        G, P = g.num_tokens_after_padding, self.P
        if any(bool(x) for x in g.is_prefilling_np) or G <= g.num_tokens:
            return tables, slots
        X, pad = slots.shape[1] // P, self.api.PAD_SLOT_ID
        rows = [
            [v for q in range(P) for v in r[q * X : (q + 1) * X] + [pad] * (G - X)] for r in slots.tolist()
        ]
        return tables, torch.tensor(rows, dtype=slots.dtype)

    def build_attention_context(self, batch=None, block_tables=None, slot_mappings=None):
        if batch is not None and batch.is_dummy:
            L, q = batch.num_tokens_after_padding, self.rank
            return PCPAttentionContext(
                global_batch=batch,
                global_block_tables=block_tables,
                global_slot_mappings=torch.tensor([r[q * L : (q + 1) * L] for r in slot_mappings.tolist()],
                                                  dtype=slot_mappings.dtype),
                hidden_restore_idx=torch.arange(q * L, q * L + L),
            )  # fmt: skip
        g, bt = self.global_batch, self.block_tables
        slots = bt.compute_slot_mappings(
            g.idx_mapping, g.query_start_loc, g.positions, g.num_tokens_after_padding
        )
        num_blocks = None
        if self.dcp > 1 and any(bool(x) for x in g.is_prefilling_np):
            rows = [
                [int(bt.num_blocks.np[k, s]) for s in g.idx_mapping_np[: g.num_reqs]]
                for k in range(bt.num_kv_cache_groups)
            ]
            num_blocks = torch.tensor(rows, dtype=torch.int32)
        return PCPAttentionContext(
            global_batch=g,
            global_block_tables=tuple(
                t.clone() for t in bt.gather_block_tables(g.idx_mapping, g.num_reqs_after_padding)
            ),
            global_slot_mappings=slots.clone(),
            hidden_restore_idx=torch.tensor(self.restore_idx, dtype=torch.int64),
            padded_gather_idx=torch.tensor(self.layout.padded_gather_idx, dtype=torch.int64),
            gathered_kv_write_mask=torch.tensor(self.layout.write_mask, dtype=torch.bool),
            global_block_table_num_blocks=num_blocks,
        )  # fmt: skip

    def restore_hidden_states(self, hidden):
        if not PP.is_last_rank or self.global_batch is None:
            return hidden
        g = self.global_batch
        gathered = GROUP.all_gather(hidden, dim=0)
        out = gathered[torch.tensor(self.restore_idx, dtype=torch.int64)]
        if g.num_tokens != g.num_tokens_after_padding:
            assert out.shape[0] == g.num_tokens_after_padding
            out[g.num_tokens :] = 0
        return out

    def restore_hidden_state_buffer(self, hidden):
        if PP.is_last_rank:
            restored = self.restore_hidden_states(hidden[: self.Lp])
            hidden[: restored.shape[0]] = restored

    def restore_for_sampling(self, hidden, aux):
        if not PP.is_last_rank:
            return hidden, aux, self.global_batch
        return super().restore_for_sampling(hidden, aux)

    @staticmethod
    def broadcast_replicated_hidden_states(last, hidden, num_tokens, replicated):
        if not replicated:
            return last, hidden
        out = GROUP.broadcast(last[:num_tokens], src=0)
        return out, out if hidden is last else GROUP.broadcast(hidden[:num_tokens], src=0)

    def prepare_dummy_attn(self, batch):
        ib, t, r = self.input_buffers, batch.num_tokens_after_padding, batch.num_reqs_after_padding
        for f in ("input_ids", "positions", "is_padding"):
            getattr(ib, f)[:t] = getattr(batch, f)
        ib.query_start_loc[: r + 1] = batch.query_start_loc
        ib.seq_lens[:r] = batch.seq_lens
        ib.seq_lens_np[:r] = batch.seq_lens_np[:r]
        return self.get_dummy_block_tables(r), self.get_dummy_slot_mappings(t)


def ascend_backend() -> AscendBackend:
    return AscendBackend(
        name="ascend-oracle",
        api=API,
        block_tables_cls=standin.AscendBlockTables,
        make_reference=lambda **kw: AscendOracle(**kw),
        make_adapter=lambda **kw: LockstepAscendManager(**kw),
        group=GROUP,
        pp=PP,
    )


CASES = [
    (Case(P=2, shard=False, seed=1), "FULL_DECODE_ONLY"),
    (Case(P=2, shard=False, spec=1, seed=2), "FULL"),
    (Case(P=3, shard=False, seed=3), "PIECEWISE"),
    (Case(P=3, shard=False, spec=2, seed=4), "NONE"),
    (Case(P=4, shard=False, dcp=2, interleave=2, seed=6), "FULL_DECODE_ONLY"),
    (Case(P=4, shard=False, spec=1, seed=7), "PIECEWISE"),
    (Case(P=8, shard=False, dcp=4, seed=9, T=64), "NONE"),
    (Case(P=8, shard=False, seed=10, T=64), "FULL"),
]


@pytest.mark.parametrize(
    "case,graphs", CASES, ids=lambda x: x if isinstance(x, str) else f"P{x.P}-dcp{x.dcp}-spec{x.spec}"
)
def test_lockstep_against_oracle(case, graphs):
    s = run_ascend_lockstep(ascend_backend(), dataclasses.replace(case, max_steps=24), graphs)
    assert s.steps >= 12 and s.mixed and s.decode_only and s.dummies and s.off_last_stage and s.drafts
    assert s.graph_padded, "no decode-only step was padded to its graph"
    if graphs == "NONE":
        assert s.rank_by_rank_slots, "no step laid the slot mappings out rank by rank"
    if graphs == "FULL":
        assert s.full_mixed, "no FULL graph of a mixed batch"
    if case.spec:
        assert s.spec
    fields = {
        "seq_lens_np",
        "attn_state",
        "num_draft_tokens_per_req",
        "is_dummy",
        "context.hidden_restore_idx",
    }
    assert fields <= s.fields


def release_backend(release: str) -> AscendBackend:
    """The lockstep over vLLM ``release``'s base (its stand-in names: ``vllm_standin.release``):
    the drop-in built on ``FunctionalPCPManager`` for that release's contract, the oracle with
    that release's per-step metadata, driven in that release's call order."""
    base, module = standin.release(release)
    contract = detect(base, module)
    assert contract.name == release
    fields = standin.vllm_api_fields(PCPManager=base, get_pcp_group=lambda: GROUP, contract=contract)
    cls = make_functional_ascend_manager(
        VllmApi(**fields),
        AscendApi(
            AscendInputBuffers=standin.AscendInputBuffers,
            build_attn_state=build_attn_state,
            get_pp_group=lambda: PP,
        ),
    )
    adapter = type("ReleaseAscendManager", (cls,), {"graph_backend": None, "check_host_syncs": True})
    api = SimpleNamespace(**vars(API), PCPBatchMetadata=getattr(module, "PCPBatchMetadata", None))
    return dataclasses.replace(
        ascend_backend(),
        name=f"ascend-oracle-{release}",
        make_reference=lambda **kw: AscendOracle(api=api, **kw),
        make_adapter=lambda **kw: adapter(**kw),
        contract=contract,
    )


@pytest.mark.parametrize("release", ["0.33-dev", "0.33", "0.34"])
@pytest.mark.parametrize(
    "case,graphs", [CASES[1], CASES[4], CASES[6]], ids=lambda x: x if isinstance(x, str) else f"P{x.P}"
)
def test_lockstep_on_every_supported_vllm_base(release, case, graphs):
    """The V2 drop-in keeps its checks on vLLM 0.33 and 0.34 bases: built without block tables
    and given them by ``set_block_tables``, the two-argument draft buffers, the renamed capture
    staging, and (0.33, 0.34) the local batch's ``pcp`` metadata, all equal to the oracle's."""
    backend = release_backend(release)
    s = run_ascend_lockstep(backend, dataclasses.replace(case, max_steps=16), graphs)
    assert s.steps >= 10 and s.mixed and s.decode_only and s.dummies and s.drafts
    if backend.contract.batch_metadata is not None:
        assert "pcp" in s.fields


@pytest.fixture
def vllm_ascend_backend():
    """The lockstep over the installed vLLM's real ``PCPManager`` (0.32, 0.33 or 0.34, its
    contract detected like the package does), vllm-ascend's names from the stand-in (vllm-ascend
    has no CPU build): the V2 drop-in on every base a user can have under it."""
    pytest.importorskip("vllm")
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu import pcp_manager as vllm_pcp
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    # vllm-ascend's fields over the installed vLLM's classes
    RealAscendInputBatch, RealAscendInputBuffers = standin.ascend_classes(InputBatch, InputBuffers)

    contract = detect(vllm_pcp.PCPManager, vllm_pcp)
    api = SimpleNamespace(
        InputBatch=RealAscendInputBatch,
        InputBuffers=RealAscendInputBuffers,
        CUDAGraphMode=CUDAGraphMode,
        BatchExecutionDescriptor=BatchExecutionDescriptor,
        PAD_SLOT_ID=vllm_pcp.PAD_SLOT_ID,
        get_pcp_group=lambda: GROUP,
        PCPBatchMetadata=getattr(vllm_pcp, "PCPBatchMetadata", None),  # vLLM 0.33+
    )
    cls = make_functional_ascend_manager(
        VllmApi(
            PCPManager=vllm_pcp.PCPManager,
            InputBuffers=InputBuffers,
            CUDAGraphMode=CUDAGraphMode,
            PAD_SLOT_ID=vllm_pcp.PAD_SLOT_ID,
            get_pcp_group=lambda: GROUP,
            contract=contract,
        ),
        AscendApi(
            AscendInputBuffers=RealAscendInputBuffers,
            build_attn_state=build_attn_state,
            get_pp_group=lambda: PP,
        ),
    )
    assert issubclass(cls, vllm_pcp.PCPManager)
    adapter = type("RealBaseAscendManager", (cls,), {"graph_backend": None, "check_host_syncs": True})
    return AscendBackend(
        name=f"ascend-oracle-vllm-{contract.name}",
        api=api,
        block_tables_cls=standin.AscendBlockTables,  # vLLM's are Triton kernels: no CPU backend
        make_reference=lambda **kw: AscendOracle(api=api, **kw),
        make_adapter=lambda **kw: adapter(**kw),
        group=GROUP,
        pp=PP,
        contract=contract,
    )


@pytest.mark.parametrize(
    "case,graphs", [CASES[1], CASES[4], CASES[7]], ids=lambda x: x if isinstance(x, str) else f"P{x.P}"
)
def test_lockstep_over_the_installed_vllm(vllm_ascend_backend, case, graphs):
    s = run_ascend_lockstep(vllm_ascend_backend, dataclasses.replace(case, max_steps=16), graphs)
    assert s.steps >= 10 and s.mixed and s.decode_only and s.dummies and s.drafts
    print(f"\n{vllm_ascend_backend.name} {s.configs[0]}: {s.steps} steps, {len(s.fields)} fields equal")


def _manager(P=2, rank=0, R=4, T=16, mode=Mode.FULL_DECODE_ONLY, cls=StandinAscendManager):
    bt = standin.AscendBlockTables([8], R, T, [8], torch.device("cpu"))
    m = cls(P, rank, torch.device("cpu"), None, R, T, bt)
    m.vllm_config = vllm_config(mode)
    return m, bt


def _decode_batch(n, padded_tokens, padded_reqs, drafts=None, fia=False):
    """A decode-only global batch; ``fia``: vllm-ascend's uniform FIA padding (one token per
    padding request, so ``query_start_loc_np[-1] == padded_tokens``)."""
    sched = np.full(n, 1 if drafts is None else 1 + drafts, np.int32)
    computed = np.arange(5, 5 + n, dtype=np.int32)
    total = int(sched.sum())
    qsl = np.full(padded_reqs + 1, total, np.int32)
    qsl[0] = 0
    np.cumsum(sched, out=qsl[1 : n + 1])
    if fia:
        qsl[n + 1 :] = total + np.arange(1, padded_reqs - n + 1)
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
    g = _decode_batch(3, padded_tokens=8, padded_reqs=8, fia=True)
    local = m.partition_batch(g, padded_num_tokens=8, padded_num_reqs=8)
    assert (local.num_reqs, local.num_reqs_after_padding, local.num_tokens_after_padding) == (3, 8, 8)
    assert local.seq_lens_np.tolist() == [6, 7, 8, 0, 0, 0, 0, 0]
    assert np.shares_memory(local.seq_lens_np, seq_buf)
    assert local.seq_lens.tolist() == [6, 7, 8, 0, 0, 0, 0, 0]
    # decodes are replicated: the global query layout (FIA padding requests included) is the local one
    assert local.query_start_loc_np.tolist() == list(range(9)) == local.query_start_loc.tolist()
    assert local.is_prefilling_np.shape == (3,)  # as vllm-ascend: the layout's rows
    assert local.attn_state is standin.AscendAttentionState.DecodeOnly
    assert m.input_buffers.query_start_loc.shape == (2 * 4 + 1,)  # vLLM's size, not the FIA slot
    assert m.draft_prefill_batch is None and m._local_batch is not local  # the drafter's is the layout's
    # a FULL_DECODE_ONLY graph's request rows are its tokens: the global batch must have them
    with pytest.raises(ValueError, match="query_start_loc_np has 5 entries"):
        _manager()[0].partition_batch(_decode_batch(3, padded_tokens=8, padded_reqs=4), 8, 4)
    # with drafts the request rows keep the request extent; draft counts and state follow
    m2, _ = _manager()
    g = _decode_batch(3, padded_tokens=8, padded_reqs=4, drafts=1)
    local = m2.partition_batch(g, padded_num_tokens=8, padded_num_reqs=4)
    assert (local.num_reqs_after_padding, local.num_draft_tokens) == (4, 3)
    assert local.num_draft_tokens_per_req.tolist() == [1, 1, 1]
    assert local.seq_lens_np.tolist() == [7, 8, 9, 0]
    assert local.attn_state is standin.AscendAttentionState.SpecDecoding


def test_padded_decode_graph_restores_and_lays_out_slots_rank_by_rank():
    """Eager data-parallel padding: 3 decodes, global graph of 5 tokens (one FIA dummy request)
    on a 3-token layout. Slot mappings per rank: the 3 rows then padding; restores give 5 rows,
    the last 2 zero, also into a model-owned buffer."""
    P = 2
    ms, bts = zip(*(_manager(P=P, rank=q, mode=Mode.NONE, cls=LockstepAscendManager) for q in range(P)))
    for bt in bts:
        for s in range(3):
            bt.set_row(s, [[10 + s]])
    g = _decode_batch(3, padded_tokens=5, padded_reqs=3)
    g = dataclasses.replace(
        g,
        num_reqs_after_padding=4,
        query_start_loc_np=np.array([0, 1, 2, 3, 5], np.int32),
        query_start_loc=torch.tensor([0, 1, 2, 3, 5], dtype=torch.int32),
        idx_mapping=torch.arange(3, dtype=torch.int64),
    )
    locals_ = [m.partition_batch(g) for m in ms]
    assert [(b.num_tokens, b.num_tokens_after_padding, b.num_reqs_after_padding) for b in locals_] == [
        (3, 5, 4)
    ] * P
    assert locals_[0].query_start_loc_np.tolist() == [0, 1, 2, 3, 5]
    slots = [m.prepare_attn(b)[1] for m, b in zip(ms, locals_)]
    row = [10 * 8 + 5, 11 * 8 + 6, 12 * 8 + 7]  # block size 8: slot = block * 8 + position
    assert slots[0].tolist() == [row + [-1, -1] + [-1] * 5]  # replicated: rank 0 writes
    ctx = ms[0].build_attention_context(locals_[0], None, None)
    assert ctx.padded_gather_idx.tolist() == [0, 1, 2] * P  # the layout: 3 tokens per rank
    assert ctx.hidden_restore_idx.tolist() == [0, 1, 2, 0, 0]
    assert ctx.global_slot_mappings.tolist() == [row + [-1, -1]]
    hidden = [torch.tensor([[1.0], [2.0], [3.0], [0.0], [0.0]]) + 10 * q for q in range(P)]
    GROUP.stage(hidden)
    try:
        for q, m in enumerate(ms):
            assert m.restore_hidden_states(hidden[q]).flatten().tolist() == [1, 2, 3, 0, 0]
        buffers = [torch.cat([h[:3], torch.full((4, 1), 7.0)]) for h in hidden]
        GROUP.stage(buffers)
        ms[1].restore_hidden_state_buffer(buffers[1])
        assert buffers[1].flatten().tolist() == [1, 2, 3, 0, 0, 7, 7]
    finally:
        GROUP.clear()


def test_dummy_runs_stage_the_buffers_and_make_their_own_context():
    m, _ = _manager(P=2, rank=1, cls=LockstepAscendManager)
    g = _decode_batch(2, padded_tokens=4, padded_reqs=2)
    dummy = dataclasses.replace(
        g,
        is_dummy=True,
        seq_lens_np=np.array([3, 4], np.int32),
        input_ids=torch.tensor([5, 6, 0, 0], dtype=torch.int32),
    )
    tables, slots = m.prepare_dummy_attn(dummy)
    ib = m.input_buffers
    assert ib.input_ids[:4].tolist() == [5, 6, 0, 0] and ib.seq_lens_np[:2].tolist() == [3, 4]
    assert tables[0].shape == (2, 8) and not tables[0].any() and slots.shape == (1, 8) and (slots == -1).all()
    ctx = m.build_attention_context(dummy, tables, slots)
    assert ctx.global_batch is dummy and ctx.hidden_restore_idx.tolist() == [4, 5, 6, 7]
    assert ctx.global_slot_mappings.shape == (1, 4) and ctx.padded_gather_idx is None
    with pytest.raises(ValueError, match="needs block_tables"):
        m.build_attention_context(dummy)
    with pytest.raises(ValueError, match="num_reqs=9 exceeds"):
        m.get_dummy_block_tables(9)


def test_slot_mappings_in_the_block_tables_dtype_and_constructor():
    m, bt = _manager()
    bufs = m.persistent_buffers()
    assert bufs["global_slot_mappings"].dtype == bufs["gathered_slot_mappings"].dtype == torch.int32
    assert bt.slot_mappings.dtype == torch.int32 and m.req_states is None
    assert m.shard_decode_requests is False
    with pytest.raises(RuntimeError, match="unavailable before partition_batch"):
        m.global_batch  # noqa: B018


def test_draft_tokens_on_a_prefill_are_refused():
    m, _ = _manager()
    g = _decode_batch(2, 4, 2, drafts=1)
    g = dataclasses.replace(g, is_prefilling_np=np.array([True, False]))
    with pytest.raises(NotImplementedError, match="draft tokens on prefill"):
        m.partition_batch(g)


def test_bad_inputs_are_refused_by_name_as_in_the_vllm_drop_in():
    """The vLLM drop-in's input checks hold here too (it is the base), and vllm-ascend's own
    padded sizes are named: a float id or graph size, a mismatched num_tokens."""
    m, _ = _manager()
    g = _decode_batch(3, padded_tokens=8, padded_reqs=8, fia=True)
    for kwargs, error, match in (
        (
            dict(padded_num_tokens=8.0, padded_num_reqs=8),
            TypeError,
            "padded_num_tokens must be an int, got float",
        ),
        (
            dict(padded_num_tokens=8, padded_num_reqs=True),
            TypeError,
            "padded_num_reqs must be an int, got bool",
        ),
    ):
        with pytest.raises(error, match=match):
            m.partition_batch(g, **kwargs)
    for change, error, match in (
        ({"input_ids": g.input_ids.float()}, TypeError, "input_ids must be torch.int32"),
        ({"num_tokens": 5}, ValueError, "num_tokens=5 disagrees"),
    ):
        with pytest.raises(error, match=match):
            m.partition_batch(dataclasses.replace(g, **change), padded_num_tokens=8, padded_num_reqs=8)
    assert m.partition_batch(g, padded_num_tokens=8, padded_num_reqs=8).num_reqs == 3


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


def test_constructor_without_capacities():
    """vllm-ascend's defaults (``max_num_reqs=None``, ``max_num_tokens=None``), as for the base: no
    buffers, the host methods work, the device path names what it needs."""
    m = ascend_manager()(pcp_world_size=2, pcp_rank=0, device=torch.device("cpu"))
    assert m.get_num_tokens_for_dispatch(np.array([3, 8]), np.array([False, True])) == 7
    with pytest.raises(RuntimeError, match="needs the max_num_reqs and max_num_tokens"):
        m.persistent_buffers()


@pytest.mark.parametrize("env, backend", [("auto", None), ("none", None), ("eager", "eager")])
def test_pcp_fn_graph_backend_configures_the_v2_drop_in(monkeypatch, env, backend):
    """The switch of every drop-in: ``PCP_FN_GRAPH_BACKEND`` picks the graphs of the class built
    next (``FunctionalAscendPCPManager`` is built on first access), every rung of its ladder made
    at construction (``auto`` on the CPU: plain calls)."""
    monkeypatch.setenv("PCP_FN_GRAPH_BACKEND", env)
    base = ascend_manager()
    cls = type("Switched", (base.__mro__[1],), {"check_host_syncs": False})  # the built class's default
    assert cls.graph_backend == env
    m, _ = _manager(cls=cls)
    assert m.graph_stats.prepared == (0 if backend is None else len(m.bookkeeper.graphs.ladder))
    assert m.bookkeeper.graphs.backend == backend


def test_the_v2_drop_in_records_its_schedule(tmp_path, monkeypatch):
    """PCP_FN_RECORD_SCHEDULE (or record_schedule=) records what the vllm-ascend V2 drop-in
    lays out, replicated decodes and all; the trace replays."""
    from pcp_fn.sim.trace import read_trace, replay_digest

    monkeypatch.setenv("PCP_FN_RECORD_SCHEDULE", str(tmp_path / "env.jsonl"))
    m, _ = _manager()
    m.partition_batch(_decode_batch(3, padded_tokens=8, padded_reqs=8, fia=True), 8, 8)
    m.partition_batch(_decode_batch(2, padded_tokens=8, padded_reqs=4, drafts=1), 8, 4)
    recorder = m.bookkeeper.recorder
    recorder.close()
    trace = read_trace(recorder.path)
    assert trace.engine.manager == "StandinAscendManager" and trace.config.layout == "mrv2"
    assert [s.num_scheduled for s in trace.steps] == [(1, 1, 1), (2, 2)]
    assert replay_digest(recorder.path).num_steps == 2
    bt = standin.AscendBlockTables([8], 4, 16, [8], torch.device("cpu"))
    path = tmp_path / "a.jsonl"
    explicit = StandinAscendManager(2, 0, torch.device("cpu"), None, 4, 16, bt, record_schedule=path)
    explicit.bookkeeper.recorder.close()
    assert read_trace(tmp_path / "a.jsonl").steps == ()


def test_the_v2_drop_in_refuses_another_layout(monkeypatch):
    """vllm-ascend's NPU attention is not checked against another prefill split: the V2 drop-in
    serves vLLM's own chunks and names the layout it refuses (never served unchecked)."""
    monkeypatch.setenv("PCP_FN_PCP_LAYOUT", "round-robin")
    with pytest.raises(ValueError, match="layout 'round-robin': StandinAscendManager"):
        _manager()
    monkeypatch.setenv("PCP_FN_PCP_LAYOUT", "mrv2")
    assert _manager()[0].bookkeeper.served.name == "mrv2"
