"""The ragged-to-fixed-shape primitives against plain Python."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from pcp_fn.core.ragged import (
    arange_of,
    expand_runs,
    masked_gather,
    offsets,
    ragged_index,
    scatter_to,
    segment_of,
    segments_of,
)


@given(lengths=st.lists(st.integers(0, 6), max_size=8), extra=st.integers(0, 5))
def test_ragged_index(lengths, extra):
    cap = sum(lengths) + extra
    idx = ragged_index(torch.tensor(lengths, dtype=torch.int64), cap)
    expected = [(seg, off) for seg, n in enumerate(lengths) for off in range(n)]
    got = list(zip(idx.segment.tolist(), idx.offset.tolist()))
    assert got[: sum(lengths)] == expected
    assert idx.valid.tolist() == [True] * sum(lengths) + [False] * extra
    assert offsets(torch.tensor(lengths, dtype=torch.int64)).tolist() == [
        sum(lengths[:i]) for i in range(len(lengths) + 1)
    ]


@given(
    runs=st.lists(
        st.tuples(st.integers(0, 4), st.integers(-50, 50), st.integers(-50, 50)), min_size=1, max_size=8
    ),
    extra=st.integers(0, 4),
)
def test_expand_runs_paints_every_slot(runs, extra):
    lengths = [n for n, _, _ in runs]
    starts = offsets(torch.tensor(lengths))[:-1]
    values = torch.tensor([[a for _, a, _ in runs], [b for _, _, b in runs]])
    cap = sum(lengths) + extra
    got = expand_runs(starts, values, cap)
    painted = [(a, b) for n, a, b in runs for _ in range(n)]
    last = (runs[-1][1], runs[-1][2])
    assert list(zip(got[0].tolist(), got[1].tolist())) == painted + [last] * extra
    assert expand_runs(starts, values[0], cap).tolist() == got[0].tolist()
    shared = arange_of(cap + 3, starts.device)  # a caller's longer arange: the same slots
    assert torch.equal(expand_runs(starts, values, cap, arange=shared), got)


def test_expand_runs_drops_starts_past_the_end():
    assert expand_runs(torch.tensor([0, 2, 9]), torch.tensor([1, 2, 3]), 4).tolist() == [1, 1, 2, 2]


@given(perm=st.permutations(list(range(7))))
def test_scatter_to_inverts_a_permutation(perm):
    fwd = torch.tensor(perm)
    valid = fwd < 5
    inv = scatter_to(fwd, valid, torch.arange(7), 5)
    for j, p in enumerate(perm):
        if p < 5:
            assert inv[p] == j


def test_masked_gather():
    values = torch.tensor([10, 11, 12], dtype=torch.int32)
    got = masked_gather(values, torch.tensor([2, 9, -1, 0]), torch.tensor([True, False, False, True]), -1)
    assert got.tolist() == [12, -1, -1, 10] and got.dtype == torch.int32


@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=10),
    extra=st.integers(0, 4),
    drop_last=st.booleans(),
)
def test_segment_of_counts_the_ends_like_a_binary_search(lengths, extra, drop_last):
    ends = offsets(torch.tensor(lengths))[1:]
    if drop_last:
        ends = ends[:-1]
    slots = torch.arange(sum(lengths) + extra)
    expected = torch.searchsorted(ends, slots, right=True)  # what a GPU or NPU runs
    assert segment_of(ends, slots).tolist() == expected.tolist()


@given(
    parts=st.lists(
        st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=6), st.integers(0, 3)),
        min_size=1,
        max_size=3,
    )
)
def test_segments_of_answers_each_search_like_segment_of(parts):
    searches = []
    for lengths, extra in parts:
        ends = offsets(torch.tensor(lengths))[1:]
        searches.append((ends[:-1], torch.arange(sum(lengths) + extra)))
    got = segments_of(*searches)
    assert [g.tolist() for g in got] == [segment_of(e, s).tolist() for e, s in searches]
