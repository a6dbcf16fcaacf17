"""What differs between the vLLM releases `FunctionalPCPManager` serves, in one place.

vLLM's model-runner-V2 `PCPManager` (`vllm/v1/worker/gpu/pcp_manager.py`)
changed its contract between 0.32.0 and 0.34.0:

|                         | 0.32                                 | 0.33 / 0.34                             |
|-------------------------|--------------------------------------|-----------------------------------------|
| block tables            | constructor                          | constructor gets `None`; the runner     |
|                         |                                      | calls `set_block_tables` after KV init  |
| MoE routing mask        | (none)                               | `moe_gathers_tokens`: the local batch's |
|                         |                                      | `is_padding` is the gathered            |
|                         |                                      | `[P * Lp]` mask; `moe_is_padding`       |
| capture / dummy staging | `prepare_inputs_to_capture`          | `prepare_inputs_for_capture_or_profile` |
| draft inputs            | `get_draft_input_buffers(buffers)`   | `get_draft_input_buffers(buffers,       |
|                         |                                      | num_tokens) -> (inputs, is_padding)`    |
| per-step metadata       | `dcp_local_seq_lens_cpu_upper_bound` | `pcp: PCPBatchMetadata` (0.33+)         |
| drafts after sampling   | (none)                               | `sync_drafts` (0.34; vLLM's, inherited) |

(vLLM main between 0.32 and 0.33 had the second column but the per-step
metadata of the first.) [`detect`][pcp_fn.adapters.vllm.detect] reads which contract the installed vLLM
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

from .engine_types import BlockTables, InputBatch, InputBuffers

logger = logging.getLogger("pcp_fn.adapters.vllm")

SUPPORTED_SERIES = ("0.32", "0.33", "0.34")
"""The vLLM release series the drop-in is checked against (the current release and the two before it);
development builds of a series (`0.33.1.dev4+g...`) count as that series."""


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
    """

    name: str
    methods: type
    moe_mask: bool
    batch_metadata: type | None = None

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


VLLM_0_32 = VllmContract("0.32", _Methods032, moe_mask=False)


def detect(manager_cls: type, module: object) -> VllmContract:
    """The contract of a vLLM whose `PCPManager` is `manager_cls`, defined in `module`
    (`vllm.v1.worker.gpu.pcp_manager`; only its `PCPBatchMetadata` is read): read from what
    they provide."""
    if not hasattr(manager_cls, "set_block_tables"):
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


RELEASE_APIS: dict[str, ReleaseApi] = {
    "0.32": ReleaseApi(
        _API_032, "(vllm_config, device, supports_mm_inputs, block_tables, cls=PCPManager)", _KEYWORDS_032
    ),
    "0.33": ReleaseApi(
        _API_033,
        "(vllm_config, device, supports_mm_inputs, block_tables=None, cls=PCPManager)",
        tuple(sorted((*_KEYWORDS_032, "moe_gathers_tokens"))),
    ),
}
"""The contract the drop-in was written for, by release series: 0.32.0, 0.33.0 and 0.34.0's sources (0.33 adds
the MoE flag, the late block tables and the capture/draft names; 0.34 `sync_drafts`, vLLM's own, inherited).
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
