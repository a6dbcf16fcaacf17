"""Logits indices: which row of the restored hidden states each request samples from."""

from __future__ import annotations

import torch

from .protocol.layout import layout_of
from .protocol.state import PCPState, check_state


def get_logits_indices(state: PCPState) -> tuple[PCPState, torch.Tensor]:
    """`[R_b]` int64 rows of `restore_hidden_states` to take logits from (`R_b`: the state's bucket).

    vllm-ascend `PCPManager.get_logits_indices`: `cumsum(pcp_tokens) * P -
    num_pads - 1`, i.e. the last real token of each request in the padded
    order (rank 0's copy for a decode). `P = 2`, tokens `[1, 5, 8]` ->
    `[0, 6, 17, 0]` in a 4-request bucket.

    With `config.hybrid_attn`: the `tokens_original` form,
    `cumsum(n + (P - 1) * is_decode) - 1` over the original scheduled tokens,
    rows of the FA-order hidden states that [`pcp_fn.restore_hidden_states`][]
    returns. `P = 2`, tokens `[1, 1, 3, 5]` (two decodes) -> `[1, 3, 6, 11]`.
    With speculative tokens configured the FA order's decodes are rank-major,
    and for several decodes this formula (kept from vllm-ascend) does not land
    on the request's own row; the runner samples those through
    [`pcp_fn.adjust_cu_num_scheduled_tokens`][] instead.

    Rows past the batch's requests hold 0, and a request with no scheduled
    token (nothing to sample) is clamped to 0.
    """
    check_state(state, "get_logits_indices")
    layout = layout_of(state.config)
    geo = layout.state_geometry(state)
    return state, layout.logits_from_geometry(state.config, geo, state.num_reqs)
