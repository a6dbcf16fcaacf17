"""Entry ops: the ops that start a step read only the incoming state's config and rank.

`update_tokens`, `step`, `spec_step` and the MRV2 `partition_batch` /
`build_layout` build the next state from the batch alone; of the state they
are given they read only the fields its class lists in `ENTRY_FIELDS` (the
rank, and for the DualChunkSwap state its config-only constant tables). So a
state coming out of any step, whatever bucket it was built for, may be fed to
the graph of any bucket: [`pcp_fn.graph.capture`][pcp_fn.graph.capture.capture] keys an entry op by the
batch alone, and `torch.compile` guards only on what is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__pcp_fn_entry__"


def entry_op(fn: F) -> F:
    """Mark `fn` as an entry op (see the module docstring)."""
    setattr(fn, _MARK, True)
    return fn


def is_entry_op(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, _MARK, False))
