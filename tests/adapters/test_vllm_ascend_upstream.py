"""The installed vllm-ascend's own unit tests of its PCP manager, run unchanged against pcp_fn's drop-in.

Each release of :data:`RELEASES` names its test files (from the source distribution of the
installed vllm-ascend's release, ``vllm_ascend-0.23.0.post1.tar.gz`` for 0.23.0.post1, fetched at
test time and cached, never copied into this repository: from ``$PCP_FN_VLLM_ASCEND_SDIST`` (a
local sdist), else the cache (``$PCP_FN_VLLM_SDIST_CACHE``, default ``~/.cache/pcp_fn``), else the
package index pip is configured with (``tools/vllm_sdist.py --project vllm-ascend``; the sha256
is checked)), the manager they test (a target of ``vllm_ascend_upstream_plugin.TARGETS``) and
the tests expected to fail with the drop-in.

The files, with the sdist's ``tests/ut/conftest.py`` (on a machine without an NPU it puts
``torch_npu`` / ``torch.npu`` stand-ins in place before vllm_ascend is imported) and the package
files around them, are extracted into ``vllm_ascend-{VERSION}-tests`` of the cache, the sdist's
layout, and run twice in a pytest subprocess from that root (its own ``pyproject.toml`` as the
configuration) with ``-p vllm_ascend_upstream_plugin``: with vllm-ascend's class, and with the
drop-in in its place. Every test that passes with vllm-ascend's class passes with the drop-in,
except the release's ``expected_failures`` (test id -> why), which must fail with the drop-in and
pass with vllm-ascend's class. Skipped without vllm_ascend, for a release not in
:data:`RELEASES`, or without the sdist (the skip says why). ``tools/make_vllm_ascend_venv.sh``
makes the environment.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm_ascend") is None,
    reason="needs vllm-ascend (tools/make_vllm_ascend_venv.sh VENV 0.23.0.post1)",
)


@dataclasses.dataclass(frozen=True)
class Release:
    """One vllm-ascend release's own tests of a PCP manager.

    Attributes:
        target: the manager the files test (``vllm_ascend_upstream_plugin.TARGETS``: ``v1``, the
            0.23 DualChunkSwap ``PCPManager``; ``v2``, the model runner V2 ``AscendPCPManager``).
        test_files: the sdist's test files (relative to its root).
        support_files: what else of the sdist they need: the conftest, the packages' ``__init__``
            files and the helpers the test files import (a missing one is left out).
        expected_failures: test id -> why it fails with the drop-in (and passes with vllm-ascend's).
        min_passed: tests that must pass with vllm-ascend's class (the files ran, not just collected).
    """

    target: str
    test_files: tuple[str, ...]
    support_files: tuple[str, ...] = (
        "pyproject.toml",
        "tests/__init__.py",
        "tests/ut/__init__.py",
        "tests/ut/conftest.py",
        "tests/ut/worker/__init__.py",
    )
    expected_failures: dict[str, str] = dataclasses.field(default_factory=dict)
    min_passed: int = 1


_V2 = "tests/ut/worker/test_pcp_manager_v2.py::"
_PATCHES_PARTITION = (
    "patches vLLM's PCPManager.partition_batch to return a prepared local batch and asserts it was "
    "called; the drop-in computes the partition itself and never calls vLLM's"
)
#: vllm-ascend 0.30.0rc2's tests that fail with the drop-in, each for a reason no correct drop-in
#: could avoid: they replace or read what only vllm-ascend's class has (the docs' test table)
V2_030_EXPECTED_FAILURES = {
    _V2 + "test_partition_batch_pads_decode_requests_when_tokens_are_already_padded": _PATCHES_PARTITION,
    _V2 + "test_partition_batch_keeps_piecewise_request_extent": _PATCHES_PARTITION
    + " (its manager has _input_buffers set to None by hand)",
    _V2 + "test_partition_batch_clears_padded_dcp_local_seq_lens": _PATCHES_PARTITION
    + " (its global batch is a SimpleNamespace of six fields)",
    _V2 + "test_prepare_slot_mappings_pads_each_pcp_rank_for_full_decode_graph": (
        "patches vLLM's PCPManager.prepare_slot_mappings to return prepared slots and sets the private "
        "_gathered_kv_slot_mappings; the drop-in computes the slots from the block tables it was built "
        "with (none here)"
    ),
    _V2 + "test_pcp_manager_restores_model_owned_hidden_buffer": (
        "builds the manager with __new__ (no constructor ran), sets private index buffers and patches "
        "vLLM's PCPManager.restore_hidden_states as the parent; the drop-in restores with its own "
        "bookkeeper, which __new__ never made"
    ),
    **{
        _V2 + f"test_pcp_slot_buffers_match_block_tables[slot_dtype{i}]": (
            "replaces PCPManager.__init__ with a function that sets vllm-ascend's private buffers and "
            "passes block_tables=SimpleNamespace(slot_mappings=...) (no input_block_tables), which the "
            "drop-in's block-table check refuses"
        )
        for i in (0, 1)
    },
}


RELEASES = {
    "0.23.0.post1": Release(
        target="v1",
        test_files=("tests/ut/worker/test_pcp_manager.py",),
        # none: every test passes with FunctionalDCSManager (a MagicMock config's placeholders are
        # read as vllm-ascend reads them; a _dummy_run's index lists are vllm-ascend's over its counts)
        expected_failures={},
        min_passed=32,
    ),
    "0.30.0rc2": Release(
        target="v2",
        test_files=(
            "tests/ut/worker/test_pcp_manager_v2.py",
            "tests/ut/worker/test_mtp_pcp_speculator_v2.py",
            "tests/ut/attention/test_mla_pcp_dcp.py",
        ),
        support_files=(
            "pyproject.toml",
            "tests/__init__.py",
            "tests/ut/__init__.py",
            "tests/ut/conftest.py",
            "tests/ut/base.py",
            "tests/ut/helpers/__init__.py",
            "tests/ut/helpers/golden_copy_and_expand.py",  # the conftest imports its stub
            "tests/ut/worker/__init__.py",
            "tests/ut/worker/conftest.py",
            "tests/ut/attention/__init__.py",
            "tests/ut/attention/utils.py",
        ),
        expected_failures=V2_030_EXPECTED_FAILURES,
        min_passed=190,
    ),
}


def _installed_release() -> str | None:
    for dist in ("vllm_ascend", "vllm-ascend"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


VERSION = _installed_release()
TESTS_DIR = Path(__file__).resolve().parents[1]
REPO = TESTS_DIR.parent


def _release() -> Release:
    if VERSION not in RELEASES:
        pytest.skip(f"vllm-ascend {VERSION}: no entry in RELEASES (known: {sorted(RELEASES)})")
    return RELEASES[VERSION]


def _sdist_tool():
    """``tools/vllm_sdist.py`` (fetches the sdist through the index pip is configured with)."""
    spec = importlib.util.spec_from_file_location("vllm_sdist", REPO / "tools" / "vllm_sdist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def upstream_root() -> Path:
    """A directory holding the release's test files in the sdist's layout (extracted once, cached)."""
    release = _release()
    tool = _sdist_tool()
    cache = tool.cache_dir()
    name = tool.sdist_name(VERSION, "vllm-ascend")
    root = cache / f"vllm_ascend-{VERSION}-tests"
    done = root / ".extracted"  # written last: a complete extraction of these files
    listing = "\n".join([name, *release.support_files, *release.test_files])
    if done.is_file() and done.read_text() == listing:
        return root
    sdist = Path(os.environ.get("PCP_FN_VLLM_ASCEND_SDIST") or cache / name)
    try:
        if not sdist.is_file():
            sdist = tool.fetch(VERSION, cache, "vllm-ascend")
        with tarfile.open(sdist) as tar:
            prefix = tar.getnames()[0].split("/")[0]  # vllm_ascend-{VERSION}
            names = set(tar.getnames())
            for f in release.test_files + release.support_files:
                member = f"{prefix}/{f}"
                if member not in names:
                    if f in release.test_files:
                        raise FileNotFoundError(f"{member} is not in {sdist.name}")
                    continue
                target = root / f
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                target.write_bytes(source.read())
        done.write_text(listing)
    except Exception as e:  # no network, no index, a corrupt file: say which
        pytest.skip(
            f"vllm-ascend {VERSION}'s sdist is not available ({type(e).__name__}: {e}); "
            "set PCP_FN_VLLM_ASCEND_SDIST"
        )
    return root


def _run(root: Path, release: Release, manager: str) -> dict[str, str]:
    """Outcome (passed / failed / skipped) of every test of the release's files, by test id."""
    report = root / f"report-{manager}-{os.getpid()}.xml"
    env = dict(os.environ, PCP_FN_UPSTREAM_MANAGER=manager, PCP_FN_UPSTREAM_ASCEND_TARGET=release.target)
    # the plugin from tests/; pcp_fn importable from a checkout (the sdist's root comes first on
    # sys.path: its `tests` package is the one imported)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), str(REPO), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "vllm_ascend_upstream_plugin",
    ]
    cmd += (
        ["-c", str(root / "pyproject.toml"), "--rootdir", str(root)]
        if (root / "pyproject.toml").is_file()
        else []
    )
    cmd += [f"--junitxml={report}", "-o", "junit_family=xunit1", *release.test_files]
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
    header = [line for line in proc.stdout.splitlines() if "under test:" in line]
    want = "vllm_ascend." if manager == "vllm-ascend" else "pcp_fn.adapters."
    assert header and want in header[0], f"the plugin did not report the class it tested: {header}"
    return outcomes


@pytest.fixture(scope="module")
def outcomes(upstream_root: Path) -> dict[str, dict[str, str]]:
    release = _release()
    return {m: _run(upstream_root, release, m) for m in ("vllm-ascend", "functional")}


def _counts(results: dict[str, str]) -> str:
    kinds = ("passed", "failed", "skipped")
    return ", ".join(f"{sum(v == k for v in results.values())} {k}" for k in kinds)


def test_upstream_tests_pass_with_vllm_ascends_class(outcomes):
    release = _release()
    theirs = outcomes["vllm-ascend"]
    print(f"\nvllm-ascend {VERSION}'s tests with its own manager: {_counts(theirs)}")
    failed = [t for t, o in theirs.items() if o == "failed"]
    assert not failed, failed
    assert sum(o == "passed" for o in theirs.values()) >= release.min_passed


def test_upstream_tests_pass_with_the_drop_in(outcomes):
    """The same tests with pcp_fn's drop-in in the class's place: every test that passes with
    vllm-ascend's class passes, except the release's expected failures, which must fail (so the
    list cannot rot)."""
    release = _release()
    theirs, ours = outcomes["vllm-ascend"], outcomes["functional"]
    print(f"\nvllm-ascend {VERSION}'s tests with pcp_fn's drop-in: {_counts(ours)}")
    assert set(ours) == set(theirs)
    for test_id, why in release.expected_failures.items():
        assert theirs.get(test_id) == "passed", f"{test_id} must pass with vllm-ascend's class"
        assert ours.get(test_id) == "failed", (
            f"{test_id} no longer fails with the drop-in ({why}): update the list"
        )
    regressions = [
        t
        for t, o in theirs.items()
        if o == "passed" and ours[t] != "passed" and t not in release.expected_failures
    ]
    assert not regressions, regressions
    assert {t for t, o in ours.items() if o == "skipped"} == {t for t, o in theirs.items() if o == "skipped"}
