"""`pcp-fn compare`: the table's numbers against an independent per-request count, and the figure."""

from __future__ import annotations

import numpy as np
import pytest

from pcp_fn.sim import cli
from pcp_fn.sim.compare import compare_layouts, workload_cost
from pcp_fn.sim.trace import TraceStep, write_trace

R, T = 6, 64
# decodes first (context, one token, prompt done), then fresh and chunked prefills
STEPS = [
    TraceStep((13, 30), (0, 0), (13, 40)),
    TraceStep((1, 10, 21), (13, 30, 0), (13, 40, 21)),
    TraceStep((1, 1, 1, 7), (14, 41, 21, 0), (13, 40, 21, 7)),
    TraceStep((1,), (8,), (7,)),
]


def _chunks_of(n, P, q):
    """Tokens of a prefill of ``n`` that DualChunkSwap / MRV2 rank ``q`` holds: chunks q and 2P-1-q of
    ceil(n / 2P), cut at n; and the rows DualChunkSwap pads them to."""
    c = -(-n // (2 * P))
    toks = [j for m in (q, 2 * P - 1 - q) for j in range(m * c, min((m + 1) * c, n))]
    return sorted(toks), 2 * c


def _linear_of(n, P, q):
    """The hybrid layout's linear split: n // P + (q < n % P) consecutive tokens."""
    size = n // P + (q < n % P)
    first = q * (n // P) + min(q, n % P)
    return list(range(first, first + size))


def independent(layout, P):
    tokens, work, padding, gathered = np.zeros(P, int), np.zeros(P, int), np.zeros(P, int), 0
    for s in STEPS:
        rows, mine = np.zeros(P, int), [[] for _ in range(P)]
        for n, k, p in zip(s.num_scheduled, s.num_computed, s.num_prompt):
            decode = k >= max(p, 1) and n <= 1
            for q in range(P):
                if decode or P == 1:
                    held, r = list(range(n)), n
                elif layout == "hybrid":
                    held = _linear_of(n, P, q)
                    r = len(held)
                else:
                    held, r = _chunks_of(n, P, q)
                    r = r if layout == "dcs" else len(held)
                rows[q] += r
                mine[q] += [k + j + 1 for j in held]  # a token at position k + j attends k + j + 1 keys
        for q in range(P):
            tokens[q] += len(mine[q])
            work[q] += sum(mine[q])
            padding[q] += rows.max() - len(mine[q])
        gathered += P * rows.max()
    return tokens.tolist(), work.tolist(), padding.tolist(), int(gathered)


@pytest.mark.parametrize("P", [2, 3, 5])
@pytest.mark.parametrize("layout", ["dcs", "hybrid", "mrv2"])
def test_costs_equal_an_independent_count(layout, P):
    cost = workload_cost(layout, P, STEPS, R, T)
    assert (list(cost.tokens), list(cost.work), list(cost.padding), cost.gathered) == independent(layout, P)


def test_compare_prints_the_table_and_writes_the_figure(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # in the test extra: it runs in CI
    trace = tmp_path / "t.jsonl"
    write_trace(trace, cli.PCPConfig(2, 0, R, T), STEPS)
    png = tmp_path / "out.png"
    args = ["compare", str(trace), "--layouts", "dcs,hybrid,mrv2", "--pcp-sizes", "2:4", "--plot", str(png)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    table = {(r.split()[0], int(r.split()[1])): r.split()[2:] for r in out[2:-1]}
    assert len(table) == 9
    for (layout, P), row in table.items():
        tokens, work, padding, gathered = independent(layout, P)
        mean = sum(work) / P
        expected = [max(tokens), min(tokens), max(work), min(work), f"{max(work) / mean:.3f}", sum(padding)]
        assert row == [str(x) for x in [*expected, gathered]], (layout, P)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).shape[:2] == (560, 800)  # 10 x 7 in at 80 dpi


def test_compare_simulates_a_workload_without_a_trace(capsys):
    argv = ["compare", "--requests", "3", "--prompt-len", "5:40", "--output-len", "2", "--pcp-sizes", "2"]
    assert cli.main([*argv, "--layouts", "dcs,mrv2", "--max-num-tokens", "64", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "a simulated workload (3 requests" in out and "\nmrv2 " in out


def test_compare_layouts_covers_every_pair():
    costs = compare_layouts(STEPS, ["dcs", "mrv2"], [2, 4], R, T)
    assert [(c.layout, c.pcp_size) for c in costs] == [("dcs", 2), ("dcs", 4), ("mrv2", 2), ("mrv2", 4)]
    # the same chunks: the same tokens and work; MRV2 cuts them at the request's end: never more padding
    assert costs[0].work == costs[2].work and sum(costs[3].padding) <= sum(costs[1].padding)
