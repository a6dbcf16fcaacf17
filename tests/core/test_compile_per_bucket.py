"""pcp_fn.graph.compile_per_bucket: one compiled graph per bucket, any number of buckets,
torch's default recompile limit untouched."""

import pytest
import torch
from helpers import tree_equal
from torch._dynamo.utils import counters

import pcp_fn
from pcp_fn import Bucket, PCPConfig, graph, init_state, make_batch

pytestmark = pytest.mark.timeout(120)

CFG = PCPConfig(2, 0, 4, 64)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _batches():
    """Batches of many buckets (more than Dynamo's default recompile limit), each bucket twice,
    with slot mappings of every length."""
    out = []
    for n in (1, 2, 3, 5, 9, 13, 17, 30, 33, 47, 64):
        for extra in (0, 1):
            m = max(1, n - extra)
            out.append(make_batch(CFG, [m], [0], [m], slot_mapping=list(range(100, 100 + m))))
    for reqs, tokens in ((2, 8), (2, 68), (4, 8), (4, 32), (4, 68)):
        for n in (3, 5):  # a decode and a prefill, in a bucket forced larger
            out.append(
                make_batch(
                    CFG, [1, n], [5, 0], [5, n], slot_mapping=range(n + 1), bucket=Bucket(reqs, tokens)
                )
            )
    return out


def test_one_graph_per_bucket_shared_by_ranks_under_the_default_limit():
    limit = torch._dynamo.config.recompile_limit
    batches = _batches()
    buckets = {b.bucket for b in batches}
    assert len(buckets) > limit  # the point: more buckets than one code object may compile
    compiled = graph.compile_per_bucket(pcp_fn.step, backend="eager")
    assert compiled.kind == "unset" and len(compiled) == 0  # lazy
    states = [init_state(CFG, rank=r) for r in range(CFG.pcp_size)]
    eager = [init_state(CFG, rank=r) for r in range(CFG.pcp_size)]
    for batch in batches:
        for r in range(CFG.pcp_size):
            states[r], got = compiled(states[r], batch)
            eager[r], want = pcp_fn.step(eager[r], batch)
            assert tree_equal(got, want)
    assert compiled.kind == "compile"
    assert len(compiled) == len(buckets)
    assert counters["stats"]["unique_graphs"] == len(buckets)
    assert torch._dynamo.config.recompile_limit == limit


def test_a_plain_compile_of_step_makes_one_graph_for_slot_mappings_of_every_length():
    """Bucket-shaped slot mappings: the number of scheduled tokens never reaches a shape."""
    fn = torch.compile(pcp_fn.step, fullgraph=True, dynamic=False, backend="eager")
    state = init_state(CFG, rank=1)
    for n in range(17, 33):  # one bucket, 16 lengths
        batch = make_batch(CFG, [n], [0], [n], slot_mapping=range(n))
        assert batch.bucket == make_batch(CFG, [32], [0], [32]).bucket
        state, _ = fn(state, batch)
    assert counters["stats"]["unique_graphs"] == 1
