"""Bad input gets a clear ValueError (TypeError for a wrong type) at the boundary; ops never change
what they are given."""

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
        (([1, 2**31], [0, 0], [1, 2]), r"num_scheduled_tokens\[1\] = 2147483648 exceeds the limit"),
        (([1], [2**31 - 1], [5]), r"num_computed_tokens\[0\] \+ num_scheduled_tokens\[0\] = 2147483648"),
        (
            ([1], np.array([2**63], dtype=np.uint64), [5]),
            r"num_computed_tokens\[0\] = 9223372036854775808 exceeds the limit",
        ),
        (([1], [0], torch.zeros(1, device="meta", dtype=torch.int32)), r"num_prompt_tokens is a meta tensor"),
    ],
)
def test_make_batch_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        make_batch(CFG, *args)


def test_make_batch_accepts_large_counts_of_different_requests():
    # the largest computed and scheduled counts sum past int32, but no request's sequence does
    cfg = PCPConfig(2, 0, 4, 2**31 - 1)
    batch = make_batch(cfg, [1, 2**30 + 5], [2**30 + 5, 0], [1, 2**30 + 5])
    assert batch.num_scheduled.tolist() == [1, 2**30 + 5]
    assert batch.num_computed.tolist() == [2**30 + 5, 0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([1.5, 2], [0, 0], [1, 2]), r"num_scheduled_tokens must hold integers"),
        (([1, True], [0, 0], [1, 2]), r"num_scheduled_tokens\[1\] must be an int, got bool"),
    ],
)
def test_make_batch_rejects_wrong_types(args, match):
    with pytest.raises(TypeError, match=match):
        make_batch(CFG, *args)
    with pytest.raises(TypeError, match="config must be a PCPConfig"):
        make_batch(object(), [1], [0], [1])


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
        (dict(request_buckets=(0, 2)), "request_buckets entry must be >= 1"),
        (dict(token_buckets=(10**6,)), "token_buckets size 1000000 exceeds the capacity"),
        (dict(max_num_tokens=2**40), "max_num_tokens must be <= 2147483647"),
        (dict(pad_slot_id=2**40), "pad_slot_id must be <= 2147483647"),
    ],
)
def test_config_rejects(kwargs, match):
    base = dict(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=32)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        PCPConfig(**base)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(hybrid_attn=1), "hybrid_attn must be a bool"),
        (dict(request_buckets="24"), "request_buckets must be a sequence of ints, got str"),
        (dict(token_buckets=(2.5,)), "token_buckets entry must be an int, got float"),
        (dict(pcp_size=2.0), "pcp_size must be an int, got float"),
    ],
)
def test_config_rejects_wrong_types(kwargs, match):
    base = dict(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=32)
    base.update(kwargs)
    with pytest.raises(TypeError, match=match):
        PCPConfig(**base)


@pytest.mark.parametrize("rank", [2, -1, np.int64(5), torch.tensor(5), torch.tensor(-1)])
def test_init_state_rejects_a_rank_out_of_range(rank):
    with pytest.raises(ValueError, match=r"rank must be in \[0, pcp_size=2\)"):
        init_state(CFG, rank=rank)


@pytest.mark.parametrize("rank", [1.7, True, torch.tensor(1.0), "1"])
def test_init_state_rejects_a_rank_of_the_wrong_type(rank):
    with pytest.raises(TypeError, match="rank must be"):
        init_state(CFG, rank=rank)


def test_init_state_takes_every_integer_rank_kind():
    for rank in (1, np.int32(1), torch.tensor(1), torch.tensor(1, dtype=torch.int32)):
        state = init_state(CFG, rank=rank)
        assert state.rank.dtype == torch.int64 and int(state.rank) == 1
    with pytest.raises(ValueError, match="meta tensor"):
        init_state(CFG, rank=torch.tensor(1, device="meta"))
    with pytest.raises(TypeError, match="config must be a PCPConfig"):
        init_state("cfg")


def test_restore_rejects_a_gathered_buffer_of_another_size():
    state, _ = pcp_fn.update_tokens(init_state(CFG), make_batch(CFG, [3], [0], [3]))
    rows = 2 * state.bucket.num_tokens
    for bad in (torch.zeros(7, 4), torch.zeros(rows - 2, 4), torch.zeros(rows + 2, 4), torch.zeros(())):
        with pytest.raises(ValueError, match=f"gathered must stack the 2 ranks' .* \\({rows} rows\\)"):
            pcp_fn.restore_hidden_states(state, bad)


def test_a_slot_mapping_of_the_wrong_length_is_refused():
    # the repro: a 1-entry slot mapping used to give every token slot 7
    c = PCPConfig(2, 0, 4, 32)
    b = make_batch(c, [5, 8], [0, 0], [5, 8])
    for bad in (torch.tensor([7]), torch.tensor([], dtype=torch.int64), torch.arange(100)):
        with pytest.raises(ValueError, match=r"slot_mapping must have the bucket's 16 scheduler-order"):
            pcp_fn.step(init_state(c), b, bad)
    with pytest.raises(ValueError, match="step needs the KV slot mapping"):
        pcp_fn.step(init_state(c), b)
    with pytest.raises(ValueError, match="slot_mapping has 1 entries; the batch schedules 13 tokens"):
        make_batch(c, [5, 8], [0, 0], [5, 8], slot_mapping=[7])
    state, _ = pcp_fn.update_tokens(init_state(c), b)
    with pytest.raises(ValueError, match="slot_mapping must have the bucket's"):
        pcp_fn.padded_slot_mapping(state, torch.arange(13))


def test_a_batch_of_another_config_is_refused():
    big = PCPConfig(4, 0, 8, 64)
    batch = make_batch(big, [1, 30, 5], [7, 0, 0], [3, 30, 5], slot_mapping=range(36))
    for other in (PCPConfig(2, 0, 8, 64), PCPConfig(4, 0, 4, 64), PCPConfig(4, 1, 8, 64, hybrid_attn=True)):
        with pytest.raises(ValueError, match="the batch was built for"):
            pcp_fn.step(init_state(other), batch)
        with pytest.raises(ValueError, match="the batch was built for"):
            pcp_fn.update_tokens(init_state(other), batch)


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
    batch = batch_for(case, cfg, slot_mapping=torch.arange(sum(case.sched)))
    slots = batch.slot_mapping
    before = snapshot((state, batch, slots))
    updated, _ = pcp_fn.update_tokens(state, batch)
    pcp_fn.step(state, batch)
    after_update = snapshot(updated)
    pcp_fn.get_logits_indices(updated)
    pcp_fn.padded_slot_mapping(updated, slots)
    pcp_fn.restore_hidden_states(updated, torch.zeros(cfg.pcp_size * batch.bucket.num_tokens, 2))
    assert tree_equal((state, batch, slots), before)
    assert tree_equal(updated, after_update)


# -- issue 20: bad input that used to be accepted or fail deep inside torch ----------------------


def test_spec_step_refuses_a_float_token_table():
    table = torch.arange(4 * 16).reshape(4, 16)
    batch, spec = pcp_fn.make_spec_batch(
        CFG, [2, 8], [6, 0], [6, 8], [1, 0], token_ids=table, slot_mapping=range(10)
    )
    state = init_state(CFG)
    pcp_fn.spec_step(state, batch, spec, table)  # the integer table is fine
    for bad in (table.float(), table.to(torch.float64), table.bool()):
        before = snapshot((state, batch, spec, bad))
        with pytest.raises(TypeError, match=r"token_ids must hold integers, got torch\.(float|bool)"):
            pcp_fn.spec_step(state, batch, spec, bad)
        assert tree_equal((state, batch, spec, bad), before)
    with pytest.raises(TypeError, match=r"token_ids must hold integers"):
        pcp_fn.spec.full_input_ids(pcp_fn.update_tokens(state, batch)[0], table.half(), batch.num_computed)


def _missing_device() -> str:
    # on a CUDA machine, the index one past its last device
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


def test_a_missing_cuda_device_is_named_before_any_pinned_memory(monkeypatch):
    from pcp_fn.core import staging

    def pinned(nbytes):
        raise AssertionError("pinned memory asked for on a device that is not there")

    monkeypatch.setattr(staging, "_pinned", pinned)
    dev = _missing_device()
    match = rf"device='{dev}' is not available"
    with pytest.raises(ValueError, match=match):
        make_batch(CFG, [1, 5], [7, 0], [3, 5], device=dev)
    with pytest.raises(ValueError, match=match):
        pcp_fn.make_spec_batch(CFG, [2, 8], [6, 0], [6, 8], [1, 0], device=dev)
    with pytest.raises(ValueError, match=match):
        pcp_fn.mrv2.make_batch(pcp_fn.mrv2.MRV2Config(2, 0, 4, 32), [3], [0], [3], device=dev)
    with pytest.raises(ValueError, match=match):
        init_state(CFG, dev)
    with pytest.raises(ValueError, match=match):
        pcp_fn.mrv2.init_state(pcp_fn.mrv2.MRV2Config(2, 0, 4, 32), dev)


def test_attention_metadata_refuses_decode_seq_lens_of_the_wrong_shape_or_dtype():
    batch = make_batch(CFG, [1, 1, 8], [255, 128, 0], [255, 128, 8])
    state = init_state(CFG)
    Rb = batch.bucket.num_reqs
    good = torch.tensor([300, 129, 999, 999], dtype=torch.int32)
    assert good.shape == (Rb,)
    pcp_fn.attention_metadata(state, batch, decode_seq_lens=good)
    for bad in (good[:3], torch.cat([good, good]), good[:, None], good.reshape(2, 2), torch.tensor(5)):
        before = snapshot((state, batch, bad))
        with pytest.raises(ValueError, match=rf"decode_seq_lens must be \[{Rb}\] \(R_b, one per request row"):
            pcp_fn.attention_metadata(state, batch, decode_seq_lens=bad)
        assert tree_equal((state, batch, bad), before)
    with pytest.raises(TypeError, match=r"decode_seq_lens must hold integers, got torch\.float32"):
        pcp_fn.attention_metadata(state, batch, decode_seq_lens=good.float())
    with pytest.raises(TypeError, match=r"decode_seq_lens must be a tensor, got list"):
        pcp_fn.attention_metadata(state, batch, decode_seq_lens=[300, 129, 999, 999])
