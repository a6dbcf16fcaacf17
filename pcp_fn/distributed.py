"""The all-gather that PCP needs, as an injectable callable, restore-after-gather, and fault checks.

An `AllGather` takes this rank's fixed-size local buffer `[L_b, ...]` and
returns the `P` ranks' buffers stacked rank-major `[P * L_b, ...]`:

- [`process_group_all_gather`][pcp_fn.process_group_all_gather] uses `torch.distributed`'s functional
  collectives (`all_gather_single`), which `torch.compile` traces into the
  graph; it works on any backend (gloo on the CPU, NCCL on CUDA, HCCL on Ascend),
  nothing here is backend-specific.
- [`ThreadedAllGather`][pcp_fn.distributed.ThreadedAllGather] simulates `P` ranks inside one process (one
  thread per rank, a barrier per collective), for tests and tools.

Faults end every rank with an error instead of a hang or a wrong answer:

- [`init_process_group`][pcp_fn.distributed.init_process_group] is the one process group this package creates;
  it always has a timeout (default [`DEFAULT_TIMEOUT`][pcp_fn.distributed.DEFAULT_TIMEOUT], a minute, where
  gloo's own default is 30 minutes), so a stalled or dead peer ends every
  other rank's collective with an error within it.
- Both all-gathers check, in eager mode, that every rank brings the same shape
  and dtype before the data moves (gloo aborts the process on a size
  mismatch); the check all-gathers a fixed-size descriptor first.
- [`check_same_batch`][pcp_fn.distributed.check_same_batch] all-gathers a small digest of one step's batch
  ([`batch_digest`][pcp_fn.distributed.batch_digest]) and names the ranks that disagree (equal
  sizes, different token ids would otherwise finish with wrong tokens);
  [`pcp_fn.sim.engine.Runner`][] calls it once per step.

    init_process_group("gloo", init_method="file:///tmp/pcp", rank=r, world_size=P)
    gather = process_group_all_gather()
    state, hidden = all_gather_and_restore(state, local_hidden, gather)
"""

from __future__ import annotations

import datetime
import hashlib
import re
import threading
import time
import zlib
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

if dist.is_available():  # torch builds without distributed support still import pcp_fn
    from torch.distributed import _functional_collectives as funcol

from .protocol.state import PCPState
from .restore import restore_hidden_states

AllGather = Callable[[torch.Tensor], torch.Tensor]
"""An all-gather along dim 0 over the PCP group: `[L_b, ...] -> [P * L_b, ...]`, rank order."""

DEFAULT_TIMEOUT = datetime.timedelta(seconds=60)
"""Timeout of every collective of a process group this package creates (gloo's default is 30 min)."""

_MAX_DIMS = 8


class CollectiveError(RuntimeError):
    """A collective failed on this rank: a peer stalled past the timeout, died, or disagreed."""


class CollectiveMismatch(CollectiveError):
    """Ranks brought different things to one collective (shapes, dtypes, or a step's batch)."""


def _backend_message(e: BaseException) -> str:
    """The backend's message on one line, without gloo's source-location prefix."""
    text = " ".join(str(e).split())
    return re.sub(r"^\[[^\]]*\]\s*", "", text)


def _as_timedelta(timeout: datetime.timedelta | float) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout must be seconds or a timedelta, got {type(timeout).__name__}")
    if not seconds > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {seconds}")
    return datetime.timedelta(seconds=seconds)


def init_process_group(
    backend: str = "gloo",
    *,
    init_method: str,
    rank: int,
    world_size: int,
    timeout: datetime.timedelta | float = DEFAULT_TIMEOUT,
) -> None:
    """`torch.distributed.init_process_group` with a timeout (seconds or a timedelta).

    Every collective of the group, and the rendezvous itself, fails after
    `timeout` when a peer stalls or dies, on every waiting rank.
    """
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=_as_timedelta(timeout)
    )


def _all_gather_single(local: torch.Tensor, group: object) -> torch.Tensor:
    # all_gather_single replaced all_gather_tensor, which warns (FutureWarning) on torch 2.13
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    out = gather(local, 0, group)
    # eager mode returns an AsyncCollectiveTensor; wait so callers get a plain tensor
    return funcol.wait_tensor(out) if isinstance(out, funcol.AsyncCollectiveTensor) else out


def _dtype_code(dtype: torch.dtype) -> int:
    """The same integer for a dtype in every process (a CRC of its name)."""
    return zlib.crc32(str(dtype).encode())


def _describe(t: torch.Tensor) -> torch.Tensor:
    """A fixed-size int64 descriptor of `t`: ndim, dtype code, shape (at most `_MAX_DIMS` dims)."""
    if t.dim() > _MAX_DIMS:
        raise ValueError(f"all_gather supports at most {_MAX_DIMS} dims, got shape {tuple(t.shape)}")
    desc = [t.dim(), _dtype_code(t.dtype), *t.shape] + [0] * (_MAX_DIMS - t.dim())
    return torch.tensor(desc, dtype=torch.int64, device=t.device)


def _explain(descs: Sequence[Sequence[int]], local: torch.Tensor) -> str:
    parts = []
    for r, d in enumerate(descs):
        ndim, code = int(d[0]), int(d[1])
        dtype = str(local.dtype) if code == _dtype_code(local.dtype) else "another dtype"
        parts.append(f"rank {r}: {dtype}{tuple(int(x) for x in d[2 : 2 + ndim])}")
    return ", ".join(parts)


def process_group_all_gather(group: object = None, *, check_sizes: bool = True) -> AllGather:
    """All-gather along dim 0 over `group` (default: the world) with functional collectives.

    With `check_sizes` (default), an eager call first all-gathers a
    fixed-size descriptor of the local buffer (shape, dtype) and raises
    [`CollectiveMismatch`][pcp_fn.distributed.CollectiveMismatch] on every rank, naming each rank's
    shape, when they differ; gloo would abort the process. Under `torch.compile` the
    check is left out (it reads values on the host): shapes are static there
    and derive from the batch, which [`check_same_batch`][pcp_fn.distributed.check_same_batch] compares.

    In eager mode a failure of the backend (a peer that stalled past the
    group's timeout, or died) is raised as [`CollectiveError`][pcp_fn.distributed.CollectiveError] with the
    backend's message on one line.
    """

    def all_gather(local: torch.Tensor) -> torch.Tensor:
        pg = group if group is not None else dist.group.WORLD
        if torch.compiler.is_compiling():
            return _all_gather_single(local.contiguous(), pg)
        try:
            if check_sizes:
                descs = _all_gather_single(_describe(local), pg).view(-1, 2 + _MAX_DIMS)
                if not bool((descs == descs[0]).all()):
                    raise CollectiveMismatch(
                        f"all_gather: the ranks' buffers differ ({_explain(descs.tolist(), local)}); "
                        "every rank must run the same batch"
                    )
            return _all_gather_single(local.contiguous(), pg)
        except CollectiveError:
            raise
        except RuntimeError as e:
            raise CollectiveError(
                f"all_gather on rank {dist.get_rank(pg)} of {dist.get_world_size(pg)} failed: a peer rank "
                f"stalled past the process group's timeout or died ({_backend_message(e)})"
            ) from e

    return all_gather


class ThreadedAllGather:
    """`P` ranks in one process: `gather.for_rank(r)` is rank `r`'s `AllGather`.

    Every rank's thread must call its collective the same number of times, in
    the same order (as with a real process group). A rank that does not arrive
    within `timeout` seconds, or that fails ([`abort`][pcp_fn.distributed.ThreadedAllGather.abort]),
    ends every waiting rank with [`CollectiveError`][pcp_fn.distributed.CollectiveError]; ranks that
    bring different shapes or dtypes all raise
    [`CollectiveMismatch`][pcp_fn.distributed.CollectiveMismatch].

    A collective returns every rank's buffer of that very collective or raises. The
    barrier counts arrivals, not ranks, so the ranks must be distinct: `for_rank`
    takes `0 <= rank < world_size` only, and a rank's `all_gather` called from a
    second thread while its first call runs raises instead of standing in for another
    rank (which once returned one caller's buffer in place of the missing rank's).
    """

    def __init__(self, world_size: int, timeout: datetime.timedelta | float = DEFAULT_TIMEOUT) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise TypeError(f"world_size must be an int, got {type(world_size).__name__} {world_size!r}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1 (ranks to run), got {world_size}")
        self.world_size = world_size
        self.timeout = _as_timedelta(timeout).total_seconds()
        self._slots: list[torch.Tensor | None] = [None] * world_size  # this collective's buffers
        self._in_call = [threading.Lock() for _ in range(world_size)]  # one caller per rank at a time
        self._barrier = threading.Barrier(world_size, timeout=self.timeout)

    def _wait(self, rank: int) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            raise CollectiveError(
                f"all_gather on rank {rank} of {self.world_size} failed: a peer rank stalled past the "
                f"{self.timeout:g} s timeout or failed"
            ) from None

    def abort(self) -> None:
        """Break the collective: every rank waiting in it (or arriving later) raises."""
        self._barrier.abort()

    def run(self, body: Callable[[int, AllGather], object]) -> list[object]:
        """`body(rank, all_gather)` for every rank, each on its own thread; their results in
        rank order. A rank that raises breaks the collective (its peers stop waiting instead
        of timing out) and the first failure is raised here once every thread has ended.

        Once one rank has ended (returned or raised), every other rank has `timeout`
        seconds to end too; one still running then (blocked outside a collective, or
        waiting for a rank that has left) is reported as
        [`CollectiveError`][pcp_fn.distributed.CollectiveError] naming it, and left behind (a daemon
        thread: it does not keep the process alive; the collective is broken, so any collective it
        reaches raises).
        """
        results: list[object] = [None] * self.world_size
        errors: list[tuple[int, BaseException]] = []
        ended: list[int] = []  # ranks in the order they ended
        first_end = threading.Event()

        def rank_thread(rank: int) -> None:
            try:
                results[rank] = body(rank, self.for_rank(rank))
            except BaseException as e:  # surfaced below; the peers are released now
                errors.append((rank, e))
                self.abort()
            finally:
                ended.append(rank)
                first_end.set()

        threads = [
            threading.Thread(target=rank_thread, args=(r,), name=f"pcp_fn rank {r}", daemon=True)
            for r in range(self.world_size)
        ]
        for t in threads:
            t.start()
        first_end.wait()  # a body may compute as long as it needs; waiting on the others is bounded
        deadline = time.monotonic() + self.timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, t in enumerate(threads) if t.is_alive()]
        if stuck:
            self.abort()
            raise CollectiveError(self._stuck(stuck, ended[0], errors)) from (
                errors[0][1] if errors else None
            )
        if errors:
            raise errors[0][1]
        return results

    def _stuck(self, stuck: list[int], first: int, errors: list[tuple[int, BaseException]]) -> str:
        ranks = f"rank {stuck[0]}" if len(stuck) == 1 else f"ranks {stuck}"
        failed = {r: e for r, e in errors}
        how = (
            f"failed ({type(failed[first]).__name__}: {_backend_message(failed[first])})"
            if first in failed
            else "returned"
        )
        return (
            f"ThreadedAllGather.run: {ranks} of {self.world_size} still running {self.timeout:g} s after "
            f"rank {first} {how}; every rank must run the same collectives and end within the timeout"
        )

    def for_rank(self, rank: int) -> AllGather:
        """Rank `rank`'s `AllGather` (`0 <= rank < world_size`)."""
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__} {rank!r}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {rank}")

        def all_gather(local: torch.Tensor) -> torch.Tensor:
            if not self._in_call[rank].acquire(blocking=False):
                raise CollectiveError(
                    f"all_gather on rank {rank} of {self.world_size}: called while the rank's previous "
                    "call runs (from another thread); each rank runs its collectives on one thread"
                )
            try:
                return self._gather(rank, local)
            finally:
                self._in_call[rank].release()

        return all_gather

    def _gather(self, rank: int, local: torch.Tensor) -> torch.Tensor:
        self._slots[rank] = local
        self._wait(rank)  # everyone has deposited
        slots = [t for t in self._slots if t is not None]
        if any(t.shape != local.shape or t.dtype != local.dtype for t in slots):
            listed = ", ".join(f"rank {r}: {t.dtype}{tuple(t.shape)}" for r, t in enumerate(slots))
            self._wait(rank)  # every rank has read the same buffers before any leaves
            self._slots[rank] = None
            raise CollectiveMismatch(
                f"all_gather: the ranks' buffers differ ({listed}); every rank must run the same batch"
            )
        out = torch.cat(slots)
        self._wait(rank)  # everyone has read before the next collective overwrites
        self._slots[rank] = None  # not kept alive until the next collective
        return out


def batch_digest(*arrays: Sequence[int]) -> torch.Tensor:
    """`[1, 4]` int64: a SHA-256 of integer arrays (a step's schedule, slots and token ids)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(len(a).to_bytes(8, "little"))
        h.update(b"".join(int(x).to_bytes(8, "little", signed=True) for x in a))
    words = [int.from_bytes(h.digest()[i : i + 8], "little", signed=True) for i in range(0, 32, 8)]
    return torch.tensor([words], dtype=torch.int64)


def check_same_batch(all_gather: AllGather, digest: torch.Tensor) -> None:
    """All-gather every rank's `[1, 4]` batch digest
    ([`batch_digest`][pcp_fn.distributed.batch_digest]) and raise when they differ.

    Raises [`CollectiveMismatch`][pcp_fn.distributed.CollectiveMismatch] on every rank, naming the groups of
    ranks that agree with each other (`ranks [0, 2], ranks [1]`); the engine
    adds the step.
    """
    digests = all_gather(digest.reshape(1, -1)).tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, d in enumerate(digests):
        groups.setdefault(tuple(d), []).append(r)
    if len(groups) > 1:
        listed = ", ".join(f"ranks {ranks}" for ranks in groups.values())
        raise CollectiveMismatch(
            f"the ranks run different batches ({listed} agree among themselves); "
            "every rank must schedule the same batch"
        )


def all_gather_and_restore(
    state: PCPState, local: torch.Tensor, all_gather: AllGather
) -> tuple[PCPState, torch.Tensor]:
    """All-gather this rank's `[L_b, ...]` local buffer and restore request order.

    Returns `[P * L_b, ...]` like [`pcp_fn.restore_hidden_states`][]: rows
    `[:P * num_tokens]` in padded request order.
    """
    return restore_hidden_states(state, all_gather(local))
