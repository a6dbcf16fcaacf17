"""Recording what a serving engine schedules, as a `pcp_fn` trace that replays anywhere.

    PCP_FN_RECORD_SCHEDULE=/var/tmp/pcp-{pid}.jsonl PCP_FN_PCP_MANAGER=1 vllm serve ...
    pcp-fn replay /var/tmp/pcp-4242.jsonl

A drop-in given a path (the environment variable
[`RECORD_ENV`][pcp_fn.adapters.recording.RECORD_ENV], or its `record_schedule` argument) hands
every step it lays out to a [`TraceRecorder`][pcp_fn.adapters.recording.TraceRecorder]: the
scheduler's per-request arrays in the engine's row order, its prefill flags and persistent rows,
and the batch descriptor (version 2 of [`pcp_fn.sim.trace`][]'s format). No token id, text or
KV slot is recorded.

Serving never waits on the disk, nor on the JSON:

- [`record`][pcp_fn.adapters.recording.TraceRecorder.record] copies the step's arrays and appends
  them to a queue (no lock, no syscall: about a microsecond);
- a feeder thread packs the queued steps into binary frames and writes them to a writer process
  ([`pcp_fn.adapters.trace_writer`][]), which makes the JSON lines and writes the file: the
  encoding holds no GIL of the engine's;
- the queue is bounded: a feeder `max_pending` steps behind stops the recording (logged once), as
  does the writer's stop (the step that would make the file pass `max_bytes`, a full disk: its
  reason logged once). Serving goes on; what was written stays a valid trace;
- every write is whole lines (a short write is cut back to the last whole line); an engine that
  dies, even by SIGKILL, closes the writer's input, and the writer writes the steps it was sent
  before it ends. The trace's lines all parse and replay.

One process records: the global rank 0 when `torch.distributed` is initialized, else PCP rank 0
(every rank lays out the same global batch). `{pid}` in the path is the process id; an existing
file is refused at construction (a restart never overwrites an earlier recording).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..protocol.config import PCPConfig
from ..sim.trace import BatchDesc, EngineInfo, header_line
from . import trace_writer

logger = logging.getLogger("pcp_fn.adapters")

RECORD_ENV = "PCP_FN_RECORD_SCHEDULE"
"""The environment variable naming the trace file a drop-in records to (`{pid}`: the process id)."""

DEFAULT_MAX_BYTES = 1 << 30
"""The largest trace a recorder writes (1 GiB); the step that would pass it stops the recording."""

DEFAULT_MAX_PENDING = 4096
"""Steps the feeder may fall behind before the recording stops (the queue's bound)."""

_MAX_DESCRIPTORS = 1024  # packed descriptors the feeder keeps (a server has one per graph)
_POLL_S = 0.01  # the feeder's wait for new steps: the serving thread never signals it
_CLOSE_TIMEOUT_S = 30.0


def record_path(explicit: str | os.PathLike[str] | None) -> str | None:
    """The path a drop-in records to: `explicit`, else `$PCP_FN_RECORD_SCHEDULE`, else `None`
    (no recording); `{pid}` formatted. An empty `explicit` (`""`) records nothing, whatever the
    environment says."""
    path = os.fspath(explicit) if explicit is not None else os.environ.get(RECORD_ENV)
    return path.replace("{pid}", str(os.getpid())) if path else None


def is_recording_process(pcp_rank: int) -> bool:
    """Whether this process records: the global rank 0 of an initialized `torch.distributed`
    group, else PCP rank 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return pcp_rank == 0


@dataclasses.dataclass
class RecorderStats:
    """What a [`TraceRecorder`][pcp_fn.adapters.recording.TraceRecorder] has done."""

    steps_recorded: int = 0  # handed to record() and queued
    steps_written: int | None = None  # on disk, whole lines: known once closed (the writer says)
    bytes_written: int | None = None  # the file's size, the header included: known once closed
    stopped: str | None = None  # why the recording stopped early (None: it did not)


class TraceRecorder:
    """Records an engine's steps to a trace file without making serving wait.

    Args:
        path: the trace file; created with its header (an existing file raises
            `FileExistsError`).
        config: the header's config (`pcp_rank` is not written).
        engine: the header's [`EngineInfo`][pcp_fn.sim.trace.EngineInfo].
        max_bytes: the file's largest size (default
            [`DEFAULT_MAX_BYTES`][pcp_fn.adapters.recording.DEFAULT_MAX_BYTES]).
        max_pending: steps the feeder may fall behind (default
            [`DEFAULT_MAX_PENDING`][pcp_fn.adapters.recording.DEFAULT_MAX_PENDING]).
        describe: turns the engine's batch descriptor, as handed to
            [`record`][pcp_fn.adapters.recording.TraceRecorder.record], into a
            [`BatchDesc`][pcp_fn.sim.trace.BatchDesc], in the feeder thread (default: it is one).

    Raises:
        ValueError: `max_bytes` below the header's size or `max_pending` below 1.
        OSError: the file cannot be created (its folder is missing, it exists, ...) or the
            writer process cannot start: at the engine's start-up, never later.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: PCPConfig,
        engine: EngineInfo,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_pending: int = DEFAULT_MAX_PENDING,
        describe: Callable[[Any], BatchDesc] | None = None,
    ) -> None:
        header = header_line(config, engine).encode()
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < len(header):
            raise ValueError(
                f"max_bytes must be an int of at least the header's {len(header)} bytes, got {max_bytes!r}"
            )
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be a positive int, got {max_pending!r}")
        self.path = os.fspath(path)
        self.max_bytes, self.max_pending = max_bytes, max_pending
        self.describe = describe
        self._descs: dict[int, tuple[Any, bytes]] = {}  # the feeder's packed descriptors, by object
        self.stats = RecorderStats()
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._closing = threading.Event()
        self._accepting = True  # False once closing or stopped: record() returns at once
        self._warned = False
        self._report_lock = threading.Lock()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            os.write(fd, header)  # one line: whole, or the start-up fails here
        finally:
            os.close(fd)
        # the writer: a script run by path, so it imports neither pcp_fn nor torch
        self._writer = subprocess.Popen(
            [sys.executable, trace_writer.__file__, self.path, str(max_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._feeder = threading.Thread(target=self._feed, name="pcp_fn-trace-recorder", daemon=True)
        self._feeder.start()
        atexit.register(self.close)

    @property
    def writer_pid(self) -> int:
        """The writer process's id (to place it on a CPU of its own, say)."""
        return self._writer.pid

    @property
    def recording(self) -> bool:
        """`True` until the recording stops (a limit, a write error, `close()`)."""
        return self.stats.stopped is None and not self._closing.is_set()

    def record(
        self,
        num_scheduled: np.ndarray | bytes,
        num_computed: np.ndarray | bytes,
        num_prompt: np.ndarray | bytes,
        is_prefilling: np.ndarray | bytes | None = None,
        idx_mapping: np.ndarray | bytes | None = None,
        batch_desc: Any = None,
    ) -> None:
        """Queue one step (`[num_reqs]` arrays in the engine's row order, `is_prefilling` and
        `idx_mapping` for an MRV2 engine's trace only; copied, so the engine
        may reuse its buffers; `batch_desc` is kept as given, an immutable descriptor, and
        converted by `describe` in the feeder). Never blocks and never raises for the disk's
        sake: it costs the serving thread the copies and an append.

        A field may also come as `bytes` in its frame dtype (int32 counts, bool flags, int64
        `idx_mapping`): immutable, kept as they are (a caller that has them spares the copy)."""
        if not self._accepting:  # (a plain attribute: an Event's is_set is a method call)
            return
        pending = self._pending
        if len(pending) >= self.max_pending:
            self._stop(f"the writer is {len(pending)} steps behind (max_pending={self.max_pending})")
            return
        pending.append(
            (
                num_scheduled if num_scheduled.__class__ is bytes else num_scheduled.copy(),
                num_computed if num_computed.__class__ is bytes else num_computed.copy(),
                num_prompt if num_prompt.__class__ is bytes else num_prompt.copy(),
                is_prefilling
                if is_prefilling is None or is_prefilling.__class__ is bytes
                else is_prefilling.copy(),
                idx_mapping if idx_mapping is None or idx_mapping.__class__ is bytes else idx_mapping.copy(),
                batch_desc,
            )
        )
        self.stats.steps_recorded += 1

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Send what is queued, end the writer's input and wait for it (at most `timeout`
        seconds each); then [`stats`][pcp_fn.adapters.recording.RecorderStats] says what is on
        disk. Idempotent."""
        if self._closing.is_set():
            return
        self._accepting = False
        self._closing.set()
        self._feeder.join(timeout)
        if self._feeder.is_alive():
            self._stop(f"the feeder did not finish within {timeout} s of close()")
            return
        self._writer_report(timeout)

    # -- the feeder thread ---------------------------------------------------------------------

    def _feed(self) -> None:
        """The thread: queued steps as frames into the writer's input until closed or stopped,
        then the input closed (the writer writes what it read and ends)."""
        pipe = self._writer.stdin
        try:
            while self.stats.stopped is None:
                if not self._pending:
                    if self._closing.wait(_POLL_S) and not self._pending:
                        break
                    continue
                frames = []
                while self._pending and len(frames) < 256:
                    *arrays, desc = self._pending.popleft()
                    packed = None if desc is None else self._packed_desc(desc)
                    frames.append(trace_writer.encode_frame(*arrays, packed))
                pipe.write(b"".join(frames))  # blocks this thread only; the GIL is released
                pipe.flush()
        except BrokenPipeError:  # the writer ended: it stopped, and says why
            self._writer_report(_CLOSE_TIMEOUT_S)
            self._stop(self.stats.stopped or "the writer process ended")
        except Exception as e:  # never let the thread die silently: say why recording stopped
            self._stop(f"{type(e).__name__}: {e}")
        finally:
            try:
                pipe.close()
            except OSError:
                pass

    def _packed_desc(self, desc: Any) -> bytes:
        """A descriptor's frame bytes, made once per descriptor object (vLLM's dispatcher hands
        out one per graph; the object is held, so its id is not reused while cached)."""
        held = self._descs.get(id(desc))
        if held is not None and held[0] is desc:
            return held[1]
        packed = trace_writer.pack_desc(self.describe(desc) if self.describe is not None else desc)
        if len(self._descs) >= _MAX_DESCRIPTORS:
            self._descs.clear()
        self._descs[id(desc)] = (desc, packed)
        return packed

    def _writer_report(self, timeout: float) -> None:
        """Wait for the writer (its input closed) and read its report: steps and bytes on disk,
        and why it stopped. Read once (by the feeder when the writer ended first)."""
        with self._report_lock:
            if self._writer.stdout.closed:
                return
            try:
                self._writer.wait(timeout)
            except subprocess.TimeoutExpired:
                self._stop(f"the writer did not finish within {timeout} s")
                return
            out = self._writer.stdout.read()
            self._writer.stdout.close()
        try:
            said = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            self._stop(f"the writer process ended with status {self._writer.returncode} and no report")
            return
        self.stats.steps_written, self.stats.bytes_written = said["steps"], said["bytes"]
        if said["stopped"] is not None:
            self._stop(said["stopped"])

    def _stop(self, why: str) -> None:
        self._accepting = False
        if self.stats.stopped is None:
            self.stats.stopped = why
            self._pending.clear()
        if not self._warned:
            self._warned = True
            logger.warning(
                "pcp_fn: recording to %s stopped: %s; serving goes on, and the steps written replay",
                self.path,
                why,
            )
