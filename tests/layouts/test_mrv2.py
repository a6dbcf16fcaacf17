"""pcp_fn.mrv2 (the vLLM MRV2 PCP layout): goldens, the oracle, identities, capturability, bad input."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from helpers import snapshot, to_device, tree_equal, tree_meta
from hypothesis import given
from hypothesis import strategies as st
from oracle_mrv2 import oracle_dispatch, oracle_layout, oracle_local, rank_pieces

import pcp_fn
from pcp_fn import Bucket, graph, mrv2
from pcp_fn.mrv2 import MRV2Config, init_state, make_batch, token_rows

SPLITS = {"head-tail": mrv2.HEAD_TAIL, "round-robin": mrv2.ROUND_ROBIN, "cost-balanced": mrv2.COST_BALANCED}

INT32_MAX = 2**31 - 1


def _cfg(P, rank=0, R=4, T=16, **kw):
    return MRV2Config(P, rank, R, T, **kw)


def _three_decodes(cfg, bucket):
    return make_batch(cfg, [1, 1, 1], [16, 16, 16], [0, 0, 0], bucket=bucket)


# --------------------------------------------------------------------------- goldens


def test_golden_three_replicated_decodes_bucket_4():
    for rank in (0, 1):
        cfg = _cfg(2, rank)
        batch = _three_decodes(cfg, Bucket(4, 4))
        state, local = mrv2.partition_batch(init_state(cfg), batch)
        lay = state.layout
        assert lay.per_rank_num_tokens.tolist() == [3, 3]
        assert lay.hidden_restore_idx[:3].tolist() == [0, 1, 2]
        assert lay.padded_gather_idx.tolist() == [0, 1, 2, 0, 0, 1, 2, 0]
        assert lay.gathered_kv_write_mask.tolist() == [True, True, True] + [False] * 5
        assert int(local.num_reqs) == 3
        assert local.global_batch_req_idx[:3].tolist() == [0, 1, 2]
        assert local.seq_lens.tolist() == [17, 17, 17, 0]
        assert local.query_start_loc.tolist() == [0, 1, 2, 3, 3]
        assert local.is_padding.tolist() == [False, False, False, True]


def test_golden_bucket_smaller_than_a_rank_raises():
    with pytest.raises(ValueError, match="smaller than the largest rank-local batch: 2 < 3"):
        _three_decodes(_cfg(2), Bucket(4, 2))


@pytest.mark.parametrize(
    ("P", "sched", "prefilling", "replicated", "sharded"),
    [
        (2, [8], [True], 4, 4),
        (2, [7], [True], 4, 4),
        (2, [3], [False], 3, 3),
        (2, [3, 8], [False, True], 7, 7),
        (4, [2, 9], [False, True], 5, 4),  # sharded: rank 0 owns the decode, rank 3 has 3 tokens
    ],
)
def test_golden_num_tokens_for_dispatch(P, sched, prefilling, replicated, sharded):
    assert mrv2.num_tokens_for_dispatch(_cfg(P), sched, prefilling) == replicated
    cfg = _cfg(P, shard_decode_requests=True)
    assert mrv2.num_tokens_for_dispatch(cfg, np.array(sched, np.int32), np.array(prefilling)) == sharded


def test_golden_sharded_decodes_vllm():
    # vLLM test_sharded_decode_piecewise_graph_padding / ..._selects_owner_kv_for_replication
    cfg = _cfg(2, shard_decode_requests=True)
    state, lay = mrv2.build_layout(init_state(cfg), _three_decodes(cfg, Bucket(4, 4)))
    assert lay.per_rank_num_tokens.tolist() == [2, 1]
    assert lay.hidden_restore_idx[:3].tolist() == [0, 4, 1]
    assert lay.padded_gather_idx.tolist() == [0, 2, 0, 0, 1, 0, 0, 0]
    assert lay.gathered_kv_write_mask.tolist() == [True, True, False, False, True, False, False, False]
    owned = [
        mrv2.partition_batch(init_state(cfg, rank=r), _three_decodes(cfg, Bucket(4, 4)))[1] for r in (0, 1)
    ]
    assert [o.global_batch_req_idx[: int(o.num_reqs)].tolist() for o in owned] == [[0, 2], [1]]

    state, lay = mrv2.build_layout(init_state(cfg), _three_decodes(cfg, Bucket(2, 2)))
    assert state.bucket == Bucket(2, 2) and token_rows(cfg, state.bucket) == 4
    _, slots = mrv2.gathered_slot_mappings(state, torch.tensor([[123, 456, 789, 0]]))
    assert slots.tolist() == [[123, 789, 456, -1]]
    assert lay.hidden_restore_idx.tolist() == [0, 2, 1, 0]
    gathered = torch.tensor([[11.0], [33.0], [22.0], [0.0]])
    _, hidden = mrv2.restore_hidden_states(state, gathered)
    # [F_b] rows: the three tokens, then the padding row repeating gathered row 0
    assert hidden.flatten().tolist() == [11.0, 22.0, 33.0, 11.0]


def test_golden_replicated_slot_mappings_docstring():
    cfg = _cfg(2)
    state, _ = mrv2.build_layout(init_state(cfg), _three_decodes(cfg, Bucket(4, 4)))
    _, slots = mrv2.gathered_slot_mappings(state, torch.tensor([[123, 456, 789, 0, 0, 0, 0, 0]]))
    assert slots.tolist() == [[123, 456, 789, -1, -1, -1, -1, -1]]  # rank 0's copies write


def test_golden_round_robin_owners_follow_the_decode_order():
    # vLLM test_pcp_only_decode_requests_are_round_robin_balanced_each_step
    P, n = 4, 18
    cfg = MRV2Config(P, 0, 32, 64, shard_decode_requests=True)
    batch = make_batch(cfg, [1] * n, [16] * n, [0] * n)
    state, lay = mrv2.build_layout(init_state(cfg), batch)
    Lp = lay.padded_num_tokens
    owner = (lay.hidden_restore_idx[:n] // Lp).tolist()
    assert owner == [i % P for i in range(n)]
    assert lay.per_rank_num_tokens.tolist() == [5, 5, 4, 4]


def test_golden_sharded_decodes_skip_zero_token_rows_and_prefills():
    # vLLM test_prefill_partitioning_is_preserved_with_sharded_decode
    cfg = _cfg(2, shard_decode_requests=True)
    batch = make_batch(cfg, [8, 1, 0, 1], [0, 16, 16, 16], [8, 0, 0, 0])
    state, lay = mrv2.build_layout(init_state(cfg), batch)
    Lp = lay.padded_num_tokens
    owners = (lay.hidden_restore_idx[:10] // Lp).tolist()
    assert owners[8:] == [0, 1]  # decode rows 1 and 3: the zero-token row 2 takes no turn
    gathered = lay.padded_gather_idx[lay.gathered_kv_write_mask]
    assert sorted(gathered.tolist()) == list(range(10))


def test_golden_dcp_keeps_decodes_replicated():
    # vLLM test_decode_requests_remain_replicated_when_dcp_is_enabled
    for rank in (0, 1):
        cfg = _cfg(2, rank, dcp_size=2)
        _, local = mrv2.partition_batch(init_state(cfg), _three_decodes(cfg, Bucket(4, 4)))
        assert local.global_batch_req_idx[: int(local.num_reqs)].tolist() == [0, 1, 2]
        assert local.dcp_local_seq_lens_cpu_upper_bound.tolist() == [9, 9, 9, 0]  # ceil(17 / 2)


def test_golden_vllm_build_batch_layout_comment_seven_token_prefill():
    # the PCP=2 example in vLLM PCPManager._build_batch_layout
    cfg = _cfg(2)
    state, lay = mrv2.build_layout(init_state(cfg), make_batch(cfg, [7], [0], [7]))
    assert lay.padded_num_tokens == 4 and state.bucket.num_tokens == 4
    assert lay.hidden_restore_idx.tolist() == [0, 1, 4, 5, 6, 7, 2, 0]  # [F_b = 8]
    assert lay.padded_gather_idx.tolist() == [0, 1, 6, 0, 2, 3, 4, 5]
    cfg1 = dataclasses.replace(cfg, pcp_rank=1)
    state1, local = mrv2.partition_batch(init_state(cfg1), make_batch(cfg1, [7], [0], [7]))
    _, draft = mrv2.prepare_draft_prefill(state1, local, torch.arange(10, 18, dtype=torch.int32))
    assert draft.input_ids.tolist() == [12, 13, 14, 15]


def test_init_state_holds_an_empty_layout_at_the_smallest_bucket():
    cfg = _cfg(2, request_buckets=(2, 8), token_buckets=(4, 16))
    for state in (init_state(cfg), init_state(cfg, rank=1)):
        assert state.bucket == Bucket(2, 4)
        lay = state.layout
        assert lay.per_rank_num_tokens.tolist() == [0, 0] and int(lay.num_tokens) == 0
        assert lay.padded_gather_idx.tolist() == [0] * 8
        assert lay.gathered_kv_write_mask.tolist() == [False] * 8
        assert lay.hidden_restore_idx.tolist() == [0] * 8
        # the consumers serve the fresh state at its bucket's shapes, padding only
        _, slots = mrv2.gathered_slot_mappings(state, torch.arange(8).view(1, 8))
        assert slots.tolist() == [[-1] * 8]
        _, hidden = mrv2.restore_hidden_states(state, torch.arange(8.0).view(8, 1))
        assert hidden.flatten().tolist() == [0.0] * 8
        # the same layout as partitioning an empty batch in that bucket
        built, _ = mrv2.partition_batch(state, make_batch(cfg, [], [], [], bucket=Bucket(2, 4)))
        assert tree_equal(built, state)
    assert tree_meta(init_state(cfg)) != tree_meta(init_state(cfg, rank=0))  # rank as data is a leaf


def test_golden_partition_docstring_example():
    cfg = _cfg(2, 1)
    batch = make_batch(cfg, [3, 8], [16, 0], [4, 8])
    assert batch.bucket == Bucket(4, 8)
    _, local = mrv2.partition_batch(init_state(cfg), batch)
    assert local.query_start_loc.tolist() == [0, 3, 5, 7, 7]
    assert local.positions.tolist() == [16, 17, 18, 2, 3, 4, 5, 0]
    assert local.seq_lens.tolist() == [19, 4, 6, 0]
    assert local.num_computed_tokens.tolist() == [16, 2, 4, 0]
    assert local.is_prefilling.tolist() == [False, True, True, False]
    assert local.logits_indices.tolist() == [2, 4, 6, 6]
    assert local.gather_idx.tolist() == [0, 1, 2, 5, 6, 7, 8, 0]
    assert bool(local.has_prefill)


def test_a_rank_without_tokens_keeps_the_placeholder_row():
    cfg = _cfg(4, 3, shard_decode_requests=True)
    batch = make_batch(cfg, [1], [5], [0], idx_mapping=[7])
    _, local = mrv2.partition_batch(init_state(cfg), batch)
    assert int(local.num_reqs) == 1 and int(local.num_tokens) == 0
    assert local.idx_mapping[:1].tolist() == [7]
    assert local.num_computed_tokens[:1].tolist() == [5]
    assert local.seq_lens.tolist() == [0]
    assert local.query_start_loc.tolist() == [0, 0]
    assert local.logits_indices.tolist() == [-1]
    assert local.cu_num_logits.tolist() == [0, 0]


def test_expand_moe_padding():
    mask = torch.tensor([False, True])
    assert mrv2.expand_moe_padding(_cfg(2, moe_gathers_tokens=True), mask).tolist() == [False, True] * 2
    assert mrv2.expand_moe_padding(_cfg(2), mask) is mask


# --------------------------------------------------------------------------- the oracle


@dataclass
class MCase:
    P: int
    R: int
    T: int
    shard: bool
    dcp: int
    interleave: int
    moe: bool
    sched: list[int]
    computed: list[int]
    prefill_len: list[int]
    prefilling: list[bool]
    idx_mapping: list[int]
    input_ids: list[int]
    positions: list[int]
    bucket: Bucket
    split: str = "head-tail"

    def config(self, rank: int = 0) -> MRV2Config:
        return MRV2Config(
            self.P,
            rank,
            self.R,
            self.T,
            shard_decode_requests=self.shard,
            dcp_size=self.dcp,
            cp_kv_cache_interleave_size=self.interleave,
            moe_gathers_tokens=self.moe,
            split=SPLITS[self.split],
        )

    def batch(self, cfg: MRV2Config, bucket: Bucket | None = None) -> mrv2.GlobalBatch:
        return make_batch(
            cfg,
            self.sched,
            self.computed,
            self.prefill_len,
            is_prefilling=self.prefilling,
            idx_mapping=self.idx_mapping,
            input_ids=self.input_ids,
            positions=self.positions,
            bucket=self.bucket if bucket is None else bucket,
        )

    def lists(self) -> dict:
        return dict(
            sched=self.sched,
            computed=self.computed,
            prefill_len=self.prefill_len,
            prefilling=self.prefilling,
            idx_mapping=self.idx_mapping,
            input_ids=self.input_ids,
            positions=self.positions,
        )


@st.composite
def mcases(draw, pcp_sizes=(1, 2, 3, 4, 8), max_reqs=8, max_tokens=120):
    """Any mix (and order) of decodes, prefills (fresh, chunked, short) and zero-token rows."""
    P = draw(st.sampled_from(pcp_sizes))
    mode = draw(st.sampled_from(["replicated", "sharded", "dcp"]))
    R = draw(st.integers(1, max_reqs))
    T = draw(st.integers(1, max_tokens))
    n_reqs = R if draw(st.booleans()) else draw(st.integers(0, R))
    sched, computed, plen = [], [], []
    budget = T
    for _ in range(n_reqs):
        kind = draw(st.sampled_from(["decode", "decode", "fresh", "chunked", "short", "zero"]))
        if kind == "decode":
            n, c = draw(st.integers(1, 3)), draw(st.integers(1, 500))
            p = draw(st.integers(0, c))
        elif kind == "zero":
            n, c, p = 0, draw(st.integers(0, 50)), draw(st.integers(0, 60))
        else:
            hi = 2 * P if kind == "short" else 60
            n = draw(st.integers(1, hi))
            c = 0 if kind in ("fresh", "short") else draw(st.integers(1, 200))
            p = c + n + draw(st.integers(0, 4))
        n = min(n, budget)
        budget -= n
        sched.append(n)
        computed.append(c)
        plen.append(p)
    prefilling = [c < p for c, p in zip(computed, plen)]
    total = sum(sched)
    starts = [sum(sched[:i]) for i in range(n_reqs)]
    positions = [
        computed[i] + t - starts[i] for i in range(n_reqs) for t in range(starts[i], starts[i] + sched[i])
    ]
    if draw(st.booleans()):  # the device cursor may run ahead of the host's (speculative rejection)
        positions = [draw(st.integers(0, 1000)) for _ in range(total)]
    input_ids = [draw(st.integers(0, 50_000)) for _ in range(total)]
    idx_mapping = draw(st.permutations(list(range(R))))[:n_reqs]
    shard, dcp = mode == "sharded", 2 if mode == "dcp" else 1
    split = "head-tail" if dcp > 1 else draw(st.sampled_from(list(SPLITS)))
    need_tokens, need_reqs = (
        oracle_dispatch(P, sched, prefilling, shard, dcp, split, computed) if n_reqs else (0, 1)
    )
    exact = Bucket(need_reqs, max(need_tokens, 1))
    bucket = draw(
        st.one_of(
            st.just(exact),
            st.builds(Bucket, st.integers(need_reqs, 2 * R), st.integers(exact.num_tokens, T)),
        )
    )
    return MCase(
        P,
        R,
        T,
        shard,
        dcp,
        draw(st.sampled_from([1, 2, 4])),
        draw(st.booleans()),
        sched,
        computed,
        plen,
        prefilling,
        idx_mapping,
        input_ids,
        positions,
        bucket,
        split,
    )


def _check_local(case: MCase, rank: int, local: mrv2.LocalBatch) -> None:
    Lp, Rl = case.bucket.num_tokens, case.bucket.num_reqs
    o = oracle_local(
        case.P,
        rank,
        case.lists(),
        Lp,
        Rl,
        shard=case.shard,
        dcp=case.dcp,
        interleave=case.interleave,
        moe=case.moe,
        split=case.split,
    )
    assert int(local.num_reqs) == o.num_reqs and int(local.num_tokens) == o.num_tokens
    for name in (
        "global_batch_req_idx",
        "idx_mapping",
        "num_scheduled_tokens",
        "num_computed_tokens",
        "query_start_loc",
        "seq_lens",
        "seq_lens_cpu_upper_bound",
        "prefill_len",
        "num_computed_prefill_tokens",
        "is_prefilling",
        "input_ids",
        "positions",
        "is_padding",
        "moe_is_padding",
        "logits_indices",
        "cu_num_logits",
        "gather_idx",
    ):
        got, want = getattr(local, name), getattr(o, name)
        if want is None:
            assert got is None, name
        else:
            assert got.tolist() == want, name
    got_dcp = local.dcp_local_seq_lens_cpu_upper_bound
    assert (got_dcp is None) == (o.dcp_bound is None)
    if got_dcp is not None:
        assert got_dcp.tolist() == o.dcp_bound
    assert bool(local.has_prefill) == any(o.is_prefilling)
    assert local.input_ids.dtype == torch.int32 and local.positions.dtype == torch.int64
    for name in ("query_start_loc", "seq_lens", "num_scheduled_tokens", "logits_indices", "cu_num_logits"):
        assert getattr(local, name).dtype == torch.int32, name


@given(case=mcases())
def test_layout_and_every_rank_match_the_oracle(case):
    cfg = case.config()
    batch = case.batch(cfg)
    Lp, P, T = case.bucket.num_tokens, case.P, case.T
    orc = oracle_layout(
        P,
        case.sched,
        case.prefilling,
        Lp,
        case.shard,
        case.dcp,
        T=T,
        split=case.split,
        computed=case.computed,
    )
    state, lay = mrv2.build_layout(init_state(cfg), batch)
    N, F = sum(case.sched), orc.global_rows
    assert token_rows(cfg, case.bucket) == F and state.bucket == case.bucket
    assert lay.padded_num_tokens == Lp
    assert lay.per_rank_num_tokens.tolist() == orc.per_rank_num_tokens
    assert int(lay.num_tokens) == N
    assert lay.hidden_restore_idx.tolist() == orc.padded_restore_idx()
    assert lay.padded_gather_idx.tolist() == orc.padded_gather_idx
    assert lay.gathered_kv_write_mask.tolist() == orc.write_mask

    slots = torch.randint(0, 1 << 40, (2, F))
    _, gathered_slots = mrv2.gathered_slot_mappings(state, slots)
    want = [
        [row[t] if w else -1 for t, w in zip(orc.padded_gather_idx, orc.write_mask)] for row in slots.tolist()
    ]
    assert gathered_slots.tolist() == want
    gathered = torch.randn(P * Lp, 2, dtype=torch.float64)
    _, restored = mrv2.restore_hidden_states(state, gathered)
    assert restored.tolist() == orc.restore(gathered.tolist())

    for rank in range(P):
        rank_cfg = dataclasses.replace(cfg, pcp_rank=rank)
        rstate, local = mrv2.partition_batch(init_state(rank_cfg), case.batch(rank_cfg))
        assert tree_equal(rstate.layout, lay) and rstate.bucket == case.bucket
        _check_local(case, rank, local)
        # rank as data gives the same local batch
        assert tree_equal(mrv2.partition_batch(init_state(cfg, rank=rank), batch)[1], local)


@given(case=mcases(), H=st.integers(1, 3))
def test_identities(case, H):
    """global = gathered[hidden_restore_idx]; padded_gathered = global[padded_gather_idx];
    every global token written once: a replicated request by rank 0, a sharded one by its owner."""
    cfg = case.config()
    batch = case.batch(cfg)
    P, Lp, N = case.P, case.bucket.num_tokens, sum(case.sched)
    F = token_rows(cfg, case.bucket)
    glob = torch.randn(F, H, dtype=torch.float64)
    locals_ = [mrv2.partition_batch(init_state(cfg, rank=r), batch) for r in range(P)]
    state = locals_[0][0]
    lay = state.layout
    # each rank's "model" is the identity on its rows; padding rows hold garbage
    bufs = [torch.where(l.is_padding[:, None], torch.nan, glob[l.gather_idx]) for _, l in locals_]
    gathered = torch.cat(bufs)
    _, restored = mrv2.restore_hidden_states(state, gathered)
    assert restored.shape == (F, H)  # the bucket's global token rows, whatever N is
    assert torch.equal(restored[:N], glob[:N])
    assert torch.equal(lay.hidden_restore_idx[N:], torch.zeros(F - N, dtype=torch.int64))  # row 0 repeats
    real = ~torch.cat([l.is_padding for _, l in locals_])
    assert torch.equal(glob[lay.padded_gather_idx][real], gathered[real])

    writers: dict[int, list[int]] = {}
    mask = lay.gathered_kv_write_mask.view(P, Lp)
    idx = lay.padded_gather_idx.view(P, Lp)
    for q in range(P):
        for t in idx[q][mask[q]].tolist():
            writers.setdefault(t, []).append(q)
    assert sorted(writers) == list(range(N)) and all(len(w) == 1 for w in writers.values())
    first = [sum(case.sched[:i]) for i in range(len(case.sched))]
    pieces = rank_pieces(P, case.sched, case.prefilling, case.shard, case.dcp, case.split, case.computed)
    for i, n in enumerate(case.sched):
        tokens = range(first[i], first[i] + n)
        whole = [q for q in range(P) for p in pieces[q] if p.req == i and len(p.tokens) == n]
        if n and whole:  # replicated on every rank (rank 0 writes) or sharded (its one owner writes)
            assert len(whole) in (1, P)
            assert all(writers[t] == [whole[0]] for t in tokens), (i, whole)
        if case.shard and n and not case.prefilling[i]:
            assert len(whole) == 1
        for t in tokens:  # a split token is written by the rank that holds it
            (q,) = writers[t]
            assert any(t in p.tokens for p in pieces[q])

    # restore_for_sampling / restore_draft_prefill restore the same way
    _, out = mrv2.restore_for_sampling(state, gathered, [gathered * 2])
    assert out.hidden_states.shape == (F, H) and out.aux_hidden_states[0].shape == (F, H)
    assert torch.equal(out.hidden_states[:N], glob[:N])
    assert torch.equal(out.aux_hidden_states[0][:N], 2 * glob[:N])
    _, draft = mrv2.restore_draft_prefill(state, gathered, gathered)
    assert draft.last_hidden_states is draft.hidden_states and torch.equal(draft.hidden_states[:N], glob[:N])
    _, draft = mrv2.restore_draft_prefill(state, gathered, gathered + 1)
    assert draft.hidden_states.shape == (F, H) and torch.equal(draft.hidden_states[:N], glob[:N] + 1)
    assert torch.equal(draft.last_hidden_states[:N], glob[:N])


@given(case=mcases())
def test_default_bucket_is_the_smallest_and_dispatch_matches(case):
    cfg = case.config()
    need_tokens, need_reqs = (
        oracle_dispatch(case.P, case.sched, case.prefilling, case.shard, case.dcp, case.split, case.computed)
        if case.sched
        else (0, 1)
    )
    assert mrv2.num_tokens_for_dispatch(cfg, case.sched, case.prefilling, case.computed) == need_tokens
    # vLLM's runner gives no contexts: a split that reads them answers a bound on every context
    bound = mrv2.num_tokens_for_dispatch(cfg, case.sched, case.prefilling)
    assert bound >= need_tokens and (bound == need_tokens or cfg.split.reads_context)
    batch = make_batch(cfg, case.sched, case.computed, case.prefill_len, is_prefilling=case.prefilling)
    assert batch.bucket == cfg.bucket_for(need_reqs, need_tokens)
    if need_tokens > 1:
        with pytest.raises(ValueError, match="smaller than the largest rank-local batch"):
            make_batch(
                cfg,
                case.sched,
                case.computed,
                case.prefill_len,
                bucket=Bucket(2 * case.R, need_tokens - 1),
                is_prefilling=case.prefilling,
            )
    if need_reqs > 1:
        with pytest.raises(ValueError, match="request capacity must cover the rank-local batch"):
            make_batch(
                cfg,
                case.sched,
                case.computed,
                case.prefill_len,
                bucket=Bucket(need_reqs - 1, case.T),
                is_prefilling=case.prefilling,
            )


# --------------------------------------------------------------------------- capturability

CFG = MRV2Config(4, 1, 8, 64)
BUCKET = Bucket(8, 64)
COMPOSITIONS = {
    # (sched, computed, prefill_len): decode rows have computed >= prefill_len
    "decode-only": ([1, 2, 1, 1], [9, 40, 7, 3], [9, 30, 7, 3]),
    "mixed": ([2, 13, 1, 0, 17], [50, 0, 8, 4, 0], [40, 20, 8, 0, 17]),
    "prefill-only": ([21, 7, 30], [0, 16, 0], [21, 30, 40]),
    "empty": ([0, 0], [3, 0], [0, 5]),
}


def _batch(name, cfg=CFG, bucket=BUCKET):
    sched, comp, plen = COMPOSITIONS[name]
    total = sum(sched)
    ids = torch.arange(100, 100 + total, dtype=torch.int32)
    return make_batch(cfg, sched, comp, plen, input_ids=ids, bucket=bucket)


def _slots(cfg, bucket, device=None):
    F = token_rows(cfg, bucket)
    return torch.arange(2 * F, dtype=torch.int64, device=device).view(2, F)


def _ops(state, batch):
    built, local = mrv2.partition_batch(state, batch)
    Lp = batch.bucket.num_tokens
    gathered = torch.randn(state.config.pcp_size * Lp, 4)
    slots = _slots(state.config, batch.bucket)
    draft_ids = torch.arange(token_rows(state.config, batch.bucket), dtype=torch.int32)
    return [
        (mrv2.build_layout, (state, batch)),
        (mrv2.partition_batch, (state, batch)),
        (mrv2.gathered_slot_mappings, (built, slots)),
        (mrv2.restore_hidden_states, (built, gathered)),
        (mrv2.prepare_draft_prefill, (built, local, draft_ids)),
        (mrv2.restore_draft_prefill, (built, gathered, gathered + 1)),
        (mrv2.restore_for_sampling, (built, gathered, (gathered,))),
    ]


def _step(state, batch, slots):
    state, local = mrv2.partition_batch(state, batch)
    state, sm = mrv2.gathered_slot_mappings(state, slots)
    return state, local, sm


def test_every_op_traces_fullgraph_and_matches_eager(fresh_dynamo):
    for name in COMPOSITIONS:
        batch = _batch(name)
        for state in (init_state(CFG), init_state(CFG, rank=2)):
            for fn, args in _ops(state, batch):
                compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend="eager")
                assert tree_equal(compiled(*args), fn(*args)), fn.__name__


def test_every_op_on_meta_tensors_and_under_the_sync_detector():
    for name in COMPOSITIONS:
        for fn, args in _ops(init_state(CFG), _batch(name)):
            ref = pcp_fn.assert_no_host_syncs(fn, *args)
            out = fn(*to_device(args, "meta"))
            assert tree_meta(out) == tree_meta(ref), fn.__name__
            assert all(
                x.device.type == "meta" for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)
            )
    cfg = dataclasses.replace(CFG, dcp_size=2, moe_gathers_tokens=True)
    pcp_fn.assert_no_host_syncs(mrv2.partition_batch, init_state(cfg, rank=1), _batch("mixed", cfg))


def test_shapes_and_op_counts_do_not_depend_on_composition():
    for cfg in (
        CFG,
        dataclasses.replace(CFG, shard_decode_requests=True),
        dataclasses.replace(CFG, dcp_size=2, moe_gathers_tokens=True),
    ):
        metas, counts = {}, {}
        for name in COMPOSITIONS:
            ops = _ops(init_state(cfg), _batch(name, cfg))
            metas[name] = [tree_meta(fn(*args)) for fn, args in ops]
            counts[name] = [pcp_fn.count_aten_ops(fn, *args) for fn, args in ops]
        assert all(m == metas["mixed"] for m in metas.values())
        assert all(c == counts["mixed"] for c in counts.values()), counts


def test_rank_as_data_traces_one_graph_and_vmaps(fresh_dynamo):
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm

    compiled = torch.compile(mrv2.partition_batch, fullgraph=True, dynamic=False, backend=backend)
    batch = _batch("mixed")
    for r in range(CFG.pcp_size):
        got = compiled(init_state(CFG, rank=r), batch)[1]
        static = dataclasses.replace(CFG, pcp_rank=r)
        want = mrv2.partition_batch(init_state(static), _batch("mixed", static))[1]
        assert tree_equal(got, want)
    assert len(frames) == 1
    state = init_state(CFG, rank=0)

    def leaves(r):  # vmap returns tensors only: the local batch's leaves (its None fields drop out)
        out = mrv2.partition_batch(dataclasses.replace(state, rank=r), batch)[1]
        return [x for x in pytree.tree_leaves(out) if x is not None]

    mapped = torch.func.vmap(leaves)(torch.arange(CFG.pcp_size))
    for r in range(CFG.pcp_size):
        want = [
            x
            for x in pytree.tree_leaves(mrv2.partition_batch(init_state(CFG, rank=r), batch)[1])
            if x is not None
        ]
        assert all(torch.equal(m[r], w) for m, w in zip(mapped, want, strict=True))


def _random_batch(rng, cfg=CFG, bucket=BUCKET):
    """Random mixed compositions that fit ``bucket``."""
    while True:
        sched, comp, plen = [], [], []
        for _ in range(rng.randint(0, cfg.max_num_reqs)):
            kind = rng.choice(["decode", "prefill", "zero"])
            if kind == "decode":
                sched.append(rng.randint(1, 2))
                comp.append(rng.randint(1, 300))
                plen.append(rng.randint(0, comp[-1]))
            else:
                sched.append(0 if kind == "zero" else rng.randint(1, 40))
                comp.append(0)
                plen.append(sched[-1] + 1)
        if sum(sched) > cfg.max_num_tokens:
            continue
        need = mrv2.rank_counts(cfg, np.array(sched, dtype=np.int64), np.array(comp) < np.array(plen))
        if need[0].max(initial=0) <= bucket.num_tokens and need[1].max(initial=1) <= bucket.num_reqs:
            ids = [rng.randint(0, 1000) for _ in range(sum(sched))]
            return make_batch(cfg, sched, comp, plen, input_ids=ids, bucket=bucket)


def test_mixed_batch_captured_and_replayed_with_other_compositions(fresh_dynamo):
    rng = random.Random(5)
    state = init_state(CFG)
    slots = _slots(CFG, BUCKET)
    mixed = _batch("mixed")
    captured = graph.capture(_step, state, mixed, slots, backend="eager")
    later = [_batch("decode-only"), _batch("prefill-only"), _batch("empty")]
    later += [_random_batch(rng) for _ in range(20)]
    for batch in later:
        assert tree_equal(captured(state, batch, slots), _step(state, batch, slots))
    assert len(captured) == 1  # one bucket, one graph, whatever the composition


# six buckets ((2, 16) x (8, 32, 64)): a plain torch.compile stays under Dynamo's recompile limit (8)
BUCKETED = MRV2Config(4, 1, 8, 64, request_buckets=(2,), token_buckets=(8, 32))


def _walk(cfg, seed):
    """Every bucket of ``cfg`` in a random order, then again in another, each with a random batch
    that fits it (forced into that bucket)."""
    rng = random.Random(seed)
    buckets = cfg.buckets()
    order = rng.sample(buckets, len(buckets)) + rng.sample(buckets, len(buckets))
    return [_random_batch(rng, cfg, b) for b in order]


def _unique_graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("rank_as_data", [False, True])
@pytest.mark.parametrize("how", ["capture", "compile"])
def test_one_graph_per_bucket_feeding_each_step_the_previous_state(fresh_dynamo, how, rank_as_data):
    """partition_batch is an entry op: the state out of any bucket's step feeds any bucket's graph."""
    cfg = BUCKETED
    batches = _walk(cfg, seed=11)
    state = init_state(cfg, rank=1) if rank_as_data else init_state(cfg)
    torch._dynamo.utils.counters.clear()
    if how == "capture":
        fn = graph.capture(mrv2.partition_batch, state, batches[0], backend="eager")
    else:
        fn = torch.compile(mrv2.partition_batch, fullgraph=True, dynamic=False, backend="eager")
    seen = set()
    for batch in batches:
        prev_bucket = state.bucket
        state, local = fn(state, batch)
        seen.add(batch.bucket)
        assert state.bucket == batch.bucket and local.bucket == batch.bucket
        fresh = init_state(cfg, rank=1) if rank_as_data else init_state(cfg)
        assert tree_equal((state, local), mrv2.partition_batch(fresh, batch))
        assert _unique_graphs() == len(seen), (prev_bucket, batch.bucket)
    assert seen == set(cfg.buckets()) and _unique_graphs() == len(cfg.buckets())
    if how == "capture":
        assert len(fn) == len(cfg.buckets())


# A consumer returns the state it was given. torch 2.10's Dynamo realizes every lazily wrapped field of a
# returned value at the frame's return (OutputGraph's `LazyVariableTracker.realize_all` over the stack), which
# installs an EQUALS_MATCH guard on each static int of that state, `bucket.num_reqs` included, though the
# restore reads only `bucket.num_tokens`: one graph per (num_reqs, num_tokens) bucket. From
# `LazyConstantVariable` on (pytorch/pytorch#169282, not in 2.10; in 2.13 and 2.15) a returned constant
# stays lazy and unguarded: one graph per token bucket.
_RETURN_GUARDS_EVERY_CONSTANT = not hasattr(torch._dynamo.variables.lazy, "LazyConstantVariable")


def test_consumers_compile_one_graph_per_bucket(fresh_dynamo):
    """The consumers are keyed by the state's bucket: restoring in the walk's order compiles one
    graph per bucket at most (the restore reads only Lp: one per token bucket, where torch does not
    guard on the returned state's other fields)."""
    cfg = BUCKETED
    restore = torch.compile(mrv2.restore_hidden_states, fullgraph=True, dynamic=False, backend="eager")
    state = init_state(cfg)
    torch._dynamo.utils.counters.clear()
    for batch in _walk(cfg, seed=12):
        state, local = mrv2.partition_batch(state, batch)
        gathered = torch.randn(cfg.pcp_size * batch.bucket.num_tokens, 3)
        _, got = restore(state, gathered)
        assert got.shape == (token_rows(cfg, batch.bucket), 3)
        assert torch.equal(got, mrv2.restore_hidden_states(state, gathered)[1])
    assert _unique_graphs() == len(cfg.buckets() if _RETURN_GUARDS_EVERY_CONSTANT else cfg.token_buckets)


def test_export_has_no_symbolic_shapes_and_equals_eager(fresh_dynamo):
    cfg = dataclasses.replace(CFG, dcp_size=2, moe_gathers_tokens=True)
    state = init_state(cfg, rank=2)
    slots = _slots(cfg, BUCKET)
    module = graph.export(_step, state, _batch("mixed", cfg), slots).module()
    for name in COMPOSITIONS:
        batch = _batch(name, cfg)
        assert tree_equal(module(state, batch, slots), _step(state, batch, slots))


def test_inductor_compiled_partition_equals_eager(fresh_dynamo):
    compiled = torch.compile(_step, fullgraph=True, dynamic=False)
    state = init_state(CFG, rank=3)
    slots = _slots(CFG, BUCKET)
    for name in COMPOSITIONS:
        batch = _batch(name)
        assert tree_equal(compiled(state, batch, slots), _step(state, batch, slots))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_graph_replay_equals_eager_without_syncs():
    dev = torch.device("cuda")
    rng = random.Random(9)
    state = init_state(CFG, dev)
    slots = _slots(CFG, BUCKET, dev)
    batches = [to_device(_batch("mixed"), dev)] + [to_device(_random_batch(rng), dev) for _ in range(30)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        captured = graph.capture(_step, state, batches[0], slots)
        assert captured.kind == "cuda-graph"
        for b in batches:
            got = captured(state, b, slots)
            torch.cuda.set_sync_debug_mode(0)
            assert tree_equal(got, _step(state, b, slots))
            torch.cuda.set_sync_debug_mode("error")
    finally:
        torch.cuda.set_sync_debug_mode(0)


@cuda
def test_device_input_ids_must_be_int32():
    cfg = _cfg(2)
    ids = torch.tensor([5, 2**40, 7], device="cuda")
    with pytest.raises(TypeError, match=r"input_ids is a torch\.int64 cuda tensor; it must be torch\.int32"):
        make_batch(cfg, [1, 2], [0, 0], [1, 2], input_ids=ids, device="cuda")
    batch = make_batch(cfg, [1, 2], [0, 0], [1, 2], input_ids=ids.to(torch.int32), device="cuda")
    assert batch.input_ids.dtype == torch.int32 and batch.input_ids.shape == (token_rows(cfg, batch.bucket),)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([1, 2], [0, 0, 0], [1, 2]), {}, r"differ in length.*num_computed_tokens has 3"),
        (([1, -2], [0, 0], [1, 2]), {}, r"num_scheduled_tokens\[1\] = -2 is negative"),
        (([1] * 5, [0] * 5, [1] * 5), {}, r"5 requests; max_num_reqs is 4"),
        (([10, 7], [0, 0], [10, 7]), {}, r"sums to 17 tokens; max_num_tokens is 16"),
        (([1, 2], [0, 0], [1, 2]), dict(is_prefilling=[True]), r"is_prefilling has 1"),
        (([1, 2], [0, 0], [1, 2]), dict(idx_mapping=[0, -1]), r"idx_mapping\[1\] = -1 is negative"),
        (([1, 2], [0, 0], [1, 2]), dict(input_ids=[5, 6]), r"input_ids has 2 entries; it must cover the 3"),
        (([1, 2], [0, 0], [1, 2]), dict(positions=list(range(17))), r"not exceed max_num_tokens=16"),
        (([1, 2], [0, 0], [1, 2]), dict(input_ids=torch.zeros(3, 1)), r"input_ids must be 1-D"),
        # issue 11: ids past int32 (vLLM's input_ids buffers are int32) were cast to 0
        (([1, 2], [0, 0], [1, 2]), dict(input_ids=[5, 2**40, 7]), r"input_ids\[1\] = 1099511627776 exceeds"),
        (
            ([1, 2], [0, 0], [1, 2]),
            dict(input_ids=torch.tensor([5, 6, 2**31])),
            r"input_ids\[2\] = 2147483648 exceeds the limit 2147483647",
        ),
        (
            ([1, 2], [0, 0], [1, 2]),
            dict(input_ids=np.array([2**40, 0, 0], dtype=np.int64)),
            r"input_ids\[0\] = 1099511627776 exceeds",
        ),
        # issue 11: a sequence length (seq_lens_cpu_upper_bound) past int32
        (
            ([1, 2], [0, INT32_MAX - 1], [1, 2]),
            {},
            r"num_computed_tokens\[1\] \+ num_scheduled_tokens\[1\] = 2147483648 exceeds the int32",
        ),
        (
            ([1, 2], [0, 0], [1, 2]),
            dict(positions=[0, 1, INT32_MAX]),
            r"positions\[2\] = 2147483647 exceeds the limit 2147483646",
        ),
        (
            ([1, 2], [0, 0], [1, 2]),
            dict(bucket=Bucket(9, 8)),
            r"bucket.num_reqs=9 exceeds the local request capacity",
        ),
        (
            ([1, 2], [0, 0], [1, 2]),
            dict(bucket=Bucket(4, 17)),
            r"bucket.num_tokens=17 exceeds the local token capacity",
        ),
        (
            ([3, 8], [16, 0], [4, 8]),
            dict(bucket=Bucket(2, 16)),
            r"request capacity must cover the rank-local batch: 2 < 3",
        ),
    ],
)
def test_make_batch_rejects(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_batch(_cfg(2), *args, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(is_prefilling=[1, 0]), r"is_prefilling must hold bools"),
        (dict(positions=torch.zeros(3)), r"positions must hold integers"),
        (dict(input_ids=[1.0, 2.0, 3.0]), r"input_ids must hold integers"),
        (dict(bucket=(4, 4)), r"bucket must be a pcp_fn.Bucket"),
    ],
)
def test_make_batch_rejects_wrong_types(kwargs, match):
    with pytest.raises(TypeError, match=match):
        make_batch(_cfg(2), [1, 2], [0, 0], [1, 2], **kwargs)
    with pytest.raises(TypeError, match="config must be an MRV2Config"):
        make_batch(pcp_fn.PCPConfig(2, 0, 4, 16), [1, 2], [0, 0], [1, 2])


def test_make_batch_accepts_the_int32_limits():
    cfg = _cfg(2)
    batch = make_batch(
        cfg, [1, 2], [0, INT32_MAX - 2], [1, 2], input_ids=[INT32_MAX, 0, 1], positions=[0, 1, INT32_MAX - 1]
    )
    assert batch.input_ids[:3].tolist() == [INT32_MAX, 0, 1] and batch.input_ids.dtype == torch.int32
    assert batch.positions[:3].tolist() == [0, 1, INT32_MAX - 1]
    # per-token arrays are carried as [F_b]: padding entries past F_b are dropped, never real ones
    batch = make_batch(cfg, [1, 2], [0, 0], [1, 2], input_ids=list(range(3)) + [9] * 13)
    assert batch.input_ids.tolist() == [0, 1, 2, 9] and token_rows(cfg, batch.bucket) == 4


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(pcp_size=0), ValueError, "pcp_size must be >= 1"),
        (dict(pcp_rank=2), ValueError, "pcp_rank must be < pcp_size=2"),
        (dict(max_num_reqs=0), ValueError, "max_num_reqs must be >= 1"),
        (dict(dcp_size=2, shard_decode_requests=True), ValueError, "shard_decode_requests requires dcp_size"),
        (dict(cp_kv_cache_interleave_size=0), ValueError, "cp_kv_cache_interleave_size must be >= 1"),
        (dict(moe_gathers_tokens=1), TypeError, "moe_gathers_tokens must be a bool"),
        (dict(token_buckets=(32,)), ValueError, "token_buckets size 32 exceeds the capacity 16"),
    ],
)
def test_config_rejects(kwargs, error, match):
    base = dict(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=16)
    with pytest.raises(error, match=match):
        MRV2Config(**{**base, **kwargs})


def test_entry_ops_reject_a_batch_of_another_config_or_past_capacity():
    cfg = _cfg(2)
    batch = make_batch(cfg, [3, 8], [16, 0], [4, 8])
    for fn in (mrv2.partition_batch, mrv2.build_layout):
        name = "global_batch" if fn is mrv2.partition_batch else "batch"
        # issue 11: a batch of another config used to be laid out silently
        with pytest.raises(
            ValueError, match=rf"{name} was built for another MRV2Config.*max_num_tokens \(16 vs 32\)"
        ):
            fn(init_state(_cfg(2, T=32)), batch)
        with pytest.raises(ValueError, match=r"pcp_rank \(0 vs 1\)"):
            fn(init_state(_cfg(2, 1)), batch)
        with pytest.raises(
            ValueError, match=rf"{name}.bucket Bucket\(num_reqs=9, num_tokens=8\) exceeds the capacity"
        ):
            fn(init_state(cfg), dataclasses.replace(batch, bucket=Bucket(9, 8)))
        with pytest.raises(ValueError, match=rf"{name}.input_ids must be \[16\], got shape \(8,\)"):
            fn(init_state(cfg), dataclasses.replace(batch, input_ids=batch.input_ids[:8]))
        with pytest.raises(TypeError, match=f"{name} must be an mrv2.GlobalBatch"):
            fn(init_state(cfg), pcp_fn.make_batch(pcp_fn.PCPConfig(2, 0, 4, 16), [1], [0], [1]))
        with pytest.raises(TypeError, match=r"state must be an mrv2\.MRV2State"):
            fn(pcp_fn.init_state(pcp_fn.PCPConfig(2, 0, 4, 16)), batch)
    with pytest.raises(ValueError, match="rank must be in"):
        init_state(cfg, rank=2)
    with pytest.raises(TypeError, match="config must be an MRV2Config"):
        init_state(pcp_fn.PCPConfig(2, 0, 4, 16))


def test_consumers_reject_inputs_of_the_wrong_rows():
    cfg = _cfg(2)
    batch = make_batch(cfg, [3, 8], [16, 0], [4, 8], bucket=Bucket(4, 16))
    state, local = mrv2.partition_batch(init_state(cfg), batch)
    assert state.bucket == Bucket(4, 16) and state.layout.padded_num_tokens == 16
    assert token_rows(cfg, state.bucket) == 16
    rows = r"must have 32 rows \(the 2 ranks' \[16, \.\.\.\] buffers stacked\)"
    with pytest.raises(ValueError, match="restore_hidden_states: gathered " + rows):
        mrv2.restore_hidden_states(state, torch.zeros(16, 2))
    with pytest.raises(ValueError, match="restore_for_sampling: hidden_states " + rows):
        mrv2.restore_for_sampling(state, torch.zeros(33, 2))
    with pytest.raises(ValueError, match=r"restore_for_sampling: aux_hidden_states\[1\] " + rows):
        mrv2.restore_for_sampling(state, torch.zeros(32, 2), [torch.zeros(32, 2), torch.zeros(8, 2)])
    with pytest.raises(ValueError, match="restore_draft_prefill: hidden_states " + rows):
        mrv2.restore_draft_prefill(state, torch.zeros(32, 2), torch.zeros(64, 2))
    with pytest.raises(ValueError, match="restore_draft_prefill: last_hidden_states " + rows):
        mrv2.restore_draft_prefill(state, torch.zeros(0, 2), torch.zeros(32, 2))
    # a size argument is gone: the bucket decides (num_tokens used to truncate)
    with pytest.raises(TypeError):
        mrv2.restore_hidden_states(state, torch.zeros(32, 2), num_tokens=11)
    token_rows_msg = r"must have 16 rows \(F_b = min\(max_num_tokens, pcp_size \* 16\) global tokens\)"
    with pytest.raises(ValueError, match="global_slot_mappings " + token_rows_msg):
        mrv2.gathered_slot_mappings(state, torch.zeros(1, 32, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"global_slot_mappings must be \[num_kv_cache_groups, F_b\]"):
        mrv2.gathered_slot_mappings(state, torch.zeros(16, dtype=torch.int64))
    with pytest.raises(ValueError, match="input_ids " + token_rows_msg):
        mrv2.prepare_draft_prefill(state, local, torch.zeros(17, dtype=torch.int32))
    with pytest.raises(TypeError, match="input_ids must be a 1-D int32 tensor"):
        mrv2.prepare_draft_prefill(state, local, torch.zeros(16, dtype=torch.int64))
    small, small_local = mrv2.partition_batch(state, make_batch(cfg, [3, 8], [16, 0], [4, 8]))
    with pytest.raises(ValueError, match=r"local_batch.bucket .* is not the state's bucket"):
        mrv2.prepare_draft_prefill(small, local, torch.zeros(16, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"state must be an mrv2\.MRV2State"):
        mrv2.restore_hidden_states(local, torch.zeros(32, 2))
    _, ok = mrv2.prepare_draft_prefill(small, small_local, torch.zeros(16, dtype=torch.int32))
    assert ok.input_ids.shape == (8,)


def test_ops_never_mutate_inputs():
    cfg = _cfg(2)
    batch = make_batch(cfg, [3, 8], [16, 0], [4, 8])
    sched = np.array([3, 8])
    make_batch(cfg, sched, [16, 0], [4, 8])
    assert sched.tolist() == [3, 8]
    before = snapshot(batch)
    fresh = init_state(cfg)
    fresh_before = snapshot(fresh)
    state, local = mrv2.partition_batch(fresh, batch)
    local_before = snapshot(local)
    gathered = torch.randn(16, 2)
    kept = gathered.clone()
    mrv2.restore_for_sampling(state, gathered, [gathered])
    mrv2.restore_draft_prefill(state, gathered, gathered)
    mrv2.prepare_draft_prefill(state, local, torch.arange(16, dtype=torch.int32))
    mrv2.gathered_slot_mappings(state, torch.zeros(1, 16, dtype=torch.int64))
    assert tree_equal(batch, before) and torch.equal(gathered, kept)
    assert tree_equal(fresh, fresh_before) and tree_equal(local, local_before)
