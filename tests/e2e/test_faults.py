"""Distributed faults end every rank with a clear error, in threads and in gloo processes:
a stalled or dead rank within the process group's timeout, ranks that disagree on the schedule
(other sizes, or the same sizes with other token ids) at the first step they differ."""

import random
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


# -- issue 41: every wait of the threaded helper is bounded, and its ranks are real ranks -----------


@pytest.mark.timeout(30)  # without the bound, run() waits for the blocked rank: pytest-timeout fails it
def test_threaded_run_reports_a_rank_stuck_outside_a_collective_within_the_timeout():
    release = threading.Event()

    def body(r, all_gather):
        if r == 1:
            release.wait()  # blocked outside any collective, until the test lets it go
        return all_gather(torch.zeros(1, 2))

    start = time.monotonic()
    try:
        with pytest.raises(CollectiveError) as e:
            ThreadedAllGather(3, timeout=0.5).run(body)
        seconds = time.monotonic() - start
    finally:
        release.set()
    # ranks 0 and 2 time out at 0.5 s; rank 1 has 0.5 s more to end, then it is named
    assert seconds < 5.0, seconds
    assert re.fullmatch(
        r"ThreadedAllGather\.run: rank 1 of 3 still running 0\.5 s after rank [02] failed "
        r"\(CollectiveError: all_gather on rank [02] of 3 failed: a peer rank stalled past the 0\.5 s "
        r"timeout or failed\); every rank must run the same collectives and end within the timeout",
        str(e.value),
    ), str(e.value)
    assert isinstance(e.value.__cause__, CollectiveError)


@pytest.mark.timeout(30)
def test_threaded_run_reports_a_rank_still_running_after_the_others_returned():
    release = threading.Event()

    def body(r, all_gather):
        out = all_gather(torch.full((1, 1), float(r)))
        if r == 2:
            release.wait()  # never ends on its own: the others have returned
        return out

    try:
        with pytest.raises(
            CollectiveError, match=r"rank 2 of 3 still running 0\.5 s after rank [01] returned"
        ):
            ThreadedAllGather(3, timeout=0.5).run(body)
    finally:
        release.set()


@pytest.mark.parametrize(
    ("world_size", "error", "match"),
    [
        (0, ValueError, r"world_size must be >= 1 \(ranks to run\), got 0"),
        (-1, ValueError, r"world_size must be >= 1 \(ranks to run\), got -1"),
        (2.0, TypeError, r"world_size must be an int, got float 2\.0"),
        (True, TypeError, r"world_size must be an int, got bool True"),
    ],
)
def test_threaded_gather_refuses_a_world_of_no_ranks(world_size, error, match):
    # before: ThreadedAllGather(0).run(body) ran nothing and returned [] (a world of no ranks)
    with pytest.raises(error, match=match):
        ThreadedAllGather(world_size)


@pytest.mark.parametrize(
    ("rank", "error", "match"),
    [
        (-1, ValueError, r"rank must be in \[0, world_size=2\), got -1"),  # before: rank 1's slot
        (2, ValueError, r"rank must be in \[0, world_size=2\), got 2"),  # before: an IndexError
        (True, TypeError, r"rank must be an int, got bool True"),
    ],
)
def test_threaded_gather_refuses_a_rank_outside_the_world(rank, error, match):
    with pytest.raises(error, match=match):
        ThreadedAllGather(2).for_rank(rank)


@pytest.mark.timeout(30)
def test_a_rank_called_from_two_threads_never_returns_another_collectives_rows():
    # The barrier counts arrivals, not ranks: two threads on rank 0 once released it without
    # rank 1, and both returned one row, the other caller's buffer (a phantom of rank 1's).
    gather = ThreadedAllGather(2, timeout=1.0)
    entered = threading.Barrier(2)

    def caller(value):
        entered.wait()
        return gather.for_rank(0)(torch.full((1, 1), float(value)))

    out = _threads(2, caller)
    assert all(isinstance(e, CollectiveError) for e in out), out  # no rows: an error on both
    messages = sorted(str(e) for e in out)
    assert any("called while the rank's previous call runs (from another thread)" in m for m in messages)
    assert any("a peer rank stalled past the 1 s timeout" in m for m in messages)


def test_every_surviving_rank_gets_every_ranks_real_rows_or_an_error():
    # stalls around the timeout and failing bodies, many times over: a collective that returns
    # holds exactly the P buffers of that collective, in rank order
    rng = random.Random(41)
    for _ in range(40):
        P, timeout = rng.choice([2, 3, 4]), 0.05
        stall = {r: rng.choice([0.0, 0.0, 0.0, 0.04, 0.06]) for r in range(P)}
        fail = rng.randrange(P + 3)  # a rank that raises at its third collective, or none
        seen = []

        def body(r, all_gather, stall=stall, fail=fail, seen=seen, P=P):
            for k in range(5):
                if k == 2 and r == fail:
                    raise RuntimeError("rank failed")
                time.sleep(stall[r] if k == 3 else 0.0)
                out = all_gather(torch.tensor([[r, k]]))
                seen.append((k, out.tolist()))
                assert out.tolist() == [[q, k] for q in range(P)], out.tolist()

        try:
            ThreadedAllGather(P, timeout=timeout).run(body)
        except (CollectiveError, RuntimeError):  # a stall past the timeout, or the failing rank
            pass  # a wrong row is an AssertionError, raised from run() and failing the test
        assert all(rows == [[q, k] for q in range(len(rows))] for k, rows in seen)
