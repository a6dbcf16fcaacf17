"""What every layout shares: the config, the state, the scheduler batch, the Layout protocol.

A layout author reads this package and nothing of a layout's own:

- [`pcp_fn.protocol.config`][]: [`PCPConfig`][pcp_fn.PCPConfig], its capacities, the two-chunk bound;
- [`pcp_fn.protocol.batch`][]: the host boundary, [`make_batch`][pcp_fn.make_batch] ->
  [`SchedulerBatch`][pcp_fn.SchedulerBatch];
- [`pcp_fn.protocol.state`][]: [`PCPState`][pcp_fn.PCPState], [`init_state`][pcp_fn.init_state]
  ([`fresh_state`][pcp_fn.protocol.fresh_state]), [`next_state`][pcp_fn.protocol.next_state];
- [`pcp_fn.protocol.rows`][]: the row, order and per-request types a layout returns;
- [`pcp_fn.protocol.layout`][]: the [`Layout`][pcp_fn.Layout] protocol and [`layout_of`][pcp_fn.layout_of];
- [`pcp_fn.protocol.registry`][]: the registry (built-ins found by name, no import side effect);
- [`pcp_fn.protocol.canonical`][]: `init_state`'s first run of a layout that is not a built-in;
- [`pcp_fn.protocol.partition`][]: [`PartitionLayout`][pcp_fn.PartitionLayout], a layout from its
  token partition alone;
- [`pcp_fn.protocol.package`][]: [`PackageLayout`][pcp_fn.PackageLayout], a layout from a module's functions.

The layouts ([`pcp_fn.dcs`][], [`pcp_fn.hybrid`][], [`pcp_fn.mrv2`][]) build on it; the ops
([`pcp_fn.step`][pcp_fn.step.step]...) are written against it, never against one layout.
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
