"""Issue 41: every flag of every `pcp-fn` command, and every trace, tried adversarially: bad input is
one line on stderr and exit status 2 naming the flag (or the line) and the limit, before anything is
allocated; a long trace replays in bounded memory; nothing is cut short without a word."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import types
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pcp_fn
from pcp_fn.sim import cli
from pcp_fn.sim.trace import TraceError, TraceStep, read_trace, replay, replay_digest, write_trace

pytestmark = pytest.mark.timeout(240)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "examples" / "traces" / "mixed_p4.jsonl"


def _main(argv: list[str]) -> tuple[int, str, str]:
    """``cli.main(argv)``: its status (argparse's SystemExit included), stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), err.getvalue()


def _one_line_error(argv: list[str], message: str) -> str:
    status, _, err = _main(argv)
    assert status == 2, (argv, status, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, (message, err)
    return err


# -- numeric flags: the limit of each is named, out-of-range values are refused before any work ----

# (flag, lowest value); the highest is cli.FLAG_LIMITS[flag]
WORKLOAD_FLAGS = [
    ("--pcp-size", 1),
    ("--requests", 1),
    ("--arrival-every", 0),
    ("--max-num-reqs", 1),
    ("--max-num-tokens", 1),
    ("--spec-tokens", 0),
    ("--max-steps", 1),
]
SPANS = ["--prompt-len", "--output-len"]
COMMANDS = [["simulate"], ["record", "never-written.jsonl"], ["compare"]]


@settings(max_examples=60)
@given(
    command=st.sampled_from(COMMANDS),
    flag=st.sampled_from(WORKLOAD_FLAGS),
    low=st.booleans(),
    offset=st.integers(min_value=0, max_value=10**40),
)
def test_a_numeric_flag_out_of_range_is_refused_naming_its_limit(command, flag, low, offset):
    name, lo = flag
    hi = cli.FLAG_LIMITS[name]
    value = lo - 1 - offset if low else hi + 1 + offset
    if len(str(abs(value))) > 30:
        message = f"argument {name}"  # never converted: "N-digit integer ... is out of range"
    elif low:
        message = f"must be >= {lo}, got {value}"
    else:
        message = f"must be <= {hi} (the limit of {name}), got {value}"
    _one_line_error([*command, f"{name}={value}"], message)


def _numbers(text: str) -> bool:
    """``text`` is ``N`` or ``LO:HI`` as Python reads integers (``" 7"``, ``"1_000"``, ``"٣"`` too)."""
    try:
        [int(part) for part in text.split(":", 1)]
    except ValueError:
        return False
    return True


@settings(max_examples=40)
@given(
    flag=st.sampled_from([name for name, _ in WORKLOAD_FLAGS] + SPANS + ["--seed"]),
    text=st.text(min_size=1, max_size=20).filter(lambda t: not _numbers(t)),
)
def test_a_numeric_flag_that_is_no_number_is_one_line(flag, text):
    _one_line_error(["simulate", f"{flag}={text}"], f"argument {flag}")


@settings(max_examples=30)
@given(
    flag=st.sampled_from(SPANS),
    lo=st.integers(min_value=-5, max_value=2**21),
    hi=st.integers(min_value=-5, max_value=2**21),
)
def test_a_range_flag_is_checked_at_both_ends(flag, lo, hi):
    text = f"{lo}:{hi}"
    if 1 <= lo <= hi <= cli.FLAG_LIMITS[flag]:
        return  # valid: it would simulate
    message = "expected 1 <= LO <= HI" if lo < 1 or hi < lo else f"(the limit of {flag})"
    _one_line_error(["simulate", f"{flag}={text}"], message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # the audit's examples: before, a traceback (an allocation of 4 GB) or a hang
        (["simulate", "--max-num-tokens", str(10**12)], "must be <= 1048576 (the limit of --max-num-tokens)"),
        (["simulate", "--pcp-size", str(10**6)], "must be <= 256 (the limit of --pcp-size)"),
        (["simulate", "--max-num-reqs", str(10**9)], "must be <= 65536 (the limit of --max-num-reqs)"),
        (["simulate", "--requests", str(10**9)], "must be <= 65536 (the limit of --requests)"),
        (["simulate", "--prompt-len", str(10**9)], "must be <= 1048576 (the limit of --prompt-len)"),
        (["compare", "--pcp-sizes", "2:1000000"], "must be <= 256 (the limit of --pcp-sizes)"),
        (["simulate", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),  # before: numpy's words
        (["simulate", "--max-steps", "9" * 5000], "argument --max-steps: 5000-digit integer 999999999999"),
        (["replay", str(BUNDLED), "--rank", str(10**6)], "must be <= 255 (the limit of --rank)"),
        (["replay", str(BUNDLED), "--expect", "abc"], "expected a SHA-256 digest (64 hex digits)"),
        (["compare", "--pcp-sizes", "1:2:3"], "expected N or LO:HI, got '1:2:3'"),
        # each flag within its limit, together past what a trace allows (a record could not replay)
        (
            ["record", "x.jsonl", "-P", "64", "--max-num-tokens", str(2**20)],
            "--pcp-size 64, --max-num-tokens 1048576, --max-num-reqs 16: 64 ranks of 1048592 local tokens "
            "make 67109888 gathered rows; a trace allows 16777216",
        ),
        (
            ["simulate", "--requests", "65536", "--prompt-len", "1000"],
            "--requests 65536 of up to --prompt-len 1000 + --output-len 32 tokens make 67633152 tokens; "
            "the simulator holds at most 16777216",
        ),
        # an unknown torch.compile backend: before, a traceback from Dynamo (status 1)
        (["simulate", "--backend", "nope"], "--backend 'nope' is not a torch.compile backend (known: eager"),
        (
            ["replay", str(BUNDLED), "--mode", "compiled", "--backend", "nope"],
            "is not a torch.compile backend",
        ),
        (["replay", str(BUNDLED), "--backend", "nope"], "--backend 'nope' is not"),  # before: ignored
        (["replay", str(BUNDLED), "--mode", "fast"], "argument --mode: invalid choice: 'fast'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag_and_the_limit(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    _one_line_error(argv, message)
    assert time.perf_counter() - t0 < 20  # refused before the work, not after it
    assert list(tmp_path.iterdir()) == []


def test_files_that_cannot_be_read_or_written_are_named(tmp_path):
    (tmp_path / "dir").mkdir()
    cases = [
        (["replay", str(tmp_path / "none.jsonl")], f"{tmp_path / 'none.jsonl'}: No such file or directory"),
        (["replay", str(tmp_path / "dir")], f"{tmp_path / 'dir'}: Is a directory"),
        (["replay", os.devnull], "line 1: the trace is empty (no header)"),
        (["compare", str(tmp_path / "dir")], f"{tmp_path / 'dir'}: Is a directory"),
        (["record", str(tmp_path / "dir"), "--requests", "2"], f"{tmp_path / 'dir'} is a directory"),
        # before: the error named the temporary file, .trace-XXXX.tmp
        (
            ["record", str(tmp_path / "no" / "t.jsonl"), "--requests", "2", "--no-progress"],
            f"{tmp_path / 'no' / 't.jsonl'}: No such file or directory (its folder {tmp_path / 'no'})",
        ),
    ]
    for argv, message in cases:
        _one_line_error(argv, message)


def test_a_trace_whose_layout_is_not_registered_is_one_line(tmp_path):
    lines = BUNDLED.read_text().splitlines()
    header = json.loads(lines[0])
    header["config"]["layout"] = "no-such-layout"  # a layout no one registered
    (tmp_path / "t.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    for command in ("replay", "compare"):
        _one_line_error([command, str(tmp_path / "t.jsonl")], "line 1: field 'config': unknown layout")


def test_a_run_cut_short_by_max_steps_says_so(tmp_path):
    small = ["-P", "2", "--requests", "6", "--prompt-len", "20:60", "--max-num-tokens", "32", "--no-progress"]
    status, out, _ = _main(["record", str(tmp_path / "t.jsonl"), *small, "--max-steps", "3"])
    # before: "wrote 2 steps", the trace silently a prefix of the workload
    assert status == 0 and re.fullmatch(
        rf"wrote \d steps to {re.escape(str(tmp_path / 't.jsonl'))} \(stopped at --max-steps 3 with \d of 6 "
        r"requests unfinished\)\n",
        out,
    ), out
    status, out, _ = _main(["simulate", *small, "--max-steps", "3", "--quiet", "--no-compile"])
    assert status == 0 and "  note: stopped at --max-steps 3 with " in out
    status, out, _ = _main(["record", str(tmp_path / "all.jsonl"), *small])
    assert status == 0 and "stopped" not in out  # the whole workload: no note
    # nothing scheduled at all: before, "no steps were scheduled" on stdout and status 1 (a mismatch's)
    _one_line_error(
        ["simulate", *small, "--arrival-every", "1000", "--max-steps", "5"],
        "no step was scheduled in --max-steps 5 steps (no request arrived)",
    )


# -- traces: any damage is a TraceError naming a line; streaming agrees with validating first -------


def _small_trace(tmp_path) -> pathlib.Path:
    cfg = pcp_fn.PCPConfig(2, 0, 4, 32, num_spec_tokens=1)
    steps = [
        TraceStep((7, 12), (0, 0), (7, 20), tuple(range(19))),
        TraceStep((2, 8), (7, 12), (7, 20)),
        TraceStep((1, 2), (9, 20), (7, 20)),
    ]
    path = tmp_path / "small.jsonl"
    write_trace(path, cfg, steps)
    return path


@settings(max_examples=80)
@given(data=st.data())
def test_a_damaged_trace_is_a_trace_error_or_a_valid_trace(tmp_path_factory, data):
    raw = _small_trace(tmp_path_factory.mktemp("t")).read_bytes()
    kind = data.draw(st.sampled_from(["truncate", "byte", "splice"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    if kind == "truncate":
        damaged = raw[:at]
    elif kind == "byte":
        damaged = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1 :]
    else:  # a wrong type or a huge number where a value was
        piece = data.draw(
            st.sampled_from([b'"x"', b"null", b"[]", b"{}", b"1e400", b"9" * 400, b"-1", b"true"])
        )
        damaged = raw[:at] + piece + raw[at:]
    try:
        trace = pcp_fn.sim.trace.parse_trace(damaged.splitlines(keepends=True))
    except TraceError as e:
        assert re.match(r"line \d+: ", str(e)), e
        return
    # still valid: replaying it streamed gives the digest of replaying it whole
    assert replay_digest(trace).digest == replay(trace).digest


def test_the_streamed_digest_is_replays_in_every_mode(tmp_path):
    path = _small_trace(tmp_path)
    for mode in ("eager", "compiled", "captured"):
        whole = replay(path, mode=mode, backend="eager")
        streamed = replay_digest(path, mode=mode, backend="eager")
        assert (streamed.digest, streamed.num_steps, streamed.num_graphs) == (
            whole.digest,
            len(whole.outputs),
            whole.num_graphs,
        ), mode
    assert replay_digest(BUNDLED).digest == replay(BUNDLED).digest
    with pytest.raises(ValueError, match=r"ranks must name distinct ranks, at least one, got \[1, 1\]"):
        replay_digest(path, ranks=[1, 1])  # before: rank 1's state stepped twice a step
    with pytest.raises(ValueError, match=r"got \[\]"):
        replay(path, ranks=[])  # before: the digest of nothing


_PEAK = """
import resource, sys
from pcp_fn.sim import cli
assert cli.main(["replay", sys.argv[1]]) == 0
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""


def _synthetic(path: pathlib.Path, steps: int) -> pathlib.Path:
    """A trace of ``steps`` fresh 65,536-token prefills at P = 2: 66 bytes a step, ~4 MB of outputs."""
    cfg = pcp_fn.PCPConfig(2, 0, 4, 1 << 16)
    write_trace(path, cfg, [TraceStep((1 << 16,), (0,), (1 << 16,))] * steps)
    return path


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB is Linux's")
def test_replay_holds_one_step_whatever_the_traces_length(tmp_path):
    # before: every rank's outputs of every step were kept for the digest: 80 steps of this trace
    # peaked ~330 MB above 5 steps (a 108 KB trace exhausted 1.5 GiB); now one step is held
    peaks = {}
    for steps in (5, 80):
        path = _synthetic(tmp_path / f"t{steps}.jsonl", steps)
        out = subprocess.run(
            [sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, cwd=ROOT, check=True
        )
        peaks[steps] = int(out.stdout.split()[-1]) // 1024  # MiB
    assert peaks[80] - peaks[5] < 48, peaks
    assert len(read_trace(tmp_path / "t80.jsonl").steps) == 80


# -- issue 40: the command as a new user meets it: its help, its flags, its progress bar ------------

# the positional arguments each command needs to reach its flags
POSITIONALS = {"record": ["never-written.jsonl"], "replay": [str(BUNDLED)]}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"pcp-fn": parser, **sub.choices}


def test_every_commands_help_is_plain_text_with_every_default():
    commands = _commands()
    assert list(commands) == ["pcp-fn", "simulate", "record", "replay", "compare", "show"]
    for name, parser in commands.items():
        text = parser.format_help()
        # before: the module docstring's reST (``replay --expect``) printed as it was written
        assert "`" not in text and not re.search(r":\w+:", text.replace("(default:", "")), (name, text)
        flat = " ".join(text.split())
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:
                continue  # --help, --version and the switches (off unless given)
            flags = "/".join(action.option_strings)
            if "(default" in (action.help or ""):  # said in words: all registered, no figure...
                continue
            # a value of its own: shown by the formatter, as the flag parses it
            assert action.default is not None, f"{name} {flags}: no default shown"
            assert f"(default: {action.default})" in flat, f"{name} {flags}"
        status, out, _ = _main([*([] if name == "pcp-fn" else [name]), "--help"])
        assert status == 0 and out == text


def test_every_flag_that_takes_a_value_names_itself_and_the_bad_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, parser in list(_commands().items())[1:]:
        for action in parser._actions:
            if action.type is None or not action.option_strings:
                continue
            argv = [name, *POSITIONALS.get(name, []), action.option_strings[0], "abc"]
            status, out, err = _main(argv)
            assert status == 2 and out == "", argv
            # before (--max-num-tokens abc): "invalid _positive value: 'abc'"
            assert err.startswith(f"pcp-fn {name}: error: argument {'/'.join(action.option_strings)}: "), err
            assert "'abc'" in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    _, _, err = _main(["simulate", "--max-num-tokens", "abc"])
    assert err == "pcp-fn simulate: error: argument --max-num-tokens: expected an integer, got 'abc'\n"


class FakeBar:
    """tqdm's interface as the command uses it, recording what it is told."""

    made: ClassVar[list[FakeBar]] = []

    def __init__(self, iterable=None, **kwargs):
        self.kwargs, self.updates, self.postfix, self.closed = kwargs, [], "", False
        FakeBar.made.append(self)

    def update(self, n=1):
        self.updates.append(n)

    def set_postfix_str(self, s="", refresh=True):
        self.postfix = s

    def close(self):
        self.closed = True


@pytest.fixture
def fake_tqdm(monkeypatch):
    module = types.ModuleType("tqdm")
    module.tqdm = FakeBar
    monkeypatch.setitem(sys.modules, "tqdm", module)
    FakeBar.made.clear()
    return FakeBar.made


def test_the_progress_bar_counts_the_workloads_requests(tmp_path, fake_tqdm):
    small = ["-P", "2", "--requests", "6", "--prompt-len", "20:60", "--max-num-tokens", "32"]
    status, out, _ = _main(["record", str(tmp_path / "t.jsonl"), *small])
    assert status == 0 and len(fake_tqdm) == 1
    bar = fake_tqdm[0]
    # before: total=--max-steps, 10000 (a run of 386 steps showed 21/10000 ... <04:38)
    assert bar.kwargs["total"] == 6 and bar.kwargs["unit"] == "req"
    assert sum(bar.updates) == 6 and all(n >= 0 for n in bar.updates) and bar.closed
    steps = int(re.match(r"wrote (\d+) steps", out)[1])
    assert int(bar.postfix.removeprefix("step ")) >= steps  # steps with nothing scheduled count too
    # cut short: the bar stops short of its total (and the run says so)
    status, out, _ = _main(["simulate", *small, "--max-steps", "3", "--quiet", "--no-compile"])
    assert status == 0 and "stopped at --max-steps 3" in out
    assert fake_tqdm[1].kwargs["total"] == 6 and sum(fake_tqdm[1].updates) < 6 and fake_tqdm[1].closed
    assert fake_tqdm[1].postfix == "step 3"
    # compare's simulated workload too; --no-progress: no bar
    assert _main(["compare", *small, "--layouts", "dcs", "--pcp-sizes", "2"])[0] == 0
    assert fake_tqdm[2].kwargs["total"] == 6 and sum(fake_tqdm[2].updates) == 6
    assert _main(["record", str(tmp_path / "u.jsonl"), *small, "--no-progress"])[0] == 0
    assert len(fake_tqdm) == 3


def test_record_checks_its_trace_path_before_the_simulation(tmp_path):
    huge = ["--requests", "5000", "--prompt-len", "2000", "--no-progress"]  # minutes to simulate
    for path in (tmp_path / "no" / "t.jsonl", tmp_path / "ro" / "t.jsonl"):
        t0 = time.perf_counter()
        if path.parent.name == "ro":
            if os.geteuid() == 0:
                continue  # root writes anywhere
            path.parent.mkdir(mode=0o500)
            message = f"{path}: Permission denied (its folder {path.parent})"
        else:  # before: found by write_trace, after the whole simulation
            message = f"{path}: No such file or directory (its folder {path.parent})"
        _one_line_error(["record", str(path), *huge], message)
        assert time.perf_counter() - t0 < 10
