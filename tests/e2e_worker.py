"""Worker for the end-to-end tests (a module, so spawned children can import it)."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings

import torch
import torch.distributed as dist

import pcp_fn
from pcp_fn.distributed import (
    ThreadedAllGather,
    all_gather_and_restore,
    init_process_group,
    process_group_all_gather,
)
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


def runner_for(P, rank, all_gather, step_fn=None, layout="dcs", k=0, requests=None, **kw):
    cfg = pcp_fn.PCPConfig(P, rank, MAX_REQS, BUDGET, num_spec_tokens=k)
    target, drafter = models()
    return Runner(
        cfg,
        workload() if requests is None else requests,
        model=target,
        drafter=drafter,
        all_gather=all_gather,
        step_fn=step_fn,
        layout=layout,
        **kw,
    )


def run_rank(P, rank, all_gather, step_fn=None, layout="dcs", k=0):
    return runner_for(P, rank, all_gather, step_fn, layout, k).run()


def run_threads(P, step_fn=None, layout="dcs", k=0):
    """All P ranks in one process, one thread each."""
    return ThreadedAllGather(P).run(
        lambda rank, all_gather: run_rank(P, rank, all_gather, step_fn, layout, k)
    )


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


def buckets_of(P, records, k=0):
    """The distinct buckets of a run's batches."""
    cfg = pcp_fn.PCPConfig(P, 0, MAX_REQS, BUDGET, num_spec_tokens=k)
    return {
        pcp_fn.make_batch(cfg, r.sched.num_scheduled, r.sched.num_computed, r.sched.num_prompt).bucket
        for r in records
    }


def gloo_worker(rank, world_size, init_file, result_dir, layout, k, compiled):
    torch.set_num_threads(1)
    # torch 2.13 deprecates funcol.all_gather_tensor with a FutureWarning: none may be left
    warnings.simplefilter("error", FutureWarning)
    init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        gather = process_group_all_gather()
        step_fn = None
        limit = torch._dynamo.config.recompile_limit
        if compiled:
            step_fn = pcp_fn.graph.compile_per_bucket(pcp_fn.step, backend="eager")
        records = run_rank(world_size, rank, gather, step_fn, layout, k)
        reference = run_rank(1, 0, lambda t: t, k=k)
        worst = compare(records, reference)
        if compiled:
            # one graph per bucket, the default recompile limit untouched
            assert len(step_fn) == len(buckets_of(world_size, records, k)), len(step_fn)
            assert torch._dynamo.config.recompile_limit == limit
            # the collective traces with the restore: one graph, the all-gather inside it
            cfg = pcp_fn.PCPConfig(world_size, rank, MAX_REQS, BUDGET)
            batch = pcp_fn.make_batch(cfg, [3, 40], [9, 0], [9, 40], slot_mapping=range(43))
            state, out = pcp_fn.step(pcp_fn.init_state(cfg), batch)
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
        # every rank done before any tears gloo down: a peer destroyed mid-send once aborted a
        # rank ("terminate called without an active exception") after all checks had passed
        dist.barrier()
    finally:
        dist.destroy_process_group()


# -- faults ------------------------------------------------------------------------------------

FAULT_STEP = 3


def _other_tokens(requests):
    """The same requests (same lengths, so the same schedule) with other token ids."""
    return [dataclasses.replace(r, prompt=[(t % 100) + 1 for t in r.prompt]) for r in requests]


def _fault_runner(fault, P, rank, gather):
    """Rank 1's runner disagrees with the others: other token ids with the same lengths
    (``tokens``), or a smaller token budget, so other batch sizes (``sizes``)."""
    reqs, kw = workload(), {}
    if rank == 1 and fault == "tokens":
        reqs = _other_tokens(reqs)
    if rank == 1 and fault.startswith("sizes"):
        kw["token_budget"] = BUDGET // 4
    return runner_for(P, rank, gather, requests=reqs, verify_batches=fault != "sizes-unverified", **kw)


def run_until_fault(fault, P, rank, gather, stall_seconds=0.0):
    """Run the workload; rank 1 misbehaves (at FAULT_STEP for ``die`` and ``stall``). Returns
    ``ok`` or ``error SECONDS TYPE: MESSAGE`` (seconds from the failing step's start)."""
    runner = _fault_runner(fault, P, rank, gather)
    while not runner.scheduler.idle:
        if rank == 1 and runner.scheduler.index == FAULT_STEP:
            if fault == "die":
                os._exit(3)
            if fault == "stall":
                time.sleep(stall_seconds)
        t0 = time.monotonic()
        try:
            runner.step()
        except Exception as e:
            return f"error {time.monotonic() - t0:.2f} {type(e).__name__}: {e}"
    return "ok"


def fault_worker(rank, world_size, init_file, result_dir, faults, timeout):
    """Run each fault in turn in one process group (the mismatches leave it usable); a dying or
    stalling rank must be the last fault."""
    torch.set_num_threads(1)
    init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size, timeout=timeout
    )
    try:
        gather = process_group_all_gather()
        for fault in faults:
            outcome = run_until_fault(fault, world_size, rank, gather, stall_seconds=2 * timeout)
            with open(os.path.join(result_dir, f"{fault}-rank{rank}.txt"), "w") as f:
                f.write(outcome + "\n")
        if faults[-1] not in ("die", "stall"):  # every rank is alive: all done before any teardown
            # (a peer destroyed mid-send aborts a rank in gloo: "terminate called without an
            # active exception", seen once in CI after every fault had been written; see worker)
            dist.barrier()
    finally:
        dist.destroy_process_group()
