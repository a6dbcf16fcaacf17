"""The hybrid-attention layout (``hybrid_attn=True``): goldens, oracle, capturability, bad input."""

import dataclasses

import pytest
import torch
from helpers import snapshot, to_device, tree_equal, tree_meta
from hypothesis import given
from hypothesis import strategies as st
from oracle_hybrid import oracle_draft_split, oracle_hybrid
from strategies import cases

import pcp_fn
from pcp_fn import Bucket, PCPConfig, init_state, make_batch, update_tokens


def _hybrid(P, rank, sched, comp, prompt, *, spec=0, R=8, T=64, bucket=None):
    cfg = PCPConfig(P, rank, R, T, num_spec_tokens=spec, hybrid_attn=True)
    batch = make_batch(cfg, sched, comp, prompt, bucket=bucket, slot_mapping=range(sum(sched)))
    state, lay = update_tokens(init_state(cfg), batch)
    return cfg, batch, state, lay


def _ref_rows(values, Lb, stride):
    """Our gathered rows ``rank * Lb + row`` written with vllm-ascend's rank stride."""
    return [v // Lb * stride + v % Lb for v in values]


# ---------------------------------------------------------------- goldens
def test_vllm_ascend_hybrid_golden_two_fresh_prefills():
    # vllm-ascend tests: P=2 rank 0, fresh prefills [3, 5]; with L_b = 6 = N_dcs
    _, batch, state, lay = _hybrid(2, 0, [3, 5], [0, 0], [3, 5], R=2, bucket=Bucket(2, 6))
    assert isinstance(lay, pcp_fn.HybridLayout) and isinstance(lay, pcp_fn.TokenLayout)
    assert lay.pcp_tokens.tolist() == [2, 3]
    assert lay.positions.tolist()[:5] == [0, 1, 0, 1, 2]
    assert lay.pcp_tokens_padded.tolist() == [2, 4]
    assert int(lay.num_tokens) == 5 and int(lay.num_tokens_padded) == 6
    assert int(lay.max_num_tokens_across_pcp) == 5
    assert int(lay.pcp_padded_tokens_fla) == 0 and int(lay.total_pcp_padding_tokens_fla) == 2
    assert int(lay.enter_fa_len) == 8
    # vllm-ascend's rank stride is M = 5, ours L_b = 6
    assert _ref_rows(lay.enter_fa_restore_idx[:8].tolist(), 6, 5) == [0, 1, 5, 2, 3, 4, 6, 7]
    assert lay.enter_fa_restore_idx.tolist() == [0, 1, 6, 2, 3, 4, 7, 8, 0, 0, 0, 0]
    assert lay.fa_padding_restore_idx.tolist() == [0, 1, 2, 8, 3, 4, 5, 6, 7, 8, 8, 8]
    assert int(lay.exit_fa_len) == 5 and lay.exit_fa_scatter_idx[:5].tolist() == [0, 6, 2, 3, 8]
    assert int(lay.fa_query_len) == 6 and lay.fa_query_idx.tolist() == [0, 3, 4, 5, 10, 11]
    assert lay.restore_index.tolist() == [0, 6, 7, 1, 2, 3, 8, 9, 10, 11, 4, 5]
    # slot mapping (vllm-ascend's test: independent KV-group buffers, same values)
    _, sm = pcp_fn.padded_slot_mapping(state, batch.slot_mapping)
    assert sm.tolist() == [0, 1, 2, -1, 3, 4, 5, 6, 7, -1, -1, -1]


def test_vllm_ascend_hybrid_logits_include_decode_padding():
    _, _, state, _ = _hybrid(2, 0, [1, 1, 3, 5], [16, 17, 0, 0], [16, 17, 3, 5])
    assert pcp_fn.get_logits_indices(state)[1].tolist() == [1, 3, 6, 11]


@pytest.mark.parametrize(
    ("P", "sched", "num_decodes", "expected"),
    [
        (2, [1, 1], 2, [1, 2]),
        (2, [3, 5], 0, [3, 8]),
        (2, [1, 1, 3, 5], 2, [1, 2, 7, 12]),
        (4, [1, 1, 5, 9], 2, [1, 2, 13, 22]),
        (2, [7], 0, [7]),
        (2, [8], 0, [8]),
    ],
)
def test_adjust_cu_num_scheduled_tokens_goldens(P, sched, num_decodes, expected):
    # vllm-ascend's test: decodes have computed == scheduled, the runner's cu of the original counts
    comp = [n if i < num_decodes else 0 for i, n in enumerate(sched)]
    _, _, state, lay = _hybrid(P, 0, sched, comp, list(sched), bucket=Bucket(len(sched), 64))
    assert int(lay.num_decode_reqs) == num_decodes
    cu = torch.cumsum(torch.tensor(sched, dtype=torch.int32), 0).to(torch.int32)
    _, got = pcp_fn.adjust_cu_num_scheduled_tokens(state, cu)
    assert got.tolist() == expected and got.dtype == torch.int32


def test_vllm_ascend_comment_single_prefill_3_2():
    # vllm-ascend's comments: one prefill of 5 at P=2 -> per-rank counts [[3, 2]]
    expected = {0: ([3], [0, 1, 2]), 1: ([2], [3, 4])}
    for rank, (tokens, positions) in expected.items():
        _, batch, _, lay = _hybrid(2, rank, [5], [0], [5], R=1, bucket=Bucket(1, 4))
        assert lay.pcp_tokens.tolist() == tokens
        assert lay.positions.tolist()[: len(positions)] == positions
        assert int(lay.max_num_tokens_across_pcp) == 3
        # vllm-ascend's comment: enter index [0, 1, 2, 3, 4] with rank stride M = 3 (ours L_b = 4)
        assert _ref_rows(lay.enter_fa_restore_idx[:5].tolist(), 4, 3) == [0, 1, 2, 3, 4]
        assert int(lay.total_pcp_padding_tokens_fla) == 1


def test_vllm_ascend_comment_two_prefills_at_p4():
    # vllm-ascend's comments: prefills [7, 5] at P=4 -> [[2, 2, 2, 1], [2, 1, 1, 1]]
    expected = {0: [0, 1, 0, 1], 1: [2, 3, 2], 2: [4, 5, 3], 3: [6, 4]}
    tokens = {0: [2, 2], 1: [2, 1], 2: [2, 1], 3: [1, 1]}
    for rank in range(4):
        _, batch, _, lay = _hybrid(4, rank, [7, 5], [0, 0], [7, 5], R=2, bucket=Bucket(2, 4))
        assert lay.pcp_tokens.tolist() == tokens[rank]
        assert lay.positions.tolist()[: len(expected[rank])] == expected[rank]
        assert int(lay.pcp_padded_tokens_fla) == 4 - sum(tokens[rank])
        M = 4  # = L_b here, so the enter index is vllm-ascend's value for value
        assert int(lay.max_num_tokens_across_pcp) == M
        assert lay.enter_fa_restore_idx.tolist()[:7] == [0, 1, M, M + 1, 2 * M, 2 * M + 1, 3 * M]
        assert lay.enter_fa_restore_idx.tolist()[7:12] == [2, 3, M + 2, 2 * M + 2, 3 * M + 1]


def test_decode_order_token_major_without_spec_rank_major_with_spec():
    # two decodes and a prefill of 4 at P=2: D=2, M = 2 + 2
    for spec, decode_rows in ((0, [0, 4, 1, 5]), (1, [0, 1, 4, 5])):
        _, _, _, lay = _hybrid(2, 0, [1, 1, 4], [5, 5, 0], [5, 5, 4], spec=spec, bucket=Bucket(4, 4))
        assert lay.enter_fa_restore_idx[:8].tolist() == decode_rows + [2, 3, 6, 7]
        assert lay.fa_padding_restore_idx.tolist() == list(range(8))  # no pads: vllm-ascend's None
        assert lay.exit_fa_scatter_idx[:2].tolist() == [
            0,
            4,
        ]  # tokens 0, 1: DCS chunk 0 (r0 row 0), 1 (r1 row 0)


def _draft_split(P, rank, lens, ids, hidden):
    """The drafter's first-pass split of an all-prefill batch ``lens`` (hybrid: linear slices)."""
    cfg = PCPConfig(P, rank, 8, 256, hybrid_attn=True)
    batch = make_batch(cfg, lens, [0] * len(lens), lens)
    state, _ = update_tokens(init_state(cfg), batch)
    Fb, Lb = pcp_fn.protocol.batch.token_rows(cfg, batch.bucket), batch.bucket.num_tokens
    full = torch.zeros(Fb, dtype=ids.dtype)
    full[: ids.shape[0]] = ids
    # without decodes the restored FA-order rows are the prefill tokens in scheduler order
    restored = torch.zeros(P * Lb, *hidden.shape[1:], dtype=hidden.dtype)
    restored[: hidden.shape[0]] = hidden
    return pcp_fn.split_prefill_for_draft(state, full, restored)[1]


def test_draft_split_docstring_example():
    ids = torch.arange(1, 9, dtype=torch.int64)  # a b c | d e f g h
    hidden = ids.to(torch.float32).unsqueeze(1).expand(8, 2)
    out = _draft_split(2, 1, [3, 5], ids, hidden)
    assert out.input_ids[:8].tolist() == [3, 0, 8, 0, 0, 0, 0, 0]
    assert out.hidden_states[:8, 0].tolist() == [3.0, 0, 8, 0, 0, 0, 0, 0]
    assert out.seq_lens[:2].tolist() == [2, 4] and out.cu_num_tokens[:3].tolist() == [0, 2, 6]
    assert int(out.num_tokens) == 6 and int(out.max_query_len) == 4 and int(out.num_reqs) == 2


# ---------------------------------------------------------------- oracle
def _check_against_oracle(case, rank, slots):
    P, n = case.P, case.num_reqs
    cfg = PCPConfig(P, rank, case.R, case.T, num_spec_tokens=case.spec, hybrid_attn=True)
    batch = make_batch(cfg, case.sched, case.comp, case.prompt, slot_mapping=slots)
    Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
    state, lay = update_tokens(init_state(cfg), batch)
    orc = oracle_hybrid(P, case.sched, case.comp, case.prompt, case.spec)
    D = orc.num_decode_tokens
    lin = orc.linear[rank]
    N = len(lin)
    N_dcs = len(orc.dcs_rows[rank])
    assert orc.max_tokens <= N_dcs <= Lb <= cfg.max_local_tokens

    assert lay.pcp_tokens.tolist() == orc.linear_tokens[rank] + [0] * (Rb - n)
    assert int(lay.num_tokens) == N
    assert lay.positions.tolist() == orc.linear_positions[rank] + [0] * (Lb - N)
    assert lay.request_index.tolist() == [i for i, _ in lin] + [0] * (Lb - N)
    assert int(lay.num_decode_tokens) == D and lay.is_decode[:n].tolist() == orc.decode
    assert lay.unpad_mask.tolist() == orc.dcs_unpad_mask + [False] * (P * (Lb - N_dcs))
    assert int(lay.num_tokens_padded) == N_dcs
    assert lay.pcp_tokens_padded.sum().item() == N_dcs
    M = orc.max_tokens
    assert int(lay.max_num_tokens_across_pcp) == M
    assert int(lay.pcp_padded_tokens_fla) == M - N
    assert int(lay.total_pcp_padding_tokens_fla) == P * (M - D) - (sum(case.sched) - D)
    enter = orc.enter_fa(Lb)
    fa_len = len(enter)
    assert int(lay.enter_fa_len) == fa_len
    assert lay.enter_fa_restore_idx.tolist() == enter + [0] * (P * Lb - fa_len)
    assert lay.fa_padding_restore_idx.tolist() == orc.fa_padding + [fa_len] * (P * (Lb - N_dcs))
    query = orc.fa_query[rank]
    assert int(lay.fa_query_len) == len(query)
    assert lay.fa_query_idx.tolist() == query + [0] * (Lb - len(query))
    exit_ = orc.exit_fa(rank, Lb)
    assert int(lay.exit_fa_len) == len(exit_)
    assert lay.exit_fa_scatter_idx.tolist() == exit_ + [0] * (Lb - len(exit_))

    _, logits = pcp_fn.get_logits_indices(state)
    assert logits.tolist() == orc.logits + [0] * (Rb - n)
    cu = torch.cumsum(lay.pcp_tokens, 0)  # [R_b]: the bucket's request rows
    _, adjusted = pcp_fn.adjust_cu_num_scheduled_tokens(state, cu)
    assert adjusted[:n].tolist() == orc.adjust_cu(cu[:n].tolist())
    _, sm = pcp_fn.padded_slot_mapping(state, batch.slot_mapping)
    from oracle import oracle_step

    dcs = oracle_step(P, case.sched, case.comp, case.prompt, case.spec)
    assert sm.tolist() == dcs.padded_slot_mapping(slots.tolist(), -1) + [-1] * (P * (Lb - N_dcs))

    _, out = pcp_fn.step(init_state(cfg), batch)
    assert tree_equal(out.layout, lay)
    assert out.positions.tolist() == [case.comp[i] + t for i, t in lin] + [0] * (Lb - N)
    starts = [sum(orc.linear_tokens[rank][:i]) for i in range(n + 1)]
    assert out.query_start_loc.tolist() == starts + [N] * (Rb - n)
    assert out.logits_indices.tolist() == logits.tolist()
    assert torch.equal(out.slot_mapping, sm)
    return cfg, state, orc, Lb


@given(case=cases())
def test_hybrid_layout_matches_the_oracle_on_every_rank(case):
    slots = torch.randperm(10_000, dtype=torch.int64)[: sum(case.sched)]
    for rank in range(case.P):
        _check_against_oracle(case, rank, slots)


@given(case=cases(), H=st.integers(1, 3))
def test_restore_puts_every_token_in_fa_order(case, H):
    P = case.P
    cfg, state, orc, Lb = _check_against_oracle(case, 0, torch.arange(sum(case.sched)))
    # each rank's fixed [Lb, H] buffer: linear rows, then junk; row value encodes (rank, row)
    gathered = torch.arange(P * Lb, dtype=torch.float64).unsqueeze(1).expand(P * Lb, H)
    _, restored = pcp_fn.restore_hidden_states(state, gathered)
    assert restored.shape == (P * Lb, H)
    order = orc.fa_order()
    for k, (q, tok) in enumerate(order):
        r, row = divmod(int(restored[k, 0]), Lb)
        assert r == q and orc.linear[r][row] == tok
    assert (restored[len(order) :] == 0).all()
    # without speculative tokens (and with no empty decode, which vllm-ascend's per-request
    # decode padding miscounts) the logits rows hold each request's last token
    if not case.spec and all(n for n, d in zip(case.sched, orc.decode) if d):
        for i, row in enumerate(pcp_fn.get_logits_indices(state)[1][: case.num_reqs].tolist()):
            if case.sched[i]:
                assert order[row][1] == (i, case.sched[i] - 1)


@given(
    P=st.sampled_from([1, 2, 3, 4, 8]),
    data=st.data(),
    lens=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    H=st.integers(1, 3),
)
def test_draft_split_matches_the_oracle(P, data, lens, H):
    rank = data.draw(st.integers(0, P - 1))
    S = sum(lens)
    ids = torch.randint(1, 1000, (S,))
    hidden = torch.randn(S, H, dtype=torch.float64)
    out = _draft_split(P, rank, lens, ids, hidden)
    orc = oracle_draft_split(P, rank, lens, ids.tolist(), hidden.tolist())
    k, n = len(orc.input_ids), len(lens)
    rows = out.input_ids.shape[0]
    assert int(out.num_tokens) == k
    assert out.input_ids.tolist() == orc.input_ids + [0] * (rows - k)
    assert out.hidden_states[:k].tolist() == orc.hidden and (out.hidden_states[k:] == 0).all()
    assert out.seq_lens[:n].tolist() == orc.seq_lens and not out.seq_lens[n:].any()
    assert out.cu_num_tokens[: n + 1].tolist() == [sum(orc.seq_lens[:i]) for i in range(n + 1)]
    assert int(out.max_query_len) == max(orc.seq_lens)


# ---------------------------------------------------------------- capturability
CFG = PCPConfig(4, 1, 8, 96, num_spec_tokens=1, hybrid_attn=True)
BUCKET = Bucket(8, 64)
COMPOSITIONS = {
    "decode-only": ([1, 2, 1, 1], [9, 40, 7, 3], [9, 30, 7, 3]),
    "mixed": ([2, 1, 33, 5, 17], [50, 8, 0, 12, 0], [40, 8, 33, 30, 17]),
    "prefill-only": ([21, 7, 40], [0, 16, 0], [21, 30, 40]),
    "empty-but-one": ([0, 0, 0, 9, 0], [0, 0, 0, 0, 0], [0, 0, 0, 9, 0]),
}


def _ops(state, batch):
    updated, _ = update_tokens(state, batch)
    Lb = batch.bucket.num_tokens
    cu = torch.cumsum(batch.num_scheduled, 0).to(torch.int32)
    return [
        (update_tokens, (state, batch)),
        (pcp_fn.get_logits_indices, (updated,)),
        (pcp_fn.padded_slot_mapping, (updated, batch.slot_mapping)),
        (pcp_fn.restore_hidden_states, (updated, torch.randn(CFG.pcp_size * Lb, 4))),
        (pcp_fn.adjust_cu_num_scheduled_tokens, (updated, cu)),
        (pcp_fn.step, (state, batch)),
    ]


def _batch(name, bucket=BUCKET):
    sched = COMPOSITIONS[name][0]
    return make_batch(CFG, *COMPOSITIONS[name], bucket=bucket, slot_mapping=range(1000, 1000 + sum(sched)))


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_every_hybrid_op_traces_fullgraph_and_matches_eager(fresh_dynamo):
    batches = [_batch(name) for name in COMPOSITIONS]
    for i, (fn, _) in enumerate(_ops(init_state(CFG), batches[0])):
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend="eager")
        for batch in batches:  # one bucket: one graph serves every composition
            args = _ops(init_state(CFG), batch)[i][1]
            assert tree_equal(compiled(*args), fn(*args)), fn.__name__


def test_every_hybrid_op_runs_on_meta_tensors_and_passes_the_sync_detector():
    for name in COMPOSITIONS:
        for fn, args in _ops(init_state(CFG), _batch(name)):
            pcp_fn.assert_no_host_syncs(fn, *args)
    for fn, args in _ops(init_state(CFG), _batch("mixed")):
        out = fn(*to_device(args, "meta"))
        assert tree_meta(out) == tree_meta(fn(*args)), fn.__name__
        leaves = [x for x in torch.utils._pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
        assert all(x.device.type == "meta" for x in leaves)


def test_hybrid_shapes_and_op_counts_do_not_depend_on_the_composition():
    metas, counts = {}, {}
    for name in COMPOSITIONS:
        ops = _ops(init_state(CFG), _batch(name))
        metas[name] = [tree_meta(fn(*args)) for fn, args in ops]
        counts[name] = [pcp_fn.count_aten_ops(fn, *args) for fn, args in ops]
    assert all(m == metas["mixed"] for m in metas.values())
    assert all(c == counts["mixed"] for c in counts.values()), counts
    s0 = init_state(CFG)
    assert all(tree_meta(update_tokens(s0, _batch(name))[0])[1] == tree_meta(s0)[1] for name in COMPOSITIONS)


def test_hybrid_step_vmaps_over_ranks_and_traces_one_graph_for_all(fresh_dynamo):
    batch = _batch("mixed")
    state = init_state(CFG, rank=0)
    mapped = pcp_fn.all_ranks(pcp_fn.step, state, batch)[1]
    frames = []
    compiled = torch.compile(
        pcp_fn.step, fullgraph=True, dynamic=False, backend=lambda gm, _: frames.append(gm) or gm
    )
    for r in range(CFG.pcp_size):
        static = pcp_fn.step(init_state(dataclasses.replace(CFG, pcp_rank=r)), batch)[1]
        assert tree_equal(torch.utils._pytree.tree_map(lambda x, r=r: x[r], mapped), static)
        assert tree_equal(compiled(init_state(CFG, rank=r), batch)[1], static)
    assert len(frames) == 1


def test_hybrid_capture_replays_every_composition(fresh_dynamo):
    state = init_state(CFG)
    captured = pcp_fn.graph.capture(pcp_fn.step, state, _batch("mixed"), backend="eager")
    for name in COMPOSITIONS:
        for bucket in (BUCKET, None):
            batch = _batch(name, bucket)
            assert tree_equal(captured(state, batch), pcp_fn.step(state, batch))


def test_hybrid_step_exports_without_symbolic_shapes(fresh_dynamo):
    state = init_state(CFG)
    module = pcp_fn.graph.export(pcp_fn.step, state, _batch("mixed")).module()
    for name in COMPOSITIONS:
        batch = _batch(name)
        assert tree_equal(module(state, batch), pcp_fn.step(state, batch))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hybrid_cuda_graph_replay_equals_eager_without_syncs():
    dev = torch.device("cuda")
    state = init_state(CFG, dev)
    batches = [to_device(_batch(name), dev) for name in COMPOSITIONS]
    torch.cuda.set_sync_debug_mode("error")
    try:
        captured = pcp_fn.graph.capture(pcp_fn.step, state, batches[0])
        assert captured.kind == "cuda-graph"
        for b in batches:
            got = captured(state, b)
            torch.cuda.set_sync_debug_mode(0)
            assert tree_equal(got, pcp_fn.step(state, b))
            torch.cuda.set_sync_debug_mode("error")
    finally:
        torch.cuda.set_sync_debug_mode(0)


# ---------------------------------------------------------------- bad input
def test_hybrid_make_batch_rejects_bad_input_like_the_dcs_one():
    with pytest.raises(ValueError, match=r"request 1 is a decode .* after prefill request 0"):
        make_batch(CFG, [5, 1], [0, 9], [5, 9])
    with pytest.raises(ValueError, match=r"sums to 97 tokens; max_num_tokens is 96"):
        make_batch(CFG, [90, 7], [0, 0], [90, 7])
    with pytest.raises(ValueError, match=r"bucket.num_tokens=4 must hold the batch.s 8 local tokens"):
        make_batch(CFG, [20, 1], [0, 0], [20, 1], bucket=Bucket(8, 4))


def test_hybrid_ops_reject_bad_shapes():
    state, _ = update_tokens(init_state(CFG), _batch("mixed"))
    with pytest.raises(ValueError, match=r"cu_num_scheduled_tokens must be \[8\] \(the state's bucket"):
        pcp_fn.adjust_cu_num_scheduled_tokens(state, torch.zeros(9, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_num_scheduled_tokens must be \[8\]"):
        pcp_fn.adjust_cu_num_scheduled_tokens(state, torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"gathered must stack the 4 ranks' \[64, ...\] buffers"):
        pcp_fn.restore_hidden_states(state, torch.zeros(10, 3))
    split = pcp_fn.split_prefill_for_draft
    ids, hid = torch.zeros(96, dtype=torch.int64), torch.zeros(4 * 64, 2)
    with pytest.raises(ValueError, match=r"input_ids_full"):
        split(state, torch.zeros(8, dtype=torch.int64), hid)
    with pytest.raises(ValueError, match=r"hidden_states"):
        split(state, ids, torch.zeros(8, 2))


def test_hybrid_ops_do_not_mutate_their_inputs():
    for fn, args in _ops(init_state(CFG), _batch("mixed")):
        before = snapshot(args)
        fn(*args)
        assert tree_equal(args, before), fn.__name__
