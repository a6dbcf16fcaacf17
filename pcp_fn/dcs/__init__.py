"""The DualChunkSwap layout (vllm-ascend ``worker/pcp_utils.py`` ``PCPManager``).

A prefill is padded to a multiple of ``2P`` and cut into ``2P`` chunks; rank
``r`` owns chunks ``r`` and ``2P-1-r``; decodes are replicated on every rank.

- :mod:`.config`: :class:`PCPConfig` and the capacities it derives;
- :mod:`.batch`: the host boundary, :func:`make_batch` -> :class:`SchedulerBatch`;
- :mod:`.state`: :class:`PCPState`, :func:`init_state`;
- :mod:`.layout`: the layout (:class:`TokenLayout`) and its ops;
- :mod:`.attention`: the attention index metadata.

The facade (``pcp_fn.update_tokens``, ``pcp_fn.step``...) and :mod:`pcp_fn.spec`
serve this layout and the hybrid one (:mod:`pcp_fn.hybrid`), chosen by
``config.hybrid_attn`` (both are :class:`pcp_fn.Layout` implementations, ``"dcs"`` and ``"hybrid"``).
"""

from .attention import AttentionMetadata, PaddedIndex, attention_metadata
from .batch import SchedulerBatch, classify_decodes, make_batch
from .config import PCPConfig
from .layout import (
    TokenLayout,
    build,
    first_pass_rows,
    logits_from_geometry,
    restore_index,
    restored_spans,
    state_local_rows,
    state_local_start,
)
from .state import PCPState, init_state

__all__ = [
    "AttentionMetadata",
    "PCPConfig",
    "PCPState",
    "PaddedIndex",
    "SchedulerBatch",
    "TokenLayout",
    "attention_metadata",
    "build",
    "classify_decodes",
    "first_pass_rows",
    "init_state",
    "logits_from_geometry",
    "make_batch",
    "restore_index",
    "restored_spans",
    "state_local_rows",
    "state_local_start",
]
