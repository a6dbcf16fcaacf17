"""The adapters' shared parts: the staging layouts (``core.packing``), the graph runtime and the
schedule cache, on their own (the managers' tests drive them through every step)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from pcp_fn.adapters.runtime import GraphRuntime, Staging
from pcp_fn.adapters.schedule_cache import ScheduleCache
from pcp_fn.core.packing import PackedRequests
from pcp_fn.mrv2 import REQUESTS

LAYOUT = PackedRequests(rows=("num_scheduled", "num_computed"), scalars=("num_reqs",))


def test_packing_the_docstring_example():
    host = np.full(LAYOUT.size(3), -7, dtype=np.int32)
    LAYOUT.pack(host, 3, 2, ([4, 1], [0, 7]), (2,))
    assert host.tolist() == [4, 1, 0, 0, 7, 0, 2]
    views = LAYOUT.unpack(torch.from_numpy(host), 3)
    assert views["num_computed"].tolist() == [0, 7, 0]
    assert views["num_reqs"].dim() == 0 and int(views["num_reqs"]) == 2
    assert LAYOUT.sizes(3) == [3, 3, 1]
    assert [LAYOUT.offset(3, n) for n in ("num_scheduled", "num_computed", "num_reqs")] == [0, 3, 6]


def test_packing_a_reused_buffer_zeroes_only_what_the_last_step_wrote():
    host = np.zeros(LAYOUT.size(4), dtype=np.int32)
    LAYOUT.pack(host, 4, 3, ([1, 2, 3], [4, 5, 6]), (3,))
    host[3] = 99  # past the last step's requests: left alone when zero_to says it is clean
    LAYOUT.packer(host, 4).pack(1, ([8], [9]), (1,), zero_to=3)
    assert host.tolist() == [8, 0, 0, 99, 9, 0, 0, 0, 1]
    LAYOUT.pack(host, 4, 1, ([8], [9]), (1,))  # default: every row past the requests
    assert host[:4].tolist() == [8, 0, 0, 0]


def test_extra_scalars_keep_the_rows_where_they_were():
    step = REQUESTS.with_scalars("Lp")
    R = 5
    assert step.rows == REQUESTS.rows
    assert step.offset(R, "num_reqs") == REQUESTS.offset(R, "num_reqs") == 5 * R
    assert step.offset(R, "Lp") == 5 * R + 1 and step.size(R) == REQUESTS.size(R) + 1


def test_schedule_cache_bound_clears_every_table_and_counts():
    cache = ScheduleCache(max_entries=3)
    a, b = cache.table("a"), cache.table("b")
    cache.put("a", 1, "x")
    cache.put("b", 1, "y")
    cache.put("a", 1, "x2")  # the same key: no new entry
    assert len(cache) == 2 and cache.made == {"a": 2, "b": 1}
    cache.put("a", 2, "z")
    cache.put("b", 2, "w")  # the fourth entry: everything is cleared first
    assert a == {} and b == {2: "w"} and len(cache) == 1 and cache.clears == 1
    cache.forget("b")
    assert b == {} and len(cache) == 0
    cache.put("a", 3, "v")
    cache.clear()
    assert a == {} and len(cache) == 0 and cache.clears == 2
    with pytest.raises(ValueError, match="max_entries"):
        ScheduleCache(0)


def _add_one(out: torch.Tensor, staged: torch.Tensor) -> None:
    out.copy_(staged + 1)


@pytest.mark.parametrize("backend", [None, "eager"])
def test_runtime_prepares_binds_and_replays(backend):
    staging = Staging(4, torch.device("cpu"))
    out = torch.zeros(4, dtype=torch.int32)
    rt = GraphRuntime(backend, torch.device("cpu"))
    call = rt.add("add one", _add_one, fixed=(out,), staged=(staging.device_buffer,), step=True)
    rt.prepare()
    assert rt.num_graphs == (0 if backend is None else 1) == rt.stats.prepared
    host = staging.host()
    host[:] = [1, 2, 3, 4]
    staging.commit(host)
    rt.run(call)
    assert out.tolist() == [2, 3, 4, 5] and rt.stats.steps == 1 and rt.stats.fallbacks == 0


def test_runtime_calls_with_one_graph_key_share_a_graph():
    a, b = torch.zeros(2, dtype=torch.int32), torch.full((2,), 5, dtype=torch.int32)
    out = torch.zeros(2, dtype=torch.int32)
    rt = GraphRuntime("eager", torch.device("cpu"))
    calls = [
        rt.add(("add", k), _add_one, fixed=(out,), staged=(x,), graph_key="add") for k, x in enumerate((a, b))
    ]
    rt.prepare()
    assert rt.num_graphs == 1
    rt.run(calls[1])
    assert out.tolist() == [6, 6]


def test_runtime_without_a_prepared_graph_runs_eagerly_counted_and_logged(caplog):
    out = torch.zeros(2, dtype=torch.int32)
    rt = GraphRuntime("eager", torch.device("cpu"))
    call = rt.add("late", _add_one, fixed=(out,), staged=(torch.ones(2, dtype=torch.int32),))
    with caplog.at_level(logging.WARNING, logger="pcp_fn.adapters"):
        rt.run(call)
        rt.run(call)
    assert out.tolist() == [2, 2] and rt.stats.fallbacks == 2 and rt.num_graphs == 0
    assert sum("no prepared 'eager' graph for late" in r.getMessage() for r in caplog.records) == 1
    rt.prepare()  # a later prepare replaces the fallback with a graph
    rt.run(call)
    assert rt.num_graphs == 1 and rt.stats.fallbacks == 2


def test_runtime_guards_plain_calls_against_host_syncs():
    from pcp_fn.graph import HostSyncError

    def syncs(out: torch.Tensor, staged: torch.Tensor) -> None:
        out.fill_(int(staged.sum()))  # reads a device value on the host

    rt = GraphRuntime(None, torch.device("cpu"), check_host_syncs=True)
    call = rt.add("sync", syncs, fixed=(torch.zeros(1),), staged=(torch.ones(2),))
    with pytest.raises(HostSyncError):
        rt.run(call)
    with pytest.raises(HostSyncError), rt.guard():
        torch.ones(1).item()
