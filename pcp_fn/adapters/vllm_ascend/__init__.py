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

import dataclasses

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
    """`FunctionalAscendPCPManager`: built on first access over vLLM and vllm-ascend main (imports
    both), `FunctionalAscendPCPManagerMixin` over the vLLM drop-in and vLLM's MRV2 `PCPManager`."""
    if name != "FunctionalAscendPCPManager":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from vllm.distributed import parallel_state
    from vllm_ascend.worker.v2.attn_utils import build_attn_state
    from vllm_ascend.worker.v2.input_batch import AscendInputBuffers

    from ..vllm.installed import vllm_api

    try:  # the attention builders' own record type, where this vllm-ascend has it
        from vllm_ascend.worker.v2.pcp_manager import AscendPCPAttentionContext as context
    except ImportError:
        context = PCPAttentionContext

    cls = make_functional_ascend_manager(
        # vLLM's names; the ladder follows vllm-ascend's padded sizes, not vLLM's capture sizes
        dataclasses.replace(vllm_api(), capture_sizes=None),
        AscendApi(
            AscendInputBuffers=AscendInputBuffers,
            build_attn_state=build_attn_state,
            get_pp_group=lambda: parallel_state.get_pp_group(),
            AttentionContext=context,
        ),
    )
    cls.__module__ = __name__
    globals()[name] = cls
    return cls
