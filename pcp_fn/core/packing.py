"""Staging layouts declared once: a step's per-request rows and scalars in one int32 buffer.

A host boundary moves a step's per-request arrays to the device in one copy; a
captured graph reads them from one persistent buffer. Both sides must agree on
where each array lives. [`PackedRequests`][pcp_fn.core.packing.PackedRequests] names them, so no offset is
written anywhere else:

    layout = PackedRequests(rows=("num_scheduled", "num_computed"), scalars=("num_reqs",))
    R = 3, two requests scheduled [4, 1] with [0, 7] computed:

    word     0  1  2 | 3  4  5 | 6
    buffer [ 4  1  0 | 0  7  0 | 2 ]
             num_scheduled  num_computed  num_reqs

    layout.pack(host, R, 2, ([4, 1], [0, 7]), (2,))          # the host side
    views = layout.unpack(device_buffer, R)                  # the graph side (views, no copy)
    views["num_computed"]  ->  tensor([0, 7, 0]);  views["num_reqs"]  ->  tensor(2)  (0-d)

Rows past the requests are zero (a graph reads `[R]` rows whatever the step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class PackedRequests:
    """`rows` `[R]` int32 arrays, one after the other, then `scalars` words.

    Attributes:
        rows: the per-request arrays' names, in buffer order.
        scalars: the names of the words after them.
    """

    rows: tuple[str, ...]
    scalars: tuple[str, ...]

    def size(self, R: int) -> int:
        """Words in the buffer for `R` requests."""
        return len(self.rows) * R + len(self.scalars)

    def sizes(self, R: int) -> list[int]:
        """Each part's words, in buffer order (for `split_with_sizes`)."""
        return [R] * len(self.rows) + [1] * len(self.scalars)

    def with_scalars(self, *names: str) -> PackedRequests:
        """This layout with more scalar words after its own (the same rows and offsets)."""
        return PackedRequests(self.rows, (*self.scalars, *names))

    def offset(self, R: int, name: str) -> int:
        """The first word of `name`."""
        if name in self.rows:
            return self.rows.index(name) * R
        return len(self.rows) * R + self.scalars.index(name)

    def table(self, buffer: np.ndarray, R: int) -> np.ndarray:
        """`[len(rows), R]`: the rows of a host `buffer` (a view)."""
        return buffer[: len(self.rows) * R].reshape(len(self.rows), R)

    def pack(
        self,
        buffer: np.ndarray,
        R: int,
        n: int,
        rows: Sequence[Any],
        scalars: Sequence[int],
        zero_to: int = -1,
    ) -> None:
        """Write `rows` (each `[n]`, the `n` requests', in
        [`rows`][pcp_fn.core.packing.PackedRequests] order) and `scalars` (in
        [`scalars`][pcp_fn.core.packing.PackedRequests] order) into a host `buffer`; the rows'
        entries from `n` to `zero_to` (default `R`: all) are zeroed. A buffer reused each step
        passes the last step's `n` as `zero_to`: its words past that are still zero."""
        Packer(self, buffer, R).pack(n, rows, scalars, zero_to)

    def packer(self, buffer: np.ndarray, R: int) -> Packer:
        """[`pack`][pcp_fn.core.packing.PackedRequests.pack] bound to one host `buffer` (a buffer
        reused every step keeps one)."""
        return Packer(self, buffer, R)

    def unpack(self, buffer: torch.Tensor, R: int) -> dict[str, torch.Tensor]:
        """Views of a device `buffer` by name: `[R]` rows, 0-d scalars (no copy; in a graph)."""
        # one plain loop: a plain (eager) graph call runs this every step, and a comprehension
        # costs a function object, a frame and an enumerate more
        views: dict[str, torch.Tensor] = {}
        at = 0
        for name in self.rows:
            views[name] = buffer[at : at + R]
            at += R
        for name in self.scalars:
            views[name] = buffer[at]
            at += 1
        return views


class Packer:
    """[`PackedRequests.pack`][pcp_fn.core.packing.PackedRequests.pack] bound to one host buffer:
    its `[len(rows), R]` table view and scalar words made once."""

    __slots__ = ("buffer", "scalars_at", "table")

    def __init__(self, layout: PackedRequests, buffer: np.ndarray, R: int) -> None:
        self.buffer = buffer
        self.table = layout.table(buffer, R)
        self.scalars_at = len(layout.rows) * R

    def pack(self, n: int, rows: Sequence[Any], scalars: Sequence[int], zero_to: int = -1) -> None:
        """See [`PackedRequests.pack`][pcp_fn.core.packing.PackedRequests.pack]."""
        table = self.table
        # row by row: assigning a tuple of arrays builds a [k, n] temporary first
        for k, values in enumerate(rows):
            table[k, :n] = values
        end = table.shape[1] if zero_to < 0 else zero_to
        if n < end:
            table[:, n:end] = 0
        at = self.scalars_at
        for k, value in enumerate(scalars):
            self.buffer[at + k] = value
