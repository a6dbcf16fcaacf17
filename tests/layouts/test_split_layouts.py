"""The built-in "round-robin" and "cost-balanced" layouts (pcp_fn.mrv2.splits): conforming, balanced,
captured, simulated; and examples/cost_balanced_layout.py, which shows the latter."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import load_example, tree_equal

import pcp_fn
from pcp_fn.testing import check_layout

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATH = ROOT / "examples" / "cost_balanced_layout.py"


def _example():
    return load_example("cost_balanced_layout")


def _balanced_runs(n, k, P):
    """Independent count: rank q's run ends at the last token where P * work <= q * total (brute force)."""
    work = np.cumsum(np.concatenate([[0], k + 1 + np.arange(n)]))  # work[b]: first b tokens' key-query pairs
    ends = [int(np.flatnonzero(P * work <= q * work[-1]).max()) for q in range(P + 1)]
    return [ends[q + 1] - ends[q] for q in range(P)]


@pytest.mark.parametrize("name", ["round-robin", "cost-balanced"])
def test_the_split_layouts_conform(name):
    check_layout(name, max_examples=8, graph_pcp_sizes=(2,))


@pytest.mark.parametrize("name", ["round-robin", "cost-balanced"])
def test_the_split_layouts_refuse_dcp(name):
    with pytest.raises(ValueError, match="requires dcp_size == 1"):
        pcp_fn.PCPConfig(2, 0, 4, 64, dcp_size=2, layout=name)


def test_round_robin_deals_the_chunks_in_turn():
    """P = 2, a fresh prefill of 10 tokens: chunks of 3; rank 0 holds chunks 0 and 2, rank 1 1 and 3."""
    cfg = pcp_fn.PCPConfig(2, 0, 4, 64, layout="round-robin")
    batch = pcp_fn.make_batch(cfg, [10], [0], [10], slot_mapping=range(10))
    _, out = pcp_fn.all_ranks(pcp_fn.step, pcp_fn.init_state(cfg, rank=0), batch)
    held = out.layout.num_tokens.tolist()
    assert held == [6, 4]
    assert [out.positions[r, : held[r]].tolist() for r in range(2)] == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9]]


@pytest.mark.parametrize(("n", "k", "runs"), [(256, 0, [127, 53, 41, 35]), (256, 1000, [69, 66, 62, 59])])
def test_the_cost_balanced_layout_balances_the_work(n, k, runs):
    cfg = pcp_fn.PCPConfig(4, 0, 4, 256, layout="cost-balanced")
    batch = pcp_fn.make_batch(cfg, [n], [k], [n + k], slot_mapping=range(n))
    _, out = pcp_fn.all_ranks(pcp_fn.step, pcp_fn.init_state(cfg, rank=0), batch)
    held = out.layout.num_tokens.tolist()
    assert held == _balanced_runs(n, k, 4) == runs
    # each rank's causal work within 4% of the others' (the integer cuts); the equal-token split of
    # the fresh prefill is 6.9x apart, and behind a 1000-token context still 1.19x
    work = np.array([int((out.positions[r, : held[r]] + 1).sum()) for r in range(4)])
    assert work.max() / work.min() < 1.04
    assert batch.bucket.num_tokens >= max(held)


@pytest.mark.parametrize("name", ["round-robin", "cost-balanced"])
def test_the_split_layouts_are_captured_and_replay(name):
    cfg = pcp_fn.PCPConfig(3, 1, 4, 64, layout=name)
    first = pcp_fn.make_batch(cfg, [64], [0], [64], slot_mapping=range(64), bucket=cfg.capacity)
    captured = pcp_fn.graph.capture(pcp_fn.step, pcp_fn.init_state(cfg), first, backend="eager")
    other = pcp_fn.make_batch(
        cfg, [1, 9, 30], [5, 0, 2], [3, 9, 40], slot_mapping=range(40), bucket=cfg.capacity
    )
    _, replayed = captured(pcp_fn.init_state(cfg), other)
    _, eager = pcp_fn.step(pcp_fn.init_state(cfg), other)
    assert len(captured) == 1
    for a, b in zip(torch.utils._pytree.tree_leaves(replayed), torch.utils._pytree.tree_leaves(eager)):
        assert torch.equal(a, b)


def test_the_simulator_samples_the_same_tokens_at_p2_as_at_p1():
    from pcp_fn.sim.engine import synthetic_requests

    ex = _example()
    requests = synthetic_requests(5, max_prompt=60, max_new_tokens=(2, 4), seed=5)
    assert ex.simulate(2, requests) == ex.simulate(1, requests)


def test_the_example_runs_as_a_script():
    out = subprocess.run([sys.executable, str(PATH)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "simulator: P = 3 samples the same tokens as P = 1" in out.stdout


def test_a_bad_split_is_named_at_the_config():
    with pytest.raises(ValueError, match=r"split must be a pcp_fn\.mrv2\.PrefillSplit, got str"):
        pcp_fn.MRV2Config(2, 0, 4, 64, split="round-robin")
    with pytest.raises(ValueError, match="split 'cost-balanced' requires dcp_size == 1, got dcp_size=2"):
        pcp_fn.MRV2Config(2, 0, 4, 64, dcp_size=2, split=pcp_fn.mrv2.COST_BALANCED)
    with pytest.raises(ValueError, match="the 'cost-balanced' split reads num_computed: pass it"):
        cfg = pcp_fn.MRV2Config(2, 0, 4, 64, split=pcp_fn.mrv2.COST_BALANCED)
        pcp_fn.mrv2.rank_counts(cfg, np.array([9]), np.array([True]))


@pytest.mark.parametrize("split", [pcp_fn.mrv2.ROUND_ROBIN, pcp_fn.mrv2.COST_BALANCED], ids=lambda s: s.name)
def test_the_mrv2_layout_of_a_split_traces_fullgraph_and_matches_eager(split, fresh_dynamo):
    """`pcp_fn.mrv2.partition_batch` with another split under torch.compile(fullgraph=True), rank as
    data: what the vLLM drop-in's graphs run; equal to the eager call for another composition."""
    from pcp_fn import mrv2

    cfg = mrv2.MRV2Config(4, 0, 8, 256, split=split)
    compiled = torch.compile(mrv2.partition_batch, fullgraph=True, dynamic=False, backend="eager")
    bucket = pcp_fn.Bucket(16, 128)
    for sched, comp, plen in (
        ([3, 100, 40], [7, 0, 500], [5, 100, 600]),
        ([1, 1, 90], [9, 4, 30], [2, 2, 200]),
    ):
        batch = mrv2.make_batch(cfg, sched, comp, plen, bucket=bucket)
        for rank in range(4):
            state = mrv2.init_state(cfg, rank=rank)
            assert tree_equal(compiled(state, batch)[1], mrv2.partition_batch(state, batch)[1])
