"""The hybrid-attention layout (`PCPConfig(..., hybrid_attn=True)`: qwen3-next, qwen3.5).

Linear-attention layers get each prefill split *linearly* (contiguous tokens
per rank); the full-attention layers keep DualChunkSwap ([`pcp_fn.dcs`][]).
Config and host boundary are the facade's ([`pcp_fn.PCPConfig`][] with
`hybrid_attn=True`, [`pcp_fn.make_batch`][]); this package holds the
layout ([`pcp_fn.hybrid.layout`][]: [`HybridLayout`][pcp_fn.HybridLayout] and its index maps), its
ops ([`pcp_fn.hybrid.ops`][]) and its host twin ([`pcp_fn.hybrid.host`][]); the draft model's linear prefill
split is [`pcp_fn.spec.split_prefill_for_draft`][pcp_fn.split_prefill_for_draft] on a hybrid config.
[`LAYOUT`][pcp_fn.hybrid.LAYOUT] is the built-in `"hybrid"` [`pcp_fn.Layout`][] (the functions of
[`pcp_fn.hybrid.ops`][]), which `pcp_fn.update_tokens`, the other facade ops and [`pcp_fn.spec`][]
find by the config.
"""

from ..protocol.package import PackageLayout
from . import ops
from .layout import HybridLayout
from .ops import (
    adjust_cu_num_scheduled_tokens,
    build,
    constants,
    first_pass_rows,
    gathered_order,
    logits_from_geometry,
    num_local_tokens,
    restore_index,
    restored_spans,
    state_geometry,
    state_local_rows,
    state_local_start,
)

LAYOUT = PackageLayout("hybrid", ops)
"""The built-in `"hybrid"` [`pcp_fn.Layout`][] (`PCPConfig(..., hybrid_attn=True)`): the functions of
[`pcp_fn.hybrid.ops`][]."""

__all__ = [
    "LAYOUT",
    "HybridLayout",
    "adjust_cu_num_scheduled_tokens",
    "build",
    "constants",
    "first_pass_rows",
    "gathered_order",
    "logits_from_geometry",
    "num_local_tokens",
    "restore_index",
    "restored_spans",
    "state_geometry",
    "state_local_rows",
    "state_local_start",
]
