"""pcp_fn against the slow per-request oracle on random batches (hypothesis)."""

import torch
from helpers import batch_for, config_for
from hypothesis import given
from hypothesis import strategies as st
from oracle import oracle_cp_local_seq_lens, oracle_step
from strategies import cases

import pcp_fn


@given(case=cases())
def test_update_tokens_and_consumers_match_the_oracle(case):
    orc = oracle_step(case.P, case.sched, case.comp, case.prompt, case.spec)
    n, P = case.num_reqs, case.P
    N = orc.num_tokens
    slots = torch.randperm(10_000, dtype=torch.int64)[: sum(case.sched)]
    for rank in range(P):
        cfg = config_for(case, rank)
        batch = batch_for(case, cfg, slot_mapping=slots)
        Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
        assert N <= Lb <= cfg.max_local_tokens and n <= Rb
        state, lay = pcp_fn.update_tokens(pcp_fn.init_state(cfg), batch)

        assert lay.is_decode[:n].tolist() == orc.is_decode and not lay.is_decode[n:].any()
        assert lay.pcp_tokens.tolist() == orc.pcp_tokens + [0] * (Rb - n)
        assert lay.num_pads.tolist() == orc.num_pads + [0] * (Rb - n)
        assert int(lay.num_tokens) == N
        assert int(lay.num_decode_reqs) == sum(orc.is_decode)
        assert int(lay.num_decode_tokens) == orc.num_decode_tokens
        assert lay.positions.tolist() == orc.positions[rank] + [0] * (Lb - N)
        owners = [i for i, k in enumerate(orc.pcp_tokens) for _ in range(k)]
        assert lay.request_index.tolist() == owners + [0] * (Lb - N)
        assert lay.unpad_mask.tolist() == orc.unpad_mask + [False] * (P * (Lb - N))
        assert lay.restore_index.tolist() == orc.restore_index(Lb) + [0] * (P * (Lb - N))

        assert state.bucket == batch.bucket
        _, logits = pcp_fn.get_logits_indices(state)
        assert logits.tolist() == orc.logits + [0] * (Rb - n)

        _, sm = pcp_fn.padded_slot_mapping(state, batch.slot_mapping)
        assert sm.tolist() == orc.padded_slot_mapping(slots.tolist(), -1) + [-1] * (P * (Lb - N))

        _, out = pcp_fn.step(pcp_fn.init_state(cfg), batch)
        absolute = [case.comp[i] + p for i, p in zip(owners, orc.positions[rank])]
        assert out.positions.tolist() == absolute + [0] * (Lb - N)
        qsl = [sum(orc.pcp_tokens[:i]) for i in range(n + 1)]
        assert out.query_start_loc.tolist() == qsl + [N] * (Rb - n)
        assert out.logits_indices.tolist() == logits.tolist()
        assert torch.equal(out.slot_mapping, sm)


@given(case=cases(), H=st.integers(1, 4))
def test_restore_hidden_states_puts_every_token_back(case, H):
    orc = oracle_step(case.P, case.sched, case.comp, case.prompt, case.spec)
    cfg = config_for(case, 0)
    batch = batch_for(case, cfg)
    Lb, P, N = batch.bucket.num_tokens, case.P, orc.num_tokens
    state, _ = pcp_fn.update_tokens(pcp_fn.init_state(cfg), batch)
    # every rank's fixed [Lb, H] buffer; row value encodes (rank, local row)
    local = torch.arange(P * Lb, dtype=torch.float64).reshape(P, Lb, 1).expand(P, Lb, H)
    _, restored = pcp_fn.restore_hidden_states(state, local.reshape(P * Lb, H))
    assert restored.shape == (P * Lb, H)
    expected = orc.restore_index(Lb)
    assert restored[: P * N, 0].long().tolist() == expected
    assert (restored[P * N :] == 0).all()
    # the logits indices land on each request's last real token
    _, logits = pcp_fn.get_logits_indices(state)
    for i, row in enumerate(logits[: case.num_reqs].tolist()):
        if case.sched[i] == 0:
            continue
        r, l = divmod(int(restored[row, 0]), Lb)
        assert orc.positions[r][l] == case.sched[i] - 1  # last token of request i (rank 0 copy for decodes)
        if orc.is_decode[i] or P == 1:
            assert r == 0


@given(
    seq=st.lists(st.integers(0, 700), min_size=1, max_size=8),
    pcp=st.sampled_from([1, 2, 3, 4, 8]),
    dcp=st.sampled_from([1, 2, 4]),
    interleave=st.sampled_from([1, 2, 16, 64, 128]),
)
def test_cp_local_seq_lens_matches_round_robin(seq, pcp, dcp, interleave):
    got = pcp_fn.cp_local_seq_lens(torch.tensor(seq), pcp, dcp, interleave)
    assert got.tolist() == oracle_cp_local_seq_lens(seq, pcp, dcp, interleave)
    assert (got.sum(dim=(1, 2)) == torch.tensor(seq)).all()


@given(case=cases(pcp_sizes=(2, 3, 4, 8)))
def test_capacity_holds_every_batch(case):
    # L = T + min(R, T) is an upper bound, checked against the worst batches too
    cfg = config_for(case, 0)
    worst_reqs = min(case.R, case.T)
    worst = pcp_fn.make_batch(cfg, [1] * worst_reqs, [0] * worst_reqs, [1] * worst_reqs)
    assert worst.bucket.num_tokens <= cfg.max_local_tokens
    assert 2 * worst_reqs <= cfg.max_local_tokens
    assert batch_for(case, cfg).bucket.num_tokens <= cfg.max_local_tokens
