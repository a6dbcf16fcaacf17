"""What differs between the vllm-ascend model-runner-V2 lines `FunctionalAscendPCPManager` serves.

vllm-ascend's `AscendPCPManager` (`vllm_ascend/worker/v2/pcp_manager.py`) subclasses vLLM's MRV2
`PCPManager`. Two lines are served:

- decodes: 0.30 shards them when PCP > 1, DCP = 1 and no speculative decoding
  (`is_decode_sharded`), else replicates them; main replicates them.
- the runner sets `vllm_config`, `kv_cache_config`, `global_input_buffers` (0.30); `vllm_config`
  (main).
- `partition_batch`: 0.30 passes `padded_num_reqs` on only when sharded and pads a sharded uniform
  FULL graph's query starts; main lays out the speculative local rows, `padded_num_reqs` pads a
  FULL graph.
- attention state: 0.30 keeps a decode-only batch's global one (`build_attn_state(...,
  kv_cache_config=)`); main builds it every step.
- empty ranks: 0.30 zeroes their sequence lengths and upper bounds; main leaves the base's.
- restores: the global `num_tokens_after_padding` rows, `_sampling_hidden_restored` skipping the
  sampling gather (0.30); the global `query_start_loc_np[-1]` rows (main).
- drafts: 0.30's `prepare_draft_prefill` does nothing (the draft is replicated); main: vLLM's.
- attention context: 0.30 adds `local_to_global_req_indices`, `local_token_indices` and a sharded
  dummy's global view.
- `validate_config`: vllm-ascend's (FULL_DECODE_ONLY graphs only) under 0.30; main's drop-in
  accepts `FULL` (a deviation).
- the class: 0.30's drop-in subclasses vllm-ascend's `AscendPCPManager`; main's subclasses vLLM's
  `PCPManager`.

[`detect_ascend`][pcp_fn.adapters.vllm_ascend.v2.contract.detect_ascend] names the line of the
installed vllm-ascend from its version and its `AscendPCPManager` (the canary: its public methods, and
the helpers the drop-in inherits, must be those of the release recorded here); any other vllm-ascend is
refused unless `PCP_FN_ALLOW_UNKNOWN_VLLM_ASCEND=1`, which serves main at 01af1b74's behaviour over a
vLLM 0.32-0.34 base. This module imports neither vLLM nor vllm-ascend.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import re
from typing import Any

from ...vllm.contract import canonical_signature, public_api

logger = logging.getLogger("pcp_fn.adapters.vllm_ascend")

ALLOW_UNKNOWN_ENV = "PCP_FN_ALLOW_UNKNOWN_VLLM_ASCEND"
"""Set to `1` to serve a vllm-ascend that is not a release the drop-in was checked against (a build of
vllm-ascend main): main at 01af1b74's behaviour over the installed vLLM 0.32-0.34, with a logged
warning."""

SUPPORTED_RELEASES = ("0.30.0rc2",)
"""The vllm-ascend releases of the model-runner-V2 line the drop-in is checked against (by their own
tests and in lockstep with their `AscendPCPManager`)."""


@dataclasses.dataclass(frozen=True)
class AscendContract:
    """One vllm-ascend line's `AscendPCPManager` contract.

    Attributes:
        name: `"0.30"` (vllm-ascend 0.30.0rc2) or `"main"` (main at 01af1b74).
        vllm: the vLLM release series its `AscendPCPManager` stands on.
        subclasses_ascend: the drop-in subclasses vllm-ascend's `AscendPCPManager` (else vLLM's
            `PCPManager`, the base vllm-ascend's subclasses).
        inherited: the members taken from vllm-ascend's class as they are (policy and plumbing: the
            decode placement rule, `validate_config`, the collectives, the attention context built
            from the manager's vLLM-named views); the drop-in implements the bookkeeping.
    """

    name: str
    vllm: tuple[str, ...]
    subclasses_ascend: bool
    inherited: tuple[str, ...] = ()


ASCEND_0_30 = AscendContract(
    "0.30",
    vllm=("0.30",),
    subclasses_ascend=True,
    inherited=(
        "validate_config",
        "is_decode_sharded",
        "replicated_requests",
        "_iter_rank_chunks",
        "broadcast_replicated_hidden_states",
        "global_batch",
        "is_last_pp_rank",
        "get_global_graph_num_reqs",
        "_get_global_graph_num_reqs",
        "_full_decode_requests_are_token_sized",
        "prepare_draft_prefill",
        "restore_for_sampling",
        "restore_hidden_state_buffer",
        "build_attention_context",
        "_build_sharded_dummy_attention_context",
    ),
)
"""vllm-ascend 0.30.0rc2, on vLLM 0.30.0."""
# ("0.33-dev": vLLM main between 0.32 and 0.33, a contract the vLLM drop-in serves too)
ASCEND_MAIN = AscendContract("main", vllm=("0.32", "0.33-dev", "0.33", "0.34"), subclasses_ascend=False)
"""vllm-ascend main at 01af1b74 (over vLLM 0.32-0.34; served by opt-in)."""

_API_030 = {
    "__init__": (
        "(self, pcp_world_size, pcp_rank, device, req_states=None, max_num_reqs=None, max_num_tokens=None, "
        "block_tables=None, dcp_world_size=1, dcp_rank=0, cp_interleave=1)"
    ),
    "broadcast_replicated_hidden_states": (
        "static (last_hidden_states, hidden_states, num_tokens, replicated_pcp)"
    ),
    "build_attention_context": "(self, input_batch=None, block_tables=None, slot_mappings=None)",
    "get_draft_input_buffers": "(self, input_buffers)",
    "get_dummy_block_tables": "(self, num_reqs)",
    "get_dummy_slot_mappings": "(self, num_tokens)",
    "get_global_graph_num_reqs": "(self, batch_desc)",
    "get_num_tokens_for_dispatch": "(self, num_scheduled_tokens, is_prefilling)",
    "global_batch": "property",
    "input_buffers": "property",
    "is_decode_sharded": "property",
    "is_last_pp_rank": "property",
    "partition_batch": "(self, input_batch, padded_num_tokens=None, padded_num_reqs=None)",
    "prepare_attn": "(self, input_batch)",
    "prepare_draft_prefill": "(self, input_batch, input_ids)",
    "prepare_inputs_to_capture": "(self, input_batch)",
    "prepare_slot_mappings": "(self)",
    "replicated_requests": "(self, num_scheduled_tokens, is_prefilling)",
    "restore_draft_prefill": "(self, last_hidden_states, hidden_states)",
    "restore_for_sampling": "(self, hidden_states)",
    "restore_hidden_state_buffer": "(self, hidden_states)",
    "restore_hidden_states": "(self, hidden_states)",
    "validate_config": "static (vllm_config, supports_mm_inputs)",
}
_PRIVATE_030 = {  # the inherited helpers: the inherited methods call them
    "_iter_rank_chunks": "(self, rank, num_scheduled_tokens, is_prefilling)",
    "_full_decode_requests_are_token_sized": "(self, global_batch)",
    "_get_global_graph_num_reqs": "(self, num_local_reqs, query_len)",
    "_build_sharded_dummy_attention_context": "(self, input_batch, query_len)",
}
RELEASE_APIS: dict[str, dict[str, str]] = {"0.30": _API_030 | _PRIVATE_030}
"""The `AscendPCPManager` each supported release has: its public methods
([`public_api`][pcp_fn.adapters.vllm.contract.public_api]) and the private helpers the inherited members
call, as canonical signatures."""


def ascend_version() -> str | None:
    """The installed vllm-ascend's version (its distribution's), `None` when it is not installed."""
    for dist in ("vllm_ascend", "vllm-ascend"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def ascend_series(version: str) -> str | None:
    """`"0.30"` of `"0.30.0rc2"`; `None` if unparsable."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return None if match is None else f"{int(match[1])}.{int(match[2])}"


def api_differences(series: str, manager_cls: type) -> list[str]:
    """How the installed `AscendPCPManager` (`manager_cls`) differs from release `series`'s
    ([`RELEASE_APIS`][pcp_fn.adapters.vllm_ascend.v2.contract.RELEASE_APIS]), one line each."""
    want = RELEASE_APIS[series]
    have = public_api(manager_cls)
    for name in _PRIVATE_030:
        member = getattr(manager_cls, name, None)
        if member is not None:
            have[name] = canonical_signature(member)
    out = []
    for name in sorted(want.keys() | have.keys()):
        expected, got = want.get(name), have.get(name)
        if got == expected:
            continue
        if expected is None:
            out.append(f"AscendPCPManager.{name} {got}: a public method vllm-ascend {series} does not have")
        elif got is None:
            out.append(f"AscendPCPManager.{name} is missing (vllm-ascend {series}: {expected})")
        else:
            out.append(f"AscendPCPManager.{name} is {got} (vllm-ascend {series}: {expected})")
    return out


def detect_ascend(
    version: str | None, manager_cls: type | None, vllm_series: str, environ: Any = None
) -> AscendContract:
    """The line of the installed vllm-ascend (`version`, its `AscendPCPManager` `manager_cls`) on the
    installed vLLM (`vllm_series`, e.g. `"0.30"`).

    Raises:
        ImportError: a vllm-ascend the drop-in was not checked against (another release, a release
            whose `AscendPCPManager` differs from the recorded one, or one on another vLLM than it
            stands on), naming each difference; `PCP_FN_ALLOW_UNKNOWN_VLLM_ASCEND=1` serves main at
            01af1b74's behaviour instead, over vLLM 0.32-0.34, with a logged warning.
    """
    environ = os.environ if environ is None else environ
    reasons: list[str] = []
    if version in SUPPORTED_RELEASES:
        series = ascend_series(version)
        contract = ASCEND_0_30
        if vllm_series not in contract.vllm:
            reasons.append(
                f"vllm-ascend {version} stands on vLLM {' / '.join(contract.vllm)}; the installed vLLM is "
                f"{vllm_series}"
            )
        if manager_cls is not None:
            reasons += api_differences(series, manager_cls)
        if not reasons:
            return contract
    else:
        supported = ", ".join(SUPPORTED_RELEASES)
        reasons.append(
            f"the installed vllm-ascend is {version}; the drop-in supports vllm-ascend {supported}"
        )
    listed = "\n  - ".join(reasons)
    message = f"pcp_fn's FunctionalAscendPCPManager cannot serve this vllm-ascend:\n  - {listed}\n"
    if environ.get(ALLOW_UNKNOWN_ENV) == "1":
        if vllm_series not in ASCEND_MAIN.vllm:
            raise ImportError(
                message + f"{ALLOW_UNKNOWN_ENV}=1 serves vllm-ascend main at 01af1b74's behaviour, which "
                f"stands on vLLM {' / '.join(ASCEND_MAIN.vllm)}; the installed vLLM is {vllm_series}."
            )
        logger.warning(
            "%s%s=1: serving vllm-ascend main at 01af1b74's behaviour, unchecked", message, ALLOW_UNKNOWN_ENV
        )
        return ASCEND_MAIN
    raise ImportError(
        message + f"Install vllm-ascend {', '.join(SUPPORTED_RELEASES)}, unset PCP_FN_PCP_MANAGER to use "
        f"vllm-ascend's own AscendPCPManager, or set {ALLOW_UNKNOWN_ENV}=1 to serve vllm-ascend main at "
        "01af1b74's behaviour unchecked."
    )
