"""`FunctionalAscendPCPManager` over the installed vLLM and vllm-ascend (importing this module imports
both, and vllm-ascend's `torch_npu`: on a machine without an NPU, after
[`install_cpu_standins`][pcp_fn.adapters.vllm_ascend.v2.reference.install_cpu_standins]).

The line served is the installed vllm-ascend's
([`detect_ascend`][pcp_fn.adapters.vllm_ascend.v2.contract.detect_ascend]: 0.30.0rc2, a subclass of
its `AscendPCPManager`); an unknown vllm-ascend is refused by importing this module, each difference
named, unless `PCP_FN_ALLOW_UNKNOWN_VLLM_ASCEND=1`.
"""

from __future__ import annotations

import dataclasses

from vllm.config import get_current_vllm_config_or_none
from vllm.distributed import parallel_state
from vllm_ascend.worker.v2 import pcp_manager as ascend_pcp
from vllm_ascend.worker.v2.input_batch import AscendInputBuffers

from ...vllm.installed import vllm_api
from .contract import ascend_version, detect_ascend
from .manager import AscendApi, PCPAttentionContext, make_functional_ascend_manager


# looked up in vllm-ascend's module at each call, as its own manager does (a patched name holds)
def _build_attn_state(*args: object, **kwargs: object) -> object:
    return ascend_pcp.build_attn_state(*args, **kwargs)


def _decode_sharding(config: object) -> bool:
    return ascend_pcp.is_pcp_decode_sharding_enabled(config)


def installed_manager() -> type:
    """`FunctionalAscendPCPManager` over the installed vLLM and vllm-ascend (a new class each call)."""
    api = vllm_api()
    contract = detect_ascend(ascend_version(), ascend_pcp.AscendPCPManager, api.contract.name)
    cls = make_functional_ascend_manager(
        # vLLM's names; the ladder follows vllm-ascend's padded sizes, not vLLM's capture sizes
        dataclasses.replace(api, capture_sizes=None),
        AscendApi(
            AscendInputBuffers=AscendInputBuffers,
            build_attn_state=_build_attn_state,
            get_pp_group=lambda: parallel_state.get_pp_group(),
            AttentionContext=getattr(ascend_pcp, "AscendPCPAttentionContext", PCPAttentionContext),
            AscendPCPManager=ascend_pcp.AscendPCPManager,
            decode_sharding=_decode_sharding
            if hasattr(ascend_pcp, "is_pcp_decode_sharding_enabled")
            else None,
            current_vllm_config=get_current_vllm_config_or_none,
        ),
        contract=contract,
    )
    cls.__module__ = "pcp_fn.adapters.vllm_ascend"
    return cls


FunctionalAscendPCPManager = installed_manager()
"""The drop-in for the installed vllm-ascend's `AscendPCPManager` (`pcp_fn.adapters.vllm_ascend`'s)."""
