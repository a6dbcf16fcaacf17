"""The recording's writer process: the engine's steps, as binary frames on its stdin, become
whole JSON lines of the trace file.

[`TraceRecorder`][pcp_fn.adapters.recording.TraceRecorder] starts it as
`python <this file> PATH MAX_BYTES` (a script: it imports the standard library and numpy, never
`pcp_fn` or torch, so it starts in a fraction of a second and holds no GIL the engine needs).
It appends to the file the recorder created (the header is already there):

- every write is whole lines: one `os.write` of complete lines; a short write (a full disk) is
  cut back to the last whole line, so the file parses whatever ends the process;
- the step that would make the file pass `MAX_BYTES` ends the recording;
- the end of its stdin (the engine closed the recording, or died: even a SIGKILLed engine's
  last steps are written) ends it too, after the steps already read.

On exit it prints one JSON object to stdout, `{"steps": N, "bytes": B, "stopped": null | why}`
(the recorder logs a stop's reason). SIGINT is ignored: a Ctrl-C to the engine's process group
lets it drain instead.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import sys
from typing import Any, BinaryIO

import numpy as np

FRAME = struct.Struct("<IIB")
"""A frame's head: the payload's bytes, the step's requests `n`, flags (`HAS_IDX`, `HAS_DESC`,
`HAS_PREFILLING`: which optional fields follow the counts)."""
DESC = struct.Struct("<bqqqq")
"""The batch descriptor: the mode's index in `CG_MODES` (`NONE`, `PIECEWISE`, `FULL`),
`num_tokens`, `num_reqs`, `max_query_len`, `uniform_token_count` (-1: `None`)."""
HAS_IDX, HAS_DESC, HAS_PREFILLING = 1, 2, 4
CG_MODES = ("NONE", "PIECEWISE", "FULL")  # pcp_fn.sim.trace.CG_MODES
DESC_FIELDS = ("cg_mode", "num_tokens", "num_reqs", "max_query_len", "uniform_token_count")  # BatchDesc


def encode_frame(
    num_scheduled: np.ndarray | bytes,
    num_computed: np.ndarray | bytes,
    num_prompt: np.ndarray | bytes,
    is_prefilling: np.ndarray | bytes | None = None,
    idx_mapping: np.ndarray | bytes | None = None,
    desc: tuple[str, int | None, int | None, int | None, int | None] | bytes | None = None,
) -> bytes:
    """One step as a frame: `[n]` int32 counts (the engine's values, checked within int32),
    then the fields given: `[n]` bool prefill flags, `[n]` int64 `idx_mapping`, the descriptor
    `(cg_mode, num_tokens, num_reqs, max_query_len, uniform_token_count)` (or its
    [`pack_desc`][pcp_fn.adapters.trace_writer.pack_desc] bytes, which a recorder keeps per
    descriptor). An array may come as `bytes` already in its frame dtype."""
    n = len(num_scheduled) // 4 if num_scheduled.__class__ is bytes else num_scheduled.shape[0]
    # the arrays themselves where they have the frame's dtype (bytes.join reads their buffers:
    # one copy, into the frame), converted otherwise
    parts = [FRAME, _as(num_scheduled, _I32), _as(num_computed, _I32), _as(num_prompt, _I32)]
    flags, size = 0, 12 * n
    if is_prefilling is not None:
        flags, size = flags | HAS_PREFILLING, size + n
        parts.append(_as(is_prefilling, _BOOL))
    if idx_mapping is not None:
        flags, size = flags | HAS_IDX, size + 8 * n
        parts.append(_as(idx_mapping, _I64))
    if desc is not None:
        flags, size = flags | HAS_DESC, size + DESC.size
        parts.append(desc if isinstance(desc, bytes) else pack_desc(desc))
    parts[0] = FRAME.pack(size, n, flags)
    return b"".join(parts)


def pack_desc(desc: tuple[str, int | None, int | None, int | None, int | None]) -> bytes:
    """A descriptor's [`DESC`][pcp_fn.adapters.trace_writer.DESC] bytes (`None` as -1)."""
    mode, *sizes = desc
    return DESC.pack(CG_MODES.index(mode), *(-1 if v is None else v for v in sizes))


_I32, _I64, _BOOL = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)


def _as(array: np.ndarray | bytes, dtype: np.dtype) -> np.ndarray | bytes:
    """`array` with `dtype`, C-contiguous (itself when it already is, or is `bytes`)."""
    if array.__class__ is bytes or (array.dtype is dtype and array.flags.c_contiguous):
        return array
    return np.ascontiguousarray(array, dtype=dtype)


def decode_frame(payload: bytes, n: int, flags: int) -> tuple[Any, ...]:
    """[`encode_frame`][pcp_fn.adapters.trace_writer.encode_frame]'s arguments back, the
    descriptor as a dict in the trace's field order."""
    ints = np.frombuffer(payload, np.int32, 3 * n)
    at = 12 * n
    prefilling = None
    if flags & HAS_PREFILLING:
        prefilling = np.frombuffer(payload, np.bool_, n, at)
        at += n
    idx = None
    if flags & HAS_IDX:
        idx = np.frombuffer(payload, np.int64, n, at)
        at += 8 * n
    desc = None
    if flags & HAS_DESC:
        mode, *sizes = DESC.unpack_from(payload, at)
        desc = dict(zip(DESC_FIELDS, (CG_MODES[mode], *(None if v < 0 else v for v in sizes))))
    return ints[:n], ints[n : 2 * n], ints[2 * n :], prefilling, idx, desc


def engine_step_line(
    index: int,
    num_scheduled: np.ndarray,
    num_computed: np.ndarray,
    num_prompt: np.ndarray,
    is_prefilling: np.ndarray | None = None,
    idx_mapping: np.ndarray | None = None,
    desc: dict[str, Any] | None = None,
) -> str:
    """The trace's line of an engine's step ([`pcp_fn.sim.trace.step_line`][]'s text, tested equal):
    `str` of an int list is its JSON, and cheaper to make."""
    text = (
        f'{{"step": {index}, "num_scheduled": {num_scheduled.tolist()}, '
        f'"num_computed": {num_computed.tolist()}, "num_prompt": {num_prompt.tolist()}'
    )
    if is_prefilling is not None:
        text += f', "is_prefilling": {json.dumps(is_prefilling.tolist())}'
    if idx_mapping is not None:
        text += f', "idx_mapping": {idx_mapping.tolist()}'
    if desc is not None:
        text += f', "batch_desc": {json.dumps(desc)}'
    return text + "}\n"


class LineWriter:
    """Whole lines to `fd` (opened for append), at most `max_bytes` in the file."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd, self.max_bytes = fd, max_bytes
        self.size = os.fstat(fd).st_size  # the header the recorder wrote
        self.steps = 0
        self.stopped: str | None = None

    def write(self, lines: list[bytes]) -> None:
        """Write `lines` (each ending in a newline), or those that fit before `max_bytes` and
        stop; a failed or short write stops with the file cut back to its last whole line."""
        size, fit = self.size, 0
        for line in lines:
            if size + len(line) > self.max_bytes:
                self.stopped = f"the trace reached max_bytes={self.max_bytes}"
                break
            size, fit = size + len(line), fit + 1
        data = b"".join(lines[:fit])
        if data:
            try:
                written = os.write(self.fd, data)
                if written != len(data):
                    os.ftruncate(self.fd, self.size)
                    raise OSError(errno.ENOSPC, f"wrote {written} of {len(data)} bytes")
            except OSError as e:
                self.stopped = f"writing failed: {e}"
                return
            self.size, self.steps = size, self.steps + fit


def run(stream: BinaryIO, writer: LineWriter) -> None:
    """Frames from `stream` into `writer` until the stream ends or the writer stops; the frames
    already buffered are written together (up to 256 steps a write)."""
    while writer.stopped is None:
        step = _read_step(stream)
        if step is None:
            return  # the engine closed the recording (or died): what was read is written
        lines = [engine_step_line(writer.steps, *step).encode()]
        while len(lines) < 256 and _more(stream):
            step = _read_step(stream)
            if step is None:
                break
            lines.append(engine_step_line(writer.steps + len(lines), *step).encode())
        writer.write(lines)
        if step is None:
            return


def _read_step(stream: BinaryIO) -> tuple[Any, ...] | None:
    """The next frame's step, or `None` at the end (a frame cut short by the engine's death is
    not a step)."""
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    size, n, flags = FRAME.unpack(head)
    payload = stream.read(size)
    return None if len(payload) < size else decode_frame(payload, n, flags)


def _more(stream: BinaryIO) -> bool:
    """Whether `stream` has bytes buffered (a frame ready without waiting)."""
    peek = getattr(stream, "peek", None)
    return bool(peek is not None and peek(1))


def main(argv: list[str]) -> int:
    path, max_bytes = argv[0], int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    writer = LineWriter(fd, max_bytes)
    try:
        run(sys.stdin.buffer, writer)
    finally:
        os.close(fd)
    print(json.dumps({"steps": writer.steps, "bytes": writer.size, "stopped": writer.stopped}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
