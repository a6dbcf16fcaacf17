"""Lockstep driver for vllm-ascend main's V2 ``AscendPCPManager`` and ``FunctionalAscendPCPManager``.

The same global ``AscendInputBatch``es go, in the V2 runner's call order, to a
reference manager and to the adapter on every PCP rank; every return value and
every attribute the runner reads must be equal. The reference is vllm-ascend's
own class (``tools/check_ascend_v2_manager_against_reference.py``, over vLLM
0.32.0) or the plain-Python oracle of ``test_vllm_ascend_v2_adapter.py``.

Per step (the simulator's chunked-prefill schedule, sometimes with rows
shuffled): ``get_num_tokens_for_dispatch``; a global batch shaped like
vllm-ascend's runner makes it for the case's graph mode (FULL_DECODE_ONLY
graphs of decode-only batches, with FIA query padding; PIECEWISE capture
sizes; eager, sometimes padded further as data parallelism does), then
``partition_batch``, ``prepare_attn``, ``build_attention_context``,
``restore_hidden_state_buffer``, ``restore_for_sampling`` /
``restore_hidden_states`` (also off the last pipeline stage), the draft
prefill and its restores, ``broadcast_replicated_hidden_states`` and, between
steps, dummy runs (``prepare_dummy_attn``, ``build_attention_context`` of the
dummy, ``prepare_inputs_to_capture``). On a vLLM 0.33+ base (the backend's
``contract``) both managers are built without block tables and get them through
``set_block_tables``, the drafts go through the two-argument
``get_draft_input_buffers`` (its MoE mask compared too) and the capture staging
through ``prepare_inputs_for_capture_or_profile``. The restored rows are also checked
against the global batch itself. ``compare_validate_config`` runs both
``validate_config`` over a grid of configs.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from oracle_mrv2 import oracle_dispatch
from vllm_lockstep import (
    BLOCK_SIZE,
    MAX_BLOCKS,
    Case,
    assert_same,
    draft_inputs,
    make_global_batch,
    runner_steps,
    stage_capture,
)

from pcp_fn.adapters.vllm.contract import VLLM_0_32

#: Where the adapter may differ from vllm-ascend's manager, and how the driver maps it.
DEVIATIONS = {
    "validate_config(FULL)": "vllm-ascend refuses FULL CUDA graphs; the adapter accepts them "
    "(one captured graph per bucket serves mixed batches): the grid expects that one difference",
    "partition_batch(mixed, padded_num_reqs)": "vllm-ascend ignores padded_num_reqs; the adapter pads "
    "a mixed batch's request rows to it (a FULL graph): never driven here, since vllm-ascend's "
    "configs have no FULL graph of a mixed batch (the oracle test covers it)",
    "errors": "bad sizes are ValueError naming the field in the adapter, RuntimeError or an "
    "assertion in vllm-ascend: not compared",
}


class PrefixGroup:
    """One process playing every PCP rank: ``stage`` snapshots the ranks' local tensors;
    ``all_gather`` of any of them (or of a leading slice of one) concatenates the ranks' same
    leading rows; ``broadcast(src)`` returns rank ``src``'s rows."""

    def __init__(self) -> None:
        self._by_ptr: dict[int, list[torch.Tensor]] = {}
        self.calls = 0

    def clear(self) -> None:
        self._by_ptr.clear()

    def stage(self, tensors: list[torch.Tensor]) -> None:
        snaps = [t.clone() for t in tensors]  # a rank's in-place restore must not change what others gather
        for t in tensors:
            self._by_ptr[t.data_ptr()] = snaps

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        assert dim == 0 and tensor.data_ptr() in self._by_ptr, "all_gather of a tensor no rank staged"
        self.calls += 1
        return torch.cat([s[: tensor.shape[0]] for s in self._by_ptr[tensor.data_ptr()]])

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        assert tensor.data_ptr() in self._by_ptr, "broadcast of a tensor no rank staged"
        self.calls += 1
        return self._by_ptr[tensor.data_ptr()][src][: tensor.shape[0]].clone()


class PPGroup:
    """``get_pp_group()``: ``is_last_rank`` (the driver flips it to play another stage)."""

    is_last_rank = True


def build_attn_state(vllm_config, seq_lens_np, num_reqs, num_scheduled_tokens, num_valid_tokens) -> tuple:
    """Stand-in of vllm-ascend's ``build_attn_state``: a record of exactly what it was given."""
    arrays = (seq_lens_np, num_scheduled_tokens, num_valid_tokens)
    return (
        "attn_state",
        id(vllm_config),
        int(num_reqs),
        tuple((a.dtype.str, tuple(a.tolist())) for a in arrays),
    )


@dataclasses.dataclass
class AscendBackend:
    """``api``: ``InputBatch`` (an ``AscendInputBatch`` class), ``CUDAGraphMode``, ``PAD_SLOT_ID``.
    ``make_reference`` / ``make_adapter`` take vllm-ascend's constructor keywords."""

    name: str
    api: Any
    block_tables_cls: type
    make_reference: Callable[..., Any]
    make_adapter: Callable[..., Any]
    group: PrefixGroup
    pp: PPGroup
    # the vLLM contract of the base both managers follow (pcp_fn.adapters.vllm.contract)
    contract: Any = VLLM_0_32


@dataclasses.dataclass
class Summary:
    configs: list[str] = dataclasses.field(default_factory=list)
    steps: int = 0
    rank_steps: int = 0
    mixed: int = 0
    decode_only: int = 0
    full_mixed: int = 0  # FULL graphs of mixed batches (the adapter's extension; the oracle only)
    graph_padded: int = 0  # decode-only steps padded to a graph past their layout
    rank_by_rank_slots: int = 0  # ... past the layout's tokens (the slot mappings' graph layout)
    fia_dummy: int = 0  # global batches with a FIA dummy request
    spec: int = 0
    drafts: int = 0
    dummies: int = 0
    off_last_stage: int = 0
    shuffled: int = 0
    fields: set[str] = dataclasses.field(default_factory=set)
    comparisons: int = 0

    def merge(self, other: Summary) -> None:
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, set):
                a |= b
            elif isinstance(a, list):
                a.extend(b)
            else:
                setattr(self, f.name, a + b)


def vllm_config(mode: Any, **overrides: Any) -> SimpleNamespace:
    """A vLLM config with what both managers read (PCP 2, no DP, dense MLA, no spec)."""
    config = SimpleNamespace(
        parallel_config=SimpleNamespace(prefill_context_parallel_size=2, data_parallel_size=1),
        model_config=SimpleNamespace(is_encoder_decoder=False, hf_text_config=SimpleNamespace()),
        lora_config=None,
        speculative_config=None,
        compilation_config=SimpleNamespace(cudagraph_mode=mode),
    )
    for key, value in overrides.items():
        obj, _, attr = key.rpartition("__")
        setattr(getattr(config, obj) if obj else config, attr, value)
    return config


# --------------------------------------------------------------------------- comparison


class Compare:
    """Field-by-field equality of the two managers' results (``assert_same``), counted in a
    :class:`Summary` (the lockstep's; the V2 benchmark's equality check uses it too)."""

    def __init__(self, summary: Summary) -> None:
        self.summary = summary

    def same(self, name: str, a: Any, b: Any) -> None:
        assert_same(name, a, b)
        self.summary.comparisons += 1

    def batch(self, what: str, a: Any, b: Any) -> None:
        assert type(a) is type(b), f"{what}: {type(a)} vs {type(b)}"
        for f in dataclasses.fields(a):
            self.same(f"{what}.{f.name}", getattr(a, f.name), getattr(b, f.name))
            self.summary.fields.add(f.name)

    def context(self, what: str, a: Any, b: Any, global_batch: Any) -> None:
        assert type(a) is type(b), f"{what}: {type(a)} vs {type(b)}"
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "global_batch":
                assert x is global_batch and y is global_batch, f"{what}.global_batch"
            elif x is None or y is None:
                assert x is None and y is None, f"{what}.{f.name}: {x!r} vs {y!r}"
            else:
                self.same(f"{what}.{f.name}", x, y)
            self.summary.fields.add(f"context.{f.name}")


def _encode(batch: Any, rows: int | None = None) -> torch.Tensor:
    """``[L, 2]`` float rows that name their token: (input id, position)."""
    rows = batch.num_tokens_after_padding if rows is None else rows
    ids, pos = batch.input_ids[:rows], batch.positions[:rows]
    return torch.stack([ids.to(torch.float64), pos.to(torch.float64)], dim=1)


# --------------------------------------------------------------------------- global batches


def _fia_pad(api: Any, g: Any, num_reqs_padded: int, uniform_len: int | None, device: torch.device) -> Any:
    """vllm-ascend's FIA padding of the global query start locations: a uniform decode graph
    gives each padding request ``uniform_len`` tokens; otherwise one dummy request takes the
    padding tokens (so ``query_start_loc_np[-1] == num_tokens_after_padding``)."""
    n, total, padded = g.num_reqs, g.num_tokens, g.num_tokens_after_padding
    qsl = np.full(num_reqs_padded + 2, total, np.int32)
    qsl[: n + 1] = g.query_start_loc_np[: n + 1]
    R = num_reqs_padded
    if uniform_len and padded == R * uniform_len and total == n * uniform_len:
        qsl[n + 1 : R + 1] = total + uniform_len * np.arange(1, R - n + 1, dtype=np.int32)
    elif qsl[R] < padded:
        qsl[R + 1] = padded
        R += 1
    qsl = qsl[: R + 1].copy()
    seq = np.zeros(R, np.int32)
    seq[:n] = g.seq_lens[:n].cpu().numpy()
    return dataclasses.replace(
        g,
        num_reqs_after_padding=R,
        query_start_loc_np=qsl,
        query_start_loc=torch.from_numpy(qsl).to(device),
        seq_lens=torch.from_numpy(seq).to(device),
        seq_lens_np=seq,
        attn_state=("global", g.num_tokens),
    )


def _capture_sizes(T: int) -> list[int]:
    sizes, s = [], 1
    while s < T:
        sizes.append(s)
        s *= 2
    return [*sizes, T]


def _step_shape(graphs: str, i: int, case: Case, sched: np.ndarray, prefilling: np.ndarray, widest: int):
    """``(padded_num_tokens, num_tokens_after_padding, num_reqs_padded, uniform_len, kind)``
    of step ``i``'s global batch as vllm-ascend's runner dispatches it (``FULL``: the adapter's
    extension, FULL graphs of mixed batches too)."""
    caps = _capture_sizes(case.T)
    total, n, q = int(sched.sum()), sched.size, 1 + case.spec
    decode_only = not prefilling.any()
    if graphs in ("FULL_DECODE_ONLY", "FULL") and decode_only:
        fits = [c for c in caps if c >= total and 1 <= c // q <= case.R]
        if fits:
            cap = fits[(i // 3) % len(fits)] if i % 3 == 0 else fits[0]
            return cap, cap, cap // q, q, "full"
    if graphs == "FULL":
        rows = oracle_dispatch(case.P, sched.tolist(), prefilling.tolist(), False, case.dcp)[1]
        cap = next(c for c in caps if c >= widest)
        reqs = min(2 * case.R, max(n, rows, min(cap, case.R)))
        return cap, max(total, cap), reqs, None, "full-mixed"
    if graphs == "PIECEWISE":
        low = min(widest + (i % 2), case.T)
        cap = next(c for c in caps if c >= low)
        return cap, max(total, cap), None, None, "piecewise"
    extra = (i % 3) if i % 2 == 1 else 0  # data parallelism pads eager batches to the largest DP rank
    return None, min(total + extra, case.T), None, None, "eager"


def ascend_global_batch(
    api: Any, step: Any, order: list[int], shape: tuple, num_reqs: int, device: torch.device
) -> Any:
    _, padded, reqs, uniform, _ = shape
    desc = SimpleNamespace(num_tokens=padded, num_reqs=None)
    g = make_global_batch(api, step, desc, order, device)
    return _fia_pad(api, g, reqs if reqs is not None else num_reqs, uniform, device)


def dummy_batch(api: Any, num_reqs: int, num_tokens: int, device: torch.device) -> Any:
    """vllm-ascend's ``AscendInputBatch.make_dummy``: ``num_tokens`` split over ``num_reqs``
    (extra tokens last), host ``seq_lens_np``, ``is_dummy``."""
    sched = [num_tokens // num_reqs] * num_reqs
    for k in range(num_tokens % num_reqs):
        sched[num_reqs - 1 - k] += 1
    step = SimpleNamespace(
        req_ids=list(range(num_reqs)),
        states=list(range(num_reqs)),
        sched=sched,
        computed=[0] * num_reqs,
        prompt=[0] * num_reqs,
        drafts=[0] * num_reqs,
        tokens=[[0] * s for s in sched],
    )
    g = make_global_batch(
        api, step, SimpleNamespace(num_tokens=num_tokens, num_reqs=None), list(range(num_reqs)), device
    )
    seq = np.array(sched, np.int32)
    return dataclasses.replace(
        g,
        is_padding=torch.ones(num_tokens, dtype=torch.bool, device=device),
        seq_lens_np=seq,
        attn_state="DecodeOnly",
        is_dummy=True,
    )


# --------------------------------------------------------------------------- the driver


def run_ascend_lockstep(
    backend: AscendBackend, case: Case, graphs: str, device: torch.device | None = None
) -> Summary:
    """Drive ``case``'s workload under vllm-ascend ``graphs`` (``FULL_DECODE_ONLY``, ``PIECEWISE``
    or ``NONE``) through the reference and the adapter on every rank."""
    api, group, pp = backend.api, backend.group, backend.pp
    Mode = api.CUDAGraphMode
    device = device or torch.device("cpu")
    summary = Summary(
        configs=[f"P={case.P} dcp={case.dcp} interleave={case.interleave} spec={case.spec} {graphs}"]
    )
    cmp = Compare(summary)
    config = vllm_config(getattr(Mode, graphs))
    rng = np.random.default_rng(case.seed + 7)
    P = case.P
    late = backend.contract.moe_mask  # vLLM 0.33+'s construction order
    tables, refs, ads = [], [], []
    for q in range(P):
        bt = backend.block_tables_cls(
            [BLOCK_SIZE], case.R, case.T, [MAX_BLOCKS], device,
            cp_size=case.dcp, cp_rank=q % case.dcp, cp_interleave=case.interleave,
        )  # fmt: skip
        tables.append(bt)
        kw = dict(
            pcp_world_size=P,
            pcp_rank=q,
            device=device,
            req_states=None,
            max_num_reqs=case.R,
            max_num_tokens=case.T,
            block_tables=None if late else bt,
            dcp_world_size=case.dcp,
            dcp_rank=q % case.dcp,
            cp_interleave=case.interleave,
        )
        for make, out in ((backend.make_reference, refs), (backend.make_adapter, ads)):
            m = make(**kw)
            if late:  # vLLM 0.33+: the runner attaches them after KV-cache init
                m.set_block_tables(bt)
            m.vllm_config = config
            out.append(m)
        for attr in ("pcp_world_size", "pcp_rank", "dcp_world_size", "dcp_rank", "cp_interleave"):
            cmp.same(f"rank {q} {attr}", getattr(refs[q], attr), getattr(ads[q], attr))
        for attr in ("max_num_reqs", "max_num_tokens"):
            cmp.same(
                f"rank {q} input_buffers.{attr}",
                getattr(refs[q].input_buffers, attr),
                getattr(ads[q].input_buffers, attr),
            )
        cmp.same(
            f"rank {q} qsl buffer",
            refs[q].input_buffers.query_start_loc.shape,
            ads[q].input_buffers.query_start_loc.shape,
        )
    for rs in runner_steps(case, tables, rng, summary):
        i, step, order, sched, prefilling = rs.index, rs.step, rs.order, rs.sched, rs.prefilling
        widest = refs[0].get_num_tokens_for_dispatch(sched, prefilling)
        for q in range(P):
            cmp.same(f"step {i} dispatch", widest, ads[q].get_num_tokens_for_dispatch(sched, prefilling))
        decode_only = not prefilling.any()
        shape = _step_shape(graphs, i, case, sched, prefilling, widest)
        g = ascend_global_batch(api, step, order, shape, len(order), device)
        padded_num_tokens, padded_num_reqs, kind = shape[0], shape[2], shape[4]
        summary.full_mixed += kind == "full-mixed"
        summary.steps += 1
        summary.mixed += not decode_only
        summary.decode_only += decode_only
        summary.fia_dummy += g.query_start_loc_np.shape[0] - 1 > (shape[2] or g.num_reqs)
        summary.spec += g.num_draft_tokens > 0

        ref_local = [refs[q].partition_batch(g, padded_num_tokens, padded_num_reqs) for q in range(P)]
        ad_local = [ads[q].partition_batch(g, padded_num_tokens, padded_num_reqs) for q in range(P)]
        for q in range(P):
            cmp.batch(f"step {i} rank {q} local", ref_local[q], ad_local[q])
            assert refs[q].global_batch is g and ads[q].global_batch is g
            assert refs[q].draft_prefill_batch is None and ads[q].draft_prefill_batch is None
            summary.rank_steps += 1
        summary.graph_padded += decode_only and ad_local[0].num_tokens_after_padding > ad_local[0].num_tokens

        attn = []
        for q in range(P):
            r_bt, r_sl = refs[q].prepare_attn(ref_local[q])
            r_bt, r_sl = tuple(t.clone() for t in r_bt), r_sl.clone()
            a_bt, a_sl = ads[q].prepare_attn(ad_local[q])
            cmp.same(f"step {i} rank {q} block_tables", r_bt, a_bt)
            cmp.same(f"step {i} rank {q} slot_mappings", r_sl, a_sl)
            attn.append((a_bt, a_sl))
            # the runner builds the attention context right after prepare_attn
            r_ctx = refs[q].build_attention_context(ref_local[q], r_bt, r_sl)
            r_tables = tuple(t.clone() for t in r_ctx.global_block_tables)  # the runner's tables: shared
            a_ctx = ads[q].build_attention_context(ad_local[q], a_bt, a_sl)
            r_ctx = dataclasses.replace(r_ctx, global_block_tables=r_tables)
            cmp.context(f"step {i} rank {q} attention context", r_ctx, a_ctx, g)
        if decode_only and a_ctx.padded_gather_idx.shape[0] // P < g.num_tokens_after_padding:
            summary.rank_by_rank_slots += 1  # the layout is narrower than the graph

        # the model's outputs: every rank's local rows name their token
        local_hidden = [_encode(b) for b in ad_local]
        aux_hidden = [h * 2 for h in local_hidden]
        n, padded = g.num_tokens, g.num_tokens_after_padding
        expected = torch.zeros(padded if padded != n else n, 2, dtype=torch.float64)
        expected[:n] = _encode(g, n)
        off_stage = i % 7 == 5
        if off_stage:
            pp.is_last_rank = False
            summary.off_last_stage += 1
        try:
            # restore_hidden_state_buffer: a model-owned buffer per rank and manager
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
                    assert torch.equal(bufs["ad"][q][: expected.shape[0]], expected), (
                        f"step {i} rank {q} buffer"
                    )
            group.stage(local_hidden)
            group.stage(aux_hidden)
            for q in range(P):
                r_h, r_aux, r_g = refs[q].restore_for_sampling(local_hidden[q], [aux_hidden[q]])
                a_h, a_aux, a_g = ads[q].restore_for_sampling(local_hidden[q], [aux_hidden[q]])
                cmp.same(f"step {i} rank {q} restored", r_h, a_h)
                cmp.same(f"step {i} rank {q} restored aux", r_aux, a_aux)
                assert r_g is g and a_g is g
                if not off_stage:
                    assert torch.equal(a_h, expected), (
                        f"step {i} rank {q}: restored rows are not the global batch"
                    )
                    assert torch.equal(a_aux[0], expected * 2)
                cmp.same(
                    f"step {i} rank {q} restore_hidden_states",
                    refs[q].restore_hidden_states(local_hidden[q]),
                    ads[q].restore_hidden_states(local_hidden[q]),
                )
                cmp.same(
                    f"step {i} rank {q} is_last_pp_rank", refs[q].is_last_pp_rank, ads[q].is_last_pp_rank
                )

            if i % 2 == 1:  # a draft prefill on the drafter's ids
                summary.drafts += 1
                draft_ids = g.input_ids + 1000
                # the speculator's own buffers (what a draft run gets when no prefill is prepared)
                sentinel = SimpleNamespace(is_padding=torch.zeros(case.T, dtype=torch.bool))
                k = g.num_tokens_after_padding
                for q in range(P):
                    refs[q].prepare_draft_prefill(g, draft_ids)
                    ads[q].prepare_draft_prefill(g, draft_ids)
                    r_buf = draft_inputs(refs[q], sentinel, k)
                    a_buf = draft_inputs(ads[q], sentinel, k, refs[q])
                    assert a_buf is ads[q].draft_prefill_batch and r_buf is refs[q].draft_prefill_batch
                    cmp.batch(f"step {i} rank {q} draft", r_buf, a_buf)
                draft_last = [
                    _encode(b, b.num_tokens_after_padding)
                    for b in (ads[q].draft_prefill_batch for q in range(P))
                ]
                draft_hidden = [h * 3 for h in draft_last]
                group.stage(draft_last)
                group.stage(draft_hidden)
                for q in range(P):
                    h = draft_last[q]
                    r_same = refs[q].restore_draft_prefill(h, h)
                    a_same = ads[q].restore_draft_prefill(h, h)
                    assert (a_same[0] is a_same[1]) == (r_same[0] is r_same[1])
                    cmp.same(f"step {i} rank {q} draft restore", r_same, a_same)
                    for m in (refs[q], ads[q]):
                        assert draft_inputs(m, sentinel, k) is sentinel
                        m.prepare_draft_prefill(g, draft_ids)
                    r_two = refs[q].restore_draft_prefill(h, draft_hidden[q])
                    a_two = ads[q].restore_draft_prefill(h, draft_hidden[q])
                    cmp.same(f"step {i} rank {q} draft restore (two)", r_two, a_two)
                    untouched = ads[q].restore_draft_prefill(h, draft_hidden[q])  # nothing prepared
                    assert untouched[0] is h and untouched[1] is draft_hidden[q]
                    for m in (refs[q], ads[q]):  # a batch that is not the partitioned one
                        m.prepare_draft_prefill(dataclasses.replace(g), draft_ids)
                        assert m.draft_prefill_batch is None

            if i % 3 == 2:  # the drafter's hidden states when the target's PCP rows are replicated
                k = max(1, n // 2)
                last = [torch.full((n, 3), float(q)) for q in range(P)]
                other = [t + 10 for t in last]
                group.stage(last)
                group.stage(other)
                for q in range(P):
                    for replicated in (False, True):
                        for second in (last[q], other[q]):
                            r = refs[q].broadcast_replicated_hidden_states(last[q], second, k, replicated)
                            a = ads[q].broadcast_replicated_hidden_states(last[q], second, k, replicated)
                            assert (r[0] is r[1]) == (a[0] is a[1])
                            cmp.same(f"step {i} rank {q} broadcast", r, a)
        finally:
            pp.is_last_rank = True
            group.clear()

        if i % 5 == 4:  # a dummy / capture run between real steps
            summary.dummies += 1
            caps = _capture_sizes(case.T)
            num_tokens = caps[i % len(caps)]
            num_reqs = max(1, min(num_tokens, case.R, 1 + i % 5))
            dummy = dummy_batch(api, num_reqs, num_tokens, device)
            for q in range(P):
                r_bt, r_sl = refs[q].prepare_dummy_attn(dummy)
                r_bt, r_sl = tuple(t.clone() for t in r_bt), r_sl.clone()
                a_bt, a_sl = ads[q].prepare_dummy_attn(dummy)
                cmp.same(f"step {i} rank {q} dummy block tables", r_bt, a_bt)
                cmp.same(f"step {i} rank {q} dummy slot mappings", r_sl, a_sl)
                rb, ab = refs[q].input_buffers, ads[q].input_buffers
                for f in ("input_ids", "positions", "is_padding"):
                    cmp.same(f"step {i} dummy {f}", getattr(rb, f)[:num_tokens], getattr(ab, f)[:num_tokens])
                cmp.same(f"step {i} dummy seq_lens", rb.seq_lens[:num_reqs], ab.seq_lens[:num_reqs])
                cmp.same(
                    f"step {i} dummy qsl",
                    rb.query_start_loc[: num_reqs + 1],
                    ab.query_start_loc[: num_reqs + 1],
                )
                cmp.same(f"step {i} dummy seq_lens_np", rb.seq_lens_np[:num_reqs], ab.seq_lens_np[:num_reqs])
                r_ctx = refs[q].build_attention_context(dummy, r_bt, r_sl)
                a_ctx = ads[q].build_attention_context(dummy, a_bt, a_sl)
                cmp.context(f"step {i} rank {q} dummy attention context", r_ctx, a_ctx, dummy)
                r_cap = stage_capture(refs[q], dummy)
                a_cap = stage_capture(ads[q], dummy)
                cmp.batch(f"step {i} rank {q} capture batch", r_cap, a_cap)
    return summary


def compare_validate_config(ref_cls: type, ad_cls: type, Mode: Any) -> tuple[int, int]:
    """Both ``validate_config`` over a grid (graph mode x DP x sparse MLA x spec x LoRA x
    encoder-decoder x multimodal x PCP size x DCP x PP): the same outcome (accepted, or the same
    exception type), but for the documented FULL difference. Returns (configs, deviations)."""
    specs = [
        None,
        SimpleNamespace(method="mtp", draft_sample_method="greedy"),
        SimpleNamespace(method="eagle3", draft_sample_method="greedy"),
        SimpleNamespace(method="ngram", draft_sample_method="greedy"),
        SimpleNamespace(method="dspark", draft_sample_method="random"),
    ]
    grid = itertools.product(
        [Mode.NONE, Mode.PIECEWISE, Mode.FULL, Mode.FULL_DECODE_ONLY, Mode.FULL_AND_PIECEWISE],
        [1, 2],
        [False, True],
        specs,
        [None, object()],
        [False, True],
        [False, True],
        [1, 4],
        [1, 2],
    )
    count = deviations = 0
    for mode, dp, sparse, spec, lora, encdec, mm, pcp, dcp in grid:
        hf = SimpleNamespace(index_topk=8) if sparse else SimpleNamespace()
        config = vllm_config(
            mode,
            parallel_config__data_parallel_size=dp,
            parallel_config__prefill_context_parallel_size=pcp,
            parallel_config__decode_context_parallel_size=dcp,
            parallel_config__pipeline_parallel_size=dcp,
            model_config__hf_text_config=hf,
            model_config__is_encoder_decoder=encdec,
            speculative_config=spec,
            lora_config=lora,
        )
        outcomes = []
        for cls in (ref_cls, ad_cls):
            try:
                cls.validate_config(config, mm)
                outcomes.append(None)
            except Exception as e:
                outcomes.append(type(e))
        count += 1
        if outcomes[0] != outcomes[1]:
            full_only = mode == Mode.FULL and outcomes[0] is NotImplementedError and outcomes[1] is None
            assert full_only, (mode, dp, sparse, spec, lora, encdec, mm, pcp, dcp, outcomes)
            deviations += 1
    return count, deviations
