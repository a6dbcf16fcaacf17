"""FunctionalDCSManager (the vllm-ascend 0.23 ``PCPManager`` drop-in) against pcp_fn's slow oracles.

The lockstep driver (``ascend_runner.SimRunner``) runs the manager in
``model_runner_v1.py``'s call order over engine schedules (mixed, decode-only,
spec decode with accepted and rejected drafts, async scheduling, hybrid
attention, DCP 2, interleave > 1, multimodal), with ``_dummy_run``s at start-up and
between steps and a block table that writes ``slot_mapping.gpu`` / ``.cpu`` as
vllm-ascend's does; every observation is checked against the oracles of
``oracle*.py`` (plain Python, no pcp_fn code), every dummy run's metadata against
the real step of its batch, the MTP mask against a model of vllm-ascend's buffer. Then the
reference docstring's golden vectors, buffer addresses, the host-sync detector
on the device path, graph capture per bucket, bad input and the import rules.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ascend_runner import (
    BlockTable,
    SimConfig,
    SimRunner,
    StepInput,
    correct_optimistic_seq_lens_cpu,
    mm_cache,
    mm_requests,
    prompt_embeds_for,
    schedule,
    slot_of,
)
from oracle import oracle_step
from oracle_attention import (
    oracle_attention,
    oracle_local_mm_schedule,
    oracle_mm_embeddings,
    oracle_mrope,
    oracle_prompt_embeds,
)
from oracle_hybrid import oracle_draft_split, oracle_hybrid
from oracle_spec import (
    oracle_decode_hidden_rows,
    oracle_drafting_seq_lens,
    oracle_first_pass,
    oracle_full_inputs,
    oracle_mask_restore,
    oracle_mtp_mask,
    oracle_mtp_slot_indices,
    oracle_rebuild,
    oracle_repair,
    oracle_spec_indices,
    request_starts,
    spec_view,
)
from torch._dynamo.utils import counters

import pcp_fn
from pcp_fn.adapters.vllm_ascend import FunctionalDCSManager, install
from pcp_fn.adapters.vllm_ascend.v1.manager import graph_backend

REFERENCE_FIELDS = pcp_fn.dcs.attention.VLLM_ASCEND_INDEX_FIELDS

CONFIGS = [
    SimConfig("mixed P2, 2 KV groups", pcp=2, kv_groups=2, R=6, T=64, num_requests=6, max_prompt=30),
    SimConfig("decode-heavy P3 k=1", pcp=3, spec=1, R=6, T=48, num_requests=5, max_prompt=5, max_new=(6, 12)),
    SimConfig("hybrid P2 k=1", pcp=2, hybrid=True, spec=1, R=6, T=64, num_requests=6, max_prompt=24),
    SimConfig(
        "async k=2 P2 DCP2 interleave 4",
        pcp=2,
        dcp=2,
        spec=2,
        interleave=4,
        async_sched=True,
        R=6,
        T=48,
        num_requests=5,
        max_prompt=10,
        max_new=(6, 12),
    ),
    SimConfig("DCP2 only k=2", pcp=1, dcp=2, spec=2, R=6, T=48, num_requests=5, max_prompt=12),
    SimConfig(
        "decode-heavy k=1 P2 DCP2 interleave 2",
        pcp=2,
        dcp=2,
        spec=1,
        interleave=2,
        R=6,
        T=48,
        num_requests=6,
        max_prompt=6,
        max_new=(2, 9),
    ),
    SimConfig("multimodal P2 k=1", pcp=2, spec=1, multimodal=True, R=6, T=64, num_requests=5, max_prompt=24),
]
STEPS = 7


def L(x):
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return x.tolist()
    return x


def _row(rank: int, step: int, local: int) -> list[float]:
    """Row ``local`` of :func:`hidden_rows` of ``rank`` (without building the buffer)."""
    return [float(local * 3 + j + rank * 1e6 + step * 1e8) for j in range(3)]


def _table(cfg: SimConfig, st) -> list[list[int]]:
    return [list(t) + [0] * (cfg.max_model_len - len(t)) for t in st.tokens]


class Tracker:
    """What a rank's checks remember across steps: the last MTP slot mapping built, and the
    MTP attention mask buffer (``[R][1 + k][max_model_len]``, rows kept until rewritten)."""

    def __init__(self) -> None:
        self.mtp_slots: list[int] | None = None
        self.mask: list | None = None

    def mask_rows(self, cfg: SimConfig, rank: int, dcp_rank: int, hist, counts, nd: int, n: int) -> list:
        """The rows ``generate_pcp_metadata`` returns: vllm-ascend's buffer semantics (rows ``[:nd]``
        rewritten only when some decode's last token reaches this CP rank), the oracle's values."""
        thr, cols = 1 + cfg.spec, cfg.max_model_len
        if self.mask is None:
            self.mask = [[[False] * cols for _ in range(thr)] for _ in range(cfg.R)]
        C, c = cfg.pcp * cfg.dcp, rank * cfg.dcp + dcp_rank
        if nd and any(hist[i] + counts[i] - 1 >= c for i in range(nd)):
            self.mask[:nd] = [
                oracle_mtp_mask(hist[i], counts[i], thr, cols, C, c, cfg.interleave) for i in range(nd)
            ]
        return self.mask[: nd if nd else n]


def _mtp_expected(cfg, st, comp, P) -> list[int]:
    return oracle_full_inputs(list(st.sched), list(comp), _table(cfg, st), cfg.spec, P, slot_fn=slot_of)[
        "mtp_slots"
    ]


def check_step(cfg: SimConfig, st, rank: int, dcp_rank: int, obs: dict, tr: Tracker) -> int:
    """Every observation of one (step, rank) against the oracles; returns how many were checked."""
    P, D, k = cfg.pcp, cfg.dcp, cfg.spec
    sched, comp, n = list(st.sched), list(st.comp), len(st.sched)
    orc = oracle_step(P, sched, comp, list(st.prompt), k)
    hyb = oracle_hybrid(P, sched, comp, list(st.prompt), k) if cfg.hybrid and P > 1 else None
    view = spec_view(hyb is not None, P, sched, comp, list(st.prompt), k, rank)
    nd = sum(orc.is_decode)
    npf = n - nd
    Dt = orc.num_decode_tokens
    N = orc.num_tokens
    checked = 0

    def eq(key, expected):
        nonlocal checked
        got = L(obs[key]) if isinstance(key, str) else key
        assert got == expected, (
            f"[{cfg.name}] step {st.index} rank {rank}/{dcp_rank}: {key}\n{got}\n{expected}"
        )
        checked += 1

    # init_batch_info
    eq("num_reqs", n)
    eq("num_decode_reqs", nd)
    eq("num_prefill_reqs", npf)
    eq("num_decode_tokens", Dt)
    eq("decode_req_mask", orc.is_decode)
    ql = sched + [0] * (cfg.R - n)
    eq(L(obs["query_lens_pcp_full"][0]), ql)
    eq(L(obs["query_lens_pcp_full"][1]), ql)

    # update_tokens_for_pcp and the attributes the runner reads after it
    if P > 1:
        if hyb is not None:
            eq("update.tokens", hyb.linear_tokens[rank])
            eq("update.positions", hyb.linear_positions[rank])
        else:
            eq("update.tokens", orc.pcp_tokens)
            eq("update.positions", orc.positions[rank])
    eq("num_pcp_pads_cpu", orc.num_pads if P > 1 else [0] * n)
    eq("num_scheduled_tokens_padded", orc.pcp_tokens if P > 1 else sched)
    total_sampled = (sum(sched) if hyb is not None else N) if P > 1 else 0
    eq("total_num_sampled_tokens_pcp", total_sampled)
    eq("max_num_tokens_across_pcp", hyb.max_tokens if hyb is not None else 0)
    if hyb is not None:
        mine = sum(hyb.linear_tokens[rank])
        eq("total_num_scheduled_tokens", mine)
        eq("pcp_padded_tokens_fla", hyb.max_tokens - mine)
        eq("total_pcp_padding_tokens_fla", P * (hyb.max_tokens - Dt) - sum(sched[nd:]) if npf else 0)

    # logits
    drafts = list(st.drafts)
    local_counts = (hyb.linear_tokens[rank] if hyb is not None else orc.pcp_tokens) if P > 1 else sched
    if not any(drafts):
        eq("logits", hyb.logits if hyb is not None else orc.logits)
    elif hyb is None and P > 1:
        eq("logits", oracle_spec_indices(view, drafts, [0] * N)["logits"])
    else:
        cu = list(np.cumsum(local_counts))
        ends = hyb.adjust_cu(cu) if hyb is not None and npf else cu
        eq("logits", [e - d - 1 + j for e, d in zip(ends, drafts) for j in range(d + 1)])

    # padded slot mapping, per KV cache group
    if P > 1:
        # the block table's main-model slots: the runner's (host counts), or the async rebuild's
        # (corrected counts); never the MTP layout compute_slot_mapping_draft writes
        rebuilt = obs.get("rebuild.result", (False, False))[0]
        base = list(st.true_comp) if rebuilt else comp
        slots = [slot_of(i, base[i] + j) for i in range(n) for j in range(sched[i])]
        padded = orc.padded_slot_mapping(slots, -1)
        pad8 = -(-total_sampled // 8) * 8
        length = N * P if hyb is not None and total_sampled == pad8 else pad8 * P
        length = min(length, cfg.T + 2 * P * cfg.R)
        for g in range(cfg.kv_groups):
            eq(f"padded_slot_mapping.{g}", (padded + [-1] * length)[:length])

    # restored hidden states
    if P > 1:
        if hyb is not None:
            expected = [
                _row(q, st.index, l)
                for q, l in (divmod(i, hyb.max_tokens) for i in hyb.enter_fa(hyb.max_tokens))
            ]
        else:
            owner = {g: (r, l) for r, rows in enumerate(orc.rows) for l, g in enumerate(rows)}
            expected = [_row(owner[g][0], st.index, owner[g][1]) for g in range(P * N)]
        eq("restored", expected)

    # attention metadata
    fixed = None
    if cfg.async_sched and k:
        base = st.true_comp if st.index % 2 else st.comp
        fixed = [b + s for b, s in zip(base, sched)]
    meta = obs["metadata"]
    oa = oracle_attention(P, rank, D, cfg.interleave, sched, comp, list(st.prompt), k, decode_seq_lens=fixed)
    eq(L(meta["num_computed_tokens_of_pcp_dcp"]), oa.num_computed_tokens_of_pcp_dcp)
    eq(meta["num_actual_tokens_pcp_padded"], oa.num_actual_tokens_pcp_padded)
    eq(L(meta["pcp_unpad_mask"]), oa.unpad_mask if P > 1 else [])
    eq(L(meta["query_lens_pcp_full_cpu"]), sched)
    eq(meta["max_query_len_pcp_full"], max(sched))
    if P > 1:
        eq(L(meta["pcp_allgather_restore_idx"]), oa.restore_index_compact)
        for name, field in REFERENCE_FIELDS.items():
            eq(L(meta[field]), oa.index[name])
        for name, values in oa.per_request.items():
            eq(L(meta[name]), values)
    if hyb is not None:
        M, Q = hyb.max_tokens, N - Dt
        eq(L(meta["pcp_enter_fa_restore_idx"]), hyb.enter_fa(M))
        eq(L(meta["pcp_fa_query_idx"]), hyb.fa_query[rank])
        eq(L(meta["pcp_exit_fa_scatter_idx"]), hyb.exit_fa(rank, Q))
        fa_len = len(hyb.enter_fa(M))
        eq(L(meta["pcp_fa_padding_restore_idx"]), hyb.fa_padding if fa_len < P * N else None)
        eq(meta["max_num_tokens_across_pcp"], M)
    if k:
        hist = [f - s for f, s in zip(fixed, sched)] if fixed else comp
        eq(L(meta["dcp_mtp_attn_mask"]), tr.mask_rows(cfg, rank, dcp_rank, hist, sched, nd, n))

    if k:
        _check_spec(cfg, st, rank, dcp_rank, obs, tr, orc, hyb, view, eq)
    if cfg.multimodal and P > 1:
        _check_multimodal(cfg, st, rank, obs, orc, eq)
    return checked


def _check_spec(cfg, st, rank, dcp_rank, obs, tr, orc, hyb, view, eq) -> None:
    P, D, k, thr = cfg.pcp, cfg.dcp, cfg.spec, 1 + cfg.spec
    sched, n = list(st.sched), len(st.sched)
    nd = sum(orc.is_decode)
    npf, Dt, N = n - nd, orc.num_decode_tokens, orc.num_tokens
    F = sum(sched)
    with_prefill = npf > 0
    table = _table(cfg, st)

    def full(comp):
        return oracle_full_inputs(sched, list(comp), table, k, P, slot_fn=slot_of)

    def repaired(ids):
        prev = st.prev
        if prev is None:
            return ids
        rows = [prev["req_id_to_index"].get(r, -1) for r in st.req_ids]
        return oracle_repair(sched, orc.is_decode, ids, L(prev["sampled"]), L(prev["drafts"][:, :k]), rows, k)

    def check_full(comp):
        f = full(comp)
        cpu, gpu = obs["input_ids_pcp_full"]
        eq(L(cpu), f["ids"])
        eq(L(gpu), repaired(f["ids"]))
        qsl = f["qsl"] + [-1] * (cfg.R - n)
        eq(L(obs["query_start_loc_pcp_full"][0]), qsl)
        eq(L(obs["query_start_loc_pcp_full"][1]), qsl)
        eq("positions_pcp_full", f["positions"])
        eq("cu_num_tokens_pcp_full", f["qsl"][1:])

    builds = thr > 2 and (not with_prefill or (P == 1 and D > 1))
    rebuilt = obs.get("rebuild.result")
    if rebuilt == (True, False):  # the host rebuild ran generate_pcp_mtp_input again, corrected
        check_full(st.true_comp)
    else:
        check_full(st.comp)
    if builds:
        tr.mtp_slots = _mtp_expected(cfg, st, st.true_comp if rebuilt == (True, False) else st.comp, P)
    if rebuilt is not None:
        should = st.prev is not None and nd > 0
        on_device = st.index % 2 == 0 and not with_prefill
        eq("rebuild.result", (should, should and on_device))
        local, full_pos = oracle_rebuild(view, list(st.true_comp))
        qsl_full = request_starts(sched)
        if should and on_device:
            eq("rebuild.positions", local)
            if thr > 2:
                tr.mtp_slots = _mtp_expected(cfg, st, st.true_comp, P)
        elif should:
            eq("rebuild.positions_np", local)
            owners = [i for i in range(n) for _ in range(orc.pcp_tokens[i] if P > 1 else sched[i])]
            eq("rebuild.input_ids", [table[i][x] for i, x in zip(owners, local)])
            eq(
                "rebuild.prepare_input_ids",
                [(n, len(local), list(np.cumsum(orc.pcp_tokens if P > 1 else sched)))],
            )
        calls = [(n, qsl_full, full_pos)] if should and P > 1 else []
        eq("rebuild.block_table_calls", [(a, L(b), L(c)) for a, b, c in calls])
        eq(L(obs["rebuild.mtp_slot_pad"]), tr.mtp_slots)
    else:
        eq(L(obs["mtp_slot_pad"]), tr.mtp_slots)

    # the proposer
    if P * D == 1:
        return
    fp = obs["first_pass"]
    tis_in = L(fp["long_seq_args"][1])
    eq(L(fp["long_seq_args"][0]), sched[:nd])
    ids_full = L(obs["input_ids_pcp_full"][1])
    if P == 1:
        eq(fp["num_tokens"], F)
        eq(L(fp["input_ids"]), ids_full)
        eq(L(fp["token_indices_to_sample"]), tis_in)
    else:
        seq = [c + s for c, s in zip(st.comp, sched)]
        of = oracle_first_pass(view, ids_full, tis_in, L(obs["logits"]), thr, seq)
        restored = L(obs["restored"])
        if hyb is None:
            eq(L(fp["input_ids"]), of["ids"])
            eq(L(fp["target_hidden_states"]), [restored[r] for r in of["rows"]])
        else:
            lens = sched[nd:]
            split = oracle_draft_split(P, rank, lens, ids_full[Dt:F], restored[Dt * P :])
            eq(L(fp["input_ids"]), ids_full[:Dt] + split.input_ids)
            eq(L(fp["target_hidden_states"]), restored[:Dt] + split.hidden)
        eq(fp["num_tokens"], N)
        eq(L(fp["token_indices_to_sample"]), of["tis"])
        eq(L(obs["first_pass.tis_in_place"]), of["tis"])
        cam = obs["first_pass.cam"]
        if npf:
            eq(L(cam["seq_lens"]), of["seq_lens"])
            eq(L(cam["query_start_loc"])[nd + 1 :], of["qsl"][nd + 1 :])
            eq(cam["max_query_len"], of["max_query_len"])
            eq(cam["num_actual_tokens"], N)
        if Dt:
            rows = range(Dt) if hyb is not None else oracle_decode_hidden_rows(view)  # FA order: rank 0 first
            eq(L(obs["decode_hidden_states"]), [restored[r] for r in rows])
    if k >= 2:
        active = (nd > 0 and npf == 0) or (P == 1 and D > 1 and npf > 0)
        got = obs["mtp_drafting"]
        if not active:
            eq(got, None)
        else:
            num = n if (P == 1 and npf) else nd
            eq(L(got["slot_indices"]), oracle_mtp_slot_indices(sched, list(st.comp), tis_in, k, P, num))
            eq(L(got["slot_mapping"]), tr.mtp_slots)
            eq(L(got["seq_lens"]), [c + s for c, s in zip(st.comp, sched)])
            eq(obs["mtp_drafting.cam_rows"], n)
    seq = [c + s for c, s in zip(st.comp, sched)]
    for d in range(max(k - 1, 1)):
        lens, _ = oracle_drafting_seq_lens(seq, d, P, D, cfg.interleave, rank, dcp_rank)
        eq(L(obs[f"drafting_cp.{d}.other"]), lens)
    length = n * thr * P
    idx = [(j * 7) % max(length, 1) for j in range(length)]
    masked = oracle_mask_restore(idx, P, thr)
    eq("mask_restore.index", masked)
    eq("mask_restore.buffer", masked + [0] * 4)


def _check_multimodal(cfg, st, rank, obs, orc, eq) -> None:
    n = len(st.sched)
    reqs = mm_requests(st)
    ids = list(st.req_ids)
    counts = orc.pcp_tokens
    N = orc.num_tokens
    owners = [i for i in range(n) for _ in range(counts[i])]
    positions = [st.comp[i] + x for i, x in zip(owners, orc.positions[rank])]
    tables = [None if r.mrope_positions is None else L(r.mrope_positions) for r in reqs.values()]
    deltas = [
        r.mrope_position_delta if r.mrope_positions is not None and r.mrope_positions.shape[1] else None
        for r in reqs.values()
    ]
    tables = [t if t is not None and len(t[0]) else None for t in tables]
    mrope = oracle_mrope(tables, deltas, list(st.prompt), positions, owners)
    eq(L(obs["mm.mrope"]), [row + [-7] * 4 for row in mrope])
    embeds = {i: L(prompt_embeds_for(rid, st.prompt[i])) for i, rid in enumerate(ids) if i % 2 == 0}
    base = [[-1.0] * 3 for _ in range(N)]
    got = L(obs["mm.prompt_embeds"])
    want = oracle_prompt_embeds(embeds, positions, owners, base)
    assert np.allclose(got, want, rtol=0, atol=0), "prompt embeds"
    eq(L(obs["mm.local_schedule"][0]), counts)
    eq(obs["mm.local_schedule"][1], N)
    cache = mm_cache(reqs)
    partial = {key: v for j, (key, v) in enumerate(sorted(cache.items())) if j % 2}
    sched_enc, needed = oracle_local_mm_schedule(ids, reqs, positions, counts, partial)
    eq(obs["mm.local_mm_schedule"], (sched_enc, needed))
    localized = obs["mm.localized"]
    if N == sum(st.sched) and list(counts) == list(st.sched):  # nothing differs: left as it is
        eq(obs["mm.restore_state"], None)
        eq(localized["total_num_scheduled_tokens"], N)
        eq(localized["scheduled_encoder_inputs"], {ids[0]: [0]})
        eq(localized["free_encoder_mm_hashes"], ["gone", *sorted(cache)[:2]])
    else:
        eq(localized["total_num_scheduled_tokens"], N)
        eq(localized["num_scheduled_tokens"], dict(zip(ids, counts)))
        eq(localized["scheduled_encoder_inputs"], sched_enc)
        eq(localized["free_encoder_mm_hashes"], ["gone"])
    rows, is_mm = oracle_mm_embeddings(ids, reqs, positions, counts, 0, cache)
    got_embeds, got_mask, sync_m, sync_x = obs["mm.embeddings"]
    flat = torch.cat(got_embeds) if got_embeds else torch.zeros(0, 3)
    eq(L(flat), [L(r) for r in rows])
    eq(L(got_mask), is_mm)
    eq((sync_m, sync_x), (False, False))
    eq(obs["mm.restored"], True)


@pytest.fixture
def async_stand_in(monkeypatch):
    """vllm-ascend's ``correct_optimistic_seq_lens_cpu`` for the host rebuild (no vllm_ascend here)."""
    for name in ("vllm_ascend", "vllm_ascend.spec_decode"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    utils = types.ModuleType("vllm_ascend.spec_decode.utils")
    utils.correct_optimistic_seq_lens_cpu = correct_optimistic_seq_lens_cpu
    monkeypatch.setitem(sys.modules, "vllm_ascend.spec_decode.utils", utils)


def _manager(cfg: SimConfig, rank: int, dcp_rank: int, **kw):
    holder: dict[str, SimRunner] = {}
    m = FunctionalDCSManager(
        *cfg.manager_args(rank, dcp_rank),
        all_gather=lambda x: holder["r"].gather(x),
        **{"check_syncs": True, **kw},
    )
    runner = SimRunner(m, cfg, rank, dcp_rank)
    holder["r"] = runner
    return m, runner


def _same_storage(view: torch.Tensor, buffer: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def _persistent(m: FunctionalDCSManager) -> dict[str, int]:
    return {k: v.data_ptr() for k, v in m.persistent_buffers().items()}


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_lockstep_runner_order_equals_the_oracles(cfg, async_stand_in):
    """Real steps in the runner's order, with ``_dummy_run``s at start-up and between steps: every real
    step against the oracles, every dummy run's metadata against the real step of its batch."""
    steps = schedule(cfg, STEPS, seed=7)
    checked = 0
    for rank in range(cfg.pcp):
        for dcp_rank in range(cfg.dcp):
            m, runner = _manager(cfg, rank, dcp_rank)
            twin, _ = _manager(cfg, rank, dcp_rank)
            before = _persistent(m)
            tr = Tracker()
            for st in steps:
                for num_tokens, uniform, capturing in SimRunner.dummy_plan(cfg, st.index):
                    obs = runner.dummy_run(num_tokens, uniform, capturing)
                    ctx = f"[{cfg.name}] dummy run {num_tokens} before step {st.index} rank {rank}/{dcp_rank}"
                    checked += check_dummy(cfg, obs, twin, runner, rank, dcp_rank, tr, ctx)
                obs = runner.step(st)
                checked += check_step(cfg, st, rank, dcp_rank, obs, tr)
                # the device views the runner got are the persistent buffers themselves
                meta, step_buffers = m.long_seq_metadata, m.persistent_buffers()
                if cfg.pcp > 1:
                    assert _same_storage(meta.pcp_allgather_restore_idx, step_buffers["restore"])
                    assert _same_storage(meta.q_head_idx_tensor, step_buffers["q_head_idx"])
            assert _persistent(m) == before, "a persistent buffer moved"
    assert checked > 100


def test_golden_vectors_of_the_reference_docstrings():
    """vllm-ascend's ``update_tokens_for_pcp`` docstring (tokens [1, 5, 8], P = 2) and its hybrid test."""
    cfg = SimConfig("golden", pcp=2, R=4, T=32)
    for rank, positions in ((0, [0, 0, 1, 6, 7, 0, 1, 6, 7]), (1, [0, 2, 3, 4, 5, 2, 3, 4, 5])):
        m, _ = _manager(cfg, rank, 0)
        m.initialize_slot_mapping()
        sched = np.array([1, 5, 8], dtype=np.int32)
        m.init_batch_info(sched, 3, np.array([7, 0, 0]), np.array([3, 5, 8]))
        tokens, pos = m.update_tokens_for_pcp(sched.copy(), np.arange(64))
        assert tokens.tolist() == [1, 4, 4] and pos.tolist() == positions
        assert m.num_pcp_pads_cpu[:3].tolist() == [1, 3, 0]
        m.generate_pcp_metadata(
            9,
            torch.from_numpy(tokens),
            SimpleNamespace(num_computed_tokens_cpu=np.array([7, 0, 0])),
            tokens,
            torch.zeros(3, 1),
            3,
            3,
        )
        meta = m.long_seq_metadata
        assert meta.pcp_unpad_mask.tolist() == [True, False] + [True] * 5 + [False] * 3 + [True] * 8
        restore = [0, 9, 1, 2, 10, 11, 12, 13, 3, 4, 5, 6, 14, 15, 16, 17, 7, 8]
        assert meta.pcp_allgather_restore_idx.tolist() == restore
        assert m.get_logits_indices(np.cumsum(tokens), 3).tolist() == [0, 6, 17]
    hybrid = SimConfig("golden hybrid", pcp=2, hybrid=True, R=4, T=32)
    m, _ = _manager(hybrid, 0, 0)
    sched = np.array([3, 5], dtype=np.int32)
    m.init_batch_info(sched, 2, np.array([0, 0]), np.array([3, 5]))
    tokens, pos = m.update_tokens_for_pcp(sched.copy())
    assert tokens.tolist() == [2, 3] and pos.tolist() == [0, 1, 0, 1, 2] and m.max_num_tokens_across_pcp == 5
    m.generate_pcp_metadata(
        5,
        torch.from_numpy(m.num_scheduled_tokens_padded),
        SimpleNamespace(num_computed_tokens_cpu=np.array([0, 0])),
        tokens,
        torch.zeros(2, 1),
        2,
        2,
    )
    meta = m.long_seq_metadata
    assert meta.pcp_enter_fa_restore_idx.tolist() == [0, 1, 5, 2, 3, 4, 6, 7]
    assert meta.pcp_fa_padding_restore_idx.tolist() == [0, 1, 2, 8, 3, 4, 5, 6, 7, 8, 8, 8]
    assert meta.pcp_fa_query_idx.tolist() == [0, 3, 4, 5, 10, 11]
    assert meta.pcp_exit_fa_scatter_idx.tolist() == [0, 6, 2, 3, 8]


def _same_observations(a: dict, b: dict, ctx: str) -> None:
    assert a.keys() == b.keys(), ctx
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            _same_observations(x, y, f"{ctx} {key}")
        else:
            assert repr(L(x)) == repr(L(y)), f"{ctx} {key}"


def _same_step_and_dummies(cfg, st, rc, re) -> None:
    """Runners ``rc`` and ``re`` observe the same in step ``st``'s dummy runs and in the step."""
    for num_tokens, uniform, capturing in SimRunner.dummy_plan(cfg, st.index):
        _same_observations(
            rc.dummy_run(num_tokens, uniform, capturing),
            re.dummy_run(num_tokens, uniform, capturing),
            "dummy",
        )
    _same_observations(rc.step(st), re.step(st), f"step {st.index}")


def test_graphs_are_made_at_construction_and_serve_every_step():
    """``capture=True`` (torch.compile on the CPU; NPUGraph on an NPU): the constructor makes every
    graph of the ladder (per bucket: the device step, the padded slot mapping, the MTP mask), the
    steps and dummy runs make none and equal the eager manager's, bucket after bucket."""
    cfg = SimConfig("capture", pcp=2, spec=1, R=4, T=32, num_requests=4, max_prompt=10, max_new=(3, 6))
    counters.clear()
    captured, rc = _manager(cfg, 1, 0, capture=True, compile_backend="eager", token_buckets=(8,))
    ladder = captured.graphs.ladder
    assert [b.num_tokens for b in ladder] == [8, 36]  # 8, then the local capacity T + min(R, T)
    stats = captured.graph_stats
    assert stats.prepared == captured.num_graphs == 3 * len(ladder) and stats.steps == 0
    made = counters["stats"]["unique_graphs"]
    assert made >= stats.prepared
    eager, re = _manager(cfg, 1, 0)
    buckets = []
    for st in schedule(cfg, 6, seed=3):
        _same_step_and_dummies(cfg, st, rc, re)
        buckets.append(captured.record.batch.bucket)
    assert set(buckets) == set(ladder), buckets  # both rungs met
    assert counters["stats"]["unique_graphs"] == made, "a step compiled a graph"
    assert captured.num_graphs == stats.prepared and stats.fallbacks == 0 and stats.steps > len(buckets)


def test_step_and_slot_graphs_read_their_persistent_staging_in_place(monkeypatch):
    """On CUDA / NPU the step's and the slot mapping's graphs read their staging inputs where they
    are (``capture(persistent_inputs=True)``: a replay copies nothing), which holds only if every
    call passes the very tensors the graph was captured on; the MTP mask's graph, whose two
    variants pass different tensors, keeps static copies. Recorded through ``graph.capture``
    (the graphs then run as plain calls) over a schedule, checked against the eager manager."""
    in_place = {"step", "slots"}  # the graph kinds whose staging is read where it is
    made, real = [], pcp_fn.graph.capture

    def recording(fn, *args, backend=None, package_path=None, persistent_inputs=False, **kw):
        made.append((args, persistent_inputs))
        return real(fn, *args, backend=None)  # plain calls: the CPU has no device graph

    monkeypatch.setattr(pcp_fn.graph, "capture", recording)  # what the graph runtime makes
    cfg = SimConfig("in place", pcp=2, spec=1, R=4, T=32, num_requests=4, max_prompt=10, max_new=(3, 6))
    m, rc = _manager(cfg, 0, 0, capture=True, compile_backend="inductor", token_buckets=(8,))
    graphs, slots_in = m.graphs, m.persistent_buffers()["slots_in"]
    kinds = set()
    for rung in graphs.rungs:
        for (kind, _variant), call in rung.calls.items():
            kinds.add(kind)
            assert call.in_place == (kind in in_place)
            if kind == "step":
                assert call.staged == (graphs.packed,)
            elif kind == "slots":  # a view of the slot staging, made once per rung
                assert call.staged[0].data_ptr() == slots_in.data_ptr()
    assert kinds == {"step", "slots", "mask"}
    assert sum(p for _, p in made) == 2 * len(graphs.rungs) and len(made) == 3 * len(graphs.rungs)
    staged_at_capture = {id(a) for args, p in made if p for a in args}
    calls = []
    invoke = graphs.runtime.invoke

    def watching(call, bound):
        if call.in_place:
            calls.append(all(id(t) in staged_at_capture for t in call.staged))
        invoke(call, bound)

    graphs.runtime.invoke = watching
    eager, re = _manager(cfg, 0, 0)
    for st in schedule(cfg, 5, seed=4):
        _same_step_and_dummies(cfg, st, rc, re)
    assert calls and all(calls), "an in-place graph was called with tensors it was not captured on"


@pytest.mark.parametrize(
    "env, kwargs, backend",
    [
        ("auto", {}, None),  # the CPU's default: plain calls
        ("none", {}, None),
        ("eager", {}, "eager"),  # a torch.compile backend
        ("eager", {"capture": False}, None),  # the constructor's arguments override the variable
        ("none", {"capture": True, "compile_backend": "eager"}, "eager"),
        ("none", {"compile_backend": "eager"}, "eager"),
    ],
)
def test_pcp_fn_graph_backend_configures_the_manager(monkeypatch, env, kwargs, backend):
    """``PCP_FN_GRAPH_BACKEND`` (the vLLM adapters' switch) picks the graphs of ``FunctionalDCSManager``
    too, made at construction; ``capture=`` / ``compile_backend=`` override it."""
    monkeypatch.setenv("PCP_FN_GRAPH_BACKEND", env)
    cfg = SimConfig("switch", pcp=2, R=4, T=32)
    m, _ = _manager(cfg, 0, 0, token_buckets=(), **kwargs)  # one rung: the capacity
    assert m.graphs.backend == backend
    assert m.graph_stats.prepared == m.num_graphs == (0 if backend is None else 2)  # step, slot mapping


@pytest.mark.timeout(600)  # two AOTInductor compiles (about a minute each on a loaded 2-core machine)
def test_aoti_graphs_are_made_at_construction_and_cached_on_disk(tmp_path, monkeypatch):
    """``PCP_FN_GRAPH_BACKEND=aoti``: the constructor compiles one AOTInductor package per graph
    of the ladder into ``$PCP_FN_CACHE_DIR``; the next construction loads them (no compile); the
    steps equal the eager manager's and make no graph."""
    monkeypatch.setenv("PCP_FN_GRAPH_BACKEND", "aoti")
    monkeypatch.setenv("PCP_FN_CACHE_DIR", str(tmp_path))
    cfg = SimConfig("aoti", pcp=2, R=4, T=16, num_requests=3, max_prompt=8, max_new=(2, 4))
    first, _ = _manager(cfg, 0, 0, token_buckets=())  # one rung: two packages (step, slot mapping)
    assert first.graph_stats.prepared == 2 and first.graph_stats.loaded == 0
    packages = sorted(p for p in os.listdir(tmp_path) if p.endswith(".pt2"))
    graphs = first.graphs  # named by the config, the graph (kind and bucket), the device type
    named = {os.path.basename(graphs.package_path(kind, graphs.ladder[0])) for kind in ("step", "slots")}
    assert set(packages) == named and len(named) == 2 and all(p.startswith("dcs_") for p in packages)
    second, rs = _manager(cfg, 0, 0, token_buckets=())
    assert second.graph_stats.prepared == 2 and second.graph_stats.loaded == 2
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".pt2")) == packages
    eager, re = _manager(cfg, 0, 0)
    for st in schedule(cfg, 4, seed=5):
        _same_observations(rs.step(st), re.step(st), f"step {st.index}")
    assert second.graph_stats.fallbacks == 0 and second.num_graphs == 2


@dataclasses.dataclass(frozen=True)
class _NPUDevice:
    """Stand-in for ``torch.device("npu")`` (torch knows the name only once torch_npu registers it)."""

    type: str = "npu"
    index: int = 0


class _OnNPU(torch.Tensor):
    """A CPU tensor that reports an NPU device: what ``graph.capture`` sees of an NPU tensor."""

    @property
    def device(self):
        return _NPUDevice()


def test_graph_capture_on_an_npu_uses_npu_graph(monkeypatch):
    """No NPU here: with a stand-in ``torch.npu`` and tensors reporting an ``npu`` device, the public
    ``pcp_fn.graph.capture`` records one ``torch.npu.NPUGraph`` and replays it (the manager's
    ``capture=`` path on an Ascend device); the manager captures by default on an NPU."""
    used = []

    class Stream:
        def __init__(self, device=None):
            used.append("Stream")

        def wait_stream(self, other):
            pass

    class NPUGraph:
        def __init__(self):
            used.append("NPUGraph")

        def replay(self):
            used.append("replay")

    class _Ctx:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    fake = SimpleNamespace(
        Stream=Stream, NPUGraph=NPUGraph, current_stream=lambda d=None: Stream(), stream=_Ctx, graph=_Ctx
    )
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    captured = pcp_fn.graph.capture(lambda x: x + 1, torch.zeros(3).as_subclass(_OnNPU), warmup=1)
    assert captured.kind == "npu-graph" and len(captured) == 1
    captured(torch.ones(3).as_subclass(_OnNPU))
    assert used.count("NPUGraph") == 1 and used[-1] == "replay"
    # the manager captures by default on an NPU (PCP_FN_GRAPH_BACKEND=auto), not on the CPU
    monkeypatch.setenv("PCP_FN_GRAPH_BACKEND", "auto")
    assert graph_backend(None, None, _NPUDevice()) == "inductor"  # graph.capture: an NPUGraph there
    assert graph_backend(None, None, torch.device("cpu")) is None


def test_the_device_path_runs_under_the_sync_detector(monkeypatch):
    cfg = CONFIGS[0]
    m, runner = _manager(cfg, 0, 0)
    st = schedule(cfg, 1, seed=1)[0]
    runner.step(st)  # check_syncs=True: every device-path call ran under pcp_fn.no_host_syncs
    real = pcp_fn.update_tokens  # the device step calls it through pcp_fn: a host sync injected there

    def syncing(state, batch):
        batch.num_reqs.item()
        return real(state, batch)

    monkeypatch.setattr(pcp_fn, "update_tokens", syncing)
    with pytest.raises(pcp_fn.HostSyncError):
        m.init_batch_info(
            np.array(st.sched, dtype=np.int32), len(st.sched), np.array(st.comp), np.array(st.prompt)
        )


def test_the_record_is_frozen_and_kept_across_steps():
    cfg = CONFIGS[0]
    m, runner = _manager(cfg, 0, 0)
    steps = schedule(cfg, 2, seed=2)
    runner.step(steps[0])
    first = m.record
    runner.step(steps[1])
    assert first.host.num_scheduled.tolist() == list(steps[0].sched)
    assert m.record.host.num_scheduled.tolist() == list(steps[1].sched)
    with pytest.raises(AttributeError):
        first.host = None


def test_a_dummy_run_with_stale_counts_does_not_fail():
    """``_dummy_run``: init_batch_info without update_tokens_for_pcp; stale counts put a 'decode' late."""
    cfg = SimConfig("dummy", pcp=2, spec=1, R=4, T=32)
    m, _ = _manager(cfg, 0, 0)
    m.initialize_slot_mapping()
    sched = np.array([4, 1, 1], dtype=np.int32)
    m.init_batch_info(sched, 3, np.array([0, 9, 0, 0]), np.array([0, 3, 0, 0]))
    assert m.num_decode_reqs == 0  # the late decode is treated as a prefill
    m.get_padded_slot_mapping(6, 8, torch.zeros(12, dtype=torch.int64), 0)
    meta, _ = m.generate_pcp_metadata(
        6,
        torch.from_numpy(sched),
        SimpleNamespace(num_computed_tokens_cpu=np.zeros(4)),
        sched,
        torch.zeros(3, 1),
        3,
        3,
    )
    assert meta is not None


@pytest.mark.parametrize(
    "args, match",
    [
        (dict(num_reqs=9), "num_reqs=9 exceeds max_num_reqs=6"),
        (dict(sched=[40, 30]), "sums to 70 tokens; max_num_tokens is 64"),
        # a sum past the int32 limit of counts each below half of it (an int32 sum would wrap)
        (dict(sched=[2**29] * 4, comp=[0] * 4, num_reqs=4), "sums to 2147483648 tokens"),
        (dict(sched=[-1, 3]), r"num_scheduled_tokens\[0\] = -1 is negative"),
        (dict(sched=[1.5, 2.0]), "num_scheduled_tokens must be a 1-D integer array"),
        (dict(comp=[1]), "num_computed_tokens has 1 entries but num_reqs is 2"),
    ],
)
def test_bad_input_names_the_field_and_the_limit(args, match):
    m, _ = _manager(CONFIGS[0], 0, 0)
    sched = np.asarray(args.get("sched", [3, 4]))
    comp = np.asarray(args.get("comp", [0, 0]))
    with pytest.raises(ValueError, match=match):
        m.init_batch_info(sched, args.get("num_reqs", 2), comp, np.array([3, 4, 0, 0, 0, 0, 0, 0, 0]))


def test_bad_calls_and_constructor_fields_raise_value_errors():
    cfg = CONFIGS[0]
    with pytest.raises(ValueError, match="pcp_rank must be < pcp_size=2"):
        FunctionalDCSManager(*cfg.manager_args(2, 0))
    args = list(cfg.manager_args(0, 0))
    args[5] = 5
    with pytest.raises(ValueError, match=r"max_num_reqs=5 differs from scheduler_config\.max_num_seqs=6"):
        FunctionalDCSManager(*args)
    m, _ = _manager(cfg, 0, 0)
    sched = np.array([3, 4], dtype=np.int32)
    m.init_batch_info(sched, 2, np.zeros(2, dtype=np.int32), np.array([3, 4]))
    with pytest.raises(ValueError, match="differs from init_batch_info"):
        m.update_tokens_for_pcp(np.array([3, 5], dtype=np.int32))
    with pytest.raises(ValueError, match="kv_cache_group_id=5 has no buffer"):
        m.get_padded_slot_mapping(4, 8, torch.zeros(7, dtype=torch.int64), 5)
    with pytest.raises(ValueError, match="the buffer holds"):
        m.mask_spec_decode_restore_idx_for_graph(torch.zeros(10_000, dtype=torch.int64))


def _placeholder_config(**fields):
    """A ``MagicMock()`` vllm_config with only ``fields`` set (``"a.b"`` paths), as vllm-ascend's
    unit tests build theirs."""
    from unittest.mock import MagicMock

    config = MagicMock()
    for path, value in fields.items():
        *parents, name = path.split(".")
        obj = config
        for parent in parents:
            obj = getattr(obj, parent)
        setattr(obj, name, value)
    return config


def test_placeholder_config_fields_read_as_vllm_ascend_reads_them():
    """A ``unittest.mock`` attribute of the config is not a value: R and T come from the constructor's
    arguments, ``max_model_len`` is vllm-ascend's buffer width for it (``operator.index``: 1), the
    model type matches no hybrid model, a mock ``speculative_config`` is present; the calls that split
    context lengths across CP ranks refuse a mock interleave size (naming it), the others run."""
    config = _placeholder_config(**{"speculative_config.num_speculative_tokens": 1})
    m = FunctionalDCSManager(2, 0, 1, 0, 32 + 2 * 2 * 4, 4, "cpu", config, False)
    s = m.settings
    assert (s.max_num_reqs, s.max_num_tokens, s.max_model_len) == (4, 48, 1)
    assert not s.hybrid_attn and s.has_spec_config and m.decode_threshold == 2 and not s.interleave_set
    sched = np.array([1, 5, 8], dtype=np.int32)
    m.init_batch_info(sched, 3, np.array([3, 0, 0]), np.array([3, 5, 8]))
    tokens, positions = m.update_tokens_for_pcp(sched.copy())
    assert tokens.tolist() == [1, 4, 4] and positions.tolist() == [0, 0, 1, 6, 7, 0, 1, 6, 7]
    batch = SimpleNamespace(num_computed_tokens_cpu=np.array([3, 0, 0]))
    with pytest.raises(
        ValueError, match=r"generate_pcp_metadata needs parallel_config\.cp_kv_cache_interleave"
    ):
        m.generate_pcp_metadata(9, torch.from_numpy(tokens), batch, sched, torch.zeros(3, 1), 3, 3)
    with pytest.raises(ValueError, match="update_spec_decode_drafting_cp_metadata needs parallel_config"):
        m.update_spec_decode_drafting_cp_metadata(None, None, torch.ones(1, dtype=torch.int64), 0)
    # a real interleave: the metadata
    config.parallel_config.cp_kv_cache_interleave_size = 1
    m = FunctionalDCSManager(2, 0, 1, 0, 48, 4, "cpu", config, False)
    m.init_batch_info(sched, 3, np.array([3, 0, 0]), np.array([3, 5, 8]))
    m.update_tokens_for_pcp(sched.copy())
    meta, _ = m.generate_pcp_metadata(9, torch.from_numpy(tokens), batch, sched, torch.zeros(3, 1), 3, 3)
    assert meta.num_computed_tokens_of_pcp_dcp.tolist() == [[[2], [2]], [[0], [0]], [[0], [0]]]


@pytest.mark.parametrize(
    "path, value, match",
    [
        ("scheduler_config.max_num_seqs", "6", r"scheduler_config\.max_num_seqs must be an int >= 1"),
        ("scheduler_config.max_num_seqs", 0, r"scheduler_config\.max_num_seqs must be an int >= 1"),
        ("scheduler_config.max_num_batched_tokens", 64.0, r"max_num_batched_tokens must be an int >= 1"),
        ("scheduler_config.max_num_batched_tokens", -1, r"max_num_batched_tokens must be an int >= 1"),
        ("speculative_config", SimpleNamespace(num_speculative_tokens=1.5), "num_speculative_tokens must be"),
        ("speculative_config", SimpleNamespace(num_speculative_tokens=-1), "num_speculative_tokens must be"),
        (
            "speculative_config",
            SimpleNamespace(num_speculative_tokens=True),
            "num_speculative_tokens must be",
        ),
        ("model_config.max_model_len", 0, r"model_config\.max_model_len must be an int >= 1"),
        ("parallel_config.cp_kv_cache_interleave_size", 0, "cp_kv_cache_interleave_size must be an int >= 1"),
        (
            "parallel_config.cp_kv_cache_interleave_size",
            "2",
            "cp_kv_cache_interleave_size must be an int >= 1",
        ),
    ],
)
def test_bad_config_values_are_refused_naming_the_field(path, value, match):
    """A real value that is not a count in range is refused, whatever placeholders the config holds."""
    cfg = CONFIGS[0]
    args = list(cfg.manager_args(0, 0))
    config = args[7]
    *parents, name = path.split(".")
    obj = config
    for parent in parents:
        obj = getattr(obj, parent)
    setattr(obj, name, value)
    with pytest.raises(ValueError, match=match):
        FunctionalDCSManager(*args)


def test_placeholder_fields_that_vllm_ascend_cannot_read_are_refused():
    """A ``Mock`` (no ``__index__``) as ``max_model_len``, or as the speculative token count: vllm-ascend
    could not size its buffers with it either; refused naming the field."""
    from unittest.mock import MagicMock, Mock

    config = _placeholder_config(**{"speculative_config.num_speculative_tokens": 0})
    config.model_config.max_model_len = Mock()
    with pytest.raises(ValueError, match=r"model_config\.max_model_len must be an int >= 1"):
        FunctionalDCSManager(2, 0, 1, 0, 48, 4, "cpu", config, False)
    config = _placeholder_config(**{"speculative_config.num_speculative_tokens": MagicMock()})
    with pytest.raises(ValueError, match=r"speculative_config\.num_speculative_tokens must be an int >= 0"):
        FunctionalDCSManager(2, 0, 1, 0, 48, 4, "cpu", config, False)


def test_generate_pcp_metadata_before_any_step_is_the_empty_steps():
    """Before the first ``init_batch_info`` the manager's step is the empty one (vllm-ascend's counts
    start at 0): its metadata has every field, every list and index empty (``query_lens`` past its
    0 requests is not read); with ``pcp * dcp == 1`` there is none."""
    m, _ = _manager(CONFIGS[0], 1, 0)
    batch = SimpleNamespace(num_computed_tokens_cpu=np.array([5, 10, 0, 0]))
    lens = torch.tensor([5, 10, 40, 60])
    meta, _ = m.generate_pcp_metadata(100, lens, batch, np.array([0, 0, 40, 60]), torch.zeros(4, 1), 4, 4)
    assert m.decode_req_mask is None and meta.num_actual_tokens_pcp_padded == 0
    assert meta.num_computed_tokens_of_pcp_dcp.shape == (0, 2, 1) and meta.pcp_unpad_mask.numel() == 0
    for field in REFERENCE_FIELDS.values():
        assert getattr(meta, field).numel() == 0, field
    assert meta.attn_mask_seqlens == [] and meta.tail_actual_seq_lengths_kv == []
    assert meta.query_lens_pcp_full_cpu.tolist() == [0, 0, 0, 0] and meta.max_query_len_pcp_full == 0
    one = FunctionalDCSManager(*SimConfig("P1", pcp=1, R=6, T=64).manager_args(0, 0))
    assert one.generate_pcp_metadata(100, lens, batch, None, torch.zeros(4, 1), 4, 4)[0] is None


def test_get_cp_local_seq_lens_is_vllm_ascends():
    """vllm-ascend's ``_get_cp_local_seq_lens`` (the sizes its arguments, not the manager's): each CP
    rank's KV tokens, in the input's dtype, against the round-robin oracle."""
    from oracle import oracle_cp_local_seq_lens

    m, _ = _manager(CONFIGS[0], 0, 0)
    lens = [0, 1, 2, 127, 128, 129, 256, 257, 1000]
    for P, D, I in ((1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (2, 1, 128), (2, 2, 128), (4, 2, 3)):
        for dtype in (torch.int32, torch.int64):
            got = m._get_cp_local_seq_lens(torch.tensor(lens, dtype=dtype), P, D, I)
            assert got.dtype == dtype and got.tolist() == oracle_cp_local_seq_lens(lens, P, D, I)


def test_dummy_run_index_tensors_are_views_of_the_persistent_buffers():
    """A dummy batch's counts taken as local rows (vllm-ascend's), up to ``T`` of them in one prefill:
    its index tensors are vllm-ascend's, in the step's persistent buffers (the local capacity holds
    ``T`` rows), int32 like a real step's."""
    cfg = SimConfig("dummy views", pcp=2, R=2, T=64)
    for rank in range(2):
        m, _ = _manager(cfg, rank, 0)
        buffers = m.persistent_buffers()
        batch = SimpleNamespace(num_computed_tokens_cpu=np.zeros(2, dtype=np.int32))
        for sched in ([8, 8], [64], [7, 57], [1, 1]):
            s = np.array(sched, dtype=np.int32)
            m.init_batch_info(s, len(sched), np.zeros(2, dtype=np.int32), s)
            total = int(s.sum())
            meta, _ = m.generate_pcp_metadata(total, torch.from_numpy(s), batch, s, torch.zeros(2, 1), 2, 2)
            want = oracle_dummy_metadata(sched, 0, 2, rank, total)
            for name, field in REFERENCE_FIELDS.items():
                got, buf = getattr(meta, field), buffers[name]
                assert got.tolist() == want[field] and got.dtype == buf.dtype, (sched, field)
                assert _same_storage(got, buf), (sched, field)
            assert meta.tail_actual_seq_lengths_kv == want["tail_actual_seq_lengths_kv"]


def test_import_pcp_fn_does_not_import_the_adapters_or_the_frameworks():
    code = (
        "import sys, pcp_fn; assert 'pcp_fn.adapters' not in sys.modules; "
        "import pcp_fn.adapters.vllm_ascend; "
        "bad = [m for m in ('vllm', 'vllm_ascend', 'torch_npu') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2])
    )


def test_install_switches_the_runner_to_the_functional_manager(monkeypatch):
    utils = types.ModuleType("vllm_ascend.worker.pcp_utils")
    runner = types.ModuleType("vllm_ascend.worker.model_runner_v1")
    utils.PCPManager = runner.PCPManager = object
    monkeypatch.setitem(sys.modules, "vllm_ascend.worker.pcp_utils", utils)
    monkeypatch.setitem(sys.modules, "vllm_ascend.worker.model_runner_v1", runner)
    for name in ("vllm_ascend", "vllm_ascend.worker"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    assert install(token_buckets=(16,)) is object
    m = runner.PCPManager(*CONFIGS[0].manager_args(0, 0))
    assert utils.PCPManager is runner.PCPManager and isinstance(m, FunctionalDCSManager)
    assert 16 in m.config.token_buckets
    # a runner module imported later takes the name from pcp_utils, already replaced
    monkeypatch.delitem(sys.modules, "vllm_ascend.worker.model_runner_v1")
    install()
    assert issubclass(utils.PCPManager, FunctionalDCSManager)


def _metadata_step(m, sched, comp, prompt, max_reqs, fixed=None):
    """One real step's manager calls up to ``generate_pcp_metadata`` (runner order); its metadata."""
    n = len(sched)
    nst = np.array(sched, dtype=np.int32)
    comp_r = np.zeros(max_reqs, dtype=np.int32)
    comp_r[:n] = comp
    prompt_r = np.zeros(max_reqs, dtype=np.int32)
    prompt_r[:n] = prompt
    m.init_batch_info(nst, n, comp_r, prompt_r)
    local = nst
    if m.pcp_world_size > 1:
        local, _ = m.update_tokens_for_pcp(nst.copy())
    if m.pcp_world_size > 1 and m.pcp_use_hybrid_attn:
        query_lens = m.num_scheduled_tokens_padded
        total = int(np.sum(sched))
    else:
        query_lens, total = local, int(np.sum(local))
    meta, _ = m.generate_pcp_metadata(
        total,
        torch.from_numpy(np.asarray(query_lens)),
        SimpleNamespace(num_computed_tokens_cpu=comp_r),
        np.asarray(local),
        torch.zeros(n, 4),
        n,
        n,
        fixed,
    )
    return meta


#: A dummy run's fields vllm-ascend derives from ``query_lens`` (the dummy batch's own counts, each
#: request's local rows: ``_dummy_run`` runs the dummy batch through the model unsplit) and from
#: the ``total`` the runner passes: checked against :func:`oracle_dummy_metadata`.
DUMMY_QUERY_FIELDS = {
    *REFERENCE_FIELDS.values(),
    "attn_mask_seqlens",
    "head_attn_nomask_seqlens",
    "tail_attn_nomask_seqlens",
    "head_actual_seq_lengths_kv",
    "tail_actual_seq_lengths_kv",
    "attn_chunk_seqlens",
    "num_actual_tokens_pcp_padded",
}
#: Views of the step's buffers whose length follows ``num_actual_tokens_pcp_padded`` (vllm-ascend's
#: hold what its last update left): their rows are the real step's of the dummy batch, as far as
#: both have rows.
DUMMY_PREFIX_FIELDS = {"pcp_allgather_restore_idx", "pcp_fa_query_idx", "pcp_fa_padding_restore_idx"}


def oracle_dummy_metadata(counts, nd, P, rank, total):
    """vllm-ascend 0.23 ``generate_pcp_metadata``'s index tensors and lists over ``query_lens = counts``
    (plain Python, its per-request loop): the first ``nd`` requests (decodes) skipped, prefill ``i``
    ``q = counts[i]`` local rows in chunks of ``q // 2``, its K/V ``P * q`` gathered rows."""
    h, t = rank, 2 * P - 1 - rank
    names = [f for k, f in REFERENCE_FIELDS.items() if k != "q_full_idx"]
    idx = {name: [] for name in names}
    chunks, seq = [], {k: [] for k in ("mask", "head_nomask", "tail_nomask", "head_kv", "tail_kv")}
    q_off = kv_off = 0
    for i, q in enumerate(counts):
        if i < nd:
            continue
        c = q // 2
        chunks.append(c)
        proj_off = len(idx["kv_tail_proj_idx_tensor"])
        idx["q_head_idx_tensor"] += range(q_off, q_off + c)
        idx["q_tail_idx_tensor"] += range(q_off + c, q_off + 2 * c)
        idx["kv_with_q_head_nomask_idx_tensor"] += range(kv_off, kv_off + c * h)
        idx["kv_with_q_head_mask_idx_tensor"] += range(kv_off + c * h, kv_off + c * (h + 1))
        idx["kv_with_q_tail_nomask_idx_tensor"] += range(kv_off, kv_off + c * t)
        idx["kv_with_q_tail_mask_idx_tensor"] += range(kv_off + c * t, kv_off + c * (t + 1))
        idx["kv_tail_proj_idx_tensor"] += range(kv_off, kv_off + c * (t + 1))
        idx["kv_with_q_head_attn_idx_in_tail_tensor"] += range(proj_off, proj_off + c * (h + 1))
        idx["kv_with_q_tail_attn_idx_in_tail_tensor"] += range(proj_off, proj_off + c * (t + 1))
        for key, n in (("mask", c), ("head_nomask", c * h), ("tail_nomask", c * t)):
            seq[key].append((seq[key][-1] if seq[key] else 0) + n)
        seq["head_kv"].append(len(idx["kv_with_q_head_attn_idx_in_tail_tensor"]))
        seq["tail_kv"].append(len(idx["kv_with_q_tail_attn_idx_in_tail_tensor"]))
        q_off += q
        kv_off += q * P
    both = idx["q_head_idx_tensor"] + idx["q_tail_idx_tensor"]
    idx["q_full_idx"] = sorted(range(len(both)), key=both.__getitem__)
    return dict(
        idx,
        attn_mask_seqlens=seq["mask"],
        head_attn_nomask_seqlens=seq["head_nomask"],
        tail_attn_nomask_seqlens=seq["tail_nomask"],
        head_actual_seq_lengths_kv=seq["head_kv"],
        tail_actual_seq_lengths_kv=seq["tail_kv"],
        attn_chunk_seqlens=chunks,
        num_actual_tokens_pcp_padded=total * P,
    )


def _same_field(name: str, a, b, ctx: str, what: str = "a real step's") -> None:
    """One metadata field against another: the same type, shape, dtype and values (the MTP mask:
    shape and dtype; its rows are the buffer's history)."""
    assert type(a) is type(b), f"{ctx}: {name} is {type(a).__name__}, {what} {type(b).__name__}"
    if isinstance(a, (torch.Tensor, np.ndarray)):
        assert (tuple(a.shape), a.dtype) == (tuple(b.shape), b.dtype), (
            f"{ctx}: {name} {tuple(a.shape)} {a.dtype}, {what} {tuple(b.shape)} {b.dtype}"
        )
        if name != "dcp_mtp_attn_mask":
            assert L(a) == L(b), f"{ctx}: {name}\n{L(a)}\n{L(b)}"
    else:
        assert a == b, f"{ctx}: {name} {a!r}, {what} {b!r}"


def _same_fields(dummy: dict, real: dict, ctx: str, counts=None, nd=0, P=1, rank=0) -> None:
    """A dummy run's metadata (``counts``: its batch, ``nd`` decodes first) against a real step's of
    the same batch, field by field; with ``P > 1`` the :data:`DUMMY_QUERY_FIELDS` against
    :func:`oracle_dummy_metadata` instead, the :data:`DUMMY_PREFIX_FIELDS` on the rows both have."""
    assert dummy.keys() == real.keys(), f"{ctx}: fields {dummy.keys() ^ real.keys()}"
    want = {} if P == 1 else oracle_dummy_metadata(counts, nd, P, rank, sum(counts))
    for name, a in dummy.items():
        b = real[name]
        if name in want:
            got = L(a)
            assert got == want[name], f"{ctx}: {name}\n{got}\n{want[name]} (vllm-ascend's)"
            if isinstance(b, torch.Tensor):  # the real step's dtype and device
                assert (a.dtype, a.device) == (b.dtype, b.device), f"{ctx}: {name} {a.dtype}, {b.dtype}"
        elif P > 1 and name in DUMMY_PREFIX_FIELDS and (a is None) != (b is None):
            # fa_padding_restore_idx: None where the FA rows fill num_actual_tokens_pcp_padded
            enter = len(dummy["pcp_enter_fa_restore_idx"])
            assert (a is None) == (enter >= dummy["num_actual_tokens_pcp_padded"]), f"{ctx}: {name}"
        elif P > 1 and name in DUMMY_PREFIX_FIELDS and a is not None:
            n = min(len(a), len(b))
            assert a.dtype == b.dtype and L(a[:n]) == L(b[:n]), f"{ctx}: {name}\n{L(a)}\n{L(b)}"
        else:
            _same_field(name, a, b, ctx)


def check_dummy(cfg, obs, twin, runner, rank, dcp_rank, tr: Tracker, ctx: str) -> int:
    """A ``_dummy_run``'s metadata against the real step of the same batch (run on ``twin``, a manager
    of the same rank) and vllm-ascend's index lists over the dummy batch's counts
    (:func:`_same_fields`), and its MTP mask against the modelled buffer; returns the checks made."""
    counts = obs["counts"].tolist()
    n = len(counts)
    comp, prompt = runner.num_computed[:n].tolist(), runner.num_prompt[:n].tolist()
    real = _metadata_step(twin, counts, comp, prompt, cfg.R, obs["fixed"])
    if real is None:
        assert obs["metadata"] is None, ctx
        return 1
    real = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(real).items()}
    _same_fields(obs["metadata"], real, ctx, counts, obs["num_decode_reqs"], cfg.pcp, rank)
    if cfg.spec:
        nd = obs["num_decode_reqs"]
        fixed = obs["fixed"]
        hist = [f - c for f, c in zip(fixed.tolist(), counts)] if fixed is not None else comp
        rows = tr.mask_rows(cfg, rank, dcp_rank, hist, counts, nd, n)
        assert L(obs["metadata"]["dcp_mtp_attn_mask"]) == rows, f"{ctx}: dcp_mtp_attn_mask"
    return 1


def test_mtp_mask_rows_not_recomputed_are_the_buffers_last_rows():
    """vllm-ascend's ``dcp_mtp_attn_mask`` buffer semantics, interleave 2 (P = 2, DCP = 2, rank 3 of 4).

    Rows ``[:nd]`` are rewritten only when some decode's last token reaches the
    rank; a step without decodes exposes ``num_reqs`` rows of the buffer, a step
    whose decodes hold no local key exposes the decodes' rows as last written.
    """
    cfg = SimConfig("mask rows", pcp=2, dcp=2, spec=1, interleave=2, R=4, T=64, max_model_len=32)
    m, _ = _manager(cfg, 1, 1)
    tr = Tracker()
    steps = [
        ([2, 2, 2], [13, 13, 21], [5, 5, 5]),  # three decodes: rows 0..2 written
        ([1], [9], [5]),  # one decode: row 0 rewritten, rows 1, 2 kept
        ([8, 8, 8], [0, 0, 0], [8, 8, 8]),  # no decode: rows 0..2 exposed as they are
        ([1, 1], [1, 2], [1, 1]),  # decodes whose last token (1, 2) is before rank 3: nothing rewritten
    ]
    seen = []
    for sched, comp, prompt in steps:
        meta = _metadata_step(m, sched, comp, prompt, cfg.R)
        nd = m.num_decode_reqs
        got = L(meta.dcp_mtp_attn_mask)
        assert got == tr.mask_rows(cfg, 1, 1, comp, sched, nd, len(sched))
        seen.append(got)
    assert seen[2][1] == seen[0][1] and seen[2][2] == seen[0][2] and any(map(any, seen[0][1]))
    assert seen[3] == seen[2][:2] and any(map(any, seen[3][1]))  # not the all-False rows


def _async_decode_step(k: int, true_comp: tuple[int, ...], over: tuple[int, ...]) -> StepInput:
    """A decode-only async step on the device rebuild branch: every request ``1 + k`` tokens, the
    host counts ``over`` ahead of the true ones (drafts the verification rejected)."""
    n = len(true_comp)
    ids = tuple(f"r{i}" for i in range(n))
    comp = tuple(c + o for c, o in zip(true_comp, over))
    return StepInput(
        index=2,  # even: the runner hands prev_positions_gpu (the device branch)
        req_ids=ids,
        sched=(1 + k,) * n,
        comp=comp,
        true_comp=true_comp,
        prompt=(4,) * n,
        drafts=(k,) * n,
        rejected=(0,) * n,
        tokens=tuple(tuple(range(100 * i, 100 * i + c + 1 + k)) for i, c in enumerate(comp)),
        is_decode=(True,) * n,
        prev=dict(
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled=torch.arange(n, dtype=torch.int32)[:, None] + 60_000,
            drafts=torch.arange(n * k).reshape(n, k) + 70_000,
            over=over,
        ),
    )


def _owner(slot: int) -> tuple[int, int] | None:
    """The (request, position) whose KV the stand-in block table keeps at ``slot`` (:func:`slot_of`)."""
    return None if slot < 0 else (slot // 100_000, (slot % 100_000 - 1) // 3)


def test_async_mtp_device_rebuild_keeps_the_main_models_slots(async_stand_in):
    """Async MTP (k = 2), decode-only step, device branch of ``rebuild_async_spec_decode_inputs``.

    vllm-ascend's real ``BlockTable`` (0.23.0, ``worker/block_table.py``): with
    ``pcp * dcp > 1`` both ``compute_slot_mapping`` and ``compute_slot_mapping_draft``
    write ``slot_mapping.gpu`` for device inputs (``_compute_pcp_dcp_slot_mapping``),
    and the runner reads ``slot_mapping.gpu`` for the main model's padded slot
    mapping. The reference calls the draft last, so the main model gets the MTP
    layout; the adapter calls it first, so the block table ends with the main
    model's slots (and ``mtp_slot_pad`` with the MTP layout).
    """
    cfg = SimConfig("async MTP", pcp=2, spec=2, async_sched=True, R=4, T=32, max_model_len=64)
    st = _async_decode_step(2, true_comp=(10, 20), over=(1, 0))
    m, runner = _manager(cfg, 0, 0)
    obs = runner.step(st)
    assert obs["rebuild.result"] == (True, True)
    main = [(0, 10), (0, 11), (0, 12), (1, 20), (1, 21), (1, 22)]
    mtp = [(0, 10), (0, 11), (0, 12), (0, 13), (1, 20), (1, 21), (1, 22), (1, 23)]
    padded = obs["padded_slot_mapping.0"].tolist()
    assert [_owner(x) for x in padded[:12:2]] == main and padded[1:12:2] == [-1] * 6
    assert [_owner(x) for x in runner.block_table.slot_mapping.gpu[:6].tolist()] == main
    assert [_owner(x) for x in obs["rebuild.mtp_slot_pad"].tolist()[::2]] == mtp

    # The reference's order on the same block table: the main model's K/V would land at the MTP
    # layout's first six slots: request 1's first token in request 0's slot for position 13, its
    # positions 21 and 22 one slot early, its slot for position 22 never written.
    table = BlockTable()
    qsl = torch.tensor([0, 3, 6], dtype=torch.int32)
    table.compute_slot_mapping(2, qsl, torch.tensor([10, 11, 12, 20, 21, 22]))
    req, pos = torch.tensor([r for r, _ in mtp]), torch.tensor([p for _, p in mtp])
    table.compute_slot_mapping_draft(req, pos)
    written = [_owner(x) for x in table.slot_mapping.gpu[:6].tolist()]
    assert written == [(0, 10), (0, 11), (0, 12), (0, 13), (1, 20), (1, 21)] != main


@pytest.mark.parametrize(
    "cfg",
    [
        SimConfig("DualChunkSwap P2 k=1", pcp=2, spec=1, R=4, T=32, num_requests=4, max_prompt=10),
        SimConfig("hybrid P2 k=1, 2 KV groups", pcp=2, hybrid=True, spec=1, kv_groups=2, R=4, T=32),
    ],
    ids=["dcs", "hybrid"],
)
def test_dummy_run_metadata_is_vllm_ascends_over_its_counts(cfg, async_stand_in):
    """``_dummy_run`` (graph capture at start-up, and between steps): ``init_batch_info`` without
    ``update_tokens_for_pcp``, ``generate_pcp_metadata`` with the dummy batch's counts, which the
    runner's forward then runs unsplit. As vllm-ascend's, the index tensors and lists take those
    counts as each request's local rows and ``num_actual_tokens_pcp_padded`` is ``P`` times the
    tokens passed; every other field has the fields, shapes, dtypes and values of the real step of
    that batch; with hybrid attention the hybrid index fields are there from the first capture on."""
    hybrid_fields = {"pcp_enter_fa_restore_idx", "pcp_fa_query_idx", "pcp_exit_fa_scatter_idx"}
    for rank in range(cfg.pcp):
        m, runner = _manager(cfg, rank, 0)
        twin, _ = _manager(cfg, rank, 0)
        tr = Tracker()
        for num_tokens, uniform in ((4, True), (6, False), (1, False), (8, True)):
            obs = runner.dummy_run(num_tokens, uniform, capturing=True)
            check_dummy(cfg, obs, twin, runner, rank, 0, tr, f"start-up dummy run {num_tokens}")
            assert obs["metadata"]["num_actual_tokens_pcp_padded"] == 2 * num_tokens
            if cfg.hybrid:
                assert hybrid_fields <= obs["metadata"].keys()
        for st in schedule(cfg, 3, seed=5):
            runner.step(st)
            obs = runner.dummy_run(6, False)
            check_dummy(cfg, obs, twin, runner, rank, 0, tr, f"dummy run after step {st.index}")


def test_generate_pcp_metadata_checks_query_lens():
    """``query_lens`` is read: the step's local counts (or a dummy run's own counts), else ``ValueError``."""
    cfg = SimConfig("query lens", pcp=2, R=4, T=32)
    m, _ = _manager(cfg, 0, 0)
    sched = np.array([1, 5, 8], dtype=np.int32)
    comp = np.array([7, 0, 0, 0], dtype=np.int32)
    m.init_batch_info(sched, 3, comp, np.array([3, 5, 8, 0]))
    local, _ = m.update_tokens_for_pcp(sched.copy())
    batch = SimpleNamespace(num_computed_tokens_cpu=comp)
    with pytest.raises(ValueError, match=r"query_lens must start with the step's local tokens .*\[1, 4, 4\]"):
        m.generate_pcp_metadata(9, torch.from_numpy(sched), batch, local, torch.zeros(3, 1), 3, 3)
    m.generate_pcp_metadata(9, torch.from_numpy(local), batch, local, torch.zeros(3, 1), 3, 3)
    m.init_batch_info(sched, 3, comp, np.array([3, 5, 8, 0]))  # a dummy run: its own counts
    with pytest.raises(ValueError, match=r"query_lens must start with the dummy batch's scheduled tokens"):
        m.generate_pcp_metadata(14, torch.from_numpy(local), batch, sched, torch.zeros(3, 1), 3, 3)
    meta, _ = m.generate_pcp_metadata(14, torch.from_numpy(sched), batch, sched, torch.zeros(3, 1), 3, 3)
    # vllm-ascend's: the dummy forward runs the 14 tokens unsplit, the prefills' counts as local rows
    assert meta.num_actual_tokens_pcp_padded == 28
    assert meta.q_head_idx_tensor.tolist() == [0, 1, 5, 6, 7, 8] and meta.attn_mask_seqlens == [2, 6]
    assert meta.kv_tail_proj_idx_tensor.tolist() == [*range(0, 8), *range(10, 26)]  # chunks 2, 4; t = 3


def test_hybrid_capture_in_dummy_runs_serves_the_real_steps(async_stand_in):
    """Hybrid attention, ``capture=True``: the graphs made at construction serve the start-up
    ``_dummy_run``s and the real steps, and every observation of both (the hybrid index fields
    included) equals the eager manager's."""
    cfg = SimConfig("hybrid capture", pcp=2, hybrid=True, spec=1, R=4, T=32, num_requests=4, max_prompt=12)
    captured, rc = _manager(cfg, 1, 0, capture=True, compile_backend="eager", check_syncs=False)
    made = captured.num_graphs
    eager, re = _manager(cfg, 1, 0)
    for st in schedule(cfg, 3, seed=4):
        _same_step_and_dummies(cfg, st, rc, re)
    assert made == captured.num_graphs == 3 * len(captured.graphs.ladder)  # all made at construction
    assert "pcp_enter_fa_restore_idx" in vars(captured.long_seq_metadata)


@pytest.mark.parametrize("hybrid", [False, True], ids=["dcs", "hybrid"])
def test_the_drop_in_records_its_schedule_and_the_trace_replays_its_layout(tmp_path, monkeypatch, hybrid):
    """PCP_FN_RECORD_SCHEDULE: rank 0 records every init_batch_info (the runner's counts, decodes
    first) as a trace of its own config; the replay (pcp_fn.step) gives each rank the local
    token counts update_tokens_for_pcp served. Rank 1 records nothing."""
    from pcp_fn.sim.trace import read_trace, replay

    monkeypatch.setenv("PCP_FN_RECORD_SCHEDULE", str(tmp_path / "t.jsonl"))
    cfg = SimConfig("recorded", pcp=2, hybrid=hybrid, R=4, T=32)
    steps = (([1, 5, 8], [7, 0, 0], [3, 5, 8]), ([1, 1, 3], [8, 5, 5], [3, 5, 8]))
    served = {}  # (step, rank): the local tokens of each request
    for rank in (0, 1):
        m, _ = _manager(cfg, rank, 0)
        assert (m.recorder is not None) == (rank == 0)
        for i, (sched, computed, prompt) in enumerate(steps):
            s = np.array(sched, np.int32)
            m.init_batch_info(s, 3, np.array(computed), np.array(prompt))
            served[i, rank] = m.update_tokens_for_pcp(s.copy(), np.arange(64))[0]
        if rank == 0:
            m.recorder.close()
    trace = read_trace(tmp_path / "t.jsonl")
    assert trace.engine.name == "vllm-ascend" and trace.engine.manager == "FunctionalDCSManager"
    assert trace.config.hybrid_attn == hybrid and trace.steps[1].num_computed == (8, 5, 5)
    outputs = replay(trace).outputs
    for (i, rank), tokens in served.items():
        assert outputs[i][rank].query_start_loc[1:4].tolist() == np.cumsum(tokens).tolist()
