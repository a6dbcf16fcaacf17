"""Adapters that put `pcp_fn` behind a serving engine's own interfaces, one package per engine line.

Shared by every adapter:

- [`pcp_fn.adapters.runtime`][]: the graph runtime (graphs made at construction, bound to
  their staging inputs, replayed; the eager fallback; the host-sync guard);
- [`pcp_fn.adapters.backend`][]: the `PCP_FN_GRAPH_BACKEND` switch, the ladder of
  buckets, the `aoti` package cache (`PCP_FN_CACHE_DIR`);
- [`pcp_fn.adapters.schedule_cache`][]: what a repeated schedule reuses.

The engines:

- [`pcp_fn.adapters.vllm`][]: `FunctionalPCPManager`, a drop-in for the
  model-runner-V2 `PCPManager` of vLLM 0.32, 0.33 and 0.34 (a thin class over the
  vLLM-free `MRV2Bookkeeper`), and the `vllm.general_plugins` entry point `register`;
- [`pcp_fn.adapters.vllm_ascend`][]: `v1`, `FunctionalDCSManager`, a drop-in for
  vllm-ascend 0.23's DualChunkSwap `PCPManager` (`install()` switches it in); `v2`,
  `FunctionalAscendPCPManager`, a drop-in for vllm-ascend main's model-runner-V2
  `AscendPCPManager` over the vLLM one (built on first access, which imports vLLM and
  vllm-ascend).

Importing these packages imports no vLLM or vllm-ascend (`import pcp_fn` never imports
the adapters); the classes over the installed engines import them on first access.
"""
