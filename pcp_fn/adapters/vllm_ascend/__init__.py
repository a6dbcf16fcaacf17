"""vllm-ascend adapters.

- [`pcp_fn.adapters.vllm_ascend.v1`][], vllm-ascend's released line (0.23.x):
  [`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager], a drop-in for the
  DualChunkSwap `PCPManager` of `vllm_ascend/worker/pcp_utils.py` that `model_runner_v1.py` runs;
  [`install`][pcp_fn.adapters.vllm_ascend.install] switches it in before the runner is built.
- [`pcp_fn.adapters.vllm_ascend.v2`][], vllm-ascend main (vLLM's model runner V2):
  `FunctionalAscendPCPManager`, built on first access over the installed vLLM's `PCPManager` by
  [`make_functional_ascend_manager`][pcp_fn.adapters.vllm_ascend.make_functional_ascend_manager].

Nothing here imports vllm, vllm_ascend or torch_npu at import time; the
methods that need them import them when called.
"""

from __future__ import annotations

import importlib

from .v1 import (
    FunctionalDCSManager,
    PCPAsyncSpecDecodeRebuildResult,
    PCPSpecDecodeFirstPassInputs,
    PCPSpecDecodeMTPInputs,
    install,
)
from .v2 import AscendApi, PCPAttentionContext, make_functional_ascend_manager

__all__ = [
    "AscendApi",
    "FunctionalAscendPCPManager",
    "FunctionalDCSManager",
    "PCPAsyncSpecDecodeRebuildResult",
    "PCPAttentionContext",
    "PCPSpecDecodeFirstPassInputs",
    "PCPSpecDecodeMTPInputs",
    "install",
    "make_functional_ascend_manager",
]


def __getattr__(name: str) -> type:
    """`FunctionalAscendPCPManager`: built on first access over the installed vLLM and vllm-ascend
    ([`pcp_fn.adapters.vllm_ascend.v2.installed`][]: imports both; an unknown vllm-ascend is refused
    unless `PCP_FN_ALLOW_UNKNOWN_VLLM_ASCEND=1`)."""
    if name != "FunctionalAscendPCPManager":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = importlib.import_module(f"{__name__}.v2.installed").FunctionalAscendPCPManager
    globals()[name] = cls
    return cls
