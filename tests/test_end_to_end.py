"""End to end: P ranks of a tiny paged-attention model equal the unsplit (P = 1) model.

A 30+ step workload (10 requests, prompts of 1 to 300 tokens, a 64-token
chunked-prefill budget, staggered arrivals, requests finishing mid-run) must
give, at every step, the same sampled tokens as P = 1 and logits within 1e-9.
"""

import e2e_worker
import pytest
import torch.multiprocessing as mp
from e2e_worker import compare, run_rank, run_threads


@pytest.fixture(scope="module")
def reference():
    records = run_rank(1, 0, lambda t: t)
    assert len(records) >= 30
    lengths = [len(r.prompt) for r in e2e_worker.workload()]
    assert min(lengths) < 50 and max(lengths) > 200
    chunked = [
        r for r in records if any(c > 0 and c < p for c, p in zip(r.sched.num_computed, r.sched.num_prompt))
    ]
    mixed = [
        r
        for r in records
        if r.sched.num_computed
        and 0 < sum(c >= p for c, p in zip(r.sched.num_computed, r.sched.num_prompt)) < len(r.sched.req_ids)
    ]
    assert chunked and mixed, "the workload must chunk prompts and mix decodes with prefills"
    return records


@pytest.mark.parametrize("P", [2, 3, 4])
def test_threaded_ranks_equal_the_unsplit_model(P, reference):
    for records in run_threads(P):
        compare(records, reference)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_threaded_mrv2_ranks_equal_the_unsplit_model(P, reference):
    for records in run_threads(P, layout="mrv2"):
        compare(records, reference)


def test_mrv2_at_p1_is_the_unsplit_model(reference):
    compare(run_rank(1, 0, lambda t: t, layout="mrv2"), reference)


def _spawn(P, compiled, tmp_path, layout="dcs"):
    init = tmp_path / "init"
    mp.start_processes(
        e2e_worker.gloo_worker,
        args=(P, str(init), compiled, str(tmp_path), layout),
        nprocs=P,
        join=True,
        start_method="spawn",
    )
    for r in range(P):
        steps, worst = (tmp_path / f"rank{r}.txt").read_text().split()
        assert int(steps) >= 30 and float(worst) <= 1e-9


def test_gloo_processes_p2_compiled_step_and_traced_all_gather(tmp_path):
    _spawn(2, True, tmp_path)


def test_gloo_processes_p4(tmp_path):
    _spawn(4, False, tmp_path)


def test_gloo_processes_mrv2_p2(tmp_path):
    _spawn(2, False, tmp_path, layout="mrv2")
