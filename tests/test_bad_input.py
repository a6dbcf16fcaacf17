"""Bad input gets a clear ValueError at the host boundary; ops never change what they are given."""

import numpy as np
import pytest
import torch
from helpers import batch_for, config_for, snapshot, tree_equal
from hypothesis import given
from strategies import cases

import pcp_fn
from pcp_fn import Bucket, PCPConfig, init_state, make_batch

CFG = PCPConfig(2, 0, 4, 32, num_spec_tokens=1)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            ([1, 2], [0, 0, 0], [1, 2, 3]),
            r"differ in length.*num_scheduled_tokens has 2.*num_computed_tokens has 3",
        ),
        (([1, -2], [0, 0], [1, 2]), r"num_scheduled_tokens\[1\] = -2 is negative"),
        (([1, 2], [0, -1], [1, 2]), r"num_computed_tokens\[1\] = -1 is negative"),
        (([1, 2], [0, 0], [-5, 2]), r"num_prompt_tokens\[0\] = -5 is negative"),
        (([1] * 5, [0] * 5, [1] * 5), r"5 requests; max_num_reqs is 4"),
        (([20, 13], [0, 0], [20, 13]), r"sums to 33 tokens; max_num_tokens is 32"),
        (([5, 1], [0, 9], [5, 9]), r"request 1 is a decode .* after prefill request 0"),
        (([[1, 2]], [[0, 0]], [[1, 2]]), r"num_scheduled_tokens must be 1-D"),
        (([1.5, 2], [0, 0], [1, 2]), r"num_scheduled_tokens must hold integers"),
        (([1, 2**31], [0, 0], [1, 2]), r"exceeds the int32 limit"),
    ],
)
def test_make_batch_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        make_batch(CFG, *args)


def test_make_batch_rejects_a_bucket_that_does_not_hold_the_batch():
    with pytest.raises(ValueError, match=r"bucket.num_tokens=4 must hold the batch's 9 local tokens"):
        make_batch(CFG, [1, 5, 8], [7, 0, 0], [3, 5, 8], bucket=Bucket(4, 4))
    with pytest.raises(ValueError, match=r"bucket.num_reqs=2 must hold the batch's 3 requests"):
        make_batch(CFG, [1, 5, 8], [7, 0, 0], [3, 5, 8], bucket=Bucket(2, 16))
    with pytest.raises(ValueError, match=r"not exceed max_num_reqs=4"):
        make_batch(CFG, [1], [0], [1], bucket=Bucket(8, 16))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(pcp_size=0), "pcp_size must be >= 1"),
        (dict(pcp_rank=2), "pcp_rank must be < pcp_size=2"),
        (dict(max_num_reqs=0), "max_num_reqs must be >= 1"),
        (dict(max_num_tokens=-1), "max_num_tokens must be >= 1"),
        (dict(num_spec_tokens=-1), "num_spec_tokens must be >= 0"),
        (dict(dcp_rank=1), "dcp_rank must be < dcp_size=1"),
        (dict(request_buckets=(0, 2)), "request_buckets must hold positive sizes"),
        (dict(token_buckets=(10**6,)), "token_buckets size 1000000 exceeds the capacity"),
        (dict(hybrid_attn=1), "hybrid_attn must be a bool"),
    ],
)
def test_config_rejects(kwargs, match):
    base = dict(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=32)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        PCPConfig(**base)


def test_init_state_rejects_a_rank_out_of_range():
    with pytest.raises(ValueError, match=r"rank must be in \[0, pcp_size=2\)"):
        init_state(CFG, rank=2)


def test_restore_rejects_a_gathered_buffer_not_split_in_p():
    state, _ = pcp_fn.update_tokens(init_state(CFG), make_batch(CFG, [3], [0], [3]))
    with pytest.raises(ValueError, match="must stack 2 equal rank buffers"):
        pcp_fn.restore_hidden_states(state, torch.zeros(7, 4))


def test_inputs_of_any_array_kind_are_accepted():
    lists = make_batch(CFG, [1, 5], [7, 0], [3, 5])
    arrays = make_batch(CFG, np.array([1, 5], np.int16), np.array([7, 0]), np.array([3, 5], np.uint8))
    tensors = make_batch(CFG, torch.tensor([1, 5]), torch.tensor([7, 0]), torch.tensor([3, 5]))
    assert tree_equal(lists, arrays) and tree_equal(lists, tensors)
    empty = make_batch(CFG, [], [], [])
    assert int(empty.num_reqs) == 0 and empty.bucket == Bucket(1, 1)


@given(case=cases(pcp_sizes=(1, 2, 3)))
def test_ops_never_change_their_inputs(case):
    cfg = config_for(case, case.P - 1)
    state = init_state(cfg)
    batch = batch_for(case, cfg)
    slots = torch.arange(max(sum(case.sched), 1))
    before = snapshot((state, batch, slots))
    updated, _ = pcp_fn.update_tokens(state, batch)
    pcp_fn.step(state, batch, slots)
    after_update = snapshot(updated)
    pcp_fn.get_logits_indices(updated)
    pcp_fn.padded_slot_mapping(updated, slots, batch.bucket.num_tokens)
    pcp_fn.restore_hidden_states(updated, torch.zeros(cfg.pcp_size * batch.bucket.num_tokens, 2))
    assert tree_equal((state, batch, slots), before)
    assert tree_equal(updated, after_update)
