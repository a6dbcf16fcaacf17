"""The vLLM adapter's graphs: one ladder of buckets, all made at construction, none at a step.

Driven through the drop-in built over the stand-in of vLLM's classes (no vLLM
needed); the real engine does the same in ``tests/e2e/test_vllm_engine.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import pytest
import torch
import vllm_standin as standin
from test_vllm_adapter import STANDIN_API, standin_manager
from torch._dynamo.utils import counters
from vllm_lockstep import Case, make_global_batch, scheduler_steps

from pcp_fn.adapters.backend import SMALLEST_BUCKET, capture_ladder, graph_ladder, resolve_graph_backend
from pcp_fn.core.buckets import Bucket


def manager_cls(backend: str | None, **attrs) -> type:
    return type("M", (standin_manager(backend, check_host_syncs=False),), attrs)


KW = dict(
    pcp_world_size=2, pcp_rank=0, device="cpu", shard_decode_requests=True, max_num_reqs=8, max_num_tokens=48
)


def _local_fields(local) -> dict:
    out = {}
    for f in dataclasses.fields(local):
        x = getattr(local, f.name)
        if isinstance(x, torch.Tensor):
            out[f.name] = x.clone()
        elif isinstance(x, np.ndarray):
            out[f.name] = x.copy()
        else:
            out[f.name] = x
    return out


def _drive(manager, steps: int = 8, seed: int = 3) -> list[dict]:
    """Partition ``steps`` scheduler steps (mixed prefills and decodes, NONE descriptors)."""
    desc = standin.BatchExecutionDescriptor(cg_mode=standin.CUDAGraphMode.NONE, num_tokens=0, num_reqs=0)
    seen = []
    for i, step in enumerate(scheduler_steps(Case(P=2, shard=True, max_steps=steps, seed=seed, T=48, R=8))):
        g = make_global_batch(STANDIN_API, step, desc, list(range(len(step.sched))), torch.device("cpu"))
        seen.append(_local_fields(manager.partition_batch(g, desc)))
        if i + 1 >= steps:
            break
    return seen


def _assert_same_steps(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert torch.equal(x[k], y[k]), k
            elif isinstance(x[k], np.ndarray):
                assert np.array_equal(x[k], y[k]), k


def test_graph_ladder_examples():
    assert graph_ladder(8, 100) == (Bucket(8, 16), Bucket(8, 32), Bucket(8, 64), Bucket(8, 100))
    assert graph_ladder(512, 64) == (Bucket(16, 16), Bucket(32, 32), Bucket(64, 64), Bucket(512, 64))
    assert graph_ladder(4, 8) == (Bucket(4, 8),)  # capacity below the smallest rung: one graph
    assert graph_ladder(8, 48, (4, 12)) == (Bucket(4, 4), Bucket(8, 12), Bucket(8, 48))
    assert SMALLEST_BUCKET == 16
    with pytest.raises(ValueError, match="token_sizes size 64 exceeds the capacity 48"):
        graph_ladder(8, 48, (64,))


def test_capture_ladder_holds_the_engines_capture_sizes():
    assert capture_ladder([1, 2, 4, 8, 16, 24, 32], 128) == (1, 2, 4, 8, 16, 24, 32, 64)
    assert capture_ladder([512, 8, 8, 1024], 600) == (8, 512)  # sizes past T dropped
    assert capture_ladder(None, 64) is None and capture_ladder([], 64) is None
    ladder = graph_ladder(16, 128, capture_ladder([1, 2, 4, 8, 16, 24, 32], 128))
    assert [b.num_tokens for b in ladder] == [1, 2, 4, 8, 16, 24, 32, 64, 128]
    assert [b.num_reqs for b in ladder] == [1, 2, 4, 8, 16, 16, 16, 16, 16]


def test_bucket_for_is_the_smallest_rung_holding_the_step():
    for R2, T in ((16, 48), (512, 64), (8, 300)):
        m = manager_cls(None)(**{**KW, "max_num_reqs": R2 // 2, "max_num_tokens": T})
        ladder = m.bookkeeper.graphs.ladder
        for Lp in range(0, T + 1, 3):
            for Rpad in range(0, R2 + 1, 5):
                for rows in (0, min(Rpad, Lp), Rpad):
                    b = m.bookkeeper.graphs.bucket_for(Lp, Rpad, rows)
                    assert b in ladder and b.num_tokens >= Lp and b.num_reqs >= max(Rpad, rows)
                    smaller = [x for x in ladder if x.num_tokens < b.num_tokens]
                    assert not any(x.num_tokens >= Lp and x.num_reqs >= max(Rpad, rows) for x in smaller), (
                        Lp,
                        Rpad,
                        rows,
                        b,
                    )


def test_auto_backend_is_plain_calls_on_the_cpu_and_graphs_elsewhere():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_graph_backend("auto", cpu) is None
    assert resolve_graph_backend("auto", cuda) == "inductor"  # device graphs on CUDA / NPU
    assert resolve_graph_backend("none", cuda) is None and resolve_graph_backend(None, cuda) is None
    assert resolve_graph_backend("aoti", cpu) == "aoti"
    assert resolve_graph_backend("inductor", cpu) == "inductor"


def test_every_graph_made_at_construction_none_at_a_step():
    counters.clear()
    m = manager_cls("eager")(**KW)
    stats = m.graph_stats
    assert (
        stats.prepared == len(m.bookkeeper.graphs.ladder) == 3 and stats.steps == 0
    )  # (16, 16) (16, 32) (16, 48)
    made = counters["stats"]["unique_graphs"]
    assert made >= stats.prepared
    eager = _drive(manager_cls(None)(**KW))
    steps = _drive(m)
    assert counters["stats"]["unique_graphs"] == made, "a step compiled a graph"
    assert m.graph_stats.steps == len(steps) and m.graph_stats.fallbacks == 0
    _assert_same_steps(steps, eager)


def test_a_step_without_a_prepared_graph_runs_eagerly_counted_and_logged(caplog):
    counters.clear()
    m = manager_cls("eager")(**KW)
    for call in m.bookkeeper.graphs.runtime.calls:  # as if no bucket had been prepared
        call.bound = None
    with caplog.at_level(logging.WARNING, logger="pcp_fn.adapters"):
        steps = _drive(m, steps=6)
    assert counters["stats"]["unique_graphs"] == 3  # the construction's, nothing more
    assert m.graph_stats.fallbacks == len(steps) == m.graph_stats.steps
    warned = [r for r in caplog.records if "no prepared 'eager' graph" in r.getMessage()]
    assert 1 <= len(warned) <= len(m.bookkeeper.graphs.ladder)  # once per bucket met
    _assert_same_steps(steps, _drive(manager_cls(None)(**KW), steps=6))
    m.bookkeeper.graphs.prepare()  # a later prepare replaces the fallbacks with graphs
    assert m.bookkeeper.graphs.num_graphs == len(m.bookkeeper.graphs.ladder)


def test_aoti_packages_are_cached_on_disk(tmp_path, monkeypatch):
    """``PCP_FN_GRAPH_BACKEND=aoti``: one package per rung, compiled at the first construction
    under ``$PCP_FN_CACHE_DIR`` and loaded (not compiled) by the next; steps equal eager."""
    monkeypatch.setenv("PCP_FN_CACHE_DIR", str(tmp_path))
    cls = manager_cls("aoti", token_buckets=(48,))  # one rung: one package to compile here
    first = cls(**KW)
    assert first.graph_stats.prepared == 1 and first.graph_stats.loaded == 0
    packages = sorted(p for p in os.listdir(tmp_path) if p.endswith(".pt2"))
    assert len(packages) == 1 and packages[0].startswith("mrv2_partition_")
    second = cls(**KW)
    assert second.graph_stats.prepared == 1 and second.graph_stats.loaded == 1
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".pt2")) == packages
    # another config (here rank 1) names another package
    other = manager_cls(None)(**{**KW, "pcp_rank": 1}).bookkeeper.graphs
    other.package_dir = str(tmp_path)
    assert other.package_path(Bucket(16, 48)) != first.bookkeeper.graphs.package_path(Bucket(16, 48))
    _assert_same_steps(_drive(second), _drive(manager_cls(None)(**KW)))
    assert second.graph_stats.fallbacks == 0
