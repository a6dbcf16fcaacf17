"""`pcp-fn show`: the README's picture, read off the layout's own outputs, for every layout."""

from __future__ import annotations

import contextlib
import io
import pathlib
import subprocess
import sys
import textwrap

import pytest

from pcp_fn.sim import cli, show

ROOT = pathlib.Path(__file__).resolve().parents[2]

# README.md's picture (DualChunkSwap, P = 2, scheduled [1, 5, 8]), quoted here rather than read:
# README.md is edited by others; when its picture changes, this quote and show change with it
README_PICTURE = [
    "request                 0 (decode)   1 (n=5, padded to 8)   2 (n=8)",
    "padded gathered rows    d d          0 1 2 3 4 . . .        0 1 2 3 4 5 6 7",
    "chunk -> rank           r0 r1        r0  r1  r1  r0         r0  r1  r1  r0",
    "rank 0 local tokens     d            0 1 . .                0 1 6 7       "
    "positions [0, 0,1,6,7, 0,1,6,7]",
    "rank 1 local tokens     d            2 3 4 .                2 3 4 5       "
    "positions [0, 2,3,4,5, 2,3,4,5]",
]


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), err.getvalue()


def _split_note(line: str) -> tuple[str, str]:
    """A row's table part and its ``positions [...]`` note."""
    table, _, note = line.partition("positions ")
    return table.rstrip(), note


def test_the_readme_batch_under_dcs_is_the_readme_picture():
    status, out, err = _main(["show"])  # the defaults: dcs, P = 2, the README's batch
    assert status == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0] == "layout dcs, P=2: scheduled [1, 5, 8], computed [3, 0, 0], prompt [3, 5, 8]"
    start = lines.index(README_PICTURE[0])
    drawn = lines[start : start + len(README_PICTURE)]
    for want, got in zip(README_PICTURE, drawn):
        # every cell in the README's column, character for character; the README sets the
        # positions note 7 spaces after the rank's last cell, show 3 after the column's widest
        assert _split_note(got) == _split_note(want), (got, want)
    # then the restored order, read off restore_hidden_states, and the logits rows
    assert lines[start + 11 :] == [
        "  request 0  0 16",
        "  request 1  1 2 17 18 19 20 3 4",
        "  request 2  5 6 21 22 23 24 7 8",
        "logits rows (each request's last token in the restored order): [0, 6, 17]",
    ]
    assert "  rank 0  [3, 0, 1, 6, 7, 0, 1, 6, 7]" in lines  # absolute: the decode at position 3


def test_mrv2_cuts_the_same_chunks_without_pads():
    status, out, _ = _main(["show", "--layout", "mrv2"])
    assert status == 0
    assert [line.rstrip() for line in out.splitlines()[3:8]] == [
        "request                 0 (decode)   1 (n=5)      2 (n=8)",
        "padded gathered rows    d            0 1 2 3 4    0 1 2 3 4 5 6 7",
        "chunk -> rank           r0           r0  r1  r1   r0  r1  r1  r0",
        "rank 0 local tokens     d            0 1          0 1 6 7           positions [0, 0,1, 0,1,6,7]",
        "rank 1 local tokens     d            2 3 4        2 3 4 5           positions [0, 2,3,4, 2,3,4,5]",
    ]
    assert out.splitlines()[-1].endswith("[0, 5, 13]")  # scheduler order: no pad rows before


BATCHES = [
    ((1, 5, 8), (3, 0, 0), (3, 5, 8)),
    ((1, 1, 7, 20), (5, 6, 0, 0), (5, 6, 7, 20)),
    ((3, 30), (0, 10), (3, 40)),  # a short prefill, a chunk in the middle of a prompt
]


@pytest.mark.parametrize("P", [1, 2, 3, 4])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("layout", ["dcs", "hybrid", "mrv2", "mrv2-sharded"])
def test_every_layout_draws_every_token_where_its_outputs_put_it(layout, batch, P):
    own = show.ownership(layout, P, *batch)
    scheduled, computed, _ = batch
    for i, n in enumerate(scheduled):
        region = own.restored[i]
        tokens = [x.offset for x in region if x.request == i and x.offset < n]
        if own.is_decode[i]:
            assert set(tokens) == set(range(n)), (i, region)  # a copy per rank, or one
        else:  # every token once, in order; the rest pads of its own
            assert tokens == list(range(n)) and all(x.request == i for x in region), (i, region)
        held = [(x.rank, x.offset) for rows in own.local for x in rows if x.request == i and x.offset < n]
        if not own.is_decode[i]:
            assert sorted(o for _, o in held) == list(range(n))  # on exactly one rank each
            # each restored row is read from the rank that holds it
            assert {(x.rank, x.offset) for x in region if x.offset < n} == set(held)
        for x in (x for rows in own.local for x in rows if x.request == i):
            assert x.position == computed[i] + x.offset
    text = show.format_ownership(own)
    assert text.count(" local tokens ") == P
    assert "?" not in text  # no restored row read from outside its request's rows


def test_show_names_a_bad_batch_or_layout(tmp_path):
    cases = [
        (["--scheduled", "1,x"], "argument --scheduled: expected comma-separated integers"),
        (["--scheduled", "0,5"], "argument --scheduled: expected comma-separated integers (must be >= 1"),
        (["--computed=-1,0,0"], "argument --computed: expected comma-separated integers (must be >= 0"),
        (
            ["--scheduled", "4,4", "--computed", "0"],
            "--computed has 1 values, --scheduled 2: one per request",
        ),
        (
            ["--scheduled", "4", "--prompt", "3"],
            "request 0: --computed 0 + --scheduled 4 runs past --prompt 3",
        ),
        (["--scheduled", "5,1", "--computed", "0,3", "--prompt", "5,3"], "decodes must come first"),
        (["--scheduled", "4097"], "must be <= 4096 (the limit of --scheduled)"),
        (["--scheduled", "4000,97"], "--scheduled sums to 4097 tokens; show draws at most 4096"),
        (["--layout", "nope"], "--layout 'nope': unknown layout; registered: ['cost-balanced', "),
        (["-P", "300"], "argument --pcp-size/-P: must be <= 256"),
        (["--layout", "mrv2-sharded", "--spec-tokens", "1"], "layout 'mrv2-sharded' at P=2: "),
        (["--plot", str(tmp_path / "no" / "x.png")], f"--plot {tmp_path / 'no' / 'x.png'}: No such file"),
    ]
    for argv, message in cases:
        status, out, err = _main(["show", *argv])
        assert status == 2 and out == "", (argv, status, out)
        assert err.count("\n") == 1 and "Traceback" not in err and message in err, (argv, err)


def test_show_plots_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "dcs.png"
    status, out, _ = _main(["show", "-P", "3", "--plot", str(png)])
    assert status == 0 and out.endswith(f"wrote {png}\n")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width = matplotlib.image.imread(str(png)).shape[:2]
    assert width > height > 100  # the requests side by side, a row per rank and the restored rows


def test_show_plot_without_matplotlib_is_one_line_before_any_work(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["matplotlib"] = None  # not installed
        from pcp_fn.sim.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "show", "--plot", str(tmp_path / "out.png")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        "pcp-fn show: error: --plot needs matplotlib, which is not installed: pip install 'pcp_fn[plot]'\n"
    )


def test_show_draws_a_loaded_layout():
    # a process of its own: the example registers in its registry, not this one's
    run = [sys.executable, "-m", "pcp_fn.sim.cli", "show", "--load", "examples/contiguous_layout.py"]
    out = subprocess.run([*run, "--layout", "contiguous"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = [line.rstrip() for line in out.stdout.splitlines()]
    assert lines[0].startswith("layout contiguous, P=2")
    assert lines[3:8] == [  # the linear split: 3 + 2 and 4 + 4 consecutive tokens, no pads
        "request                 0 (decode)   1 (n=5)     2 (n=8)",
        "padded gathered rows    d            0 1 2 3 4   0 1 2 3 4 5 6 7",
        "chunk -> rank           r0           r0    r1    r0      r1",
        "rank 0 local tokens     d            0 1 2       0 1 2 3           positions [0, 0,1,2, 0,1,2,3]",
        "rank 1 local tokens     d            3 4         4 5 6 7           positions [0, 3,4, 4,5,6,7]",
    ]
