"""pcp_fn.mrv2.host, the numpy twin of the MRV2 segment rules, against the oracle's pieces."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from oracle_mrv2 import dcp_rank0_share, rank_pieces

from pcp_fn.mrv2 import MRV2Config, host, rank_counts


@st.composite
def batches(draw):
    P = draw(st.sampled_from([1, 2, 3, 4, 8]))
    mode = draw(st.sampled_from(["replicated", "sharded", "dcp"]))
    n = draw(st.integers(0, 12))
    sched = [draw(st.sampled_from([0, 1, 2, 3, draw(st.integers(1, 70))])) for _ in range(n)]
    prefilling = [draw(st.booleans()) for _ in range(n)]
    cfg = MRV2Config(
        P, 0, 16, 1024, shard_decode_requests=mode == "sharded", dcp_size=2 if mode == "dcp" else 1
    )
    return cfg, np.array(sched, np.int32), np.array(prefilling, np.bool_)


@given(batches())
def test_local_segments_are_the_oracles_pieces(batch):
    cfg, sched, prefilling = batch
    ranks = rank_pieces(
        cfg.pcp_size, sched.tolist(), prefilling.tolist(), cfg.shard_decode_requests, cfg.dcp_size
    )
    starts = np.concatenate([[0], np.cumsum(sched)])
    for q, pieces in enumerate(ranks):
        seg = host.local_segments(cfg, q, sched, prefilling)  # a few requests: Python integers
        with mock.patch.object(host, "FEW_REQUESTS", -1):  # numpy: split prefills one by one
            by_prefill = host.local_segments(cfg, q, sched, prefilling)
            with mock.patch.object(host, "FEW_PREFILLS", -1):  # and as one [P, S] table
                table = host.local_segments(cfg, q, sched, prefilling)
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
            tokens, rows = rank_counts(cfg, sched, prefilling)
            largest = host.largest_rank(cfg, sched.astype(np.int64), prefilling, int(sched.sum()))
        assert (tokens.tolist(), rows.tolist()) == expected
        assert largest == ((max(expected[0]), max(expected[1])) if sched.size else (0, 0))


@given(st.lists(st.integers(0, 300), max_size=8), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 16]))
def test_dcp_rank0_share(seq_lens, dcp, interleave):
    got = host.dcp_rank0_seq_lens(np.array(seq_lens, np.int64), dcp, interleave)
    assert got.tolist() == [dcp_rank0_share(s, dcp, interleave) for s in seq_lens]
