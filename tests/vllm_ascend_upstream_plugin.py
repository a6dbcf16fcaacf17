"""pytest plugin for vllm-ascend's own unit tests: ``-p vllm_ascend_upstream_plugin``.

``tests/adapters/test_vllm_ascend_upstream.py`` runs vllm-ascend's files with it.

``PCP_FN_UPSTREAM_ASCEND_TARGET`` names the manager of vllm-ascend the files test (a key of
:data:`TARGETS`). With ``PCP_FN_UPSTREAM_MANAGER=functional`` the plugin puts pcp_fn's drop-in in
the place of that class before the first test module is imported (so its
``from vllm_ascend.worker.pcp_utils import PCPManager`` gets the drop-in), and in every
vllm_ascend module already loaded that holds the class under that name; with ``vllm-ascend`` (or
unset) it changes nothing, so the same files run against vllm-ascend's class. The test files are
vllm-ascend's, unchanged.

Order: vllm-ascend's ``tests/ut/conftest.py`` puts ``torch_npu`` / ``torch.npu`` stand-ins in
place on a machine without an NPU, then imports ``vllm_ascend``. pytest imports ``-p`` plugins
before any conftest, so this module imports nothing of vllm_ascend at load time: the swap runs
when the first test module's collection starts (``pytest_collectstart``), after the conftests of
the paths given, and refuses to run if that conftest is not loaded.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

#: target -> (vllm-ascend's module, its class's name there, pcp_fn's drop-in as "module:attribute")
TARGETS = {
    # vllm-ascend 0.23.x: model_runner_v1's DualChunkSwap manager
    "v1": ("vllm_ascend.worker.pcp_utils", "PCPManager", "pcp_fn.adapters.vllm_ascend:FunctionalDCSManager"),
    # vllm-ascend main / 0.30: the model runner V2 manager
    "v2": (
        "vllm_ascend.worker.v2.pcp_manager",
        "AscendPCPManager",
        "pcp_fn.adapters.vllm_ascend:FunctionalAscendPCPManager",
    ),
}
MANAGER = os.environ.get("PCP_FN_UPSTREAM_MANAGER", "vllm-ascend")
TARGET = os.environ.get("PCP_FN_UPSTREAM_ASCEND_TARGET", "v1")
CONFTEST = os.path.join("tests", "ut", "conftest.py")

if MANAGER not in ("vllm-ascend", "functional"):
    raise ValueError(f"PCP_FN_UPSTREAM_MANAGER must be 'vllm-ascend' or 'functional', got {MANAGER!r}")
if TARGET not in TARGETS:
    raise ValueError(f"PCP_FN_UPSTREAM_ASCEND_TARGET must be one of {sorted(TARGETS)}, got {TARGET!r}")

_under_test: list[type] = []  # the class the tests get, once the swap (or its absence) is done


def _conftest_loaded() -> bool:
    return any((getattr(m, "__file__", None) or "").endswith(CONFTEST) for m in list(sys.modules.values()))


def _swap() -> type:
    module_name, attr, drop_in = TARGETS[TARGET]
    if not _conftest_loaded():
        raise pytest.UsageError(
            f"vllm-ascend's {CONFTEST} is not loaded: its torch_npu stand-ins must exist before "
            "vllm_ascend is imported (run pytest from the extracted sdist's root on its tests/ut files)"
        )
    module = importlib.import_module(module_name)
    original = getattr(module, attr)
    if MANAGER == "vllm-ascend":
        return original
    where, name = drop_in.split(":")
    replacement = getattr(importlib.import_module(where), name)
    # the class's own module, and any vllm_ascend module that imported it already
    for loaded_name, loaded in list(sys.modules.items()):
        if loaded_name.startswith("vllm_ascend") and getattr(loaded, attr, None) is original:
            setattr(loaded, attr, replacement)
    return replacement


def pytest_collectstart(collector: pytest.Collector) -> None:
    if not _under_test and isinstance(collector, pytest.Module):
        _under_test.append(_swap())


def pytest_report_collectionfinish(config: pytest.Config, start_path: object, items: list) -> str:
    if not _under_test:
        return "manager under test: none (no test module collected)"
    cls = _under_test[0]
    return f"{TARGETS[TARGET][1]} under test: {cls.__module__}.{cls.__qualname__}"
