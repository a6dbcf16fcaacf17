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
Each layout runs under the workload's own config (:func:`layout_config`: every field
that changes the partition or the costs, e.g. ``num_spec_tokens``, ``dcp_size``,
``pd_decode_recompute``), and a layout that refuses it (``"mrv2-sharded"`` with
``dcp_size > 1``) is reported as a :class:`Refusal`, never costed under another config.
The figure needs matplotlib (the ``plot`` extra), imported only for ``--plot``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Sequence

import numpy as np

from .. import PCPConfig, all_ranks, available_layouts, init_state, make_batch, update_tokens
from .trace import TraceStep, check_gathered_rows

#: The workload's ``PCPConfig`` fields every layout's config carries (:func:`layout_config`).
CARRIED_FIELDS = (
    "max_num_reqs",
    "max_num_tokens",
    "dcp_size",
    "dcp_rank",
    "num_spec_tokens",
    "cp_kv_cache_interleave_size",
    "pad_slot_id",
    "pd_decode_recompute",
)
#: The ones it does not: what the comparison varies (``P``, the layout, which ``hybrid_attn``
#: selects), the rank (every rank is costed), and the bucket ladders (graph shapes only: the
#: costs count real rows, and the token capacity a ladder is checked against differs at P = 1).
NOT_CARRIED_FIELDS = ("pcp_size", "pcp_rank", "layout", "hybrid_attn", "request_buckets", "token_buckets")


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
    """:class:`LayoutCost` of ``layout`` at ``P = pcp_size`` over ``steps`` (eager, host totals),
    every other config field at its default (:func:`compare_config` carries a workload's)."""
    cfg = PCPConfig(pcp_size, 0, max_num_reqs, max_num_tokens, num_spec_tokens=num_spec_tokens, layout=layout)
    return config_cost(cfg, steps)


def config_cost(cfg: PCPConfig, steps: Sequence[TraceStep]) -> LayoutCost:
    """:class:`LayoutCost` of ``cfg``'s layout at ``cfg.pcp_size`` over ``steps`` (eager, host totals).

    A step the layout cannot batch raises ``ValueError`` naming the step."""
    P = cfg.pcp_size
    tokens, work, padding = np.zeros(P, np.int64), np.zeros(P, np.int64), np.zeros(P, np.int64)
    gathered = 0
    state = init_state(cfg, rank=0)
    for i, s in enumerate(steps):
        if not s.num_scheduled:
            continue
        try:
            batch = make_batch(cfg, s.num_scheduled, s.num_computed, s.num_prompt)
        except ValueError as e:
            raise ValueError(f"step {i}: {e}") from None
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
        cfg.layout_name, P, tuple(map(int, tokens)), tuple(map(int, work)), tuple(map(int, padding)), gathered
    )


def layout_config(workload: PCPConfig, layout: str, pcp_size: int) -> PCPConfig:
    """The config ``layout`` is costed under at ``P = pcp_size``: the workload's
    :data:`CARRIED_FIELDS`; ``ValueError`` (the layout's own message) when it refuses it."""
    carried = {name: getattr(workload, name) for name in CARRIED_FIELDS}
    return PCPConfig(pcp_size=pcp_size, pcp_rank=0, layout=layout, **carried)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A layout at one ``P`` that was not costed, and why (its config refused, or a step)."""

    layout: str
    pcp_size: int
    reason: str


class LayoutFailed(RuntimeError):
    """A layout raised something other than a refusal (``ValueError``) while being costed;
    the message names the layout and ``P``, the cause is chained."""


def compare_config(
    steps: Sequence[TraceStep], layouts: Sequence[str], pcp_sizes: Sequence[int], workload: PCPConfig
) -> tuple[list[LayoutCost], list[Refusal]]:
    """:func:`config_cost` of every layout at every ``P`` under :func:`layout_config`, and the
    pairs refused (by the config, or at a step the layout cannot batch), in order.

    Raises ``ValueError`` for a name no layout is registered under, and :class:`LayoutFailed`
    when a layout's code fails otherwise."""
    unknown = [name for name in layouts if name not in available_layouts()]
    if unknown:
        raise ValueError(f"unknown layout {unknown[0]!r}; registered: {sorted(available_layouts())}")
    steps = list(steps)
    costs, refused = [], []
    for name in layouts:
        for P in pcp_sizes:
            try:
                cfg = layout_config(workload, name, P)
                check_gathered_rows(cfg)  # a trace's limit: the states and outputs are sized by it
                costs.append(config_cost(cfg, steps))
            except ValueError as e:
                refused.append(Refusal(name, P, " ".join(str(e).split())))
            except Exception as e:  # a researcher's layout code: name it, keep the cause
                raise LayoutFailed(f"layout {name!r} at P={P} failed: {type(e).__name__}: {e}") from e
    return costs, refused


def compare_layouts(
    steps: Sequence[TraceStep],
    layouts: Sequence[str],
    pcp_sizes: Sequence[int],
    max_num_reqs: int,
    max_num_tokens: int,
    num_spec_tokens: int = 0,
) -> list[LayoutCost]:
    """:func:`workload_cost` of every layout at every ``P`` (R, T and the spec tokens only; a refusal
    raises: :func:`compare_config` carries the whole config and lists the refusals)."""
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
    ``"mrv2-sharded"`` with spec tokens)."""
    served = []
    for name in names:
        try:
            PCPConfig(2, 0, max_num_reqs, max_num_tokens, num_spec_tokens=num_spec_tokens, layout=name)
        except ValueError:
            continue
        served.append(name)
    return served


def format_refusals(refused: Sequence[Refusal]) -> list[str]:
    """One line per layout and reason: ``mrv2-sharded at P = 2, 3, 4: <reason>``."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in refused:
        groups.setdefault((r.layout, r.reason), []).append(r.pcp_size)
    return [
        f"{name} at P = {', '.join(map(str, sizes))}: {reason}" for (name, reason), sizes in groups.items()
    ]


def config_settings(workload: PCPConfig) -> str:
    """The carried fields that differ from ``PCPConfig``'s defaults, as ``", name=value"``
    (what the table's header line adds to R and T)."""
    defaults = {f.name: f.default for f in dataclasses.fields(PCPConfig)}
    return "".join(
        f", {name}={getattr(workload, name)}"
        for name in CARRIED_FIELDS[2:]
        if getattr(workload, name) != defaults[name]
    )


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


def check_plot_path(path: str) -> None:
    """Before any work: ``path`` can take the figure (its folder exists, it is no folder, its
    extension names a format matplotlib writes) and matplotlib is importable; ``ValueError``
    or ``OSError`` naming ``path`` otherwise."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"{os.strerror(errno.ENOENT)} (its folder {folder})", path)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise ValueError(
            "--plot needs matplotlib, which is not installed: pip install 'pcp_fn[plot]'"
        ) from None
    formats = FigureCanvasAgg.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        given = f"extension .{ext}" if ext else "no extension"
        raise ValueError(
            f"--plot {path}: {given}; name the figure's format by its extension: {', '.join(sorted(formats))}"
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
