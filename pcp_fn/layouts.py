"""The one place a ``PCPConfig``'s layout is chosen: DualChunkSwap or hybrid.

Both layout packages offer the same interface, which the facade ops
(:func:`update_tokens`, ``get_logits_indices``, ``restore_hidden_states``,
``step``) and the spec-decode prep use:

- ``build(state, batch) -> LayoutUpdate``: the next state, the public layout
  (``TokenLayout`` / ``HybridLayout``) and the maps ``step`` reuses;
- ``logits_from_geometry(config, geometry, num_reqs) -> [R_b]``: the rows to sample;
- ``restore_index(state) -> [P*L_b]``: the gathered row of each row
  ``restore_hidden_states`` returns.

and, for the spec-decode (MTP) prep of :mod:`pcp_fn.spec`, at the state's bucket
(each also takes ``geometry=``, the state's request geometry when the caller has
it, e.g. the step's own, so that several maps share one scan):

- ``state_local_rows(state) -> LocalRows``: request and offset of each of this
  rank's ``[L_b]`` local rows (the DualChunkSwap rows / the linear rows);
- ``state_local_start(state) -> [R_b + 1]``: first local row of each request
  (the runner's ``cu_num_tokens``, with a leading 0);
- ``restored_spans(state) -> RestoredSpans``: where each request's tokens sit
  in what ``restore_hidden_states`` returns (padded order / FA order), so
  request ``i``'s last ``s`` tokens are rows ``start + n - s ..``: the
  runner's PCP-adjusted ``cu_num_scheduled_tokens`` (``cu * P - num_pcp_pads``
  / vllm-ascend ``adjust_cu_num_scheduled_tokens_for_pcp``);
- ``first_pass_rows(state) -> LocalRows``: this rank's rows of the drafter's
  first pass (decode tokens, then each prefill's head and tail chunks / its
  linear slice of the ``2P``-padded tokens).

The MRV2 layout (:mod:`pcp_fn.mrv2`) has its own config and state and is used
through its own package.
"""

from __future__ import annotations

from types import ModuleType

from . import dcs, hybrid
from .core.entry import entry_op
from .dcs.batch import SchedulerBatch
from .dcs.config import PCPConfig
from .dcs.layout import TokenLayout
from .dcs.state import PCPState


def layout_of(config: PCPConfig) -> ModuleType:
    """The layout package serving ``config``: :mod:`pcp_fn.hybrid` or :mod:`pcp_fn.dcs`."""
    return hybrid if config.hybrid_attn else dcs


def check_batch(state: PCPState, batch: SchedulerBatch) -> None:
    """A batch built for another config, or a bucket past the state's capacity, is an error.

    ``make_batch`` records the config it validated the batch for; a state of
    another config would silently truncate the layout.
    """
    if not isinstance(state, PCPState):
        raise TypeError(f"state must be a PCPState, got {type(state).__name__}")
    if not isinstance(batch, SchedulerBatch):
        raise TypeError(f"batch must be a SchedulerBatch, got {type(batch).__name__}")
    if batch.config != state.config.shared:
        raise ValueError(
            f"the batch was built for {batch.config}, the state is of {state.config} "
            "(ranks aside); build the batch with the state's config"
        )


@entry_op
def update_tokens(state: PCPState, batch: SchedulerBatch) -> tuple[PCPState, TokenLayout]:
    """Split the batch's tokens across ranks.

    vllm-ascend ``PCPManager.init_batch_info`` + ``update_tokens_for_pcp``.
    Reads only the incoming state's config and rank (:mod:`pcp_fn.core.entry`),
    so the result does not depend on earlier steps; the returned state records
    the batch and its bucket for the consumer ops. Example, ``P = 2``, tokens
    ``[1, 5, 8]`` (request 0 a decode): rank 0 gets ``pcp_tokens [1, 4, 4]`` and
    positions ``[0, 0, 1, 6, 7, 0, 1, 6, 7]``; rank 1 ``[0, 2, 3, 4, 5, 2, 3, 4, 5]``.

    With ``config.hybrid_attn`` the layout is a :class:`pcp_fn.hybrid.HybridLayout`
    (the linear split for the local rows, plus the FA index maps).
    """
    check_batch(state, batch)
    up = layout_of(state.config).build(state, batch)
    return up.state, up.layout
