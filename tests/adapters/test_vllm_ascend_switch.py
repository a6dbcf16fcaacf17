"""`PCP_FN_PCP_MANAGER=1` under vllm-ascend's own model runner V2 (`NPUModelRunner`).

Needs vllm-ascend 0.30.0rc2 (`tools/make_vllm_ascend_venv.sh VENV 0.30.0rc2 python3.11`); on a machine
without an NPU its runner imports after its tests' `torch_npu` stand-ins
([`pcp_fn.adapters.vllm_ascend.v2.reference`][]). The switch is process-wide (a class attribute, an
import hook), so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm_ascend") is None,
        reason="needs vllm-ascend (tools/make_vllm_ascend_venv.sh VENV 0.30.0rc2 python3.11)",
    ),
]


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(autouse=True)
def _release() -> None:
    if importlib.metadata.version("vllm_ascend") != "0.30.0rc2":
        pytest.skip("the switch is checked on vllm-ascend 0.30.0rc2")


def test_the_plugin_switches_the_npu_runner_before_and_after_it_loads() -> None:
    """The entry point registered before vllm-ascend's runner is imported (as vLLM loads its general
    plugins) or after it: either way the runner builds the drop-in, an `AscendPCPManager`."""
    for register_first in (True, False):
        proc = _python(
            f"""
            import sys
            from pcp_fn.adapters.vllm_ascend.v2 import switch as plugin
            from pcp_fn.adapters.vllm_ascend.v2 import switch
            from pcp_fn.adapters.vllm_ascend.v2.reference import install_cpu_standins, load_reference

            install_cpu_standins()  # (vLLM's import loads vllm-ascend's platform, which needs torch_npu)
            if {register_first}:
                plugin.register()
                assert switch.is_registered() and switch.RUNNER_MODULE not in sys.modules
            ascend = load_reference()
            from vllm_ascend.worker.v2.model_runner import NPUModelRunner
            if not {register_first}:
                assert not switch.is_registered()
                plugin.register()
            assert switch.is_registered()
            runner = NPUModelRunner.__new__(NPUModelRunner)  # the property reads nothing of the runner
            cls = runner.pcp_manager_cls
            assert cls.__name__ == "FunctionalAscendPCPManager", cls
            assert issubclass(cls, ascend.AscendPCPManager), cls.__mro__
            import pcp_fn.adapters.vllm_ascend as adapters
            assert cls is adapters.FunctionalAscendPCPManager
            plugin.register()  # idempotent
            assert NPUModelRunner.__dict__["pcp_manager_cls"] is switch.PCP_MANAGER_CLS
            print("ok")
            """,
            PCP_FN_PCP_MANAGER="1",
        )
        assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_without_the_flag_the_runner_keeps_vllm_ascends_class() -> None:
    proc = _python(
        """
        from pcp_fn.adapters.vllm_ascend.v2 import switch as plugin
        from pcp_fn.adapters.vllm_ascend.v2.reference import install_cpu_standins, load_reference

        install_cpu_standins()
        plugin.register()
        ascend = load_reference()
        from vllm_ascend.worker.v2.model_runner import NPUModelRunner
        assert NPUModelRunner.__new__(NPUModelRunner).pcp_manager_cls is ascend.AscendPCPManager
        print("ok")
        """,
        PCP_FN_PCP_MANAGER="0",
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_the_entry_point_is_the_switch() -> None:
    """vLLM loads every `vllm.general_plugins` entry point: pcp_fn's are the vLLM runner's switch and
    this one."""
    from pcp_fn.adapters.vllm_ascend.v2 import switch

    points = {e.name: e for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert points["pcp_fn_ascend"].load() is switch.register


def test_an_unknown_vllm_ascend_is_refused_at_plugin_load() -> None:
    proc = _python(
        """
        from pcp_fn.adapters.vllm_ascend.v2 import switch
        from pcp_fn.adapters.vllm_ascend.v2 import contract

        switch.ascend_version = lambda: "0.31.0"
        try:
            switch.register()
        except RuntimeError as e:
            assert "0.31.0" in str(e) and "PCP_FN_ALLOW_UNKNOWN_VLLM_ASCEND" in str(e), e
            assert not switch.is_registered()
            print("ok")
        """,
        PCP_FN_PCP_MANAGER="1",
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
