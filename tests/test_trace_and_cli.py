"""Traces, deterministic replay and the pcp-fn command."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

import pcp_fn
from pcp_fn.sim import cli
from pcp_fn.sim.trace import TraceError, TraceStep, digest_of, parse_trace, read_trace, replay, write_trace

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "examples" / "traces" / "mixed_p4.jsonl"
BUNDLED_DIGEST = "77fe3f9815100c087350e96b0fab41650f46bb1b53a05d6446aab515aca16c27"


def test_bundled_trace_replays_to_its_digest_in_every_mode():
    eager = replay(BUNDLED)
    assert len(eager.outputs) == 35 and len(eager.outputs[0]) == 4
    assert eager.digest == BUNDLED_DIGEST
    # compiling costs a trace per bucket and rank: one rank is enough to compare the modes
    one = replay(BUNDLED, ranks=[3]).digest
    assert replay(BUNDLED, ranks=[3], mode="compiled", backend="eager").digest == one
    assert replay(BUNDLED, ranks=[3], mode="captured", backend="eager").digest == one


def test_rank_views_combine_into_the_same_digest():
    trace = read_trace(BUNDLED)
    per_rank = [replay(trace, ranks=[r]).outputs for r in range(4)]
    combined = [per_rank[r][s][0] for s in range(len(trace.steps)) for r in range(4)]
    assert digest_of(combined) == BUNDLED_DIGEST
    assert len({replay(trace, ranks=[r]).digest for r in range(4)}) == 4  # ranks do differ


def test_another_process_gets_the_same_digest():
    out = subprocess.run(
        [sys.executable, "-m", "pcp_fn.sim.cli", "replay", str(BUNDLED)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert out.stdout.split()[0] == BUNDLED_DIGEST


def _lines():
    return BUNDLED.read_text().splitlines()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
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
            r"line 6: num_scheduled_tokens sums to 300 tokens; max_num_tokens is 256",
        ),
        (
            lambda ls: ls.__setitem__(
                2, json.dumps({"num_scheduled": ["x"], "num_computed": [0], "num_prompt": [1]})
            ),
            r"line 3: field 'num_scheduled' must be a list of integers",
        ),
        (
            lambda ls: ls.__setitem__(
                2,
                json.dumps(
                    {"num_scheduled": [3], "num_computed": [0], "num_prompt": [3], "slot_mapping": [1]}
                ),
            ),
            r"line 3: field 'slot_mapping' has 1 entries for 3 scheduled tokens",
        ),
    ],
)
def test_malformed_traces_name_the_line_and_field(edit, match):
    lines = _lines()
    edit(lines)
    with pytest.raises(TraceError, match=match):
        parse_trace(lines)


def test_an_empty_trace_is_an_error():
    with pytest.raises(TraceError, match="empty"):
        parse_trace([])


def test_write_trace_round_trips_and_leaves_nothing_when_it_fails(tmp_path):
    trace = read_trace(BUNDLED)
    path = tmp_path / "t.jsonl"
    write_trace(path, trace.config, trace.steps)
    assert read_trace(path) == trace

    def broken():
        yield trace.steps[0]
        raise RuntimeError("scheduler died")

    target = tmp_path / "never.jsonl"
    with pytest.raises(RuntimeError):
        write_trace(target, trace.config, broken())
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
    # record twice: the same trace, byte for byte
    again = tmp_path / "again.jsonl"
    cli.main(["record", str(again), *small, "--no-progress"])
    assert again.read_bytes() == path.read_bytes()


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
    from pcp_fn.sim.engine import Runner, synthetic_requests

    cfg = pcp_fn.PCPConfig(2, 0, 4, 48)
    runner = Runner(cfg, synthetic_requests(5, max_prompt=90, seed=3))
    records = runner.run()
    steps = [
        TraceStep(r.sched.num_scheduled, r.sched.num_computed, r.sched.num_prompt, tuple(r.slot_mapping))
        for r in records
    ]
    write_trace(tmp_path / "e.jsonl", dataclasses.replace(cfg, pcp_rank=0), steps)
    result = replay(tmp_path / "e.jsonl", ranks=[0])
    for rec, (out,) in zip(records, result.outputs):
        assert pcp_fn.graph.capture._signature(*_flat(out)) == pcp_fn.graph.capture._signature(*_flat(rec.out))


def _flat(tree):
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten(tree)
    return spec, leaves
