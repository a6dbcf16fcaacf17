"""The documentation runs: every ```python block of README.md and docs/**/*.md, and the site builds.

Each block runs as written, alone, in a fresh interpreter (``python BLOCK.py`` with the
repository root as the working directory and the interpreter's own ``bin`` first on
``PATH``, where ``pip install`` puts ``pcp-fn``). A block that needs more than this
suite has says so on the line before it::

    <!-- requires: vllm -->      vLLM importable; the test carries the `vllm` marker
                                 (CI's real-vLLM stage, `pytest -m vllm`, runs it)
    <!-- requires: cuda -->      a CUDA device
    <!-- requires: vllm_ascend --> vllm-ascend importable (anything else: a module name)

and is skipped where that is missing. ``mkdocs build --strict`` fails on a broken link, a
page missing from the nav, or an API reference that does not resolve.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"^(?:<!--\s*requires:\s*(?P<needs>[\w, -]+?)\s*-->\n)?```python\n(?P<code>.*?)^```$", re.M | re.S
)
BLOCK_TIMEOUT_S = {"vllm": 600}  # a real engine starts in ~20 s and generates in a few; 60 s otherwise


def _blocks():
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start("code")) + 1
            needs = tuple(n.strip() for n in (m.group("needs") or "").split(",") if n.strip())
            marks = [pytest.mark.vllm] if "vllm" in needs else []
            rel = page.relative_to(ROOT).as_posix()
            out.append(pytest.param(m.group("code"), needs, id=f"{rel}:{line}", marks=marks))
    return out


def _missing(needs: tuple[str, ...]) -> str | None:
    for need in needs:
        if need == "cuda":
            import torch

            if not torch.cuda.is_available():
                return "needs a CUDA device"
        elif importlib.util.find_spec(need) is None:
            return f"needs {need} importable"
    return None


def test_every_page_has_its_blocks_found():
    # a block written ```py, or with a typo in its marker, would silently never run
    for page in PAGES:
        text = page.read_text()
        fences = re.findall(r"^```(\w*)", text, re.M)
        opening = fences[0::2]
        assert all(f in ("python", "bash", "text", "") for f in opening), (page.name, opening)
        assert "" not in opening, f"{page.name}: a code block without a language (python, bash, text)"
        assert text.count("```python") == len(BLOCK.findall(text)), page.name
        markers = re.findall(r"^<!--\s*requires:", text, re.M)  # each on the line before its block
        assert len(markers) == sum(1 for m in BLOCK.finditer(text) if m.group("needs")), page.name


@pytest.mark.parametrize(("code", "needs"), _blocks())
def test_python_block_runs(code: str, needs: tuple[str, ...], tmp_path: pathlib.Path):
    reason = _missing(needs)
    if reason:
        pytest.skip(reason)
    script = tmp_path / "block.py"
    script.write_text(code)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PCP_FN_PCP_MANAGER", None)
    timeout = max([60, *(BLOCK_TIMEOUT_S.get(n, 60) for n in needs)])
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    output = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"the block failed:\n{code}\n--- output:\n{output}"


def test_readme_links_into_the_docs_name_pages_that_exist():
    site = "https://pcp-fn.github.io/pcp_fn/"
    links = re.findall(re.escape(site) + r"([\w/.-]*)", (ROOT / "README.md").read_text())
    assert links, "the README links into the documentation"
    for path in links:
        page = path.strip("/") or "index"
        assert (ROOT / "docs" / f"{page}.md").exists() or (ROOT / "docs" / page / "index.md").exists(), path


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason="needs mkdocs (pip install -e '.[docs]')"
)
@pytest.mark.timeout(300)
def test_mkdocs_build_strict(tmp_path: pathlib.Path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert (tmp_path / "site" / "api" / "pcp_fn" / "index.html").exists()
