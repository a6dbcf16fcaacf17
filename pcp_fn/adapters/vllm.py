"""vLLM 0.32.0 drop-in: ``FunctionalPCPManager`` and the ``vllm.general_plugins`` entry point.

Importing this module imports vLLM (``import pcp_fn`` does not import it).

    PCP_FN_PCP_MANAGER=1 vllm serve ... --prefill-context-parallel-size 4

With the package installed, vLLM calls :func:`register` in every process
(entry point ``pcp_fn = "pcp_fn.adapters.vllm:register"`` in the
``vllm.general_plugins`` group); with ``PCP_FN_PCP_MANAGER=1`` it makes the GPU
model runner V2 (``GPUModelRunner.pcp_manager_cls``, read by
``maybe_build_pcp_manager``) build :data:`FunctionalPCPManager`.
"""

from __future__ import annotations

import os
from typing import Any

from vllm.config import get_current_vllm_config_or_none
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed import parallel_state
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.input_batch import InputBuffers
from vllm.v1.worker.gpu.pcp_manager import PCPManager

from .vllm_manager import VllmApi, make_functional_manager

ENV_FLAG = "PCP_FN_PCP_MANAGER"


def _get_pcp_group() -> Any:
    return parallel_state.get_pcp_group()  # looked up per call: honours a patched group


def _capture_sizes() -> list[int] | None:
    """The current vLLM config's CUDA-graph capture sizes (``None`` outside a config context)."""
    config = get_current_vllm_config_or_none()
    return None if config is None else config.compilation_config.cudagraph_capture_sizes


VLLM_API = VllmApi(
    PCPManager=PCPManager,
    InputBuffers=InputBuffers,
    CUDAGraphMode=CUDAGraphMode,
    PAD_SLOT_ID=PAD_SLOT_ID,
    get_pcp_group=_get_pcp_group,
    capture_sizes=_capture_sizes,
)

#: A subclass of ``vllm.v1.worker.gpu.pcp_manager.PCPManager`` (vLLM 0.32.0).
FunctionalPCPManager = make_functional_manager(VLLM_API)
FunctionalPCPManager.__module__ = __name__


def _manager_cls(self: Any) -> type:
    return FunctionalPCPManager


_PCP_MANAGER_CLS = property(_manager_cls, doc="pcp_fn's FunctionalPCPManager (pcp_fn.adapters.vllm)")


def register() -> None:
    """``vllm.general_plugins`` entry point: with ``PCP_FN_PCP_MANAGER=1``, make vLLM's GPU model
    runner (V2) build :data:`FunctionalPCPManager`. Idempotent; a no-op without the flag."""
    if os.environ.get(ENV_FLAG, "0") != "1":
        return
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if GPUModelRunner.__dict__.get("pcp_manager_cls") is not _PCP_MANAGER_CLS:
        GPUModelRunner.pcp_manager_cls = _PCP_MANAGER_CLS  # type: ignore[assignment,method-assign]


def is_registered() -> bool:
    """Whether :func:`register` has swapped the GPU model runner's manager class."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner.__dict__.get("pcp_manager_cls") is _PCP_MANAGER_CLS
