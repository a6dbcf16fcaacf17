"""`pcp-fn compare`: what each layout costs every rank on one workload, as a table and a figure.

For a trace or a simulated schedule, and every layout at `P = 2..8`, summed over
the steps:

- tokens: the scheduled tokens a rank holds (a replicated decode counts on every rank);
- work: their causal attention work, key-query pairs (a token at absolute position
  `p` attends `p + 1` keys);
- padding: rows a rank all-gathers that are no token of its own: its pad rows and
  the rows up to the fullest rank (`all_gather` moves equal buffers; the graph
  bucket's rows past that are a capture artefact and are not counted);
- gathered: rows of the all-gather, `P` times the fullest rank's rows.

Everything is read off the layout's own `update_tokens` for every rank
([`pcp_fn.all_ranks`][]), so any registered [`pcp_fn.Layout`][] can be compared.
Each layout runs under the workload's own config
([`layout_config`][pcp_fn.sim.compare.layout_config]: every field that changes the partition or the
costs, e.g. `num_spec_tokens`, `dcp_size`, `pd_decode_recompute`), and a layout that refuses it
(`"mrv2-sharded"` with `dcp_size > 1`) is reported as a [`Refusal`][pcp_fn.sim.compare.Refusal],
never costed under another config. The table is printed
([`format_table`][pcp_fn.sim.compare.format_table]), drawn ([`plot`][pcp_fn.sim.compare.plot]: the
work imbalance too, every layout visible, the padding on a log scale, the workload in the caption)
and written as CSV and JSON ([`write_csv`][pcp_fn.sim.compare.write_csv],
[`write_json`][pcp_fn.sim.compare.write_json]). The figure needs matplotlib (the `plot` extra),
imported only for `--plot`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import PCPConfig, all_ranks, available_layouts, init_state, make_batch, update_tokens
from ..protocol import classify_decodes
from .trace import TraceStep, check_gathered_rows

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
"""The workload's `PCPConfig` fields every layout's config carries
([`layout_config`][pcp_fn.sim.compare.layout_config])."""
NOT_CARRIED_FIELDS = ("pcp_size", "pcp_rank", "layout", "hybrid_attn", "request_buckets", "token_buckets")
"""The ones it does not: what the comparison varies (`P`, the layout, which `hybrid_attn` selects), the rank
(every rank is costed), and the bucket ladders (graph shapes only: the costs count real rows, and the token
capacity a ladder is checked against differs at P = 1)."""


@dataclasses.dataclass(frozen=True)
class LayoutCost:
    """One layout at one `P` over a workload; per-rank tuples have `P` entries."""

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
    """[`LayoutCost`][pcp_fn.sim.compare.LayoutCost] of `layout` at `P = pcp_size` over `steps`
    (eager, host totals), every other config field at its default
    ([`compare_config`][pcp_fn.sim.compare.compare_config] carries a workload's)."""
    cfg = PCPConfig(pcp_size, 0, max_num_reqs, max_num_tokens, num_spec_tokens=num_spec_tokens, layout=layout)
    return config_cost(cfg, steps)


def config_cost(cfg: PCPConfig, steps: Sequence[TraceStep]) -> LayoutCost:
    """[`LayoutCost`][pcp_fn.sim.compare.LayoutCost] of `cfg`'s layout at `cfg.pcp_size` over
    `steps` (eager, host totals).

    A step the layout cannot batch raises `ValueError` naming the step."""
    P = cfg.pcp_size
    tokens, work, padding = np.zeros(P, np.int64), np.zeros(P, np.int64), np.zeros(P, np.int64)
    gathered = 0
    state = init_state(cfg, rank=0)
    for i, s in enumerate(steps):
        if not s.num_scheduled:
            continue
        if s.is_prefilling is not None:  # an engine's order: every layout here wants decodes first
            s = decodes_first(cfg, s)
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


def decodes_first(cfg: PCPConfig, s: TraceStep) -> TraceStep:
    """An engine-recorded step's requests reordered for `cfg`'s layouts: its decodes (by the
    layouts' rule, [`classify_decodes`][pcp_fn.protocol.classify_decodes]) first, each
    group in the engine's order. vLLM's model runner V2 sorts by drafts and query length, so a
    short prompt chunk may precede a decode; the per-rank costs do not depend on that order."""
    arrays = [np.asarray(a, np.int64) for a in (s.num_scheduled, s.num_computed, s.num_prompt)]
    order = np.argsort(~classify_decodes(cfg, *arrays), kind="stable")
    sched, comp, prompt = (tuple(a[order].tolist()) for a in arrays)
    return TraceStep(sched, comp, prompt)


def layout_config(workload: PCPConfig, layout: str, pcp_size: int) -> PCPConfig:
    """The config `layout` is costed under at `P = pcp_size`: the workload's
    [`CARRIED_FIELDS`][pcp_fn.sim.compare.CARRIED_FIELDS]; `ValueError` (the layout's own message)
    when it refuses it."""
    carried = {name: getattr(workload, name) for name in CARRIED_FIELDS}
    return PCPConfig(pcp_size=pcp_size, pcp_rank=0, layout=layout, **carried)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A layout at one `P` that was not costed, and why (its config refused, or a step)."""

    layout: str
    pcp_size: int
    reason: str


class LayoutFailed(RuntimeError):
    """A layout raised something other than a refusal (`ValueError`) while being costed;
    the message names the layout and `P`, the cause is chained."""


def compare_config(
    steps: Sequence[TraceStep], layouts: Sequence[str], pcp_sizes: Sequence[int], workload: PCPConfig
) -> tuple[list[LayoutCost], list[Refusal]]:
    """[`config_cost`][pcp_fn.sim.compare.config_cost] of every layout at every `P` under
    [`layout_config`][pcp_fn.sim.compare.layout_config], and the pairs refused (by the config, or at
    a step the layout cannot batch), in order.

    Raises `ValueError` for a name no layout is registered under, and
    [`LayoutFailed`][pcp_fn.sim.compare.LayoutFailed] when a layout's code fails otherwise."""
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
    """[`workload_cost`][pcp_fn.sim.compare.workload_cost] of every layout at every `P` (R, T and
    the spec tokens only; a refusal
    raises: [`compare_config`][pcp_fn.sim.compare.compare_config] carries the whole config and lists
    the refusals)."""
    steps = list(steps)
    return [
        workload_cost(name, P, steps, max_num_reqs, max_num_tokens, num_spec_tokens)
        for name in layouts
        for P in pcp_sizes
    ]


def serving_layouts(
    names: Sequence[str], max_num_reqs: int, max_num_tokens: int, num_spec_tokens: int = 0
) -> list[str]:
    """The layouts of `names` that serve the workload's config (a layout may refuse one:
    `"mrv2-sharded"` with spec tokens)."""
    served = []
    for name in names:
        try:
            PCPConfig(2, 0, max_num_reqs, max_num_tokens, num_spec_tokens=num_spec_tokens, layout=name)
        except ValueError:
            continue
        served.append(name)
    return served


def format_refusals(refused: Sequence[Refusal]) -> list[str]:
    """One line per layout and reason: `mrv2-sharded at P = 2, 3, 4: <reason>`."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in refused:
        groups.setdefault((r.layout, r.reason), []).append(r.pcp_size)
    return [
        f"{name} at P = {', '.join(map(str, sizes))}: {reason}" for (name, reason), sizes in groups.items()
    ]


def config_settings(workload: PCPConfig) -> str:
    """The carried fields that differ from `PCPConfig`'s defaults, as `", name=value"`
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


def describe(source: str, workload: PCPConfig) -> str:
    """The table's header line, and the figure's caption: the workload, `R`, `T` and the
    carried settings that differ from the defaults."""
    return (
        f"layouts on {source}, R={workload.max_num_reqs}, T={workload.max_num_tokens}"
        f"{config_settings(workload)}; summed over the steps"
    )


FIELDS = (
    "layout",
    "pcp_size",
    "tokens_max",
    "tokens_min",
    "work_max",
    "work_min",
    "imbalance",
    "padding",
    "gathered",
)
"""The columns of `--csv` (and the fields of each `--json` row), in the table's order."""


def table_records(costs: Sequence[LayoutCost]) -> list[dict[str, object]]:
    """The table's rows as [`FIELDS`][pcp_fn.sim.compare.FIELDS] dicts, the imbalance unrounded."""
    return [
        dict(
            zip(
                FIELDS,
                (
                    c.layout,
                    c.pcp_size,
                    max(c.tokens),
                    min(c.tokens),
                    max(c.work),
                    min(c.work),
                    c.work_imbalance,
                    sum(c.padding),
                    c.gathered,
                ),
            )
        )
        for c in costs
    ]


def write_csv(costs: Sequence[LayoutCost], path: str) -> None:
    """The table as CSV: a header of [`FIELDS`][pcp_fn.sim.compare.FIELDS], one row per (layout, P)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(table_records(costs))


def write_json(
    costs: Sequence[LayoutCost], refused: Sequence[Refusal], source: str, workload: PCPConfig, path: str
) -> None:
    """The table as JSON: the workload (`source`, the carried config fields), one object per
    (layout, P) with [`FIELDS`][pcp_fn.sim.compare.FIELDS] and the per-rank `tokens`, `work` and
    `padding`, and the pairs not costed with their reason."""
    rows = [
        {**record, "per_rank": {"tokens": list(c.tokens), "work": list(c.work), "padding": list(c.padding)}}
        for record, c in zip(table_records(costs), costs)
    ]
    document = {
        "workload": source,
        "config": {name: getattr(workload, name) for name in CARRIED_FIELDS},
        "rows": rows,
        "not_costed": [dataclasses.asdict(r) for r in refused],
    }
    with open(path, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


PANELS: tuple[tuple[str, Callable[[LayoutCost], float], bool], ...] = (
    ("fullest rank's tokens", lambda c: max(c.tokens), False),
    ("fullest rank's work (key-query pairs)", lambda c: max(c.work), False),
    ("work imbalance (fullest rank / mean)", lambda c: c.work_imbalance, False),
    ("padding rows, all ranks (log scale)", lambda c: sum(c.padding), True),
    ("gathered rows (log scale)", lambda c: c.gathered, True),
)
"""What the figure draws against `P`: title, value, whether its y axis is logarithmic."""
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")


def line_style(index: int, count: int) -> dict[str, object]:
    """The look of layout `index` of `count`: its own dash and hollow marker, the earlier
    layouts drawn wider and larger, so that a layout with the same values as an earlier
    one (`mrv2`'s tokens and work are `dcs`'s) shows inside it instead of hiding it."""
    wider = count - 1 - index
    return dict(
        linestyle=LINE_STYLES[index % len(LINE_STYLES)],
        marker=MARKERS[index % len(MARKERS)],
        markersize=5 + 2 * wider,
        markerfacecolor="none",
        linewidth=1.2 + 0.5 * wider,
    )


def _log_scale(ax: Any, values: Sequence[float]) -> None:
    """A logarithmic y axis, so that one layout's rows do not flatten the others'; symmetric
    (linear below 1) when a value is 0, which a log axis cannot show."""
    if min(values) > 0:
        ax.set_yscale("log")  # labels its minor ticks too when the values span under a decade
    else:
        ax.set_yscale("symlog", linthresh=1)


def plot(costs: Sequence[LayoutCost], path: str, caption: str = "") -> None:
    """Five panels against `P`, one line per layout: the fullest rank's tokens and work, the
    work imbalance (the table's key column), the total padding rows and the gathered rows
    (both on a log scale, `_log_scale`: one layout's padding does not flatten the
    others'), the legend in the sixth; `caption` on top. Written to `path` in the format
    of its extension."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 8), constrained_layout=True)
    names = list(dict.fromkeys(c.layout for c in costs))
    for ax, (title, value, log) in zip(axes.flat, PANELS):
        for i, name in enumerate(names):
            mine = [c for c in costs if c.layout == name]
            xs, ys = [c.pcp_size for c in mine], [value(c) for c in mine]
            ax.plot(xs, ys, label=name, **line_style(i, len(names)))
        if log:
            _log_scale(ax, [value(c) for c in costs])
        ax.set_title(title)
        ax.set_xlabel("P")
        ax.set_xticks(sorted({c.pcp_size for c in costs}))  # whole rank counts only
        ax.grid(True, alpha=0.3)
    axes.flat[2].axhline(1.0, color="grey", linewidth=0.8, zorder=0)  # perfectly balanced
    legend = axes.flat[5]
    legend.axis("off")
    legend.legend(*axes.flat[0].get_legend_handles_labels(), loc="center", title="layout")
    if caption:
        fig.suptitle("\n".join(textwrap.wrap(caption, 120)), fontsize="medium")
    fig.savefig(path, dpi=80)
    plt.close(fig)
