"""The repository's promises: README's commands, CI running the same, tests standing alone."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUTSIDE = "/".join(["..", "sha" + "red"])  # the folder beside a checkout that a fresh clone lacks


def _readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_starts_with_two_commands_and_ci_runs_the_second():
    commands = _readme_commands()
    assert len(commands) >= 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci
    assert "pytest" in commands[1]


def test_tests_do_not_read_outside_the_repository():
    for path in (ROOT / "tests").rglob("*.py"):
        assert OUTSIDE not in path.read_text(), path.name
        assert "tools" not in re.findall(r"^(?:from|import) (\w+)", path.read_text(), re.M), path.name


# the test layers: the primitives, the layouts and their ops, the engine adapters, whole runs;
# beside them, the repository's own promises (this file, the docs, the benchmarks' output)
TEST_GROUPS = ("core", "layouts", "adapters", "e2e")
REPOSITORY_TESTS = {"test_repo.py", "test_docs.py", "test_benchmark_markdown.py"}


def test_tests_are_grouped_by_layer():
    tests = (ROOT / "tests").rglob("test_*.py")
    stray = [
        p.relative_to(ROOT)
        for p in tests
        if p.parent.name not in TEST_GROUPS and p.name not in REPOSITORY_TESTS
    ]
    assert not stray, f"put these in tests/{{{','.join(TEST_GROUPS)}}}/: {stray}"
    # the oracles and stand-ins they share stay at tests/ (conftest.py puts it on sys.path)
    assert not [
        p for g in TEST_GROUPS for p in (ROOT / "tests" / g).glob("*.py") if not p.name.startswith("test_")
    ]


# ---------------------------------------------------------------- the package's shape
PKG = ROOT / "pcp_fn"
# lower layers never import higher ones; peers (same layer) only without a loop
LAYERS = {
    "core": 0,
    "graph": 1,
    "protocol": 2,
    "multimodal": 2,
    "dcs": 3,
    "mrv2": 3,
    "hybrid": 4,
    "update_tokens": 5,
    "logits": 5,
    "slots": 5,
    "restore": 5,
    "attention_runs": 5,
    "step": 5,
    "spec": 6,
    "distributed": 6,
    "__init__": 7,
    "sim": 8,
    "testing": 8,
    "adapters": 8,
}
# imported lazily on purpose: optional extras and heavy or process-wide machinery
# fcntl: POSIX only, imported where a package cache is locked
LAZY_OK = {
    "torch_npu",
    "vllm",
    "vllm_ascend",
    "tqdm",
    "matplotlib",  # the plot extra: only `pcp-fn compare --plot` imports it
    "torch.distributed",
    "torch._dynamo",
    "fcntl",
}
# pcp_fn modules that import an engine at module level (the drop-in over the installed vLLM):
# the adapter packages import them lazily, so importing an adapter package imports no engine
ENGINE_MODULES = {"pcp_fn.adapters.vllm.installed", "pcp_fn.adapters.vllm_ascend.v2.installed"}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: pathlib.Path):
    """``(target module, imported names, at module level?)`` of every import in ``path``, the
    ``if TYPE_CHECKING:`` ones included: a type-only import is an arrow between modules too."""
    import ast

    tree = ast.parse(path.read_text())
    this = _module_name(path).split(".")
    package = this if path.name == "__init__.py" else this[:-1]
    in_functions = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_functions.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        top = id(node) not in in_functions
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            out.append((target, names, top))
        elif isinstance(node, ast.Import):
            out.extend((a.name, [], top) for a in node.names)
    return out


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else "__init__"]


def test_imports_go_downwards_and_never_loop():
    graph = {}
    for path in PKG.rglob("*.py"):
        mod = _module_name(path)
        for target, names, _ in _imports(path):
            if not target.startswith("pcp_fn"):
                continue
            # `from . import x` / `from .. import x` name submodules
            targets = [
                f"{target}.{n}"
                for n in names
                if (PKG.parent / f"{target}.{n}".replace(".", "/")).exists()
                or (PKG.parent / (f"{target}.{n}".replace(".", "/") + ".py")).exists()
            ]
            for t in targets or [target]:
                if t == "pcp_fn" and mod.startswith("pcp_fn.sim"):
                    t = "pcp_fn.__init__"
                assert _layer(t if t != "pcp_fn" else "pcp_fn") <= _layer(mod), (
                    f"{mod} imports the higher {t}"
                )
                graph.setdefault(mod, set()).add(t)
    # no loop among pcp_fn modules
    state = {}

    def visit(m, stack):
        state[m] = 1
        for t in graph.get(m, ()):
            assert state.get(t) != 1, "import loop: " + " -> ".join([*stack, m, t])
            if t not in state:
                visit(t, [*stack, m])
        state[m] = 2

    for m in list(graph):
        if m not in state:
            visit(m, [])


def test_no_private_name_crosses_a_package_and_no_hidden_import():
    for path in PKG.rglob("*.py"):
        mod = _module_name(path)
        own_package = mod.split(".")[:2]
        for target, names, top in _imports(path):
            if target.startswith("pcp_fn") and target.split(".")[:2] != own_package:
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                assert not private, f"{mod} imports private {private} from {target}"
            if not top and target.startswith("pcp_fn") and target not in ENGINE_MODULES:
                raise AssertionError(f"{mod} imports {target} inside a function")
            if not top and not target.startswith("pcp_fn"):
                assert any(target == x or target.startswith(x + ".") for x in LAZY_OK), (mod, target)


# the adapters, one package per engine line, over the modules every adapter shares
ADAPTERS = ("pcp_fn.adapters.vllm", "pcp_fn.adapters.vllm_ascend.v1", "pcp_fn.adapters.vllm_ascend.v2")
ADAPTERS_SHARED = (
    "pcp_fn.adapters.runtime",
    "pcp_fn.adapters.backend",
    "pcp_fn.adapters.schedule_cache",
    "pcp_fn.adapters.recording",
    "pcp_fn.adapters.trace_writer",
)


def _adapter_of(module: str) -> str | None:
    return next((a for a in ADAPTERS if module == a or module.startswith(a + ".")), None)


def test_adapters_are_one_package_per_engine_line_and_share_only_public_names():
    """Each adapter module is in its engine line's package or is one of the shared modules; an
    adapter imports another adapter's public names only (no private name, no private module)."""
    for path in (PKG / "adapters").rglob("*.py"):
        mod = _module_name(path)
        if mod in ("pcp_fn.adapters", "pcp_fn.adapters.vllm_ascend"):
            continue  # the packages' own front doors
        own = _adapter_of(mod)
        assert own or mod in ADAPTERS_SHARED, f"{mod} belongs to no adapter package"
        for target, names, _ in _imports(path):
            other = _adapter_of(target)
            if other is None or other == own:
                continue
            private = [n for n in names if n.startswith("_")]
            hidden = [p for p in target.split(".") if p.startswith("_")]
            assert not private and not hidden, f"{mod} imports private {private or hidden} of {other}"


def test_no_library_function_is_longer_than_80_lines():
    import ast

    long = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_two_classes_share_a_name():
    import ast
    import collections

    where = collections.defaultdict(list)
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not {name: at for name, at in where.items() if len(at) > 1}


def test_the_protocol_package_knows_no_layout_and_finds_the_builtins_by_name():
    """A layout author reads pcp_fn.protocol alone: it imports no layout package; the registry
    finds each built-in at the module attribute it names, and checks a layout by the members of
    the Layout protocol."""
    import importlib

    import pcp_fn.protocol as protocol
    from pcp_fn.protocol import registry

    for path in (PKG / "protocol").rglob("*.py"):
        for target, _, _ in _imports(path):
            assert target.split(".")[:2] in (
                ["pcp_fn", "core"],
                ["pcp_fn", "protocol"],
            ) or not target.startswith("pcp_fn"), f"{path.name} imports {target}"
    for name, (module, attribute) in registry.BUILTIN_LAYOUTS.items():
        assert getattr(importlib.import_module(module), attribute).name == name
    declared = {m for m in vars(protocol.Layout) if not m.startswith("_")} | {"name"}
    assert declared == set(registry.PROTOCOL_MEMBERS)


def test_no_module_registers_a_layout_as_an_import_side_effect():
    """The built-ins are found by name (pcp_fn.protocol.registry.BUILTIN_LAYOUTS), not registered
    by whoever happens to be imported first."""
    import ast

    for path in PKG.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, ast.Expr | ast.Assign) else None
            if isinstance(call, ast.Call):
                name = getattr(call.func, "id", getattr(call.func, "attr", ""))
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                assert name != "register_layout", f"{where} registers a layout at import"


def test_import_pcp_fn_imports_neither_the_simulator_nor_vllm():
    import subprocess
    import sys

    code = "import sys, pcp_fn; print(sorted(m for m in sys.modules if m.startswith(('pcp_fn.sim', 'vllm'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_library_text_names_vllm_not_the_word_seed():
    # the references are named by their vLLM / vllm-ascend functions; a random seed is not one of them
    random_seed = re.compile(r"--seed|seed=|\.seed\b|random seed|seed: int|_rng\(seed\)|manual_seed", re.I)
    for path in PKG.rglob("*.py"):
        hits = [
            i + 1
            for i, line in enumerate(path.read_text().splitlines())
            if re.search(r"\bseeds?\b", line, re.I) and not random_seed.search(line)
        ]
        assert not hits, f"{path.relative_to(ROOT)} lines {hits}"


def test_tools_benchmarks_and_docs_name_the_references_not_the_word_seed():
    # users know vLLM / vllm-ascend's functions and files: the reference checks, their loaders and
    # the benchmarks' flags are named after the reference; random-number seeds keep their name, and
    # shared/seeds is the folder the reference files sit in beside a checkout (tools/reference.py)
    allowed = re.compile(
        r"--seed|seed=|\.seed\b|random seed|seed: int|_rng\(seed\)|manual_seed|, seed\)"
        r"|MODEL_SEED|shared/seeds|\"shared\", \"seeds\"",
        re.I,
    )
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / ".ci" / "run", ROOT / "mkdocs.yml"]
    for folder in ("tools", "benchmarks", "docs"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".sh")]
    for path in files:
        assert "seed" not in path.name.lower(), path.relative_to(ROOT)
        hits = [
            i + 1
            for i, line in enumerate(path.read_text().splitlines())
            if re.search(r"(?<![a-z])seeds?(?![a-z])", line, re.I) and not allowed.search(line)
        ]
        assert not hits, f"{path.relative_to(ROOT)} lines {hits}"
    for path in (ROOT / "benchmarks").glob("*.py"):
        assert 'add_argument("--seed"' not in path.read_text(), f"{path.name}: use --reference"
