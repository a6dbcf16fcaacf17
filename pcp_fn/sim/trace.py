"""Scheduler traces (JSON Lines) and deterministic replay through the pure step.

Format, one JSON object per line::

    {"format": "pcp_fn.trace", "version": 1, "config": {"pcp_size": 4, "max_num_reqs": 16, ...}}
    {"step": 0, "num_scheduled": [40, 7], "num_computed": [0, 0], "num_prompt": [40, 7],
     "slot_mapping": [0, 1, ...]}                       # optional; default 0 .. total-1
    ...

The header's config is a :class:`pcp_fn.PCPConfig` without ``pcp_rank``:
replay runs every rank. :func:`replay` returns every rank's ``StepOutputs`` of
every step and a SHA-256 digest over all of them (dtype, shape and bytes of
every leaf, in pytree order), so two replays agree exactly when their outputs
do, bit for bit, whatever ran them: eager, compiled or a captured graph.

Malformed input raises :class:`TraceError` naming the line and the field, and
the whole trace is validated before anything runs; :func:`write_trace` writes
to a temporary file and renames it, so a failed write leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from ..dcs.batch import SchedulerBatch, make_batch
from ..dcs.config import PCPConfig
from ..dcs.state import init_state
from ..step import StepOutputs, step

FORMAT, VERSION = "pcp_fn.trace", 1
_CONFIG_FIELDS = [f.name for f in dataclasses.fields(PCPConfig) if f.name != "pcp_rank"]
_ARRAYS = ("num_scheduled", "num_computed", "num_prompt")


class TraceError(ValueError):
    """A malformed trace: the message names the line and the field."""


@dataclasses.dataclass(frozen=True)
class TraceStep:
    num_scheduled: tuple[int, ...]
    num_computed: tuple[int, ...]
    num_prompt: tuple[int, ...]
    slot_mapping: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Trace:
    config: PCPConfig  # pcp_rank 0; replay sets each rank
    steps: tuple[TraceStep, ...]


def config_to_json(config: PCPConfig) -> dict[str, Any]:
    out = {name: getattr(config, name) for name in _CONFIG_FIELDS}
    out["request_buckets"] = list(config.request_buckets)
    out["token_buckets"] = list(config.token_buckets)
    return out


def write_trace(path: str | os.PathLike[str], config: PCPConfig, steps: Iterable[TraceStep]) -> None:
    """Write a trace atomically (temporary file, then rename)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".trace-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(
                json.dumps({"format": FORMAT, "version": VERSION, "config": config_to_json(config)}) + "\n"
            )
            for i, s in enumerate(steps):
                line: dict[str, Any] = {"step": i}
                for name in _ARRAYS:
                    line[name] = list(getattr(s, name))
                if s.slot_mapping is not None:
                    line["slot_mapping"] = list(s.slot_mapping)
                f.write(json.dumps(line) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a trace is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _int_list(lineno: int, name: str, value: Any, allow_negative: bool = False) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TraceError(f"line {lineno}: field {name!r} must be a list of integers")
    if not allow_negative:
        for i, v in enumerate(value):
            if v < 0:
                raise TraceError(f"line {lineno}: field {name!r}[{i}] = {v} is negative")
    return tuple(value)


def parse_trace(lines: Iterable[str]) -> Trace:
    """Parse and validate a whole trace (every step against the config's capacities)."""
    config: PCPConfig | None = None
    steps: list[TraceStep] = []
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"line {lineno}: expected a JSON object")
        if config is None:
            if obj.get("format") != FORMAT:
                raise TraceError(f"line {lineno}: field 'format' must be {FORMAT!r} (the header comes first)")
            if obj.get("version") != VERSION:
                raise TraceError(
                    f"line {lineno}: field 'version' must be {VERSION}, got {obj.get('version')!r}"
                )
            raw = obj.get("config")
            if not isinstance(raw, dict):
                raise TraceError(f"line {lineno}: field 'config' must be an object")
            unknown = sorted(set(raw) - set(_CONFIG_FIELDS))
            if unknown:
                raise TraceError(f"line {lineno}: field 'config.{unknown[0]}' is not a PCPConfig field")
            for name in ("pcp_size", "max_num_reqs", "max_num_tokens"):
                if name not in raw:
                    raise TraceError(f"line {lineno}: field 'config.{name}' is missing")
            kwargs = dict(raw)
            for name in ("request_buckets", "token_buckets"):
                if kwargs.get(name) is not None:
                    kwargs[name] = tuple(kwargs[name])
            try:
                config = PCPConfig(pcp_rank=0, **kwargs)
            except (TypeError, ValueError) as e:
                raise TraceError(f"line {lineno}: field 'config': {e}") from None
            continue
        for name in _ARRAYS:
            if name not in obj:
                raise TraceError(f"line {lineno}: field {name!r} is missing")
        arrays = {name: _int_list(lineno, name, obj[name]) for name in _ARRAYS}
        slots = obj.get("slot_mapping")
        if slots is not None:
            slots = _int_list(lineno, "slot_mapping", slots, allow_negative=True)
            if len(slots) < sum(arrays["num_scheduled"]):
                raise TraceError(
                    f"line {lineno}: field 'slot_mapping' has {len(slots)} entries for "
                    f"{sum(arrays['num_scheduled'])} scheduled tokens"
                )
        try:
            make_batch(config, arrays["num_scheduled"], arrays["num_computed"], arrays["num_prompt"])
        except ValueError as e:
            raise TraceError(f"line {lineno}: {e}") from None
        steps.append(TraceStep(**arrays, slot_mapping=slots))
    if config is None:
        raise TraceError("line 1: the trace is empty (no header)")
    return Trace(config, tuple(steps))


def read_trace(path: str | os.PathLike[str]) -> Trace:
    with open(path) as f:
        return parse_trace(f)


def digest_of(outputs: Iterable[Any]) -> str:
    """SHA-256 over every tensor leaf (dtype, shape, bytes) of ``outputs``, in order."""
    h = hashlib.sha256()
    for tree in outputs:
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
    return h.hexdigest()


@dataclasses.dataclass
class ReplayResult:
    outputs: list[list[StepOutputs]]  # [step][rank]
    digest: str


StepRunner = Callable[[Any, SchedulerBatch, torch.Tensor], tuple[Any, StepOutputs]]


def replay(
    trace: Trace | str | os.PathLike[str] | Sequence[str],
    *,
    mode: str = "eager",
    ranks: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
    backend: str = "inductor",
) -> ReplayResult:
    """Run a trace through :func:`pcp_fn.step` for every rank and digest the outputs.

    Args:
        mode: ``"eager"``, ``"compiled"`` (``torch.compile(fullgraph=True)``)
            or ``"captured"`` (:func:`pcp_fn.graph.capture`: CUDA/NPU graph on
            those devices, compiled per bucket on the CPU).
        ranks: which ranks (default all); the digest covers exactly these.
        backend: ``torch.compile`` backend for the compiled and captured modes.
    """
    from ..graph.capture import Captured, _fresh_code

    if not isinstance(trace, Trace):
        trace = read_trace(trace) if isinstance(trace, (str, os.PathLike)) else parse_trace(trace)
    cfg0 = trace.config
    ranks = list(range(cfg0.pcp_size)) if ranks is None else list(ranks)
    if mode == "eager":
        runners: dict[int, StepRunner] = {r: step for r in ranks}
    elif mode == "compiled":
        runners = {
            r: torch.compile(_fresh_code(step), fullgraph=True, dynamic=False, backend=backend) for r in ranks
        }
    elif mode == "captured":
        runners = {r: Captured(step, backend=backend) for r in ranks}
    else:
        raise ValueError(f"mode must be 'eager', 'compiled' or 'captured', got {mode!r}")
    if mode == "compiled":
        torch._dynamo.config.recompile_limit = max(
            torch._dynamo.config.recompile_limit, 4 * len(cfg0.buckets())
        )
    states = {r: init_state(dataclasses.replace(cfg0, pcp_rank=r), device) for r in ranks}
    outputs: list[list[StepOutputs]] = []
    for s in trace.steps:
        batch = make_batch(cfg0, s.num_scheduled, s.num_computed, s.num_prompt, device)
        total = sum(s.num_scheduled)
        slots = s.slot_mapping if s.slot_mapping is not None else range(total)
        slot_mapping = torch.as_tensor(np.asarray(list(slots) or [0], dtype=np.int64), device=device)
        row = []
        for r in ranks:
            states[r], out = runners[r](states[r], batch, slot_mapping)
            row.append(pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, out))
        outputs.append(row)
    return ReplayResult(outputs, digest_of(o for row in outputs for o in row))
