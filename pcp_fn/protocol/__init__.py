"""What every layout shares: the config, the state, the scheduler batch, the Layout protocol.

A layout author reads this package and nothing of a layout's own:

- :mod:`.config`: :class:`PCPConfig`, its capacities, the two-chunk bound;
- :mod:`.batch`: the host boundary, :func:`make_batch` -> :class:`SchedulerBatch`;
- :mod:`.state`: :class:`PCPState`, :func:`init_state` (:func:`fresh_state`), :func:`next_state`;
- :mod:`.rows`: the row, order and per-request types a layout returns;
- :mod:`.layout`: the :class:`Layout` protocol and :func:`layout_of`;
- :mod:`.registry`: the registry (built-ins found by name, no import side effect);
- :mod:`.canonical`: ``init_state``'s first run of a layout that is not a built-in;
- :mod:`.partition`: :class:`PartitionLayout`, a layout from its token partition alone;
- :mod:`.package`: :class:`PackageLayout`, a layout from a module's functions.

The layouts (:mod:`pcp_fn.dcs`, :mod:`pcp_fn.hybrid`, :mod:`pcp_fn.mrv2`) build on it; the ops
(:func:`pcp_fn.step`...) are written against it, never against one layout.
"""

from .batch import SchedulerBatch, classify_decodes, make_batch
from .config import PCPConfig
from .layout import Layout, layout_of
from .package import PackageLayout
from .partition import PartitionLayout, Requests, rows_from_segments
from .registry import LayoutError, available_layouts, get_layout, register_layout, unregister_layout
from .rows import GatheredOrder, LayoutUpdate, LocalRows, RequestGeometry, RestoredSpans, TokenLayout
from .state import PCPState, check_batch, fresh_state, init_state, next_state

__all__ = [
    "GatheredOrder",
    "Layout",
    "LayoutError",
    "LayoutUpdate",
    "LocalRows",
    "PCPConfig",
    "PCPState",
    "PackageLayout",
    "PartitionLayout",
    "RequestGeometry",
    "Requests",
    "RestoredSpans",
    "SchedulerBatch",
    "TokenLayout",
    "available_layouts",
    "check_batch",
    "classify_decodes",
    "fresh_state",
    "get_layout",
    "init_state",
    "layout_of",
    "make_batch",
    "next_state",
    "register_layout",
    "rows_from_segments",
    "unregister_layout",
]
