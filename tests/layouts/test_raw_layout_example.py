"""examples/contiguous_layout.py: a layout on the raw protocol (no PartitionLayout), conforming and exact."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from helpers import load_example

import pcp_fn
from pcp_fn.testing import check_layout

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATH = ROOT / "examples" / "contiguous_layout.py"


def _example():
    return load_example("contiguous_layout")


def _expected_rows(P, sched, decodes):
    """Independent, token by token: each rank's ``(request, offset)`` rows, in order."""
    rows = [[] for _ in range(P)]
    for i, n in enumerate(sched):
        start = 0
        for q in range(P):
            count = n if (i < decodes or P == 1) else n // P + (q < n % P)
            first = 0 if (i < decodes or P == 1) else start
            rows[q] += [(i, first + j) for j in range(count)]
            start += count
    return rows


def _expected_restore(P, Lb, sched, rows):
    """Scheduler-order token ``t``'s gathered row: rank 0's copy of a decode, the owner's otherwise."""
    where = {}
    for q in reversed(range(P)):  # rank 0 last: its copy of a replicated token wins
        for l, key in enumerate(rows[q]):
            where[key] = q * Lb + l
    return [where[(i, j)] for i, n in enumerate(sched) for j in range(n)]


def test_the_raw_layout_passes_check_layout():
    ex = _example()
    assert not isinstance(ex.CONTIGUOUS, (pcp_fn.PartitionLayout, pcp_fn.PackageLayout))
    assert isinstance(ex.CONTIGUOUS, pcp_fn.Layout)
    # hypothesis batches at P = 1..5 with 0 and 1 spec tokens (the spec-decode prep checked token by
    # token), the capacity edges, then no host sync / fullgraph compile / export at P = 3
    check_layout(ex.CONTIGUOUS, pcp_sizes=(1, 2, 3, 4, 5), max_examples=25, graph_pcp_sizes=(3,))


@pytest.mark.parametrize(
    ("P", "sched", "comp", "prompt"),
    [
        (2, [1, 5, 8], [7, 0, 0], [3, 5, 8]),  # the module docstring's batch
        (3, [2, 1, 7, 0, 2, 4], [9, 4, 0, 3, 5, 0], [6, 3, 7, 4, 7, 4]),  # spec decodes, an empty prefill
        (4, [3, 10], [0, 20], [3, 40]),  # a prefill shorter than P, a chunk behind its context
        (1, [1, 6], [5, 0], [5, 6]),
    ],
)
def test_the_rows_are_the_linear_split(P, sched, comp, prompt):
    _example()
    cfg = pcp_fn.PCPConfig(P, 0, 8, 64, num_spec_tokens=1, layout="contiguous")
    batch = pcp_fn.make_batch(cfg, sched, comp, prompt, slot_mapping=range(sum(sched)))
    arrays = [np.asarray(x, np.int64) for x in (sched, comp, prompt)]
    decodes = int(pcp_fn.protocol.classify_decodes(cfg, *arrays).sum())
    Lb = batch.bucket.num_tokens
    rows = _expected_rows(P, sched, decodes)
    _, out = pcp_fn.all_ranks(pcp_fn.step, pcp_fn.init_state(cfg, rank=0), batch)
    for q in range(P):
        n = len(rows[q])
        assert int(out.layout.num_tokens[q]) == n
        got = list(zip(out.layout.request_index[q, :n].tolist(), out.layout.positions[q, :n].tolist()))
        assert got == rows[q]
        assert out.positions[q, :n].tolist() == [comp[i] + j for i, j in rows[q]]
        assert out.query_start_loc[q, : len(sched) + 1].tolist() == [
            sum(1 for i, _ in rows[q] if i < k) for k in range(len(sched) + 1)
        ]
    # rank 0 holds the most rows: the host bound is its count
    assert cfg.layout_impl.num_local_tokens(cfg, arrays[0], decodes, arrays[1]) == len(rows[0])
    total = sum(sched)
    restore = out.layout.restore_index[0].tolist()
    assert restore[:total] == _expected_restore(P, Lb, sched, rows)
    assert restore[total:] == [0] * (P * Lb - total)
    assert out.layout.unpad_mask[0].tolist() == [t < total for t in range(P * Lb)]
    assert out.slot_mapping[0, :total].tolist() == list(range(total))
    assert out.logits_indices[0, : len(sched)].tolist() == [max(e - 1, 0) for e in np.cumsum(sched)]
    if P == 2:  # the docstring's arrays
        assert restore == [0, 1, 2, 3, 9, 10, 4, 5, 6, 7, 11, 12, 13, 14, 0, 0]
        assert out.logits_indices[0, :3].tolist() == [0, 5, 13]


def test_show_prints_one_step_of_each_rank(capsys):
    _example().show()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "rank 0: request [0, 1, 1, 1, 2, 2, 2, 2] offset [0, 0, 1, 2, 0, 1, 2, 3] "
        "positions [7, 0, 1, 2, 0, 1, 2, 3]"
    )
    assert lines[2] == "restore_index [0, 1, 2, 3, 9, 10, 4, 5, 6, 7, 11, 12, 13, 14]"


def test_the_example_runs_as_a_script():
    out = subprocess.run([sys.executable, str(PATH)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "check_layout: ok"
