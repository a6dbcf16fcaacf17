"""``pcp-fn compare``: what each layout costs every rank on one workload, as a table and a figure.

For a trace or a simulated schedule, and every layout at ``P = 2..8``, summed over
the steps:

- tokens: the scheduled tokens a rank holds (a replicated decode counts on every rank);
- work: their causal attention work, key-query pairs (a token at absolute position
  ``p`` attends ``p + 1`` keys);
- padding: rows a rank all-gathers that are no token of its own: its pad rows and
  the rows up to the fullest rank (``all_gather`` moves equal buffers; the graph
  bucket's rows past that are a capture artefact and are not counted);
- gathered: rows of the all-gather, ``P`` times the fullest rank's rows.

Everything is read off the layout's own ``update_tokens`` for every rank
(:func:`pcp_fn.all_ranks`), so any registered :class:`pcp_fn.Layout` can be compared.
The figure needs matplotlib (the ``plot`` extra), imported only for ``--plot``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .. import PCPConfig, all_ranks, init_state, make_batch, update_tokens
from .trace import TraceStep


@dataclasses.dataclass(frozen=True)
class LayoutCost:
    """One layout at one ``P`` over a workload; per-rank tuples have ``P`` entries."""

    layout: str
    pcp_size: int
    tokens: tuple[int, ...]
    work: tuple[int, ...]
    padding: tuple[int, ...]
    gathered: int

    @property
    def work_imbalance(self) -> float:
        """Fullest rank's work over the mean (1.0: perfectly balanced)."""
        mean = sum(self.work) / len(self.work)
        return max(self.work) / mean if mean else 1.0


def workload_cost(
    layout: str,
    pcp_size: int,
    steps: Sequence[TraceStep],
    max_num_reqs: int,
    max_num_tokens: int,
    num_spec_tokens: int = 0,
) -> LayoutCost:
    """:class:`LayoutCost` of ``layout`` at ``P = pcp_size`` over ``steps`` (eager, host totals)."""
    cfg = PCPConfig(pcp_size, 0, max_num_reqs, max_num_tokens, num_spec_tokens=num_spec_tokens, layout=layout)
    P = pcp_size
    tokens, work, padding = np.zeros(P, np.int64), np.zeros(P, np.int64), np.zeros(P, np.int64)
    gathered = 0
    state = init_state(cfg, rank=0)
    for s in steps:
        if not s.num_scheduled:
            continue
        batch = make_batch(cfg, s.num_scheduled, s.num_computed, s.num_prompt)
        _, lay = all_ranks(update_tokens, state, batch)
        rows = lay.num_tokens.numpy()  # [P]
        request, offset = lay.request_index.numpy(), lay.positions.numpy()  # [P, L_b]
        sched = np.asarray(s.num_scheduled, np.int64)[request]
        comp = np.asarray(s.num_computed, np.int64)[request]
        held = (np.arange(request.shape[1])[None, :] < rows[:, None]) & (offset < sched)
        mine = held.sum(1)
        tokens += mine
        work += np.where(held, comp + offset + 1, 0).sum(1)
        padding += rows.max() - mine
        gathered += P * int(rows.max())
    return LayoutCost(
        layout, P, tuple(map(int, tokens)), tuple(map(int, work)), tuple(map(int, padding)), gathered
    )


def compare_layouts(
    steps: Sequence[TraceStep],
    layouts: Sequence[str],
    pcp_sizes: Sequence[int],
    max_num_reqs: int,
    max_num_tokens: int,
    num_spec_tokens: int = 0,
) -> list[LayoutCost]:
    """:func:`workload_cost` of every layout at every ``P``."""
    steps = list(steps)
    return [
        workload_cost(name, P, steps, max_num_reqs, max_num_tokens, num_spec_tokens)
        for name in layouts
        for P in pcp_sizes
    ]


def serving_layouts(
    names: Sequence[str], max_num_reqs: int, max_num_tokens: int, num_spec_tokens: int = 0
) -> list[str]:
    """The layouts of ``names`` that serve the workload's config (a layout may refuse one:
    ``"mrv2-sharded"`` with spec tokens); the default set of ``pcp-fn compare``."""
    served = []
    for name in names:
        try:
            PCPConfig(2, 0, max_num_reqs, max_num_tokens, num_spec_tokens=num_spec_tokens, layout=name)
        except ValueError:
            continue
        served.append(name)
    return served


HEADER = (
    "layout",
    "P",
    "tokens max",
    "tokens min",
    "work max",
    "work min",
    "imbalance",
    "padding",
    "gathered",
)


def format_table(costs: Sequence[LayoutCost]) -> str:
    """One row per (layout, P): per-rank extremes, work imbalance, total padding rows, gathered rows."""
    rows = [HEADER] + [
        (
            c.layout,
            str(c.pcp_size),
            str(max(c.tokens)),
            str(min(c.tokens)),
            str(max(c.work)),
            str(min(c.work)),
            f"{c.work_imbalance:.3f}",
            str(sum(c.padding)),
            str(c.gathered),
        )
        for c in costs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
        for r in rows
    )


def plot(costs: Sequence[LayoutCost], path: str) -> None:
    """Four panels against ``P``, one line per layout: the fullest rank's tokens and work, the
    total padding rows, the gathered rows; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    panels = [
        ("fullest rank's tokens", lambda c: max(c.tokens)),
        ("fullest rank's work (key-query pairs)", lambda c: max(c.work)),
        ("padding rows (all ranks)", lambda c: sum(c.padding)),
        ("gathered rows", lambda c: c.gathered),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    names = list(dict.fromkeys(c.layout for c in costs))
    for ax, (title, value) in zip(axes.flat, panels):
        for name in names:
            mine = [c for c in costs if c.layout == name]
            ax.plot([c.pcp_size for c in mine], [value(c) for c in mine], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("P")
        ax.set_xticks(sorted({c.pcp_size for c in costs}))  # whole rank counts only
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend()
    fig.savefig(path, dpi=80)
    plt.close(fig)
