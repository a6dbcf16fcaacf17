"""End to end: P ranks of a tiny paged-attention model equal the unsplit (P = 1) model.

A 30+ step workload (10 requests, prompts of 1 to 300 tokens, a 64-token
chunked-prefill budget, staggered arrivals, requests finishing mid-run,
speculative decoding with k = 0, 1, 2 draft tokens from a drafter that the
target half agrees with) must give, at every step, the same sampled tokens as
P = 1 and logits within 1e-9; and the P = 1 paged engine must equal the dense,
unpaged forward of the same model. Every rank checks once per step that all run the
same batch (``Runner(verify_batches=True)``, the default); the gloo groups have the
package's one-minute timeout and every test its own limit (faults: test_faults.py).
"""

import e2e_worker
import pytest
import torch
import torch.multiprocessing as mp
from e2e_worker import compare, models, run_rank, run_threads

import pcp_fn
from pcp_fn.sim.engine import Runner

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def references():
    refs = {k: run_rank(1, 0, lambda t: t, k=k) for k in (0, 1, 2)}
    for k, records in refs.items():
        assert len(records) >= 30
        scheds = [r.sched for r in records]
        assert any(0 < c < p for s in scheds for c, p in zip(s.num_computed, s.num_prompt)), "chunked prompts"
        assert any(
            0 < sum(c >= p for c, p in zip(s.num_computed, s.num_prompt)) < len(s.req_ids) for s in scheds
        )
        if k:
            drafts = sum(sum(s.drafts) for s in scheds)
            accepted = sum(len(x) - 1 for r in records for x in r.sampled)
            assert 0 < accepted < drafts, "drafts must be both accepted and rejected"
    lengths = [len(r.prompt) for r in e2e_worker.workload()]
    assert min(lengths) < 50 and max(lengths) > 200
    return refs


@pytest.mark.parametrize("k", [0, 2])
def test_the_paged_engine_equals_the_dense_unsplit_model(k):
    target, drafter = models()
    cfg = pcp_fn.PCPConfig(1, 0, e2e_worker.MAX_REQS, e2e_worker.BUDGET, num_spec_tokens=k)
    runner = Runner(cfg, e2e_worker.workload(), model=target, drafter=drafter, all_gather=lambda t: t)
    checked = 0
    while not runner.scheduler.idle:
        known = {r.req_id: r.tokens + r.drafts for r in runner.scheduler.running + runner.scheduler.pending}
        rec = runner.step()
        if rec is None:
            continue
        row = 0
        for rid, n, c, d in zip(
            rec.sched.req_ids, rec.sched.num_scheduled, rec.sched.num_computed, rec.sched.drafts
        ):
            seq = torch.tensor(known[rid][: c + n])
            dense = target.dense_logits(seq)[c + n - d - 1 : c + n]
            assert (rec.logits[row : row + d + 1] - dense).abs().max() < 1e-9
            row += d + 1
            checked += d + 1
    assert checked > 100


@pytest.mark.parametrize("layout", ["dcs", "mrv2"])
@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("P", [2, 3, 4])
def test_threaded_ranks_equal_the_unsplit_model(P, k, layout, references):
    for records in run_threads(P, layout=layout, k=k):
        compare(records, references[k])


def test_mrv2_at_p1_is_the_unsplit_model(references):
    compare(run_rank(1, 0, lambda t: t, layout="mrv2"), references[0])


def _spawn(tmp_path, P, layout="dcs", k=0, compiled=False):
    mp.start_processes(
        e2e_worker.gloo_worker,
        args=(P, str(tmp_path / "init"), str(tmp_path), layout, k, compiled),
        nprocs=P,
        join=True,
        start_method="spawn",
    )
    for r in range(P):
        steps, worst, drafts, accepted = (tmp_path / f"rank{r}.txt").read_text().split()
        assert int(steps) >= 30 and float(worst) <= 1e-9
        if k:
            assert 0 < int(accepted) < int(drafts)


def test_gloo_p2_spec1_compiled_step_and_traced_all_gather(tmp_path):
    _spawn(tmp_path, 2, k=1, compiled=True)


def test_gloo_p4_spec2(tmp_path):
    _spawn(tmp_path, 4, k=2)


def test_gloo_p2_mrv2_spec2(tmp_path):
    _spawn(tmp_path, 2, layout="mrv2", k=2)
