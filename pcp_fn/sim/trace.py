"""Scheduler traces (JSON Lines) and deterministic replay through the pure step.

Format, one JSON object per line:

    {"format": "pcp_fn.trace", "version": 1, "config": {"pcp_size": 4, "max_num_reqs": 16, ...}}
    {"step": 0, "num_scheduled": [40, 7], "num_computed": [0, 0], "num_prompt": [40, 7],
     "slot_mapping": [0, 1, ...]}                       # optional; default 0 .. total-1
    ...

The header's config is a [`pcp_fn.PCPConfig`][] without `pcp_rank`:
replay runs every rank. [`replay`][pcp_fn.sim.replay] returns every rank's `StepOutputs` of
every step and a SHA-256 digest over all of them (dtype, shape and bytes of
every leaf, in pytree order), so two replays agree exactly when their outputs
do, bit for bit, whatever ran them: eager, compiled or a captured graph.
[`replay_digest`][pcp_fn.sim.replay_digest] computes the same digest step by step, the trace read one
line at a time ([`stream_trace`][pcp_fn.sim.stream_trace]), in the memory of one step (`pcp-fn replay`).

The whole trace is validated before anything runs, and malformed input raises
[`TraceError`][pcp_fn.sim.trace.TraceError] naming the line and the field: not UTF-8, not JSON, nested
too deeply, a line over [`MAX_LINE_BYTES`][pcp_fn.sim.trace.MAX_LINE_BYTES], a duplicate key, an unknown
key (a typo such as `slot_maping` is an error, not a default), a wrong type,
an integer out of range (counts are int32, slots int64; integers of any
length are rejected without being converted), a `step` number out of order
(the field is optional; given, it must be the step's place in the file, from 0).
The header's sizes are checked against [`LIMITS`][pcp_fn.sim.trace.LIMITS] before anything is
allocated. [`write_trace`][pcp_fn.sim.write_trace] writes to a temporary file and renames it, so a
failed or interrupted write (an exception, Ctrl-C, SIGTERM) leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree

from .. import PCPConfig, StepOutputs, init_state, make_batch, step
from ..core.checks import INT32_MAX
from ..graph import Captured, compile_per_bucket
from ..mrv2 import partition_batch
from .mrv2_path import engine_batch, engine_mrv2_config, engine_outputs

FORMAT, VERSION = "pcp_fn.trace", 2
VERSIONS = (1, 2)
"""The versions read: 1, the scheduler's arrays; 2 adds an engine's recording (the header's
`engine`, the steps' `is_prefilling`, `idx_mapping` and `batch_desc`). A trace without them is
written as version 1, so readers of version 1 keep reading it."""
CONFIG_FIELDS = (
    "pcp_size",
    "max_num_reqs",
    "max_num_tokens",
    "dcp_size",
    "dcp_rank",
    "num_spec_tokens",
    "cp_kv_cache_interleave_size",
    "hybrid_attn",
    "pad_slot_id",
    "request_buckets",
    "token_buckets",
    "pd_decode_recompute",
    "layout",
)
"""The header's config, in the format's order: PCPConfig's fields but pcp_rank (replay runs every rank)."""
_CONFIG_FLAGS = ("hybrid_attn", "pd_decode_recompute")
_CONFIG_LISTS = ("request_buckets", "token_buckets")
_HEADER_FIELDS = ("format", "version", "config", "engine")
_ENGINE_FIELDS = ("name", "version", "manager", "moe_gathers_tokens")
_ARRAYS = ("num_scheduled", "num_computed", "num_prompt")
_ENGINE_STEP_FIELDS = ("is_prefilling", "idx_mapping", "batch_desc")
_STEP_FIELDS = ("step", *_ARRAYS, "slot_mapping", *_ENGINE_STEP_FIELDS)
_DESC_FIELDS = ("cg_mode", "num_tokens", "num_reqs", "max_query_len", "uniform_token_count")
CG_MODES = ("NONE", "PIECEWISE", "FULL")
"""The CUDA-graph modes a recorded step's `batch_desc.cg_mode` names (vLLM's `CUDAGraphMode`)."""
ENGINE_LAYOUTS = (
    "mrv2",
    "mrv2-sharded",
    "round-robin",
    "round-robin-sharded",
    "cost-balanced",
    "cost-balanced-sharded",
)
"""The layouts whose engine traces carry the engine's own row order (`is_prefilling` per step) and
replay through `pcp_fn.mrv2`: the vLLM drop-in's (its prefill split, decodes replicated or
sharded; the built-in [`pcp_fn.MRV2Partition`][] layouts). An engine
trace of another layout (vllm-ascend 0.23's DualChunkSwap) is the scheduler's arrays, decodes
first, replayed through `pcp_fn.step` as a version-1 trace is."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

MAX_LINE_BYTES = 1 << 24
"""Longest line a trace may have (16 MiB; a full step of a 1M-token batch is about 8 MiB)."""

LIMITS = {"pcp_size": 256, "dcp_size": 256, "max_num_reqs": 1 << 16, "max_num_tokens": 1 << 20}
"""Largest header values a trace may ask for, checked before anything is allocated.
Besides these, `request_buckets` and `token_buckets` hold at most 64 sizes, and the
all-gathered rows of the capacity, `G = pcp_size * L`, are at most
[`MAX_GATHERED_ROWS`][pcp_fn.sim.trace.MAX_GATHERED_ROWS]."""
_MAX_BUCKETS = 64
MAX_GATHERED_ROWS = 1 << 24
"""Largest all-gathered rows of a trace's capacity, `G = pcp_size * L` (see
[`LIMITS`][pcp_fn.sim.trace.LIMITS])."""


class TraceError(ValueError):
    """A malformed trace: the message names the line and the field."""


class BatchDesc(NamedTuple):
    """The engine's batch descriptor of a recorded step (vLLM's `BatchExecutionDescriptor`)."""

    cg_mode: str  # one of CG_MODES
    num_tokens: int | None  # the graph's tokens (None: not padded)
    num_reqs: int | None  # the graph's request rows (None: not padded)
    max_query_len: int | None = None  # the graph's query bound (varlen decode graphs)
    uniform_token_count: int | None = None  # every request's query length (uniform decode graphs)


@dataclasses.dataclass(frozen=True)
class TraceStep:
    """One step of a trace: the scheduler's per-request arrays, and the slot mapping when recorded.

    An engine's recording ([`pcp_fn.adapters.recording`][]) adds, per request in the engine's
    row order, `is_prefilling` (the engine's own flag: vLLM's `is_prefilling_np`) and
    `idx_mapping` (its persistent request rows), and the step's
    [`BatchDesc`][pcp_fn.sim.trace.BatchDesc]. `num_prompt` is then vLLM's `prefill_len`.
    """

    num_scheduled: tuple[int, ...]
    num_computed: tuple[int, ...]
    num_prompt: tuple[int, ...]
    slot_mapping: tuple[int, ...] | None = None
    is_prefilling: tuple[bool, ...] | None = None
    idx_mapping: tuple[int, ...] | None = None
    batch_desc: BatchDesc | None = None


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """The header's `engine` of a recorded trace: who recorded it (the steps are replayed
    through the layout functions that engine's drop-in runs)."""

    name: str  # "vllm"
    version: str  # the engine's release, "0.32.0"
    manager: str  # the drop-in class that recorded, "FunctionalPCPManager"
    moe_gathers_tokens: bool = False


@dataclasses.dataclass(frozen=True)
class Trace:
    """A whole trace: the header's config, the steps, and the engine that recorded them (if one did)."""

    config: PCPConfig  # pcp_rank 0; replay runs every rank with its rank as data
    steps: tuple[TraceStep, ...]
    engine: EngineInfo | None = None


def config_to_json(config: PCPConfig) -> dict[str, Any]:
    out = {name: getattr(config, name) for name in CONFIG_FIELDS}
    for name in _CONFIG_LISTS:
        out[name] = list(getattr(config, name))
    if out["layout"] is None:  # the DualChunkSwap family (hybrid_attn says which): traces stay as they were
        del out["layout"]
    return out


def header_line(config: PCPConfig, engine: EngineInfo | None = None) -> str:
    """The header's JSON line (with its newline): version 1 without an engine, 2 with one."""
    header: dict[str, Any] = {"format": FORMAT, "version": 1, "config": config_to_json(config)}
    if engine is not None:
        header["version"] = 2
        header["engine"] = dataclasses.asdict(engine)
    return json.dumps(header) + "\n"


def step_line(index: int, s: TraceStep) -> str:
    """Step `index`'s JSON line (with its newline); the optional fields only when set."""
    line: dict[str, Any] = {"step": index}
    for name in _ARRAYS:
        line[name] = [int(v) for v in getattr(s, name)]
    if s.slot_mapping is not None:
        line["slot_mapping"] = [int(v) for v in s.slot_mapping]
    if s.is_prefilling is not None:
        line["is_prefilling"] = [bool(v) for v in s.is_prefilling]
    if s.idx_mapping is not None:
        line["idx_mapping"] = [int(v) for v in s.idx_mapping]
    if s.batch_desc is not None:
        line["batch_desc"] = s.batch_desc._asdict()
    return json.dumps(line) + "\n"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that cleanups run
    ([`write_trace`][pcp_fn.sim.write_trace]'s, the CLI's); not an `Exception`: `except Exception`
    in a caller's step generator must not swallow it."""


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the body runs, a SIGTERM whose disposition is the default (end the process) raises
    [`Terminated`][pcp_fn.sim.trace.Terminated] instead, so `finally` / `except` cleanups run; once
    the body is left the default disposition is back and the signal is delivered again: the process
    still ends by SIGTERM, only later. A handler the caller installed (the CLI's), an ignored
    SIGTERM or one handled outside Python is left alone, as is everything off the main thread
    (Python runs handlers there only).
    """
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    received = False

    def handler(signum: int, frame: object) -> None:
        nonlocal received
        if not received:  # a second SIGTERM while unwinding: the first one is delivered again below
            received = True
            raise Terminated

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if received:  # the cleanups ran: end the process as the signal would have
            signal.raise_signal(signal.SIGTERM)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT held back (POSIX, main thread) while the body runs: `_write`
    creates its temporary file and learns its name with no signal in between, so a cleanup
    always knows it."""
    if not (hasattr(signal, "pthread_sigmask") and _in_main_thread()):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def write_trace(
    path: str | os.PathLike[str],
    config: PCPConfig,
    steps: Iterable[TraceStep],
    *,
    overwrite: bool = True,
    engine: EngineInfo | None = None,
) -> int:
    """Write a trace atomically: a temporary file beside `path`, renamed once complete.

    `steps` may be a generator (the trace streams to disk); whatever ends the
    write early (an exception, `KeyboardInterrupt`, SIGTERM) removes the temporary
    file. A SIGTERM with the default disposition still ends the process, by the
    signal, once the file is removed (in the main thread the function installs a
    handler for the duration of the write and restores the default after); a
    handler of the caller's is left in place. With `overwrite=False` an existing `path` raises
    `FileExistsError` and is left alone (checked again at the rename, so a
    file created meanwhile is not replaced). `engine`: the header's
    [`EngineInfo`][pcp_fn.sim.trace.EngineInfo] of an engine's steps (version 2). Returns the
    number of steps.
    """
    path = os.fspath(path)
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(f"{path} exists")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # named here: mkstemp's error would name the temporary file
        raise FileNotFoundError(errno.ENOENT, f"{os.strerror(errno.ENOENT)} (its folder {folder})", path)
    with _sigterm_unwinds():
        return _write(path, folder, header_line(config, engine), steps, overwrite)


def _write(path: str, folder: str, header: str, steps: Iterable[TraceStep], overwrite: bool) -> int:
    tmp = None
    try:
        with _signals_deferred():
            fd, tmp = tempfile.mkstemp(prefix=".trace-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(header)
            count = 0
            for i, s in enumerate(steps):
                f.write(step_line(i, s))
                count += 1
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a trace is an ordinary file
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path appeared meanwhile: never clobbers
            os.unlink(tmp)
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return count


# -- parsing -------------------------------------------------------------------------------------


class _HugeInt:
    """A JSON integer too long to be any valid field: kept as text, never converted
    (Python refuses to convert integers over 4,300 digits, and no field needs 20)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        digits = self.text.lstrip("-")
        return f"{self.text[:12]}... ({len(digits)} digits)"


class _JSONProblem(Exception):
    """Raised from a json hook; parse_trace adds the line number."""


def _parse_int(text: str) -> int | _HugeInt:
    return int(text) if len(text) <= 40 else _HugeInt(text)


def _parse_constant(name: str) -> float:
    raise _JSONProblem(f"not valid JSON ({name} is not a JSON number)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JSONProblem(f"field {key!r} appears twice")
        out[key] = value
    return out


def _loads(lineno: int, raw: str | bytes) -> Any:
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(
                f"line {lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
            ) from None
    try:
        return json.loads(
            raw, object_pairs_hook=_object, parse_int=_parse_int, parse_constant=_parse_constant
        )
    except json.JSONDecodeError as e:
        raise TraceError(f"line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    except _JSONProblem as e:
        raise TraceError(f"line {lineno}: {e}") from None
    except RecursionError:
        raise TraceError(f"line {lineno}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # anything else the decoder refuses
        raise TraceError(f"line {lineno}: not valid JSON ({e})") from None


def _type_name(value: Any) -> str:
    if isinstance(value, _HugeInt):
        return "integer"
    return {
        bool: "boolean",
        int: "integer",
        str: "string",
        float: "number",
        list: "list",
        dict: "object",
    }.get(type(value), "null" if value is None else type(value).__name__)


def _check_keys(
    lineno: int, obj: dict[str, Any], allowed: Sequence[str], what: str, prefix: str = ""
) -> None:
    for key in obj:
        if key not in allowed:
            raise TraceError(
                f"line {lineno}: field {prefix + key!r} is not a {what} field (expected one of "
                f"{', '.join(allowed)})"
            )


def _int(lineno: int, name: str, value: Any, lo: int, hi: int, limit: str = "the limit") -> int:
    if isinstance(value, _HugeInt) or (isinstance(value, int) and not isinstance(value, bool)):
        if isinstance(value, _HugeInt) or value > hi:
            raise TraceError(f"line {lineno}: field {name} = {value!r} exceeds {limit} {hi}")
        if value < lo:
            if lo == 0:
                raise TraceError(f"line {lineno}: field {name} = {value} is negative")
            raise TraceError(f"line {lineno}: field {name} = {value} is below {lo}")
        return value
    raise TraceError(f"line {lineno}: field {name} must be an integer, got {_type_name(value)}")


def _int_list(lineno: int, name: str, value: Any, lo: int, hi: int, limit: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(f"line {lineno}: field {name!r} must be a list of integers, got {_type_name(value)}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int | _HugeInt):
            raise TraceError(
                f"line {lineno}: field {name!r} must be a list of integers ({name}[{i}] is {_type_name(v)})"
            )
        _int(lineno, f"{name!r}[{i}]", v, lo, hi, limit)
    return tuple(value)


class Header(NamedTuple):
    """A trace's header, parsed: the config, the engine that recorded it (version 2) and, for an
    engine's MRV2 trace, the [`pcp_fn.MRV2Config`][] its steps are replayed under."""

    config: PCPConfig
    engine: EngineInfo | None = None
    engine_config: Any = None  # MRV2Config (rank 0) of an MRV2 engine trace (ENGINE_LAYOUTS)


def _parse_header(lineno: int, obj: dict[str, Any]) -> Header:
    _check_keys(lineno, obj, _HEADER_FIELDS, "header")
    if obj.get("format") != FORMAT:
        raise TraceError(f"line {lineno}: field 'format' must be {FORMAT!r} (the header comes first)")
    version = obj.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise TraceError(
            f"line {lineno}: field 'version' must be one of {', '.join(map(str, VERSIONS))}, got {version!r}"
        )
    config = _parse_config(lineno, obj.get("config"))
    if "engine" not in obj:
        return Header(config)
    if version < 2:
        raise TraceError(f"line {lineno}: field 'engine' needs version 2 (this header says {version})")
    engine = _parse_engine(lineno, obj["engine"])
    if config.layout not in ENGINE_LAYOUTS:
        return Header(config, engine)
    try:
        engine_config = engine_mrv2_config(config, engine.moe_gathers_tokens)
    except (TypeError, ValueError) as e:
        raise TraceError(f"line {lineno}: field 'config': {e}") from None
    return Header(config, engine, engine_config)


def _parse_engine(lineno: int, raw: Any) -> EngineInfo:
    if not isinstance(raw, dict):
        raise TraceError(f"line {lineno}: field 'engine' must be an object, got {_type_name(raw)}")
    _check_keys(lineno, raw, _ENGINE_FIELDS, "engine", "engine.")
    for name in ("name", "version", "manager"):
        if not isinstance(raw.get(name), str):
            got = "missing" if name not in raw else f"a {_type_name(raw[name])}"
            raise TraceError(f"line {lineno}: field 'engine.{name}' must be a string, got {got}")
    moe = raw.get("moe_gathers_tokens", False)
    if not isinstance(moe, bool):
        raise TraceError(
            f"line {lineno}: field 'engine.moe_gathers_tokens' must be a boolean, got {_type_name(moe)}"
        )
    return EngineInfo(raw["name"], raw["version"], raw["manager"], moe)


def _parse_config(lineno: int, raw: Any) -> PCPConfig:
    if not isinstance(raw, dict):
        raise TraceError(f"line {lineno}: field 'config' must be an object, got {_type_name(raw)}")
    _check_keys(lineno, raw, CONFIG_FIELDS, "PCPConfig", "config.")
    for name in ("pcp_size", "max_num_reqs", "max_num_tokens"):
        if name not in raw:
            raise TraceError(f"line {lineno}: field 'config.{name}' is missing")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        field = f"'config.{name}'"
        if name == "layout":  # a registered layout's name (pcp_fn.available_layouts())
            if value is not None and not isinstance(value, str):
                raise TraceError(
                    f"line {lineno}: field {field} must be a layout name, got {_type_name(value)}"
                )
        elif name in _CONFIG_FLAGS:
            if not isinstance(value, bool):
                raise TraceError(f"line {lineno}: field {field} must be a boolean, got {_type_name(value)}")
        elif name in _CONFIG_LISTS:
            if value is not None:
                if isinstance(value, list) and len(value) > _MAX_BUCKETS:
                    raise TraceError(
                        f"line {lineno}: field {field} has {len(value)} sizes; a trace allows {_MAX_BUCKETS}"
                    )
                value = _int_list(lineno, f"config.{name}", value, 1, INT32_MAX, "the int32 limit")
        elif name in LIMITS:
            _int(lineno, field, value, -INT32_MAX - 1, LIMITS[name], "the trace limit")
        else:
            _int(lineno, field, value, -INT32_MAX - 1, INT32_MAX, "the int32 limit")
        kwargs[name] = value
    try:
        config = PCPConfig(pcp_rank=0, **kwargs)
    except (TypeError, ValueError) as e:
        raise TraceError(f"line {lineno}: field 'config': {e}") from None
    try:
        check_gathered_rows(config)
    except ValueError as e:
        raise TraceError(f"line {lineno}: field 'config.pcp_size': {e}") from None
    return config


def check_gathered_rows(config: PCPConfig) -> None:
    """`ValueError` unless the all-gathered rows of the capacity, `G = pcp_size * L`, are
    at most [`MAX_GATHERED_ROWS`][pcp_fn.sim.trace.MAX_GATHERED_ROWS] (every rank's state and
    outputs are sized by it)."""
    if config.max_gathered_tokens > MAX_GATHERED_ROWS:
        raise ValueError(
            f"{config.pcp_size} ranks of {config.max_local_tokens} local tokens make "
            f"{config.max_gathered_tokens} gathered rows; a trace allows {MAX_GATHERED_ROWS}"
        )


def _parse_step(lineno: int, obj: dict[str, Any], header: Header, index: int) -> TraceStep:
    """Step `index` of the trace (its 0-based place in the file), from line `lineno`."""
    _check_keys(lineno, obj, _STEP_FIELDS, "step")
    for name in _ARRAYS:
        if name not in obj:
            raise TraceError(f"line {lineno}: field {name!r} is missing")
    if "step" in obj:
        number = _int(lineno, "'step'", obj["step"], 0, INT32_MAX)
        if number != index:  # replay runs steps in file order: a shuffled or gapped trace is not that run
            raise TraceError(
                f"line {lineno}: field 'step' = {number} is out of order; this is step {index} "
                "(steps are numbered 0, 1, 2, ... in file order)"
            )
    arrays = {name: _int_list(lineno, name, obj[name], 0, INT32_MAX, "the int32 limit") for name in _ARRAYS}
    engine = _engine_fields(lineno, obj, header)
    slots = obj.get("slot_mapping")
    if slots is not None:
        slots = _int_list(lineno, "slot_mapping", slots, INT64_MIN, INT64_MAX, "the int64 limit")
    per_request = {**arrays, **{k: v for k, v in engine.items() if k != "batch_desc" and v is not None}}
    lengths = [len(a) for a in per_request.values()]
    if len(set(lengths)) > 1:
        listed = ", ".join(f"{name!r} has {n}" for name, n in zip(per_request, lengths))
        raise TraceError(f"line {lineno}: fields differ in length (one entry per request): {listed}")
    config = header.config
    if lengths[0] > config.max_num_reqs:
        raise TraceError(
            f"line {lineno}: field 'num_scheduled' has {lengths[0]} requests; "
            f"max_num_reqs is {config.max_num_reqs}"
        )
    total = sum(arrays["num_scheduled"])
    if total > config.max_num_tokens:
        raise TraceError(
            f"line {lineno}: field 'num_scheduled' sums to {total} tokens; "
            f"max_num_tokens is {config.max_num_tokens}"
        )
    step_ = TraceStep(**arrays, slot_mapping=slots, **engine)
    try:  # the rest against the config (sequence lengths, decodes first, the bucket)
        if header.engine_config is None:
            make_batch(config, arrays["num_scheduled"], arrays["num_computed"], arrays["num_prompt"])
        else:  # the engine's own row order and prefill flags, as its drop-in lays them out
            engine_batch(header.engine_config, step_)
    except ValueError as e:
        raise TraceError(f"line {lineno}: {e}") from None
    if slots is not None and len(slots) != total:
        raise TraceError(
            f"line {lineno}: field 'slot_mapping' has {len(slots)} entries for {total} scheduled tokens"
        )
    return step_


def _engine_fields(lineno: int, obj: dict[str, Any], header: Header) -> dict[str, Any]:
    """A step's engine fields: `is_prefilling` required in an engine's MRV2 trace, none allowed in
    another."""
    if header.engine_config is None:
        extra = next((k for k in _ENGINE_STEP_FIELDS if k in obj), None)
        if extra is not None:
            raise TraceError(
                f"line {lineno}: field {extra!r} belongs to an engine's trace of layout "
                f"{' or '.join(ENGINE_LAYOUTS)} (a header with 'engine')"
            )
        return {}
    if "is_prefilling" not in obj:
        raise TraceError(f"line {lineno}: field 'is_prefilling' is missing (an engine trace records it)")
    flags = obj["is_prefilling"]
    if not isinstance(flags, list) or not all(isinstance(f, bool) for f in flags):
        what = _type_name(flags) if not isinstance(flags, list) else "a list with a non-boolean"
        raise TraceError(f"line {lineno}: field 'is_prefilling' must be a list of booleans, got {what}")
    idx = obj.get("idx_mapping")
    if idx is not None:
        idx = _int_list(lineno, "idx_mapping", idx, 0, INT32_MAX, "the int32 limit")
    desc = obj.get("batch_desc")
    if desc is not None:
        desc = _parse_desc(lineno, desc)
    return {"is_prefilling": tuple(flags), "idx_mapping": idx, "batch_desc": desc}


def _parse_desc(lineno: int, raw: Any) -> BatchDesc:
    if not isinstance(raw, dict):
        raise TraceError(f"line {lineno}: field 'batch_desc' must be an object, got {_type_name(raw)}")
    _check_keys(lineno, raw, _DESC_FIELDS, "batch_desc", "batch_desc.")
    mode = raw.get("cg_mode")
    if mode not in CG_MODES:
        raise TraceError(
            f"line {lineno}: field 'batch_desc.cg_mode' must be one of {', '.join(CG_MODES)}, got {mode!r}"
        )
    sizes = []
    for name in _DESC_FIELDS[1:]:
        value = raw.get(name)
        sizes.append(None if value is None else _int(lineno, f"'batch_desc.{name}'", value, 0, INT32_MAX))
    return BatchDesc(mode, *sizes)


def parse_trace(lines: Iterable[str | bytes]) -> Trace:
    """Parse and validate a whole trace (every step against the config's capacities).

    `lines`: text or bytes lines (bytes are decoded as UTF-8, strictly).
    """
    header, steps = _open_records(_records(lines))
    return Trace(header.config, tuple(steps), header.engine)


def _records(lines: Iterable[str | bytes]) -> Iterator[Header | TraceStep]:
    """The header, then each step, validated one line at a time (a malformed line
    raises when it is reached; an empty trace when the lines end without a header)."""
    config: Header | None = None
    index = 0
    for lineno, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"line {lineno}: longer than {MAX_LINE_BYTES} bytes")
        if not raw.strip():
            continue
        obj = _loads(lineno, raw)
        if not isinstance(obj, dict):
            raise TraceError(f"line {lineno}: expected a JSON object, got {_type_name(obj)}")
        if config is None:
            config = _parse_header(lineno, obj)
            yield config
        else:
            yield _parse_step(lineno, obj, config, index)
            index += 1
    if config is None:
        raise TraceError("line 1: the trace is empty (no header)")


def _open_records(records: Iterator[Header | TraceStep]) -> tuple[Header, Iterator[TraceStep]]:
    """The header of a `_records` stream, and its steps (a generator: read as they are used)."""
    header = next(records)
    assert isinstance(header, Header)  # _records yields the header first
    return header, (s for s in records if isinstance(s, TraceStep))


def _binary_lines(f: Any) -> Iterable[bytes]:
    """The file's lines, none read past `MAX_LINE_BYTES + 1` bytes."""
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        yield line
        if len(line) > MAX_LINE_BYTES:  # _loads reports it; never read the rest of the line
            return


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace file (`OSError` when it cannot be read, e.g. a directory)."""
    with open(path, "rb") as f:
        return parse_trace(_binary_lines(f))


# -- replay --------------------------------------------------------------------------------------


def digest_of(outputs: Iterable[Any]) -> str:
    """SHA-256 over every tensor leaf (dtype, shape, bytes) of `outputs`, in order."""
    h = hashlib.sha256()
    for tree in outputs:
        _digest_tree(h, tree)
    return h.hexdigest()


def _digest_tree(h: Any, tree: Any) -> None:
    """Add one output's leaves to the hash `h` ([`digest_of`][pcp_fn.sim.trace.digest_of]'s order
    and bytes)."""
    for leaf in pytree.tree_leaves(tree):
        if leaf is None:
            h.update(b"none;")
            continue
        t = leaf.detach().to("cpu").contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        data = t.numpy()
        if data.dtype.byteorder == ">":  # canonical little-endian bytes
            data = data.astype(data.dtype.newbyteorder("<"))
        h.update(data.tobytes())


@dataclasses.dataclass
class ReplayResult:
    outputs: list[list[StepOutputs]]  # [step][rank]
    digest: str
    num_graphs: int = 0  # graphs compiled or captured (0 in eager mode): one per bucket met


@dataclasses.dataclass(frozen=True)
class ReplayDigest:
    """[`replay_digest`][pcp_fn.sim.replay_digest]'s answer: [`replay`][pcp_fn.sim.replay]'s digest
    without the outputs."""

    digest: str
    num_steps: int
    num_graphs: int = 0  # graphs compiled or captured (0 in eager mode): one per bucket met
    engine: EngineInfo | None = None  # the engine that recorded the trace, if one did
    through: str = "pcp_fn.step"  # what every rank's step ran: pcp_fn.step or pcp_fn.mrv2.partition_batch


TraceSource = Trace | str | os.PathLike[str] | Iterable[str | bytes]
"""A [`Trace`][pcp_fn.sim.trace.Trace], a trace file's path, or a trace's lines."""


def replay(
    trace: TraceSource,
    *,
    mode: str = "eager",
    ranks: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
    backend: str = "inductor",
) -> ReplayResult:
    """Run a trace through [`pcp_fn.step`][pcp_fn.step.step] for every rank and digest the outputs.

    Every step's batch comes from `make_batch(..., slot_mapping=...)`, which
    pads the slot mapping to the bucket on the host, and every rank's state
    carries its rank as data (`init_state(config, rank=r)`): the ranks share
    one graph per bucket, so a trace compiles (or captures) exactly as many
    graphs as it has buckets, within Dynamo's default recompile limit.

    The whole trace is validated before anything runs, and every rank's outputs of every
    step are kept (a copy each): memory grows with the trace. For the digest alone,
    [`replay_digest`][pcp_fn.sim.replay_digest] holds one step at a time.

    Args:
        mode: `"eager"`, `"compiled"` ([`pcp_fn.graph.compile_per_bucket`][]:
            `torch.compile(fullgraph=True, dynamic=False)` per bucket) or
            `"captured"` ([`pcp_fn.graph.capture`][pcp_fn.graph.capture.capture]: CUDA/NPU graph on
            those devices, compiled per bucket on the CPU).
        ranks: which ranks (default all); the digest covers exactly these.
        backend: `torch.compile` backend for the compiled and captured modes.
    """
    if not isinstance(trace, Trace):
        trace = read_trace(trace) if isinstance(trace, str | os.PathLike) else parse_trace(trace)
    header = _header_of(trace)
    run = _step_runner(mode, backend, header)
    ranks = _checked_ranks(trace.config, ranks)
    outputs: list[list[StepOutputs]] = []
    for out in _run(header, trace.steps, run, ranks, device):
        if not outputs or len(outputs[-1]) == len(ranks):
            outputs.append([])
        # a captured graph's outputs are its static buffers, rewritten by the next replay: a copy
        outputs[-1].append(pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, out))
    return ReplayResult(
        outputs, digest_of(o for row in outputs for o in row), 0 if mode == "eager" else len(run)
    )


def replay_digest(
    trace: TraceSource,
    *,
    mode: str = "eager",
    ranks: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
    backend: str = "inductor",
) -> ReplayDigest:
    """[`replay`][pcp_fn.sim.replay]'s digest (bit for bit the same) in memory bounded by one step.

    Each rank's outputs are hashed as soon as they are made, and a trace file is read
    one line at a time, each line validated before its step runs: the memory held is one
    step's batch, the ranks' states and the graphs, whatever the trace's length. A
    malformed line ends the replay with its [`TraceError`][pcp_fn.sim.trace.TraceError] (no digest
    is returned, as when [`replay`][pcp_fn.sim.replay] validates the whole trace first). Arguments
    as [`replay`][pcp_fn.sim.replay].
    """
    with _stream(trace) as (header, steps):
        run = _step_runner(mode, backend, header)
        ranks = _checked_ranks(header.config, ranks)
        h = hashlib.sha256()
        calls = 0
        for out in _run(header, steps, run, ranks, device):
            _digest_tree(h, out)  # before the next call rewrites a captured graph's buffers
            calls += 1
    graphs = 0 if mode == "eager" else len(run)
    through = "pcp_fn.step" if header.engine_config is None else "pcp_fn.mrv2.partition_batch"
    return ReplayDigest(h.hexdigest(), calls // len(ranks), graphs, header.engine, through)


def check_replay(
    trace: TraceSource | str | os.PathLike[str],
    expected: str,
    *,
    modes: Sequence[str] = ("eager", "compiled"),
    backend: str = "inductor",
) -> None:
    """A recorded trace as a regression test: replay it in every mode of `modes` and raise
    `AssertionError` unless each digest is `expected` (a trace file, or its lines, read once
    per mode).

        # tests/test_incident_1234.py, beside the trace pcp-fn replay printed the digest of
        from pcp_fn.sim import check_replay

        def test_incident_1234():
            check_replay("tests/traces/incident-1234.jsonl", "3f5c...e1")

    Args:
        modes: how to run the step (see [`replay`][pcp_fn.sim.replay]); they must agree.
        backend: the `torch.compile` backend of the compiled and captured modes.
    """
    if isinstance(trace, Iterable) and not isinstance(trace, str | Trace):
        trace = list(trace)  # lines: read once per mode
    for mode in modes:
        got = replay_digest(trace, mode=mode, backend=backend).digest
        if got != expected:
            raise AssertionError(
                f"replaying {trace if isinstance(trace, str | os.PathLike) else 'the trace'} in mode "
                f"{mode!r} gives digest {got}; expected {expected}"
            )


@contextlib.contextmanager
def stream_trace(trace: TraceSource) -> Iterator[tuple[PCPConfig, Iterable[TraceStep]]]:
    """`with stream_trace(path) as (config, steps):` the header's config, and the steps as an
    iterator that reads and validates the file one line at a time (a malformed line raises
    [`TraceError`][pcp_fn.sim.trace.TraceError] when it is reached): memory bounded by one line,
    whatever the length."""
    with _stream(trace) as (header, steps):
        yield header.config, steps


@contextlib.contextmanager
def _stream(trace: TraceSource) -> Iterator[tuple[Header, Iterable[TraceStep]]]:
    """[`stream_trace`][pcp_fn.sim.stream_trace] with the whole header."""
    if isinstance(trace, Trace):
        yield _header_of(trace), trace.steps
    elif isinstance(trace, str | os.PathLike):
        with open(trace, "rb") as f:
            yield _open_records(_records(_binary_lines(f)))
    else:
        yield _open_records(_records(trace))


def _header_of(trace: Trace) -> Header:
    if trace.engine is None or trace.config.layout not in ENGINE_LAYOUTS:
        return Header(trace.config, trace.engine)
    engine_config = engine_mrv2_config(trace.config, trace.engine.moe_gathers_tokens)
    return Header(trace.config, trace.engine, engine_config)


def _step_runner(mode: str, backend: str, header: Header) -> Any:
    """The function every rank's step runs: [`pcp_fn.step`][pcp_fn.step.step], or for an engine's
    MRV2 trace [`pcp_fn.mrv2.partition_batch`][] (what the vLLM drop-in's graph runs)."""
    fn = step if header.engine_config is None else partition_batch
    if mode == "eager":
        return fn
    if mode == "compiled":
        return compile_per_bucket(fn, backend=backend)
    if mode == "captured":
        return Captured(fn, backend=backend)
    raise ValueError(f"mode must be 'eager', 'compiled' or 'captured', got {mode!r}")


def _checked_ranks(config: PCPConfig, ranks: Sequence[int] | None) -> list[int]:
    ranks = list(range(config.pcp_size)) if ranks is None else list(ranks)
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < config.pcp_size:
            raise ValueError(f"ranks must be ints in [0, pcp_size={config.pcp_size}), got {r!r}")
    if not ranks or len(set(ranks)) != len(ranks):  # each rank's state steps once per step
        raise ValueError(f"ranks must name distinct ranks, at least one, got {ranks}")
    return ranks


def _run(
    header: Header, steps: Iterable[TraceStep], run: Any, ranks: list[int], device: torch.device | str
) -> Iterator[Any]:
    """Each step's outputs, rank after rank, in `ranks`' order; an output is valid until the
    next is made (a captured graph rewrites its buffers)."""
    if header.engine_config is not None:
        yield from engine_outputs(header.engine_config, steps, run, ranks, device)
        return
    config = header.config
    states = {r: init_state(config, device, rank=r) for r in ranks}
    for s in steps:
        slots = s.slot_mapping if s.slot_mapping is not None else range(sum(s.num_scheduled))
        batch = make_batch(
            config, s.num_scheduled, s.num_computed, s.num_prompt, device, slot_mapping=list(slots)
        )
        for r in ranks:
            states[r], out = run(states[r], batch)
            yield out
