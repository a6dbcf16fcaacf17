"""pytest plugin for vLLM's own unit tests, ``-p vllm_upstream_plugin`` (test_vllm_upstream.py).

With ``PCP_FN_UPSTREAM_MANAGER=functional`` it puts ``FunctionalPCPManager`` in the
place of ``vllm.v1.worker.gpu.pcp_manager.PCPManager`` when pytest loads it, before
any test module runs ``from vllm.v1.worker.gpu.pcp_manager import PCPManager``; with
``vllm`` (or unset) it changes nothing, so the same files run against vLLM's class.
The test files themselves are vLLM's, unchanged.
"""

from __future__ import annotations

import os

MANAGER = os.environ.get("PCP_FN_UPSTREAM_MANAGER", "vllm")

if MANAGER == "functional":
    from vllm.v1.worker.gpu import pcp_manager

    from pcp_fn.adapters.vllm import FunctionalPCPManager

    pcp_manager.PCPManager = FunctionalPCPManager  # type: ignore[misc]
elif MANAGER != "vllm":
    raise ValueError(f"PCP_FN_UPSTREAM_MANAGER must be 'vllm' or 'functional', got {MANAGER!r}")


def pytest_report_header(config: object) -> str:
    from vllm.v1.worker.gpu import pcp_manager

    cls = pcp_manager.PCPManager
    return f"PCPManager under test: {cls.__module__}.{cls.__qualname__}"
