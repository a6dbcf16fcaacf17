"""`FunctionalPCPManager` over the installed vLLM (importing this module imports vLLM).

The installed vLLM's contract (0.32, 0.33 or 0.34: [`pcp_fn.adapters.vllm.contract`][])
is read from its `PCPManager`; a vLLM outside
[`SUPPORTED_SERIES`][pcp_fn.adapters.vllm.SUPPORTED_SERIES] is refused by importing
`FunctionalPCPManager`, with a message naming the installed and the supported versions, and
so is one whose `PCPManager` public methods or `maybe_build_pcp_manager` differ from its
release's (a build of vLLM main after it: the contract canary,
[`check_installed`][pcp_fn.adapters.vllm.contract.check_installed]; `PCP_FN_ALLOW_UNKNOWN_VLLM=1`
serves it with a logged warning).
"""

from __future__ import annotations

import functools
from typing import Any

import vllm

from .contract import check_installed, detect, unsupported_reason
from .engine_types import GroupCoordinator
from .manager import FunctionalPCPManagerMixin, VllmApi

VLLM_VERSION: str = getattr(vllm, "__version__", "unknown")
"""The installed vLLM's version."""


def _refusal() -> str | None:
    """Why the installed vLLM is refused: its series, then (a supported series: its module
    exists) its `PCPManager` contract."""
    if unsupported_reason(VLLM_VERSION) is not None:
        return unsupported_reason(VLLM_VERSION)
    from vllm.v1.worker.gpu import pcp_manager

    return check_installed(VLLM_VERSION, pcp_manager.PCPManager, pcp_manager.maybe_build_pcp_manager)


UNSUPPORTED = _refusal()
"""Why the installed vLLM is refused (`None`: supported): a series outside the supported ones, or a
`PCPManager` that is not its release's (checked once a process)."""


@functools.cache
def vllm_api() -> VllmApi:
    """The installed vLLM's names ([`VllmApi`][pcp_fn.adapters.vllm.VllmApi]); the vllm-ascend
    V2 manager builds on the same. `ImportError` when the installed vLLM is refused
    ([`UNSUPPORTED`][pcp_fn.adapters.vllm.installed.UNSUPPORTED]): nothing is built over a guess."""
    if UNSUPPORTED is not None:
        raise ImportError(UNSUPPORTED)
    from vllm.config import get_current_vllm_config_or_none
    from vllm.config.compilation import CUDAGraphMode
    from vllm.distributed import parallel_state
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu import pcp_manager
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    def get_pcp_group() -> GroupCoordinator:
        return parallel_state.get_pcp_group()  # looked up per call: honours a patched group

    def capture_sizes() -> list[int] | None:
        """The current config's CUDA-graph capture sizes (`None` outside a config context)."""
        config = get_current_vllm_config_or_none()
        return None if config is None else config.compilation_config.cudagraph_capture_sizes

    def compilation_config() -> Any:
        """The current config's compilation config (`None` outside a config context): the
        runner builds the manager under its config, and resolves its `cudagraph_mode` in place
        later (`CompilationConfig.resolve_cudagraph_mode_and_sizes`)."""
        config = get_current_vllm_config_or_none()
        return None if config is None else config.compilation_config

    return VllmApi(
        PCPManager=pcp_manager.PCPManager,
        InputBuffers=InputBuffers,
        CUDAGraphMode=CUDAGraphMode,
        PAD_SLOT_ID=PAD_SLOT_ID,
        get_pcp_group=get_pcp_group,
        capture_sizes=capture_sizes,
        compilation_config=compilation_config,
        contract=detect(pcp_manager.PCPManager, pcp_manager),
    )


if UNSUPPORTED is None:
    VLLM_API = vllm_api()
    """The installed vLLM's names and `PCPManager`
    ([`vllm_api`][pcp_fn.adapters.vllm.installed.vllm_api]); importing it where the installed vLLM
    is refused raises `ImportError` naming why
    ([`UNSUPPORTED`][pcp_fn.adapters.vllm.installed.UNSUPPORTED])."""

    class FunctionalPCPManager(VLLM_API.contract.methods, FunctionalPCPManagerMixin, VLLM_API.PCPManager):
        __doc__ = FunctionalPCPManagerMixin.__doc__
        vllm_api = VLLM_API

    FunctionalPCPManager.__module__ = "pcp_fn.adapters.vllm"  # its public name

else:

    def __getattr__(name: str) -> Any:
        if name in ("VLLM_API", "FunctionalPCPManager"):
            raise ImportError(UNSUPPORTED)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
