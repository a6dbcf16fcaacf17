"""Ragged-to-fixed-shape primitives: the only index tricks the package uses.

A ragged batch is a vector of per-segment lengths, e.g. ``lengths = [2, 0, 3]``
(segments A, -, C). A fixed-shape buffer of ``cap = 7`` slots lays them out
back to back and leaves the tail as padding::

    slot      0  1  2  3  4  5  6
    segment   A  A  C  C  C  .  .        segment_ids -> [0, 0, 2, 2, 2, 3, 3]
    offset    0  1  0  1  2  .  .        (padding slots: segment clamped, offset
    valid     T  T  T  T  T  F  F         meaningless, valid False)

No function here reads a tensor value on the host, and every output shape
depends only on the input shapes and ``cap``: they trace under
``torch.compile(fullgraph=True)``, run on ``meta`` tensors and capture into
CUDA/ACL graphs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


def offsets(lengths: torch.Tensor) -> torch.Tensor:
    """``[n] -> [n + 1]`` start offsets and the total, ``[0, l0, l0 + l1, ...]``, int64."""
    return F.pad(torch.cumsum(lengths, dim=-1, dtype=torch.int64), (1, 0))


class RaggedIndex(NamedTuple):
    """Per-slot view of a ragged layout; all fields ``[cap]``."""

    segment: torch.Tensor  # int64 segment of each slot, clamped to ``n - 1`` on padding
    offset: torch.Tensor  # int64 offset of the slot inside its segment
    valid: torch.Tensor  # bool, False on the padding tail


def ragged_index(lengths: torch.Tensor, cap: int) -> RaggedIndex:
    """Segment id, offset and validity of each of ``cap`` slots for ``lengths [n]``.

    ``lengths = [2, 0, 3]``, ``cap = 7`` -> segment ``[0, 0, 2, 2, 2, 2, 2]``,
    offset ``[0, 1, 0, 1, 2, 3, 4]``, valid ``[T, T, T, T, T, F, F]``.
    Empty segments own no slot (``searchsorted(..., right=True)`` skips them).
    """
    starts = offsets(lengths)
    slot = torch.arange(cap, dtype=torch.int64, device=lengths.device)
    segment = torch.searchsorted(starts[1:], slot, right=True)
    valid = slot < starts[-1]
    segment = segment.clamp(max=max(lengths.shape[-1] - 1, 0))
    return RaggedIndex(segment, slot - starts[segment], valid)


def inverse_permutation(forward: torch.Tensor, valid: torch.Tensor, size: int) -> torch.Tensor:
    """Invert a partial permutation without sorting.

    ``forward [m]`` sends slot ``j`` to position ``forward[j]`` when ``valid[j]``.
    Returns ``inverse [size]`` with ``inverse[forward[j]] = j``; positions that no
    valid slot reaches hold 0 (an in-range index). Invalid slots are written to a
    trash row past the end, then sliced off, so the scatter is deterministic.
    """
    dest = torch.where(valid, forward, size)
    src = torch.arange(forward.shape[-1], dtype=torch.int64, device=forward.device)
    out = torch.zeros(size + 1, dtype=torch.int64, device=forward.device)
    return out.scatter(0, dest, src)[:size]


def masked_gather(values: torch.Tensor, index: torch.Tensor, mask: torch.Tensor, fill: int) -> torch.Tensor:
    """``values[index]`` where ``mask``, else ``fill``; ``index`` is clamped in range first.

    The fixed-shape replacement for ``out[mask] = values`` (compaction read
    backwards: each output row knows which input row it takes).
    """
    safe = index.clamp(0, max(values.shape[0] - 1, 0))
    return torch.where(mask, values[safe], fill)
