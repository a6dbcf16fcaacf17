"""Traces, deterministic replay and the pcp-fn command."""

import dataclasses
import json
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import tree_equal
from torch._dynamo.utils import counters

import pcp_fn
from pcp_fn.sim import cli
from pcp_fn.sim.engine import Runner, synthetic_requests
from pcp_fn.sim.trace import (
    LIMITS,
    MAX_LINE_BYTES,
    TraceError,
    TraceStep,
    digest_of,
    parse_trace,
    read_trace,
    replay,
    write_trace,
)

pytestmark = pytest.mark.timeout(240)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "examples" / "traces" / "mixed_p4.jsonl"
BUNDLED_DIGEST = "77fe3f9815100c087350e96b0fab41650f46bb1b53a05d6446aab515aca16c27"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_bundled_trace_replays_to_its_digest_in_every_mode():
    eager = replay(BUNDLED)
    assert len(eager.outputs) == 35 and len(eager.outputs[0]) == 4
    assert eager.digest == BUNDLED_DIGEST
    # compiling costs a trace per bucket: one rank is enough to compare the modes
    one = replay(BUNDLED, ranks=[3]).digest
    assert replay(BUNDLED, ranks=[3], mode="compiled", backend="eager").digest == one
    assert replay(BUNDLED, ranks=[3], mode="captured", backend="eager").digest == one


def test_rank_views_combine_into_the_same_digest():
    trace = read_trace(BUNDLED)
    per_rank = [replay(trace, ranks=[r]).outputs for r in range(4)]
    combined = [per_rank[r][s][0] for s in range(len(trace.steps)) for r in range(4)]
    assert digest_of(combined) == BUNDLED_DIGEST
    assert len({replay(trace, ranks=[r]).digest for r in range(4)}) == 4  # ranks do differ


def test_another_process_gets_the_same_digest_and_checks_it():
    base = [sys.executable, "-m", "pcp_fn.sim.cli", "replay", str(BUNDLED), "--expect"]
    ok = subprocess.run([*base, BUNDLED_DIGEST], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split()[0] == BUNDLED_DIGEST
    bad = subprocess.run([*base, "0" * 64], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1
    assert bad.stderr == f"pcp-fn replay: digest mismatch: expected {'0' * 64}, got {BUNDLED_DIGEST}\n"


# -- one graph per bucket (issue 11) ----------------------------------------------------------------


def _record(tmp_path, *flags):
    path = tmp_path / "long.jsonl"
    assert cli.main(["record", str(path), *flags, "--no-progress"]) == 0
    return path


LONG = ["-P", "4", "--requests", "120", "--prompt-len", "1:200", "--output-len", "1:24"]
LONG += ["--max-num-reqs", "8", "--max-num-tokens", "64"]


def test_a_long_trace_compiles_one_graph_per_bucket_with_the_default_recompile_limit(tmp_path, capsys):
    limit = torch._dynamo.config.recompile_limit
    path = _record(tmp_path, *LONG)
    trace = read_trace(path)
    buckets = {pcp_fn.make_batch(trace.config, *dataclasses.astuple(s)[:3]).bucket for s in trace.steps}
    lengths = {sum(s.num_scheduled) for s in trace.steps}
    assert len(trace.steps) > 200 and len(lengths) > 2 * len(buckets)  # many lengths per bucket
    assert len(buckets) > limit  # more buckets than one code object may compile
    eager = replay(trace)
    compiled = replay(trace, mode="compiled", backend="eager")
    assert compiled.digest == eager.digest
    assert compiled.num_graphs == len(buckets)
    assert counters["stats"]["unique_graphs"] == len(buckets)
    assert torch._dynamo.config.recompile_limit == limit


def test_the_engine_with_a_compiled_step_compiles_one_graph_per_bucket():
    cfg = pcp_fn.PCPConfig(2, 1, 4, 32)
    step_fn = pcp_fn.graph.compile_per_bucket(pcp_fn.step, backend="eager")
    records = Runner(cfg, synthetic_requests(12, max_prompt=80, seed=5), step_fn=step_fn).run()
    eager = Runner(cfg, synthetic_requests(12, max_prompt=80, seed=5)).run()
    buckets = {pcp_fn.make_batch(cfg, *dataclasses.astuple(r.sched)[2:5]).bucket for r in records}
    assert len({r.sched.num_tokens for r in records}) > len(buckets)
    assert len(step_fn) == counters["stats"]["unique_graphs"] == len(buckets)
    for got, want in zip(records, eager):
        assert tree_equal(got.out, want.out)


def test_simulate_compiles_the_busiest_bucket_once(capsys):
    small = ["-P", "2", "--requests", "6", "--prompt-len", "1:60", "--max-num-reqs", "4"]
    assert (
        cli.main(
            ["simulate", *small, "--max-num-tokens", "32", "--quiet", "--no-progress", "--backend", "eager"]
        )
        == 0
    )
    assert "compiled" in capsys.readouterr().out
    assert counters["stats"]["unique_graphs"] == 1


# -- malformed traces -------------------------------------------------------------------------------


def _lines():
    return BUNDLED.read_text().splitlines()


def _step(**fields):
    return json.dumps({"num_scheduled": [3], "num_computed": [0], "num_prompt": [3], **fields})


def _header(**config):
    base = {"pcp_size": 2, "max_num_reqs": 4, "max_num_tokens": 32}
    return json.dumps({"format": "pcp_fn.trace", "version": 1, "config": {**base, **config}})


MALFORMED = [
    (lambda ls: ls.__setitem__(2, ls[2][:-3]), r"line 3: not valid JSON"),
    (lambda ls: ls.__setitem__(0, ls[0].replace("pcp_fn.trace", "other")), r"line 1: field 'format'"),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"max_num_tokens": 256, ', "")),
        r"line 1: field 'config.max_num_tokens' is missing",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"pcp_size": 4', '"pcp_size": 0')),
        r"line 1: field 'config': pcp_size must be >= 1",
    ),
    (
        lambda ls: ls.__setitem__(1, json.dumps({"num_scheduled": [1], "num_prompt": [1]})),
        r"line 2: field 'num_computed' is missing",
    ),
    (
        lambda ls: ls.__setitem__(
            3, json.dumps({"num_scheduled": [1, -4], "num_computed": [0, 0], "num_prompt": [1, 4]})
        ),
        r"line 4: field 'num_scheduled'\[1\] = -4 is negative",
    ),
    (
        lambda ls: ls.__setitem__(
            5, json.dumps({"num_scheduled": [300], "num_computed": [0], "num_prompt": [300]})
        ),
        r"line 6: field 'num_scheduled' sums to 300 tokens; max_num_tokens is 256",
    ),
    (
        lambda ls: ls.__setitem__(
            2, json.dumps({"num_scheduled": ["x"], "num_computed": [0], "num_prompt": [1]})
        ),
        r"line 3: field 'num_scheduled' must be a list of integers",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(slot_mapping=[1])),
        r"line 3: field 'slot_mapping' has 1 entries for 3 scheduled tokens",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(num_prompt=[3, 3])),
        r"line 3: fields differ in length \(one entry per request\): 'num_scheduled' has 1, "
        r"'num_computed' has 1, 'num_prompt' has 2",
    ),
    (
        lambda ls: ls.__setitem__(
            2, json.dumps({name: [1] * 9 for name in ("num_scheduled", "num_computed", "num_prompt")})
        ),
        r"line 3: field 'num_scheduled' has 9 requests; max_num_reqs is 8",
    ),
    (
        lambda ls: ls.__setitem__(
            2, json.dumps({"num_scheduled": [4, 1], "num_computed": [0, 5], "num_prompt": [4, 5]})
        ),
        r"line 3: request 1 is a decode .* but comes after prefill request 0; decodes must come first",
    ),
    (
        lambda ls: ls.__setitem__(
            0,
            ls[0]
            .replace('"max_num_tokens": 256', '"max_num_tokens": 1048576')
            .replace('"pcp_size": 4', '"pcp_size": 64'),
        ),
        r"line 1: field 'config.pcp_size': 64 ranks of 1048584 local tokens make 67109376 gathered rows; "
        r"a trace allows 16777216",
    ),
    # issue 11: wrong types, huge integers, the right field blamed, unknown and duplicate keys
    (
        lambda ls: ls.__setitem__(
            0, ls[0].replace('"request_buckets": [1, 2, 4, 8]', '"request_buckets": 5')
        ),
        r"line 1: field 'config.request_buckets' must be a list of integers, got integer",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"hybrid_attn": false', '"hybrid_attn": 0')),
        r"line 1: field 'config.hybrid_attn' must be a boolean, got integer",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"max_num_reqs": 8', '"max_num_reqs": 1e8')),
        r"line 1: field 'config.max_num_reqs' must be an integer, got number",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"max_num_reqs": 8', '"max_num_reqs": 100000000')),
        rf"line 1: field 'config.max_num_reqs' = 100000000 exceeds the trace limit {LIMITS['max_num_reqs']}",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"max_num_reqs": 8', '"max_num_reqs": ' + "9" * 5000)),
        r"line 1: field 'config.max_num_reqs' = 999999999999\.\.\. \(5000 digits\) exceeds the trace limit",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"token_buckets": [', '"token_buckets": [' + "3, " * 70)),
        r"line 1: field 'config.token_buckets' has 80 sizes; a trace allows 64",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(slot_mapping=[0, 2**63, 1])),
        r"line 3: field 'slot_mapping'\[1\] = 9223372036854775808 exceeds the int64 limit",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(slot_mapping=[0, -(2**63) - 1, 1])),
        r"line 3: field 'slot_mapping'\[1\] = -9223372036854775809 is below -9223372036854775808",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(slot_mapping=[0, 1, 0.5])),
        r"line 3: field 'slot_mapping' must be a list of integers \(slot_mapping\[2\] is number\)",
    ),
    (
        lambda ls: ls.__setitem__(
            2, _step(slot_mapping=[0, 1, 2]).replace("1, 2]", "1, " + "7" * 4400 + "]")
        ),
        r"line 3: field 'slot_mapping'\[2\] = 777777777777\.\.\. \(4400 digits\) exceeds the int64 limit",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(num_scheduled=[2147483648], slot_mapping=[0, 1, 2])),
        r"line 3: field 'num_scheduled'\[0\] = 2147483648 exceeds the int32 limit 2147483647",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(slot_maping=[0, 1, 2])),
        r"line 3: field 'slot_maping' is not a step field \(expected one of step, num_scheduled, ",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0].replace('"dcp_size": 1', '"dcp_sise": 1')),
        r"line 1: field 'config.dcp_sise' is not a PCPConfig field",
    ),
    (
        lambda ls: ls.__setitem__(0, ls[0][:-1] + ', "comment": "x"}'),
        r"line 1: field 'comment' is not a header field",
    ),
    (
        lambda ls: ls.__setitem__(2, _step()[:-1] + ', "num_computed": [1]}'),
        r"line 3: field 'num_computed' appears twice",
    ),
    (
        lambda ls: ls.__setitem__(2, _step(step="two")),
        r"line 3: field 'step' must be an integer, got string",
    ),
    # issue 20: step numbers must follow the file's order (swapped, missing, repeated)
    (
        lambda ls: ls.__setitem__(slice(1, 3), [ls[2], ls[1]]),
        r"line 2: field 'step' = 1 is out of order; this is step 0",
    ),
    (lambda ls: ls.__delitem__(2), r"line 3: field 'step' = 2 is out of order; this is step 1"),
    (lambda ls: ls.__setitem__(2, ls[1]), r"line 3: field 'step' = 0 is out of order; this is step 1"),
    (
        lambda ls: ls.__setitem__(4, "[" * 100_000 + "]" * 100_000),
        r"line 5: not valid JSON \(nested too deeply\)",
    ),
    (lambda ls: ls.__setitem__(4, "[1, 2]"), r"line 5: expected a JSON object, got list"),
    (
        lambda ls: ls.__setitem__(4, _step(num_prompt=[NaN])),
        r"line 5: not valid JSON \(NaN is not a JSON number\)",
    ),
]
NaN = float("nan")


@pytest.mark.parametrize(("edit", "match"), MALFORMED)
def test_malformed_traces_name_the_line_and_field(edit, match):
    lines = _lines()
    edit(lines)
    with pytest.raises(TraceError, match=match):
        parse_trace(lines)


def test_every_malformed_trace_exits_2_with_one_line(tmp_path, capsys):
    for i, (edit, match) in enumerate(MALFORMED):
        lines = _lines()
        edit(lines)
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        assert cli.main(["replay", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("pcp-fn replay: error: line "), err[:300]
        assert re.search(match, err), err[:300]


def test_header_limits_come_before_any_allocation():
    header = _header(max_num_reqs=LIMITS["max_num_reqs"] + 1)
    assert len(header) < 300
    t0 = time.perf_counter()
    with pytest.raises(TraceError, match="exceeds the trace limit"):
        parse_trace([header])
    assert time.perf_counter() - t0 < 0.5


def test_non_utf8_bytes_name_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(_header().encode() + b"\n" + _step().encode()[:-1] + b', "x\xe9": 1}\n')
    with pytest.raises(TraceError, match=r"line 2: not valid UTF-8 \(byte 0xe9 at column "):
        read_trace(path)


def test_a_line_past_the_limit_is_not_read_whole(tmp_path):
    path = tmp_path / "long-line.jsonl"
    with open(path, "wb") as f:
        f.write(_header().encode() + b"\n" + b" " * (MAX_LINE_BYTES + 10) + b"{}\n")
    with pytest.raises(TraceError, match=f"line 2: longer than {MAX_LINE_BYTES} bytes"):
        read_trace(path)


def test_an_empty_trace_is_an_error():
    with pytest.raises(TraceError, match="empty"):
        parse_trace([])


def test_command_line_errors_never_print_a_traceback(tmp_path, capsys):
    """A directory, a missing file, non-UTF-8 bytes, a huge integer: status 2 and one line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(_header().encode() + b"\n\xff\xfe\n")
    huge = tmp_path / "huge.jsonl"
    huge.write_text(_header() + "\n" + _step(slot_mapping=[0, 1, 2**63]) + "\n")
    cases = {
        str(tmp_path / "missing.jsonl"): f"pcp-fn replay: error: {tmp_path / 'missing.jsonl'}: No such file",
        str(bad): "pcp-fn replay: error: line 2: not valid UTF-8 (byte 0xff at column 1)",
        str(huge): "pcp-fn replay: error: line 2: field 'slot_mapping'[2] = 9223372036854775808 exceeds",
    }
    for path, message in cases.items():
        assert cli.main(["replay", path]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err
    # and in a process of its own: nothing escapes main
    out = subprocess.run(
        [sys.executable, "-m", "pcp_fn.sim.cli", "replay", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and out.stderr == f"pcp-fn replay: error: {tmp_path}: Is a directory\n"


# -- writing ----------------------------------------------------------------------------------------


def test_write_trace_round_trips_and_leaves_nothing_when_it_fails(tmp_path):
    trace = read_trace(BUNDLED)
    path = tmp_path / "t.jsonl"
    assert write_trace(path, trace.config, trace.steps) == len(trace.steps)
    assert read_trace(path) == trace
    assert path.read_bytes() == BUNDLED.read_bytes()

    def broken():
        yield trace.steps[0]
        raise RuntimeError("scheduler died")

    target = tmp_path / "never.jsonl"
    with pytest.raises(RuntimeError):
        write_trace(target, trace.config, broken())
    with pytest.raises(FileExistsError):
        write_trace(path, trace.config, trace.steps[:1], overwrite=False)
    assert read_trace(path) == trace
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_simulate_record_replay_through_the_command(tmp_path, capsys):
    small = [
        "-P",
        "2",
        "--requests",
        "6",
        "--prompt-len",
        "1:60",
        "--max-num-reqs",
        "4",
        "--max-num-tokens",
        "32",
    ]
    assert cli.main(["simulate", *small, "--no-compile", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "summary: P=2" in out and "restore check" in out and "attention work per rank" in out
    path = tmp_path / "sim.jsonl"
    assert cli.main(["record", str(path), *small, "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["replay", str(path)]) == 0
    digest = capsys.readouterr().out.split()[0]
    assert digest == replay(path).digest
    assert cli.main(["replay", str(path), "--expect", digest.upper()]) == 0
    assert cli.main(["replay", str(path), "--expect", "f" * 64]) == 1
    assert "digest mismatch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["replay", str(path), "--expect", "abc"])
    assert e.value.code == 2 and "64 hex digits" in capsys.readouterr().err
    # record refuses to overwrite without --force, and leaves the file alone
    before = path.read_bytes()
    assert cli.main(["record", str(path), *small, "--seed", "1", "--no-progress"]) == 2
    assert "exists; pass --force to overwrite it" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert cli.main(["record", str(path), *small, "--seed", "1", "--force", "--no-progress"]) == 0
    assert path.read_bytes() != before
    assert cli.main(["record", str(tmp_path), *small, "--force", "--no-progress"]) == 2
    assert "is a directory" in capsys.readouterr().err
    # record twice: the same trace, byte for byte
    again = tmp_path / "again.jsonl"
    cli.main(["record", str(again), *small, "--seed", "1", "--no-progress"])
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_record_leaves_no_file_behind(tmp_path, sig, status):
    out = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pcp_fn.sim.cli",
            "record",
            str(out),
            "--requests",
            "5000",
            "--prompt-len",
            "1:100",
            "--no-progress",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as a terminal delivers it, whatever this process inherited: a job a shell starts
        # in the background ignores SIGINT, and so would the child (a CI launched so failed here)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(".trace-") for p in tmp_path.iterdir()):  # streaming to disk
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, err
    assert err.endswith(("interrupted\n", "terminated\n")) and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


_SLOW_WRITER = """
import sys, time
from pcp_fn.sim.trace import read_trace, write_trace

trace = read_trace(sys.argv[1])

def steps():  # the scheduler stalls after two steps, the temporary file half written
    yield from trace.steps[:2]
    print("writing", flush=True)
    while True:
        time.sleep(0.05)

write_trace(sys.argv[2], trace.config, steps())
"""


def test_write_trace_removes_its_temporary_file_when_terminated(tmp_path):
    # issue 20: the library function itself, with no handler of its caller's (the CLI installs one)
    out = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, str(BUNDLED), str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "writing\n", proc.stderr.read()
        assert [p.name.startswith(".trace-") for p in tmp_path.iterdir()] == [True]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGTERM, err  # still ended by the signal, as by default
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_write_trace_restores_the_sigterm_handler_and_keeps_the_callers(tmp_path):
    trace = read_trace(BUNDLED)
    seen = []

    def steps():
        seen.append(signal.getsignal(signal.SIGTERM))
        yield from trace.steps[:1]

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        write_trace(tmp_path / "a.jsonl", trace.config, steps())
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
        assert seen[-1] not in (signal.SIG_DFL, mine)  # a handler of its own while it wrote
        signal.signal(signal.SIGTERM, mine)
        write_trace(tmp_path / "b.jsonl", trace.config, steps())
        assert seen[-1] is mine and signal.getsignal(signal.SIGTERM) is mine  # the caller's, untouched
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_command_errors_are_clear(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["simulate", "--pcp-size", "0"])
    assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "pcp_fn.trace", "version": 1, "config": {"pcp_size": 2}}\n')
    assert cli.main(["replay", str(bad)]) == 2
    assert "line 1: field 'config.max_num_reqs' is missing" in capsys.readouterr().err
    assert cli.main(["replay", str(tmp_path / "missing.jsonl")]) == 2


def test_trace_steps_match_the_engine(tmp_path):
    cfg = pcp_fn.PCPConfig(2, 0, 4, 48)
    runner = Runner(cfg, synthetic_requests(5, max_prompt=90, seed=3))
    records = runner.run()
    steps = [
        TraceStep(r.sched.num_scheduled, r.sched.num_computed, r.sched.num_prompt, tuple(r.slot_mapping))
        for r in records
    ]
    write_trace(tmp_path / "e.jsonl", cfg, steps)
    result = replay(tmp_path / "e.jsonl", ranks=[0])
    for rec, (out,) in zip(records, result.outputs):
        assert tree_equal(out, rec.out)


def test_importing_pcp_fn_leaves_the_simulator_alone():
    code = "import sys, pcp_fn; print(sorted(m for m in sys.modules if m.startswith('pcp_fn.sim')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_trace_header_holds_every_config_field_but_the_rank():
    import dataclasses

    from pcp_fn.sim import trace

    fields = {f.name for f in dataclasses.fields(pcp_fn.PCPConfig)} - {"pcp_rank"}
    assert sorted(trace.CONFIG_FIELDS) == sorted(fields)
