"""Lockstep driver for vllm-ascend 0.30.0rc2's ``AscendPCPManager`` and ``FunctionalAscendPCPManager``.

The reference is vllm-ascend's own class, imported from the installed release (its sdist, built
by ``tools/make_vllm_ascend_venv.sh``) after its tests' CPU stand-ins
(``pcp_fn.adapters.vllm_ascend.v2.reference``). Every PCP rank gets one manager of each class, built
and configured as 0.30.0rc2's ``NPUModelRunner`` builds them: vLLM 0.30's constructor arguments,
then ``vllm_config``, ``kv_cache_config`` and ``global_input_buffers`` (the runner's own buffers,
one object for both). Per scheduler step, in the runner's call order:

- ``get_num_tokens_for_dispatch`` (the graph dispatch reads it), the descriptor vLLM's dispatcher
  makes of it (``FULL`` for a uniform decode-only batch under ``FULL_DECODE_ONLY``, a capture size
  under ``PIECEWISE``, else ``NONE``, sometimes padded further as data parallelism does), then
  ``get_global_graph_num_reqs(batch_desc)`` (a sharded decode graph's global requests);
- the global ``AscendInputBatch`` as its ``prepare_inputs`` makes it: padded to the global graph,
  ``_pad_query_start_loc_for_fia``'s query starts, ``build_attn_state`` of the global batch;
- ``partition_batch(input_batch, padded_num_tokens, padded_num_reqs)`` as vLLM 0.30's
  ``maybe_partition_pcp_batch`` passes them, ``prepare_attn``, ``build_attention_context``;
- the sampling path of ``NPUModelRunner.sample_tokens``: with a replicated draft (speculative
  decoding), ``restore_hidden_state_buffer`` of the MTP target buffer, ``restore_hidden_states``
  and the ``_sampling_hidden_restored`` skip in ``restore_for_sampling``; else
  ``restore_for_sampling`` (an all-gather); the auxiliary states through ``restore_hidden_states``;
  some steps off the last pipeline stage; ``prepare_draft_prefill`` (a no-op in both), the draft's
  ``broadcast_replicated_hidden_states``;
- between steps, a capture as ``_prepare_pcp_inputs_to_capture`` (``worker/v2/aclgraph_utils.py``)
  makes one: ``AscendInputBatch.make_dummy`` over the manager's buffers, ``get_dummy_block_tables``,
  ``get_dummy_slot_mappings``, ``build_attention_context`` of the dummy (sharded: the global graph's
  context over ``global_input_buffers``).

Every return value is compared field by field (dtype, shape, values), and the restored rows are
checked against the global batch itself. Decodes are sharded (PCP > 1, DCP = 1, no speculative
decoding: vllm-ascend's ``is_pcp_decode_sharding_enabled``) or replicated; the workload is the
simulator's chunked-prefill schedule (``vllm_lockstep.runner_steps``: fresh and chunked prefills,
decodes, drafts, departures, shuffled rows), with ranks left empty by small batches.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from ascend_v2_lockstep import Compare, PPGroup, PrefixGroup, Summary, _encode, _fia_pad
from vllm_lockstep import BLOCK_SIZE, MAX_BLOCKS, Case, make_global_batch, runner_steps
from vllm_standin import BlockTables

#: Where the drop-in may differ from 0.30.0rc2's manager, and how the driver meets it.
DEVIATIONS = {
    "errors": "bad sizes are a ValueError naming the field in the drop-in, a RuntimeError or an "
    "assertion in vllm-ascend: not driven here (the drop-in's own tests check them)",
}


@dataclasses.dataclass
class Ascend030:
    """The installed release's names (``ascend_030_names``) and the PCP group both managers see."""

    AscendPCPManager: type
    drop_in: type
    InputBatch: type  # vLLM 0.30's
    AscendInputBatch: type
    AscendInputBuffers: type
    CUDAGraphMode: Any
    BatchExecutionDescriptor: type
    build_attn_state: Any
    group: PrefixGroup
    pp: PPGroup


def ascend_030_names(monkeypatch: Any) -> Ascend030:
    """vllm-ascend 0.30.0rc2's classes, with one process playing every PCP rank: the PCP group is a
    :class:`PrefixGroup`, the pipeline group a :class:`PPGroup`, wherever either manager looks them
    up; the host-to-device copy of vLLM's ``async_tensor_h2d`` a plain copy, as vllm-ascend's own
    tests make it (no pinned memory on a CPU)."""
    from pcp_fn.adapters.vllm_ascend.v2.reference import load_reference

    ascend_pcp = load_reference()
    from vllm.config import CUDAGraphMode
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu import pcp_manager as vllm_pcp
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.input_batch import InputBatch

    from pcp_fn.adapters.vllm_ascend.v2.installed import FunctionalAscendPCPManager

    group, pp = PrefixGroup(), PPGroup()
    for module in (ascend_pcp, vllm_pcp, parallel_state):
        monkeypatch.setattr(module, "get_pcp_group", lambda: group, raising=False)
    for module in (ascend_pcp, parallel_state):
        monkeypatch.setattr(module, "get_pp_group", lambda: pp, raising=False)
    monkeypatch.setattr(ascend_pcp, "async_copy_to_gpu", _copy_h2d)
    monkeypatch.setattr(vllm_pcp, "async_tensor_h2d", _copy_h2d, raising=False)
    plain = {"graph_backend": None, "check_host_syncs": True}  # eager, checked for host syncs
    return Ascend030(
        AscendPCPManager=ascend_pcp.AscendPCPManager,
        drop_in=type("FunctionalAscendPCPManager", (FunctionalAscendPCPManager,), plain),
        InputBatch=InputBatch,
        AscendInputBatch=ascend_pcp.AscendInputBatch,
        AscendInputBuffers=ascend_pcp.AscendInputBuffers,
        CUDAGraphMode=CUDAGraphMode,
        BatchExecutionDescriptor=BatchExecutionDescriptor,
        build_attn_state=ascend_pcp.build_attn_state,
        group=group,
        pp=pp,
    )


def _copy_h2d(value: Any, out: torch.Tensor | None = None, device: Any = None, **_: Any) -> torch.Tensor:
    """vllm-ascend's tests' ``_mock_async_copy_to_cpu``: the copy, without pinned memory."""
    value = torch.from_numpy(value) if isinstance(value, np.ndarray) else torch.as_tensor(value)
    if out is not None:
        return out.copy_(value)
    return value.to("cpu")


def runner_config(names: Ascend030, case: Case, graphs: str) -> SimpleNamespace:
    """What both managers read of the runner's ``vllm_config`` (``build_attn_state`` included)."""
    spec = SimpleNamespace(method="mtp", num_speculative_tokens=case.spec) if case.spec else None
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            prefill_context_parallel_size=case.P,
            decode_context_parallel_size=case.dcp,
            pipeline_parallel_size=1,
            data_parallel_size=1,
        ),
        model_config=SimpleNamespace(
            use_mla=True, is_encoder_decoder=False, hf_text_config=SimpleNamespace(), runner_type="generate"
        ),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=True),
        lora_config=None,
        speculative_config=spec,
        compilation_config=SimpleNamespace(cudagraph_mode=getattr(names.CUDAGraphMode, graphs)),
    )


# --------------------------------------------------------------------------- the runner's batches


def _capture_sizes(T: int, q: int) -> list[int]:
    """The FULL_DECODE_ONLY capture sizes: multiples of the decode query length up to ``T``."""
    sizes, s = [], 1
    while s * q <= T:
        sizes.append(s * q)
        s *= 2
    return sizes


def dispatch(
    names: Ascend030, case: Case, graphs: str, i: int, widest: int, sched: np.ndarray, prefilling: np.ndarray
) -> Any:
    """vLLM's ``BatchExecutionDescriptor`` for ``widest`` (``get_num_tokens_for_dispatch``), as its
    dispatcher gives it under ``graphs``: a uniform decode-only batch gets a FULL graph of the
    smallest capture size holding it (every third step a larger one: data parallelism syncs to the
    largest DP rank's)."""
    Mode, q = names.CUDAGraphMode, 1 + case.spec
    decode_only = not prefilling.any()
    uniform = decode_only and bool(np.all(sched == q))
    caps = _capture_sizes(case.T, q)
    if graphs == "FULL_DECODE_ONLY" and uniform:
        fits = [c for c in caps if c >= widest and c // q <= case.R]
        if fits:
            cap = fits[min((i // 3) % 2, len(fits) - 1)] if i % 3 == 0 else fits[0]
            return names.BatchExecutionDescriptor(
                cg_mode=Mode.FULL, num_tokens=cap, num_reqs=cap // q, uniform_token_count=q
            )
    if graphs == "PIECEWISE":
        sizes = [s for s in range(1, case.T + 1) if s & (s - 1) == 0 or s == case.T]
        cap = next(s for s in sizes if s >= widest)
        return names.BatchExecutionDescriptor(cg_mode=Mode.PIECEWISE, num_tokens=cap, num_reqs=None)
    extra = (i % 3) if i % 2 == 1 else 0  # DP pads an eager batch to the largest DP rank's
    return names.BatchExecutionDescriptor(
        cg_mode=Mode.NONE, num_tokens=min(widest + extra, case.T), num_reqs=None
    )


def ascend_batch(names: Ascend030, g: Any, **fields: Any) -> Any:
    """vLLM's ``InputBatch`` ``g`` as an ``AscendInputBatch`` (``seq_lens_np``, ``attn_state``...)."""
    base = {f.name: getattr(g, f.name) for f in dataclasses.fields(names.InputBatch)}
    return names.AscendInputBatch(**base, **fields)


def global_batch(
    names: Ascend030, config: Any, rs: Any, desc: Any, graph_reqs: int | None, device: torch.device
) -> Any:
    """The global ``AscendInputBatch`` of a runner step as 0.30.0rc2's ``prepare_inputs`` makes it
    for ``desc``: tokens padded to the graph (a sharded graph: ``graph_reqs * query_len``),
    ``_pad_query_start_loc_for_fia``'s query starts (FULL), the global ``build_attn_state``."""
    n, total = len(rs.order), int(rs.sched.sum())
    padded = max(total, desc.num_tokens)
    graph_num_reqs = desc.num_reqs
    if graph_reqs is not None:
        graph_num_reqs, padded = graph_reqs, graph_reqs * desc.uniform_token_count
    g = make_global_batch(names, rs.step, SimpleNamespace(num_tokens=padded, num_reqs=None), rs.order, device)
    seq = g.seq_lens[:n].cpu().numpy().astype(np.int32)
    g = ascend_batch(names, g, seq_lens_np=seq, attn_state=None)
    if desc.cg_mode == names.CUDAGraphMode.FULL:
        g = _fia_pad(names, g, max(n, graph_num_reqs or 0), desc.uniform_token_count, device)
    drafts = np.array([rs.step.drafts[k] for k in rs.order], np.int32)
    state = names.build_attn_state(
        config, g.seq_lens_np, n, rs.sched, rs.sched - drafts, kv_cache_config=None
    )
    return dataclasses.replace(g, attn_state=state)


def dummy_batch(names: Ascend030, manager: Any, num_reqs: int, num_tokens: int, query_len: int | None) -> Any:
    """``_prepare_pcp_inputs_to_capture``'s batch: ``make_dummy`` over the manager's own buffers."""
    return names.AscendInputBatch.make_dummy(
        num_reqs, num_tokens, manager.input_buffers, max_query_len=query_len
    )


# --------------------------------------------------------------------------- the driver


def run_030_lockstep(
    names: Ascend030, case: Case, graphs: str, device: torch.device | None = None, record: str | None = None
) -> Summary:
    """Drive ``case``'s workload under ``graphs`` (``FULL_DECODE_ONLY``, ``PIECEWISE`` or ``NONE``)
    through vllm-ascend 0.30.0rc2's manager and the drop-in on every rank (module docstring).

    ``record``: rank 0's drop-in records the schedule to this trace file (``summary.served``: what
    its ``partition_batch`` served each step, ``(num_reqs, idx_mapping, query starts, positions)``)."""
    device = device or torch.device("cpu")
    P, group, pp = case.P, names.group, names.pp
    summary = Summary(
        configs=[f"P={P} dcp={case.dcp} interleave={case.interleave} spec={case.spec} {graphs}"]
    )
    cmp = Compare(summary)
    config = runner_config(names, case, graphs)
    global_buffers = names.AscendInputBuffers(max_num_reqs=case.R, max_num_tokens=case.T, device=device)
    rng = np.random.default_rng(case.seed + 11)
    tables, refs, ads = [], [], []
    for q in range(P):
        bt = BlockTables(
            [BLOCK_SIZE],
            case.R,
            case.T,
            [MAX_BLOCKS],
            device,
            cp_size=case.dcp,
            cp_rank=q % case.dcp,
            cp_interleave=case.interleave,
        )
        tables.append(bt)
        kw = dict(
            pcp_world_size=P,
            pcp_rank=q,
            device=device,
            req_states=None,
            max_num_reqs=case.R,
            max_num_tokens=case.T,
            block_tables=bt,
            dcp_world_size=case.dcp,
            dcp_rank=q % case.dcp,
            cp_interleave=case.interleave,
        )
        for cls, out in ((names.AscendPCPManager, refs), (names.drop_in, ads)):
            extra = {"record_schedule": record if q == 0 else ""} if cls is names.drop_in and record else {}
            m = cls(**kw, **extra)
            m.vllm_config, m.kv_cache_config, m.global_input_buffers = config, None, global_buffers
            out.append(m)
        assert isinstance(ads[q], names.AscendPCPManager)
        cmp.same(f"rank {q} is_decode_sharded", refs[q].is_decode_sharded, ads[q].is_decode_sharded)
        for attr in ("pcp_world_size", "pcp_rank", "dcp_world_size", "dcp_rank", "cp_interleave"):
            cmp.same(f"rank {q} {attr}", getattr(refs[q], attr), getattr(ads[q], attr))
        for attr in ("max_num_reqs", "max_num_tokens"):
            cmp.same(
                f"rank {q} buffers.{attr}",
                getattr(refs[q].input_buffers, attr),
                getattr(ads[q].input_buffers, attr),
            )
    sharded = refs[0].is_decode_sharded
    summary.__dict__.setdefault("sharded", sharded)
    counts = summary.__dict__.setdefault(
        "counts", {"empty_ranks": 0, "sharded_graphs": 0, "captures": 0, "sharded_captures": 0}
    )

    served = summary.__dict__.setdefault("served", [])
    for rs in runner_steps(case, tables, rng, summary):
        i, sched, prefilling = rs.index, rs.sched, rs.prefilling
        widest = refs[0].get_num_tokens_for_dispatch(sched, prefilling)
        for q in range(P):
            cmp.same(
                f"step {i} rank {q} dispatch", widest, ads[q].get_num_tokens_for_dispatch(sched, prefilling)
            )
        desc = dispatch(names, case, graphs, i, widest, sched, prefilling)
        graph_reqs = refs[0].get_global_graph_num_reqs(desc)
        for q in range(P):
            cmp.same(
                f"step {i} rank {q} global graph reqs", graph_reqs, ads[q].get_global_graph_num_reqs(desc)
            )
        g = global_batch(names, config, rs, desc, graph_reqs, device)
        full = desc.cg_mode == names.CUDAGraphMode.FULL
        tokens = None if desc.cg_mode == names.CUDAGraphMode.NONE else desc.num_tokens
        reqs = desc.num_reqs if full else None
        decode_only = not prefilling.any()
        summary.steps += 1
        summary.mixed += not decode_only
        summary.decode_only += decode_only
        summary.spec += g.num_draft_tokens > 0
        counts["sharded_graphs"] += graph_reqs is not None

        ref_local = [refs[q].partition_batch(g, tokens, reqs) for q in range(P)]
        ad_local = [ads[q].partition_batch(g, tokens, reqs) for q in range(P)]
        for q in range(P):
            cmp.batch(f"step {i} rank {q} local", ref_local[q], ad_local[q])
            assert refs[q].global_batch is g and ads[q].global_batch is g
            summary.rank_steps += 1
            counts["empty_ranks"] += ad_local[q].num_tokens == 0
        summary.graph_padded += decode_only and ad_local[0].num_tokens_after_padding > ad_local[0].num_tokens
        local = ad_local[0]
        served.append(
            (
                local.num_reqs,
                local.idx_mapping[: local.num_reqs].tolist(),
                local.query_start_loc_np[: local.num_reqs + 1].tolist(),
                local.positions[: local.num_tokens].tolist(),
            )
        )

        for q in range(P):
            r_bt, r_sl = refs[q].prepare_attn(ref_local[q])
            r_bt, r_sl = tuple(t.clone() for t in r_bt), r_sl.clone()
            a_bt, a_sl = ads[q].prepare_attn(ad_local[q])
            cmp.same(f"step {i} rank {q} block_tables", r_bt, a_bt)
            cmp.same(f"step {i} rank {q} slot_mappings", r_sl, a_sl)
            r_ctx = refs[q].build_attention_context(ref_local[q], r_bt, r_sl)
            r_ctx = dataclasses.replace(
                r_ctx, global_block_tables=tuple(t.clone() for t in r_ctx.global_block_tables)
            )
            a_ctx = ads[q].build_attention_context(ad_local[q], a_bt, a_sl)
            cmp.context(f"step {i} rank {q} attention context", r_ctx, a_ctx, g)
        if decode_only and not sharded and a_ctx.padded_gather_idx.shape[0] // P < g.num_tokens_after_padding:
            summary.rank_by_rank_slots += 1

        _sampling(names, cmp, summary, refs, ads, ad_local, g, i, case)

        if i % 4 == 2:  # a capture between real steps (vllm-ascend's _prepare_pcp_inputs_to_capture)
            counts["captures"] += 1
            counts["sharded_captures"] += _capture(names, cmp, refs, ads, case, i)
            summary.dummies += 1
    group.clear()
    pp.is_last_rank = True
    if record:
        ads[0].bookkeeper.recorder.close()
    return summary


def _sampling(
    names: Ascend030,
    cmp: Compare,
    summary: Summary,
    refs: list,
    ads: list,
    ad_local: list,
    g: Any,
    i: int,
    case: Case,
) -> None:
    """``NPUModelRunner.sample_tokens``'s restores of one step on every rank (module docstring)."""
    P, group, pp = case.P, names.group, names.pp
    local_hidden = [_encode(b) for b in ad_local]
    aux_hidden = [h * 2 for h in local_hidden]
    n, padded = g.num_tokens, g.num_tokens_after_padding
    expected = torch.zeros(padded, 2, dtype=torch.float64)
    expected[:n] = _encode(g, n)
    off_stage = i % 7 == 5
    replicated_draft = case.spec > 0  # the speculator's replicated_pcp
    pp.is_last_rank = not off_stage
    summary.off_last_stage += off_stage
    try:
        if replicated_draft:  # the MTP target buffer: model-owned, one per rank and manager
            bufs = {}
            for who in ("ref", "ad"):
                bufs[who] = []
                for q in range(P):
                    b = torch.full((case.T, 2), -5.0, dtype=torch.float64)
                    b[: local_hidden[q].shape[0]] = local_hidden[q]
                    bufs[who].append(b)
                group.stage(bufs[who])
            for q in range(P):
                refs[q].restore_hidden_state_buffer(bufs["ref"][q])
                ads[q].restore_hidden_state_buffer(bufs["ad"][q])
                cmp.same(f"step {i} rank {q} restored buffer", bufs["ref"][q], bufs["ad"][q])
                if not off_stage:
                    assert torch.equal(bufs["ad"][q][:padded], expected), f"step {i} rank {q} buffer"
        group.stage(local_hidden)
        group.stage(aux_hidden)
        for q in range(P):
            r_h, a_h = local_hidden[q], local_hidden[q]
            for m in (refs[q], ads[q]):
                m._sampling_hidden_restored = False  # sample_tokens clears it first
            if replicated_draft and not off_stage:  # _restore_replicated_draft_target_states
                r_h, a_h = refs[q].restore_hidden_states(r_h), ads[q].restore_hidden_states(a_h)
                refs[q]._sampling_hidden_restored = ads[q]._sampling_hidden_restored = True
            r_h, r_g = refs[q].restore_for_sampling(r_h)
            a_h, a_g = ads[q].restore_for_sampling(a_h)
            cmp.same(f"step {i} rank {q} restored", r_h, a_h)
            cmp.same(
                f"step {i} rank {q} restore flag",
                refs[q]._sampling_hidden_restored,
                ads[q]._sampling_hidden_restored,
            )
            assert r_g is g and a_g is g
            r_aux, a_aux = (
                refs[q].restore_hidden_states(aux_hidden[q]),
                ads[q].restore_hidden_states(aux_hidden[q]),
            )
            cmp.same(f"step {i} rank {q} restored aux", r_aux, a_aux)
            if not off_stage:
                assert torch.equal(a_h, expected), (
                    f"step {i} rank {q}: restored rows are not the global batch"
                )
                assert torch.equal(a_aux, expected * 2)
            cmp.same(f"step {i} rank {q} is_last_pp_rank", refs[q].is_last_pp_rank, ads[q].is_last_pp_rank)
            for m in (refs[q], ads[q]):
                m.prepare_draft_prefill(g, g.input_ids + 1000)  # a no-op: the draft stays global
            cmp.same(
                f"step {i} rank {q} draft batch", refs[q].draft_prefill_batch, ads[q].draft_prefill_batch
            )
        if replicated_draft:  # the drafter's states broadcast from rank 0
            summary.drafts += 1
            k = max(1, n // 2)
            last = [torch.full((n, 3), float(q)) for q in range(P)]
            other = [t + 10 for t in last]
            group.stage(last)
            group.stage(other)
            for q in range(P):
                for second in (last[q], other[q]):
                    r = refs[q].broadcast_replicated_hidden_states(last[q], second, k, True)
                    a = ads[q].broadcast_replicated_hidden_states(last[q], second, k, True)
                    assert (r[0] is r[1]) == (a[0] is a[1])
                    cmp.same(f"step {i} rank {q} broadcast", r, a)
    finally:
        pp.is_last_rank = True
        group.clear()


def _capture(names: Ascend030, cmp: Compare, refs: list, ads: list, case: Case, i: int) -> bool:
    """One graph capture's staging on every rank, as ``_prepare_pcp_inputs_to_capture`` asks it:
    a FULL_DECODE_ONLY size (uniform requests of the decode query length) or a ragged one.
    Returns whether the context was a sharded graph's global one."""
    sharded = False
    q_len = 1 + case.spec
    caps = _capture_sizes(case.T, q_len)
    num_tokens = caps[(i // 4) % len(caps)]
    uniform = (i // 4) % 3 != 2
    num_reqs = num_tokens // q_len if uniform else max(1, min(case.R, num_tokens // 2 + 1))
    num_reqs = min(num_reqs, case.R)
    query_len = q_len if uniform and num_reqs * q_len == num_tokens else None
    for q in range(case.P):
        r_dummy = dummy_batch(names, refs[q], num_reqs, num_tokens, query_len)
        a_dummy = dummy_batch(names, ads[q], num_reqs, num_tokens, query_len)
        _same_dummy(cmp, f"step {i} rank {q} capture batch", r_dummy, a_dummy)
        r_bt = tuple(t.clone() for t in refs[q].get_dummy_block_tables(num_reqs))
        a_bt = ads[q].get_dummy_block_tables(num_reqs)
        cmp.same(f"step {i} rank {q} dummy block tables", r_bt, a_bt)
        r_sl = refs[q].get_dummy_slot_mappings(num_tokens).clone()
        a_sl = ads[q].get_dummy_slot_mappings(num_tokens)
        cmp.same(f"step {i} rank {q} dummy slot mappings", r_sl, a_sl)
        r_ctx = refs[q].build_attention_context(r_dummy, r_bt, r_sl)
        a_ctx = ads[q].build_attention_context(a_dummy, a_bt, a_sl)
        assert type(r_ctx) is type(a_ctx)
        for f in dataclasses.fields(r_ctx):
            x, y = getattr(r_ctx, f.name), getattr(a_ctx, f.name)
            if f.name == "global_batch":
                if x is r_dummy:  # the dummy itself (replicated)
                    assert y is a_dummy, f"step {i} rank {q} capture context global_batch"
                else:  # a sharded graph's global dummy over the runner's buffers
                    sharded = True
                    _same_dummy(cmp, f"step {i} rank {q} capture global batch", x, y)
            else:
                cmp.same(f"step {i} rank {q} capture context.{f.name}", x, y)
    return sharded


def _same_dummy(cmp: Compare, what: str, a: Any, b: Any) -> None:
    """Two ``make_dummy`` batches equal but for their request ids (``make_dummy`` draws them)."""
    assert type(a) is type(b), f"{what}: {type(a)} vs {type(b)}"
    assert len(a.req_ids) == len(b.req_ids), f"{what}.req_ids"
    for f in dataclasses.fields(a):
        if f.name != "req_ids":
            cmp.same(f"{what}.{f.name}", getattr(a, f.name), getattr(b, f.name))
