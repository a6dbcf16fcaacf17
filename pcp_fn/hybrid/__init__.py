"""The hybrid-attention layout (``PCPConfig(..., hybrid_attn=True)``: qwen3-next, qwen3.5).

Linear-attention layers get each prefill split *linearly* (contiguous tokens
per rank); the full-attention layers keep DualChunkSwap (:mod:`pcp_fn.dcs`).
Config and host boundary are the DualChunkSwap ones (:class:`pcp_fn.PCPConfig`
with ``hybrid_attn=True``, :func:`pcp_fn.make_batch`); this package holds the
layout (:mod:`.layout`: :class:`HybridLayout` and its index maps) and its
ops (:mod:`.ops`); the draft model's linear prefill split is
:func:`pcp_fn.spec.split_prefill_for_draft` on a hybrid config.
``pcp_fn.update_tokens``, the other facade ops and :mod:`pcp_fn.spec` pick it
by the config (both are :class:`pcp_fn.Layout` implementations, ``"dcs"`` and ``"hybrid"``).
"""

from .layout import HybridLayout, build
from .ops import (
    adjust_cu_num_scheduled_tokens,
    first_pass_rows,
    logits_from_geometry,
    restore_index,
    restored_spans,
    state_local_rows,
    state_local_start,
)

__all__ = [
    "HybridLayout",
    "adjust_cu_num_scheduled_tokens",
    "build",
    "first_pass_rows",
    "logits_from_geometry",
    "restore_index",
    "restored_spans",
    "state_local_rows",
    "state_local_start",
]
