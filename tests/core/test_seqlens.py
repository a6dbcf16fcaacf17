"""cp_local_seq_lens and its host twin: exact at the int32 limit, its arguments checked."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import pcp_fn
from pcp_fn.core.seqlens import cp_local_seq_lens, host_cp_local_seq_lens

INT32_MAX = 2**31 - 1


def _oracle(s: int, C: int, interleave: int) -> list[int]:
    """Rank ``j``'s tokens of a sequence of ``s``: token ``t`` is in block ``t // interleave``, dealt
    to rank ``block % C`` (Python integers: nothing wraps)."""
    rounds, rest = divmod(max(s, 0), C * interleave)
    return [rounds * interleave + min(max(rest - j * interleave, 0), interleave) for j in range(C)]


# lengths anywhere in int32, most of them at the top of it (where a sum before a division wraps)
lengths = st.one_of(st.integers(0, INT32_MAX), st.integers(INT32_MAX - 300, INT32_MAX), st.integers(0, 300))


@given(
    seq=st.lists(lengths, min_size=1, max_size=6),
    P=st.integers(1, 8),
    D=st.integers(1, 4),
    interleave=st.sampled_from([1, 2, 3, 64, 128, 2**20, 2**30, INT32_MAX]),
)
def test_every_int32_length_is_split_exactly(seq, P, D, interleave):
    want = [_oracle(s, P * D, interleave) for s in seq]
    for dtype in (torch.int32, torch.int64):
        got = cp_local_seq_lens(torch.tensor(seq, dtype=dtype), P, D, interleave)
        assert got.dtype == dtype and got.shape == (len(seq), P, D)
        assert got.reshape(len(seq), P * D).tolist() == want
    for dtype in (np.int32, np.int64):
        host = host_cp_local_seq_lens(np.asarray(seq, dtype), P, D, interleave)
        assert host.dtype == dtype and host.reshape(len(seq), P * D).tolist() == want


def test_the_audit_case_gives_each_rank_half_of_the_context():
    # a decode whose context ends at INT32_MAX: its 2**31 - 1 tokens on two ranks
    M = INT32_MAX
    cfg = pcp_fn.PCPConfig(2, 0, 4, 32)
    batch = pcp_fn.make_batch(cfg, [1, 8], [M - 1, 0], [5, 8], slot_mapping=range(9))
    _, meta = pcp_fn.attention_metadata(pcp_fn.init_state(cfg), batch)
    lens = meta.num_computed_tokens_of_pcp_dcp
    assert lens.dtype == torch.int32 and lens[0].tolist() == [[2**30], [2**30 - 1]]
    seq = torch.tensor([M], dtype=torch.int32)
    assert cp_local_seq_lens(seq, 2).tolist() == [[[2**30], [2**30 - 1]]]
    assert host_cp_local_seq_lens(seq.numpy(), 2, 1, 1).tolist() == [[[2**30], [2**30 - 1]]]


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((torch.tensor([5]), 0), ValueError, r"pcp_size must be >= 1, got 0"),
        ((torch.tensor([5]), 2, 0), ValueError, r"dcp_size must be >= 1, got 0"),
        ((torch.tensor([5]), 2, 1, -2), ValueError, r"interleave must be >= 1, got -2"),
        ((torch.tensor([5]), 2, 1, 0), ValueError, r"interleave must be >= 1, got 0"),
        ((torch.tensor([5]), 2.0), TypeError, r"pcp_size must be an int, got float"),
        ((torch.tensor([5]), 2, 1, True), TypeError, r"interleave must be an int, got bool"),
        ((torch.tensor([5]), 2**31), ValueError, r"pcp_size must be <= 2147483647"),
        ((torch.tensor([5.0]), 2), TypeError, r"seq_lens must be an integer tensor.*float32"),
        ((torch.tensor([True]), 2), TypeError, r"seq_lens must be an integer tensor.*bool"),
        (([5], 2), TypeError, r"seq_lens must be a tensor, got list"),
        ((np.array([5]), 2), TypeError, r"seq_lens must be a tensor, got ndarray"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, error, match):
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(error, match=match):
        pcp_fn.cp_local_seq_lens(*args)
    for a, b in zip(args, before):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)  # the input is never changed


@given(seq=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=5), I=st.sampled_from([1, 3, 128]))
def test_a_negative_length_holds_no_token_on_any_rank(seq, I):
    # device data the op cannot read: documented as holding nothing, never a wrapped or negative share
    got = cp_local_seq_lens(torch.tensor(seq, dtype=torch.int32), 2, 2, I)
    assert got.reshape(len(seq), 4).tolist() == [_oracle(s, 4, I) for s in seq]
    assert (got >= 0).all()


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8])
def test_narrow_dtypes_are_split_exactly_in_their_own_dtype(dtype):
    top = torch.iinfo(dtype).max
    seq = torch.tensor([0, 1, top - 1, top], dtype=dtype)
    got = cp_local_seq_lens(seq, 3, 1, 2)
    assert got.dtype == dtype
    assert got.reshape(4, 3).tolist() == [_oracle(int(s), 3, 2) for s in seq.tolist()]


def test_a_round_longer_than_the_dtype_splits_exactly():
    # C * interleave past int32: no int32 length completes a round, every share still exact
    seq = torch.tensor([0, 5, 2**16 + 3, INT32_MAX], dtype=torch.int32)
    got = cp_local_seq_lens(seq, 2**10, 1, 2**22)
    assert got.shape == (4, 2**10, 1)
    for s, row in zip(seq.tolist(), got[:, :, 0].tolist()):
        assert row == _oracle(s, 2**10, 2**22)
    host = host_cp_local_seq_lens(seq.numpy(), 2**10, 1, 2**22)
    assert np.array_equal(host, got.numpy())


def test_it_traces_in_one_graph_and_runs_on_meta():
    seq = torch.tensor([INT32_MAX, 7, 0], dtype=torch.int32)
    for interleave in (1, 16):
        compiled = torch.compile(cp_local_seq_lens, fullgraph=True, dynamic=False, backend="eager")
        assert torch.equal(compiled(seq, 4, 2, interleave), cp_local_seq_lens(seq, 4, 2, interleave))
        assert cp_local_seq_lens(seq.to("meta"), 4, 2, interleave).shape == (3, 4, 2)
