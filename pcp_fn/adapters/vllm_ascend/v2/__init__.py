"""vllm-ascend main's model-runner-V2 line: `FunctionalAscendPCPManager` (`AscendPCPManager`'s drop-in).

[`make_functional_ascend_manager`][pcp_fn.adapters.vllm_ascend.make_functional_ascend_manager]
builds it over any vLLM base (imports neither vLLM nor vllm-ascend);
[`pcp_fn.adapters.vllm_ascend.FunctionalAscendPCPManager`][] is the one over the installed vLLM and
vllm-ascend.
"""

from .manager import (
    SPEC_METHODS,
    AscendApi,
    AscendBookkeeper,
    FunctionalAscendPCPManagerMixin,
    PCPAttentionContext,
    make_functional_ascend_manager,
)

__all__ = [
    "SPEC_METHODS",
    "AscendApi",
    "AscendBookkeeper",
    "FunctionalAscendPCPManagerMixin",
    "PCPAttentionContext",
    "make_functional_ascend_manager",
]
