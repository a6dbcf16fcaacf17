"""Recording what a serving engine schedules, as a `pcp_fn` trace that replays anywhere.

    PCP_FN_RECORD_SCHEDULE=/var/tmp/pcp-{pid}.jsonl PCP_FN_PCP_MANAGER=1 vllm serve ...
    pcp-fn replay /var/tmp/pcp-4242.jsonl

A drop-in given a path (the environment variable
[`RECORD_ENV`][pcp_fn.adapters.recording.RECORD_ENV], or its `record_schedule` argument) hands
every step it lays out to a [`TraceRecorder`][pcp_fn.adapters.recording.TraceRecorder]: the
scheduler's per-request arrays in the engine's row order, its prefill flags and persistent rows,
and the batch descriptor (version 2 of [`pcp_fn.sim.trace`][]'s format). No token id, text or
KV slot is recorded.

Serving never waits on the disk:

- [`record`][pcp_fn.adapters.recording.TraceRecorder.record] copies the step's arrays and appends
  them to a queue (no lock, no syscall); a background thread turns them into JSON lines and
  writes them;
- the queue is bounded: a writer `max_pending` steps behind stops the recording (logged once),
  as does any `OSError` (a full disk, a closed file) and the step that would make the file pass
  `max_bytes`. Serving goes on; what was written stays a valid trace;
- every write is whole lines (one `os.write` of complete lines on a file opened for append; a
  short write is cut back to the last whole line), so a process killed at any moment leaves a
  trace whose lines all parse and replay.

One process records: the global rank 0 when `torch.distributed` is initialized, else PCP rank 0
(every rank lays out the same global batch). `{pid}` in the path is the process id; an existing
file is refused at construction (a restart never overwrites an earlier recording).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import errno
import logging
import os
import threading
from typing import Any

import numpy as np

from ..protocol.config import PCPConfig
from ..sim.trace import BatchDesc, EngineInfo, TraceStep, header_line, step_line

logger = logging.getLogger("pcp_fn.adapters")

RECORD_ENV = "PCP_FN_RECORD_SCHEDULE"
"""The environment variable naming the trace file a drop-in records to (`{pid}`: the process id)."""

DEFAULT_MAX_BYTES = 1 << 30
"""The largest trace a recorder writes (1 GiB); the step that would pass it stops the recording."""

DEFAULT_MAX_PENDING = 4096
"""Steps the writer may fall behind before the recording stops (the queue's bound)."""

_POLL_S = 0.01  # the writer's wait for new steps: the serving thread never signals it
_CLOSE_TIMEOUT_S = 10.0


def record_path(explicit: str | os.PathLike[str] | None) -> str | None:
    """The path a drop-in records to: `explicit`, else `$PCP_FN_RECORD_SCHEDULE`, else `None`
    (no recording); `{pid}` formatted."""
    path = os.fspath(explicit) if explicit is not None else os.environ.get(RECORD_ENV) or None
    return None if path is None else path.replace("{pid}", str(os.getpid()))


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
    steps_written: int = 0  # on disk, whole lines
    bytes_written: int = 0  # the header included
    stopped: str | None = None  # why the recording stopped early (None: still recording)


class TraceRecorder:
    """Writes an engine's steps to a trace file from a background thread.

    Args:
        path: the trace file; created (an existing file raises `FileExistsError`).
        config: the header's config (`pcp_rank` is not written).
        engine: the header's [`EngineInfo`][pcp_fn.sim.trace.EngineInfo].
        max_bytes: the file's largest size (default
            [`DEFAULT_MAX_BYTES`][pcp_fn.adapters.recording.DEFAULT_MAX_BYTES]).
        max_pending: steps the writer may fall behind (default
            [`DEFAULT_MAX_PENDING`][pcp_fn.adapters.recording.DEFAULT_MAX_PENDING]).

    Raises:
        ValueError: `max_bytes` below the header's size or `max_pending` below 1.
        OSError: the file cannot be created (its folder is missing, it exists, ...): at the
            engine's start-up, never later.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: PCPConfig,
        engine: EngineInfo,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_pending: int = DEFAULT_MAX_PENDING,
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
        self.stats = RecorderStats()
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._closing = threading.Event()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
        self._write_whole(header)
        self._thread = threading.Thread(target=self._writer, name="pcp_fn-trace-recorder", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    @property
    def recording(self) -> bool:
        """`True` until the recording stops (a limit, a write error, `close()`)."""
        return self.stats.stopped is None and not self._closing.is_set()

    def record(
        self,
        num_scheduled: np.ndarray,
        num_computed: np.ndarray,
        num_prompt: np.ndarray,
        is_prefilling: np.ndarray,
        idx_mapping: np.ndarray | None = None,
        batch_desc: BatchDesc | None = None,
    ) -> None:
        """Queue one step (`[num_reqs]` arrays in the engine's row order; copied, so the engine
        may reuse its buffers). Never blocks and never raises for the disk's sake."""
        if self.stats.stopped is not None or self._closing.is_set():
            return
        if len(self._pending) >= self.max_pending:
            self._stop(f"the writer is {len(self._pending)} steps behind (max_pending={self.max_pending})")
            return
        idx = None if idx_mapping is None else idx_mapping.copy()
        arrays = (num_scheduled.copy(), num_computed.copy(), num_prompt.copy(), is_prefilling.copy())
        self._pending.append((*arrays, idx, batch_desc))
        self.stats.steps_recorded += 1

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Write what is queued (waiting at most `timeout` seconds) and close the file. Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._thread.join(timeout)  # the writer closes the file when it ends
        if self._thread.is_alive():
            self._stop(f"the writer did not finish within {timeout} s of close()")

    # -- the writer thread ---------------------------------------------------------------------

    def _writer(self) -> None:
        """The thread: drain the queue into whole-line writes until closed or stopped, then close
        the file (the only code that touches it after the header)."""
        try:
            while self.stats.stopped is None:
                if not self._pending:
                    if self._closing.wait(_POLL_S) and not self._pending:
                        break
                    continue
                lines = []
                while self._pending:
                    args = self._pending.popleft()
                    lines.append(step_line(self.stats.steps_written + len(lines), _step(*args)).encode())
                self._write_lines(lines)
        except Exception as e:  # never let the thread die silently: say why recording stopped
            self._stop(f"{type(e).__name__}: {e}")
        finally:
            self._close_fd()

    def _write_lines(self, lines: list[bytes]) -> None:
        size = self.stats.bytes_written
        for i, line in enumerate(lines):
            size += len(line)
            if size > self.max_bytes:  # the lines before this one fit: write them, then stop
                self._write_whole(b"".join(lines[:i]), i)
                self._stop(f"the trace reached max_bytes={self.max_bytes}")
                return
        self._write_whole(b"".join(lines), len(lines))

    def _write_whole(self, data: bytes, steps: int = 0) -> None:
        """Write complete lines, or none of them (a short write is cut back)."""
        if not data:
            return
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                os.ftruncate(self._fd, self.stats.bytes_written)
                raise OSError(errno.ENOSPC, f"wrote {written} of {len(data)} bytes")
        except OSError as e:
            self._stop(f"writing failed: {e}")
            return
        self.stats.bytes_written += written
        self.stats.steps_written += steps

    def _stop(self, why: str) -> None:
        if self.stats.stopped is None:
            self.stats.stopped = why
            self._pending.clear()
            logger.warning(
                "pcp_fn: recording to %s stopped: %s; serving goes on, and the %d steps written replay",
                self.path,
                why,
                self.stats.steps_written,
            )

    def _close_fd(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def _step(
    num_scheduled: np.ndarray,
    num_computed: np.ndarray,
    num_prompt: np.ndarray,
    is_prefilling: np.ndarray,
    idx_mapping: np.ndarray | None,
    batch_desc: BatchDesc | None,
) -> TraceStep:
    return TraceStep(
        tuple(num_scheduled.tolist()),
        tuple(num_computed.tolist()),
        tuple(num_prompt.tolist()),
        is_prefilling=tuple(is_prefilling.tolist()),
        idx_mapping=None if idx_mapping is None else tuple(idx_mapping.tolist()),
        batch_desc=batch_desc,
    )
