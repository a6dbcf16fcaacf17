"""``FunctionalAscendPCPManager`` in lockstep with vllm-ascend 0.30.0rc2's own ``AscendPCPManager``.

Needs vllm-ascend 0.30.0rc2 over vLLM 0.30.0 (``tools/make_vllm_ascend_venv.sh VENV 0.30.0rc2
python3.11``); the reference is the installed release's class, imported on a CPU after its tests'
``torch_npu`` stand-ins. The driver (``ascend_030_lockstep``) follows 0.30.0rc2's ``NPUModelRunner``:
every method it calls, on every rank, compared field by field.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm_ascend") is None,
        reason="needs vllm-ascend (tools/make_vllm_ascend_venv.sh VENV 0.30.0rc2 python3.11)",
    ),
]

from vllm_lockstep import Case  # noqa: E402


@pytest.fixture
def names(monkeypatch):
    if importlib.metadata.version("vllm_ascend") != "0.30.0rc2":
        pytest.skip("the lockstep follows vllm-ascend 0.30.0rc2")
    from ascend_030_lockstep import ascend_030_names

    return ascend_030_names(monkeypatch)


# (case, graph mode): decodes sharded (PCP > 1, DCP = 1, no spec) and replicated (spec 1-2, DCP 2)
CASES = [
    (Case(P=2, seed=1), "FULL_DECODE_ONLY"),
    (Case(P=2, spec=1, seed=2), "FULL_DECODE_ONLY"),
    (Case(P=3, seed=3), "PIECEWISE"),
    (Case(P=3, spec=2, seed=4), "NONE"),
    (Case(P=4, dcp=2, interleave=2, seed=6), "FULL_DECODE_ONLY"),
    (Case(P=4, spec=1, seed=7), "PIECEWISE"),
    (Case(P=4, seed=8, R=16, T=64), "FULL_DECODE_ONLY"),
    (Case(P=8, seed=10, T=64), "NONE"),
    (Case(P=8, spec=2, seed=11, T=64), "FULL_DECODE_ONLY"),
    (Case(P=8, dcp=4, seed=12, T=64), "PIECEWISE"),
    (Case(P=2, spec=2, seed=13, requests=14), "NONE"),
    (Case(P=3, seed=14, R=4, T=24, requests=12), "FULL_DECODE_ONLY"),
]


@pytest.mark.parametrize("case,graphs", CASES, ids=[f"P{c.P}-dcp{c.dcp}-spec{c.spec}-{g}" for c, g in CASES])
def test_lockstep_against_vllm_ascend_030(names, case, graphs):
    from ascend_030_lockstep import run_030_lockstep

    summary = run_030_lockstep(names, case, graphs)
    counts = summary.counts
    assert summary.steps >= 10 and summary.mixed and summary.decode_only
    assert summary.comparisons > 100 * case.P
    assert summary.sharded == (case.dcp == 1 and case.spec == 0)
    if graphs == "FULL_DECODE_ONLY":
        assert summary.graph_padded, "no decode-only step padded to its graph"
        assert counts["sharded_graphs"] if summary.sharded else not counts["sharded_graphs"]
    if summary.sharded:
        assert counts["sharded_captures"], "no capture of a sharded graph's global context"
    if case.spec:
        assert summary.spec and summary.drafts
    assert summary.off_last_stage and counts["captures"]
    print(
        f"\nvllm-ascend 0.30.0rc2 lockstep {summary.configs[0]}: {summary.steps} steps "
        f"({summary.mixed} mixed, {summary.decode_only} decode-only, {summary.graph_padded} graph-padded), "
        f"sharded={summary.sharded}, {counts}, {summary.comparisons} comparisons"
    )


def test_validate_config_is_vllm_ascends_over_a_grid(names):
    # speculative methods (MTP, Eagle3, DSpark with probabilistic drafts; n-gram refused), graph
    # modes, DP, sparse MLA, LoRA, encoder-decoder, multimodal, PCP, DCP, PP: the same outcome
    from ascend_v2_lockstep import compare_validate_config

    count, deviations = compare_validate_config(names.AscendPCPManager, names.drop_in, names.CUDAGraphMode)
    assert count > 1000 and deviations == 0


@pytest.mark.parametrize(
    "case,graphs", [(Case(P=2, seed=1), "FULL_DECODE_ONLY"), (Case(P=3, spec=1, seed=2), "PIECEWISE")]
)
def test_a_recording_under_the_runner_replays_and_agrees_with_vllm_ascend(
    names, case, graphs, tmp_path, capsys
):
    import numpy as np
    from ascend_030_lockstep import run_030_lockstep

    from pcp_fn.adapters.vllm_ascend.v2.against import compare_with_vllm_ascend
    from pcp_fn.sim import trace as T
    from pcp_fn.sim.cli import main

    path = str(tmp_path / "served.jsonl")
    summary = run_030_lockstep(names, case, graphs, record=path)
    trace = T.read_trace(path)
    assert trace.engine.manager == "FunctionalAscendPCPManager" and trace.engine.version == "0.30.0"
    assert trace.config.layout == ("mrv2-sharded" if summary.sharded else "mrv2")
    assert len(trace.steps) == len(summary.served) == summary.steps
    replayed = T.replay(trace, ranks=[0])
    for (n, idx, qsl, positions), out in zip(summary.served, replayed.outputs, strict=True):
        _, local = out[0]
        assert int(local.num_reqs) == n and local.idx_mapping[:n].tolist() == idx
        assert local.positions[: int(local.num_tokens)].tolist() == positions
        if positions:  # (an empty rank's placeholder gets the graph's query width in vllm-ascend)
            assert np.diff(local.query_start_loc[: n + 1].tolist()).tolist() == np.diff(qsl).tolist()
    assert T.replay_digest(path).digest == T.replay_digest(path).digest  # bit-identical

    found = compare_with_vllm_ascend(path)
    assert found.difference is None and found.steps == summary.steps and found.ranks == tuple(range(case.P))
    assert main(["replay", path, "--against", "vllm-ascend"]) == 0
    assert "against vllm-ascend 0.30.0rc2's AscendPCPManager: no difference" in capsys.readouterr().out


def test_against_vllm_ascend_names_the_first_difference(names, tmp_path, capsys):
    import dataclasses

    from ascend_030_lockstep import run_030_lockstep

    from pcp_fn.adapters.vllm_ascend.v2 import against
    from pcp_fn.sim.cli import main

    path = str(tmp_path / "served.jsonl")
    run_030_lockstep(names, Case(P=2, seed=1), "FULL_DECODE_ONLY", record=path)

    class Shifted(names.drop_in):  # a drop-in whose positions are one off from step 3 on
        steps = 0

        def partition_batch(self, input_batch, padded_num_tokens=None, padded_num_reqs=None):
            local = super().partition_batch(input_batch, padded_num_tokens, padded_num_reqs)
            Shifted.steps += 1
            return dataclasses.replace(local, positions=local.positions + 1) if Shifted.steps > 3 else local

    installed = against.installed_vllm_ascend()
    found = against.compare_with_vllm_ascend(path, names=dataclasses.replace(installed, drop_in=Shifted))
    d = found.difference
    assert (d.step, d.rank, d.field) == (3, 0, "positions"), d
    assert main(["replay", path, "--against", "vllm-ascend", "--rank", "1"]) == 0
    capsys.readouterr()
