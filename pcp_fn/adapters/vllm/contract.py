"""What differs between the vLLM releases `FunctionalPCPManager` serves, in one place.

vLLM's model-runner-V2 `PCPManager` (`vllm/v1/worker/gpu/pcp_manager.py`)
changed its contract between 0.30.0 and 0.34.0 (0.30 is the vLLM vllm-ascend 0.30 stands on):

| what | 0.30 | 0.32 | 0.33 / 0.34 |
|---|---|---|---|
| decodes | replicated | `shard_decode_requests` | as 0.32 |
| `partition_batch` | `(batch, padded_num_tokens, padded_num_reqs)` | `(batch, batch_desc)` | as 0.32 |
| `restore_for_sampling` | `(hidden) -> (hidden, batch)` | `(hidden, aux) -> (hidden, aux, batch)` | as 0.32 |
| a draft of another batch | `prepare_draft_prefill` keeps the prepared one | resets it | as 0.32 |
| the batch's graph fields | (none) | `max_seq_len_np`, `decode_graph_eligible`, ... | as 0.32 |
| a FULL capture's batch | `max_query_len=None` | `max_query_len = num_tokens` | as 0.32 |
| block tables | constructor | constructor | `set_block_tables` after KV init |
| MoE routing mask | (none) | (none) | `moe_gathers_tokens`, `moe_is_padding` |
| capture / dummy staging | `prepare_inputs_to_capture` | as 0.30 | `prepare_inputs_for_capture_or_profile` |
| draft inputs | `get_draft_input_buffers(buffers)` | as 0.30 | `(buffers, num_tokens) -> (inputs, mask)` |
| per-step metadata | `dcp_local_seq_lens_cpu_upper_bound` | as 0.30 | `pcp: PCPBatchMetadata` |
| drafts after sampling | (none) | (none) | `sync_drafts` (0.34; vLLM's, inherited) |

With `moe_gathers_tokens` the local batch's `is_padding` is the gathered `[P * Lp]` mask. (vLLM main
between 0.32 and 0.33 had the 0.33 methods but the per-step metadata of 0.32.)

[`detect`][pcp_fn.adapters.vllm.detect] reads which contract the installed vLLM
has from its `PCPManager` class and module, never from a user switch; the
manager ([`pcp_fn.adapters.vllm.manager`][]) is one class over it: the
public methods whose names or signatures differ are a mixin picked here, and
the local batch's metadata fields come from
[`VllmContract.metadata_fields`][pcp_fn.adapters.vllm.VllmContract.metadata_fields]. This module
imports no vLLM.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import os
import re
import textwrap
from typing import Any

import numpy as np
import torch

from ...core.checks import check_int
from .engine_types import BlockTables, InputBatch, InputBuffers

logger = logging.getLogger("pcp_fn.adapters.vllm")

SUPPORTED_SERIES = ("0.30", "0.32", "0.33", "0.34")
"""The vLLM release series the drop-in is checked against: the current release and the two before it, and
0.30 (the vLLM vllm-ascend 0.30 stands on); development builds of a series (`0.33.1.dev4+g...`) count as
that series."""


def vllm_series(version: str) -> str | None:
    """`"0.34"` of `"0.34.0"`, `"0.32.0+cpu"` or `"0.33.1.dev4+gabc"`; `None` if unparsable."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return None if match is None else f"{int(match[1])}.{int(match[2])}"


def unsupported_reason(version: str) -> str | None:
    """Why the installed vLLM `version` is refused, or `None` when it is supported."""
    if vllm_series(version) in SUPPORTED_SERIES:
        return None
    supported = ", ".join(f"{s}.x" for s in SUPPORTED_SERIES)
    return (
        f"pcp_fn's FunctionalPCPManager supports vLLM {supported}; the installed vLLM is {version}. "
        "Install a supported vLLM or unset PCP_FN_PCP_MANAGER to use vLLM's own PCPManager."
    )


# --------------------------------------------------------------------------- the public methods


@dataclasses.dataclass(frozen=True)
class PaddedSizes:
    """vLLM 0.30's padded sizes as the descriptor the bookkeeper reads (what vLLM 0.30's
    `maybe_partition_pcp_batch` made of the runner's `BatchExecutionDescriptor`, read back):
    `NONE` without `padded_num_tokens`, `FULL` with `padded_num_reqs`, else `PIECEWISE`."""

    cg_mode: Any
    num_tokens: int
    num_reqs: int | None


def padded_sizes(
    modes: Any,
    cache: dict[tuple[Any, ...], PaddedSizes],
    padded_num_tokens: int | None,
    padded_num_reqs: int | None,
) -> PaddedSizes:
    """The [`PaddedSizes`][pcp_fn.adapters.vllm.contract.PaddedSizes] of vLLM 0.30's
    `partition_batch(input_batch, padded_num_tokens, padded_num_reqs)`, one object per distinct
    pair in `cache` (the bookkeeper recognises a repeated descriptor by identity); the sizes
    checked as ints, naming the argument. `num_tokens` 0 without `padded_num_tokens` (vLLM pads to
    the largest rank then)."""
    # (the classes too: 8.0 == 8, and a float is checked, not matched)
    key = (padded_num_tokens, padded_num_tokens.__class__, padded_num_reqs, padded_num_reqs.__class__)
    found = cache.get(key)
    if found is not None:
        return found
    if padded_num_tokens is not None:
        check_int("padded_num_tokens", padded_num_tokens, 0)
    if padded_num_reqs is not None:
        check_int("padded_num_reqs", padded_num_reqs, 1)
        if padded_num_tokens is None:
            raise ValueError("padded_num_reqs needs padded_num_tokens (a FULL graph pads both)")
    if padded_num_tokens is None:
        sizes = PaddedSizes(modes.NONE, 0, None)
    elif padded_num_reqs is None:
        sizes = PaddedSizes(modes.PIECEWISE, padded_num_tokens, None)
    else:
        sizes = PaddedSizes(modes.FULL, padded_num_tokens, padded_num_reqs)
    cache[key] = sizes
    return sizes


class _Methods030:
    """vLLM 0.30's names: decodes replicated (the constructor has no `shard_decode_requests`),
    `partition_batch` of padded sizes, a 2-tuple `restore_for_sampling`, block tables at
    construction, no MoE mask; `prepare_draft_prefill` of another batch keeps a prepared draft."""

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: torch.device,
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: BlockTables | None = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
        *,
        record_schedule: str | os.PathLike[str] | None = None,
        layout: str | None = None,
    ) -> None:
        """vLLM 0.30's constructor: decodes replicated on every rank."""
        super().__init__(  # type: ignore[call-arg]
            pcp_world_size, pcp_rank, device, False, max_num_reqs, max_num_tokens, block_tables,
            dcp_world_size, dcp_rank, cp_interleave, record_schedule=record_schedule, layout=layout,
        )  # fmt: skip

    def partition_batch(
        self,
        input_batch: InputBatch,
        padded_num_tokens: int | None = None,
        padded_num_reqs: int | None = None,
    ) -> InputBatch:
        """This rank's local `InputBatch` (vLLM 0.30): the local tokens padded to
        `padded_num_tokens` (default: the largest rank's), the request rows to `padded_num_reqs`
        (a FULL graph)."""
        bookkeeper = self.bookkeeper  # type: ignore[attr-defined]
        cache = bookkeeper.__dict__.setdefault("padded_sizes", {})
        sizes = padded_sizes(self.vllm_api.CUDAGraphMode, cache, padded_num_tokens, padded_num_reqs)  # type: ignore[attr-defined]
        return bookkeeper.partition_batch(input_batch, sizes)

    def restore_for_sampling(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, InputBatch]:
        """Restored hidden states with the global batch to sample with (vLLM 0.30)."""
        hidden, _, batch = self.bookkeeper.restore_for_sampling(hidden_states, None)  # type: ignore[attr-defined]
        return hidden, batch

    def prepare_draft_prefill(self, input_batch: InputBatch, input_ids: torch.Tensor) -> None:
        """Point the drafter at this rank's rows of `input_ids` when `input_batch` is the batch
        last partitioned; another batch changes nothing (vLLM 0.30 keeps a prepared draft)."""
        bookkeeper = self.bookkeeper  # type: ignore[attr-defined]
        if input_batch is bookkeeper.last_global_batch and bookkeeper.last_local_batch is not None:
            bookkeeper.prepare_draft_prefill(input_batch, input_ids)

    def prepare_inputs_to_capture(self, input_batch: InputBatch) -> InputBatch:
        """Stage a capture or dummy batch in the persistent local buffers (vLLM 0.30)."""
        return self.bookkeeper.stage_capture(input_batch)  # type: ignore[attr-defined]

    def get_draft_input_buffers(self, input_buffers: InputBuffers) -> InputBatch | InputBuffers:
        """The local batch while a draft prefill is prepared, else `input_buffers` (vLLM 0.30)."""
        return self.bookkeeper.draft_input_buffers(input_buffers)  # type: ignore[attr-defined]


class _Methods032:
    """vLLM 0.32's names: block tables at construction, no MoE mask."""

    def prepare_inputs_to_capture(self, input_batch: InputBatch) -> InputBatch:
        """Stage a capture or dummy batch in the persistent local buffers (vLLM 0.32)."""
        return self.bookkeeper.stage_capture(input_batch)  # type: ignore[attr-defined]

    def get_draft_input_buffers(self, input_buffers: InputBuffers) -> InputBatch | InputBuffers:
        """The local batch while a draft prefill is prepared, else `input_buffers` (vLLM 0.32)."""
        return self.bookkeeper.draft_input_buffers(input_buffers)  # type: ignore[attr-defined]


class _Methods033:
    """vLLM 0.33's names (and vLLM main's between 0.32 and 0.33): late block tables, MoE mask."""

    def set_block_tables(self, block_tables: BlockTables | None) -> None:
        """Attach the KV block tables (the runner calls it after KV-cache init): the local block
        tables and slot-mapping buffers are allocated for them, once."""
        bookkeeper = self.__dict__.get("bookkeeper")
        if bookkeeper is None:  # from vLLM's constructor: its attributes as vLLM's leave them
            super().set_block_tables(block_tables)  # type: ignore[misc]
        else:
            bookkeeper.set_block_tables(block_tables)

    def moe_is_padding(self, is_padding: torch.Tensor) -> torch.Tensor:
        """A capture/dummy padding mask `[n]`, the same on every rank, as the `[P * n]` rows the
        MoE routes (rank-major), in the persistent MoE mask; unchanged without `moe_gathers_tokens`."""
        return self.bookkeeper.moe_is_padding(is_padding)  # type: ignore[attr-defined]

    def prepare_inputs_for_capture_or_profile(self, input_batch: InputBatch) -> InputBatch:
        """Stage a capture or dummy batch in the persistent local buffers; its `is_padding` is
        the MoE's gathered mask when the MoE all-gathers the tokens."""
        bookkeeper = self.bookkeeper  # type: ignore[attr-defined]
        staged = bookkeeper.stage_capture(input_batch)
        return dataclasses.replace(staged, is_padding=bookkeeper.moe_is_padding(staged.is_padding))

    def get_draft_input_buffers(
        self, input_buffers: InputBuffers, num_tokens: int
    ) -> tuple[InputBatch | InputBuffers, torch.Tensor]:
        """The draft inputs and their MoE routing mask: the local batch while a draft prefill is
        prepared, else `input_buffers` with its first `num_tokens` rows' mask."""
        return self.bookkeeper.draft_input_buffers(input_buffers, num_tokens)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the contract


@dataclasses.dataclass(frozen=True)
class VllmContract:
    """One vLLM release's `PCPManager` contract.

    Attributes:
        name: `"0.32"`, `"0.33"` or `"0.34"` (`"0.33-dev"`: vLLM main
            between 0.32 and 0.33, the 0.33 methods without the metadata class).
        methods: the mixin of the public methods whose names or signatures differ.
        moe_mask: the constructor takes `moe_gathers_tokens`.
        batch_metadata: `PCPBatchMetadata` (the local batch's `pcp` field), or
            `None` (its `dcp_local_seq_lens_cpu_upper_bound` field).
        shards_decodes: the constructor takes `shard_decode_requests` (0.32+; 0.30 replicates
            every decode).
        graph_fields: the `InputBatch` has `max_seq_len_np`, `decode_graph_eligible` and
            `prefill_runs_as_decode_np` (0.32+).
        capture_bounds_queries: the capture of a FULL graph without a query bound stages a batch
            promising queries as long as the graph (`max_query_len = num_tokens`, 0.32+); vLLM
            0.30 stages `max_query_len=None`.
    """

    name: str
    methods: type
    moe_mask: bool
    batch_metadata: type | None = None
    shards_decodes: bool = True
    graph_fields: bool = True
    capture_bounds_queries: bool = True

    def metadata_fields(
        self,
        global_batch: InputBatch,
        num_scheduled: np.ndarray,
        rows: np.ndarray,
        dcp_upper: torch.Tensor | None,
    ) -> dict[str, Any]:
        """The local batch's per-step PCP metadata: `rows [n]` each local row's global request,
        `dcp_upper` the DCP rank 0 sequence-length bound `[Rpad]` (`None` without DCP)."""
        if self.batch_metadata is None:
            return {"dcp_local_seq_lens_cpu_upper_bound": dcp_upper}
        upper = global_batch.seq_lens_cpu_upper_bound
        upper = upper.numpy() if isinstance(upper, torch.Tensor) else np.asarray(upper)
        return {
            "pcp": self.batch_metadata(
                global_num_tokens=global_batch.num_tokens,
                global_query_lens_np=num_scheduled[rows],
                global_seq_lens_cpu_upper_bound_np=upper[rows],
                dcp_local_seq_lens_cpu_upper_bound=dcp_upper,
            )
        }

    def base_init_keywords(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: torch.device,
        shard_decode_requests: bool,
        dcp_world_size: int,
        dcp_rank: int,
        cp_interleave: int,
    ) -> dict[str, Any]:
        """The keywords the drop-in builds vLLM's base with: the ranks and sizes, no capacities (the
        base allocates nothing), `shard_decode_requests` where the release's constructor takes it."""
        kw: dict[str, Any] = dict(
            pcp_world_size=pcp_world_size, pcp_rank=pcp_rank, device=device,
            dcp_world_size=dcp_world_size, dcp_rank=dcp_rank, cp_interleave=cp_interleave,
        )  # fmt: skip
        if self.shards_decodes:
            kw["shard_decode_requests"] = shard_decode_requests
        return kw


VLLM_0_30 = VllmContract(
    "0.30",
    _Methods030,
    moe_mask=False,
    shards_decodes=False,
    graph_fields=False,
    capture_bounds_queries=False,
)
VLLM_0_32 = VllmContract("0.32", _Methods032, moe_mask=False)


def detect(manager_cls: type, module: object) -> VllmContract:
    """The contract of a vLLM whose `PCPManager` is `manager_cls`, defined in `module`
    (`vllm.v1.worker.gpu.pcp_manager`; only its `PCPBatchMetadata` is read): read from what
    they provide."""
    if not hasattr(manager_cls, "set_block_tables"):
        partition = getattr(manager_cls, "partition_batch", None)  # (0.30: of the padded sizes)
        if partition is not None and "padded_num_tokens" in inspect.signature(partition).parameters:
            return VLLM_0_30
        return VLLM_0_32
    params = inspect.signature(manager_cls.__init__).parameters
    if "moe_gathers_tokens" not in params:
        raise ValueError(
            f"{manager_cls.__qualname__} has set_block_tables but no moe_gathers_tokens: a vLLM "
            "between the supported releases that pcp_fn was not checked against"
        )
    metadata = getattr(module, "PCPBatchMetadata", None)
    if hasattr(manager_cls, "sync_drafts"):
        # sync_drafts is vLLM's own (a broadcast of rank 0's drafts: nothing of the layout in it)
        return VllmContract("0.34", _Methods033, moe_mask=True, batch_metadata=metadata)
    return VllmContract(
        "0.33" if metadata else "0.33-dev", _Methods033, moe_mask=True, batch_metadata=metadata
    )


# --------------------------------------------------------------------------- the contract canary

ALLOW_UNKNOWN_ENV = "PCP_FN_ALLOW_UNKNOWN_VLLM"
"""Set to `1` to serve an installed vLLM whose `PCPManager` differs from the release the drop-in was written
for (a build of vLLM main): the differences are logged, not refused."""


class _Default:
    """A parameter default as the canonical signature prints it: literals as `repr`, anything
    else by name (`cls=PCPManager`): stable across processes and releases."""

    def __init__(self, value: object) -> None:
        literal = value is None or isinstance(value, bool | int | float | str)
        self.text = repr(value) if literal else getattr(value, "__name__", type(value).__name__)

    def __repr__(self) -> str:
        return self.text


def canonical_signature(fn: Any) -> str:
    """`fn`'s parameters (names, kinds, defaults) as text, without annotations: what a caller's
    call depends on (`"(self, input_batch, batch_desc)"`)."""
    sig = inspect.signature(fn)
    params = [
        p.replace(
            annotation=inspect.Parameter.empty,
            default=p.default if p.default is inspect.Parameter.empty else _Default(p.default),
        )
        for p in sig.parameters.values()
    ]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def public_api(manager_cls: type) -> dict[str, str]:
    """Every public method of `manager_cls` (its own and inherited, but `object`'s) and its
    constructor, by name: `canonical_signature`, prefixed `static` / `class` for static and
    class methods; a property is `"property"`."""
    names = {"__init__"}
    for klass in manager_cls.__mro__[:-1]:  # (object last)
        names.update(n for n in vars(klass) if not n.startswith("_"))
    api = {}
    for name in sorted(names):
        attr = inspect.getattr_static(manager_cls, name)
        if isinstance(attr, property):
            api[name] = "property"
        elif isinstance(attr, staticmethod | classmethod):
            kind = "static" if isinstance(attr, staticmethod) else "class"
            api[name] = f"{kind} {canonical_signature(attr.__func__)}"
        elif callable(attr):
            api[name] = canonical_signature(attr)
    return api


def build_keywords(build_fn: Any) -> tuple[str, ...] | None:
    """The keywords `maybe_build_pcp_manager` (`build_fn`) passes to the manager class
    (`cls(...)` in its source), sorted; `None` when its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(build_fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cls"
    ]
    return tuple(sorted(k.arg for call in calls for k in call.keywords if k.arg is not None))


_API_032 = {
    "__init__": (
        "(self, pcp_world_size, pcp_rank, device, shard_decode_requests, max_num_reqs=None, "
        "max_num_tokens=None, block_tables=None, dcp_world_size=1, dcp_rank=0, cp_interleave=1)"
    ),
    "get_draft_input_buffers": "(self, input_buffers)",
    "get_dummy_block_tables": "(self, num_reqs)",
    "get_dummy_slot_mappings": "(self, num_tokens)",
    "get_num_tokens_for_dispatch": "(self, num_scheduled_tokens, is_prefilling)",
    "global_batch": "property",
    "input_buffers": "property",
    "partition_batch": "(self, input_batch, batch_desc)",
    "prepare_attn": "(self, input_batch)",
    "prepare_draft_prefill": "(self, input_batch, input_ids)",
    "prepare_inputs_to_capture": "(self, input_batch)",
    "prepare_slot_mappings": "(self)",
    "replicated_requests": "(self, num_scheduled_tokens, is_prefilling)",
    "restore_draft_prefill": "(self, last_hidden_states, hidden_states)",
    "restore_for_sampling": "(self, hidden_states, aux_hidden_states)",
    "restore_hidden_states": "(self, hidden_states)",
    "validate_config": "static (vllm_config, supports_mm_inputs)",
}
_API_033 = {k: v for k, v in _API_032.items() if k != "prepare_inputs_to_capture"} | {
    "__init__": _API_032["__init__"][:-1] + ", moe_gathers_tokens=False)",
    "get_draft_input_buffers": "(self, input_buffers, num_tokens)",
    "moe_is_padding": "(self, is_padding)",
    "prepare_inputs_for_capture_or_profile": "(self, input_batch)",
    "set_block_tables": "(self, block_tables)",
}
_KEYWORDS_032 = (
    "block_tables", "cp_interleave", "dcp_rank", "dcp_world_size", "device", "max_num_reqs",
    "max_num_tokens", "pcp_rank", "pcp_world_size", "shard_decode_requests",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ReleaseApi:
    """What the drop-in was written for in one vLLM release (`vllm/v1/worker/gpu/pcp_manager.py`
    of its source, read by [`public_api`][pcp_fn.adapters.vllm.contract.public_api],
    [`canonical_signature`][pcp_fn.adapters.vllm.contract.canonical_signature] and
    [`build_keywords`][pcp_fn.adapters.vllm.contract.build_keywords]).

    Attributes:
        methods: `PCPManager`'s public methods and constructor
            ([`public_api`][pcp_fn.adapters.vllm.contract.public_api]).
        build: `maybe_build_pcp_manager`'s signature.
        keywords: the keywords `maybe_build_pcp_manager` passes to the manager class.
    """

    methods: dict[str, str]
    build: str
    keywords: tuple[str, ...]


_API_030 = {k: v for k, v in _API_032.items() if k != "global_batch"} | {
    "__init__": _API_032["__init__"].replace(" shard_decode_requests,", ""),
    "partition_batch": "(self, input_batch, padded_num_tokens=None, padded_num_reqs=None)",
    "restore_for_sampling": "(self, hidden_states)",
}

RELEASE_APIS: dict[str, ReleaseApi] = {
    "0.30": ReleaseApi(
        _API_030,
        "(vllm_config, device, supports_mm_inputs, block_tables, cls=PCPManager)",
        tuple(k for k in _KEYWORDS_032 if k != "shard_decode_requests"),
    ),
    "0.32": ReleaseApi(
        _API_032, "(vllm_config, device, supports_mm_inputs, block_tables, cls=PCPManager)", _KEYWORDS_032
    ),
    "0.33": ReleaseApi(
        _API_033,
        "(vllm_config, device, supports_mm_inputs, block_tables=None, cls=PCPManager)",
        tuple(sorted((*_KEYWORDS_032, "moe_gathers_tokens"))),
    ),
}
"""The contract the drop-in was written for, by release series: 0.30.0, 0.32.0, 0.33.0 and 0.34.0's sources
(0.32 adds decode sharding, the batch descriptor and the auxiliary restores; 0.33 the MoE flag, the late
block tables and the capture/draft names; 0.34 `sync_drafts`, vLLM's own, inherited).
"""
RELEASE_APIS["0.34"] = dataclasses.replace(
    RELEASE_APIS["0.33"],
    methods=_API_033 | {"sync_drafts": "(self, draft_tokens, idx_mapping, draft_logits)"},
)


def api_differences(series: str, manager_cls: type, build_fn: Any) -> list[str]:
    """How the installed `PCPManager` (`manager_cls`) and `maybe_build_pcp_manager`
    (`build_fn`) differ from release `series`'s
    ([`RELEASE_APIS`][pcp_fn.adapters.vllm.contract.RELEASE_APIS]), one line each (empty: the same
    contract)."""
    want = RELEASE_APIS[series]
    have = public_api(manager_cls)
    out = []
    for name in sorted(want.methods.keys() | have.keys()):
        expected, got = want.methods.get(name), have.get(name)
        if got == expected:
            continue
        if expected is None:
            out.append(f"PCPManager.{name} {got}: a public method vLLM {series}.0 does not have")
        elif got is None:
            out.append(f"PCPManager.{name} is missing (vLLM {series}.0: {expected})")
        else:
            out.append(f"PCPManager.{name} is {got} (vLLM {series}.0: {expected})")
    build = canonical_signature(build_fn)
    if build != want.build:
        out.append(f"maybe_build_pcp_manager is {build} (vLLM {series}.0: {want.build})")
    keywords = build_keywords(build_fn)
    if keywords is None:
        out.append("maybe_build_pcp_manager's source is unavailable: the keywords it passes are unknown")
    elif keywords != want.keywords:
        added = sorted(set(keywords) - set(want.keywords))
        gone = sorted(set(want.keywords) - set(keywords))
        out.append(
            f"maybe_build_pcp_manager passes the manager class the keywords {list(keywords)} "
            f"(new: {added}, gone: {gone}; vLLM {series}.0: {list(want.keywords)})"
        )
    return out


def check_installed(version: str, manager_cls: type, build_fn: Any, environ: Any = None) -> str | None:
    """Why the installed vLLM (`version`, its `PCPManager` and `maybe_build_pcp_manager`) is
    refused, or `None`: an unsupported series, or a contract that differs from its release's
    (a build of vLLM main after that release), naming each difference. With
    `PCP_FN_ALLOW_UNKNOWN_VLLM=1` in `environ` (default `os.environ`) the differences are a
    logged warning instead."""
    reason = unsupported_reason(version)
    if reason is not None:
        return reason
    series = vllm_series(version)
    differences = api_differences(series, manager_cls, build_fn)
    if not differences:
        return None
    listed = "\n  - ".join(differences)
    message = (
        f"pcp_fn's FunctionalPCPManager was written for vLLM {series}.0's PCPManager; the installed "
        f"vLLM {version} differs:\n  - {listed}\n"
    )
    environ = os.environ if environ is None else environ
    if environ.get(ALLOW_UNKNOWN_ENV) == "1":
        logger.warning("%s%s=1: serving it anyway, unchecked", message, ALLOW_UNKNOWN_ENV)
        return None
    return message + (
        f"Install vLLM {series}.0 (or another supported release), unset PCP_FN_PCP_MANAGER to use "
        f"vLLM's own PCPManager, or set {ALLOW_UNKNOWN_ENV}=1 to serve this build unchecked."
    )
