"""Where the reference implementations are: the one way tools and benchmarks find them.

The references are the vLLM / vllm-ascend sources pcp_fn is checked against
(development only; nothing in ``pcp_fn`` or ``tests`` reads them):

    name                      file                         environment override
    vllm_ascend_pcp_utils     shared/seeds/000_*.txt       PCP_FN_REF_VLLM_ASCEND_PCP_UTILS
    vllm_pcp_manager          shared/seeds/001_*.txt       PCP_FN_REF_VLLM_PCP_MANAGER
    vllm_ascend_model_runner  shared/seeds/002_*.txt       PCP_FN_REF_VLLM_ASCEND_MODEL_RUNNER
    vllm_ascend_v2_pcp_manager  (none: env var only)     PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER

Each file's first line is the path of the source inside its repository; the
rest is the source. Without an override, ``shared/seeds`` is looked for in the
nearest parent of this file that has it (a checkout beside ``shared/``, or a
git worktree further down), or in ``$PCP_FN_REFERENCE_DIR``.

``vllm_ascend_v2_pcp_manager`` (vllm-ascend main's
``vllm_ascend/worker/v2/pcp_manager.py``, the model runner V2
``AscendPCPManager``) is not one of ``shared/seeds``: it lives outside the
repository and must be supplied with ``PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER``
(a file in the same format); without it the reference is unreachable.
"""

from __future__ import annotations

import glob
import os

FILES: dict[str, str | None] = {
    "vllm_ascend_pcp_utils": "000",
    "vllm_pcp_manager": "001",
    "vllm_ascend_model_runner": "002",
    "vllm_ascend_v2_pcp_manager": None,  # outside shared/seeds: the environment override only
}


def _search_dirs() -> list[str]:
    dirs = []
    if os.environ.get("PCP_FN_REFERENCE_DIR"):
        dirs.append(os.environ["PCP_FN_REFERENCE_DIR"])
    here = os.path.dirname(os.path.abspath(__file__))
    while True:
        dirs.append(os.path.join(here, "shared", "seeds"))
        if os.path.dirname(here) == here:
            return dirs
        here = os.path.dirname(here)


def reference_path(name: str) -> str | None:
    """Path of reference ``name`` (a key of ``FILES``), or ``None`` when it is not reachable."""
    if name not in FILES:
        raise KeyError(f"unknown reference {name!r}; known: {sorted(FILES)}")
    env = os.environ.get(f"PCP_FN_REF_{name.upper()}")
    if env:
        return env if os.path.exists(env) else None
    prefix = FILES[name]
    if prefix is None:
        return None
    for d in _search_dirs():
        hits = sorted(glob.glob(os.path.join(d, f"{prefix}_*.txt")))
        if hits:
            return hits[0]
    return None


def reference_source(name: str) -> tuple[str, str]:
    """``(path, source)`` of reference ``name`` (the header line dropped); raises if unreachable."""
    path = reference_path(name)
    if path is None:
        raise FileNotFoundError(
            f"reference {name} not found: set PCP_FN_REF_{name.upper()}"
            + ("" if FILES[name] is None else " or PCP_FN_REFERENCE_DIR")
        )
    with open(path) as f:
        return path, f.read().split("\n", 1)[1]
