"""`PCP_FN_PCP_MANAGER=1` under vllm-ascend's model runner V2.

vllm-ascend's `NPUModelRunner` (`vllm_ascend/worker/v2/model_runner.py`) names its manager class in
its own `pcp_manager_cls` property, so the vLLM plugin's swap of `GPUModelRunner.pcp_manager_cls`
does not reach it. [`register`][pcp_fn.adapters.vllm_ascend.v2.switch.register], the
`vllm.general_plugins` entry point `pcp_fn_ascend` (beside the vLLM one, `pcp_fn`), with the flag set
replaces that property with one returning `FunctionalAscendPCPManager`: at once when the runner's
module is loaded, else right after it is (an import hook: the plugin runs in every vLLM process,
before vllm-ascend's platform has loaded, and must not import NPU modules early). The runner's
`isinstance(pcp_manager, AscendPCPManager)` assertions hold: the drop-in subclasses vllm-ascend's
class. The class is built (and the installed vllm-ascend checked, `detect_ascend`) when the runner
first asks for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from .contract import ALLOW_UNKNOWN_ENV, SUPPORTED_RELEASES, ascend_version

ENV_FLAG = "PCP_FN_PCP_MANAGER"
"""The switch (the vLLM plugin's too)."""

RUNNER_MODULE = "vllm_ascend.worker.v2.model_runner"
"""The module of vllm-ascend's model runner V2 (`NPUModelRunner`)."""


def _manager_cls(self: object) -> type:  # self: vllm-ascend's NPUModelRunner, not read
    from .installed import FunctionalAscendPCPManager

    return FunctionalAscendPCPManager


PCP_MANAGER_CLS = property(
    _manager_cls, doc="pcp_fn's FunctionalAscendPCPManager (pcp_fn.adapters.vllm_ascend)"
)


def _patch_runner(module: types.ModuleType) -> None:
    runner = getattr(module, "NPUModelRunner", None)
    if runner is None:
        raise RuntimeError(f"PCP_FN_PCP_MANAGER=1: {RUNNER_MODULE} has no NPUModelRunner to switch")
    if runner.__dict__.get("pcp_manager_cls") is not PCP_MANAGER_CLS:
        runner.pcp_manager_cls = PCP_MANAGER_CLS


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then a function of the loaded module."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[types.ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the module's own
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once module `name` has loaded (and removes itself)."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.name, self.then = name, then
        self._finding = threading.local()

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or getattr(self._finding, "on", False):
            return None
        self._finding.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.on = False
        if spec is None or spec.loader is None:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


def is_registered() -> bool:
    """Whether `NPUModelRunner.pcp_manager_cls` is the drop-in's, or will be once it loads."""
    module = sys.modules.get(RUNNER_MODULE)
    if module is not None:
        runner = getattr(module, "NPUModelRunner", None)
        return runner is not None and runner.__dict__.get("pcp_manager_cls") is PCP_MANAGER_CLS
    return any(isinstance(f, _AfterImport) and f.name == RUNNER_MODULE for f in sys.meta_path)


def register() -> None:
    """With `PCP_FN_PCP_MANAGER=1`, switch vllm-ascend's `NPUModelRunner` to
    `FunctionalAscendPCPManager` (idempotent; nothing without the flag or without vllm-ascend).

    Raises:
        RuntimeError: the installed vllm-ascend is not a supported release (and
            `PCP_FN_ALLOW_UNKNOWN_VLLM_ASCEND` is not `1`).
    """
    if os.environ.get(ENV_FLAG, "0") != "1" or importlib.util.find_spec("vllm_ascend") is None:
        return
    version = ascend_version()
    if version not in SUPPORTED_RELEASES and os.environ.get(ALLOW_UNKNOWN_ENV) != "1":
        raise RuntimeError(
            f"PCP_FN_PCP_MANAGER=1: pcp_fn's FunctionalAscendPCPManager supports vllm-ascend "
            f"{', '.join(SUPPORTED_RELEASES)}; the installed vllm-ascend is {version} (unset "
            f"PCP_FN_PCP_MANAGER for vllm-ascend's own manager, or {ALLOW_UNKNOWN_ENV}=1 to serve it "
            "unchecked)"
        )
    module = sys.modules.get(RUNNER_MODULE)
    if module is not None:
        _patch_runner(module)
    elif not is_registered():
        sys.meta_path.insert(0, _AfterImport(RUNNER_MODULE, _patch_runner))
