"""A recorded schedule against vLLM's own `PCPManager`: where does the drop-in differ?

    pcp-fn replay pcp-4242.jsonl --against vllm

Every step of an engine's MRV2 trace ([`pcp_fn.adapters.recording`][]) becomes vLLM's global
`InputBatch` again, on every rank, in the engine's row order with its prefill flags, request
rows and batch descriptor, and goes through two managers built alike (no block tables: the
layout needs none): vLLM's `PCPManager` of the installed release and
[`FunctionalPCPManager`][pcp_fn.adapters.vllm.FunctionalPCPManager] over it. Every field of the
two local batches `partition_batch` returns is compared (dtype, shape and values; vLLM 0.33+'s
PCP metadata field by field); the answer names the first step, rank and field that differ, or
says none does. A step one manager refuses and the other serves is a difference too.

A trace of another layout the drop-in served (`"round-robin"`, `"cost-balanced"`, ...:
[`pcp_fn.adapters.vllm.served`][]) cuts prefills differently from vLLM's head and tail chunks by
design; it is compared on what the split must not change, step by step over every rank
([`SPLIT_FIELDS`][pcp_fn.adapters.vllm.against.SPLIT_FIELDS]): the same steps served, each
rank's decode rows equal to vLLM's, every prefill's scheduled positions held exactly once over
the ranks as in vLLM's, and each of the drop-in's rows one contiguous run ending at its
`seq_len`.

Not replayed: the token ids (a recording holds none: zeros), the draft tokens (none), the
block tables and slot mappings (the recording holds no KV slot).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ...mrv2.splits import HeadTail
from ...protocol.registry import get_layout
from ...sim.trace import ENGINE_LAYOUTS, Trace, TraceStep, read_trace


@dataclasses.dataclass(frozen=True)
class VllmNames:
    """The engine's classes the comparison builds: vLLM's own, or a stand-in's in tests.

    Attributes:
        PCPManager: the reference manager class (vLLM's `PCPManager`).
        drop_in: the drop-in over it ([`FunctionalPCPManager`][pcp_fn.adapters.vllm.FunctionalPCPManager]).
        InputBatch: vLLM's `InputBatch` dataclass.
        BatchExecutionDescriptor: vLLM's descriptor dataclass.
        CUDAGraphMode: vLLM's `CUDAGraphMode` enum.
        version: the engine's version, for the report.
    """

    PCPManager: type
    drop_in: type
    InputBatch: type
    BatchExecutionDescriptor: type
    CUDAGraphMode: Any
    version: str


def installed_vllm() -> VllmNames:
    """The installed vLLM's names (`ImportError` without vLLM, or with one the drop-in refuses)."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu import pcp_manager
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.input_batch import InputBatch

    from .installed import VLLM_VERSION, FunctionalPCPManager

    plain = type("FunctionalPCPManager", (FunctionalPCPManager,), {"graph_backend": None})
    return VllmNames(
        pcp_manager.PCPManager, plain, InputBatch, BatchExecutionDescriptor, CUDAGraphMode, VLLM_VERSION
    )


@dataclasses.dataclass(frozen=True)
class Difference:
    """The first place where the two managers differ."""

    step: int
    rank: int
    field: str  # the local batch's field, or "partition_batch" when one of them raised
    vllm: str  # vLLM's value (or its error), shortened
    pcp_fn: str  # the drop-in's

    def __str__(self) -> str:
        return f"step {self.step}, rank {self.rank}, {self.field}: vLLM {self.vllm}; pcp_fn {self.pcp_fn}"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """[`compare_with_vllm`][pcp_fn.adapters.vllm.against.compare_with_vllm]'s answer."""

    version: str  # the engine's
    steps: int  # compared (up to and including a difference's)
    ranks: tuple[int, ...]
    fields: tuple[str, ...]  # the local batch's fields compared
    difference: Difference | None


SPLIT_FIELDS = ("partition_batch", "decode rows", "prefill positions", "row runs")
"""What a trace of another prefill split is compared on (module docstring)."""


def compare_with_vllm(
    trace: Trace | str,
    *,
    ranks: Sequence[int] | None = None,
    names: VllmNames | None = None,
    device: torch.device | str = "cpu",
) -> Comparison:
    """Every step of a recorded MRV2 trace through vLLM's `PCPManager` and the drop-in, on each
    rank of `ranks` (default all), until the first difference.

    Args:
        trace: an engine's trace (a layout of `ENGINE_LAYOUTS`), or its path.
        names: the engine's classes (default [`installed_vllm`][pcp_fn.adapters.vllm.against.installed_vllm]).

    Raises:
        ValueError: a trace no vLLM model runner V2 recorded (no engine, another layout).
        ImportError: no vLLM, or one the drop-in refuses.
    """
    if not isinstance(trace, Trace):
        trace = read_trace(trace)
    if trace.engine is None or trace.config.layout not in ENGINE_LAYOUTS:
        raise ValueError(
            "--against vllm needs a trace a vLLM model runner V2 drop-in recorded (its header's engine, "
            f"layout {' or '.join(ENGINE_LAYOUTS)}); this one has engine {trace.engine} and layout "
            f"{trace.config.layout!r}"
        )
    names = installed_vllm() if names is None else names
    cfg = trace.config
    ranks = tuple(range(cfg.pcp_size)) if ranks is None else tuple(ranks)
    fields = tuple(f.name for f in dataclasses.fields(names.InputBatch))
    layout = get_layout(cfg.layout)
    kw = dict(
        pcp_world_size=cfg.pcp_size,
        device=torch.device(device),
        shard_decode_requests=layout.shard_decode_requests,
        max_num_reqs=cfg.max_num_reqs,
        max_num_tokens=cfg.max_num_tokens,
        dcp_world_size=cfg.dcp_size,
        cp_interleave=cfg.cp_kv_cache_interleave_size,
    )
    if trace.engine.moe_gathers_tokens:
        kw["moe_gathers_tokens"] = True
    if not isinstance(layout.split, HeadTail):
        return _compare_split(trace, names, ranks, kw, torch.device(device))
    steps = 0
    for rank in ranks:
        theirs = names.PCPManager(pcp_rank=rank, **kw)
        ours = names.drop_in(pcp_rank=rank, record_schedule="", **kw)  # never recorded again
        for i, s in enumerate(trace.steps):
            steps = max(steps, i + 1)
            found = _step_difference(names, theirs, ours, s, torch.device(device))
            if found is not None:
                field, a, b = found
                return Comparison(names.version, steps, ranks, fields, Difference(i, rank, field, a, b))
    return Comparison(names.version, steps, ranks, fields, None)


def _compare_split(
    trace: Trace, names: VllmNames, ranks: tuple[int, ...], kw: dict[str, Any], device: torch.device
) -> Comparison:
    """A trace of another prefill split against vLLM's head and tail chunks, step by step over
    `ranks` together ([`SPLIT_FIELDS`][pcp_fn.adapters.vllm.against.SPLIT_FIELDS])."""
    theirs = {q: names.PCPManager(pcp_rank=q, **kw) for q in ranks}
    base = trace.config.layout.removesuffix("-sharded")
    ours = {q: names.drop_in(pcp_rank=q, record_schedule="", layout=base, **kw) for q in ranks}
    for i, s in enumerate(trace.steps):
        locals_: dict[str, dict[int, Any]] = {"vllm": {}, "pcp_fn": {}}
        # vLLM's chunks may need more rows than the recorded graph size the drop-in's split fit:
        # vLLM's manager pads its own way (NONE), the split-neutral fields do not see the padding
        plain = dataclasses.replace(s, batch_desc=None)
        for who, managers, step in (("vllm", theirs, plain), ("pcp_fn", ours, s)):
            for q in ranks:
                batch, desc = global_batch(names.InputBatch, step, device), descriptor(names, step)
                try:
                    locals_[who][q] = _rows(managers[q].partition_batch(batch, desc))
                except Exception as e:  # one refusing what the other serves is the finding
                    locals_[who][q] = f"raised {type(e).__name__}: {e}"
        found = _split_difference(locals_["vllm"], locals_["pcp_fn"], ranks)
        if found is not None:
            rank, field, a, b = found
            return Comparison(names.version, i + 1, ranks, SPLIT_FIELDS, Difference(i, rank, field, a, b))
    return Comparison(names.version, len(trace.steps), ranks, SPLIT_FIELDS, None)


def _rows(local: Any) -> list[tuple[str, bool, list[int], int]]:
    """A local batch's request rows: `(request id, prefilling, positions, seq_len)`."""
    n = local.num_reqs
    qsl, positions = local.query_start_loc_np[: n + 1].tolist(), local.positions.cpu().tolist()
    seq_lens = local.seq_lens[:n].cpu().tolist()
    flags = local.is_prefilling_np[:n].tolist()
    return [(local.req_ids[k], flags[k], positions[qsl[k] : qsl[k + 1]], seq_lens[k]) for k in range(n)]


def _split_difference(theirs: dict[int, Any], ours: dict[int, Any], ranks: tuple[int, ...]) -> Any:
    """`(rank, field, vLLM's, pcp_fn's)` of the first entry of
    [`SPLIT_FIELDS`][pcp_fn.adapters.vllm.against.SPLIT_FIELDS] that differs in one step (rank ->
    rows or an error), else `None`."""
    for q in ranks:
        a, b = theirs[q], ours[q]
        if isinstance(a, str) or isinstance(b, str):
            if not (isinstance(a, str) and isinstance(b, str)):
                return (
                    q,
                    "partition_batch",
                    shorten(a if isinstance(a, str) else "served"),
                    shorten(b if isinstance(b, str) else "served"),
                )
            continue
        decodes_a = [row for row in a if not row[1] and row[2]]
        decodes_b = [row for row in b if not row[1] and row[2]]
        if decodes_a != decodes_b:
            return q, "decode rows", shorten(repr(decodes_a)), shorten(repr(decodes_b))
        for req, _, positions, seq_len in b:
            if positions and positions != list(range(seq_len - len(positions), seq_len)):
                return (
                    q,
                    "row runs",
                    "one contiguous run a row",
                    shorten(f"{req}: {positions}, seq_len {seq_len}"),
                )
    covered: list[dict[str, list[int]]] = [{}, {}]
    for held, by_rank in zip(covered, (theirs, ours)):
        for q in ranks:
            if isinstance(by_rank[q], str):
                continue
            for req, prefilling, positions, _ in by_rank[q]:
                if prefilling:
                    held.setdefault(req, []).extend(positions)
    for req in sorted(set(covered[0]) | set(covered[1])):
        a, b = sorted(covered[0].get(req, [])), sorted(covered[1].get(req, []))
        if a != b:
            return ranks[0], "prefill positions", shorten(f"{req}: {a}"), shorten(f"{req}: {b}")
    return None


def _step_difference(names: VllmNames, theirs: Any, ours: Any, s: TraceStep, device: torch.device) -> Any:
    """`(field, vLLM's, pcp_fn's)` of the first field where the two local batches of step `s`
    differ (or where only one manager raised), else `None`."""
    results = []
    for manager in (theirs, ours):
        batch, desc = global_batch(names.InputBatch, s, device), descriptor(names, s)
        try:
            results.append((True, manager.partition_batch(batch, desc)))
        except Exception as e:  # one refusing what the other serves is the finding
            results.append((False, f"raised {type(e).__name__}: {e}"))
    (ok_a, a), (ok_b, b) = results
    if not (ok_a and ok_b):
        return None if not (ok_a or ok_b) else ("partition_batch", shorten(a), shorten(b))
    return next(differences(a, b), None)


def differences(a: Any, b: Any, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """Every field of two dataclass instances that differs: `(name, a's, b's)`."""
    for f in dataclasses.fields(a):
        x, y, name = getattr(a, f.name), getattr(b, f.name), prefix + f.name
        if dataclasses.is_dataclass(x) and not isinstance(x, type) and type(x) is type(y):
            yield from differences(x, y, name + ".")
        elif not _same(x, y):
            yield name, shorten(x), shorten(y)


def _same(x: Any, y: Any) -> bool:
    """Equal values and types: tensors and arrays by dtype, shape and values."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return (
            isinstance(x, torch.Tensor)
            and isinstance(y, torch.Tensor)
            and x.dtype == y.dtype
            and x.shape == y.shape
            and torch.equal(x.cpu(), y.cpu())
        )
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return (
            isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)
            and x.dtype == y.dtype
            and (np.array_equal(x, y))
        )
    if isinstance(x, list | tuple) and x and isinstance(x[0], torch.Tensor):
        return type(x) is type(y) and len(x) == len(y) and all(map(_same, x, y))
    return type(x) is type(y) and bool(x == y)


def shorten(value: Any, most: int = 160) -> str:
    """A value for the report: a tensor or array as its dtype, shape and values, cut at `most`."""
    if isinstance(value, torch.Tensor):
        text = f"{value.dtype} {tuple(value.shape)} {value.tolist()}"
    elif isinstance(value, np.ndarray):
        text = f"{value.dtype} {value.shape} {value.tolist()}"
    else:
        text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= most else text[: most - 3] + "..."


def descriptor(names: VllmNames, s: TraceStep) -> Any:
    """vLLM's `BatchExecutionDescriptor` of a recorded step (`NONE` when none was recorded)."""
    desc = s.batch_desc
    values: dict[str, Any] = {"cg_mode": names.CUDAGraphMode[desc.cg_mode if desc else "NONE"]}
    values["num_tokens"] = desc.num_tokens if desc and desc.num_tokens is not None else 0
    values["num_reqs"] = desc.num_reqs if desc else None
    if desc is not None:
        values["max_query_len"], values["uniform_token_count"] = desc.max_query_len, desc.uniform_token_count
    accepted = {f.name for f in dataclasses.fields(names.BatchExecutionDescriptor)}
    return names.BatchExecutionDescriptor(**{k: v for k, v in values.items() if k in accepted})


def _has_field(cls: type, name: str) -> bool:
    """Whether the dataclass `cls` has a field `name`."""
    return any(f.name == name for f in dataclasses.fields(cls))


def global_batch(
    input_batch_cls: type,
    s: TraceStep,
    device: torch.device,
    *,
    req_ids: Sequence[object] | None = None,
    input_ids: Sequence[Sequence[int]] | None = None,
    num_drafts: Sequence[int] | None = None,
) -> Any:
    """vLLM's global `InputBatch` (`input_batch_cls`) of a step, as its runner's `prepare_inputs`
    makes it: the step's rows, prefill flags (default `num_computed < num_prompt`), request rows
    (default `arange`) and descriptor's padding; positions from the computed tokens.

    Args:
        req_ids: the requests' ids (default `req-<request row>`).
        input_ids: each request's scheduled token ids (default zeros: a recording holds none).
        num_drafts: each request's draft tokens (default none).
    """
    sched = np.asarray(s.num_scheduled, np.int32)
    computed = np.asarray(s.num_computed, np.int32)
    prompt = np.asarray(s.num_prompt, np.int32)
    n, total = sched.size, int(sched.sum())
    flags = s.is_prefilling if s.is_prefilling is not None else np.minimum(computed, prompt) < prompt
    prefilling = np.asarray(flags, np.bool_)
    desc = s.batch_desc
    rows = desc.num_reqs if desc is not None and desc.num_reqs else n
    padded = max(total, desc.num_tokens if desc is not None and desc.num_tokens else 0)
    qsl = np.full(rows + 1, total, np.int32)
    qsl[0] = 0
    np.cumsum(sched, out=qsl[1 : n + 1])
    positions = np.zeros(padded, np.int64)
    positions[:total] = np.repeat(computed.astype(np.int64) - qsl[:n], sched) + np.arange(total)
    ids = np.zeros(padded, np.int32)
    if input_ids is not None:
        ids[:total] = np.concatenate([np.asarray(t, np.int32) for t in input_ids] or [np.zeros(0, np.int32)])
    seq = np.zeros(rows, np.int32)
    seq[:n] = computed + sched
    states = np.asarray(s.idx_mapping if s.idx_mapping is not None else range(n), np.intp)
    drafts = [0] * n if num_drafts is None else list(num_drafts)
    t: Callable[[np.ndarray], torch.Tensor] = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    idx = torch.from_numpy(states.astype(np.int64)).to(device)
    # vLLM 0.32+'s batch says whether a decode graph may run it (0.30's has no such field)
    graph = (
        {"decode_graph_eligible": not bool(prefilling.any())}
        if _has_field(input_batch_cls, "decode_graph_eligible")
        else {}
    )
    return input_batch_cls(
        req_ids=[f"req-{k}" for k in (states.tolist() if req_ids is None else req_ids)],
        num_reqs=n,
        num_reqs_after_padding=rows,
        idx_mapping=idx,
        idx_mapping_np=states,
        expanded_idx_mapping=idx,
        expanded_local_pos=torch.zeros(n, dtype=torch.int32, device=device),
        num_scheduled_tokens=sched,
        num_tokens=total,
        num_tokens_after_padding=padded,
        num_draft_tokens=sum(drafts),
        num_draft_tokens_per_req=np.array(drafts, np.int32) if any(drafts) else None,
        query_start_loc=t(qsl),
        query_start_loc_np=qsl,
        seq_lens=t(seq),
        seq_lens_cpu_upper_bound=torch.from_numpy(seq.copy()),
        dcp_local_seq_lens=None,
        num_computed_tokens_np=computed,
        prefill_len_np=prompt,
        num_computed_prefill_tokens_np=np.minimum(computed, prompt),
        is_prefilling_np=prefilling,
        has_prefill=bool(prefilling.any()),
        **graph,
        input_ids=t(ids),
        positions=t(positions),
        is_padding=t(np.arange(padded) >= total),
        logits_indices=t(qsl[1 : n + 1] - 1),
        cu_num_logits=torch.arange(n + 1, dtype=torch.int32, device=device),
        cu_num_logits_np=np.arange(n + 1, dtype=np.int32),
        has_structured_output_reqs=False,
        prompt_lens=None,
    )
