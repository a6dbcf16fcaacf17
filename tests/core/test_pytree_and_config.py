"""PCPState / SchedulerBatch / outputs are pytrees; configs are hashable static data."""

import dataclasses
import pickle

import torch
import torch.utils._pytree as pytree
from helpers import tree_equal

import pcp_fn
from pcp_fn import Bucket, PCPConfig, init_state, make_batch


def test_state_flattens_and_unflattens():
    cfg = PCPConfig(4, 3, 16, 512)
    for state in (init_state(cfg), init_state(cfg, rank=2)):
        leaves, spec = pytree.tree_flatten(state)
        back = pytree.tree_unflatten(leaves, spec)
        assert isinstance(back, pcp_fn.PCPState) and back.config is cfg
        assert tree_equal(back, state)
        per_request = pytree.tree_leaves(dataclasses.replace(state, constants={}))
        assert all(x is None or x.dim() == 0 or x.shape[0] == 16 for x in per_request)
        assert sorted(state.constants) == [
            "attn_pair",
            "attn_runs",
            "attn_sums",
            "dcs_chunks",
            "dcs_ranks",
            "dcs_sizes",
        ]


def test_config_rides_in_the_structure_and_leaves_are_tensors():
    cfg = PCPConfig(2, 0, 4, 32)
    leaves, spec = pytree.tree_flatten(init_state(cfg))
    assert all(x is None or isinstance(x, torch.Tensor) for x in leaves)
    other = pytree.tree_flatten(init_state(dataclasses.replace(cfg, pcp_rank=1)))[1]
    assert spec != other  # a different static config is a different structure


def test_replace_makes_the_next_state():
    state = init_state(PCPConfig(2, 0, 4, 32))
    nxt = dataclasses.replace(state, num_reqs=torch.tensor(3))
    assert int(state.num_reqs) == 0 and int(nxt.num_reqs) == 3
    try:
        state.num_reqs = torch.tensor(1)
        raise AssertionError("frozen")
    except dataclasses.FrozenInstanceError:
        pass


def test_outputs_are_pytrees():
    cfg = PCPConfig(2, 1, 4, 32)
    batch = make_batch(cfg, [1, 5, 8], [7, 0, 0], [3, 5, 8], slot_mapping=range(14))
    state, out = pcp_fn.step(init_state(cfg), batch)
    for tree in (batch, out, out.layout):
        leaves, spec = pytree.tree_flatten(tree)
        assert tree_equal(pytree.tree_unflatten(leaves, spec), tree)
    assert pytree.tree_flatten(batch)[1] != pytree.tree_flatten(make_batch(cfg, [30], [0], [30]))[1]


def test_config_is_hashable_and_derives_capacities():
    cfg = PCPConfig(8, 0, 256, 8192)
    assert hash(cfg) == hash(PCPConfig(8, 0, 256, 8192))
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.max_local_tokens == cfg.L == 8192 + 256
    assert cfg.max_gathered_tokens == cfg.G == 8 * (8192 + 256)
    assert cfg.request_buckets == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert cfg.token_buckets[-2:] == (8192, 8448) and cfg.token_buckets[0] == 1
    assert cfg.decode_threshold == 1 and pcp_fn.dcs.pad_multiple(cfg.pcp_size) == 16
    one = PCPConfig(1, 0, 4, 100, num_spec_tokens=2)
    assert one.L == 100 and one.G == 100 and pcp_fn.dcs.pad_multiple(1) == 1 and one.decode_threshold == 3
    custom = PCPConfig(2, 0, 8, 64, request_buckets=[4, 2], token_buckets=(16, 40))
    assert custom.request_buckets == (2, 4, 8) and custom.token_buckets == (16, 40, 72)


def test_buckets_pick_the_smallest_that_holds():
    cfg = PCPConfig(4, 0, 256, 8192)
    assert make_batch(cfg, [1] * 256, [500] * 256, [100] * 256).bucket == Bucket(256, 256)
    b = make_batch(cfg, [1] * 64 + [2048, 1000], [500] * 64 + [0, 0], [100] * 64 + [2048, 1000])
    assert b.bucket == Bucket(128, 1024)  # 64 + 512 + 250 = 826 local tokens
    assert len(cfg.buckets()) == len(cfg.request_buckets) * len(cfg.token_buckets)


def test_geometric_buckets_bound_the_padding_and_serve_as_a_config_ladder():
    from pcp_fn.core.buckets import geometric_buckets, powers_of_two_then

    assert geometric_buckets(24, 2) == (1, 2, 3, 4, 6, 8, 12, 16, 24)
    for cap in (1, 2, 5, 96, 8448):
        assert geometric_buckets(cap) == powers_of_two_then(cap)
    for per_octave in (1, 2, 3, 4):
        sizes = geometric_buckets(300, per_octave)
        assert list(sizes) == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == 300
        for n in range(1, 301):
            bucket = next(s for s in sizes if s >= n)
            assert bucket < n * (1 + 1 / per_octave) + 1, (per_octave, n, bucket)
    # a config built on it picks the tighter bucket: 767 local tokens fit 768, not 1024
    cap = PCPConfig(8, 0, 256, 8192).max_local_tokens
    cfg = PCPConfig(8, 0, 256, 8192, token_buckets=geometric_buckets(cap, 2))
    assert cfg.bucket_for(256, 767) == Bucket(256, 768)
