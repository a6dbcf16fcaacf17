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

import html
import html.parser
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
    # the README links the documentation's pages relative to the repository (docs/...md)
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", (ROOT / "README.md").read_text())
    assert links, "the README links into the documentation"
    for path in links:
        assert (ROOT / path).exists(), path


NEEDS_MKDOCS = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None, reason="needs mkdocs (pip install -e '.[docs]')"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The site, built once for this module's tests with `mkdocs build --strict`."""
    out = tmp_path_factory.mktemp("site") / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return out


@NEEDS_MKDOCS
@pytest.mark.timeout(300)
def test_mkdocs_build_strict(site: pathlib.Path):
    assert (site / "api" / "pcp_fn" / "index.html").exists()


class _Text(html.parser.HTMLParser):
    """A page's text outside code (`<pre>`, `<code>`, `<script>`, `<style>`), one string per text node."""

    SKIP = frozenset({"pre", "code", "script", "style"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.depth += tag in self.SKIP

    def handle_endtag(self, tag: str) -> None:
        self.depth -= tag in self.SKIP

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self.text.append(data)


# what a docstring written in reST shows once mkdocstrings renders it as Markdown
REST_LEFTOVERS = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj|const):|``|::")


@NEEDS_MKDOCS
@pytest.mark.timeout(300)
def test_no_rest_markup_in_the_html(site: pathlib.Path):
    """The docstrings are Markdown: no reST role (`:class:`...), no double-backtick code and no
    literal-block `::` outside code on any page of the site."""
    found = []
    for page in sorted(site.rglob("*.html")):
        parser = _Text()
        parser.feed(page.read_text())
        text = "".join(parser.text)
        for m in REST_LEFTOVERS.finditer(text):
            context = " ".join(text[max(0, m.start() - 60) : m.end() + 60].split())
            found.append(f"{page.relative_to(site)}: {m.group(0)!r} in ...{context}...")
    assert not found, "\n".join(found[:40])


def _entries(page: str):
    """`(id, kind, signature text, the entry's own HTML)` of every API entry of a page."""
    heads = list(re.finditer(r'<h(\d) id="([^"]+)" class="doc doc-heading">(.*?)</h\1>', page, re.S))
    for head, nxt in zip(heads, [*heads[1:], None]):
        body = page[head.end() : nxt.start() if nxt else len(page)]
        kind = re.search(r"doc-symbol-(?!heading)(\w+)", head.group(3))
        sig = re.match(r'\s*<div class="doc-signature highlight"><pre>(.*?)</pre>', body, re.S)
        text = html.unescape(re.sub(r"<[^>]+>", "", sig.group(1))) if sig else None
        yield head.group(2), kind.group(1) if kind else None, text, body


@pytest.fixture(scope="module")
def static_package():
    """`pcp_fn` read statically, as mkdocstrings reads it: griffe with the site's extensions
    (the managers built on first access, the constructors a static reader does not see)."""
    griffe = pytest.importorskip("griffe")
    sys.path.insert(0, str(ROOT / "docs" / "api"))
    try:
        from runtime_classes import ClassSignatures, RuntimeClasses
    finally:
        sys.path.remove(str(ROOT / "docs" / "api"))
    extensions = griffe.load_extensions(RuntimeClasses, ClassSignatures)
    return griffe.load("pcp_fn", search_paths=[str(ROOT)], extensions=extensions)


def _static_object(pkg, path: str):
    """The object an entry's id names (through aliases; `pcp_fn.step`: the function)."""
    obj = pkg if path == "pcp_fn" else pkg[path.removeprefix("pcp_fn.")]
    obj = obj.final_target if obj.is_alias else obj
    inner = obj.members.get(obj.name) if obj.is_module else None
    return inner if inner is not None and not inner.is_alias else obj


def _made_by_no_call(cls) -> bool:
    """A Protocol (never made) or an exception (made with a message): no signature of its own."""
    names = {str(base).rsplit(".", 1)[-1] for base in cls.bases}
    for base in cls.bases:
        try:
            resolved = base.resolved if hasattr(base, "resolved") else None
        except Exception:
            resolved = None
        if resolved is not None and getattr(resolved, "is_class", False) and _made_by_no_call(resolved):
            return True
    return "Protocol" in names or any(n.endswith(("Error", "Exception", "Warning")) for n in names)


@NEEDS_MKDOCS
@pytest.mark.timeout(300)
def test_every_class_and_function_has_a_signature_and_its_parameters_their_defaults(
    site: pathlib.Path, static_package
):
    """Every class (but a Protocol or an exception) and every function shows its signature; an
    entry's parameter list names one parameter per item, and an item shows the default the
    signature has (an item like `dcp_size, dcp_rank: ...` matches no parameter and reads as
    required)."""
    problems = []
    for page in sorted((site / "api").rglob("*.html")):
        for ident, kind, signature, body in _entries(page.read_text()):
            if kind in ("function", "method") and signature is None:
                problems.append(f"{ident}: no signature")
            if kind == "class" and signature is None:
                if not _made_by_no_call(_static_object(static_package, ident)):
                    problems.append(f"{ident}: no signature")
            if signature is None:
                continue
            defaults = set(re.findall(r"(\w+)(?::[^,=\n]*)?\s*=\s*[^,\n]+", signature))
            section = re.search(r"Parameters:</span></p>\s*<ul>(.*?)</ul>", body, re.S)
            for item in re.findall(r"<li[^>]*>(.*?)</li>", section.group(1), re.S) if section else ():
                name = html.unescape(re.sub(r"<[^>]+>", "", re.search(r"<b>(.*?)</b>", item, re.S).group(1)))
                if not re.fullmatch(r"\**\w+", name):
                    problems.append(f"{ident}: parameter item {name!r} is not one parameter")
                elif name in defaults and "default:" not in item:
                    problems.append(f"{ident}: parameter {name} has a default the entry does not show")
    assert not problems, "\n".join(problems)


# the public packages: every name of their __all__ has exactly one entry in the API reference
PUBLIC_PACKAGES = (
    "pcp_fn",
    "pcp_fn.protocol",
    "pcp_fn.testing",
    "pcp_fn.dcs",
    "pcp_fn.hybrid",
    "pcp_fn.mrv2",
    "pcp_fn.spec",
    "pcp_fn.graph",
    "pcp_fn.sim",
    "pcp_fn.adapters.vllm",
    "pcp_fn.adapters.vllm_ascend",
)


@NEEDS_MKDOCS
@pytest.mark.timeout(300)
def test_every_public_name_has_one_entry(site: pathlib.Path, static_package):
    """Every public name resolves to an object with exactly one top-level entry (`pcp_fn.Layout`
    once, not again as `pcp_fn.protocol.Layout`), the two managers built on first access too."""
    ids = {i for page in (site / "api").rglob("*.html") for i, *_ in _entries(page.read_text())}

    def target(path: str):
        return _static_object(static_package, path)

    # an entry of its own: not a member rendered inside its class's entry
    top = [i for i in ids if i.rsplit(".", 1)[0] not in ids or target(i.rsplit(".", 1)[0]).is_module]
    entries: dict[str, list[str]] = {}
    for ident in top:
        entries.setdefault(target(ident).path, []).append(ident)
    missing, twice = [], {p: i for p, i in entries.items() if len(i) > 1}
    for package in PUBLIC_PACKAGES:
        for name in target(package).exports or ():
            if str(name).startswith("_") or str(name) in ("VLLM_API", "VLLM_VERSION", "UNSUPPORTED"):
                continue  # *_INSTALLED's names: documented on pcp_fn.adapters.vllm.installed
            obj = target(f"{package}.{name}")
            if not obj.is_module and obj.path not in entries:
                missing.append(f"{package}.{name}")
    assert not missing, f"public names without an entry: {missing}"
    assert not twice, f"documented more than once: {twice}"
    assert "pcp_fn.adapters.vllm.FunctionalPCPManager" in ids
    assert "pcp_fn.adapters.vllm_ascend.FunctionalAscendPCPManager" in ids
