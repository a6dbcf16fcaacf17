"""The public Layout protocol: the registry, selection by config, and the "mrv2" facade layout."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pcp_fn
from pcp_fn import PCPConfig, init_state, make_batch
from pcp_fn.mrv2 import MRV2Config
from pcp_fn.mrv2.host import local_segments


def test_registry_holds_the_three_builtins_and_configs_select_by_name():
    assert pcp_fn.available_layouts()[:3] == ("dcs", "hybrid", "mrv2")
    for name in ("dcs", "hybrid", "mrv2"):
        assert isinstance(pcp_fn.get_layout(name), pcp_fn.Layout)
        assert PCPConfig(2, 0, 4, 32, layout=name).layout_impl is pcp_fn.get_layout(name)
    assert PCPConfig(2, 0, 4, 32).layout_name == "dcs"
    hybrid = PCPConfig(2, 0, 4, 32, layout="hybrid")
    assert hybrid.hybrid_attn and hybrid == PCPConfig(2, 0, 4, 32, hybrid_attn=True)
    assert PCPConfig(2, 0, 4, 32, layout="dcs") == PCPConfig(2, 0, 4, 32)
    with pytest.raises(ValueError, match="unknown layout"):
        PCPConfig(2, 0, 4, 32, layout="nope")
    with pytest.raises(ValueError, match="hybrid_attn"):
        PCPConfig(2, 0, 4, 32, layout="mrv2", hybrid_attn=True)
    with pytest.raises(TypeError, match=r"not a pcp_fn\.Layout"):
        pcp_fn.register_layout(object())
    with pytest.raises(ValueError, match="already registered"):
        pcp_fn.register_layout(pcp_fn.PackageLayout("mrv2", pcp_fn.dcs))
    cfg = PCPConfig(2, 1, 4, 32, layout="mrv2")
    assert pickle.loads(pickle.dumps(cfg)) == cfg and hash(cfg) != hash(PCPConfig(2, 1, 4, 32))


def test_a_layout_object_given_to_the_config_is_registered_by_name():
    class Whole(pcp_fn.PartitionLayout):  # every rank holds everything: a (wasteful) valid layout
        name = "test-whole-requests"

        def segments(self, config, requests, rank):
            n = requests.num_scheduled
            return torch.zeros_like(n)[:, None], torch.where(requests.replicated, n, n * (rank == 0))[:, None]

    cfg = PCPConfig(2, 0, 4, 32, layout=Whole())
    assert cfg.layout == "test-whole-requests" and pcp_fn.get_layout(cfg.layout) is cfg.layout_impl


def test_mrv2_facade_layout_worked_example():
    cfg = PCPConfig(2, 0, 4, 32, layout="mrv2")
    batch = make_batch(cfg, [1, 5, 8], [7, 0, 0], [3, 5, 8], slot_mapping=range(100, 114))
    _, out = pcp_fn.all_ranks(pcp_fn.step, init_state(cfg, rank=0), batch)
    n0, n1 = out.query_start_loc[:, -1].tolist()
    lay = out.layout
    pairs = [
        list(zip(lay.request_index[r, :n].tolist(), lay.positions[r, :n].tolist()))
        for r, n in ((0, n0), (1, n1))
    ]
    assert pairs[0] == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 6), (2, 7)]
    assert pairs[1] == [(0, 0), (1, 2), (1, 3), (1, 4), (2, 2), (2, 3), (2, 4), (2, 5)]
    assert out.logits_indices[0].tolist() == [0, 5, 13, 0]
    assert out.slot_mapping[0, :14].tolist() == list(range(100, 114))
    # restore: rank-major gathered buffer of (request, offset) codes -> scheduler order
    Lb = batch.bucket.num_tokens
    gathered = (lay.request_index * 100 + lay.positions).reshape(2 * Lb)
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    _, restored = pcp_fn.restore_hidden_states(state, gathered)
    assert restored[:14].tolist() == [0, 100, 101, 102, 103, 104, *range(200, 208)]


@settings(max_examples=60)
@given(
    P=st.integers(1, 5),
    sched=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    num_decodes=st.integers(0, 3),
    mode=st.sampled_from(["replicated", "sharded", "dcp"]),
)
def test_mrv2_facade_layout_holds_the_tokens_mrv2_gives_each_rank(P, sched, num_decodes, mode):
    """The "mrv2" / "mrv2-sharded" Layouts against pcp_fn.mrv2's own numpy twin of vLLM's segment
    rules (vLLM's lockstep tests check that twin): decodes replicated, dealt round-robin
    (shard_decode_requests), or with DCP the short prefills replicated too."""
    num_decodes = min(num_decodes, len(sched))
    sched = [min(n, 1) for n in sched[:num_decodes]] + sched[num_decodes:]
    comp = [5 if i < num_decodes else 0 for i in range(len(sched))]
    prompt = [5 if i < num_decodes else max(n, 1) for i, n in enumerate(sched)]
    R, T = len(sched), max(sum(sched), 1)
    shard, dcp = mode == "sharded", 2 if mode == "dcp" else 1
    cfg = PCPConfig(P, 0, R, T, dcp_size=dcp, layout="mrv2-sharded" if shard else "mrv2")
    batch = make_batch(cfg, sched, comp, prompt)
    _, lay = pcp_fn.all_ranks(pcp_fn.update_tokens, init_state(cfg, rank=0), batch)
    is_decode = np.asarray(lay.is_decode[0, :R])
    for rank in range(P):
        mrv2 = MRV2Config(P, rank, R, T, shard_decode_requests=shard, dcp_size=dcp)
        seg = local_segments(mrv2, rank, np.array(sched), ~is_decode)
        expected = [
            (int(i), int(o) + k) for i, o, n in zip(seg.request, seg.offset, seg.length) for k in range(n)
        ]
        n = int(lay.num_tokens[rank])
        got = list(zip(lay.request_index[rank, :n].tolist(), lay.positions[rank, :n].tolist()))
        assert got == expected, (rank, sched)
        # the bucket's bound is the fullest rank's rows (vLLM get_num_tokens_for_dispatch)
        assert batch.bucket.num_tokens >= int(seg.per_rank_num_tokens.max())
    bound = cfg.layout_impl.num_local_tokens(cfg, np.array(sched), int(is_decode.sum()), np.array(comp))
    assert bound == int(seg.per_rank_num_tokens.max()) or P == 1


def test_the_sharded_mrv2_layout_refuses_dcp_and_spec_tokens():
    with pytest.raises(ValueError, match="requires dcp_size == 1"):
        PCPConfig(2, 0, 4, 32, dcp_size=2, layout="mrv2-sharded")
    with pytest.raises(ValueError, match="num_spec_tokens=1"):
        PCPConfig(2, 0, 4, 32, num_spec_tokens=1, layout="mrv2-sharded")
    # P = 2, decodes [1, 1, 1] dealt to ranks 0, 1, 0; the prefill of 8 split as in "mrv2"
    cfg = PCPConfig(2, 0, 4, 32, layout="mrv2-sharded")
    batch = make_batch(cfg, [1, 1, 1, 8], [7, 7, 7, 0], [3, 3, 3, 8], slot_mapping=range(11))
    _, out = pcp_fn.all_ranks(pcp_fn.step, init_state(cfg, rank=0), batch)
    n0, n1 = out.query_start_loc[:, -1].tolist()
    assert out.layout.request_index[0, :n0].tolist() == [0, 2, 3, 3, 3, 3]
    assert out.layout.request_index[1, :n1].tolist() == [1, 3, 3, 3, 3]
    assert out.logits_indices[0].tolist() == [0, 1, 2, 10]  # scheduler order


def test_a_trace_records_the_layout_by_name(tmp_path):
    from pcp_fn.sim.trace import TraceStep, read_trace, write_trace

    cfg = PCPConfig(2, 0, 4, 32, layout="mrv2")
    write_trace(tmp_path / "t.jsonl", cfg, [TraceStep((3, 5), (0, 0), (3, 5))])
    assert read_trace(tmp_path / "t.jsonl").config.layout_impl is pcp_fn.get_layout("mrv2")


def test_spec_decode_indices_go_through_the_layout():
    """The runner's comment example at P = 2: the rows of each request's last 1 + drafts tokens in the
    layout's restored order (DualChunkSwap's padded order, MRV2's scheduler order)."""
    drafts = torch.tensor([3, 2, 0, 0, 1, 0, 0, 0], dtype=torch.int32)
    expected = {
        "dcs": [0, 1, 2, 3, 8, 9, 10, 113, 213, 214, 215],
        "mrv2": [0, 1, 2, 3, 4, 5, 6, 106, 206, 207, 208],  # token_start [0, 4, 7, 107, 207] + n - s ..
    }
    for name, rows in expected.items():
        cfg = PCPConfig(2, 0, 8, 256, num_spec_tokens=3, layout=name)
        batch = make_batch(cfg, [4, 3, 100, 100, 2], [50, 30, 0, 0, 0], [10, 20, 100, 100, 2])
        state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
        ids = torch.zeros(batch.bucket.num_tokens, dtype=torch.int64)
        _, idx = pcp_fn.spec_decode_indices(state, drafts, ids)
        assert idx.logits_indices[:11].tolist() == rows, name


def test_attention_metadata_refuses_a_layout_it_does_not_describe():
    cfg = PCPConfig(2, 0, 4, 32, layout="mrv2")
    batch = make_batch(cfg, [5], [0], [5])
    state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
    with pytest.raises(ValueError, match="DualChunkSwap"):
        pcp_fn.attention_metadata(state, batch)


def test_unregister_layout_frees_a_name_and_refuses_a_builtin():
    assert pcp_fn.unregister_layout is pcp_fn.protocol.unregister_layout
    assert "unregister_layout" in pcp_fn.__all__ and "unregister_layout" in pcp_fn.protocol.__all__

    class Mine(pcp_fn.MRV2Partition):
        name = "test-unregister"

    class Other(pcp_fn.MRV2Partition):
        name = "test-unregister"

    mine = pcp_fn.register_layout(Mine())
    cfg = PCPConfig(2, 0, 4, 32, layout="test-unregister")
    assert pcp_fn.unregister_layout("test-unregister") is mine
    assert "test-unregister" not in pcp_fn.available_layouts()
    assert cfg.layout_impl is mine  # a config made before keeps the layout it bound
    with pytest.raises(ValueError, match="unknown layout 'test-unregister'"):
        PCPConfig(2, 0, 4, 32, layout="test-unregister")
    with pytest.raises(ValueError, match="unknown layout 'test-unregister'"):
        pcp_fn.unregister_layout("test-unregister")
    other = pcp_fn.register_layout(Other())  # the name is free: another class, no replace=True
    assert pcp_fn.get_layout("test-unregister") is other
    pcp_fn.unregister_layout("test-unregister")
    with pytest.raises(TypeError, match="a layout name must be a str"):
        pcp_fn.unregister_layout(other)


def test_a_builtin_cannot_be_unregistered_but_a_replacement_of_one_can():
    builtin = pcp_fn.get_layout("mrv2")
    for name in ("dcs", "hybrid", "mrv2", "mrv2-sharded"):
        with pytest.raises(ValueError, match=rf"{name!r} is a built-in and cannot be unregistered"):
            pcp_fn.unregister_layout(name)
    replacement = pcp_fn.register_layout(pcp_fn.PackageLayout("mrv2", pcp_fn.dcs.layout), replace=True)
    try:
        assert pcp_fn.get_layout("mrv2") is replacement
    finally:
        assert pcp_fn.unregister_layout("mrv2") is replacement
    assert pcp_fn.get_layout("mrv2") is builtin is pcp_fn.mrv2.LAYOUT  # the built-in's name again
    assert PCPConfig(2, 0, 4, 32, layout="mrv2").layout_impl is builtin
    assert pcp_fn.available_layouts()[:4] == ("dcs", "hybrid", "mrv2", "mrv2-sharded")
