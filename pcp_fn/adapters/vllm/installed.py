"""``FunctionalPCPManager`` over the installed vLLM (importing this module imports vLLM).

The installed vLLM's contract (0.32, 0.33 or 0.34: :mod:`pcp_fn.adapters.vllm.contract`)
is read from its ``PCPManager``; a vLLM outside
:data:`~pcp_fn.adapters.vllm.contract.SUPPORTED_SERIES` is refused by importing
``FunctionalPCPManager``, with a message naming the installed and the supported versions.
"""

from __future__ import annotations

import functools
from typing import Any

import vllm

from .contract import detect, unsupported_reason
from .engine_types import GroupCoordinator
from .manager import FunctionalPCPManagerMixin, VllmApi

#: The installed vLLM's version, and why it is refused (``None``: supported).
VLLM_VERSION: str = getattr(vllm, "__version__", "unknown")
UNSUPPORTED = unsupported_reason(VLLM_VERSION)


@functools.cache
def vllm_api() -> VllmApi:
    """The installed vLLM's names (:class:`~pcp_fn.adapters.vllm.manager.VllmApi`); the vllm-ascend
    V2 manager builds on the same."""
    from vllm.config import get_current_vllm_config_or_none
    from vllm.config.compilation import CUDAGraphMode
    from vllm.distributed import parallel_state
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu import pcp_manager
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    def get_pcp_group() -> GroupCoordinator:
        return parallel_state.get_pcp_group()  # looked up per call: honours a patched group

    def capture_sizes() -> list[int] | None:
        """The current config's CUDA-graph capture sizes (``None`` outside a config context)."""
        config = get_current_vllm_config_or_none()
        return None if config is None else config.compilation_config.cudagraph_capture_sizes

    return VllmApi(
        PCPManager=pcp_manager.PCPManager,
        InputBuffers=InputBuffers,
        CUDAGraphMode=CUDAGraphMode,
        PAD_SLOT_ID=PAD_SLOT_ID,
        get_pcp_group=get_pcp_group,
        capture_sizes=capture_sizes,
        contract=detect(pcp_manager.PCPManager, pcp_manager),
    )


if UNSUPPORTED is None:
    VLLM_API = vllm_api()

    class FunctionalPCPManager(VLLM_API.contract.methods, FunctionalPCPManagerMixin, VLLM_API.PCPManager):
        __doc__ = FunctionalPCPManagerMixin.__doc__
        vllm_api = VLLM_API

    FunctionalPCPManager.__module__ = "pcp_fn.adapters.vllm"  # its public name

else:

    def __getattr__(name: str) -> Any:
        if name in ("VLLM_API", "FunctionalPCPManager"):
            raise ImportError(UNSUPPORTED)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
