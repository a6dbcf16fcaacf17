"""`pcp-fn compare`: the table's numbers against an independent per-request count, and the figure."""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pcp_fn
from pcp_fn.sim import cli, compare
from pcp_fn.sim.compare import compare_layouts, workload_cost
from pcp_fn.sim.trace import TraceStep, write_trace

R, T = 6, 64
# decodes first (context, one token, prompt done), then fresh and chunked prefills
STEPS = [
    TraceStep((13, 30), (0, 0), (13, 40)),
    TraceStep((1, 10, 21), (13, 30, 0), (13, 40, 21)),
    TraceStep((1, 1, 1, 7), (14, 41, 21, 0), (13, 40, 21, 7)),
    TraceStep((1,), (8,), (7,)),
]


def _chunks_of(n, P, q):
    """Tokens of a prefill of ``n`` that DualChunkSwap / MRV2 rank ``q`` holds: chunks q and 2P-1-q of
    ceil(n / 2P), cut at n; and the rows DualChunkSwap pads them to."""
    c = -(-n // (2 * P))
    toks = [j for m in (q, 2 * P - 1 - q) for j in range(m * c, min((m + 1) * c, n))]
    return sorted(toks), 2 * c


def _linear_of(n, P, q):
    """The hybrid layout's linear split: n // P + (q < n % P) consecutive tokens."""
    size = n // P + (q < n % P)
    first = q * (n // P) + min(q, n % P)
    return list(range(first, first + size))


def independent(layout, P, steps=STEPS, spec=0, pd=False):
    """Per-rank tokens, work, padding and gathered rows; ``spec`` draft tokens a decode may carry,
    ``pd``: a prompt with one token left also counts as done (vllm-ascend's recompute scheduler)."""
    tokens, work, padding, gathered = np.zeros(P, int), np.zeros(P, int), np.zeros(P, int), 0
    for s in steps:
        rows, mine = np.zeros(P, int), [[] for _ in range(P)]
        for n, k, p in zip(s.num_scheduled, s.num_computed, s.num_prompt):
            decode = k >= max(p - pd, 1) and n <= 1 + spec
            for q in range(P):
                if decode or P == 1:
                    held, r = list(range(n)), n
                elif layout == "hybrid":
                    held = _linear_of(n, P, q)
                    r = len(held)
                else:
                    held, r = _chunks_of(n, P, q)
                    r = r if layout == "dcs" else len(held)
                rows[q] += r
                mine[q] += [k + j + 1 for j in held]  # a token at position k + j attends k + j + 1 keys
        for q in range(P):
            tokens[q] += len(mine[q])
            work[q] += sum(mine[q])
            padding[q] += rows.max() - len(mine[q])
        gathered += P * rows.max()
    return tokens.tolist(), work.tolist(), padding.tolist(), int(gathered)


@pytest.mark.parametrize("P", [2, 3, 5])
@pytest.mark.parametrize("layout", ["dcs", "hybrid", "mrv2"])
def test_costs_equal_an_independent_count(layout, P):
    cost = workload_cost(layout, P, STEPS, R, T)
    assert (list(cost.tokens), list(cost.work), list(cost.padding), cost.gathered) == independent(layout, P)


def test_compare_prints_the_table_and_writes_the_figure(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # in the test extra: it runs in CI
    trace = tmp_path / "t.jsonl"
    write_trace(trace, cli.PCPConfig(2, 0, R, T), STEPS)
    png = tmp_path / "out.png"
    args = ["compare", str(trace), "--layouts", "dcs,hybrid,mrv2", "--pcp-sizes", "2:4", "--plot", str(png)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    table = {(r.split()[0], int(r.split()[1])): r.split()[2:] for r in out[2:-1]}
    assert len(table) == 9
    for (layout, P), row in table.items():
        tokens, work, padding, gathered = independent(layout, P)
        mean = sum(work) / P
        expected = [max(tokens), min(tokens), max(work), min(work), f"{max(work) / mean:.3f}", sum(padding)]
        assert row == [str(x) for x in [*expected, gathered]], (layout, P)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).shape[:2] == (640, 1120)  # 14 x 8 in at 80 dpi


def test_compare_simulates_a_workload_without_a_trace(capsys):
    argv = ["compare", "--requests", "3", "--prompt-len", "5:40", "--output-len", "2", "--pcp-sizes", "2"]
    assert cli.main([*argv, "--layouts", "dcs,mrv2", "--max-num-tokens", "64", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "a simulated workload (3 requests" in out and "\nmrv2 " in out


def test_compare_layouts_covers_every_pair():
    costs = compare_layouts(STEPS, ["dcs", "mrv2"], [2, 4], R, T)
    assert [(c.layout, c.pcp_size) for c in costs] == [("dcs", 2), ("dcs", 4), ("mrv2", 2), ("mrv2", 4)]
    # the same chunks: the same tokens and work; MRV2 cuts them at the request's end: never more padding
    assert costs[0].work == costs[2].work and sum(costs[3].padding) <= sum(costs[1].padding)


# -- issue 41: the trace's config reaches every layout; a refusal is said, not costed otherwise ------

ROOT = pathlib.Path(__file__).resolve().parents[2]
# under pd_decode_recompute a prompt with one token left is done (request 0 of steps 0 and 2), and
# with one spec token a decode carries two tokens (request 1 of step 0, request 0 of step 1): all
# decodes, replicated on every rank; without those settings they are prefills, split and padded
PD_STEPS = [
    TraceStep((1, 2, 20), (9, 5, 0), (10, 5, 30)),
    TraceStep((2, 10), (10, 20), (10, 30)),
    TraceStep((1, 7), (29, 0), (30, 7)),
]


def _table(out):
    """The table's rows by (layout, P); the header and the lines after the table left out."""
    rows = [line.split() for line in out]
    return {(r[0], int(r[1])): r[2:] for r in rows if len(r) == 9 and r[1].isdigit()}


def _row(layout, P, steps, **kw):
    tokens, work, padding, gathered = independent(layout, P, steps, **kw)
    expected = [max(tokens), min(tokens), max(work), min(work), f"{max(work) / (sum(work) / P):.3f}"]
    return [str(x) for x in [*expected, sum(padding), gathered]]


def test_compare_costs_each_layout_under_the_traces_own_config(tmp_path, capsys):
    # before: compare kept R, T and the spec tokens, and costed this trace as if pd_decode_recompute
    # were off (its pd decodes split as prefills)
    cfg = pcp_fn.PCPConfig(2, 0, R, T, num_spec_tokens=1, pd_decode_recompute=True)
    write_trace(tmp_path / "pd.jsonl", cfg, PD_STEPS)
    argv = ["compare", str(tmp_path / "pd.jsonl"), "--layouts", "dcs,hybrid,mrv2", "--pcp-sizes", "2:3"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(
        f"R={R}, T={T}, num_spec_tokens=1, pd_decode_recompute=True; summed over the steps"
    )
    table = _table(out[1:])
    assert len(table) == 6
    for (layout, P), row in table.items():
        assert row == _row(layout, P, PD_STEPS, spec=1, pd=True), (layout, P)
    # and it matters: without the settings, other numbers
    assert any(row != _row(layout, P, PD_STEPS) for (layout, P), row in table.items())


def test_a_layout_that_refuses_the_config_is_said_not_costed(tmp_path, capsys):
    cfg = pcp_fn.PCPConfig(2, 0, R, T, dcp_size=2)
    write_trace(tmp_path / "dcp.jsonl", cfg, STEPS)
    assert cli.main(["compare", str(tmp_path / "dcp.jsonl"), "--pcp-sizes", "2:3"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = _table(out[1:])
    assert sorted(table) == [(n, P) for n in ("dcs", "hybrid", "mrv2") for P in (2, 3)]  # no mrv2-sharded
    refused = [line for line in out if line.startswith("not costed: ")]
    assert refused[0] == (
        "not costed: mrv2-sharded at P = 2, 3: the 'mrv2-sharded' layout requires dcp_size == 1, got "
        "dcp_size=2: DCP needs every decode on every rank (vLLM's pcp_shard_decode_requests is False then)"
    )
    # the other prefill splits: vLLM's DCP reads head and tail chunks
    others = ("round-robin", "cost-balanced", "round-robin-sharded", "cost-balanced-sharded")
    assert refused[1:] == [
        f"not costed: {name} at P = 2, 3: the {name!r} layout requires dcp_size == 1, got dcp_size=2: "
        "vLLM's DCP reads each rank's prefill rows as head and tail chunks"
        for name in others
    ]
    for P in (2, 3):  # MRV2 under DCP keeps a short prefill whole: the trace's dcp_size is used
        cost = compare.config_cost(dataclasses.replace(cfg, pcp_size=P, layout="mrv2"), STEPS)
        assert table["mrv2", P] == [
            str(x)
            for x in (max(cost.tokens), min(cost.tokens), max(cost.work), min(cost.work))
            + (f"{cost.work_imbalance:.3f}", sum(cost.padding), cost.gathered)
        ]
    assert table["mrv2", 3] != _row("mrv2", 3, STEPS)
    # asked for by name alone: nothing to cost is an error, naming the layout and why
    assert cli.main(["compare", str(tmp_path / "dcp.jsonl"), "--layouts", "mrv2-sharded"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "pcp-fn compare: error: no layout serves the workload's config: "
        "mrv2-sharded at P = 2, 3, 4, 5, 6, 7, 8: the 'mrv2-sharded' layout requires dcp_size == 1"
    ), err


def test_every_config_field_is_carried_or_named_as_not_carried():
    fields = {f.name for f in dataclasses.fields(pcp_fn.PCPConfig)}
    assert set(compare.CARRIED_FIELDS) | set(compare.NOT_CARRIED_FIELDS) == fields
    assert not set(compare.CARRIED_FIELDS) & set(compare.NOT_CARRIED_FIELDS)


LAYOUT_FILE = """
import pcp_fn


class {cls}(pcp_fn.PartitionLayout):
    name = "{name}"

    def segments(self, config, requests, rank):  # rank 0 holds every prefill whole
        n = requests.num_scheduled
        whole = requests.replicated | (rank == 0)
        {body}
        return (n * 0)[:, None], (n * whole)[:, None]

    def num_local_tokens(self, config, num_scheduled, num_decodes, num_computed):
        {host}
        return int(num_scheduled.sum())


pcp_fn.register_layout({cls}())
"""


def _layout_file(path, name, body="pass", host="pass"):
    path.parent.mkdir(parents=True, exist_ok=True)
    cls = "".join(part.title() for part in name.split("-"))
    path.write_text(LAYOUT_FILE.format(cls=cls, name=name, body=body, host=host))
    return str(path)


def test_load_runs_every_file_under_a_name_of_its_own(tmp_path):
    # before: a file named like a module already imported (json.py), or a second mylayout.py,
    # was skipped without a word, and its layouts were unknown
    files = [
        _layout_file(tmp_path / "json.py", "from-json"),
        _layout_file(tmp_path / "a" / "mylayout.py", "from-a"),
        _layout_file(tmp_path / "b" / "mylayout.py", "from-b"),
    ]
    # a bug in a researcher's layout, met at the trace's 13-token request: named, not a traceback
    host = "if 13 in num_scheduled.tolist(): raise RuntimeError('num_local_tokens broke')"
    broken = _layout_file(tmp_path / "broken.py", "broken", host=host)
    trace = tmp_path / "t.jsonl"
    write_trace(trace, pcp_fn.PCPConfig(2, 0, R, T), STEPS)
    loads = [arg for f in files for arg in ("--load", f)]
    # a process of its own: the layouts register in its registry, not this one's
    run = [sys.executable, "-m", "pcp_fn.sim.cli", "compare", str(trace), "--pcp-sizes", "2"]
    ok = subprocess.run([*run, *loads, "--load", files[0]], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    table = _table(ok.stdout.splitlines()[1:])
    assert {"from-json", "from-a", "from-b", "dcs"} <= {name for name, _ in table}
    assert table["from-a", 2] == table["from-b", 2]
    bad = subprocess.run([*run, "--load", broken], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr == (
        "pcp-fn compare: error: layout 'broken' at P=2 failed: RuntimeError: num_local_tokens broke\n"
    ), bad.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = (\n", "line 1: SyntaxError: '(' was never closed"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
        ("import sys\nsys.exit(0)\n", "the file called sys.exit(0)"),  # before: exit status 0, no table
        ("X = 1\n", "registered no new layout (it must call pcp_fn.register_layout"),  # before: silent
    ],
)
def test_a_load_file_that_fails_or_registers_nothing_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "layouts.py"
    path.write_text(text)
    before = dict(sys.modules)
    assert cli.main(["compare", "--load", str(path), "--requests", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"pcp-fn compare: error: --load {path}: {message}" + err.split(message, 1)[1]
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not [m for m in sys.modules if m.startswith("pcp_fn_load_") and m not in before]  # not left


def test_load_names_a_missing_file_a_folder_and_a_file_that_is_not_python(tmp_path, capsys):
    (tmp_path / "t.txt").write_text("")
    cases = {
        str(tmp_path / "none.py"): f"--load {tmp_path / 'none.py'}: No such file or directory",
        str(tmp_path): f"--load {tmp_path}: Is a directory",
        str(tmp_path / "t.txt"): f"--load {tmp_path / 't.txt'}: not a Python file (.py)",
    }
    for path, message in cases.items():
        assert cli.main(["compare", "--load", path, "--requests", "2", "--no-progress"]) == 2
        assert capsys.readouterr().err == f"pcp-fn compare: error: {message}\n"


def test_plot_refuses_a_path_it_cannot_write_before_any_work(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    cases = {
        str(tmp_path): f"--plot {tmp_path}: Is a directory",
        str(
            tmp_path / "no" / "x.png"
        ): f"--plot {tmp_path / 'no' / 'x.png'}: No such file or directory (its folder",
        str(tmp_path / "out"): f"--plot {tmp_path / 'out'}: no extension; name the figure's format by its",
        str(tmp_path / "x.xyz"): f"--plot {tmp_path / 'x.xyz'}: extension .xyz; name the figure's format",
    }
    for path, message in cases.items():
        # before: `--plot out` wrote out.png and said "wrote out"; a folder or a bad format failed
        # only after every layout was costed
        assert cli.main(["compare", "--plot", path, "--requests", "500", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"pcp-fn compare: error: {message}") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_plot_without_matplotlib_is_one_line_before_any_work(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, pcp_fn.PCPConfig(2, 0, R, T), STEPS)
    code = textwrap.dedent(
        """
        import sys
        sys.modules["matplotlib"] = None  # not installed
        from pcp_fn.sim.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "compare", str(trace), "--plot", str(tmp_path / "out.png")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and out.stdout == ""  # before: a traceback after the table, status 1
    assert out.stderr == (
        "pcp-fn compare: error: --plot needs matplotlib, which is not installed: pip install 'pcp_fn[plot]'\n"
    )


def test_layouts_names_an_empty_repeated_or_unknown_layout(capsys):
    for text, message in [
        ("", "--layouts '': an empty layout name"),  # before: every layout, silently
        ("dcs,,mrv2", "--layouts 'dcs,,mrv2': an empty layout name"),
        ("dcs,dcs", "--layouts 'dcs,dcs': 'dcs' is named twice"),
        ("dcs,nope", "unknown layout 'nope'; registered: "),
    ]:
        assert cli.main(["compare", "--layouts", text, "--requests", "2", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"pcp-fn compare: error: {message}") and err.count("\n") == 1, err


def test_a_size_past_the_gathered_rows_limit_is_said_not_allocated(tmp_path, capsys):
    # P * (T + min(R, T)) rows past a trace's limit: listed, never allocated (before: P = 256 at this
    # T asked for 268 million rows per all-gather)
    write_trace(tmp_path / "t.jsonl", pcp_fn.PCPConfig(2, 0, 4, 1 << 20), [TraceStep((5,), (0,), (5,))])
    assert cli.main(["compare", str(tmp_path / "t.jsonl"), "--pcp-sizes", "15:16", "--layouts", "dcs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert list(_table(out)) == [("dcs", 15)]
    assert out[-1] == (
        "not costed: dcs at P = 16: 16 ranks of 1048580 local tokens make 16777280 gathered rows; "
        "a trace allows 16777216"
    )


# -- issue 40: the figure draws the imbalance, no layout hides another; the table as CSV and JSON ---


def _drawn(monkeypatch, draw):
    """The matplotlib figure ``draw()`` makes (kept: plot() closes it)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    draw()
    assert len(kept) == 1
    return kept[0]


def _lines(ax):
    """The layouts' lines of a panel, by layout (the balance line at 1.0 left out)."""
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_the_figure_draws_the_imbalance_and_no_layout_hides_another(tmp_path, monkeypatch):
    layouts = ["dcs", "hybrid", "mrv2", "mrv2-sharded"]
    costs = compare_layouts(STEPS, layouts, [2, 3, 4], R, T)
    fig = _drawn(monkeypatch, lambda: compare.plot(costs, str(tmp_path / "f.png"), caption="on t.jsonl"))
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert list(panels) == [title for title, _, _ in compare.PANELS]
    imbalance = _lines(panels["work imbalance (fullest rank / mean)"])
    for name in layouts:  # the table's key column, unrounded
        assert list(imbalance[name].get_ydata()) == [c.work_imbalance for c in costs if c.layout == name]
    for title, ax in panels.items():
        lines = _lines(ax)
        assert list(lines) == layouts, title
        looks = [(line.get_linestyle(), line.get_marker()) for line in lines.values()]
        assert len(set(looks)) == len(looks), title  # each layout its own dash and marker
    # before: mrv2's line lay exactly on dcs' (the same tokens and work), hiding it: now dcs is
    # drawn wider, with larger hollow markers, and mrv2 shows inside it
    tokens = _lines(panels["fullest rank's tokens"])
    assert list(tokens["dcs"].get_ydata()) == list(tokens["mrv2"].get_ydata())
    assert tokens["dcs"].get_linewidth() > tokens["mrv2"].get_linewidth()
    assert tokens["dcs"].get_markersize() > tokens["mrv2"].get_markersize()
    assert tokens["dcs"].get_markerfacecolor() == "none"
    # the padding and gathered rows on a log scale (symmetric where a layout has none)
    for title in ("padding rows, all ranks (log scale)", "gathered rows (log scale)"):
        values = [y for line in _lines(panels[title]).values() for y in line.get_ydata()]
        assert panels[title].get_yscale() == ("log" if min(values) > 0 else "symlog"), title
    assert fig.get_suptitle() == "on t.jsonl"
    legend = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert [t.get_text() for t in legend[0].get_legend().get_texts()] == layouts


def test_the_commands_figure_names_the_trace_r_and_t(tmp_path, monkeypatch, capsys):
    trace = tmp_path / "named.jsonl"
    write_trace(trace, pcp_fn.PCPConfig(2, 0, R, T, num_spec_tokens=1), STEPS)
    argv = [
        "compare",
        str(trace),
        "--layouts",
        "dcs,mrv2",
        "--pcp-sizes",
        "2:3",
        "--plot",
        str(tmp_path / "f.png"),
    ]
    fig = _drawn(monkeypatch, lambda: cli.main(argv))
    header = capsys.readouterr().out.splitlines()[0]
    assert (
        " ".join(fig.get_suptitle().split())  # wrapped at 120 characters
        == header
        == (f"layouts on {trace} (4 steps), R={R}, T={T}, num_spec_tokens=1; summed over the steps")
    )
    simulated = ["compare", "--requests", "3", "--prompt-len", "9", "--layouts", "dcs", "--pcp-sizes", "2"]
    fig = _drawn(
        monkeypatch, lambda: cli.main([*simulated, "--plot", str(tmp_path / "g.png"), "--no-progress"])
    )
    assert "a simulated workload (3 requests" in fig.get_suptitle() and "R=16, T=1024" in fig.get_suptitle()


def test_compare_writes_the_table_as_csv_and_json(tmp_path, capsys):
    trace = tmp_path / "dcp.jsonl"
    write_trace(trace, pcp_fn.PCPConfig(2, 0, R, T, dcp_size=2), STEPS)  # mrv2-sharded refuses it
    paths = tmp_path / "t.csv", tmp_path / "t.json"
    argv = ["compare", str(trace), "--pcp-sizes", "2:3", "--csv", str(paths[0]), "--json", str(paths[1])]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [f"wrote {paths[0]}", f"wrote {paths[1]}"]
    table = _table(out[1:])
    with open(paths[0], newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == compare.FIELDS
        rows = list(reader)
    assert [(r["layout"], int(r["pcp_size"])) for r in rows] == list(table)
    for r in rows:  # the table's numbers, the imbalance unrounded
        shown = [f"{float(v):.3f}" if k == "imbalance" else v for k, v in r.items()]
        assert shown[2:] == table[r["layout"], int(r["pcp_size"])]
    doc = json.loads(paths[1].read_text())
    assert doc["workload"] == f"{trace} (4 steps)" and doc["config"]["dcp_size"] == 2
    for r, j in zip(rows, doc["rows"]):
        assert {k: str(v) for k, v in j.items() if k != "per_rank"} == r
        ranks = j["per_rank"]
        assert len(ranks["tokens"]) == j["pcp_size"] and max(ranks["tokens"]) == j["tokens_max"]
        assert min(ranks["work"]) == j["work_min"] and sum(ranks["padding"]) == j["padding"]
    refused = ("mrv2-sharded", "round-robin", "cost-balanced", "round-robin-sharded", "cost-balanced-sharded")
    expected = [(n, P) for n in refused for P in (2, 3)]
    assert [(x["layout"], x["pcp_size"]) for x in doc["not_costed"]] == expected
    assert doc["not_costed"][0]["reason"].startswith("the 'mrv2-sharded' layout requires dcp_size == 1")


def test_compare_checks_every_output_before_any_work(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, pcp_fn.PCPConfig(2, 0, R, T), STEPS)
    (tmp_path / "dir").mkdir()
    out = tmp_path / "out.csv"
    cases = [
        (
            ["--csv", str(tmp_path / "no" / "t.csv")],
            f"--csv {tmp_path / 'no' / 't.csv'}: No such file or directory",
        ),
        (["--json", str(tmp_path / "dir")], f"--json {tmp_path / 'dir'}: Is a directory"),
        (["--csv", str(out), "--json", str(out)], f"--csv and --json name the same file {out}"),
        (
            ["--plot", str(tmp_path / "f.png"), "--csv", str(tmp_path / "f.png")],
            "--plot and --csv name the same",
        ),
        (
            [str(trace), "--json", str(trace)],
            f"TRACE and --json name the same file {trace}",
        ),  # the trace kept
    ]
    for argv, message in cases:
        t0 = time.perf_counter()  # a workload that takes minutes to cost: refused before it
        assert cli.main(["compare", *argv, "--requests", "3000", "--no-progress"]) == 2
        assert time.perf_counter() - t0 < 10
        err = capsys.readouterr().err
        assert err.startswith(f"pcp-fn compare: error: {message}") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "t.jsonl"]
