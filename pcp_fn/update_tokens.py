"""`update_tokens`: split the batch's tokens across ranks, by the config's layout."""

from __future__ import annotations

from .core.entry import entry_op
from .protocol.batch import SchedulerBatch
from .protocol.layout import layout_of
from .protocol.rows import TokenLayout
from .protocol.state import PCPState, check_batch


@entry_op
def update_tokens(state: PCPState, batch: SchedulerBatch) -> tuple[PCPState, TokenLayout]:
    """Split the batch's tokens across ranks.

    vllm-ascend `PCPManager.init_batch_info` + `update_tokens_for_pcp`.
    Reads only the incoming state's config and rank ([`pcp_fn.core.entry`][]),
    so the result does not depend on earlier steps; the returned state records
    the batch and its bucket for the consumer ops. Example, `P = 2`, tokens
    `[1, 5, 8]` (request 0 a decode): rank 0 gets `pcp_tokens [1, 4, 4]` and
    positions `[0, 0, 1, 6, 7, 0, 1, 6, 7]`; rank 1 `[0, 2, 3, 4, 5, 2, 3, 4, 5]`.

    The layout is the config's ([`pcp_fn.layout_of`][]): with `config.hybrid_attn` a
    [`pcp_fn.hybrid.HybridLayout`][pcp_fn.HybridLayout] (the linear split for the local rows, plus
    the FA index maps).
    """
    check_batch(state, batch)
    up = layout_of(state.config).build(state, batch)
    return up.state, up.layout
