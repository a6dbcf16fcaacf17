"""Worker for the end-to-end tests (a module, so spawned children can import it)."""

from __future__ import annotations

import os
import threading

import torch

import pcp_fn
from pcp_fn.distributed import ThreadedAllGather, all_gather_and_restore, process_group_all_gather
from pcp_fn.sim.engine import Runner, synthetic_requests
from pcp_fn.sim.tiny_model import TinyConfig, TinyModel

WORKLOAD = dict(num_requests=10, max_prompt=300, max_new_tokens=(4, 16), seed=1)
BUDGET = 64
MAX_REQS = 8


def workload():
    return synthetic_requests(**WORKLOAD)


def models():
    """The target, and the drafter: the same tiny model with its output head nudged, so that it
    agrees with the target about half the time (drafts get both accepted and rejected)."""
    target = TinyModel(TinyConfig())
    return target, target.perturbed(0.3)


def run_rank(P, rank, all_gather, step_fn=None, layout="dcs", k=0):
    cfg = pcp_fn.PCPConfig(P, rank, MAX_REQS, BUDGET, num_spec_tokens=k)
    target, drafter = models()
    runner = Runner(
        cfg, workload(), model=target, drafter=drafter, all_gather=all_gather, step_fn=step_fn, layout=layout
    )
    return runner.run()


def run_threads(P, step_fn=None, layout="dcs", k=0):
    """All P ranks in one process, one thread each."""
    gather = ThreadedAllGather(P)
    results = [None] * P
    errors = []

    def worker(r):
        try:
            results[r] = run_rank(P, r, gather.for_rank(r), step_fn, layout, k)
        except BaseException as e:  # surface thread failures
            errors.append(e)
            gather._barrier.abort()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def compare(records, reference, tol=1e-9):
    """Same schedule and sampled tokens at every step, logits within ``tol``; returns the max gap."""
    assert len(records) == len(reference), (len(records), len(reference))
    worst = 0.0
    for got, ref in zip(records, reference):
        assert got.sched == ref.sched, got.sched.index
        assert got.sampled == ref.sampled, (got.sched.index, got.sampled, ref.sampled)
        assert got.logits.shape == ref.logits.shape
        gap = (got.logits - ref.logits).abs().max().item() if got.logits.numel() else 0.0
        assert gap <= tol, (got.sched.index, gap)
        worst = max(worst, gap)
    return worst


def gloo_worker(rank, world_size, init_file, result_dir, layout, k, compiled):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        gather = process_group_all_gather()
        step_fn = None
        if compiled:
            step_fn = torch.compile(pcp_fn.step, fullgraph=True, dynamic=False, backend="eager")
            torch._dynamo.config.recompile_limit = 64
        records = run_rank(world_size, rank, gather, step_fn, layout, k)
        reference = run_rank(1, 0, lambda t: t, k=k)
        worst = compare(records, reference)
        if compiled:
            # the collective traces with the restore: one graph, the all-gather inside it
            cfg = pcp_fn.PCPConfig(world_size, rank, MAX_REQS, BUDGET)
            batch = pcp_fn.make_batch(cfg, [3, 40], [9, 0], [9, 40])
            state, out = pcp_fn.step(pcp_fn.init_state(cfg), batch, torch.arange(43))
            Lb = batch.bucket.num_tokens
            local = torch.full((Lb, 2), float(rank), dtype=torch.float64)
            local[:, 1] = torch.arange(Lb, dtype=torch.float64)
            fn = torch.compile(
                lambda s, x: all_gather_and_restore(s, x, gather),
                fullgraph=True,
                dynamic=False,
                backend="eager",
            )
            _, restored = fn(state, local)
            expect = torch.stack([out.layout.restore_index // Lb, out.layout.restore_index % Lb], 1)
            assert torch.equal(restored.long(), expect)
        drafts = sum(sum(r.sched.drafts) for r in records)
        accepted = sum(len(s) - 1 for r in records for s in r.sampled)
        with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
            f.write(f"{len(records)} {worst} {drafts} {accepted}\n")
    finally:
        dist.destroy_process_group()
