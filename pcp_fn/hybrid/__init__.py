"""The hybrid-attention layout (``PCPConfig(..., hybrid_attn=True)``: qwen3-next, qwen3.5).

Linear-attention layers get each prefill split *linearly* (contiguous tokens
per rank); the full-attention layers keep DualChunkSwap (:mod:`pcp_fn.dcs`).
Config and host boundary are the facade's (:class:`pcp_fn.PCPConfig` with
``hybrid_attn=True``, :func:`pcp_fn.make_batch`); this package holds the
layout (:mod:`.layout`: :class:`HybridLayout` and its index maps), its
ops (:mod:`.ops`) and its host twin (:mod:`.host`); the draft model's linear prefill
split is :func:`pcp_fn.spec.split_prefill_for_draft` on a hybrid config.
:data:`LAYOUT` is the built-in ``"hybrid"`` :class:`pcp_fn.Layout` (the functions of
:mod:`.ops`), which ``pcp_fn.update_tokens``, the other facade ops and :mod:`pcp_fn.spec`
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
