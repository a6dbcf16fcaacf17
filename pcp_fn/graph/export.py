"""`torch.export` of a PCP function with every shape static."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .errors import CaptureError


class _AsModule(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def export(fn: Callable[..., Any], *example_args: Any) -> torch.export.ExportedProgram:
    """`torch.export` of `fn` for the example's bucket, with every shape static.

    Raises [`CaptureError`][pcp_fn.graph.CaptureError] if the program has any symbolic (data-dependent
    or dynamic) size, which would mean an op read a value to decide a shape.
    """
    ep = torch.export.export(_AsModule(fn), tuple(example_args), strict=False)
    symbolic = [
        f"{node.name}: {tuple(val.shape)}"
        for node in ep.graph.nodes
        for val in pytree.tree_leaves(node.meta.get("val"))
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape)
    ]
    if symbolic or ep.range_constraints:
        raise CaptureError(f"exported program has symbolic shapes: {symbolic or ep.range_constraints}")
    return ep
