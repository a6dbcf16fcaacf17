"""Putting the all-gathered hidden states back in request order."""

from __future__ import annotations

import torch

from .protocol.layout import layout_of
from .protocol.state import PCPState, check_state


def check_gathered(state: PCPState, gathered: torch.Tensor) -> None:
    """`gathered` stacks the `P` ranks' `[L_b, ...]` buffers: a dense tensor of exactly `P * L_b`
    rows on the state's device. Any dtype: the restore only moves rows. Static checks: capturable."""
    check_state(state, "restore_hidden_states")
    rows = state.config.pcp_size * state.bucket.num_tokens
    if not isinstance(gathered, torch.Tensor):
        raise TypeError(f"gathered must be a tensor, got {type(gathered).__name__}")
    if gathered.dim() < 1 or gathered.shape[0] != rows:
        raise ValueError(
            f"gathered must stack the {state.config.pcp_size} ranks' [{state.bucket.num_tokens}, ...] "
            f"buffers of the state's bucket ({rows} rows), got shape {tuple(gathered.shape)}"
        )
    if gathered.layout != torch.strided:
        raise TypeError(f"gathered must be a dense (strided) tensor, got layout {gathered.layout}")
    if gathered.device != state.device:
        raise ValueError(f"gathered is on {gathered.device}, the state on {state.device}")


def restore_hidden_states(state: PCPState, gathered: torch.Tensor) -> tuple[PCPState, torch.Tensor]:
    """Reorder all-gathered hidden states into the padded request order.

    Args:
        gathered: `[P * L_b, ...]`, the P ranks' fixed-size `[L_b, ...]`
            local buffers (`L_b`: the state's bucket) stacked rank-major
            (what `all_gather` of the local buffer yields).

    Returns `[P * L_b, ...]`; rows `[:P * num_tokens]` equal vllm-ascend
    `PCPManager.get_restore_hidden_states` row for row (so logits indices
    index it), the rest repeat row 0.

    With `config.hybrid_attn` each rank's buffer holds its linear rows
    (`layout.num_tokens` of them, decodes first) and anything after them.
    vllm-ascend pads every rank's rows to `max_num_tokens_across_pcp` (`M`)
    before the all-gather; here the fixed `[L_b]` buffer already is that
    padding (`L_b >= M`), so rank `q`'s row `l` is read at `q * L_b + l`
    instead of `q * M + l`. The result is in the compact FA order (decode
    rows, then prefill tokens in scheduler order): rows `[:enter_fa_len]`
    equal vllm-ascend's restored rows, the rest repeat row 0.
    """
    check_gathered(state, gathered)
    return state, gathered.index_select(0, layout_of(state.config).restore_index(state))
