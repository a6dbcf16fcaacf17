"""The DualChunkSwap layout (vllm-ascend `worker/pcp_utils.py` `PCPManager`).

A prefill is padded to a multiple of `2P` and cut into `2P` chunks; rank
`r` owns chunks `r` and `2P-1-r`; decodes are replicated on every rank.

- [`pcp_fn.dcs.geometry`][]: [`ChunkGeometry`][pcp_fn.dcs.ChunkGeometry], every per-request size
  from one scan;
- [`pcp_fn.dcs.layout_tables`][], [`pcp_fn.dcs.attention_tables`][]: its config-only tables, rows named;
- [`pcp_fn.dcs.layout`][]: the layout's maps (local rows, the padded order, logits, spans);
- [`pcp_fn.dcs.attention`][]: the attention index metadata (vllm-ascend `generate_pcp_metadata`);
- [`pcp_fn.dcs.host`][]: the host twin (every host value vllm-ascend's runner reads, O(R) numpy);
- [`pcp_fn.dcs.packing`][]: the scheduler batch's staging layout.

[`LAYOUT`][pcp_fn.dcs.LAYOUT] is the built-in `"dcs"` [`pcp_fn.Layout`][] (the functions of
[`pcp_fn.dcs.layout`][]), the facade's default; the hybrid layout ([`pcp_fn.hybrid`][]) keeps its
geometry for the full-attention layers.
"""

from ..protocol.package import PackageLayout
from . import layout
from .attention import AttentionMetadata, PaddedIndex, attention_metadata
from .geometry import ChunkGeometry, pad_multiple, request_geometry
from .layout import (
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

LAYOUT = PackageLayout("dcs", layout)
"""The built-in `"dcs"` [`pcp_fn.Layout`][], the facade's default: the functions of
[`pcp_fn.dcs.layout`][]."""

__all__ = [
    "LAYOUT",
    "AttentionMetadata",
    "ChunkGeometry",
    "PaddedIndex",
    "attention_metadata",
    "build",
    "constants",
    "first_pass_rows",
    "gathered_order",
    "logits_from_geometry",
    "num_local_tokens",
    "pad_multiple",
    "request_geometry",
    "restore_index",
    "restored_spans",
    "state_geometry",
    "state_local_rows",
    "state_local_start",
]
