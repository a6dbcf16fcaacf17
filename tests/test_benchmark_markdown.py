"""The benchmarks' ``--markdown PATH`` fragments and the performance page built from them.

Two cheap benchmark runs (tiny iteration counts, no compiling) write their tables with
``--markdown``; the fragment's heading line must state the date, the machine and its load, the
torch version and the command (relative paths only), and every table must parse, with the
columns the benchmark prints and positive numbers in them. The page side: every ``--8<--``
include of ``docs/`` names a fragment that exists (``check_paths`` makes a missing one fail the
site build too), every fragment is included, and each fragment's own command wrote it.
"""

from __future__ import annotations

import datetime
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FIELD = re.compile(r"\*\*(?P<key>[\w ]+)\*\* (?P<value>.+)")
NUMBER = re.compile(r"^-?\d+(?:\.\d+)?")


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def heading(text: str) -> dict[str, str]:
    """The fragment's first line as ``field -> value`` (``**date** ... · **machine** ...``)."""
    first = text.splitlines()[0]
    fields = {}
    for part in first.split(" · "):
        m = FIELD.fullmatch(part)
        assert m, f"not a '**field** value' part of the heading: {part!r}"
        fields[m["key"]] = m["value"]
    return fields


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table of ``text`` as ``(columns, rows)``, checked well-formed."""
    out, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in block]
            assert re.fullmatch(r"\|(?:-+\|)+", block[1]), f"no separator under {block[0]}"
            columns, rows = cells[0], cells[2:]
            assert rows, f"a table without rows: {columns}"
            for row in rows:
                assert len(row) == len(columns), (columns, row)
            out.append((columns, rows))
            block = []
    return out


def number(cell: str) -> float:
    """The number a cell starts with (``12.5``, ``12.5 [10-14]``, ``49 / 54``, ``0.21``)."""
    m = NUMBER.match(cell)
    assert m, f"not a number: {cell!r}"
    return float(m.group())


def check_heading(text: str, command: str) -> dict[str, str]:
    fields = heading(text)
    assert {"date", "machine", "load average", "torch", "command"} <= set(fields), fields
    when = datetime.datetime.strptime(fields["date"], "%Y-%m-%d %H:%M UTC")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert abs((now - when).total_seconds()) < 3600, fields["date"]
    assert re.search(r", \d+ cores", fields["machine"]), fields["machine"]
    assert re.fullmatch(r"\d+\.\d\d at the start, \d+\.\d\d at the end", fields["load average"])
    import torch

    assert fields["torch"] == torch.__version__
    cmd = fields["command"].strip("`")
    assert re.fullmatch(r"(?:[A-Z_0-9]+=\S+ )*(?:taskset -c [\d,]+ )?" + re.escape(command), cmd), cmd
    return fields


def run(script: str, args: list[str], out: pathlib.Path) -> str:
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args, "--markdown", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    text = out.read_text()
    assert str(ROOT) not in text and str(out.parent) not in text, "an absolute path of this machine"
    return text


def by_columns(found, columns):
    hits = [rows for cols, rows in found if cols == columns]
    assert len(hits) == 1, f"no table with columns {columns}: {[c for c, _ in found]}"
    return hits[0]


@pytest.mark.timeout(120)
def test_bench_core_writes_its_tables_as_markdown(tmp_path: pathlib.Path):
    args = ["--iters", "3", "--backends", "eager", "--no-inductor-counts", "--batches", "A"]
    text = run("bench_core.py", args, tmp_path / "core.md")
    check_heading(text, "python benchmarks/bench_core.py " + " ".join(args) + " --markdown /path/to/core.md")
    found = tables(text)
    host = by_columns(found, ["batch", "boundary", "us"])
    assert [r[1] for r in host] == ["make_batch", "make_batch (numpy in)"]
    # --no-inductor-counts: the inductor column is left out, and the title says so
    ops = by_columns(found, ["batch", "op", "eager us", "dev", "cpu"])
    assert "(not measured in this run: inductor)" in text
    assert {r[1] for r in ops} >= {"update_tokens", "step", "attention_metadata", "composed step"}
    for row in ops:
        assert row[0] == "A" and all(number(c) > 0 for c in row[2:5]), row
    # the ratio column only where the vllm-ascend reference was found (tools/reference.py)
    referenced = any(cols == ["batch", "path", "us", "/ reference"] for cols, _ in found)
    paths = by_columns(found, ["batch", "path", "us"] + ["/ reference"] * referenced)
    assert referenced or "(not measured in this run: / reference)" in text
    assert {"step / eager", "step + restore / eager", "composed step / eager"} <= {r[1] for r in paths}
    assert all(number(r[2]) > 0 for r in paths)
    assert "Kernel counts the same for every batch." in text


@pytest.mark.timeout(120)
def test_bench_mrv2_writes_its_tables_as_markdown(tmp_path: pathlib.Path):
    args = ["--iters", "3", "--no-compile", "--no-inductor-counts", "--no-reference", "--batches", "A"]
    text = run("bench_mrv2.py", args, tmp_path / "mrv2.md")
    check_heading(text, "python benchmarks/bench_mrv2.py " + " ".join(args) + " --markdown /path/to/mrv2.md")
    found = tables(text)
    # --no-compile, --no-inductor-counts: no column of blanks, the title names what was left out
    ops = by_columns(found, ["batch", "op", "eager us", "dev", "cpu"])
    assert "(not measured in this run: compiled us, inductor)" in text
    assert [r[0] for r in ops] == ["A"] * 5
    for row in ops:
        assert all(number(c) > 0 for c in row[2:]), row
    summary = next(rows for cols, rows in found if cols[:2] == ["batch", "make_batch (numpy in)"])
    assert all(number(c) > 0 for row in summary for c in row[1:])


def test_the_command_has_no_absolute_path_of_this_machine(tmp_path: pathlib.Path):
    common = _common()
    inside = ROOT / "docs" / "_generated" / "x.md"
    argv = [
        str(ROOT / "benchmarks" / "bench_x.py"),
        "--markdown",
        str(inside),
        f"--reference={tmp_path}/r.txt",
    ]
    cmd = common.command_line(argv)
    assert re.fullmatch(
        r"(?:\w+=\S+ )*(?:taskset -c [\d,]+ )?python benchmarks/bench_x.py --markdown docs/_generated/x.md "
        r"--reference=/path/to/r.txt",
        cmd,
    ), cmd


def test_a_column_empty_in_every_row_is_left_out():
    common = _common()
    columns, rows, dropped = common.drop_empty_columns(["a", "b", "c"], [["1", None, ""], ["2", "", "x"]])
    assert (columns, rows, dropped) == (["a", "c"], [["1", ""], ["2", "x"]], ["b"])
    assert common.drop_empty_columns(["a"], []) == (["a"], [], [])


def test_format_table_pads_and_escapes():
    lines = _common().format_table(["a", "bb"], [["x|y", None], [1, 2.5]])
    assert lines == ["| a    | bb  |", "|------|-----|", "| x\\|y |     |", "| 1    | 2.5 |"]


# ---------------------------------------------------------------- the page's fragments
def _includes() -> list[tuple[pathlib.Path, str]]:
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        for name in re.findall(r'^\s*--8<--\s+"([^"]+)"', page.read_text(), re.M):
            out.append((page, name))
    return out


def _base_path() -> pathlib.Path:
    config = (ROOT / "mkdocs.yml").read_text()
    block = re.search(r"- pymdownx\.snippets:\n((?:\s{6}.+\n)+)", config)
    assert block, "mkdocs.yml configures pymdownx.snippets"
    assert re.search(r"check_paths: true", block.group(1)), "a missing snippet must fail the build"
    base = re.search(r"base_path: \[([\w/.-]+)\]", block.group(1))
    assert base, block.group(1)
    return ROOT / base.group(1)


def test_every_include_resolves_and_every_fragment_is_included():
    base = _base_path()
    includes = _includes()
    assert includes, "docs/performance.md includes the benchmarks' fragments"
    for page, name in includes:
        assert (base / name).is_file(), f"{page.relative_to(ROOT)} includes {name}: no {base / name}"
    fragments = {p.name for p in base.glob("*.md")}
    assert fragments == {name for _, name in includes}, "a fragment nobody includes, or one missing"


@pytest.mark.parametrize("fragment", sorted(p.name for p in (DOCS / "_generated").glob("*.md")))
def test_each_fragment_was_written_by_its_own_command(fragment: str):
    path = DOCS / "_generated" / fragment
    text = path.read_text()
    fields = heading(text)
    datetime.datetime.strptime(fields["date"], "%Y-%m-%d %H:%M UTC")
    assert re.search(r", \d+ cores", fields["machine"]) and "at the end" in fields["load average"]
    cmd = fields["command"].strip("`")
    m = re.search(r"\bpython (benchmarks/bench_\w+\.py)\b.* --markdown (\S+)$", cmd)
    assert m, f"{fragment}: {cmd}"
    assert (ROOT / m.group(1)).is_file(), cmd
    assert m.group(2) == path.relative_to(ROOT).as_posix(), f"{fragment} says it was written to {m.group(2)}"
    assert "/" + "work/" not in text and str(ROOT) not in text
    assert tables(text), f"{fragment}: no table"
