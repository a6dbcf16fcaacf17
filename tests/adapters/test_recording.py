"""Recording an engine's schedule (pcp_fn.adapters.recording) and replaying it (pcp_fn.sim.trace v2).

The recorder's guarantees, each provoked for real: a background writer (a stalled one stops the
recording, serving goes on), whole lines only (a short write is cut back, a SIGKILLed process
leaves a trace that parses and replays), the size limit, a failing disk, one log line per stop.
Then the vLLM drop-in over the stand-in: the steps it was given are the steps recorded, and the
replay through ``pcp_fn.mrv2`` gives rank 0 the local rows the drop-in served.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch
import vllm_standin as standin
from vllm_lockstep import Case, Summary, make_global_batch, runner_steps

import pcp_fn
from pcp_fn.adapters import recording, trace_writer
from pcp_fn.adapters.recording import RECORD_ENV, TraceRecorder, record_path
from pcp_fn.sim import trace as T

CFG = pcp_fn.PCPConfig(2, 0, 8, 64, layout="mrv2")
ENGINE = T.EngineInfo("vllm", "0.32.0", "FunctionalPCPManager")
STEPS = [  # (scheduled, computed, prefill_len, is_prefilling): the engine's order, decodes anywhere
    ([1, 5, 8], [3, 0, 0], [3, 5, 8], [False, True, True]),
    ([5, 1, 1], [0, 5, 8], [6, 5, 8], [True, False, False]),
    ([1, 1, 1], [5, 6, 9], [6, 5, 8], [True, False, False]),
]


def _record(rec: TraceRecorder, sched, computed, prompt, prefilling, idx=None, desc=None) -> None:
    a = lambda x: np.asarray(x, np.int32)  # noqa: E731
    idx = None if idx is None else np.asarray(idx, np.intp)
    rec.record(a(sched), a(computed), a(prompt), np.asarray(prefilling, bool), idx, desc)


def _lines(path) -> list[bytes]:
    return open(path, "rb").read().splitlines(keepends=True)


def test_a_recording_reads_back_step_for_step_and_replays_bit_identically(tmp_path):
    path = tmp_path / "t.jsonl"
    rec = TraceRecorder(path, CFG, ENGINE)
    desc = T.BatchDesc("PIECEWISE", 16, None, None)
    for i, s in enumerate(STEPS):
        _record(rec, *s, idx=[2, 0, 1][: len(s[0])], desc=desc if i == 1 else None)
    rec.close()
    assert rec.stats.steps_written == 3 and rec.stats.stopped is None
    assert rec.stats.bytes_written == os.path.getsize(path)
    trace = T.read_trace(path)
    assert trace.engine == ENGINE and trace.config.layout == "mrv2"
    for got, (sched, computed, prompt, prefilling) in zip(trace.steps, STEPS, strict=True):
        assert (got.num_scheduled, got.num_computed, got.num_prompt) == (
            tuple(sched),
            tuple(computed),
            tuple(prompt),
        )
        assert got.is_prefilling == tuple(prefilling) and got.idx_mapping == (2, 0, 1)
    assert trace.steps[1].batch_desc == desc and trace.steps[0].batch_desc is None
    eager = T.replay(path)
    assert T.replay_digest(path).digest == eager.digest
    assert T.replay_digest(path, mode="compiled", backend="eager").digest == eager.digest
    # the replay is pcp_fn.mrv2's partition of the engine's rows: step 0, rank 0
    layout, local = eager.outputs[0][0]
    # the decode; request 1's head chunk (c = ceil(5 / 4) = 2; its tail chunk is empty); request 2's
    # head and tail chunks (c = 2), one row each
    assert local.num_scheduled_tokens[: int(local.num_reqs)].tolist() == [1, 2, 2, 2]
    assert local.idx_mapping[: int(local.num_reqs)].tolist() == [2, 0, 1, 1]


def test_version_1_readers_are_unaffected_and_engine_fields_stay_in_engine_traces(tmp_path):
    plain = tmp_path / "plain.jsonl"
    T.write_trace(plain, pcp_fn.PCPConfig(2, 0, 8, 64), [T.TraceStep((1, 5), (3, 0), (3, 5))])
    assert b'"version": 1' in _lines(plain)[0] and b"engine" not in _lines(plain)[0]
    with pytest.raises(T.TraceError, match="line 2: field 'is_prefilling' belongs to an engine's trace"):
        T.parse_trace(
            [_lines(plain)[0], b'{"num_scheduled": [1], "num_computed": [0], "num_prompt": [1], '
             b'"is_prefilling": [true]}']
        )  # fmt: skip
    header = T.header_line(CFG, ENGINE)
    with pytest.raises(T.TraceError, match="field 'engine' needs version 2"):
        T.parse_trace([header.replace('"version": 2', '"version": 1')])
    # an engine's DualChunkSwap trace (vllm-ascend 0.23) is the scheduler's arrays, decodes first
    dcs = T.header_line(pcp_fn.PCPConfig(2, 0, 8, 64), T.EngineInfo("vllm-ascend", "0.23", "M"))
    step = '{"num_scheduled": [1, 5], "num_computed": [3, 0], "num_prompt": [3, 5]'
    assert len(T.parse_trace([dcs, step + "}"]).steps) == 1
    with pytest.raises(T.TraceError, match="line 2: field 'is_prefilling' belongs to an engine's trace of"):
        T.parse_trace([dcs, step + ', "is_prefilling": [false, true]}'])


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('"is_prefilling": [true, 1, false]', "'is_prefilling' must be a list of booleans"),
        ('"is_prefilling": [true, false]', "fields differ in length .* 'is_prefilling' has 2"),
        ('"is_prefilling": [false, true, true], "idx_mapping": [0, -1, 2]', r"'idx_mapping'\[1\] = -1 is"),
        ('"is_prefilling": [false, true, true], "batch_desc": {"cg_mode": "FAST", "num_tokens": 8}',
         "'batch_desc.cg_mode' must be one of NONE, PIECEWISE, FULL, got 'FAST'"),
        ('"is_prefilling": [false, true, true], "batch_desc": {"cg_mode": "FULL", "num_tokenz": 8}',
         "'batch_desc.num_tokenz' is not a batch_desc field"),
        ('"idx_mapping": [0, 1, 2]', "field 'is_prefilling' is missing"),
    ],
)  # fmt: skip
def test_a_corrupted_recorded_line_is_refused_with_its_line_and_field(line, match):
    step = '{"step": 0, "num_scheduled": [1, 5, 8], "num_computed": [3, 0, 0], "num_prompt": [3, 5, 8], '
    with pytest.raises(T.TraceError, match="line 2: .*" + match):
        T.parse_trace([T.header_line(CFG, ENGINE), step + line + "}"])


def test_path_placeholder_environment_and_an_existing_file(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    assert record_path(None) is None
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "r-{pid}.jsonl"))
    assert record_path(None) == str(tmp_path / f"r-{os.getpid()}.jsonl")
    assert record_path(tmp_path / "x.jsonl") == str(tmp_path / "x.jsonl")  # the argument wins
    TraceRecorder(tmp_path / "x.jsonl", CFG, ENGINE).close()
    with pytest.raises(FileExistsError):  # a restart never overwrites an earlier recording
        TraceRecorder(tmp_path / "x.jsonl", CFG, ENGINE)
    with pytest.raises(ValueError, match="max_pending must be a positive int"):
        TraceRecorder(tmp_path / "y.jsonl", CFG, ENGINE, max_pending=0)


def _stopped_once(caplog, rec: TraceRecorder, reason: str) -> None:
    stops = [r for r in caplog.records if "recording to" in r.getMessage()]
    assert len(stops) == 1 and reason in stops[0].getMessage(), [r.getMessage() for r in stops]
    assert rec.stats.stopped is not None and not rec.recording
    assert all(line.endswith(b"\n") for line in _lines(rec.path))
    assert len(T.read_trace(rec.path).steps) == rec.stats.steps_written


def test_a_stalled_feeder_stops_the_recording_and_serving_goes_on(tmp_path, monkeypatch, caplog):
    release = threading.Event()
    real = recording.trace_writer.encode_frame

    def slow_encode(*args):
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(recording.trace_writer, "encode_frame", slow_encode)
    rec = TraceRecorder(tmp_path / "t.jsonl", CFG, ENGINE, max_pending=4)
    with caplog.at_level(logging.WARNING, "pcp_fn.adapters"):
        _record(rec, *STEPS[0])
        deadline = time.monotonic() + 5
        while rec._pending and time.monotonic() < deadline:  # the feeder holds step 0
            time.sleep(0.001)
        start = time.perf_counter()
        for _ in range(100):  # never blocks: the queue fills, then record() is a no-op
            _record(rec, *STEPS[1])
        assert time.perf_counter() - start < 1.0
        release.set()
        rec.close()
    _stopped_once(caplog, rec, "the writer is 4 steps behind (max_pending=4)")
    assert rec.stats.steps_written == 1  # what the feeder had taken; the queue was dropped


def test_the_size_limit_keeps_whole_lines(tmp_path, caplog):
    header = len(T.header_line(CFG, ENGINE).encode())
    rec = TraceRecorder(tmp_path / "t.jsonl", CFG, ENGINE, max_bytes=header + 300)
    with caplog.at_level(logging.WARNING, "pcp_fn.adapters"):
        for _ in range(20):
            _record(rec, *STEPS[0])
            time.sleep(0.002)  # the writer stops while steps still come: record() stays quiet
        rec.close()
    _stopped_once(caplog, rec, f"the trace reached max_bytes={header + 300}")
    assert 0 < rec.stats.steps_written < 20 and os.path.getsize(rec.path) <= header + 300


def _frames(*steps) -> io.BufferedReader:
    data = b"".join(trace_writer.encode_frame(*map(np.asarray, s)) for s in steps)
    return io.BufferedReader(io.BytesIO(data))


def test_the_writer_cuts_a_short_write_back_to_whole_lines(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    path.write_bytes(T.header_line(CFG, ENGINE).encode())
    real_write = os.write

    def half_write(fd, data):  # a disk that fills in the middle of the second write
        half_write.calls += 1
        return real_write(fd, data if half_write.calls == 1 else data[: len(data) // 2])

    half_write.calls = 0
    monkeypatch.setattr(trace_writer.os, "write", half_write)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    writer = trace_writer.LineWriter(fd, 1 << 20)
    trace_writer.run(_frames(STEPS[0]), writer)
    trace_writer.run(_frames(STEPS[1], STEPS[2]), writer)
    os.close(fd)
    assert writer.steps == 1 and "writing failed" in writer.stopped
    assert writer.size == os.path.getsize(path) and len(T.read_trace(path).steps) == 1


def test_a_writer_that_ends_is_logged_once_and_serving_goes_on(tmp_path, caplog):
    rec = TraceRecorder(tmp_path / "t.jsonl", CFG, ENGINE)
    with caplog.at_level(logging.WARNING, "pcp_fn.adapters"):
        _record(rec, *STEPS[0])
        rec._writer.kill()  # the writer gone (killed, out of memory): the feeder's write fails
        deadline = time.monotonic() + 10
        while rec.stats.stopped is None and time.monotonic() < deadline:
            _record(rec, *STEPS[1])
            time.sleep(0.005)
        rec.close()
        _record(rec, *STEPS[2])  # after the stop: nothing, no error
    stops = [r.getMessage() for r in caplog.records if "recording to" in r.getMessage()]
    assert len(stops) == 1 and "the writer process ended" in stops[0], stops
    assert all(line.endswith(b"\n") for line in _lines(rec.path))
    T.read_trace(rec.path)  # the lines written before parse


KILLED = textwrap.dedent(
    """
    import sys, time, numpy as np, pcp_fn
    from pcp_fn.adapters.recording import TraceRecorder
    from pcp_fn.sim.trace import EngineInfo
    config = pcp_fn.PCPConfig(2, 0, 8, 64, layout="mrv2")
    rec = TraceRecorder(sys.argv[1], config, EngineInfo("vllm", "t", "M"))
    print(rec._writer.pid, flush=True)
    i = 0
    while True:
        n = 1 + i % 40
        rec.record(np.array([1, n], np.int32), np.array([n, 0], np.int32), np.array([1, n], np.int32),
                   np.array([False, True]))
        i += 1
        time.sleep(0.0002)  # an engine's step rate, not a tight loop's
    """
)


def test_a_killed_engine_leaves_a_trace_whose_lines_replay(tmp_path):
    """SIGKILL the engine: its writer reads what was sent, writes it as whole lines, and ends."""
    path = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE, text=True)
    writer_pid = int(proc.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while path.stat().st_size < 200_000 and time.monotonic() < deadline:
            assert proc.poll() is None, "the recording process ended early"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{writer_pid}") and time.monotonic() < deadline:  # it drains, then ends
        with open(f"/proc/{writer_pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":  # a zombie: ended (its parent died)
                break
        time.sleep(0.01)
    lines = _lines(path)
    assert len(lines) > 100 and all(line.endswith(b"\n") for line in lines)
    assert T.replay_digest(path, ranks=[0]).num_steps == len(lines) - 1


# -- the vLLM drop-in (stand-in names) ---------------------------------------------------------


def _standin_manager(**kw):  # record_schedule= passes through
    from test_vllm_adapter import StandinManager

    tables = standin.BlockTables([4], 8, 48, [64], torch.device("cpu"))
    base = dict(pcp_world_size=2, device="cpu", shard_decode_requests=True, max_num_reqs=8)
    return StandinManager(**base, max_num_tokens=48, block_tables=tables, **kw), tables


def _served_steps(manager, tables):
    """Drive the simulator's schedule (rows shuffled every 4th step) through `manager`; what it
    served: (the runner step, local rows, idx_mapping, query_start_loc, real positions)."""
    from test_vllm_adapter import STANDIN_API

    Desc, Mode = standin.BatchExecutionDescriptor, standin.CUDAGraphMode
    case = Case(P=2, R=8, T=48, requests=8, seed=3, max_steps=25)
    for rs in runner_steps(case, [tables], np.random.default_rng(0), Summary()):
        desc = Desc(cg_mode=Mode.NONE, num_tokens=0, num_reqs=None)
        batch = make_global_batch(STANDIN_API, rs.step, desc, rs.order, torch.device("cpu"))
        local = manager.partition_batch(batch, desc)
        n = local.num_reqs
        yield (
            rs,
            n,
            local.idx_mapping_np[:n].tolist(),
            local.query_start_loc_np[: n + 1].tolist(),
            (local.positions[: local.num_tokens].tolist()),
        )


def test_the_drop_in_records_what_it_serves_and_the_replay_gives_the_same_rows(tmp_path, monkeypatch):
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "served-{pid}.jsonl"))
    manager, tables = _standin_manager(pcp_rank=0)
    other, _ = _standin_manager(pcp_rank=1)  # one process records: PCP rank 0 without torch.distributed
    assert other.bookkeeper.recorder is None
    served = list(_served_steps(manager, tables))
    recorder = manager.bookkeeper.recorder
    recorder.close()
    assert recorder.path == str(tmp_path / f"served-{os.getpid()}.jsonl")
    trace = T.read_trace(recorder.path)
    assert trace.engine.manager == "StandinManager" and trace.config.layout == "mrv2-sharded"
    assert len(trace.steps) == len(served) >= 20
    assert any(s.is_prefilling != tuple(sorted(s.is_prefilling)) for s in trace.steps)  # shuffled rows
    replayed = T.replay(trace, ranks=[0])
    for s, (rs, n, idx, qsl, positions), out in zip(trace.steps, served, replayed.outputs, strict=True):
        assert s.num_scheduled == tuple(rs.sched.tolist())
        assert s.is_prefilling == tuple(rs.prefilling.tolist())
        _, local = out[0]
        assert int(local.num_reqs) == n and local.idx_mapping[:n].tolist() == idx
        assert local.query_start_loc[: n + 1].tolist() == qsl
        assert local.positions[: int(local.num_tokens)].tolist() == positions


def test_no_recording_without_a_path(monkeypatch):
    monkeypatch.delenv(RECORD_ENV, raising=False)
    manager, _ = _standin_manager(pcp_rank=0)
    assert manager.bookkeeper.recorder is None


def test_check_replay_turns_a_recording_into_a_regression_test(tmp_path, capsys):
    from pcp_fn.sim import check_replay
    from pcp_fn.sim.cli import main

    path = tmp_path / "incident.jsonl"
    rec = TraceRecorder(path, CFG, ENGINE)
    for s in STEPS:
        _record(rec, *s)
    rec.close()
    assert main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    digest = out.split()[0]
    assert "(3 steps, mode eager; recorded by vllm 0.32.0's FunctionalPCPManager" in out
    check_replay(path, digest, modes=("eager", "compiled"), backend="eager")
    check_replay(_lines(path), digest, modes=("eager",))
    with pytest.raises(AssertionError, match=f"in mode 'eager' gives digest {digest}; expected 0+"):
        check_replay(path, "0" * 64)


def test_compare_reads_an_engine_trace_decodes_first(tmp_path, capsys):
    from pcp_fn.sim.cli import main

    path = tmp_path / "t.jsonl"
    rec = TraceRecorder(path, CFG, ENGINE)
    for s in STEPS:  # steps 1, 2: a prompt chunk before decodes, as vLLM's runner may order them
        _record(rec, *s)
    rec.close()
    out = tmp_path / "c.json"
    assert main(["compare", str(path), "--pcp-sizes", "2", "--layouts", "dcs,mrv2", "--json", str(out)]) == 0
    capsys.readouterr()
    rows = {r["layout"]: r for r in json.loads(out.read_text())["rows"]}
    total = sum(sum(s[0]) for s in STEPS)
    # every token once, plus a second copy of each of the 5 decodes (mrv2 replicates them; step 2's
    # request 0 is a prompt's last token, split, not a decode)
    assert sum(rows["mrv2"]["per_rank"]["tokens"]) == total + 5, rows["mrv2"]


@pytest.mark.parametrize("seed", range(5))
def test_the_writers_lines_are_the_traces_step_lines_exactly(seed):
    # the writer runs without pcp_fn (a script): its copies of the format's names must be the format's
    assert trace_writer.CG_MODES == T.CG_MODES and trace_writer.DESC_FIELDS == T.BatchDesc._fields
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 9))
    arrays = [rng.integers(0, 2**31 - 1, n).astype(np.int32) for _ in range(3)]
    flags, idx = rng.random(n) < 0.5, rng.integers(0, 2**40, n).astype(np.int64)
    descs = (T.BatchDesc("FULL", 16, 4, 2), T.BatchDesc("NONE", 0, None))
    for extra in ((None, None), (idx, None), (idx, descs[0]), (None, descs[1])):
        step = T.TraceStep(
            *(tuple(a.tolist()) for a in arrays),
            is_prefilling=tuple(flags.tolist()),
            idx_mapping=None if extra[0] is None else tuple(extra[0].tolist()),
            batch_desc=extra[1],
        )
        frame = trace_writer.encode_frame(*arrays, flags, *extra)
        size, count, bits = trace_writer.FRAME.unpack_from(frame)
        decoded = trace_writer.decode_frame(frame[trace_writer.FRAME.size :], count, bits)
        assert size == len(frame) - trace_writer.FRAME.size and count == n
        assert trace_writer.engine_step_line(3, *decoded) == T.step_line(3, step)


# -- a recorded schedule against vLLM's own manager (pcp-fn replay --against vllm) -------------


def _standin_names(drop_in=None):
    from oracle_vllm import OracleManager
    from test_vllm_adapter import STANDIN_API, StandinManager

    from pcp_fn.adapters.vllm.against import VllmNames

    def oracle(**kw):  # the slow oracle of vLLM's PCPManager, as the reference
        tables = standin.BlockTables([4], kw["max_num_reqs"], kw["max_num_tokens"], [64], torch.device("cpu"))
        return OracleManager(STANDIN_API, block_tables=tables, **kw)

    plain = type("Plain", (drop_in or StandinManager,), {"graph_backend": None})
    desc, mode = standin.BatchExecutionDescriptor, standin.CUDAGraphMode
    return VllmNames(oracle, plain, standin.InputBatch, desc, mode, "0.32-standin")


def _served_trace(tmp_path):
    manager, tables = _standin_manager(pcp_rank=0, record_schedule=tmp_path / "served.jsonl")
    served = list(_served_steps(manager, tables))
    manager.bookkeeper.recorder.close()
    return T.read_trace(tmp_path / "served.jsonl"), len(served)


def test_a_served_schedule_agrees_with_the_reference_manager_step_for_step(tmp_path):
    from pcp_fn.adapters.vllm.against import compare_with_vllm

    trace, steps = _served_trace(tmp_path)
    found = compare_with_vllm(trace, names=_standin_names())
    assert found.difference is None and found.steps == steps and found.ranks == (0, 1)
    assert {"positions", "query_start_loc", "seq_lens", "idx_mapping_np"} <= set(found.fields)


def test_the_first_differing_step_rank_and_field_are_named(tmp_path):
    from test_vllm_adapter import StandinManager

    from pcp_fn.adapters.vllm.against import compare_with_vllm

    class OffByOne(StandinManager):  # a drop-in with a bug: rank 1's positions from step 6 on
        calls = 0

        def partition_batch(self, input_batch, batch_desc):
            local = super().partition_batch(input_batch, batch_desc)
            type(self).calls += self.pcp_rank == 1
            if self.pcp_rank == 1 and type(self).calls > 6:
                local.positions[0] += 1
            return local

    trace, _ = _served_trace(tmp_path)
    found = compare_with_vllm(trace, names=_standin_names(OffByOne))
    d = found.difference
    assert (d.step, d.rank, d.field) == (6, 1, "positions")
    assert str(d).startswith("step 6, rank 1, positions: vLLM torch.int64")


def test_against_refuses_a_trace_no_vllm_recorded(tmp_path, capsys):
    from pcp_fn.adapters.vllm.against import compare_with_vllm
    from pcp_fn.sim.cli import main

    path = tmp_path / "plain.jsonl"
    T.write_trace(path, pcp_fn.PCPConfig(2, 0, 8, 64), [T.TraceStep((1, 5), (3, 0), (3, 5))])
    with pytest.raises(ValueError, match="needs a trace a vLLM model runner V2 drop-in recorded"):
        compare_with_vllm(path, names=_standin_names())
    assert main(["replay", str(path), "--against", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--against vllm" in err[0], err


@pytest.mark.vllm
def test_against_the_installed_vllm_no_difference_and_a_named_one(tmp_path, monkeypatch):
    """The installed vLLM's own PCPManager and FunctionalPCPManager over it, on an engine trace
    of the simulator's schedule (rows shuffled every 4th step, NONE and PIECEWISE descriptors),
    sharded and replicated decodes; then the drop-in made wrong on one field, which is named."""
    pytest.importorskip("vllm")
    from pcp_fn.adapters.vllm.against import compare_with_vllm, installed_vllm

    for layout in ("mrv2-sharded", "mrv2"):
        case = Case(P=3, R=8, T=48, requests=9, seed=5, max_steps=30)
        steps = []
        for i, rs in enumerate(runner_steps(case, [], np.random.default_rng(1), Summary())):
            pick = lambda xs, order=rs.order: tuple(xs[k] for k in order)  # noqa: E731
            step = T.TraceStep(
                pick(rs.step.sched),
                pick(rs.step.computed),
                pick(rs.step.prompt),
                is_prefilling=tuple(rs.prefilling.tolist()),
                idx_mapping=pick(rs.step.states),
                batch_desc=T.BatchDesc("PIECEWISE", 48, None) if i % 3 == 2 else T.BatchDesc("NONE", 0, None),
            )
            steps.append(step)
        path = tmp_path / f"{layout}.jsonl"
        T.write_trace(path, pcp_fn.PCPConfig(3, 0, 8, 48, layout=layout), steps, engine=ENGINE)
        found = compare_with_vllm(path)
        assert found.difference is None and found.steps == len(steps) >= 20, found
    names = installed_vllm()

    class Wrong(names.drop_in):
        def partition_batch(self, input_batch, batch_desc):
            local = super().partition_batch(input_batch, batch_desc)
            local.query_start_loc_np[1] += 1
            return local

    import dataclasses

    found = compare_with_vllm(path, names=dataclasses.replace(names, drop_in=Wrong))
    assert (found.difference.step, found.difference.rank, found.difference.field) == (
        0,
        0,
        "query_start_loc_np",
    )


# -- another layout served, recorded, replayed and compared -----------------------------------


@pytest.mark.parametrize("layout", ["round-robin", "cost-balanced"])
def test_another_layout_served_records_replays_and_keeps_what_vllm_keeps(tmp_path, layout):
    """The drop-in serving another split records it (the sharded twin: vLLM deals the decodes),
    the replay through pcp_fn.mrv2 gives the served rows, and against vLLM's own manager (the
    oracle here) the decode rows and every prefill's positions agree while the rows differ."""
    from pcp_fn.adapters.vllm.against import SPLIT_FIELDS, compare_with_vllm

    path = tmp_path / "served.jsonl"
    manager, tables = _standin_manager(pcp_rank=0, record_schedule=path, layout=layout)
    served = list(_served_steps(manager, tables))
    manager.bookkeeper.recorder.close()
    trace = T.read_trace(path)
    assert trace.config.layout == f"{layout}-sharded"
    replayed = T.replay(trace, ranks=[0])
    for (_, n, idx, qsl, positions), out in zip(served, replayed.outputs, strict=True):
        _, local = out[0]
        assert int(local.num_reqs) == n and local.idx_mapping[:n].tolist() == idx
        assert local.query_start_loc[: n + 1].tolist() == qsl
        assert local.positions[: int(local.num_tokens)].tolist() == positions
    found = compare_with_vllm(trace, names=_standin_names())
    assert found.difference is None and found.fields == SPLIT_FIELDS and found.steps == len(served)
    # not vacuous: vLLM's own split of the same steps gives rank 0 other rows
    vllm_split = dataclasses.replace(trace, config=dataclasses.replace(trace.config, layout="mrv2-sharded"))
    theirs = T.replay(vllm_split, ranks=[0]).outputs
    differ = [
        a[0][1].positions[: int(a[0][1].num_tokens)].tolist() != rows[4]
        for a, rows in zip(theirs, served, strict=True)
    ]
    assert sum(differ) >= 3, differ


def test_against_names_a_split_that_loses_a_prefill_token(tmp_path):
    from test_vllm_adapter import StandinManager

    from pcp_fn.adapters.vllm.against import compare_with_vllm

    class Drops(StandinManager):  # a drop-in with a bug: rank 1 serves its prefill rows one position off
        def partition_batch(self, input_batch, batch_desc):
            local = super().partition_batch(input_batch, batch_desc)
            if self.pcp_rank == 1 and local.has_prefill:
                local.positions[local.num_tokens - 1] += 1
            return local

    path = tmp_path / "served.jsonl"
    manager, tables = _standin_manager(pcp_rank=0, record_schedule=path, layout="round-robin")
    list(_served_steps(manager, tables))
    manager.bookkeeper.recorder.close()
    d = compare_with_vllm(path, names=_standin_names(Drops)).difference
    assert d is not None and d.field in ("row runs", "prefill positions"), d
