"""Spec-decode (MTP) preparation: golden vectors, the per-request oracle, capturability, bad input."""

from __future__ import annotations

import dataclasses
import functools
import random
from dataclasses import dataclass

import pytest
import torch
import torch.utils._pytree as pytree
from helpers import snapshot, to_device, tree_equal, tree_meta
from hypothesis import given
from hypothesis import strategies as st
from oracle import oracle_step
from oracle_spec import (
    local_tokens,
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
    oracle_split,
)

import pcp_fn
from pcp_fn import Bucket, PCPConfig, graph, init_state, make_spec_batch
from pcp_fn.spec import PrevStep, token_rows, mtp_rows, sampled_rows


def slot_of(request, position):
    """A stand-in block table: any fixed-shape function of (request, position)."""
    return request * 100_000 + 3 * position + 1


# ============================================================================ golden vectors
def _runner_comment_batch(P):
    # cu_num_scheduled_tokens [4, 104, 107, 207, 209] at P = 1: request 0 a decode, the rest prefills
    cfg = PCPConfig(P, 0, 8, 512, num_spec_tokens=3)
    batch, spec = make_spec_batch(
        cfg, [4, 100, 3, 100, 2], [10, 0, 0, 0, 0], [5, 100, 3, 100, 2], [3, 0, 2, 0, 1]
    )
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    ids = torch.arange(1000, 1000 + batch.bucket.num_tokens)
    return pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, ids, bucket=batch.bucket)[1]


def test_spec_decode_indices_runner_comment_at_p1():
    out = _runner_comment_batch(1)
    assert int(out.num_sampled) == 11 and int(out.num_drafts) == 6
    assert out.logits_indices[:11].tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert out.target_logits_indices[:6].tolist() == [0, 1, 2, 5, 6, 9]
    assert out.bonus_logits_indices[:5].tolist() == [3, 4, 7, 8, 10]
    assert out.cu_num_draft_tokens[:5].tolist() == [3, 3, 5, 5, 6]
    assert out.cu_num_sampled_tokens[:5].tolist() == [4, 5, 8, 9, 11]
    # draft_token_indices [1, 2, 3, 105, 106, 208] of the input ids
    assert out.draft_token_ids[:6].tolist() == [1001, 1002, 1003, 1105, 1106, 1208]


def test_spec_decode_indices_pcp_adjusted_at_p2_and_p4():
    # cu * P - num_pcp_pads: P = 2 pads [4, 0, 1, 0, 2], P = 4 pads [12, 4, 5, 4, 6]
    p2 = _runner_comment_batch(2)
    assert p2.logits_indices[:11].tolist() == [0, 1, 2, 3, 107, 108, 109, 110, 211, 212, 213]
    p4 = _runner_comment_batch(4)
    assert p4.logits_indices[:11].tolist() == [0, 1, 2, 3, 115, 120, 121, 122, 227, 232, 233]
    for out in (p2, p4):  # the sampled-token bookkeeping does not depend on P
        assert out.target_logits_indices[:6].tolist() == [0, 1, 2, 5, 6, 9]
        assert out.bonus_logits_indices[:5].tolist() == [3, 4, 7, 8, 10]


VLLM_ASCEND_ROWS = [
    [0, 671, 6102, 294, 8760, 344, 88907, 0],
    [0, 19923, 14, 1026, 2329, 344, 9807, 14, 342, 0],
    [0, 671, 8749, 294, 3702, 4106, 344, 88907],
    [0, 671, 5335, 1469, 7539, 305, 6397],
]


@pytest.mark.parametrize(
    ("rows", "computed", "scheduled", "ids", "qsl"),
    [
        ([[0, 671, 6102, 294, 8760, 344]], [0], [6], [0, 671, 6102, 294, 8760, 344], [0, 6]),
        ([VLLM_ASCEND_ROWS[0]], [6], [2], [88907, 0], [0, 2]),
        (
            [VLLM_ASCEND_ROWS[0], [0, 19923, 14, 1026, 2329, 344, 9807, 14, 342, 1030]],
            [6, 0],
            [2, 10],
            [88907, 0, 0, 19923, 14, 1026, 2329, 344, 9807, 14, 342, 1030],
            [0, 2, 12],
        ),
        (
            VLLM_ASCEND_ROWS,
            [6, 8, 0, 0],
            [2, 2, 8, 7],
            [
                88907,
                0,
                342,
                0,
                0,
                671,
                8749,
                294,
                3702,
                4106,
                344,
                88907,
                0,
                671,
                5335,
                1469,
                7539,
                305,
                6397,
            ],
            [0, 2, 4, 12, 19],
        ),
    ],
)
def test_full_input_ids_vllm_ascend_vectors(rows, computed, scheduled, ids, qsl):
    cfg = PCPConfig(2, 0, 4, 4096, num_spec_tokens=1)
    table = torch.zeros(4, 4096, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r)
    prompt = [c if c else n for c, n in zip(computed, scheduled)]
    drafts = [n - 1 if c else 0 for c, n in zip(computed, scheduled)]
    batch, _ = make_spec_batch(cfg, scheduled, computed, prompt, drafts, token_ids=table)
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, bucket=batch.bucket)
    n = len(ids)
    assert int(full.num_tokens) == n
    assert full.input_ids[:n].tolist() == ids and not full.input_ids[n:].any()
    k = len(qsl)
    assert full.query_start_loc[:k].tolist() == qsl
    assert (full.query_start_loc[k:] == -1).all()
    assert full.mtp is None  # one spec token: no MTP extras


# ============================================================================ docstring examples
def _small(P, sched, comp, prompt, drafts, spec=1, rank=0, **kw):
    cfg = PCPConfig(P, rank, 8, 64, num_spec_tokens=spec, **kw)
    batch, sp = make_spec_batch(cfg, sched, comp, prompt, drafts)
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    return cfg, batch, sp, state


def test_docstring_examples():
    # repair_full_input_ids
    cfg, batch, _, state = _small(2, [2, 2], [5, 5], [5, 5], [1, 1])
    ids = torch.zeros(token_rows(cfg, batch.bucket), dtype=torch.int32)
    ids[:4] = torch.tensor([11, 12, 13, 14])
    prev = torch.full((batch.bucket.num_reqs,), -1)
    prev[0] = 1
    _, got = pcp_fn.repair_full_input_ids(
        state, ids, torch.tensor([[7], [9]]), torch.tensor([[70], [90]]), prev, bucket=batch.bucket
    )
    assert got[:4].tolist() == [9, 90, 13, 14]
    # mtp_slot_inputs
    cfg, batch, _, state = _small(2, [3, 3], [5, 5], [5, 5], [2, 2], spec=2)
    tis = torch.zeros(batch.bucket.num_reqs, dtype=torch.int64)
    tis[:2] = torch.tensor([1, 5])
    _, got = pcp_fn.mtp_slot_inputs(state, tis, torch.zeros(1), bucket=batch.bucket)
    assert got.slot_indices[:4].tolist() == [2, 3, 12, 13]
    # mtp_attention_mask: C = 2 (dcp), rank 0, h = 5, n = 3
    cfg, batch, _, state = _small(1, [3], [5], [5], [2], spec=2, dcp_size=2)
    _, got = pcp_fn.mtp_attention_mask(state, batch.num_computed, 6, bucket=batch.bucket)
    F_, T_ = False, True
    assert got.mask[0].tolist() == [[F_, F_, F_, T_, F_, F_], [F_] * 6, [F_] * 6]
    # mask_restore_index_for_graph
    cfg, _, _, state = _small(2, [1], [1], [1], [0])
    _, got = pcp_fn.mask_restore_index_for_graph(state, torch.arange(8))
    assert got.tolist() == [0, 1, 0, 0, 4, 5, 0, 0]
    # drafting_cp_seq_lens, P = 2, rank 1
    cfg, _, _, state = _small(2, [1], [1], [1], [0], rank=1)
    _, got = pcp_fn.drafting_cp_seq_lens(state, torch.tensor([5]), 0)
    assert got.num_computed_tokens_of_pcp_dcp.tolist() == [[[3], [3]]] and got.cp_seq_len.tolist() == [3]
    # decode_hidden_states: decodes of 2 and 1 tokens -> restored rows [0, 1, 4]
    cfg, batch, _, state = _small(2, [2, 1], [5, 5], [5, 5], [1, 0])
    hidden = torch.arange(2 * batch.bucket.num_tokens).unsqueeze(1)
    _, got = pcp_fn.decode_hidden_states(state, hidden, bucket=batch.bucket)
    assert got[:3, 0].tolist() == [0, 1, 4]
    # split_prefill_for_draft and first_pass_inputs: a decode [a, b] then a prefill [c .. g]
    cfg, batch, _, state = _small(2, [2, 5], [5, 0], [5, 5], [1, 0])
    Fb, Lb = token_rows(cfg, batch.bucket), batch.bucket.num_tokens
    full = torch.zeros(Fb, dtype=torch.int64)
    full[:7] = torch.arange(1, 8)  # a..g = 1..7
    hidden = torch.arange(2 * Lb).unsqueeze(1)
    _, split = pcp_fn.split_prefill_for_draft(state, full, hidden, bucket=batch.bucket)
    assert split.input_ids[:4].tolist() == [3, 4, 0, 0] and split.seq_lens[:1].tolist() == [4]
    assert split.hidden_states[:4, 0].tolist() == [
        4,
        5,
        10,
        11,
    ]  # prefill rows 0, 1, 6, 7 after 4 decode rows
    tis = torch.zeros(batch.bucket.num_reqs, dtype=torch.int64)
    logits = torch.tensor([0, 1, 8])
    _, fp = pcp_fn.first_pass_inputs(
        state, full, torch.zeros(Lb, dtype=torch.int64), hidden, tis, logits, 3, bucket=batch.bucket
    )
    assert int(fp.num_tokens) == 6 and fp.input_ids[:6].tolist() == [1, 2, 3, 4, 0, 0]
    assert fp.hidden_states[:6, 0].tolist() == [0, 1, 4, 5, 10, 11]
    assert fp.query_start_loc[:3].tolist() == [0, 2, 6] and fp.token_indices_to_sample[:2].tolist() == [0, 8]
    # rebuild_spec_positions
    cfg, batch, _, state = _small(2, [2, 2], [5, 5], [5, 5], [1, 1])
    corrected = torch.zeros(batch.bucket.num_reqs, dtype=torch.int64)
    corrected[:2] = torch.tensor([10, 4])
    _, got = pcp_fn.rebuild_spec_positions(state, corrected, bucket=batch.bucket)
    assert got.positions[:4].tolist() == [10, 11, 4, 5] and got.positions_full[:4].tolist() == [10, 11, 4, 5]
    # spec_step
    cfg = PCPConfig(2, 0, 4, 64, num_spec_tokens=1)
    table = torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16)
    batch, spec = make_spec_batch(cfg, [2, 2], [5, 8], [5, 8], [1, 1], token_ids=table)
    _, out = pcp_fn.spec_step(init_state(cfg), batch, torch.arange(4), spec, table)
    assert out.indices.logits_indices[:4].tolist() == [0, 1, 4, 5]
    assert out.input_ids[:4].tolist() == [5, 6, 24, 25] and out.full.query_start_loc[:3].tolist() == [0, 2, 4]


# ============================================================================ the oracle, on random batches
@dataclass
class SpecCase:
    P: int
    dcp: int
    spec: int
    interleave: int
    R: int
    T: int
    sched: list[int]
    comp: list[int]
    prompt: list[int]
    drafts: list[int]
    rank: int
    dcp_rank: int

    @property
    def n(self) -> int:
        return len(self.sched)

    def config(self, **kw) -> PCPConfig:
        return PCPConfig(
            self.P,
            self.rank,
            self.R,
            self.T,
            num_spec_tokens=self.spec,
            dcp_size=self.dcp,
            dcp_rank=self.dcp_rank,
            cp_kv_cache_interleave_size=self.interleave,
            **kw,
        )


@st.composite
def spec_cases(draw, pcp_sizes=(1, 2, 4), dcp_sizes=(1, 2, 3, 4), interleaves=(1, 128), max_reqs=7):
    """Decodes (some empty) with drafts, then fresh, chunked and empty prefills; a random rank."""
    P = draw(st.sampled_from(pcp_sizes))
    dcp = draw(st.sampled_from(dcp_sizes))
    spec = draw(st.integers(1, 3))
    interleave = draw(st.sampled_from(interleaves))
    n_dec = draw(st.integers(0, max_reqs))
    n_pre = draw(st.integers(0, max_reqs - n_dec))
    sched, comp, prompt, drafts = [], [], [], []
    for _ in range(n_dec):
        n = draw(st.integers(0 if draw(st.integers(0, 9)) == 0 else 1, 1 + spec))
        c = draw(st.integers(1, 400))
        sched.append(n)
        comp.append(c)
        prompt.append(draw(st.integers(0, c)))
        drafts.append(n - 1 if n and draw(st.booleans()) else draw(st.integers(0, max(n - 1, 0))))
    for _ in range(n_pre):
        kind = draw(st.sampled_from(["fresh", "chunked", "empty"]))
        n = 0 if kind == "empty" else draw(st.integers(1, 40))
        c = draw(st.integers(1, 200)) if kind == "chunked" else 0
        sched.append(n)
        comp.append(c)
        prompt.append(c + n + 1 if kind == "chunked" else n)
        drafts.append(0)
    R = max(len(sched), 1) + draw(st.integers(0, 2))
    T = max(sum(sched), 1) + draw(st.integers(0, 16))
    rank = draw(st.integers(0, P - 1))
    dcp_rank = draw(st.integers(0, dcp - 1))
    return SpecCase(P, dcp, spec, interleave, R, T, sched, comp, prompt, drafts, rank, dcp_rank)


def _setup(case: SpecCase, width_extra=3):
    cfg = case.config()
    width = max([c + n for c, n in zip(case.comp, case.sched)] + [1]) + width_extra
    table = torch.randint(1, 50_000, (case.R, width), dtype=torch.int32)
    batch, spec = make_spec_batch(cfg, case.sched, case.comp, case.prompt, case.drafts, token_ids=table)
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    orc = oracle_step(case.P, case.sched, case.comp, case.prompt, case.spec)
    return cfg, batch, spec, state, table, orc


@given(case=spec_cases())
def test_spec_decode_indices_match_the_oracle(case):
    cfg, batch, spec, state, _, orc = _setup(case)
    Lb = batch.bucket.num_tokens
    ids = torch.randint(0, 50_000, (Lb,))
    _, out = pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, ids, bucket=batch.bucket)
    want = oracle_spec_indices(orc, case.rank, case.sched, case.drafts, ids.tolist())
    S, D, n = int(out.num_sampled), int(out.num_drafts), case.n
    assert out.logits_indices.shape == (sampled_rows(cfg, batch.bucket),)
    assert out.logits_indices[:S].tolist() == want["logits"] and not out.logits_indices[S:].any()
    assert out.local_logits_indices[:S].tolist() == want["local_logits"]
    assert (
        out.target_logits_indices[:D].tolist() == want["target"] and not out.target_logits_indices[D:].any()
    )
    assert out.draft_token_ids[:D].tolist() == want["draft_ids"]
    assert out.bonus_logits_indices[:n].tolist() == want["bonus"]
    assert out.cu_num_draft_tokens[:n].tolist() == want["cu_draft"]
    assert out.cu_num_sampled_tokens[:n].tolist() == want["cu_sampled"]
    assert (out.cu_num_sampled_tokens[n:] == S).all() and (out.cu_num_draft_tokens[n:] == D).all()


@given(case=spec_cases(), data=st.data())
def test_full_input_ids_and_repair_match_the_oracle(case, data):
    cfg, batch, _, state, table, orc = _setup(case)
    Rb, n = batch.bucket.num_reqs, case.n
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, bucket=batch.bucket, slot_fn=slot_of)
    want = oracle_full_inputs(
        case.sched, case.comp, table.tolist(), case.spec, case.P, lambda i, p: slot_of(i, p)
    )
    F = len(want["ids"])
    assert full.input_ids.shape == (token_rows(cfg, batch.bucket),)
    assert int(full.num_tokens) == F
    assert full.input_ids[:F].tolist() == want["ids"] and not full.input_ids[F:].any()
    assert full.positions[:F].tolist() == want["positions"]
    assert full.query_start_loc.tolist() == want["qsl"] + [-1] * (Rb - n)
    if want["mtp"] is None:
        assert full.mtp is None
    else:
        M = len(want["mtp"])
        assert int(full.mtp.num_tokens) == M and full.mtp.request.shape == (mtp_rows(cfg, batch.bucket),)
        assert list(zip(full.mtp.request[:M].tolist(), full.mtp.positions[:M].tolist())) == want["mtp"]
        assert full.mtp.slot_mapping[: M * case.P].tolist() == want["mtp_slots"]
        assert (full.mtp.slot_mapping[M * case.P :] == -1).all()

    prev_reqs = data.draw(st.integers(1, 5))
    sampled = [[data.draw(st.integers(60_000, 70_000))] for _ in range(prev_reqs)]
    drafts = [[data.draw(st.integers(70_000, 80_000)) for _ in range(case.spec)] for _ in range(prev_reqs)]
    prev_pos = [data.draw(st.integers(-1, prev_reqs - 1)) for _ in range(n)]
    with_drafts = data.draw(st.booleans())
    padded_prev = torch.full((Rb,), -1, dtype=torch.int64)
    padded_prev[:n] = torch.tensor(prev_pos, dtype=torch.int64)
    before = snapshot(full.input_ids)
    _, repaired = pcp_fn.repair_full_input_ids(
        state,
        full.input_ids,
        torch.tensor(sampled),
        torch.tensor(drafts) if with_drafts else None,
        padded_prev,
        bucket=batch.bucket,
    )
    assert torch.equal(full.input_ids, before)  # the input is not modified
    expected = oracle_repair(
        case.sched, orc.is_decode, want["ids"], sampled, drafts if with_drafts else None, prev_pos, case.spec
    )
    assert repaired[:F].tolist() == expected and not repaired[F:].any()


@given(case=spec_cases(), H=st.integers(1, 3), data=st.data())
def test_draft_inputs_match_the_oracle(case, H, data):
    cfg, batch, spec, state, _, orc = _setup(case)
    Rb, Lb, P, n = batch.bucket.num_reqs, batch.bucket.num_tokens, case.P, case.n
    Fb = token_rows(cfg, batch.bucket)
    full_ids = torch.randint(1, 50_000, (Fb,))
    # restored buffer whose row g holds g: gathered rows read back as restored row numbers
    hidden = torch.arange(P * Lb, dtype=torch.float64).unsqueeze(1).expand(P * Lb, H).contiguous()

    _, dh = pcp_fn.decode_hidden_states(state, hidden, bucket=batch.bucket)
    rows = oracle_decode_hidden_rows(orc, case.sched)
    assert dh.shape == (Lb, H) and dh[: len(rows), 0].long().tolist() == rows

    _, split = pcp_fn.split_prefill_for_draft(state, full_ids, hidden, bucket=batch.bucket)
    want = oracle_split(orc, case.rank, case.sched, full_ids.tolist())
    K = len(want["ids"])
    assert int(split.num_tokens) == K and int(split.num_reqs) == len(want["seq_lens"])
    assert split.input_ids[:K].tolist() == want["ids"] and not split.input_ids[K:].any()
    assert split.hidden_states[:K, 0].long().tolist() == want["rows"]
    assert split.seq_lens[: len(want["seq_lens"])].tolist() == want["seq_lens"]
    assert split.cu_num_tokens[: len(want["cu"])].tolist() == want["cu"]
    assert int(split.max_query_len) == want["max_query_len"]

    _, idx = pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, torch.zeros(Lb), bucket=batch.bucket)
    S = int(idx.num_sampled)
    logits = idx.logits_indices[:S].tolist()
    cu_s = idx.cu_num_sampled_tokens.tolist()
    tis = [
        cu_s[i] - (case.drafts[i] + 1) + data.draw(st.integers(0, case.drafts[i])) if orc.is_decode[i] else 99
        for i in range(n)
    ]
    seq = [data.draw(st.integers(1, 500)) for _ in range(n)]
    tis_b = torch.zeros(Rb, dtype=torch.int64)
    tis_b[:n] = torch.tensor(tis, dtype=torch.int64)
    seq_b = torch.zeros(Rb, dtype=torch.int32)
    seq_b[:n] = torch.tensor(seq, dtype=torch.int32)
    positions = torch.randint(0, 500, (Lb,))
    _, fp = pcp_fn.first_pass_inputs(
        state,
        full_ids,
        positions,
        hidden,
        tis_b,
        idx.logits_indices,
        idx.num_sampled,
        seq_lens=seq_b,
        bucket=batch.bucket,
    )
    want = oracle_first_pass(
        orc, case.rank, case.sched, full_ids.tolist(), tis, logits, cfg.decode_threshold, seq
    )
    K = len(want["ids"])
    assert int(fp.num_tokens) == K
    assert fp.input_ids[:K].tolist() == want["ids"]
    assert fp.hidden_states[:K, 0].long().tolist() == want["rows"]
    assert torch.equal(fp.positions, positions)
    assert fp.token_indices_to_sample[:n].tolist() == want["tis"]
    assert fp.seq_lens[:n].tolist() == want["seq_lens"]
    assert fp.ori_token_indices_to_sample[:n].tolist() == tis
    assert fp.decode_query_lens[:n].tolist() == [s if d else 0 for s, d in zip(case.sched, orc.is_decode)]
    if P > 1:
        assert fp.query_start_loc[: n + 1].tolist() == want["qsl"]
        assert int(fp.max_query_len) == want["max_query_len"]


@given(case=spec_cases(), data=st.data())
def test_mtp_slot_and_drafting_inputs_match_the_oracle(case, data):
    cfg, batch, _, state, table, orc = _setup(case)
    Rb, n, P = batch.bucket.num_reqs, case.n, case.P
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, bucket=batch.bucket, slot_fn=slot_of)
    qsl = [sum(case.sched[:i]) for i in range(n + 1)]
    tis = [
        qsl[i] + data.draw(st.integers(0, case.sched[i] - 1)) if case.sched[i] else qsl[i] for i in range(n)
    ]
    tis_b = torch.zeros(Rb, dtype=torch.int64)
    tis_b[:n] = torch.tensor(tis, dtype=torch.int64)
    seq = torch.randint(1, 500, (Rb,), dtype=torch.int32)
    _, got = pcp_fn.mtp_drafting_inputs(state, tis_b, seq, torch.zeros(1), bucket=batch.bucket)
    if case.spec < 2:
        assert got is None
        return
    D = sum(orc.is_decode)
    prefill = D < n
    dcp_prefill = prefill and P == 1 and case.dcp > 1
    assert bool(got.active) == ((D > 0 and not prefill) or dcp_prefill)
    used = n if dcp_prefill else D
    assert int(got.num_reqs) == used and torch.equal(got.seq_lens, seq)
    live = [i for i in range(used) if case.sched[i]]  # an empty request has no accepted token
    want = oracle_mtp_slot_indices(case.sched, case.comp, tis, case.spec, P, used)
    for i in live:
        assert got.slot_indices[i * P : (i + 1) * P].tolist() == want[i * P : (i + 1) * P]
    assert not got.slot_indices[used * P :].any()
    # slot r == 0 of each request holds the KV slot of its last accepted token
    for i in live:
        slot = int(full.mtp.slot_mapping[int(got.slot_indices[i * P])])
        assert slot == slot_of(i, case.comp[i] + tis[i] - qsl[i])


@given(case=spec_cases(), cols=st.integers(1, 400))
def test_mtp_attention_mask_matches_the_round_robin_oracle(case, cols):
    cfg, batch, _, state, _, orc = _setup(case)
    thr = cfg.decode_threshold
    _, got = pcp_fn.mtp_attention_mask(state, batch.num_computed, cols, bucket=batch.bucket)
    assert got.mask.shape == (batch.bucket.num_reqs, thr, cols)
    C, c = case.P * case.dcp, case.rank * case.dcp + case.dcp_rank
    for i in range(batch.bucket.num_reqs):
        if i < case.n and orc.is_decode[i]:
            want = oracle_mtp_mask(case.comp[i], case.sched[i], thr, cols, C, c, case.interleave)
            assert got.mask[i].tolist() == want, i
        else:
            assert not got.mask[i].any()
    D = sum(orc.is_decode)
    assert int(got.num_rows) == (D if D else case.n)


@given(case=spec_cases(), length=st.integers(0, 40), d=st.integers(0, 3), as_tensor=st.booleans())
def test_mask_restore_index_and_drafting_seq_lens_match_the_oracle(case, length, d, as_tensor):
    cfg, _, _, state, _, _ = _setup(case)
    index = torch.randint(0, 999, (length,))
    _, got = pcp_fn.mask_restore_index_for_graph(state, index)
    assert got.tolist() == oracle_mask_restore(index.tolist(), case.P, cfg.decode_threshold)
    seq = torch.randint(0, 700, (5,))
    _, lens = pcp_fn.drafting_cp_seq_lens(state, seq, torch.tensor(d) if as_tensor else d)
    all_lens, mine = oracle_drafting_seq_lens(
        seq.tolist(), d, case.P, case.dcp, case.interleave, case.rank, case.dcp_rank
    )
    assert lens.num_computed_tokens_of_pcp_dcp.tolist() == all_lens and lens.cp_seq_len.tolist() == mine


@given(case=spec_cases(), data=st.data())
def test_rebuild_spec_positions_matches_the_oracle(case, data):
    cfg, batch, _, state, _, orc = _setup(case)
    Rb, Lb, n = batch.bucket.num_reqs, batch.bucket.num_tokens, case.n
    corrected = [c + data.draw(st.integers(-1, 2)) for c in case.comp]
    corrected_b = torch.zeros(Rb, dtype=torch.int64)
    corrected_b[:n] = torch.tensor(corrected, dtype=torch.int64)
    _, got = pcp_fn.rebuild_spec_positions(state, corrected_b, bucket=batch.bucket, slot_fn=slot_of)
    local, full = oracle_rebuild(orc, case.rank, case.sched, corrected)
    assert got.positions.tolist() == local + [0] * (Lb - len(local))
    assert got.positions_full[: len(full)].tolist() == full
    if case.spec >= 2:
        mtp = [(i, corrected[i] + j) for i, s in enumerate(case.sched) for j in range(s + case.spec - 1)]
        M = len(mtp)
        assert list(zip(got.mtp.request[:M].tolist(), got.mtp.positions[:M].tolist())) == mtp
        assert got.mtp.slot_mapping[: M * case.P : case.P].tolist() == [slot_of(i, p) for i, p in mtp]


@given(case=spec_cases(), async_prev=st.booleans())
def test_spec_step_composes_the_ops(case, async_prev):
    cfg, batch, spec, _, table, orc = _setup(case)
    Rb, Lb, n = batch.bucket.num_reqs, batch.bucket.num_tokens, case.n
    slots = torch.arange(max(sum(case.sched), 1))
    prev = None
    if async_prev:
        prev_pos = torch.full((Rb,), -1, dtype=torch.int64)
        prev_pos[:n] = torch.randint(-1, 2, (n,))
        prev = PrevStep(torch.randint(60_000, 70_000, (2, 1)), torch.randint(7, 9, (2, case.spec)), prev_pos)
    state, out = pcp_fn.spec_step(init_state(cfg), batch, slots, spec, table, prev, slot_fn=slot_of)
    assert tree_equal(out.step, pcp_fn.step(init_state(cfg), batch, slots)[1])
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, bucket=batch.bucket, slot_fn=slot_of)
    ids = full.input_ids
    if prev is not None:
        _, ids = pcp_fn.repair_full_input_ids(
            state, ids, prev.sampled_token_ids, prev.draft_token_ids, prev.positions, bucket=batch.bucket
        )
    assert torch.equal(out.full.input_ids, ids) and tree_equal(out.full.mtp, full.mtp)
    # local ids: each local row's scheduler-order token (0 on pad rows)
    qsl = [sum(case.sched[:i]) for i in range(n + 1)]
    mine = local_tokens(orc, case.rank)
    want = [int(ids[qsl[t.request] + t.offset]) if t.offset < case.sched[t.request] else 0 for t in mine]
    assert out.input_ids.tolist() == want + [0] * (Lb - len(want))
    _, idx = pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, out.input_ids, bucket=batch.bucket)
    assert tree_equal(out.indices, idx)
    if case.P * case.dcp > 1:
        _, mask = pcp_fn.mtp_attention_mask(state, batch.num_computed, table.shape[1], bucket=batch.bucket)
        assert tree_equal(out.attention_mask, mask)
    else:
        assert out.attention_mask is None


# ============================================================================ capturability
CFG = PCPConfig(2, 1, 8, 96, num_spec_tokens=2, dcp_size=2, dcp_rank=1)
BUCKET = Bucket(8, 64)
TABLE = torch.randint(1, 50_000, (8, 128), dtype=torch.int32)
SLOTS = torch.arange(1000, 1000 + CFG.max_num_tokens, dtype=torch.int32)
H = 4

# (scheduled, computed, prompt, drafts)
COMPOSITIONS = {
    "decode-only": ([3, 2, 3, 1], [9, 40, 7, 3], [9, 30, 7, 3], [2, 1, 2, 0]),
    "mixed": ([2, 1, 33, 5, 17], [50, 8, 0, 12, 0], [40, 8, 33, 30, 17], [1, 0, 0, 0, 0]),
    "prefill-only": ([21, 7, 40], [0, 16, 0], [21, 30, 40], [0, 0, 0]),
    "empty-but-one": ([0, 0, 0, 9, 0], [0, 0, 0, 0, 0], [0, 0, 0, 9, 0], [0, 0, 0, 0, 0]),
}


def _spec_batch(name, bucket=BUCKET, cfg=CFG):
    return make_spec_batch(cfg, *COMPOSITIONS[name], token_ids=TABLE, bucket=bucket)


def _spec_ops(name):
    """Every spec op with example arguments for this composition (the same shapes for all)."""
    batch, spec = _spec_batch(name)
    state, _ = pcp_fn.update_tokens(init_state(CFG), batch)
    b, P, Rb, Lb = batch.bucket, CFG.pcp_size, batch.bucket.num_reqs, batch.bucket.num_tokens
    gen = torch.Generator().manual_seed(len(name))
    ri = lambda hi, *shape: torch.randint(0, hi, shape, generator=gen)  # noqa: E731
    full_ids = ri(50_000, token_rows(CFG, b)).to(torch.int32)
    hidden = torch.randn(P * Lb, H, generator=gen)
    tis = ri(4, Rb)
    mtp_slots = ri(9999, mtp_rows(CFG, b) * P).to(torch.int32)
    on_bucket = lambda fn, **kw: functools.partial(fn, bucket=b, **kw)  # noqa: E731
    return [
        (
            pcp_fn.spec_decode_indices,
            on_bucket(pcp_fn.spec_decode_indices),
            (state, spec.num_draft_tokens, ri(99, Lb)),
        ),
        (
            pcp_fn.full_input_ids,
            on_bucket(pcp_fn.full_input_ids, slot_fn=slot_of),
            (state, TABLE, batch.num_computed),
        ),
        (
            pcp_fn.repair_full_input_ids,
            on_bucket(pcp_fn.repair_full_input_ids),
            (state, full_ids, ri(9, 3, 1), ri(9, 3, 2), ri(4, Rb) - 1),
        ),
        (pcp_fn.decode_hidden_states, on_bucket(pcp_fn.decode_hidden_states), (state, hidden)),
        (
            pcp_fn.split_prefill_for_draft,
            on_bucket(pcp_fn.split_prefill_for_draft),
            (state, full_ids, hidden),
        ),
        (
            pcp_fn.first_pass_inputs,
            on_bucket(pcp_fn.first_pass_inputs),
            (state, full_ids, ri(99, Lb), hidden, tis, ri(99, sampled_rows(CFG, b)), torch.tensor(5)),
        ),
        (pcp_fn.mtp_slot_inputs, on_bucket(pcp_fn.mtp_slot_inputs), (state, tis, mtp_slots)),
        (
            pcp_fn.mtp_drafting_inputs,
            on_bucket(pcp_fn.mtp_drafting_inputs),
            (state, tis, ri(99, Rb), mtp_slots),
        ),
        (
            pcp_fn.mtp_attention_mask,
            on_bucket(pcp_fn.mtp_attention_mask, num_cols=128),
            (state, batch.num_computed),
        ),
        (pcp_fn.mask_restore_index_for_graph, pcp_fn.mask_restore_index_for_graph, (state, ri(99, P * Lb))),
        (pcp_fn.drafting_cp_seq_lens, pcp_fn.drafting_cp_seq_lens, (state, ri(500, Rb), torch.tensor(1))),
        (
            pcp_fn.rebuild_spec_positions,
            on_bucket(pcp_fn.rebuild_spec_positions, slot_fn=slot_of),
            (state, batch.num_computed + 1),
        ),
        (
            pcp_fn.spec_step,
            functools.partial(pcp_fn.spec_step, slot_fn=slot_of),
            (init_state(CFG), batch, SLOTS, spec, TABLE),
        ),
    ]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_every_spec_op_traces_fullgraph_and_matches_eager(fresh_dynamo):
    ops = {name: _spec_ops(name) for name in COMPOSITIONS}
    for k, (op, fn, _) in enumerate(ops["mixed"]):
        # a code object of its own per op (a functools.partial would share Dynamo's wrapper code)
        compiled = torch.compile(graph._fresh_code(fn), fullgraph=True, dynamic=False, backend="eager")
        for name in COMPOSITIONS:  # one bucket: the first trace serves every composition
            args = ops[name][k][2]
            assert tree_equal(compiled(*args), fn(*args)), (op.__name__, name)


def test_every_spec_op_runs_on_meta_tensors():
    for op, fn, args in _spec_ops("mixed"):
        out = fn(*to_device(args, "meta"))
        assert tree_meta(out) == tree_meta(fn(*args)), op.__name__
        assert all(x.device.type == "meta" for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor))


def test_every_spec_op_passes_the_sync_detector():
    for name in COMPOSITIONS:
        for _, fn, args in _spec_ops(name):
            pcp_fn.assert_no_host_syncs(fn, *args)


def test_spec_shapes_and_op_counts_do_not_depend_on_the_composition():
    metas, counts = {}, {}
    for name in COMPOSITIONS:
        ops = _spec_ops(name)
        metas[name] = [tree_meta(fn(*args)) for _, fn, args in ops]
        counts[name] = [pcp_fn.count_aten_ops(fn, *args) for _, fn, args in ops]
    first = metas["mixed"]
    assert all(m == first for m in metas.values())
    assert all(c == counts["mixed"] for c in counts.values()), counts


def test_spec_ops_never_change_their_inputs():
    for op, fn, args in _spec_ops("mixed"):
        before = snapshot(args)
        fn(*args)
        assert tree_equal(args, before), op.__name__


def _random_spec_batch(rng: random.Random, bucket=None):
    kind = rng.choice(list(COMPOSITIONS))
    n_dec = rng.randint(1, 6) if kind == "decode-only" else rng.randint(1, 3) if kind == "mixed" else 0
    n_pre = rng.randint(1, 8 - n_dec) if kind in ("mixed", "prefill-only") else 0
    sched, comp, prompt, drafts = [], [], [], []
    for _ in range(n_dec):
        sched.append(rng.randint(1, 3))
        comp.append(rng.randint(1, 100))
        prompt.append(rng.randint(0, comp[-1]))
        drafts.append(sched[-1] - 1)
    budget = CFG.max_num_tokens - sum(sched)
    for _ in range(n_pre):
        k = rng.randint(1, max(1, min(budget // n_pre, 127 - 8)))
        budget -= k
        sched.append(k)
        comp.append(0)
        prompt.append(k)
        drafts.append(0)
    if kind == "empty-but-one":
        k = rng.randint(1, 5)
        sched, comp, drafts = [0] * k, [0] * k, [0] * k
        sched[rng.randrange(k)] = rng.randint(1, 100)
        prompt = list(sched)
    return make_spec_batch(CFG, sched, comp, prompt, drafts, token_ids=TABLE, bucket=bucket)


def test_spec_step_captures_once_per_bucket_and_replays_other_compositions(fresh_dynamo):
    rng = random.Random(5)
    state = init_state(CFG)
    fn = functools.partial(pcp_fn.spec_step, slot_fn=slot_of)
    batches = [_random_spec_batch(rng, bucket=BUCKET) for _ in range(12)]
    batches += [_random_spec_batch(rng) for _ in range(8)]  # their own buckets
    captured = graph.capture(fn, state, batches[0][0], SLOTS, batches[0][1], TABLE, backend="eager")
    for batch, spec in batches:
        assert tree_equal(captured(state, batch, SLOTS, spec, TABLE), fn(state, batch, SLOTS, spec, TABLE))
    assert len(captured) == len({b.bucket for b, _ in batches})


def test_spec_step_with_async_repair_captures_and_replays(fresh_dynamo):
    rng = random.Random(9)
    state = init_state(CFG)
    fn = functools.partial(pcp_fn.spec_step, slot_fn=slot_of)

    def prev_for(batch):
        positions = torch.tensor([rng.randint(-1, 3) for _ in range(batch.bucket.num_reqs)])
        return PrevStep(torch.randint(60_000, 70_000, (4, 1)), torch.randint(1, 9, (4, 2)), positions)

    batches = [_random_spec_batch(rng, bucket=BUCKET) for _ in range(8)]
    (b0, s0) = batches[0]
    captured = graph.capture(fn, state, b0, SLOTS, s0, TABLE, prev_for(b0), backend="eager")
    for batch, spec in batches:
        prev = prev_for(batch)
        got = captured(state, batch, SLOTS, spec, TABLE, prev)
        assert tree_equal(got, fn(state, batch, SLOTS, spec, TABLE, prev))
    assert len(captured) == 1


def test_spec_step_traces_one_graph_with_the_rank_as_data(fresh_dynamo):
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm

    fn = functools.partial(pcp_fn.spec_step, slot_fn=slot_of)
    compiled = torch.compile(graph._fresh_code(fn), fullgraph=True, dynamic=False, backend=backend)
    batch, spec = _spec_batch("mixed")
    for r in range(CFG.pcp_size):
        out = compiled(init_state(CFG, rank=r), batch, SLOTS, spec, TABLE)
        ref = fn(init_state(dataclasses.replace(CFG, pcp_rank=r)), batch, SLOTS, spec, TABLE)
        assert tree_equal(out[1], ref[1])
    assert len(frames) == 1


def test_spec_step_exports_without_symbolic_shapes():
    fn = functools.partial(pcp_fn.spec_step, slot_fn=slot_of)
    state = init_state(CFG)
    module = graph.export(fn, state, _spec_batch("mixed")[0], SLOTS, _spec_batch("mixed")[1], TABLE).module()
    for name in COMPOSITIONS:
        batch, spec = _spec_batch(name)
        assert tree_equal(module(state, batch, SLOTS, spec, TABLE), fn(state, batch, SLOTS, spec, TABLE)), (
            name
        )


def test_spec_step_vmaps_over_ranks():
    fn = functools.partial(pcp_fn.spec_step, slot_fn=slot_of)
    batch, spec = _spec_batch("decode-only")
    _, mapped = pcp_fn.all_ranks(fn, init_state(CFG, rank=0), batch, SLOTS, spec, TABLE)
    for r in range(CFG.pcp_size):
        ref = fn(init_state(dataclasses.replace(CFG, pcp_rank=r)), batch, SLOTS, spec, TABLE)[1]
        assert tree_equal(pytree.tree_map(lambda x, r=r: x[r], mapped), ref), r


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_spec_step_cuda_graph_replay_equals_eager_without_syncs():
    dev = torch.device("cuda")
    rng = random.Random(4)
    state = init_state(CFG, dev)
    table, slots = TABLE.to(dev), SLOTS.to(dev)
    fn = functools.partial(pcp_fn.spec_step, slot_fn=slot_of)
    batches = [to_device(_random_spec_batch(rng, bucket=BUCKET), dev) for _ in range(20)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        captured = graph.capture(fn, state, batches[0][0], slots, batches[0][1], table)
        assert captured.kind == "cuda-graph"
        for batch, spec in batches:
            got = captured(state, batch, slots, spec, table)
            torch.cuda.set_sync_debug_mode(0)
            assert tree_equal(got, fn(state, batch, slots, spec, table))
            torch.cuda.set_sync_debug_mode("error")
    finally:
        torch.cuda.set_sync_debug_mode(0)


# ============================================================================ bad input
SMALL = PCPConfig(2, 0, 4, 32, num_spec_tokens=2)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([3, 2], [5, 5], [5, 5], [3, 1]), {}, r"num_draft_tokens\[0\] = 3 exceeds num_spec_tokens=2"),
        (
            ([2, 2], [5, 5], [5, 5], [1, 2]),
            {},
            r"num_draft_tokens\[1\] = 2 needs at least 3 scheduled tokens",
        ),
        (([0, 2], [5, 5], [5, 5], [1, 0]), {}, r"num_draft_tokens\[0\] = 1 needs at least 2 scheduled"),
        (([2, 2], [5, 5], [5, 5], [1]), {}, r"num_draft_tokens has 1 entries but the batch has 2 requests"),
        (([2, 2], [5, 5], [5, 5], [1, -1]), {}, r"num_draft_tokens\[1\] = -1 is negative"),
        (([2, 2], [5, 5], [5, 5], [[1, 1]]), {}, r"num_draft_tokens must be 1-D"),
        (
            ([2, 2], [5, 9], [5, 9], [1, 1]),
            {"token_ids": torch.zeros(4, 10)},
            r"token_ids is too narrow: it has 10 columns but request 1 reads position 10",
        ),
        (
            ([2, 2], [5, 5], [5, 5], [1, 1]),
            {"token_ids": (1, 64)},
            r"token_ids has 1 rows but the batch has 2",
        ),
        (([2, 2], [5, 5], [5, 5], [1, 1]), {"token_ids": torch.zeros(64)}, r"token_ids must be a \[num_rows"),
        (([5, 1], [0, 9], [5, 9], [0, 0]), {}, r"request 1 is a decode .* after prefill request 0"),
    ],
)
def test_make_spec_batch_rejects(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_spec_batch(SMALL, *args, **kwargs)


def test_ops_reject_buffers_of_the_wrong_shape():
    batch, spec = make_spec_batch(SMALL, [2, 3], [5, 5], [5, 5], [1, 2])
    state, _ = pcp_fn.update_tokens(init_state(SMALL), batch)
    b = batch.bucket
    with pytest.raises(ValueError, match=r"num_draft_tokens must have 2 rows"):
        pcp_fn.spec_decode_indices(state, torch.zeros(3, dtype=torch.int32), torch.zeros(8), bucket=b)
    with pytest.raises(ValueError, match=r"token_ids must be a \[num_rows, max_model_len\] table"):
        pcp_fn.full_input_ids(state, torch.zeros(64), batch.num_computed, bucket=b)
    with pytest.raises(ValueError, match=r"slot_fn must return \["):
        pcp_fn.full_input_ids(state, TABLE, batch.num_computed, bucket=b, slot_fn=lambda r, p: r[:1])
    with pytest.raises(ValueError, match=r"hidden_states must be the restored \[P \* L_b, \.\.\.\]"):
        pcp_fn.decode_hidden_states(state, torch.zeros(3, 2), bucket=b)
    with pytest.raises(ValueError, match=r"input_ids_full must have"):
        pcp_fn.repair_full_input_ids(state, torch.zeros(1), torch.zeros(1, 1), None, torch.zeros(2), bucket=b)
    with pytest.raises(ValueError, match=r"prev_sampled_token_ids must be \[prev_reqs, num_sampled\]"):
        F_ = token_rows(SMALL, b)
        pcp_fn.repair_full_input_ids(state, torch.zeros(F_), torch.zeros(3), None, torch.zeros(2), bucket=b)
    with pytest.raises(ValueError, match=r"num_cols must be a positive int"):
        pcp_fn.mtp_attention_mask(state, batch.num_computed, 0, bucket=b)
