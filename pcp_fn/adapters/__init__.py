"""Adapters that put ``pcp_fn`` behind a serving engine's own interfaces.

- :mod:`pcp_fn.adapters.vllm`: ``FunctionalPCPManager``, a drop-in for vLLM
  0.32.0's model-runner-V2 ``PCPManager``, and the ``vllm.general_plugins``
  entry point ``register``. Importing it imports vLLM.
- :mod:`pcp_fn.adapters.vllm_manager`: the manager's class body, built over any
  base (vLLM's, or a test stand-in); imports no vLLM.
- :mod:`pcp_fn.adapters.bookkeeping`: the only adapter module that calls
  ``pcp_fn`` (host twin, captured ``mrv2`` graph, restores).

This package imports nothing on its own: ``import pcp_fn`` never imports vLLM.
"""
