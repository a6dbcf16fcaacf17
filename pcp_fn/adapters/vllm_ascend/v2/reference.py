"""vllm-ascend's own `AscendPCPManager`, importable on a machine without an NPU.

`pcp-fn replay --against vllm-ascend`, the lockstep tests and `benchmarks/bench_ascend_v2.py` run the
installed vllm-ascend's manager beside the drop-in. On an NPU that is a plain import. Without one
(`torch_npu` not importable) vllm-ascend's modules cannot load; its own unit tests meet that with the
stand-ins of its `tests/ut/conftest.py` (a `torch_npu` module of `MagicMock`s, `torch.npu`, Triton's
runtime), installed at import before `vllm_ascend` is imported. [`load_reference`][
pcp_fn.adapters.vllm_ascend.v2.reference.load_reference] does the same: it imports that conftest from the
release's source tree, then `vllm_ascend.worker.v2.pcp_manager`.

The source tree is `$PCP_FN_VLLM_ASCEND_TESTS` (a directory holding `tests/ut/conftest.py`: an
extracted sdist of the installed release), else the tree of an editable install (`pip install -e`
of the extracted sdist, as `tools/make_vllm_ascend_venv.sh` makes it). The conftest imports `pytest`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

TESTS_ENV = "PCP_FN_VLLM_ASCEND_TESTS"
"""A vllm-ascend source tree (its extracted sdist) whose `tests/ut/conftest.py` supplies the CPU
stand-ins for `torch_npu`."""

_CONFTEST = Path("tests") / "ut" / "conftest.py"
_MODULE = "vllm_ascend.worker.v2.pcp_manager"


def has_torch_npu() -> bool:
    return "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None


def _source_tree() -> Path:
    """The directory holding vllm-ascend's `tests/ut/conftest.py`."""
    env = os.environ.get(TESTS_ENV)
    if env:
        root = Path(env)
        if not (root / _CONFTEST).is_file():
            raise ImportError(f"{TESTS_ENV}={env}: no {_CONFTEST} there")
        return root
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or spec.origin is None:
        raise ImportError("vllm_ascend is not installed")
    root = Path(spec.origin).resolve().parents[1]  # <tree>/vllm_ascend/__init__.py
    if not (root / _CONFTEST).is_file():
        raise ImportError(
            f"without torch_npu, vllm-ascend's manager imports only after its tests' CPU stand-ins; "
            f"{root / _CONFTEST} does not exist (a wheel install): set {TESTS_ENV} to an extracted "
            "sdist of the installed release"
        )
    return root


def install_cpu_standins() -> Path | None:
    """Import vllm-ascend's `tests/ut/conftest.py` (its `torch_npu` stand-ins) once, when `torch_npu`
    is not importable. Returns the source tree used (`None`: `torch_npu` is there, nothing done).

    Raises:
        ImportError: no source tree holding the conftest, or another `tests` package already
            imported (the conftest imports `tests.ut.helpers`).
    """
    loaded = sys.modules.get("tests.ut.conftest")
    if loaded is not None:
        return Path(loaded.__file__).resolve().parents[2]
    if has_torch_npu():
        return None
    root = _source_tree()
    other = sys.modules.get("tests")
    if other is not None and Path(getattr(other, "__file__", "") or "").resolve().parent != root / "tests":
        raise ImportError(
            f"another 'tests' package is imported ({other!r}); vllm-ascend's conftest needs its own"
        )
    sys.path.insert(0, str(root))
    try:
        importlib.import_module("tests.ut.conftest")
    finally:
        sys.path.remove(str(root))
    return root


def load_reference() -> types.ModuleType:
    """vllm-ascend's `vllm_ascend.worker.v2.pcp_manager` module (its `AscendPCPManager`), after the
    CPU stand-ins where there is no NPU ([`install_cpu_standins`][
    pcp_fn.adapters.vllm_ascend.v2.reference.install_cpu_standins])."""
    install_cpu_standins()
    return importlib.import_module(_MODULE)
