"""Adapters that put ``pcp_fn`` behind a serving engine's own interfaces.

- :mod:`pcp_fn.adapters.vllm`: ``FunctionalPCPManager``, a drop-in for the
  model-runner-V2 ``PCPManager`` of vLLM 0.32, 0.33 and 0.34, and the
  ``vllm.general_plugins`` entry point ``register``. Importing it imports vLLM.
- :mod:`pcp_fn.adapters.vllm_contract`: what differs between those releases
  (detected from the installed vLLM) and the supported set; imports no vLLM.
- :mod:`pcp_fn.adapters.vllm_manager`: the manager's class body, built over any
  base (vLLM's, or a test stand-in); imports no vLLM.
- :mod:`pcp_fn.adapters.bookkeeping`: the only vLLM-adapter module that calls
  ``pcp_fn`` (host twin, captured ``mrv2`` graph, restores).
- :mod:`pcp_fn.adapters.backend`: what every adapter's graphs share: the
  ``PCP_FN_GRAPH_BACKEND`` switch, the ladder of buckets made at construction, the
  ``aoti`` package cache (``PCP_FN_CACHE_DIR``).
- :mod:`pcp_fn.adapters.vllm_ascend`: ``FunctionalDCSManager``, a drop-in for
  vllm-ascend 0.23's DualChunkSwap ``PCPManager`` (``install()`` switches it in), and
  ``FunctionalAscendPCPManager``, a drop-in for vllm-ascend main's model-runner-V2
  ``AscendPCPManager`` (built on first access, which imports vLLM and vllm-ascend).

This package imports nothing on its own: ``import pcp_fn`` never imports the
adapters, vLLM or vllm-ascend.
"""
