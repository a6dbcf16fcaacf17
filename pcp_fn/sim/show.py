"""`pcp-fn show`: which rank holds which token of one batch, under any layout, as text or a figure.

The drawing is read off the layout's own outputs, never drawn by hand: every rank's
[`pcp_fn.step`][pcp_fn.step.step] ([`pcp_fn.all_ranks`][]) gives its local rows (request, offset,
absolute position); [`pcp_fn.restore_hidden_states`][] of the gathered row numbers gives
the gathered row each restored row reads; the layout's `restored_spans` where each
request's rows start. So a registered researcher's layout draws like a built-in. The text
is the README's picture (DualChunkSwap, `P = 2`, scheduled `[1, 5, 8]`):

    request                 0 (decode)   1 (n=5, padded to 8)   2 (n=8)
    padded gathered rows    d d          0 1 2 3 4 . . .        0 1 2 3 4 5 6 7
    chunk -> rank           r0 r1        r0  r1  r1  r0         r0  r1  r1  r0
    rank 0 local tokens     d            0 1 . .                0 1 6 7
    rank 1 local tokens     d            2 3 4 .                2 3 4 5

each rank's line ending with its rows' offsets (`positions [0, 0,1,6,7, 0,1,6,7]`); then
the absolute positions, the restored order (the gathered rows each request reads) and the
logits rows. The figure (`--plot`) needs matplotlib, imported only then.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from .. import PCPConfig, all_ranks, init_state, layout_of, make_batch, restore_hidden_states, step

README_BATCH = ((1, 5, 8), (3, 0, 0), (3, 5, 8))
"""The README's batch: a decode with 3 tokens computed, a 5-token and an 8-token prefill."""
MAX_TOKENS = 4096
"""The most scheduled tokens `show` draws (a picture, not a workload)."""


@dataclasses.dataclass(frozen=True)
class LocalRow:
    """One row of a rank's local buffer that holds a token (or a pad) of a request."""

    rank: int
    row: int  # in the rank's [L_b] buffer; gathered row rank * L_b + row
    request: int  # -1: a row past the rank's local tokens (read only as a filler)
    offset: int  # inside the request's scheduled tokens; >= n: a pad row
    position: int  # absolute position, num_computed + offset


@dataclasses.dataclass(frozen=True)
class Ownership:
    """One batch under one layout: every rank's local rows, and each request's restored rows
    (the local row each one is read from, in the restored order)."""

    layout: str
    pcp_size: int
    num_scheduled: tuple[int, ...]
    num_computed: tuple[int, ...]
    num_prompt: tuple[int, ...]
    is_decode: tuple[bool, ...]
    rows_per_rank: int  # L_b: the all-gather stacks P buffers of this many rows
    local: tuple[tuple[LocalRow, ...], ...]  # [P]: the rank's rows that hold a token or a pad
    restored: tuple[tuple[LocalRow, ...], ...]  # [num_reqs]: the rows each request reads
    logits: tuple[int, ...]  # restored row of each request's last token

    def label(self, row: LocalRow) -> str:
        """A token's mark: its offset, `d` for a one-token decode, `.` for a pad, `?`
        for a row of no token of the request."""
        if row.request < 0:
            return "?"
        n = self.num_scheduled[row.request]
        if row.offset >= n:
            return "."
        return "d" if self.is_decode[row.request] and n == 1 else str(row.offset)


def check_batch_counts(scheduled: Sequence[int], computed: Sequence[int], prompt: Sequence[int]) -> None:
    """`ValueError` naming the flag for a batch `show` cannot draw (`make_batch` checks
    the rest: a decode after a prefill, say)."""
    flags = {"--scheduled": scheduled, "--computed": computed, "--prompt": prompt}
    for flag, values in flags.items():
        if len(values) != len(scheduled):
            raise ValueError(
                f"{flag} has {len(values)} values, --scheduled {len(scheduled)}: one per request"
            )
    for i, (n, k, p) in enumerate(zip(scheduled, computed, prompt)):
        if n < 1 or k < 0 or p < 1:
            raise ValueError(
                f"request {i}: --scheduled {n} must be >= 1, --computed {k} >= 0, --prompt {p} >= 1"
            )
        if k < p < k + n:  # a prefill schedules its prompt's tokens only
            raise ValueError(
                f"request {i}: --computed {k} + --scheduled {n} runs past --prompt {p} "
                "(a prefill schedules prompt tokens only)"
            )
    if sum(scheduled) > MAX_TOKENS:
        raise ValueError(f"--scheduled sums to {sum(scheduled)} tokens; show draws at most {MAX_TOKENS}")


def ownership(
    layout: str,
    pcp_size: int,
    scheduled: Sequence[int],
    computed: Sequence[int],
    prompt: Sequence[int],
    num_spec_tokens: int = 0,
) -> Ownership:
    """The batch under `layout` at `P = pcp_size`, read off every rank's [`pcp_fn.step`][pcp_fn.step.step]
    and [`pcp_fn.restore_hidden_states`][] (`ValueError` for a batch or config the layout
    refuses)."""
    check_batch_counts(scheduled, computed, prompt)
    P, tokens = pcp_size, sum(scheduled)
    cfg = PCPConfig(P, 0, len(scheduled), tokens, num_spec_tokens=num_spec_tokens, layout=layout)
    batch = make_batch(cfg, scheduled, computed, prompt, slot_mapping=range(tokens))
    Lb = batch.bucket.num_tokens
    _, outs = all_ranks(step, init_state(cfg, rank=0), batch)  # [P, ...]: rank r's row r
    num_local = outs.layout.num_tokens.tolist()
    request, offset = outs.layout.request_index.tolist(), outs.layout.positions.tolist()
    position = outs.positions.tolist()
    rows = [
        LocalRow(r, j, request[r][j] if j < num_local[r] else -1, offset[r][j], position[r][j])
        for r in range(P)
        for j in range(Lb)
    ]
    # the restore reads gathered rows: restoring the gathered row numbers says which each row reads
    state, _ = step(init_state(cfg, rank=0), batch)
    _, source = restore_hidden_states(state, torch.arange(P * Lb))
    spans = layout_of(cfg).restored_spans(state)
    regions = _regions(
        rows, source.tolist(), spans.start[: len(scheduled)].tolist(), spans.length[: len(scheduled)].tolist()
    )
    return Ownership(
        layout=cfg.layout_name,
        pcp_size=P,
        num_scheduled=tuple(scheduled),
        num_computed=tuple(computed),
        num_prompt=tuple(prompt),
        is_decode=tuple(outs.layout.is_decode[0, : len(scheduled)].tolist()),
        rows_per_rank=Lb,
        local=tuple(tuple(x for x in rows[r * Lb : (r + 1) * Lb] if x.request >= 0) for r in range(P)),
        restored=regions,
        logits=tuple(outs.logits_indices[0, : len(scheduled)].tolist()),
    )


def _regions(
    rows: list[LocalRow], source: list[int], start: list[int], length: list[int]
) -> tuple[tuple[LocalRow, ...], ...]:
    """Each request's restored rows: from its span's start to the next request's (a DualChunkSwap
    decode's copies sit between); the last request's span, then any more rows of its own (a
    replicated decode's copies), each gathered row once."""
    order = sorted(range(len(start)), key=lambda i: start[i])
    out: dict[int, tuple[LocalRow, ...]] = {}
    for k, i in enumerate(order):
        if k + 1 < len(order):
            out[i] = tuple(rows[g] for g in source[start[i] : start[order[k + 1]]])
            continue
        end, seen = start[i] + length[i], set(source[start[i] : start[i] + length[i]])
        while end < len(source) and rows[source[end]].request == i and source[end] not in seen:
            seen.add(source[end])
            end += 1
        out[i] = tuple(rows[g] for g in source[start[i] : end])
    return tuple(out[i] for i in range(len(start)))


def _rank_marks(marks: list[str], ranks: list[int]) -> str:
    """The `chunk -> rank` cell under a request's gathered rows: the source rank of each chunk,
    each label under the chunk's first token, moved right only as far as not to touch the
    label before. A chunk is the largest size that divides every run of rows read from one
    rank but the last (a chunk cut at the request's end: MRV2's), else each run is one."""
    runs, at = [], 0
    while at < len(ranks):
        end = at
        while end < len(ranks) and ranks[end] == ranks[at]:
            end += 1
        runs.append((at, end - at))
        at = end
    sizes = [size for _, size in runs]
    width = math.gcd(*sizes[:-1]) if len(sizes) > 1 else len(ranks)
    firsts = [at for at, _ in runs] if width <= 1 else list(range(0, len(ranks), width))
    columns = [sum(len(m) + 1 for m in marks[:k]) for k in range(len(marks) + 1)]
    text = ""
    for k in firsts:
        pad = columns[k] - len(text) if not text else max(columns[k] - len(text), 1)
        text += " " * pad + f"r{ranks[k]}"
    return text


def _columns(own: Ownership) -> list[list[str]]:
    """Per request the table's cells, top to bottom: header, gathered rows, ranks, each rank's rows."""
    cells = []
    for i, region in enumerate(own.restored):
        n = own.num_scheduled[i]
        if own.is_decode[i]:
            head = f"{i} (decode)" if n == 1 else f"{i} (decode, n={n})"
        else:
            head = f"{i} (n={n}, padded to {len(region)})" if len(region) > n else f"{i} (n={n})"
        marks = [own.label(x) for x in region]
        local = [" ".join(own.label(x) for x in rows if x.request == i) or "-" for rows in own.local]
        cells.append([head, " ".join(marks), _rank_marks(marks, [x.rank for x in region]), *local])
    return cells


def _offsets(own: Ownership, rank: int) -> str:
    """`[0, 0,1,6,7, 0,1,6,7]`: the rank's offsets, request by request (the README's positions)."""
    groups = [
        ",".join(str(x.offset) for x in own.local[rank] if x.request == i) for i in range(len(own.restored))
    ]
    return "[" + ", ".join(g for g in groups if g) + "]"


def format_table(own: Ownership) -> list[str]:
    """The README's picture of the batch: one column per request, one line per rank."""
    labels = ["request", "padded gathered rows", "chunk -> rank"]
    labels += [f"rank {r} local tokens" for r in range(own.pcp_size)]
    columns = _columns(own)
    widths = [max(map(len, labels)) + 4] + [max(map(len, col)) + 3 for col in columns]
    lines = []
    for k, label in enumerate(labels):
        cells = [label, *(col[k] for col in columns)]
        line = "".join(c.ljust(w) for c, w in zip(cells, widths))
        if k >= 3:
            line += f"positions {_offsets(own, k - 3)}"
        lines.append(line.rstrip())
    return lines


def format_ownership(own: Ownership) -> str:
    """The whole text: the batch, the table, the absolute positions, the restored order."""
    Lb = own.rows_per_rank
    lines = [
        f"layout {own.layout}, P={own.pcp_size}: scheduled {list(own.num_scheduled)}, computed "
        f"{list(own.num_computed)}, prompt {list(own.num_prompt)}",
        "(a token by its offset among the request's n scheduled tokens; d: a decode's token; "
        ".: a pad row; -: none on this rank)",
        "",
        *format_table(own),
        "",
        "absolute positions (num_computed + offset):",
    ]
    for r, rows in enumerate(own.local):
        lines.append(f"  rank {r}  {[x.position for x in rows]}")
    lines += [
        "restored order: the gathered row each restored row is read from (restore_hidden_states);",
        f"the all-gather stacks the ranks' {Lb}-row buffers, rank r's row j at r*{Lb}+j:",
        *(
            f"  request {i}  {' '.join(str(x.rank * Lb + x.row) for x in region)}"
            for i, region in enumerate(own.restored)
        ),
        f"logits rows (each request's last token in the restored order): {list(own.logits)}",
    ]
    return "\n".join(lines)


def plot(own: Ownership, path: str) -> None:
    """The table as a figure: the restored rows, one cell per row coloured by the rank it is
    read from, then each rank's local rows under their request; pads hatched. Written to
    `path` in the format of its extension."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    starts = [0]
    for region in own.restored:
        starts.append(starts[-1] + len(region) + 1)  # a free cell between requests
    width, height = starts[-1], own.pcp_size + 1
    fig, ax = plt.subplots(
        figsize=(min(60.0, 2.5 + 0.45 * width), 1.4 + 0.5 * height), constrained_layout=True
    )
    colours = plt.get_cmap("tab10" if own.pcp_size <= 10 else "tab20")

    def cell(x: int, y: int, row: LocalRow) -> None:
        pad = own.label(row) in ".?"
        colour = colours(row.rank % colours.N)
        ax.add_patch(
            Rectangle(
                (x, y), 0.92, 0.8, facecolor=colour, alpha=0.35 if pad else 0.8, hatch="//" if pad else None
            )
        )
        ax.text(x + 0.46, y + 0.4, own.label(row), ha="center", va="center", fontsize=9)

    for i, region in enumerate(own.restored):
        for k, row in enumerate(region):
            cell(starts[i] + k, own.pcp_size, row)
        ax.text(starts[i], height + 0.05, f"request {i}", fontsize=9)
        for r, rows in enumerate(own.local):
            for k, row in enumerate(x for x in rows if x.request == i):
                cell(starts[i] + k, own.pcp_size - 1 - r, row)
    ticks = [own.pcp_size - 1 - r + 0.4 for r in range(own.pcp_size)] + [own.pcp_size + 0.4]
    ax.set_yticks(ticks, [f"rank {r} local rows" for r in range(own.pcp_size)] + ["restored rows"])
    ax.set_xticks([])
    ax.set_xlim(-0.2, width)
    ax.set_ylim(-0.2, height + 0.5)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    handles = [Patch(color=colours(r % colours.N), label=f"rank {r}") for r in range(own.pcp_size)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.tick_params(axis="y", length=0)
    ax.set_title(
        f"layout {own.layout}, P={own.pcp_size}: scheduled {list(own.num_scheduled)}, computed "
        f"{list(own.num_computed)}, prompt {list(own.num_prompt)}\n"
        "a token by its offset in the request's scheduled tokens; d: a decode's token; hatched: a pad",
        fontsize=10,
    )
    fig.savefig(path, dpi=80)
    plt.close(fig)
