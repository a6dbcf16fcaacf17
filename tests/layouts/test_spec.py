"""Spec-decode (MTP) preparation: golden vectors, the per-request oracle, capturability, bad input.

Both PCP layouts (DualChunkSwap and ``hybrid_attn=True``) throughout; the layout
interface the spec ops read (``state_local_rows``, ``state_local_start``,
``restored_spans``, ``first_pass_rows`` of ``pcp_fn.dcs`` / ``pcp_fn.hybrid``)
is checked here too.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import types
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from helpers import snapshot, to_device, tree_equal, tree_meta
from hypothesis import given
from hypothesis import strategies as st
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
    oracle_split,
    spec_view,
)

import pcp_fn
import pcp_fn.spec as pcp_spec
from pcp_fn import Bucket, PCPConfig, graph, init_state, make_spec_batch
from pcp_fn.core.entry import entry_op, is_entry_op
from pcp_fn.spec import PrevStep, mtp_rows, sampled_rows, token_rows

LAYOUTS = pytest.mark.parametrize("hybrid", [False, True], ids=["dcs", "hybrid"])


def slot_of(request, position):
    """A stand-in block table: any fixed-shape function of (request, position)."""
    return request * 100_000 + 3 * position + 1


def _slots(sched):
    """Scheduler-order KV slots of a batch (what make_spec_batch(..., slot_mapping=...) pads to F_b)."""
    return np.arange(sum(sched), dtype=np.int64) + 1000


# ============================================================================ golden vectors
def _runner_comment_batch(P):
    # cu_num_scheduled_tokens [4, 104, 107, 207, 209] at P = 1: request 0 a decode, the rest prefills
    cfg = PCPConfig(P, 0, 8, 512, num_spec_tokens=3)
    batch, spec = make_spec_batch(
        cfg, [4, 100, 3, 100, 2], [10, 0, 0, 0, 0], [5, 100, 3, 100, 2], [3, 0, 2, 0, 1]
    )
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    ids = torch.arange(1000, 1000 + batch.bucket.num_tokens)
    return pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, ids)[1]


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


# --- the hybrid bug: spec_decode_indices / spec_step ignored hybrid_attn=True
@pytest.mark.parametrize("rank", [0, 1])
def test_hybrid_spec_logits_of_two_fresh_prefills_are_the_fa_rows(rank):
    # P = 2, k = 1, fresh prefills [3, 5]: the hybrid FA order holds the 8 tokens back to back, no pads,
    # and the vllm-ascend runner (adjust_cu_num_scheduled_tokens_for_pcp: cu [3, 8]) samples [2, 7];
    # the DualChunkSwap padded order (requests padded to 4 and 8 rows) samples [2, 8]
    for hybrid, want in ((True, [2, 7]), (False, [2, 8])):
        cfg = PCPConfig(2, rank, 4, 64, num_spec_tokens=1, hybrid_attn=hybrid)
        table = torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16)
        batch, spec = make_spec_batch(
            cfg, [3, 5], [0, 0], [3, 5], [0, 0], token_ids=table, slot_mapping=_slots([3, 5])
        )
        state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
        _, idx = pcp_fn.spec_decode_indices(
            state, spec.num_draft_tokens, torch.zeros(batch.bucket.num_tokens)
        )
        assert idx.logits_indices[: int(idx.num_sampled)].tolist() == want
        _, out = pcp_fn.spec_step(init_state(cfg), batch, spec, table)
        assert out.indices.logits_indices[:2].tolist() == want


@pytest.mark.parametrize("rank", [0, 1])
def test_hybrid_spec_logits_sample_each_request_from_its_own_rows(rank):
    # decodes [2, 2] (one draft each) and a prefill of 7, P = 2, k = 1. FA order: rank 0's copies of the
    # 4 decode tokens (rows 0-3), rank 1's (rows 4-7), then the prefill (rows 8-14). Request 1 samples
    # rows [2, 3], not [4, 5] (rank 1's copy of request 0: the bug); the prefill its last token, row 14
    # (adjust_cu_num_scheduled_tokens_for_pcp: cu [2, 4, 7] -> [2, 4, 15]).
    cfg = PCPConfig(2, rank, 4, 64, num_spec_tokens=1, hybrid_attn=True)
    table = torch.arange(4 * 32, dtype=torch.int32).reshape(4, 32)
    sched = [2, 2, 7]
    batch, spec = make_spec_batch(
        cfg, sched, [10, 10, 0], [5, 5, 7], [1, 1, 0], token_ids=table, slot_mapping=_slots(sched)
    )
    _, out = pcp_fn.spec_step(init_state(cfg), batch, spec, table)
    assert out.indices.logits_indices[:5].tolist() == [0, 1, 2, 3, 14]
    assert out.indices.target_logits_indices[:2].tolist() == [0, 2]
    assert out.indices.draft_token_ids[:2].tolist() == [11, 43]  # table[0, 11], table[1, 11]
    # the restored FA rows they point at hold each request's own tokens
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    gathered = torch.zeros(2 * batch.bucket.num_tokens, dtype=torch.int64)
    for r in range(2):  # every rank's local input ids, all-gathered
        _, o = pcp_fn.spec_step(init_state(cfg, rank=r), batch, spec, table)
        gathered[r * batch.bucket.num_tokens : (r + 1) * batch.bucket.num_tokens] = o.input_ids
    _, restored = pcp_fn.restore_hidden_states(state, gathered)
    logits = out.indices.logits_indices[:5]
    assert restored[logits].tolist() == [10, 11, 42, 43, 70]  # table[i, computed + j] of the sampled tokens


VLLM_ASCEND_ROWS = [
    [0, 671, 6102, 294, 8760, 344, 88907, 0],
    [0, 19923, 14, 1026, 2329, 344, 9807, 14, 342, 0],
    [0, 671, 8749, 294, 3702, 4106, 344, 88907],
    [0, 671, 5335, 1469, 7539, 305, 6397],
]


@LAYOUTS
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
def test_full_input_ids_vllm_ascend_vectors(rows, computed, scheduled, ids, qsl, hybrid):
    cfg = PCPConfig(2, 0, 4, 4096, num_spec_tokens=1, hybrid_attn=hybrid)
    table = torch.zeros(4, 4096, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r)
    prompt = [c if c else n for c, n in zip(computed, scheduled)]
    drafts = [n - 1 if c else 0 for c, n in zip(computed, scheduled)]
    batch, _ = make_spec_batch(cfg, scheduled, computed, prompt, drafts, token_ids=table)
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed)
    n = len(ids)
    assert int(full.num_tokens) == n
    assert full.input_ids[:n].tolist() == ids and not full.input_ids[n:].any()
    k = len(qsl)
    assert full.query_start_loc[:k].tolist() == qsl
    assert (full.query_start_loc[k:] == -1).all()
    assert full.mtp is None  # one spec token: no MTP extras


# ============================================================================ the layout interface
def _layout_state(hybrid, P, rank, sched, comp, prompt, spec=1):
    cfg = PCPConfig(P, rank, 8, 64, num_spec_tokens=spec, hybrid_attn=hybrid)
    batch, _ = make_spec_batch(cfg, sched, comp, prompt, [0] * len(sched))
    return cfg, batch, pcp_fn.update_tokens(init_state(cfg), batch)


def test_layout_interface_docstring_examples():
    # DualChunkSwap, P = 2, tokens [1, 5, 8] (request 0 a decode)
    for rank in (0, 1):
        cfg, _, (state, _) = _layout_state(False, 2, rank, [1, 5, 8], [7, 0, 0], [3, 5, 8])
        assert pcp_fn.dcs.state_local_start(state)[:4].tolist() == [0, 1, 5, 9]
        spans = pcp_fn.dcs.restored_spans(state)
        assert spans.start[:3].tolist() == [0, 2, 10] and spans.length[:3].tolist() == [1, 8, 8]
    # hybrid, P = 2, fresh prefills [3, 5]
    starts = {0: [0, 2, 5], 1: [0, 1, 3]}
    for rank in (0, 1):
        cfg, _, (state, _) = _layout_state(True, 2, rank, [3, 5], [0, 0], [3, 5])
        assert pcp_fn.hybrid.state_local_start(state)[:3].tolist() == starts[rank]
    rows = pcp_fn.hybrid.first_pass_rows(state)  # rank 1
    assert rows.request[:6].tolist() == [0, 0, 1, 1, 1, 1] and rows.position[:6].tolist() == [
        2,
        3,
        4,
        5,
        6,
        7,
    ]
    assert rows.valid.sum() == 6
    # hybrid, one spec token, decodes [2, 2] then a prefill of 7
    _, _, (state, _) = _layout_state(True, 2, 0, [2, 2, 7], [10, 10, 0], [5, 5, 7])
    spans = pcp_fn.hybrid.restored_spans(state)
    assert spans.start[:3].tolist() == [0, 2, 8] and spans.length[:3].tolist() == [2, 2, 7]
    # without spec tokens the hybrid decodes are token-major: rank 0's copy of decode token t at t * P
    _, _, (state, _) = _layout_state(True, 2, 0, [1, 1, 4], [5, 5, 0], [5, 5, 4], spec=0)
    assert pcp_fn.hybrid.restored_spans(state).start[:3].tolist() == [0, 2, 4]


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
        state, ids, torch.tensor([[7], [9]]), torch.tensor([[70], [90]]), prev
    )
    assert got[:4].tolist() == [9, 90, 13, 14]
    # mtp_slot_inputs
    cfg, batch, _, state = _small(2, [3, 3], [5, 5], [5, 5], [2, 2], spec=2)
    tis = torch.zeros(batch.bucket.num_reqs, dtype=torch.int64)
    tis[:2] = torch.tensor([1, 5])
    slots = torch.zeros(mtp_rows(cfg, batch.bucket) * 2, dtype=torch.int32)
    _, got = pcp_fn.mtp_slot_inputs(state, tis, slots)
    assert got.slot_indices[:4].tolist() == [2, 3, 12, 13]
    # mtp_attention_mask: C = 2 (dcp), rank 0, h = 5, n = 3
    cfg, batch, _, state = _small(1, [3], [5], [5], [2], spec=2, dcp_size=2)
    _, got = pcp_fn.mtp_attention_mask(state, batch.num_computed, 6)
    F_, T_ = False, True
    assert got.mask[0].tolist() == [[F_, F_, F_, T_, F_, F_], [F_] * 6, [F_] * 6]
    # mask_restore_index_for_graph: P = 2, thr = 2, the [P * L_b] = [8] restore index of an 8-token prefill
    cfg, batch, _, state = _small(2, [8], [0], [8], [0])
    assert batch.bucket.num_tokens == 4
    _, got = pcp_fn.mask_restore_index_for_graph(state, torch.arange(8))
    assert got.tolist() == [0, 1, 0, 0, 4, 5, 0, 0]
    # drafting_cp_seq_lens, P = 2, rank 1
    cfg, _, _, state = _small(2, [1], [1], [1], [0], rank=1)
    _, got = pcp_fn.drafting_cp_seq_lens(state, torch.tensor([5]), 0)
    assert got.num_computed_tokens_of_pcp_dcp.tolist() == [[[3], [3]]] and got.cp_seq_len.tolist() == [3]
    # rebuild_spec_positions
    cfg, batch, _, state = _small(2, [2, 2], [5, 5], [5, 5], [1, 1])
    corrected = torch.zeros(batch.bucket.num_reqs, dtype=torch.int64)
    corrected[:2] = torch.tensor([10, 4])
    _, got = pcp_fn.rebuild_spec_positions(state, corrected)
    assert got.positions[:4].tolist() == [10, 11, 4, 5] and got.positions_full[:4].tolist() == [10, 11, 4, 5]


@LAYOUTS
def test_docstring_examples_of_the_draft_ops(hybrid):
    # decode_hidden_states: decodes of 2 and 1 tokens -> restored rows [0, 1, 4] (hybrid: [0, 1, 2])
    cfg, batch, _, state = _small(2, [2, 1], [5, 5], [5, 5], [1, 0], hybrid_attn=hybrid)
    hidden = torch.arange(2 * batch.bucket.num_tokens).unsqueeze(1) + 100
    _, got = pcp_fn.decode_hidden_states(state, hidden)
    assert got[:3, 0].tolist() == ([100, 101, 102] if hybrid else [100, 101, 104])
    assert got.shape == (batch.bucket.num_tokens, 1) and not got[3:].any()
    # split_prefill_for_draft and first_pass_inputs: a decode [a, b] then a prefill [c .. g]
    cfg, batch, _, state = _small(2, [2, 5], [5, 0], [5, 5], [1, 0], hybrid_attn=hybrid)
    Fb, Lb = token_rows(cfg, batch.bucket), batch.bucket.num_tokens
    full = torch.zeros(Fb, dtype=torch.int64)
    full[:7] = torch.arange(1, 8)  # a..g = 1..7
    hidden = torch.arange(2 * Lb).unsqueeze(1)
    _, split = pcp_fn.split_prefill_for_draft(state, full, hidden)
    assert split.seq_lens[:1].tolist() == [4] and int(split.num_reqs) == 1
    if hybrid:  # the linear slice [0, 4) of the prefill padded to 8; the FA order's prefill starts at 2 * 2
        assert split.input_ids[:4].tolist() == [3, 4, 5, 6]
        assert split.hidden_states[:4, 0].tolist() == [4, 5, 6, 7]
    else:  # prefill rows 0, 1, 6, 7 after 4 decode rows
        assert split.input_ids[:4].tolist() == [3, 4, 0, 0]
        assert split.hidden_states[:4, 0].tolist() == [4, 5, 10, 11]
    tis = torch.zeros(batch.bucket.num_reqs, dtype=torch.int64)
    logits = torch.zeros(sampled_rows(cfg, batch.bucket), dtype=torch.int64)
    logits[:3] = torch.tensor([0, 1, 8])
    _, fp = pcp_fn.first_pass_inputs(state, full, torch.zeros(Lb, dtype=torch.int64), hidden, tis, logits, 3)
    assert int(fp.num_tokens) == 6
    assert fp.input_ids[:6].tolist() == ([1, 2, 3, 4, 5, 6] if hybrid else [1, 2, 3, 4, 0, 0])
    assert fp.hidden_states[:6, 0].tolist() == ([0, 1, 4, 5, 6, 7] if hybrid else [0, 1, 4, 5, 10, 11])
    assert fp.query_start_loc[:3].tolist() == [0, 2, 6] and fp.token_indices_to_sample[:2].tolist() == [0, 8]
    # spec_step
    cfg = PCPConfig(2, 0, 4, 64, num_spec_tokens=1, hybrid_attn=hybrid)
    table = torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16)
    batch, spec = make_spec_batch(
        cfg, [2, 2], [5, 8], [5, 8], [1, 1], token_ids=table, slot_mapping=[0, 1, 2, 3]
    )
    _, out = pcp_fn.spec_step(init_state(cfg), batch, spec, table)
    assert out.indices.logits_indices[:4].tolist() == ([0, 1, 2, 3] if hybrid else [0, 1, 4, 5])
    assert out.input_ids[:4].tolist() == [5, 6, 24, 25] and out.full.query_start_loc[:3].tolist() == [0, 2, 4]


def test_one_draft_split_class_for_both_layouts():
    assert pcp_fn.DraftSplit is pcp_fn.spec.DraftSplit
    assert not hasattr(pcp_fn, "split_prefill_for_draft_hybrid")  # one public name per concept


# ============================================================================ the oracle, on random batches
@dataclass
class SpecCase:
    P: int
    dcp: int
    spec: int
    interleave: int
    hybrid: bool
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
            hybrid_attn=self.hybrid,
            **kw,
        )


@st.composite
def spec_cases(
    draw, pcp_sizes=(1, 2, 4), dcp_sizes=(1, 2, 3, 4), interleaves=(1, 128), hybrids=(False, True), max_reqs=7
):
    """Decodes (some empty) with drafts, then fresh, chunked and empty prefills; a random rank;
    the DualChunkSwap or the hybrid-attention layout."""
    P = draw(st.sampled_from(pcp_sizes))
    dcp = draw(st.sampled_from(dcp_sizes))
    spec = draw(st.integers(1, 3))
    interleave = draw(st.sampled_from(interleaves))
    hybrid = draw(st.sampled_from(hybrids))
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
    return SpecCase(P, dcp, spec, interleave, hybrid, R, T, sched, comp, prompt, drafts, rank, dcp_rank)


def _setup(case: SpecCase, width_extra=3):
    cfg = case.config()
    width = max([c + n for c, n in zip(case.comp, case.sched)] + [1]) + width_extra
    table = torch.randint(1, 50_000, (case.R, width), dtype=torch.int32)
    batch, spec = make_spec_batch(
        cfg, case.sched, case.comp, case.prompt, case.drafts, token_ids=table, slot_mapping=_slots(case.sched)
    )
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    view = spec_view(case.hybrid, case.P, case.sched, case.comp, case.prompt, case.spec, case.rank)
    return cfg, batch, spec, state, table, view


def _restored_buffer(P, Lb, H=1):
    """A restored buffer whose row g holds g + 1 (0 then means "no row": a hybrid pad)."""
    return (torch.arange(P * Lb, dtype=torch.float64) + 1).unsqueeze(1).expand(P * Lb, H).contiguous()


def _rows_plus_one(rows):
    return [0 if r is None else r + 1 for r in rows]


@given(case=spec_cases())
def test_layout_interface_matches_the_oracle(case):
    """Both packages' spec interface, against the explicit per-rank lists of the oracles."""
    cfg, batch, _, state, _, view = _setup(case)
    lay = pcp_fn.layout_of(cfg)
    assert lay is pcp_fn.get_layout("hybrid" if case.hybrid else "dcs")
    assert lay.package is (pcp_fn.hybrid.ops if case.hybrid else pcp_fn.dcs.layout)
    Rb, Lb, n = batch.bucket.num_reqs, batch.bucket.num_tokens, case.n
    mine = lay.state_local_rows(state)
    k = len(view.local)
    assert mine.request.shape == (Lb,) and int(mine.valid.sum()) == k and bool(mine.valid[:k].all())
    assert list(zip(mine.request[:k].tolist(), mine.position[:k].tolist())) == view.local
    # the local rows are the layout's: update_tokens' request_index / positions
    _, layout = pcp_fn.update_tokens(init_state(cfg), batch)
    assert torch.equal(mine.request, layout.request_index) and torch.equal(mine.position, layout.positions)
    starts = lay.state_local_start(state)
    counts = view.local_counts
    assert starts.shape == (Rb + 1,) and starts[: n + 1].tolist() == [sum(counts[:i]) for i in range(n + 1)]
    spans = lay.restored_spans(state)
    assert spans.start.shape == spans.length.shape == (Rb,)
    for i, s in enumerate(case.sched):
        length = int(spans.length[i])
        assert int(spans.start[i]) == view.restored_start(i), i
        assert length >= s and all((i, o) in view.restored for o in range(length)), i
        assert [view.restored[(i, o)] for o in range(length)] == [
            view.restored_start(i) + o for o in range(length)
        ]
        assert (i, length) not in view.restored, i  # the span ends where the request's rows end
    rows = lay.first_pass_rows(state)
    k = len(view.first_pass)
    assert int(rows.valid.sum()) == k and bool(rows.valid[:k].all())
    assert list(zip(rows.request[:k].tolist(), rows.position[:k].tolist())) == view.first_pass
    # given the geometry (spec_step passes its step's own), every map is the same
    geo = pcp_fn.dcs.layout.state_geometry(state)
    for name in ("state_local_rows", "state_local_start", "restored_spans", "first_pass_rows"):
        assert tree_equal(getattr(lay, name)(state, geometry=geo), getattr(lay, name)(state)), name


@given(case=spec_cases())
def test_spec_decode_indices_match_the_oracle(case):
    cfg, batch, spec, state, _, view = _setup(case)
    Lb = batch.bucket.num_tokens
    ids = torch.randint(0, 50_000, (Lb,))
    _, out = pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, ids)
    want = oracle_spec_indices(view, case.drafts, ids.tolist())
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
    cfg, batch, _, state, table, view = _setup(case)
    Rb, n = batch.bucket.num_reqs, case.n
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, slot_fn=slot_of)
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
    )
    assert torch.equal(full.input_ids, before)  # the input is not modified
    expected = oracle_repair(
        case.sched, view.is_decode, want["ids"], sampled, drafts if with_drafts else None, prev_pos, case.spec
    )
    assert repaired[:F].tolist() == expected and not repaired[F:].any()


@given(case=spec_cases(), H=st.integers(1, 3), data=st.data())
def test_draft_inputs_match_the_oracle(case, H, data):
    cfg, batch, spec, state, _, view = _setup(case)
    Rb, Lb, P, n = batch.bucket.num_reqs, batch.bucket.num_tokens, case.P, case.n
    Fb = token_rows(cfg, batch.bucket)
    full_ids = torch.randint(1, 50_000, (Fb,))
    hidden = _restored_buffer(P, Lb, H)  # row g holds g + 1: hidden states read back as row numbers

    _, dh = pcp_fn.decode_hidden_states(state, hidden)
    rows = oracle_decode_hidden_rows(view)
    assert dh.shape == (Lb, H) and dh[: len(rows), 0].long().tolist() == _rows_plus_one(rows)
    assert not dh[len(rows) :].any()

    _, split = pcp_fn.split_prefill_for_draft(state, full_ids, hidden)
    want = oracle_split(view, full_ids.tolist())
    K = len(want["ids"])
    assert int(split.num_tokens) == K and int(split.num_reqs) == len(want["seq_lens"])
    assert split.input_ids[:K].tolist() == want["ids"] and not split.input_ids[K:].any()
    assert split.hidden_states[:K, 0].long().tolist() == _rows_plus_one(want["rows"])
    assert not split.hidden_states[K:].any()
    assert split.seq_lens[: len(want["seq_lens"])].tolist() == want["seq_lens"]
    assert split.cu_num_tokens[: len(want["cu"])].tolist() == want["cu"]
    assert int(split.max_query_len) == want["max_query_len"]

    _, idx = pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, torch.zeros(Lb))
    S = int(idx.num_sampled)
    logits = idx.logits_indices[:S].tolist()
    cu_s = idx.cu_num_sampled_tokens.tolist()
    tis = [
        cu_s[i] - (case.drafts[i] + 1) + data.draw(st.integers(0, case.drafts[i]))
        if view.is_decode[i]
        else 99
        for i in range(n)
    ]
    seq = [data.draw(st.integers(1, 500)) for _ in range(n)]
    tis_b = torch.zeros(Rb, dtype=torch.int64)
    tis_b[:n] = torch.tensor(tis, dtype=torch.int64)
    seq_b = torch.zeros(Rb, dtype=torch.int32)
    seq_b[:n] = torch.tensor(seq, dtype=torch.int32)
    positions = torch.randint(0, 500, (Lb,))
    _, fp = pcp_fn.first_pass_inputs(
        state, full_ids, positions, hidden, tis_b, idx.logits_indices, idx.num_sampled, seq_lens=seq_b
    )
    want = oracle_first_pass(view, full_ids.tolist(), tis, logits, cfg.decode_threshold, seq)
    K = len(want["ids"])
    assert int(fp.num_tokens) == K
    assert fp.input_ids[:K].tolist() == want["ids"]
    assert fp.hidden_states[:K, 0].long().tolist() == _rows_plus_one(want["rows"])
    assert torch.equal(fp.positions, positions)
    assert fp.token_indices_to_sample[:n].tolist() == want["tis"]
    assert fp.seq_lens[:n].tolist() == want["seq_lens"]
    assert fp.ori_token_indices_to_sample[:n].tolist() == tis
    assert fp.decode_query_lens[:n].tolist() == [s if d else 0 for s, d in zip(case.sched, view.is_decode)]
    if P > 1:
        assert fp.query_start_loc[: n + 1].tolist() == want["qsl"]
        assert int(fp.max_query_len) == want["max_query_len"]


@given(case=spec_cases(), data=st.data())
def test_mtp_slot_and_drafting_inputs_match_the_oracle(case, data):
    cfg, batch, _, state, table, view = _setup(case)
    Rb, n, P = batch.bucket.num_reqs, case.n, case.P
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, slot_fn=slot_of)
    qsl = [sum(case.sched[:i]) for i in range(n + 1)]
    tis = [
        qsl[i] + data.draw(st.integers(0, case.sched[i] - 1)) if case.sched[i] else qsl[i] for i in range(n)
    ]
    tis_b = torch.zeros(Rb, dtype=torch.int64)
    tis_b[:n] = torch.tensor(tis, dtype=torch.int64)
    seq = torch.randint(1, 500, (Rb,), dtype=torch.int32)
    slots = full.mtp.slot_mapping if full.mtp is not None else torch.zeros(1)
    _, got = pcp_fn.mtp_drafting_inputs(state, tis_b, seq, slots)
    if case.spec < 2:
        assert got is None
        return
    D = sum(view.is_decode)
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
    cfg, batch, _, state, _, view = _setup(case)
    thr = cfg.decode_threshold
    _, got = pcp_fn.mtp_attention_mask(state, batch.num_computed, cols)
    assert got.mask.shape == (batch.bucket.num_reqs, thr, cols)
    C, c = case.P * case.dcp, case.rank * case.dcp + case.dcp_rank
    for i in range(batch.bucket.num_reqs):
        if i < case.n and view.is_decode[i]:
            want = oracle_mtp_mask(case.comp[i], case.sched[i], thr, cols, C, c, case.interleave)
            assert got.mask[i].tolist() == want, i
        else:
            assert not got.mask[i].any()
    D = sum(view.is_decode)
    assert int(got.num_rows) == (D if D else case.n)


@given(case=spec_cases(), cols=st.integers(1, 400), seed=st.integers(0, 2**16))
def test_mtp_blocked_keys_written_into_a_buffer_give_the_mask(case, cols, seed):
    """``mtp_blocked_keys``: a buffer of any earlier masks (column 0 False, as in every mask) whose
    decode rows are zeroed, then ``blocked`` written at every ``cell``: the decode rows are the
    round-robin oracle's mask, every other row keeps what it held."""
    cfg, batch, _, state, _, view = _setup(case)
    thr, Rb = cfg.decode_threshold, batch.bucket.num_reqs
    _, keys = pcp_spec.mtp_blocked_keys(state, batch.num_computed, cols)
    assert keys.cell.shape == keys.blocked.shape == (Rb, thr, max(thr - 1, 0))
    old = torch.rand(Rb + 2, thr, cols, generator=torch.Generator().manual_seed(seed)) < 0.5
    old[:, :, 0] = False
    buf = old.clone()
    D = sum(view.is_decode)
    buf[:D] = False
    buf.view(-1).index_put_((keys.cell.view(-1),), keys.blocked.view(-1))
    C, c = case.P * case.dcp, case.rank * case.dcp + case.dcp_rank
    for i in range(Rb + 2):
        if i < D:
            want = oracle_mtp_mask(case.comp[i], case.sched[i], thr, cols, C, c, case.interleave)
            assert buf[i].tolist() == want, i
        else:
            assert torch.equal(buf[i], old[i]), i
    assert int(keys.num_rows) == (D if D else case.n)


@given(case=spec_cases(), d=st.integers(0, 3), as_tensor=st.booleans())
def test_mask_restore_index_and_drafting_seq_lens_match_the_oracle(case, d, as_tensor):
    cfg, batch, _, state, _, _ = _setup(case)
    Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
    index = torch.randint(0, 999, (case.P * Lb,))
    _, got = pcp_fn.mask_restore_index_for_graph(state, index)
    assert got.tolist() == oracle_mask_restore(index.tolist(), case.P, cfg.decode_threshold)
    seq = torch.randint(0, 700, (Rb,))
    _, lens = pcp_fn.drafting_cp_seq_lens(state, seq, torch.tensor(d) if as_tensor else d)
    all_lens, mine = oracle_drafting_seq_lens(
        seq.tolist(), d, case.P, case.dcp, case.interleave, case.rank, case.dcp_rank
    )
    assert lens.num_computed_tokens_of_pcp_dcp.tolist() == all_lens and lens.cp_seq_len.tolist() == mine


@given(case=spec_cases(), data=st.data())
def test_rebuild_spec_positions_matches_the_oracle(case, data):
    cfg, batch, _, state, _, view = _setup(case)
    Rb, Lb, n = batch.bucket.num_reqs, batch.bucket.num_tokens, case.n
    corrected = [c + data.draw(st.integers(-1, 2)) for c in case.comp]
    corrected_b = torch.zeros(Rb, dtype=torch.int64)
    corrected_b[:n] = torch.tensor(corrected, dtype=torch.int64)
    _, got = pcp_fn.rebuild_spec_positions(state, corrected_b, slot_fn=slot_of)
    local, full = oracle_rebuild(view, corrected)
    assert got.positions.tolist() == local + [0] * (Lb - len(local))
    assert got.positions_full[: len(full)].tolist() == full
    if case.spec >= 2:
        mtp = [(i, corrected[i] + j) for i, s in enumerate(case.sched) for j in range(s + case.spec - 1)]
        M = len(mtp)
        assert list(zip(got.mtp.request[:M].tolist(), got.mtp.positions[:M].tolist())) == mtp
        assert got.mtp.slot_mapping[: M * case.P : case.P].tolist() == [slot_of(i, p) for i, p in mtp]


@given(case=spec_cases(), async_prev=st.booleans())
def test_spec_step_composes_the_ops(case, async_prev):
    cfg, batch, spec, _, table, view = _setup(case)
    Rb, Lb, n = batch.bucket.num_reqs, batch.bucket.num_tokens, case.n
    prev = None
    if async_prev:
        prev_pos = torch.full((Rb,), -1, dtype=torch.int64)
        prev_pos[:n] = torch.randint(-1, 2, (n,))
        prev = PrevStep(torch.randint(60_000, 70_000, (2, 1)), torch.randint(7, 9, (2, case.spec)), prev_pos)
    state, out = pcp_fn.spec_step(init_state(cfg), batch, spec, table, prev, slot_fn=slot_of)
    assert tree_equal(out.step, pcp_fn.step(init_state(cfg), batch)[1])
    assert state.bucket == batch.bucket
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, slot_fn=slot_of)
    ids = full.input_ids
    if prev is not None:
        _, ids = pcp_fn.repair_full_input_ids(
            state, ids, prev.sampled_token_ids, prev.draft_token_ids, prev.positions
        )
    assert torch.equal(out.full.input_ids, ids) and tree_equal(out.full.mtp, full.mtp)
    # local ids: each local row's scheduler-order token (0 on pad rows)
    qsl = [sum(case.sched[:i]) for i in range(n + 1)]
    want = [int(ids[qsl[i] + off]) if off < case.sched[i] else 0 for i, off in view.local]
    assert out.input_ids.tolist() == want + [0] * (Lb - len(want))
    _, idx = pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, out.input_ids)
    assert tree_equal(out.indices, idx)
    if case.P * case.dcp > 1:
        _, mask = pcp_fn.mtp_attention_mask(state, batch.num_computed, table.shape[1])
        assert tree_equal(out.attention_mask, mask)
    else:
        assert out.attention_mask is None


# ============================================================================ capturability
CFG = PCPConfig(2, 1, 8, 96, num_spec_tokens=2, dcp_size=2, dcp_rank=1)
CONFIGS = {"dcs": CFG, "hybrid": dataclasses.replace(CFG, hybrid_attn=True)}
BUCKET = Bucket(8, 64)
TABLE = torch.randint(1, 50_000, (8, 128), dtype=torch.int32)
H = 4
ON_CONFIGS = pytest.mark.parametrize("cfg", list(CONFIGS.values()), ids=list(CONFIGS))

# (scheduled, computed, prompt, drafts)
COMPOSITIONS = {
    "decode-only": ([3, 2, 3, 1], [9, 40, 7, 3], [9, 30, 7, 3], [2, 1, 2, 0]),
    "mixed": ([2, 1, 33, 5, 17], [50, 8, 0, 12, 0], [40, 8, 33, 30, 17], [1, 0, 0, 0, 0]),
    "prefill-only": ([21, 7, 40], [0, 16, 0], [21, 30, 40], [0, 0, 0]),
    "empty-but-one": ([0, 0, 0, 9, 0], [0, 0, 0, 0, 0], [0, 0, 0, 9, 0], [0, 0, 0, 0, 0]),
}


def _spec_batch(name, bucket=BUCKET, cfg=CFG):
    sched = COMPOSITIONS[name][0]
    return make_spec_batch(
        cfg, *COMPOSITIONS[name], token_ids=TABLE, slot_mapping=_slots(sched), bucket=bucket
    )


# spec_step with a slot_fn, still an entry op for graph.capture (a partial does not carry the mark)
SPEC_STEP = entry_op(functools.partial(pcp_fn.spec_step, slot_fn=slot_of))


def _spec_ops(name, cfg=CFG):
    """Every spec op with example arguments for this composition (the same shapes for all)."""
    batch, spec = _spec_batch(name, cfg=cfg)
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    b, P, Rb, Lb = batch.bucket, cfg.pcp_size, batch.bucket.num_reqs, batch.bucket.num_tokens
    gen = torch.Generator().manual_seed(len(name))
    ri = lambda hi, *shape: torch.randint(0, hi, shape, generator=gen)  # noqa: E731
    full_ids = ri(50_000, token_rows(cfg, b)).to(torch.int32)
    hidden = torch.randn(P * Lb, H, generator=gen)
    tis = ri(4, Rb)
    mtp_slots = ri(9999, mtp_rows(cfg, b) * P).to(torch.int32)
    with_slots = functools.partial(pcp_fn.full_input_ids, slot_fn=slot_of)
    return [
        (pcp_fn.spec_decode_indices, pcp_fn.spec_decode_indices, (state, spec.num_draft_tokens, ri(99, Lb))),
        (pcp_fn.full_input_ids, with_slots, (state, TABLE, batch.num_computed)),
        (
            pcp_fn.repair_full_input_ids,
            pcp_fn.repair_full_input_ids,
            (state, full_ids, ri(9, 3, 1), ri(9, 3, 2), ri(4, Rb) - 1),
        ),
        (pcp_fn.decode_hidden_states, pcp_fn.decode_hidden_states, (state, hidden)),
        (pcp_fn.split_prefill_for_draft, pcp_fn.split_prefill_for_draft, (state, full_ids, hidden)),
        (
            pcp_fn.first_pass_inputs,
            pcp_fn.first_pass_inputs,
            (state, full_ids, ri(99, Lb), hidden, tis, ri(99, sampled_rows(cfg, b)), torch.tensor(5)),
        ),
        (pcp_fn.mtp_slot_inputs, pcp_fn.mtp_slot_inputs, (state, tis, mtp_slots)),
        (pcp_fn.mtp_drafting_inputs, pcp_fn.mtp_drafting_inputs, (state, tis, ri(99, Rb), mtp_slots)),
        (
            pcp_fn.mtp_attention_mask,
            functools.partial(pcp_fn.mtp_attention_mask, num_cols=128),
            (state, batch.num_computed),
        ),
        (
            pcp_spec.mtp_blocked_keys,
            functools.partial(pcp_spec.mtp_blocked_keys, num_cols=128),
            (state, batch.num_computed),
        ),
        (pcp_fn.mask_restore_index_for_graph, pcp_fn.mask_restore_index_for_graph, (state, ri(99, P * Lb))),
        (pcp_fn.drafting_cp_seq_lens, pcp_fn.drafting_cp_seq_lens, (state, ri(500, Rb), torch.tensor(1))),
        (
            pcp_fn.rebuild_spec_positions,
            functools.partial(pcp_fn.rebuild_spec_positions, slot_fn=slot_of),
            (state, batch.num_computed + 1),
        ),
        (pcp_fn.spec_step, SPEC_STEP, (init_state(cfg), batch, spec, TABLE)),
    ]


def _own_code(fn):
    """``fn`` behind a trampoline with a code object of its own: a Dynamo cache per op (partials and
    closures would share one code object and hit the recompile limit)."""

    def trampoline(*args):
        return fn(*args)

    return types.FunctionType(
        trampoline.__code__.replace(), trampoline.__globals__, "own", None, trampoline.__closure__
    )


@ON_CONFIGS
def test_every_spec_op_traces_fullgraph_and_matches_eager(fresh_dynamo, cfg):
    ops = {name: _spec_ops(name, cfg) for name in COMPOSITIONS}
    for k, (op, fn, _) in enumerate(ops["mixed"]):
        # a code object of its own per op (a functools.partial would share Dynamo's wrapper code)
        compiled = torch.compile(_own_code(fn), fullgraph=True, dynamic=False, backend="eager")
        for name in COMPOSITIONS:  # one bucket: the first trace serves every composition
            args = ops[name][k][2]
            assert tree_equal(compiled(*args), fn(*args)), (op.__name__, name)


@ON_CONFIGS
def test_every_spec_op_runs_on_meta_tensors(cfg):
    for op, fn, args in _spec_ops("mixed", cfg):
        out = fn(*to_device(args, "meta"))
        assert tree_meta(out) == tree_meta(fn(*args)), op.__name__
        assert all(x.device.type == "meta" for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor))


@ON_CONFIGS
def test_every_spec_op_passes_the_sync_detector(cfg):
    for name in COMPOSITIONS:
        for _, fn, args in _spec_ops(name, cfg):
            pcp_fn.assert_no_host_syncs(fn, *args)


@ON_CONFIGS
def test_spec_shapes_and_op_counts_do_not_depend_on_the_composition(cfg):
    metas, counts = {}, {}
    for name in COMPOSITIONS:
        ops = _spec_ops(name, cfg)
        metas[name] = [tree_meta(fn(*args)) for _, fn, args in ops]
        counts[name] = [pcp_fn.count_aten_ops(fn, *args) for _, fn, args in ops]
    first = metas["mixed"]
    assert all(m == first for m in metas.values())
    assert all(c == counts["mixed"] for c in counts.values()), counts


@ON_CONFIGS
def test_spec_ops_never_change_their_inputs(cfg):
    for op, fn, args in _spec_ops("mixed", cfg):
        before = snapshot(args)
        fn(*args)
        assert tree_equal(args, before), op.__name__


def _random_spec_batch(rng: random.Random, bucket=None, cfg=CFG):
    kind = rng.choice(list(COMPOSITIONS))
    n_dec = rng.randint(1, 6) if kind == "decode-only" else rng.randint(1, 3) if kind == "mixed" else 0
    n_pre = rng.randint(1, 8 - n_dec) if kind in ("mixed", "prefill-only") else 0
    sched, comp, prompt, drafts = [], [], [], []
    for _ in range(n_dec):
        sched.append(rng.randint(1, 3))
        comp.append(rng.randint(1, 100))
        prompt.append(rng.randint(0, comp[-1]))
        drafts.append(sched[-1] - 1)
    budget = cfg.max_num_tokens - sum(sched)
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
    return make_spec_batch(
        cfg, sched, comp, prompt, drafts, token_ids=TABLE, slot_mapping=_slots(sched), bucket=bucket
    )


@ON_CONFIGS
def test_spec_step_captures_once_per_bucket_and_replays_other_compositions(fresh_dynamo, cfg):
    rng = random.Random(5)
    fn = SPEC_STEP
    assert is_entry_op(pcp_fn.spec_step) and is_entry_op(fn)
    batches = [_random_spec_batch(rng, bucket=BUCKET, cfg=cfg) for _ in range(12)]
    batches += [_random_spec_batch(rng, cfg=cfg) for _ in range(8)]  # their own buckets
    state = init_state(cfg)
    captured = graph.capture(fn, state, batches[0][0], batches[0][1], TABLE, backend="eager")
    for batch, spec in batches:
        # an entry op: the state coming out of the previous step (any bucket) replays this batch's graph
        want = fn(init_state(cfg), batch, spec, TABLE)
        state, out = captured(state, batch, spec, TABLE)
        assert tree_equal(out, want[1]) and state.bucket == batch.bucket
    assert len(captured) == len({b.bucket for b, _ in batches})


def test_spec_step_with_async_repair_captures_and_replays(fresh_dynamo):
    rng = random.Random(9)
    state = init_state(CFG)
    fn = SPEC_STEP

    def prev_for(batch):
        positions = torch.tensor([rng.randint(-1, 3) for _ in range(batch.bucket.num_reqs)])
        return PrevStep(torch.randint(60_000, 70_000, (4, 1)), torch.randint(1, 9, (4, 2)), positions)

    batches = [_random_spec_batch(rng, bucket=BUCKET) for _ in range(8)]
    (b0, s0) = batches[0]
    captured = graph.capture(fn, state, b0, s0, TABLE, prev_for(b0), backend="eager")
    for batch, spec in batches:
        prev = prev_for(batch)
        got = captured(state, batch, spec, TABLE, prev)
        assert tree_equal(got, fn(state, batch, spec, TABLE, prev))
    assert len(captured) == 1


@ON_CONFIGS
def test_spec_step_traces_one_graph_with_the_rank_as_data(fresh_dynamo, cfg):
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm

    compiled = torch.compile(_own_code(SPEC_STEP), fullgraph=True, dynamic=False, backend=backend)
    batch, spec = _spec_batch("mixed", cfg=cfg)
    for r in range(cfg.pcp_size):
        out = compiled(init_state(cfg, rank=r), batch, spec, TABLE)
        static = dataclasses.replace(cfg, pcp_rank=r)  # the same step with the rank static
        ref = SPEC_STEP(init_state(static), *_spec_batch("mixed", cfg=static), TABLE)
        assert tree_equal(out[1], ref[1])
    assert len(frames) == 1


@ON_CONFIGS
def test_spec_step_exports_without_symbolic_shapes(cfg):
    state = init_state(cfg)
    module = graph.export(SPEC_STEP, state, *_spec_batch("mixed", cfg=cfg), TABLE).module()
    for name in COMPOSITIONS:
        batch, spec = _spec_batch(name, cfg=cfg)
        assert tree_equal(module(state, batch, spec, TABLE), SPEC_STEP(state, batch, spec, TABLE)), name


@ON_CONFIGS
def test_spec_step_vmaps_over_ranks(cfg):
    batch, spec = _spec_batch("decode-only", cfg=cfg)
    _, mapped = pcp_fn.all_ranks(SPEC_STEP, init_state(cfg, rank=0), batch, spec, TABLE)
    for r in range(cfg.pcp_size):
        static = dataclasses.replace(cfg, pcp_rank=r)  # the same step with the rank static
        ref = SPEC_STEP(init_state(static), *_spec_batch("decode-only", cfg=static), TABLE)[1]
        assert tree_equal(pytree.tree_map(lambda x, r=r: x[r], mapped), ref), r


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@ON_CONFIGS
def test_spec_step_cuda_graph_replay_equals_eager_without_syncs(cfg):
    dev = torch.device("cuda")
    rng = random.Random(4)
    state = init_state(cfg, dev)
    table = TABLE.to(dev)
    batches = [to_device(_random_spec_batch(rng, bucket=BUCKET, cfg=cfg), dev) for _ in range(20)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        captured = graph.capture(SPEC_STEP, state, batches[0][0], batches[0][1], table)
        assert captured.kind == "cuda-graph"
        for batch, spec in batches:
            got = captured(state, batch, spec, table)
            torch.cuda.set_sync_debug_mode(0)
            assert tree_equal(got, SPEC_STEP(state, batch, spec, table))
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
    # numpy arrays (a runner's) take the vectorised checks: the same messages
    with pytest.raises(ValueError, match=match):
        make_spec_batch(SMALL, *(np.asarray(a) for a in args), **kwargs)


def test_ops_reject_buffers_of_the_wrong_shape():
    batch, spec = make_spec_batch(SMALL, [2, 3], [5, 5], [5, 5], [1, 2])
    state, _ = pcp_fn.update_tokens(init_state(SMALL), batch)
    b = batch.bucket
    Rb, Lb, P = b.num_reqs, b.num_tokens, SMALL.pcp_size
    F_, S_, M_ = token_rows(SMALL, b), sampled_rows(SMALL, b), mtp_rows(SMALL, b)
    ids, hidden, tis = torch.zeros(Lb), torch.zeros(P * Lb, 2), torch.zeros(Rb, dtype=torch.int64)
    full, seq, slots = torch.zeros(F_), torch.zeros(Rb), torch.zeros(M_ * P)
    with pytest.raises(ValueError, match=rf"num_draft_tokens must have {Rb} rows \(R_b"):
        pcp_fn.spec_decode_indices(state, torch.zeros(3, dtype=torch.int32), ids)
    with pytest.raises(
        ValueError, match=rf"input_ids must have {Lb} rows \(L_b"
    ):  # longer: no longer accepted
        pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, torch.zeros(Lb + 1))
    with pytest.raises(ValueError, match=r"token_ids must be a \[num_rows, max_model_len\] table"):
        pcp_fn.full_input_ids(state, torch.zeros(64), batch.num_computed)
    with pytest.raises(ValueError, match=rf"num_computed_tokens must have {Rb} rows"):
        pcp_fn.full_input_ids(state, TABLE, torch.zeros(Rb + 1))
    with pytest.raises(ValueError, match=r"slot_fn must return \["):
        pcp_fn.full_input_ids(state, TABLE, batch.num_computed, slot_fn=lambda r, p: r[:1])
    with pytest.raises(ValueError, match=r"hidden_states must be the restored \[P \* L_b, \.\.\.\]"):
        pcp_fn.decode_hidden_states(state, torch.zeros(3, 2))
    with pytest.raises(ValueError, match=rf"input_ids_full must have {F_} rows \(F_b"):
        pcp_fn.repair_full_input_ids(state, torch.zeros(1), torch.zeros(1, 1), None, torch.zeros(Rb))
    with pytest.raises(ValueError, match=r"prev_sampled_token_ids must be \[prev_reqs, num_sampled\]"):
        pcp_fn.repair_full_input_ids(state, full, torch.zeros(3), None, torch.zeros(Rb))
    with pytest.raises(ValueError, match=rf"prev_positions must have {Rb} rows"):
        pcp_fn.repair_full_input_ids(state, full, torch.zeros(3, 1), None, torch.zeros(Rb + 2))
    with pytest.raises(ValueError, match=r"draft_token_ids must be \[prev_reqs >= 1, num_spec_tokens=2\]"):
        pcp_fn.repair_full_input_ids(state, full, torch.zeros(3, 1), torch.zeros(3, 1), torch.zeros(Rb))
    with pytest.raises(ValueError, match=rf"input_ids_full must have {F_} rows"):
        pcp_fn.split_prefill_for_draft(state, torch.zeros(F_ - 1), hidden)
    with pytest.raises(ValueError, match=r"hidden_states must be the restored"):
        pcp_fn.split_prefill_for_draft(state, full, torch.zeros(P * Lb + 1, 2))
    fp = functools.partial(pcp_fn.first_pass_inputs, state)
    with pytest.raises(ValueError, match=rf"positions must have {Lb} rows"):
        fp(full, torch.zeros(Lb - 1), hidden, tis, torch.zeros(S_), 3)
    with pytest.raises(ValueError, match=rf"token_indices_to_sample must have {Rb} rows"):
        fp(full, ids, hidden, torch.zeros(Rb + 1), torch.zeros(S_), 3)
    with pytest.raises(ValueError, match=rf"logits_indices must have {S_} rows \(S_b.* or {Rb} \(R_b"):
        fp(full, ids, hidden, tis, torch.zeros(S_ + 1), 3)
    with pytest.raises(ValueError, match=rf"seq_lens must have {Rb} rows"):
        fp(full, ids, hidden, tis, torch.zeros(Rb), 3, seq_lens=torch.zeros(1))
    with pytest.raises(ValueError, match=rf"mtp_slot_mapping must have {M_ * P} rows \(M_b \* P"):
        pcp_fn.mtp_slot_inputs(state, tis, torch.zeros(1))
    with pytest.raises(ValueError, match=rf"token_indices_to_sample must have {Rb} rows"):
        pcp_fn.mtp_slot_inputs(state, torch.zeros(Rb + 1), slots)
    with pytest.raises(ValueError, match=rf"seq_lens must have {Rb} rows"):
        pcp_fn.mtp_drafting_inputs(state, tis, torch.zeros(Rb + 1), slots)
    with pytest.raises(ValueError, match=rf"mtp_slot_mapping must have {M_ * P} rows"):
        pcp_fn.mtp_drafting_inputs(state, tis, seq, torch.zeros(1))
    with pytest.raises(ValueError, match=r"num_cols must be a positive int"):
        pcp_fn.mtp_attention_mask(state, batch.num_computed, 0)
    with pytest.raises(ValueError, match=rf"num_computed_tokens must have {Rb} rows"):
        pcp_fn.mtp_attention_mask(state, torch.zeros(1), 8)
    with pytest.raises(ValueError, match=rf"restore_index must have {P * Lb} rows \(P \* L_b"):
        pcp_fn.mask_restore_index_for_graph(state, torch.arange(P * Lb + 1))
    with pytest.raises(ValueError, match=rf"seq_lens must have {Rb} rows"):
        pcp_fn.drafting_cp_seq_lens(state, torch.zeros(5), 0)
    with pytest.raises(ValueError, match=rf"num_computed_tokens must have {Rb} rows"):
        pcp_fn.rebuild_spec_positions(state, torch.zeros(Rb - 1))


SPEC_OPS = [
    pcp_fn.spec_decode_indices,
    pcp_fn.full_input_ids,
    pcp_fn.repair_full_input_ids,
    pcp_fn.rebuild_spec_positions,
    pcp_fn.decode_hidden_states,
    pcp_fn.split_prefill_for_draft,
    pcp_fn.first_pass_inputs,
    pcp_fn.mtp_slot_inputs,
    pcp_fn.mtp_drafting_inputs,
    pcp_fn.mtp_attention_mask,
    pcp_spec.mtp_blocked_keys,
    pcp_fn.mask_restore_index_for_graph,
    pcp_fn.drafting_cp_seq_lens,
    pcp_fn.spec_step,
]


@pytest.mark.parametrize("op", SPEC_OPS, ids=lambda op: op.__name__)
def test_no_spec_op_takes_a_size(op):
    """The size comes with the data (the state's or the batch's bucket): no bucket / row-count argument."""
    import inspect

    names = set(inspect.signature(op).parameters)
    assert not names & {"bucket", "num_rows", "rows", "num_tokens", "size", "capacity"}, names
    batch, spec = make_spec_batch(SMALL, [2, 3], [5, 5], [5, 5], [1, 2])
    state, _ = pcp_fn.update_tokens(init_state(SMALL), batch)
    with pytest.raises(TypeError, match="bucket"):
        op(state, bucket=batch.bucket)


def test_spec_step_refuses_a_token_table_narrower_than_the_checked_one():
    """Issue 11: a token table too narrow for the batch is a ValueError, never a truncated read."""
    sched, comp = [2, 2], [5, 9]
    table = torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16)
    batch, spec = make_spec_batch(
        SMALL, sched, comp, [5, 9], [1, 1], token_ids=table, slot_mapping=_slots(sched)
    )
    assert spec.token_ids_shape == (4, 16)
    state = init_state(SMALL)
    _, out = pcp_fn.spec_step(state, batch, spec, table)  # the checked table: fine
    assert out.full.input_ids[:4].tolist() == [5, 6, 16 + 9, 16 + 10]
    for narrow in (table[:, :10], table[:, :11], table[:, :15], table[:1]):  # request 1 reads column 10
        with pytest.raises(
            ValueError, match=r"token_ids must be a \[num_rows >= 4, max_model_len >= 16\] table"
        ):
            pcp_fn.spec_step(state, batch, spec, narrow)
    with pytest.raises(ValueError, match=r"token_ids must be a \[num_rows >= 4"):
        pcp_fn.spec_step(state, batch, spec, table.reshape(-1))
    wider = torch.cat([table, torch.zeros(4, 8, dtype=table.dtype)], 1)
    assert tree_equal(pcp_fn.spec_step(state, batch, spec, wider)[1].full, out.full)
    # a spec batch built without the table cannot vouch for any table
    batch2, spec2 = make_spec_batch(SMALL, sched, comp, [5, 9], [1, 1], slot_mapping=_slots(sched))
    with pytest.raises(ValueError, match=r"make_spec_batch\(\.\.\., token_ids=table\)"):
        pcp_fn.spec_step(state, batch2, spec2, table)
    # make_spec_batch itself refuses the narrow table
    with pytest.raises(
        ValueError, match=r"token_ids is too narrow: it has 10 columns but request 1 reads position 10"
    ):
        make_spec_batch(SMALL, sched, comp, [5, 9], [1, 1], token_ids=table[:, :10])


def test_spec_step_rejects_mismatched_inputs():
    sched = [2, 3]
    batch, spec = make_spec_batch(
        SMALL, sched, [5, 5], [5, 5], [1, 2], token_ids=TABLE, slot_mapping=_slots(sched)
    )
    state = init_state(SMALL)
    F_ = token_rows(SMALL, batch.bucket)
    with pytest.raises(
        ValueError, match=rf"slot_mapping must have the bucket's {F_} scheduler-order token rows"
    ):
        pcp_fn.spec_step(state, batch, spec, TABLE, slot_mapping=torch.arange(5))
    no_slots, spec_ns = make_spec_batch(SMALL, sched, [5, 5], [5, 5], [1, 2], token_ids=TABLE)
    with pytest.raises(ValueError, match=r"step needs the KV slot mapping"):
        pcp_fn.spec_step(state, no_slots, spec_ns, TABLE)
    _, out = pcp_fn.spec_step(state, no_slots, spec_ns, TABLE, slot_mapping=batch.slot_mapping)
    assert tree_equal(out, pcp_fn.spec_step(state, batch, spec, TABLE)[1])
    other, other_spec = make_spec_batch(SMALL, [2] * 4, [5] * 4, [5] * 4, [1] * 4, token_ids=TABLE)
    with pytest.raises(ValueError, match=r"spec.num_draft_tokens must have"):
        pcp_fn.spec_step(state, batch, other_spec, TABLE)
    with pytest.raises(TypeError, match=r"spec must be SpecInputs"):
        pcp_fn.spec_step(state, batch, spec.num_draft_tokens, TABLE)
    with pytest.raises(ValueError, match=r"the batch was built for"):
        pcp_fn.spec_step(init_state(dataclasses.replace(SMALL, num_spec_tokens=1)), batch, spec, TABLE)
    prev = PrevStep(torch.zeros(2, 1), None, torch.zeros(1))
    with pytest.raises(ValueError, match=r"prev.positions must have"):
        pcp_fn.spec_step(state, batch, spec, TABLE, prev)
