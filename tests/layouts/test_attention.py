"""attention_metadata: golden vectors, the slow oracle (hypothesis), capturability, fixed shapes."""

import dataclasses
import random

import pytest
import torch
from helpers import snapshot, to_device, tree_equal, tree_meta
from hypothesis import given
from hypothesis import strategies as st
from oracle_attention import oracle_attention
from strategies import cases

import pcp_fn
from pcp_fn import Bucket, PCPConfig, attention_metadata, init_state, make_batch

INDEX_NAMES = [
    "q_head_idx",
    "q_tail_idx",
    "q_full_idx",
    "kv_with_q_head_nomask_idx",
    "kv_with_q_head_mask_idx",
    "kv_with_q_tail_nomask_idx",
    "kv_with_q_tail_mask_idx",
    "kv_tail_proj_idx",
    "kv_with_q_head_attn_idx_in_tail",
    "kv_with_q_tail_attn_idx_in_tail",
]
PER_REQUEST = [
    "attn_chunk_seqlens",
    "attn_mask_seqlens",
    "head_attn_nomask_seqlens",
    "tail_attn_nomask_seqlens",
    "head_actual_seq_lengths_kv",
    "tail_actual_seq_lengths_kv",
]


def _meta(P, rank, sched, comp=None, prompt=None, bucket=None, **kw):
    comp = [0] * len(sched) if comp is None else comp
    prompt = list(sched) if prompt is None else prompt
    cfg = PCPConfig(P, rank, max(len(sched), 4), 256, **kw)
    batch = make_batch(cfg, sched, comp, prompt, bucket=bucket)
    return batch, attention_metadata(init_state(cfg), batch)[1]


def _real(padded):
    return padded.index[: int(padded.length)].tolist()


# ---- golden vectors ----------------------------------------------------------------------------


def test_golden_p2_rank0_one_fresh_prefill_of_8():
    # local_len 4, chunk 2, head chunk 0, tail chunk 3
    _, m = _meta(2, 0, [8])
    assert _real(m.q_head_idx) == [0, 1]
    assert _real(m.q_tail_idx) == [2, 3]
    assert _real(m.q_full_idx) == [0, 1, 2, 3]
    assert _real(m.kv_with_q_head_nomask_idx) == []
    assert _real(m.kv_with_q_head_mask_idx) == [0, 1]
    assert _real(m.kv_with_q_tail_nomask_idx) == [0, 1, 2, 3, 4, 5]
    assert _real(m.kv_with_q_tail_mask_idx) == [6, 7]
    assert _real(m.kv_tail_proj_idx) == list(range(8))
    assert _real(m.kv_with_q_head_attn_idx_in_tail) == [0, 1]
    assert _real(m.kv_with_q_tail_attn_idx_in_tail) == list(range(8))
    assert m.attn_chunk_seqlens.tolist() == [2]
    assert m.attn_mask_seqlens.tolist() == [2]
    assert m.head_attn_nomask_seqlens.tolist() == [0]
    assert m.tail_attn_nomask_seqlens.tolist() == [6]
    assert m.head_actual_seq_lengths_kv.tolist() == [2]
    assert m.tail_actual_seq_lengths_kv.tolist() == [8]
    assert int(m.num_actual_tokens_pcp_padded) == 8
    assert m.query_lens_pcp_full.tolist() == [8] and int(m.max_query_len_pcp_full) == 8


def test_golden_p4_rank3_fresh_prefills_8_and_12():
    # local_len [2, 4] (12 pads to 16), chunk [1, 2], head chunk 3, tail chunk 4; kv_off [0, 8]
    _, m = _meta(4, 3, [8, 12])
    assert _real(m.q_head_idx) == [0, 2, 3]
    assert _real(m.q_tail_idx) == [1, 4, 5]
    assert _real(m.q_full_idx) == [0, 3, 1, 2, 4, 5]
    assert _real(m.kv_with_q_head_nomask_idx) == [0, 1, 2, 8, 9, 10, 11, 12, 13]
    assert _real(m.kv_with_q_head_mask_idx) == [3, 14, 15]
    assert _real(m.kv_with_q_tail_nomask_idx) == [0, 1, 2, 3, *range(8, 16)]
    assert _real(m.kv_with_q_tail_mask_idx) == [4, 16, 17]
    assert _real(m.kv_tail_proj_idx) == [*range(0, 5), *range(8, 18)]
    assert _real(m.kv_with_q_head_attn_idx_in_tail) == [*range(0, 4), *range(5, 13)]
    assert _real(m.kv_with_q_tail_attn_idx_in_tail) == list(range(15))
    assert m.attn_chunk_seqlens.tolist() == [1, 2]
    assert m.attn_mask_seqlens.tolist() == [1, 3]
    assert m.head_attn_nomask_seqlens.tolist() == [3, 9]
    assert m.tail_attn_nomask_seqlens.tolist() == [4, 12]
    assert m.head_actual_seq_lengths_kv.tolist() == [4, 12]
    assert m.tail_actual_seq_lengths_kv.tolist() == [5, 15]


def _vllm_ascend_tail_projection(P, rank, local_lens):
    """vllm-ascend's test construction: per request, ranges from kv_off, kv_off += local_len * P."""
    tail_idx, head_in_tail, tail_in_tail, head_kv, tail_kv = [], [], [], [], []
    kv_off, h, t = 0, rank, 2 * P - 1 - rank
    for local_len in local_lens:
        c = local_len // 2
        proj_off = len(tail_idx)
        tail_idx += range(kv_off, kv_off + c * (t + 1))
        head_in_tail += range(proj_off, proj_off + c * (h + 1))
        tail_in_tail += range(proj_off, proj_off + c * (t + 1))
        head_kv.append(len(head_in_tail))
        tail_kv.append(len(tail_in_tail))
        kv_off += local_len * P
    return tail_idx, head_in_tail, tail_in_tail, head_kv, tail_kv


@pytest.mark.parametrize(
    ("P", "rank", "sched", "local_lens"),
    [
        # the batches: fresh prefills of 8 and [8, 12]
        (2, 0, [8], [4]),
        (2, 1, [8], [4]),
        (4, 0, [8, 12], [2, 4]),
        (4, 3, [8, 12], [2, 4]),
        # vllm-ascend's test passes query lens [8] and [8, 12] directly: the local lengths of these batches
        (2, 0, [16], [8]),
        (2, 1, [16], [8]),
        (4, 0, [32, 48], [8, 12]),
        (4, 3, [32, 48], [8, 12]),
    ],
)
def test_golden_tail_projection_per_request_ranges(P, rank, sched, local_lens):
    batch, m = _meta(P, rank, sched)
    tail_idx, head_in_tail, tail_in_tail, head_kv, tail_kv = _vllm_ascend_tail_projection(P, rank, local_lens)
    assert _real(m.kv_tail_proj_idx) == tail_idx
    assert _real(m.kv_with_q_head_attn_idx_in_tail) == head_in_tail
    assert _real(m.kv_with_q_tail_attn_idx_in_tail) == tail_in_tail
    n = len(sched)
    assert m.head_actual_seq_lengths_kv[:n].tolist() == head_kv
    assert m.tail_actual_seq_lengths_kv[:n].tolist() == tail_kv
    full_kv_len = sum(local_lens) * P
    assert 0 < len(tail_idx) <= full_kv_len and max(tail_idx) < full_kv_len


def test_golden_pcp_and_dcp_context_split():
    # vllm-ascend: P=2, D=2, interleave 64, decodes with 255 and 128 computed tokens, then prefills
    cfg = PCPConfig(2, 0, 4, 64, dcp_size=2, cp_kv_cache_interleave_size=64)
    batch = make_batch(cfg, [1, 1, 8, 12], [255, 128, 0, 0], [255, 128, 8, 12])
    _, m = attention_metadata(init_state(cfg), batch)
    assert m.num_computed_tokens_of_pcp_dcp.tolist() == [
        [[64, 64], [64, 64]],
        [[64, 64], [1, 0]],
        [[0, 0], [0, 0]],
        [[0, 0], [0, 0]],
    ]
    assert int(m.num_decode_reqs) == 2 and int(m.num_prefill_reqs) == 2
    # decodes are skipped: the prefill part starts at local row 0 and K/V row 0
    assert _real(m.q_head_idx) == [0, 1, 4, 5, 6]
    assert m.attn_chunk_seqlens.tolist() == [2, 3, 0, 0]


def test_decode_seq_lens_override_the_decode_context():
    cfg = PCPConfig(2, 0, 4, 64, dcp_size=2, cp_kv_cache_interleave_size=64)
    batch = make_batch(cfg, [1, 1, 8], [255, 128, 0], [255, 128, 8])
    fixed = torch.tensor([300, 129, 999, 999], dtype=torch.int32)
    _, m = attention_metadata(init_state(cfg), batch, decode_seq_lens=fixed)
    assert m.num_computed_tokens_of_pcp_dcp[:3].tolist() == [
        [[108, 64], [64, 64]],  # 300 = 4 * 64 + 44 (instead of 255 + 1 = 256)
        [[64, 64], [1, 0]],
        [[0, 0], [0, 0]],  # a prefill's context is its computed tokens, whatever is passed
    ]


def test_padding_of_a_larger_bucket():
    # chunks [2, 1] (3 tokens pad to 4: 2 local rows); C_b = 16 // 2 = 8
    _, m = _meta(2, 1, [8, 3], bucket=Bucket(4, 16))
    assert m.q_head_idx.index.shape == (8,) and int(m.q_head_idx.length) == 3
    assert m.q_head_idx.index[3:].tolist() == [0] * 5
    assert m.kv_tail_proj_idx.index.shape == (4 * 8,)
    assert m.attn_mask_seqlens.tolist() == [2, 3, 3, 3]  # past the prefills: the total
    assert m.attn_chunk_seqlens.tolist() == [2, 1, 0, 0]
    assert m.pcp_unpad_mask.shape == (32,) and m.pcp_allgather_restore_idx.shape == (32,)
    assert m.query_lens_pcp_full.tolist() == [8, 3, 0, 0]


def test_p1_has_no_head_tail_fields():
    cfg = PCPConfig(1, 0, 4, 64, dcp_size=2)
    batch = make_batch(cfg, [1, 9], [10, 0], [10, 9])
    _, m = attention_metadata(init_state(cfg), batch)
    assert all(getattr(m, name) is None for name in INDEX_NAMES + PER_REQUEST)
    assert m.num_computed_tokens_of_pcp_dcp[:2].tolist() == [[[6, 5]], [[0, 0]]]
    assert int(m.num_actual_tokens_pcp_padded) == 10


# ---- the oracle, on random batches ------------------------------------------------------------


@given(
    case=cases(),
    D=st.sampled_from([1, 2]),
    interleave=st.sampled_from([1, 64]),
    data=st.data(),
)
def test_attention_metadata_matches_the_oracle(case, D, interleave, data):
    P, n = case.P, case.num_reqs
    rank = data.draw(st.integers(0, P - 1), label="rank")
    dcp_rank = data.draw(st.integers(0, D - 1), label="dcp_rank")
    rank_as_data = data.draw(st.booleans(), label="rank_as_data")
    cfg = PCPConfig(
        P, rank, case.R, case.T, dcp_size=D, dcp_rank=dcp_rank, num_spec_tokens=case.spec,
        cp_kv_cache_interleave_size=interleave,
    )  # fmt: skip
    batch = make_batch(cfg, case.sched, case.comp, case.prompt)
    Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
    state = init_state(cfg, rank=rank) if rank_as_data else init_state(cfg)
    out_state, m = attention_metadata(state, batch)
    assert out_state is state
    orc = oracle_attention(P, rank, D, interleave, case.sched, case.comp, case.prompt, case.spec)
    N = orc.num_actual_tokens_pcp_padded // P

    assert m.num_computed_tokens_of_pcp_dcp.shape == (Rb, P, D)
    assert m.num_computed_tokens_of_pcp_dcp.tolist() == orc.num_computed_tokens_of_pcp_dcp + [
        [[0] * D] * P
    ] * (Rb - n)
    assert int(m.num_actual_tokens_pcp_padded) == orc.num_actual_tokens_pcp_padded
    assert m.pcp_unpad_mask.tolist() == orc.unpad_mask + [False] * (P * (Lb - N))
    restore = m.pcp_allgather_restore_idx[: P * N]
    assert (restore - (restore // Lb) * (Lb - N)).tolist() == orc.restore_index_compact
    assert m.query_lens_pcp_full.tolist() == case.sched + [0] * (Rb - n)
    assert int(m.max_query_len_pcp_full) == max(case.sched, default=0)
    assert int(m.num_decode_reqs) == orc.num_decode_reqs
    num_prefill = n - orc.num_decode_reqs
    assert int(m.num_prefill_reqs) == num_prefill
    if P == 1:
        assert all(getattr(m, name) is None for name in INDEX_NAMES + PER_REQUEST)
        return

    Cb = Lb // 2
    caps = {
        "q_head_idx": Cb,
        "q_tail_idx": Cb,
        "q_full_idx": 2 * Cb,
        "kv_with_q_head_nomask_idx": (P - 1) * Cb,
        "kv_with_q_head_mask_idx": Cb,
        "kv_with_q_tail_nomask_idx": (2 * P - 1) * Cb,
        "kv_with_q_tail_mask_idx": Cb,
        "kv_tail_proj_idx": 2 * P * Cb,
        "kv_with_q_head_attn_idx_in_tail": P * Cb,
        "kv_with_q_tail_attn_idx_in_tail": 2 * P * Cb,
    }
    for name in INDEX_NAMES:
        padded = getattr(m, name)
        expected = orc.index[name]
        assert padded.index.dtype == torch.int32 and padded.index.shape == (caps[name],), name
        assert padded.length.dtype == torch.int64 and int(padded.length) == len(expected), name
        assert padded.index.tolist() == expected + [0] * (caps[name] - len(expected)), name
    for name in PER_REQUEST:
        vec = getattr(m, name)
        expected = orc.per_request[name]
        assert vec.dtype == torch.int32 and vec.shape == (Rb,), name
        fill = 0 if name == "attn_chunk_seqlens" else (expected[-1] if expected else 0)
        assert vec.tolist() == expected + [fill] * (Rb - num_prefill), name


# ---- capturability -----------------------------------------------------------------------------

CFG = PCPConfig(4, 1, 8, 96, num_spec_tokens=1, dcp_size=2, cp_kv_cache_interleave_size=2)
COMPOSITIONS = {
    "decode-only": ([1, 2, 1, 1], [9, 40, 7, 3], [9, 30, 7, 3]),
    "mixed": ([2, 1, 33, 5, 17], [50, 8, 0, 12, 0], [40, 8, 33, 30, 17]),
    "prefill-only": ([21, 7, 40], [0, 16, 0], [21, 30, 40]),
    "empty-but-one": ([0, 0, 0, 9, 0], [0, 0, 0, 0, 0], [0, 0, 0, 9, 0]),
}
BUCKET = Bucket(8, 32)


def _batch(name, cfg=CFG, bucket=BUCKET):
    return make_batch(cfg, *COMPOSITIONS[name], bucket=bucket)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_fullgraph_compile_equals_eager_for_every_composition():
    compiled = torch.compile(attention_metadata, fullgraph=True, dynamic=False, backend="eager")
    for state in (init_state(CFG), init_state(CFG, rank=2)):
        for name in COMPOSITIONS:
            batch = _batch(name)
            assert tree_equal(compiled(state, batch), attention_metadata(state, batch)), name


def test_rank_as_data_traces_one_graph_and_vmaps_over_ranks():
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm

    compiled = torch.compile(attention_metadata, fullgraph=True, dynamic=False, backend=backend)
    batch = _batch("mixed")
    per_rank = []
    for r in range(CFG.pcp_size):
        out = compiled(init_state(CFG, rank=r), batch)[1]
        ref = attention_metadata(init_state(dataclasses.replace(CFG, pcp_rank=r)), batch)[1]
        assert tree_equal(out, ref)
        per_rank.append(ref)
    assert len(frames) == 1
    _, mapped = pcp_fn.all_ranks(attention_metadata, init_state(CFG, rank=0), batch)
    for r, ref in enumerate(per_rank):
        assert tree_equal(torch.utils._pytree.tree_map(lambda x, r=r: x[r], mapped), ref)


def test_runs_on_meta_tensors():
    for state in (init_state(CFG), init_state(CFG, rank=3)):
        batch = _batch("mixed")
        out = attention_metadata(to_device(state, "meta"), to_device(batch, "meta"))
        assert tree_meta(out) == tree_meta(attention_metadata(state, batch))
        assert all(x.device.type == "meta" for x in torch.utils._pytree.tree_leaves(out[1]))


def test_passes_the_sync_detector():
    for name in COMPOSITIONS:
        pcp_fn.assert_no_host_syncs(attention_metadata, init_state(CFG), _batch(name))
        pcp_fn.assert_no_host_syncs(attention_metadata, init_state(CFG, rank=1), _batch(name))


def test_shapes_and_op_count_do_not_depend_on_the_composition():
    state = init_state(CFG)
    metas = {name: tree_meta(attention_metadata(state, _batch(name))[1]) for name in COMPOSITIONS}
    assert len({repr(m) for m in metas.values()}) == 1
    counts = {name: pcp_fn.count_aten_ops(attention_metadata, state, _batch(name)) for name in COMPOSITIONS}
    assert len(set(counts.values())) == 1, counts
    # and the shapes do not depend on the rank either (every rank shares one graph)
    other = init_state(dataclasses.replace(CFG, pcp_rank=3))
    assert tree_meta(attention_metadata(other, _batch("mixed"))[1]) == metas["mixed"]


def test_does_not_touch_its_inputs():
    state, batch = init_state(CFG), _batch("mixed")
    before = (snapshot(batch), state.num_scheduled.clone())
    attention_metadata(state, batch)
    assert tree_equal(batch, before[0]) and torch.equal(state.num_scheduled, before[1])


def _random_batch(rng):
    n_dec = rng.randint(0, 4)
    sched = [rng.randint(1, 2) for _ in range(n_dec)]
    comp = [rng.randint(1, 300) for _ in range(n_dec)]
    prompt = [rng.randint(0, c) for c in comp]
    budget = CFG.max_num_tokens - sum(sched)
    for _ in range(rng.randint(0 if n_dec else 1, 8 - n_dec)):
        n = rng.randint(0, max(0, budget // 3))
        budget -= n
        sched.append(n)
        comp.append(rng.choice([0, rng.randint(1, 50)]))
        prompt.append(comp[-1] + n + rng.randint(0, 3))
    return make_batch(CFG, sched, comp, prompt)


def test_export_has_no_symbolic_shapes_and_replays_other_compositions():
    state = init_state(CFG)
    module = pcp_fn.graph.export(attention_metadata, state, _batch("mixed")).module()
    for name in COMPOSITIONS:
        assert tree_equal(module(state, _batch(name)), attention_metadata(state, _batch(name))), name


def test_graph_capture_replays_random_batches():
    rng = random.Random(5)
    state = init_state(CFG, rank=2)
    batches = [_random_batch(rng) for _ in range(30)]
    captured = pcp_fn.graph.capture(attention_metadata, state, batches[0], backend="eager")
    for b in batches:
        assert tree_equal(captured(state, b), attention_metadata(state, b))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_replay_equals_eager_without_syncs():
    dev = torch.device("cuda")
    rng = random.Random(9)
    state = init_state(CFG, dev)
    batches = [to_device(_random_batch(rng), dev) for _ in range(30)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        captured = pcp_fn.graph.capture(attention_metadata, state, batches[0])
        assert captured.kind == "cuda-graph"
        for b in batches:
            got = captured(state, b)
            torch.cuda.set_sync_debug_mode(0)
            assert tree_equal(got, attention_metadata(state, b))
            torch.cuda.set_sync_debug_mode("error")
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("P", [2, 4])
def test_hybrid_configs_get_the_dcs_metadata(P):
    kw = dict(num_spec_tokens=1, dcp_size=2)
    plain = pcp_fn.PCPConfig(P, 1, 8, 128, **kw)
    hybrid = pcp_fn.PCPConfig(P, 1, 8, 128, hybrid_attn=True, **kw)
    args = ([2, 1, 33, 17], [40, 8, 0, 5], [30, 8, 33, 40])
    batch = pcp_fn.make_batch(plain, *args)
    _, want = pcp_fn.attention_metadata(pcp_fn.init_state(plain), batch)
    state = pcp_fn.init_state(hybrid)
    _, got = pcp_fn.attention_metadata(state, pcp_fn.make_batch(hybrid, *args))
    assert tree_equal(got, want)
    pcp_fn.assert_no_host_syncs(pcp_fn.attention_metadata, state, pcp_fn.make_batch(hybrid, *args))
