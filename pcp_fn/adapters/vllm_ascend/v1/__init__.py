"""vllm-ascend 0.23's line:
[`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager], a drop-in for the
DualChunkSwap `PCPManager`.

vllm-ascend's released line (0.23.x) runs the DualChunkSwap `PCPManager` of
`vllm_ascend/worker/pcp_utils.py` from `model_runner_v1.py`. This package
gives the same class on pcp_fn: every index map is built by pcp_fn's fixed-shape
ops (captured once per bucket on an NPU with `torch.npu.NPUGraph`), every
host value the runner reads comes from an O(R) numpy twin, and the state
carried across steps is one frozen record. Switch it in with [`install`][pcp_fn.adapters.vllm_ascend.install]
before the runner is built:

    from pcp_fn.adapters.vllm_ascend import install
    install()  # vllm_ascend.worker.pcp_utils.PCPManager -> FunctionalDCSManager

Nothing here imports vllm, vllm_ascend or torch_npu at import time; the
methods that need them (the PCP group's all-gather, vllm-ascend's metadata
class) import them when called and fall back to stand-ins when absent.
"""

from __future__ import annotations

import importlib
import sys

from ._spec_inputs import PCPAsyncSpecDecodeRebuildResult
from ._spec_proposer import PCPSpecDecodeFirstPassInputs, PCPSpecDecodeMTPInputs
from .manager import FunctionalDCSManager

__all__ = [
    "FunctionalDCSManager",
    "PCPAsyncSpecDecodeRebuildResult",
    "PCPSpecDecodeFirstPassInputs",
    "PCPSpecDecodeMTPInputs",
    "install",
]


def install(**manager_kwargs) -> type:
    """Make vllm-ascend's runner build
    [`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager] instead of its
    `PCPManager`.

    Replaces `PCPManager` in `vllm_ascend.worker.pcp_utils` (and in
    `vllm_ascend.worker.model_runner_v1` if it was imported already: it imports
    the name), so call it before the model runner is constructed, e.g. from a
    vLLM general plugin. `manager_kwargs` (`capture=`, `token_buckets=`...)
    go to every manager. Returns the class that was replaced.
    """
    utils = importlib.import_module("vllm_ascend.worker.pcp_utils")
    original = utils.PCPManager

    class _Configured(FunctionalDCSManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**manager_kwargs, **kwargs})

    _Configured.__name__ = _Configured.__qualname__ = "FunctionalDCSManager"
    utils.PCPManager = _Configured
    runner = sys.modules.get("vllm_ascend.worker.model_runner_v1")
    if runner is not None:
        runner.PCPManager = _Configured
    return original
