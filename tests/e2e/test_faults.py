"""Distributed faults end every rank with a clear error, in threads and in gloo processes:
a stalled or dead rank within the process group's timeout, ranks that disagree on the schedule
(other sizes, or the same sizes with other token ids) at the first step they differ."""

import re
import threading
import time

import e2e_worker
import pytest
import torch
import torch.multiprocessing as mp

from pcp_fn.distributed import (
    DEFAULT_TIMEOUT,
    CollectiveError,
    CollectiveMismatch,
    ThreadedAllGather,
    batch_digest,
    check_same_batch,
    init_process_group,
)

pytestmark = pytest.mark.timeout(180)

TIMEOUT = 3.0  # seconds: the process group's timeout in these tests


def test_every_process_group_has_a_timeout_of_about_a_minute_by_default():
    assert DEFAULT_TIMEOUT.total_seconds() == 60
    assert ThreadedAllGather(2).timeout == 60
    with pytest.raises(ValueError, match="timeout must be > 0"):
        init_process_group("gloo", init_method="file:///nonexistent", rank=0, world_size=1, timeout=0)


# -- threads ---------------------------------------------------------------------------------------


def _threads(P, body):
    """Run ``body(rank)`` on P threads; returns each rank's result or exception."""
    out = [None] * P

    def run(r):
        try:
            out[r] = body(r)
        except Exception as e:
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out


def test_threaded_gather_of_other_shapes_fails_on_every_rank():
    gather = ThreadedAllGather(3, timeout=10)
    out = _threads(3, lambda r: gather.for_rank(r)(torch.zeros(2 + (r == 2), 4)))
    for e in out:
        assert isinstance(e, CollectiveMismatch)
        assert "rank 0: torch.float32(2, 4), rank 1: torch.float32(2, 4), rank 2: torch.float32(3, 4)" in str(
            e
        )


def test_threaded_stalled_rank_ends_the_others_within_the_timeout():
    gather = ThreadedAllGather(3, timeout=1.0)

    def body(r):
        if r == 1:
            time.sleep(3)
        t0 = time.monotonic()
        try:
            gather.for_rank(r)(torch.zeros(2))
        except CollectiveError as e:
            return time.monotonic() - t0, str(e)

    out = _threads(3, body)
    for r in (0, 2):
        seconds, message = out[r]
        assert seconds < 2.0, seconds
        assert f"all_gather on rank {r} of 3 failed: a peer rank stalled past the 1 s timeout" in message


def test_the_engine_names_the_step_and_the_ranks_that_run_another_batch():
    P = 3
    gather = ThreadedAllGather(P, timeout=30)
    other = e2e_worker._other_tokens(e2e_worker.workload())

    def body(r):
        reqs = other if r == 1 else e2e_worker.workload()
        runner = e2e_worker.runner_for(P, r, gather.for_rank(r), requests=reqs)
        while runner.step() is None:  # until the first request arrives
            pass

    first = _first_step()
    for r, e in enumerate(_threads(P, body)):
        assert isinstance(e, CollectiveMismatch), e
        assert str(e).startswith(
            f"rank {r}, step {first}: the ranks run different batches (ranks [0, 2], ranks [1]"
        )


def test_the_batch_check_can_be_turned_off():
    P = 2
    gather = ThreadedAllGather(P, timeout=30)
    other = e2e_worker._other_tokens(e2e_worker.workload())

    def body(r):
        reqs = other if r == 1 else e2e_worker.workload()
        runner = e2e_worker.runner_for(P, r, gather.for_rank(r), requests=reqs, verify_batches=False)
        while (rec := runner.step()) is None:
            pass
        return rec

    for rec in _threads(P, body):
        assert not isinstance(rec, Exception), rec  # same sizes, other ids: nothing can tell


def _first_step():
    """The index of the workload's first scheduled step (requests arrive from then on)."""
    runner = e2e_worker.runner_for(1, 0, None)
    while (rec := runner.step()) is None:
        pass
    return rec.sched.index


def test_batch_digest_covers_every_array():
    base = batch_digest([0], [1, 2], [3])
    assert base.shape == (1, 4) and base.dtype == torch.int64
    assert not torch.equal(base, batch_digest([0], [1, 2], [4]))
    assert not torch.equal(base, batch_digest([0], [1], [2, 3]))  # the boundary between arrays counts
    check_same_batch(lambda t: torch.cat([t, t]), base)
    with pytest.raises(CollectiveMismatch, match=r"ranks \[0\], ranks \[1\]"):
        check_same_batch(lambda t: torch.cat([t, t + 1]), base)


# -- gloo processes --------------------------------------------------------------------------------


def _spawn_faults(tmp_path, P, faults, deadline=120):
    ctx = mp.start_processes(
        e2e_worker.fault_worker,
        args=(P, str(tmp_path / "init"), str(tmp_path), faults, TIMEOUT),
        nprocs=P,
        join=False,
        start_method="spawn",
    )
    end = time.monotonic() + deadline
    for p in ctx.processes:
        p.join(max(0.0, end - time.monotonic()))
    hung = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    assert not hung, f"ranks {hung} still running after {deadline} s"
    outcomes = {}
    for fault in faults:
        for r in range(P):
            path = tmp_path / f"{fault}-rank{r}.txt"
            outcomes[fault, r] = path.read_text().strip() if path.exists() else None
    return outcomes, [p.exitcode for p in ctx.processes]


def _error(outcome):
    m = re.fullmatch(r"error (\S+) (\w+): (.*)", outcome or "")
    assert m, outcome
    return float(m[1]), m[2], m[3]


def test_gloo_ranks_that_disagree_fail_with_the_step_and_the_ranks(tmp_path):
    faults = ["tokens", "sizes", "sizes-unverified"]
    outcomes, exits = _spawn_faults(tmp_path, 3, faults)
    first = _first_step()
    assert exits == [0, 0, 0]  # no C++ abort: every rank raised, and went on to the next fault
    for r in range(3):
        for fault in ("tokens", "sizes"):  # the per-step batch check
            _, kind, message = _error(outcomes[fault, r])
            assert kind == "CollectiveMismatch"
            assert message.startswith(
                f"rank {r}, step {first}: the ranks run different batches (ranks [0, 2], ranks [1]"
            )
        # without it, the size check before the first collective
        _, kind, message = _error(outcomes["sizes-unverified", r])
        assert kind == "CollectiveMismatch"
        assert re.match(
            rf"rank {r}, step {first}: all_gather: the ranks' buffers differ \(rank 0: torch.float64\(",
            message,
        )


def test_gloo_stalled_rank_ends_every_other_rank_within_the_timeout(tmp_path):
    outcomes, exits = _spawn_faults(tmp_path, 3, ["stall"])
    for r in (0, 2):
        seconds, kind, message = _error(outcomes["stall", r])
        assert kind == "CollectiveError"
        assert message.startswith(
            f"rank {r}, step {e2e_worker.FAULT_STEP}: all_gather on rank {r} of 3 failed"
        )
        assert TIMEOUT - 0.5 < seconds < TIMEOUT + 2.0, seconds  # the group's timeout, not gloo's 30 min
    # the stalled rank itself fails when it comes back: its peers are gone
    assert _error(outcomes["stall", 1])[1] == "CollectiveError"


def test_gloo_dead_rank_ends_every_other_rank(tmp_path):
    outcomes, exits = _spawn_faults(tmp_path, 3, ["die"])
    assert exits[1] == 3 and outcomes["die", 1] is None
    for r in (0, 2):
        seconds, kind, message = _error(outcomes["die", r])
        assert kind == "CollectiveError" and "stalled past the process group's timeout or died" in message
        assert seconds < TIMEOUT + 2.0, seconds


def test_threaded_run_returns_rank_order_and_raises_a_rank_failure_without_waiting_out_the_timeout():
    gather = ThreadedAllGather(3, timeout=30)
    out = gather.run(lambda r, all_gather: all_gather(torch.full((1, 2), float(r))).sum().item() + r)
    assert out == [6.0, 7.0, 8.0]  # each rank's own result: 2 * (0 + 1 + 2) + r

    def body(r, all_gather):
        if r == 1:
            raise RuntimeError("rank 1 failed")
        return all_gather(torch.zeros(1, 2))

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        ThreadedAllGather(3, timeout=30).run(body)
    assert time.monotonic() - start < 10  # the peers were released, not timed out
