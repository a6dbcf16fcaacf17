"""pcp_fn.attention_runs: every layout's local rows as varlen causal attention sequences.

Checked against the rows ``step`` returns (each real row's causal key limit is its own
position), against vLLM model runner V2's segments (``pcp_fn.mrv2.host``, the numpy twin
checked against vLLM in lockstep), and numerically: a varlen bottom-right causal attention
over the runs equals the tiny model's dense masked attention on every real row.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pcp_fn
import pcp_fn.testing as conformance
from pcp_fn import PCPConfig, init_state, make_batch
from pcp_fn.mrv2 import MRV2Config
from pcp_fn.mrv2.host import local_segments
from pcp_fn.testing import Batch, LayoutCheckError, batches

LAYOUTS = ("dcs", "hybrid", "mrv2", "mrv2-sharded")


def _config(name: str, P: int, R: int, T: int, spec: int = 0) -> PCPConfig:
    if name == "hybrid":
        return PCPConfig(P, 0, R, T, num_spec_tokens=spec, hybrid_attn=True)
    return PCPConfig(P, 0, R, T, num_spec_tokens=0 if name == "mrv2-sharded" else spec, layout=name)


def _runs(cfg: PCPConfig, b: Batch, rank: int):
    batch = make_batch(cfg, b.sched, b.comp, b.prompt, slot_mapping=range(sum(b.sched)))
    state, out = pcp_fn.step(init_state(cfg, rank=rank), batch)
    return out, pcp_fn.attention_runs(state)[1]


def test_worked_example_dualchunkswap_and_mrv2():
    b = Batch((1, 5, 8), (7, 0, 0), (3, 5, 8))
    _, runs = _runs(_config("dcs", 2, 4, 32), b, 0)
    assert int(runs.num_runs) == 5
    assert runs.query_start_loc[:7].tolist() == [0, 1, 3, 5, 7, 9, 9]
    assert set(runs.query_start_loc[6:].tolist()) == {9}
    assert runs.seq_lens[:6].tolist() == [8, 2, 5, 2, 8, 0]
    assert runs.request[:6].tolist() == [0, 1, 1, 2, 2, 0]
    assert runs.is_padding[:6].tolist() == [False, False, True, False, False, False]
    _, runs = _runs(_config("mrv2", 2, 4, 32), b, 0)
    assert int(runs.num_runs) == 4
    assert runs.query_start_loc[:6].tolist() == [0, 1, 3, 5, 7, 7]
    assert runs.seq_lens[:5].tolist() == [8, 2, 2, 8, 0]
    assert not runs.is_padding.any()


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(LAYOUTS),
    P=st.sampled_from([1, 2, 3, 4, 8]),
    spec=st.integers(0, 2),
    data=st.data(),
)
def test_each_real_row_sees_the_keys_up_to_its_own_position(name, P, spec, data):
    R, T = 6, 48
    cfg = _config(name, P, R, T, spec)
    b = data.draw(batches(R, T, cfg.num_spec_tokens))
    sched = np.asarray(b.sched + (0,), np.int64)
    comp = np.asarray(b.comp + (0,), np.int64)
    for rank in range(P):
        out, runs = _runs(cfg, b, rank)
        n_r = int(out.layout.num_tokens)
        req, offset = out.layout.request_index.numpy(), out.layout.positions.numpy()
        absolute = out.positions.numpy()
        qsl, keys = runs.query_start_loc.numpy().astype(np.int64), runs.seq_lens.numpy()
        m = int(runs.num_runs)
        assert qsl[0] == 0 and (np.diff(qsl[: m + 1]) > 0).all() and qsl[m] == n_r
        for j in range(m):
            rows = np.arange(qsl[j], qsl[j + 1])
            i = int(runs.request[j])
            assert (req[rows] == i).all()
            real = offset[rows] < sched[i]
            assert (real == (not runs.is_padding[j])).all()
            if runs.is_padding[j]:
                assert keys[j] == comp[i] + sched[i]
                continue
            # bottom-right causal: query k of the run sees keys < seq_len - q + k + 1
            assert (keys[j] - len(rows) + np.arange(len(rows)) == absolute[rows]).all()
            assert keys[j] <= comp[i] + sched[i]
        for j in range(m - 1):  # maximal: two neighbouring runs could not be one
            a, c = qsl[j + 1] - 1, qsl[j + 1]
            assert (
                runs.request[j] != runs.request[j + 1]
                or runs.is_padding[j] != runs.is_padding[j + 1]
                or offset[c] != offset[a] + 1
            )


@settings(max_examples=40, deadline=None)
@given(
    P=st.integers(1, 5),
    sched=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    num_decodes=st.integers(0, 3),
    shard=st.booleans(),
)
def test_mrv2_runs_are_vllm_model_runner_v2s_segments(P, sched, num_decodes, shard):
    """vLLM MRV2 gives each of a rank's segments its own local request row with seq_len =
    the segment's last position + 1; attention_runs gives the same sequences, with a rank's
    two adjacent chunks (rank P-1 holds chunks P-1 and P) as one run."""
    num_decodes = min(num_decodes, len(sched))
    sched = [min(n, 1) for n in sched[:num_decodes]] + sched[num_decodes:]
    comp = [5 if i < num_decodes else 3 * i for i in range(len(sched))]
    prompt = [5 if i < num_decodes else c + max(n, 1) for i, (n, c) in enumerate(zip(sched, comp))]
    R, T = len(sched), max(sum(sched), 1)
    cfg = PCPConfig(P, 0, R, T, layout="mrv2-sharded" if shard else "mrv2")
    b = Batch(tuple(sched), tuple(comp), tuple(prompt))
    for rank in range(P):
        out, runs = _runs(cfg, b, rank)
        is_decode = out.layout.is_decode[:R].numpy()
        mrv2 = MRV2Config(P, rank, R, T, shard_decode_requests=shard)
        seg = local_segments(mrv2, rank, np.array(sched), ~is_decode)
        qsl = runs.query_start_loc.numpy().astype(np.int64)
        m = int(runs.num_runs)
        ends = np.cumsum(seg.length)
        assert set(qsl[1 : m + 1].tolist()) <= set(ends.tolist())  # runs merge whole segments
        for i, o, n, end in zip(seg.request, seg.offset, seg.length, ends):
            j = int(np.searchsorted(qsl[1 : m + 1], end))  # the run holding the segment's last row
            if qsl[j + 1] == end:  # the run ends with this segment: vLLM's seq_len
                assert int(runs.seq_lens[j]) == comp[i] + o + n and int(runs.request[j]) == i


def _varlen_causal(q, k_cache, v_cache, runs, block_rows):
    """A varlen bottom-right causal attention over the runs, one run at a time (the oracle of a
    FlashAttention ``flash_attn_varlen_func(causal=True)`` call with ``seqused_k``)."""
    out = torch.zeros_like(q)
    qsl = runs.query_start_loc.tolist()
    for j in range(int(runs.num_runs)):
        a, c, n_k = qsl[j], qsl[j + 1], int(runs.seq_lens[j])
        keys = k_cache[block_rows[int(runs.request[j])], :n_k]
        values = v_cache[block_rows[int(runs.request[j])], :n_k]
        scores = q[a:c] @ keys.T / math.sqrt(q.shape[1])
        limit = n_k - (c - a) + torch.arange(c - a)[:, None]  # query k sees keys <= limit
        scores = scores.masked_fill(torch.arange(n_k)[None, :] > limit, float("-inf"))
        out[a:c] = torch.nan_to_num(torch.softmax(scores, -1)) @ values
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_varlen_kernel_over_the_runs_is_the_models_attention(name):
    """The dense masked attention pcp_fn.sim's tiny model runs (keys at positions <= the
    query's, within the request's context) equals the varlen kernel over the runs."""
    P, R, T = 4, 6, 64
    cfg = _config(name, P, R, T, spec=1)  # "mrv2-sharded" refuses spec tokens: one-token decodes there
    b = Batch((1, 1 + cfg.num_spec_tokens, 0, 13, 29), (9, 4, 0, 0, 17), (5, 4, 1, 13, 46))
    g = torch.Generator().manual_seed(0)
    context = [c + n for c, n in zip(b.comp, b.sched)]
    k_cache = torch.randn(len(b.sched), max(context), 8, generator=g, dtype=torch.float64)
    v_cache = torch.randn(len(b.sched), max(context), 8, generator=g, dtype=torch.float64)
    for rank in range(P):
        out, runs = _runs(cfg, b, rank)
        n_r = int(out.layout.num_tokens)
        q = torch.randn(out.positions.shape[0], 8, generator=g, dtype=torch.float64)
        got = _varlen_causal(q, k_cache, v_cache, runs, list(range(len(b.sched))))
        req, pos = out.layout.request_index, out.positions
        for row in range(n_r):
            i = int(req[row])
            if int(out.layout.positions[row]) >= b.sched[i]:
                continue  # a pad row: dropped by the restore
            t = torch.arange(context[i])
            visible = t <= pos[row]
            scores = (q[row] @ k_cache[i, : context[i]].T / math.sqrt(8)).masked_fill(~visible, float("-inf"))
            want = torch.softmax(scores, -1) @ v_cache[i, : context[i]]
            torch.testing.assert_close(got[row], want, rtol=0, atol=1e-12)


def test_the_conformance_rule_catches_a_wrong_key_count(monkeypatch):
    """check_layout's attention-runs rule is not vacuous: one key too many fails it."""
    real = pcp_fn.attention_runs

    def off_by_one(state):
        state, runs = real(state)
        bumped = runs.seq_lens.clone()
        bumped[0] += 1
        return state, type(runs)(**{**runs.__dict__, "seq_lens": bumped})

    monkeypatch.setattr(conformance, "attention_runs", off_by_one)
    cfg = PCPConfig(2, 0, 4, 32)
    with pytest.raises(LayoutCheckError, match="attention runs"):
        conformance.check_batch_exact(cfg, Batch((1, 5, 8), (7, 0, 0), (3, 5, 8)))


def test_attention_runs_vmap_over_ranks_equals_each_rank():
    cfg = _config("mrv2", 3, 6, 48)
    batch = make_batch(cfg, [1, 20, 7], [4, 0, 9], [3, 20, 16])
    state, _ = pcp_fn.update_tokens(init_state(cfg, rank=0), batch)
    _, stacked = pcp_fn.all_ranks(pcp_fn.attention_runs, state)
    for rank in range(3):
        own, _ = pcp_fn.update_tokens(init_state(cfg, rank=rank), batch)
        _, runs = pcp_fn.attention_runs(own)
        for f in ("num_runs", "query_start_loc", "seq_lens", "request", "is_padding"):
            assert torch.equal(getattr(stacked, f)[rank], getattr(runs, f)), f
