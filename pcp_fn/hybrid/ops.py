"""The hybrid layout's consumer ops: logits rows, the FA-entry restore, spec-decode re-alignment.

They read the record of the state's last update (`PCPState`) at its bucket's
sizes, like the DualChunkSwap ones in [`pcp_fn.dcs.layout`][], and offer the
same interface: with the DualChunkSwap geometry, KV order, host bound and tables (the
full-attention layers keep them) this module is the `"hybrid"` [`pcp_fn.Layout`][]
(`pcp_fn.hybrid.LAYOUT`).
"""

from __future__ import annotations

import torch

from ..core.ragged import expand_runs, segment_of
from ..core.rank import select_rank
from ..dcs.layout import constants, gathered_order, num_local_tokens, state_geometry
from ..protocol.config import PCPConfig
from ..protocol.rows import LocalRows, RequestGeometry, RestoredSpans
from ..protocol.state import PCPState
from .layout import LinearRuns, build, enter_fa_rows, linear_runs, linear_segments, paint_linear

# the hybrid layout's own functions, and DualChunkSwap's it serves as they are
__all__ = [
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


def logits_from_geometry(config: PCPConfig, geo: RequestGeometry, num_reqs: torch.Tensor) -> torch.Tensor:
    """`[R_b]` int64: `cumsum(n + (P-1)*decode) - 1`.

    vllm-ascend `PCPManager.get_logits_indices` with `tokens_original`:
    rows of the FA-order restored hidden states. Each decode counts `P - 1`
    extra rows even when it has no token (as vllm-ascend counts them). 0 past
    `num_reqs`; a leading request with no token is clamped to 0. `P = 2`,
    tokens `[1, 1, 3, 5]` (two decodes) -> `[1, 3, 6, 11]`.
    """
    rows = torch.add(geo.num_scheduled, geo.replicated, alpha=config.pcp_size - 1)
    last = (torch.cumsum(rows, 0) - 1).clamp(min=0)
    return last * (geo.request_ids < num_reqs)


def _state_runs(state: PCPState, geo: RequestGeometry) -> LinearRuns:
    """The linear split of the state's last update (`geo`: its geometry), as `build` makes it."""
    is_decode = state.is_decode[: state.bucket.num_reqs]
    return linear_runs(state.config, geo, is_decode, state.bucket.num_tokens, state.constants)


def restore_index(state: PCPState) -> torch.Tensor:
    """`[P*L_b]` int64: the state's `enter_fa_restore_idx` (rank-independent)."""
    cfg, Lb = state.config, state.bucket.num_tokens
    geo = state_geometry(state)
    runs = _state_runs(state, geo)
    return enter_fa_rows(runs, cfg.pcp_size * Lb)


def adjust_cu_num_scheduled_tokens(
    state: PCPState, cu_num_scheduled_tokens: torch.Tensor
) -> tuple[PCPState, torch.Tensor]:
    """Re-align cumulative scheduled tokens to the FA-order restored rows.

    vllm-ascend `adjust_cu_num_scheduled_tokens_for_pcp`.

    For spec-decode logits indices under the hybrid layout. Decode rows are
    returned unchanged; prefill request `i` ends at
    `P * cu[num_decode_reqs - 1] + (prefill tokens up to i)`, which is the
    vllm-ascend's `(cu[D-1] + cumsum(pcp_tokens)) * P - cumsum(pads)`. `P = 2`,
    tokens `[1, 1, 3, 5]` (two decodes), `cu [1, 2, 5, 10]` -> `[1, 2, 7, 12]`.

    Args:
        cu_num_scheduled_tokens: `[R_b]` cumulative tokens of the requests of
            the state's last update (its bucket's request rows), as the runner
            has them. Rows past `num_reqs` are returned unchanged.

    Returns `[R_b]` in the input's dtype.
    """
    cu = cu_num_scheduled_tokens
    k = state.bucket.num_reqs
    if cu.dim() != 1 or cu.shape[0] != k:
        raise ValueError(
            f"cu_num_scheduled_tokens must be [{k}] (the state's bucket request rows), "
            f"got shape {tuple(cu.shape)}"
        )
    P = state.config.pcp_size
    n = state.num_scheduled[:k].to(torch.int64)
    dec = state.is_decode[:k]
    prefill = ~dec & (torch.arange(k, device=cu.device) < state.num_reqs)
    num_dec = state.is_decode.sum()
    last_decode = (num_dec - 1).clamp(min=0, max=k - 1).reshape(1)
    base = torch.where(num_dec > 0, cu.index_select(0, last_decode)[0].to(torch.int64), 0)
    adjusted = P * base + torch.cumsum(torch.where(prefill, n, 0), 0)
    return state, torch.where(prefill, adjusted, cu.to(torch.int64)).to(cu.dtype)


# -- what the spec-decode (MTP) prep reads of the layout (pcp_fn.spec, through pcp_fn.layout_of) --
def state_local_rows(state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
    """This rank's `[L_b]` linear rows of the state's last update (`HybridLayout.request_index` /
    `positions`): request and offset inside its scheduled tokens, `valid` False past them.

    `build`'s painting ([`pcp_fn.hybrid.layout.linear_segments`][]) without `num_computed` (the state
    does not keep it), on the `L_b` local rows alone. `geometry`:
    [`pcp_fn.dcs.layout.state_geometry`][pcp_fn.dcs.state_geometry] of the state when the caller has it.
    """
    geo = state_geometry(state) if geometry is None else geometry
    Lb = state.bucket.num_tokens
    segments, start = linear_segments(_state_runs(state, geo), geo, state.pcp_rank, None, Lb, state.constants)
    row = torch.arange(Lb, dtype=torch.int64, device=start.device)
    return paint_linear(segments, start, segment_of(segments.ends[:-1], row), row, Lb).rows


def state_local_start(state: PCPState, *, geometry: RequestGeometry | None = None) -> torch.Tensor:
    """`[R_b + 1]` int64: first linear row of each request on this rank, then the total.

    `StepOutputs.query_start_loc`: `[0, cumsum(pcp_tokens)]` of the linear counts, the runner's
    `cu_num_tokens` with a leading 0. `P = 2`, fresh prefills `[3, 5]`: rank 0 `[0, 2, 5]`,
    rank 1 `[0, 1, 3]`. `geometry`: [`pcp_fn.dcs.layout.state_geometry`][pcp_fn.dcs.state_geometry]
    of the state when the caller has it.
    """
    geo = state_geometry(state) if geometry is None else geometry
    # a column of the [R_b + 1, P] starts: made contiguous, like every other op's output
    return select_rank(_state_runs(state, geo).starts, state.pcp_rank, dim=1).contiguous()


def restored_spans(state: PCPState, *, geometry: RequestGeometry | None = None) -> RestoredSpans:
    """Where each request's tokens sit in the FA order that `restore_hidden_states` returns.

    The FA order holds the `P * D` decode rows (`D` decode tokens), then every prefill
    token in scheduler order, no pads: a prefill's tokens start at `token_start + (P - 1) * D`.
    With spec tokens configured the decode rows are rank-major, so rank 0's copy of decode
    token `t` is row `t`; without them token-major, row `t * P`. So request `i`'s last
    token is row `start + n - 1`: one less than vllm-ascend
    `adjust_cu_num_scheduled_tokens_for_pcp` (which the runner's `_calc_spec_decode_metadata`
    uses under hybrid attention). `length` is `n`. `P = 2`, one spec token, decodes
    `[2, 2]` then a prefill of 7: `start [0, 2, 8]`, `length [2, 2, 7]`.
    `geometry`: [`pcp_fn.dcs.layout.state_geometry`][pcp_fn.dcs.state_geometry] of the state when
    the caller has it.
    """
    cfg = state.config
    geo = state_geometry(state) if geometry is None else geometry
    is_decode = state.is_decode[: state.bucket.num_reqs]
    token_start = geo.token_start[:-1]
    decode_start = token_start if cfg.num_spec_tokens > 0 else token_start * cfg.pcp_size
    prefill_start = torch.add(token_start, geo.num_decode_tokens, alpha=cfg.pcp_size - 1)
    return RestoredSpans(torch.where(is_decode, decode_start, prefill_start), geo.num_scheduled)


def first_pass_rows(state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
    """`[L_b]` rows of the MTP drafter's first pass on this rank: request and offset inside the
    request's padded tokens (`offset >= n`: a zero pad), decode tokens first, `valid` False past.

    vllm-ascend `_split_spec_decode_pcp_prefill_input_hybrid`: a prefill is padded to a
    multiple of `2P` and rank `r` takes its `k = padded / P` consecutive rows from
    `r * k` (a *linear* slice, not the layout's linear split of the unpadded tokens); a decode
    keeps all its tokens. Each request has `k` (`pcp_tokens_padded`) rows, as in the
    DualChunkSwap layout. `P = 2`, rank 1, prefills `[3, 5]`: requests `[0, 0, 1, 1, 1, 1]`,
    offsets `[2, 3, 4, 5, 6, 7]` (offsets 3, 5, 6, 7 are pads).
    """
    geo = state_geometry(state) if geometry is None else geometry
    rows = state.bucket.num_tokens
    start = geo.local_start
    shift = torch.where(geo.replicated, 0, state.pcp_rank * geo.local) - start[:-1]
    shift, request = expand_runs(start[:-1], torch.stack([shift, geo.request_ids]), rows)
    row = torch.arange(rows, dtype=torch.int64, device=start.device)
    valid = row < start[-1]
    return LocalRows(torch.where(valid, request, 0), torch.where(valid, row + shift, 0), valid)
