"""vLLM drop-in: `FunctionalPCPManager` and the `vllm.general_plugins` entry point.

    PCP_FN_PCP_MANAGER=1 vllm serve ... --prefill-context-parallel-size 4

With the package installed, vLLM calls [`register`][pcp_fn.adapters.vllm.register] in every process
(entry point `pcp_fn = "pcp_fn.adapters.vllm:register"` in the
`vllm.general_plugins` group); with `PCP_FN_PCP_MANAGER=1` it makes the GPU
model runner V2 (`GPUModelRunner.pcp_manager_cls`, read by
`maybe_build_pcp_manager`) build [`FunctionalPCPManager`][pcp_fn.adapters.vllm.FunctionalPCPManager].

The package, one module per concept:

- [`bookkeeper`][pcp_fn.adapters.vllm.bookkeeper]:
  [`MRV2Bookkeeper`][pcp_fn.adapters.vllm.MRV2Bookkeeper], the step work with vLLM's method names
  and no vLLM import (the engine's names in its constructor);
- [`graphs`][pcp_fn.adapters.vllm.graphs]: [`StepGraphs`][pcp_fn.adapters.vllm.StepGraphs], the only
  module that calls `pcp_fn` (the host twin, the captured `mrv2` graph per bucket, the restores);
- [`manager`][pcp_fn.adapters.vllm.manager]: the thin class over vLLM's `PCPManager`;
- [`contract`][pcp_fn.adapters.vllm.contract]: what differs between vLLM 0.32, 0.33 and 0.34;
- [`engine_types`][pcp_fn.adapters.vllm.engine_types]: the vLLM objects the adapters read, as protocols
  (`InputBatch`, `BlockTables`, `BatchExecutionDescriptor`, ...);
- [`installed`][pcp_fn.adapters.vllm.installed]: the class over the installed vLLM (imports vLLM).

- [`inputs`][pcp_fn.adapters.vllm.inputs]: the checks of what vLLM hands it (constructor arguments,
  block tables, descriptors, the batch's tensors, restore and draft inputs);
- [`against`][pcp_fn.adapters.vllm.against]: a recorded schedule through vLLM's own `PCPManager`
  and the drop-in, the first difference named (`pcp-fn replay --against vllm`; imports vLLM).

Importing this package imports no vLLM: `FunctionalPCPManager`, `VLLM_API`,
`VLLM_VERSION` and `UNSUPPORTED` import it on first access, and [`register`][pcp_fn.adapters.vllm.register]
only with the flag set. A vLLM outside the supported series is refused by
[`register`][pcp_fn.adapters.vllm.register] (with the flag) and by `FunctionalPCPManager`, naming
the installed and supported versions; so is one whose `PCPManager` public methods or
`maybe_build_pcp_manager` are not its release's (a build of vLLM main: the contract canary, naming
each difference), unless `PCP_FN_ALLOW_UNKNOWN_VLLM=1`
([`ALLOW_UNKNOWN_ENV`][pcp_fn.adapters.vllm.ALLOW_UNKNOWN_ENV]) makes that a logged warning.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .bookkeeper import EngineNames, MRV2Bookkeeper
from .contract import ALLOW_UNKNOWN_ENV, SUPPORTED_SERIES, VllmContract, detect
from .graphs import StepGraphs
from .manager import FunctionalPCPManagerMixin, VllmApi, make_functional_manager

ENV_FLAG = "PCP_FN_PCP_MANAGER"
"""Set to `1` for [`register`][pcp_fn.adapters.vllm.register] to switch vLLM's GPU model runner (V2)
to [`FunctionalPCPManager`][pcp_fn.adapters.vllm.FunctionalPCPManager]."""

_INSTALLED = ("FunctionalPCPManager", "VLLM_API", "VLLM_VERSION", "UNSUPPORTED")

__all__ = [
    "ALLOW_UNKNOWN_ENV",
    "ENV_FLAG",
    "SUPPORTED_SERIES",
    "EngineNames",
    "FunctionalPCPManagerMixin",
    "MRV2Bookkeeper",
    "StepGraphs",
    "VllmApi",
    "VllmContract",
    "detect",
    "is_registered",
    "make_functional_manager",
    "register",
    *_INSTALLED,
]


def __getattr__(name: str) -> Any:
    if name in _INSTALLED:
        return getattr(importlib.import_module(f"{__name__}.installed"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _manager_cls(self: object) -> type:  # self: vLLM's GPUModelRunner, not read
    from .installed import FunctionalPCPManager

    return FunctionalPCPManager  # (only registered when supported)


_PCP_MANAGER_CLS = property(_manager_cls, doc="pcp_fn's FunctionalPCPManager (pcp_fn.adapters.vllm)")


def register() -> None:
    """`vllm.general_plugins` entry point: with `PCP_FN_PCP_MANAGER=1`, make vLLM's GPU model
    runner (V2) build [`FunctionalPCPManager`][pcp_fn.adapters.vllm.FunctionalPCPManager].
    Idempotent; a no-op without the flag.

    Raises:
        RuntimeError: (with the flag) the installed vLLM is refused: an unsupported series, or a
            `PCPManager` contract that is not its release's, each difference named
            (`PCP_FN_ALLOW_UNKNOWN_VLLM=1`: a logged warning instead).
    """
    if os.environ.get(ENV_FLAG, "0") != "1":
        return
    from .installed import UNSUPPORTED

    if UNSUPPORTED is not None:
        raise RuntimeError(UNSUPPORTED)
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if GPUModelRunner.__dict__.get("pcp_manager_cls") is not _PCP_MANAGER_CLS:
        GPUModelRunner.pcp_manager_cls = _PCP_MANAGER_CLS  # type: ignore[assignment,method-assign]


def is_registered() -> bool:
    """Whether [`register`][pcp_fn.adapters.vllm.register] has swapped the GPU model runner's
    manager class."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner.__dict__.get("pcp_manager_cls") is _PCP_MANAGER_CLS
