"""vLLM drop-in: ``FunctionalPCPManager`` and the ``vllm.general_plugins`` entry point.

Importing this module imports vLLM (``import pcp_fn`` does not import it).

    PCP_FN_PCP_MANAGER=1 vllm serve ... --prefill-context-parallel-size 4

With the package installed, vLLM calls :func:`register` in every process
(entry point ``pcp_fn = "pcp_fn.adapters.vllm:register"`` in the
``vllm.general_plugins`` group); with ``PCP_FN_PCP_MANAGER=1`` it makes the GPU
model runner V2 (``GPUModelRunner.pcp_manager_cls``, read by
``maybe_build_pcp_manager``) build :data:`FunctionalPCPManager`.

The installed vLLM's contract (0.32, 0.33 or 0.34:
:mod:`pcp_fn.adapters.vllm_contract`) is read from its ``PCPManager``; a vLLM
outside :data:`~pcp_fn.adapters.vllm_contract.SUPPORTED_SERIES` is refused by
:func:`register` (with the flag) and by importing ``FunctionalPCPManager``,
with a message naming the installed and the supported versions.
"""

from __future__ import annotations

import os
from typing import Any

import vllm

from .vllm_contract import detect, unsupported_reason
from .vllm_manager import VllmApi, make_functional_manager

#: The installed vLLM's version, and why it is refused (``None``: supported).
VLLM_VERSION: str = getattr(vllm, "__version__", "unknown")
UNSUPPORTED = unsupported_reason(VLLM_VERSION)

ENV_FLAG = "PCP_FN_PCP_MANAGER"


def _build() -> tuple[Any, type]:
    """The ``VllmApi`` of the installed vLLM and the drop-in class over it."""
    from vllm.config import get_current_vllm_config_or_none
    from vllm.config.compilation import CUDAGraphMode
    from vllm.distributed import parallel_state
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu import pcp_manager
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    def get_pcp_group() -> Any:
        return parallel_state.get_pcp_group()  # looked up per call: honours a patched group

    def capture_sizes() -> list[int] | None:
        """The current config's CUDA-graph capture sizes (``None`` outside a config context)."""
        config = get_current_vllm_config_or_none()
        return None if config is None else config.compilation_config.cudagraph_capture_sizes

    api = VllmApi(
        PCPManager=pcp_manager.PCPManager,
        InputBuffers=InputBuffers,
        CUDAGraphMode=CUDAGraphMode,
        PAD_SLOT_ID=PAD_SLOT_ID,
        get_pcp_group=get_pcp_group,
        capture_sizes=capture_sizes,
        contract=detect(pcp_manager.PCPManager, pcp_manager),
    )
    cls = make_functional_manager(api)
    cls.__module__ = __name__
    return api, cls


if UNSUPPORTED is None:
    VLLM_API, FunctionalPCPManager = _build()
    #: FunctionalPCPManager: a subclass of the installed vLLM's
    #: ``vllm.v1.worker.gpu.pcp_manager.PCPManager`` (0.32, 0.33 or 0.34).
else:

    def __getattr__(name: str) -> Any:
        if name in ("VLLM_API", "FunctionalPCPManager"):
            raise ImportError(UNSUPPORTED)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _manager_cls(self: Any) -> type:
    return FunctionalPCPManager  # (only registered when supported)


_PCP_MANAGER_CLS = property(_manager_cls, doc="pcp_fn's FunctionalPCPManager (pcp_fn.adapters.vllm)")


def register() -> None:
    """``vllm.general_plugins`` entry point: with ``PCP_FN_PCP_MANAGER=1``, make vLLM's GPU model
    runner (V2) build :data:`FunctionalPCPManager`. Idempotent; a no-op without the flag."""
    if os.environ.get(ENV_FLAG, "0") != "1":
        return
    if UNSUPPORTED is not None:
        raise RuntimeError(UNSUPPORTED)
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if GPUModelRunner.__dict__.get("pcp_manager_cls") is not _PCP_MANAGER_CLS:
        GPUModelRunner.pcp_manager_cls = _PCP_MANAGER_CLS  # type: ignore[assignment,method-assign]


def is_registered() -> bool:
    """Whether :func:`register` has swapped the GPU model runner's manager class."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner.__dict__.get("pcp_manager_cls") is _PCP_MANAGER_CLS
