"""pcp_fn.mrv2.host, the numpy twin of the MRV2 segment rules, against the oracle's pieces."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from oracle_mrv2 import balanced_cuts, dcp_rank0_share, rank_pieces

from pcp_fn import mrv2
from pcp_fn.mrv2 import MRV2Config, host, rank_counts, splits

SPLITS = (mrv2.HEAD_TAIL, mrv2.ROUND_ROBIN, mrv2.COST_BALANCED)


@st.composite
def batches(draw):
    P = draw(st.sampled_from([1, 2, 3, 4, 8]))
    mode = draw(st.sampled_from(["replicated", "sharded", "dcp"]))
    n = draw(st.integers(0, 12))
    sched = [draw(st.sampled_from([0, 1, 2, 3, draw(st.integers(1, 70))])) for _ in range(n)]
    prefilling = [draw(st.booleans()) for _ in range(n)]
    split = mrv2.HEAD_TAIL if mode == "dcp" else draw(st.sampled_from(SPLITS))
    computed = [draw(st.integers(0, 300)) for _ in range(n)]
    cfg = MRV2Config(
        P,
        0,
        16,
        1024,
        shard_decode_requests=mode == "sharded",
        dcp_size=2 if mode == "dcp" else 1,
        split=split,
    )
    return cfg, np.array(sched, np.int32), np.array(prefilling, np.bool_), np.array(computed, np.int64)


@given(batches())
def test_local_segments_are_the_oracles_pieces(batch):
    cfg, sched, prefilling, computed = batch
    ranks = rank_pieces(
        cfg.pcp_size,
        sched.tolist(),
        prefilling.tolist(),
        cfg.shard_decode_requests,
        cfg.dcp_size,
        cfg.split.name,
        computed.tolist(),
    )
    starts = np.concatenate([[0], np.cumsum(sched)])
    for q, pieces in enumerate(ranks):
        seg = host.local_segments(cfg, q, sched, prefilling, computed)  # a few requests: Python integers
        with mock.patch.object(host, "FEW_REQUESTS", -1):  # numpy: split prefills one by one
            by_prefill = host.local_segments(cfg, q, sched, prefilling, computed)
            with mock.patch.object(host, "FEW_PREFILLS", -1):  # and as one [P, S] table
                table = host.local_segments(cfg, q, sched, prefilling, computed)
        for other in (by_prefill, table):
            assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(seg, other))
        assert seg.request.tolist() == [p.req for p in pieces]
        assert seg.offset.tolist() == [p.tokens[0] - starts[p.req] for p in pieces]
        assert seg.length.tolist() == [len(p.tokens) for p in pieces]
        assert seg.per_rank_num_tokens.tolist() == [sum(len(p.tokens) for p in ps) for ps in ranks]
        assert seg.per_rank_num_reqs.tolist() == [len(ps) for ps in ranks]
    expected = (seg.per_rank_num_tokens.tolist(), seg.per_rank_num_reqs.tolist())
    for few in (host.FEW_PREFILLS, -1):  # split prefills one by one, and as one [2P, S] table
        with mock.patch.object(host, "FEW_PREFILLS", few):
            tokens, rows = rank_counts(cfg, sched, prefilling, computed)
            largest = host.largest_rank(cfg, sched.astype(np.int64), prefilling, int(sched.sum()), computed)
            bound = host.largest_rank(cfg, sched.astype(np.int64), prefilling, int(sched.sum()))
        assert (tokens.tolist(), rows.tolist()) == expected
        assert largest == ((max(expected[0]), max(expected[1])) if sched.size else (0, 0))
        # without the contexts (vLLM's dispatch): a bound, exact for a split that reads none
        assert bound[0] >= largest[0] and bound[1] >= largest[1]
        assert bound == largest or cfg.split.reads_context


@given(st.integers(0, 5000), st.integers(0, 1 << 20), st.sampled_from([1, 2, 3, 4, 8]))
def test_cost_balanced_cuts_are_the_scan_and_no_context_widens_a_rank(n, k, P):
    """The float-guessed cuts equal the oracle's scan (small n), and no run is longer than the
    bound on every context (what get_num_tokens_for_dispatch answers)."""
    q = np.arange(P, dtype=np.int64)[:, None]
    first, length = splits.COST_BALANCED.runs(np.array([n]), np.array([k]), q, P)
    if n <= 300:
        cuts = balanced_cuts(n, k, P)
        assert first[:, 0, 0].tolist() == cuts[:-1] and length[:, 0, 0].tolist() == np.diff(cuts).tolist()
    assert length.sum() == n and not length[..., 1].any()
    widest = splits.COST_BALANCED.widest_without_context(np.array([n]), P)
    assert length.max() <= widest[0]


def test_the_splits_docstring_examples():
    q = np.arange(2)[:, None]
    n, k = np.array([10]), np.array([0])
    assert splits.HEAD_TAIL.runs(n, k, q, 2)[0][:, 0].tolist() == [[0, 9], [3, 6]]
    assert splits.ROUND_ROBIN.runs(n, k, q, 2)[0][:, 0].tolist() == [[0, 6], [3, 9]]
    assert splits.ROUND_ROBIN.runs(n, k, q, 2)[1][:, 0].tolist() == [[3, 3], [3, 1]]
    assert splits.COST_BALANCED.runs(n, k, q, 2)[1][:, 0].tolist() == [[6, 0], [4, 0]]
    four = splits.COST_BALANCED.runs(np.array([256]), k, np.arange(4)[:, None], 4)[1]
    assert four[:, 0, 0].tolist() == [127, 53, 41, 35]


@given(st.lists(st.integers(0, 300), max_size=8), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 16]))
def test_dcp_rank0_share(seq_lens, dcp, interleave):
    got = host.dcp_rank0_seq_lens(np.array(seq_lens, np.int64), dcp, interleave)
    assert got.tolist() == [dcp_rank0_share(s, dcp, interleave) for s in seq_lens]
