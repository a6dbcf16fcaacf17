"""Ragged-to-fixed-shape primitives: the only index tricks the package uses.

A ragged batch is a vector of per-segment lengths, e.g. `lengths = [2, 0, 3]`
(segments A, -, C). A fixed-shape buffer of `cap = 7` slots lays them out
back to back and leaves the tail as padding:

    slot      0  1  2  3  4  5  6
    segment   A  A  C  C  C  .  .        segment_ids -> [0, 0, 2, 2, 2, 3, 3]
    offset    0  1  0  1  2  .  .        (padding slots: segment clamped, offset
    valid     T  T  T  T  T  F  F         meaningless, valid False)

No function here reads a tensor value on the host, and every output shape
depends only on the input shapes and `cap`: they trace under
`torch.compile(fullgraph=True)`, run on `meta` tensors and capture into
CUDA/ACL graphs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


def offsets(lengths: torch.Tensor) -> torch.Tensor:
    """`[n] -> [n + 1]` start offsets and the total, `[0, l0, l0 + l1, ...]`, int64."""
    return F.pad(torch.cumsum(lengths, dim=-1, dtype=torch.int64), (1, 0))


def arange_of(n: int, device: torch.device, arange: torch.Tensor | None = None) -> torch.Tensor:
    """int64 `arange(n)`, or the head of `arange` (a longer int64 arange the caller shares
    between several index maps: one kernel in an eager graph instead of one each)."""
    return torch.arange(n, dtype=torch.int64, device=device) if arange is None else arange[:n]


def expand_runs(
    starts: torch.Tensor, values: torch.Tensor, cap: int, *, arange: torch.Tensor | None = None
) -> torch.Tensor:
    """Paint `cap` slots with the value of the run that covers each one.

    Run `j` covers `[starts[j], starts[j + 1])` (`starts [m]` non-decreasing;
    empty runs repeat a start). `values` is `[m]` or `[k, m]` (`k`
    channels painted at once); the result is `[cap]` or `[k, cap]`. Slots
    before `starts[0]` get 0; the last run extends to the end.

        starts [0, 2, 2, 5], values [7, 8, 9, 4], cap 7 -> [7, 7, 9, 9, 9, 4, 4]

    Each slot finds its run by binary search ([`segment_of`][pcp_fn.core.ragged.segment_of] on the starts)
    and gathers the run's values: four wide kernels, no per-run loop, no scan.
    `arange`: an int64 arange of at least `cap` slots to take them from
    ([`arange_of`][pcp_fn.core.ragged.arange_of]; `starts` int64 then).
    """
    slot = torch.arange(cap, dtype=starts.dtype, device=starts.device) if arange is None else arange[:cap]
    run = segment_of(starts.clamp(max=cap), slot)  # runs starting at or before the slot: 0 before the first
    return F.pad(values, (1, 0)).index_select(-1, run)


def segment_of(ends: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """int64 `[n]`: for each slot of `slots = arange(n)`, how many `ends [m]` are `<= slot`.

    `ends` is non-decreasing. With `ends` the ends of back-to-back segments, that is the segment holding
    the slot (empty segments own none); slots past `ends[-1]` get `m`. With
    `ends[:-1]` instead, they fall in the last segment. Every end must lie in
    `[0, n]` (the caller's segments fit its slots).

    On a GPU or NPU: one binary search per slot (`searchsorted`; one kernel,
    fused by inductor's triton backend). On the CPU a binary search costs
    ~40-60 ns a slot once the ends outgrow the cache, and inductor's C++ backend
    cannot fuse it, so the CPU counts the ends instead: a histogram of the ends
    and its prefix sum, O(n + m) (a merge of two sorted lists).
    """
    if slots.device.type != "cpu":
        return torch.searchsorted(ends.contiguous(), slots, right=True)
    n = slots.shape[0]
    marks = torch.zeros(n + 1, dtype=torch.int64, device=slots.device)
    marks = marks.scatter_add(0, ends.to(torch.int64), torch.ones_like(ends, dtype=torch.int64))
    return marks.cumsum(0)[:n]


def segments_of(*searches: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    """[`segment_of`][pcp_fn.core.ragged.segment_of] of several `(ends, slots)` pairs at once (one
    histogram on the CPU).

    On the CPU the slot ranges are laid end to end and the ends of each shifted
    by the slots before it: one scatter and one prefix sum serve every search
    (a later search's counts then include every earlier end, subtracted). Elsewhere,
    one binary search each.
    """
    if searches[0][1].device.type != "cpu":
        return [segment_of(ends, slots) for ends, slots in searches]
    offset, shifted, firsts = 0, [], []
    for ends, slots in searches:
        shifted.append(ends.to(torch.int64) + offset if offset else ends.to(torch.int64))
        firsts.append(offset)
        offset += slots.shape[0]
    ends = torch.cat(shifted)
    marks = torch.zeros(offset + 1, dtype=torch.int64, device=ends.device)
    counts = marks.scatter_add(0, ends, torch.ones_like(ends)).cumsum(0)
    out, earlier = [], 0
    for (own, slots), first in zip(searches, firsts):
        part = counts[first : first + slots.shape[0]]
        out.append(part - earlier if earlier else part)
        earlier += own.shape[0]
    return out


class RaggedIndex(NamedTuple):
    """Per-slot view of a ragged layout; all fields `[cap]`."""

    segment: torch.Tensor  # int64 segment of each slot (the last segment's id on the padding tail)
    offset: torch.Tensor  # int64 offset of the slot inside its segment
    valid: torch.Tensor  # bool, False on the padding tail


def ragged_index(lengths: torch.Tensor, cap: int) -> RaggedIndex:
    """Segment id, offset and validity of each of `cap` slots for `lengths [n]`.

    `lengths = [2, 0, 3]`, `cap = 7` -> segment `[0, 0, 2, 2, 2, 2, 2]`,
    offset `[0, 1, 0, 1, 2, 3, 4]`, valid `[T, T, T, T, T, F, F]`.
    Empty segments own no slot.
    """
    starts = offsets(lengths)
    slot = torch.arange(cap, dtype=torch.int64, device=lengths.device)
    segment = segment_of(starts[1:-1], slot)  # the last segment also takes the padding tail
    start = F.pad(starts[1:-1], (1, 0)).index_select(-1, segment)
    return RaggedIndex(segment, slot - start, slot < starts[-1])


def scatter_to(dest: torch.Tensor, valid: torch.Tensor, values: torch.Tensor, size: int) -> torch.Tensor:
    """`out [size]` with `out[dest[j]] = values[j]` where `valid[j]`; 0 elsewhere.

    With `values = arange` this inverts a (partial) permutation without
    sorting: `forward = [2, 0, 1]` -> `[1, 2, 0]`. Invalid slots are written
    to a trash row past the end, then sliced off, so the result is
    deterministic as long as valid destinations are distinct.
    """
    dest = torch.where(valid, dest, size).reshape(-1)
    out = torch.zeros(size + 1, dtype=values.dtype, device=values.device)
    return out.scatter(0, dest, values.reshape(-1))[:size]


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`values[index]` along dim 0 with `index` clamped in range: the one safe gather.

    Fixed-shape code computes indices on padding rows too; clamping keeps those
    reads in bounds (their results are masked or documented by the caller), so
    a gather never faults on a device where nothing checks bounds.
    """
    return values[index.clamp(0, max(values.shape[0] - 1, 0))]


def masked_gather(values: torch.Tensor, index: torch.Tensor, mask: torch.Tensor, fill: int) -> torch.Tensor:
    """`values[index]` where `mask`, else `fill` ([`take`][pcp_fn.core.ragged.take], then a select).

    The fixed-shape replacement for `out[mask] = values` (compaction read
    backwards: each output row knows which input row it takes).
    """
    gathered = take(values, index)
    if gathered.dim() > mask.dim():
        mask = mask.reshape(*mask.shape, *([1] * (gathered.dim() - mask.dim())))
    return torch.where(mask, gathered, fill)
