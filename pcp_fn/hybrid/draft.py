"""The hybrid layout's prefill split for the draft model, and :class:`DraftSplit`, the result of both splits.

vllm-ascend ``_split_spec_decode_pcp_prefill_input_hybrid``.

For the first MTP draft pass each rank takes a *linear* slice of every prefill
request's input ids and target hidden states: the request is padded with zeros
to a multiple of ``2P`` and rank ``r`` takes rows ``[r*k, (r+1)*k)`` with
``k = padded / P``. ``P = 2``, rank 1, prefills ``[3, 5]`` with ids
``[a b c | d e f g h]``::

    padded      [a b c 0]  [d e f g h 0 0 0]
    rank 1      [c 0]      [h 0 0 0]           input_ids [c, 0, h, 0, 0, 0]
    seq_lens    [2, 4]     cu_num_tokens [0, 2, 6]   max_query_len 4

The padding zeros inside a rank's slice are real output rows (vllm-ascend keeps
them); rows past ``num_tokens`` are zero too.
"""

from __future__ import annotations

import torch

from ..core.pytree import pytree_dataclass
from ..core.ragged import expand_runs, masked_gather, offsets
from ..dcs.state import PCPState


@pytree_dataclass
class DraftSplit:
    """This rank's share of the prefill requests' inputs for the MTP drafter's first pass.

    vllm-ascend ``_split_spec_decode_pcp_prefill_input`` (and its ``_hybrid`` variant)
    return these six values as a tuple, plus ``num_reqs``. The one result type of both
    splits: :func:`pcp_fn.spec.split_prefill_for_draft` (either layout, from the state's
    last update) and :func:`split_prefill_for_draft_hybrid` (the hybrid split of given
    prefill lengths). It is defined here, below :mod:`pcp_fn.spec` in the import order,
    so that both can return it.

    Fields (``K`` prefill rows: ``R_b`` from ``split_prefill_for_draft``, the length of
    ``prefill_lens`` from ``split_prefill_for_draft_hybrid``):
        num_tokens: 0-d int64 rows of this rank (``sum(seq_lens)``).
        input_ids: ``[L_b]`` ids (input dtype), each prefill's rows back to back, pads 0;
            0 past ``num_tokens``.
        hidden_states: ``[L_b, ...]`` their hidden states (input dtype); 0 past ``num_tokens``.
        max_query_len: 0-d int64 ``max(seq_lens)`` (0 without prefills).
        seq_lens: ``[K]`` int32 rows of each prefill on this rank (``2 * ceil(n / 2P)``;
            0 for an empty request and past the prefills).
        cu_num_tokens: ``[K + 1]`` int64 ``[0, cumsum(seq_lens)]``.
        num_reqs: 0-d int64 prefill requests (given only lengths,
            ``split_prefill_for_draft_hybrid`` counts up to the last non-empty one).
    """

    num_tokens: torch.Tensor
    input_ids: torch.Tensor
    hidden_states: torch.Tensor
    max_query_len: torch.Tensor
    seq_lens: torch.Tensor
    cu_num_tokens: torch.Tensor
    num_reqs: torch.Tensor


def split_prefill_for_draft_hybrid(
    state: PCPState,
    prefill_lens: torch.Tensor,
    input_ids: torch.Tensor,
    hidden_states: torch.Tensor,
) -> tuple[PCPState, DraftSplit]:
    """Linear-split the prefills' draft inputs for this rank.

    vllm-ascend ``_split_spec_decode_pcp_prefill_input_hybrid``, on its own inputs (the
    prefill lengths and their rows back to back); see the module docstring for a worked
    example. :func:`pcp_fn.spec.split_prefill_for_draft` gives the same split of the
    state's batch (and the DualChunkSwap one for a non-hybrid config).

    Args:
        prefill_lens: ``[K]`` scheduled tokens of each prefill request, in
            order (vllm-ascend's ``req_scheduled_tokens`` values); trailing
            zeros are empty requests that take no row.
        input_ids: ``[S]`` the prefills' ids back to back (``S >= 1``; the
            first ``sum(prefill_lens)`` are read).
        hidden_states: ``[S2, ...]`` their target hidden states in the same
            order (for the hybrid layout: the restored rows after the decodes).

    Returns ``[L_b]`` rows (the state's bucket): a rank's slices of the batch's
    prefills are its DualChunkSwap prefill rows (``2 * ceil(n / 2P)`` each),
    which the bucket holds.

    ``P = 1`` pads nothing (the identity), like the rest of the package;
    vllm-ascend would pad to 2 there but never runs its PCP path at ``P = 1``.
    """
    cfg = state.config
    if prefill_lens.dim() != 1:
        raise ValueError(
            f"prefill_lens must be 1-D (one entry per request), got shape {tuple(prefill_lens.shape)}"
        )
    if input_ids.dim() != 1 or input_ids.shape[0] < 1:
        raise ValueError(f"input_ids must be 1-D with at least one entry, got shape {tuple(input_ids.shape)}")
    if hidden_states.dim() < 1 or hidden_states.shape[0] < 1:
        raise ValueError(f"hidden_states must have at least one row, got shape {tuple(hidden_states.shape)}")
    rows = state.bucket.num_tokens
    P, m = cfg.pcp_size, cfg.pad_multiple
    n = prefill_lens.to(torch.int64)
    per_rank = (n + m - 1) // m * m // P
    take_from = state.pcp_rank * per_rank  # first padded row of this rank's slice
    token_start, out_start = offsets(n), offsets(per_rank)
    # inside a request's run, output row o reads token o + shift while it is a real (not pad) token
    shift, real_end = expand_runs(
        out_start[:-1],
        torch.stack([token_start[:-1] + take_from - out_start[:-1], out_start[:-1] + n - take_from]),
        rows,
    )
    o = torch.arange(rows, dtype=torch.int64, device=n.device)
    real = (o < real_end) & (o < out_start[-1])
    src = o + shift
    ids = masked_gather(input_ids, src, real, 0)
    hidden = masked_gather(hidden_states, src, real, 0)
    zero = torch.zeros((), dtype=torch.int64, device=n.device)
    max_len = per_rank.amax() if per_rank.shape[0] else zero
    k = torch.arange(n.shape[0], dtype=torch.int64, device=n.device)
    num_reqs = torch.where(n > 0, k + 1, 0).amax() if n.shape[0] else zero
    return state, DraftSplit(
        num_tokens=out_start[-1],
        input_ids=ids,
        hidden_states=hidden,
        max_query_len=max_len,
        seq_lens=per_rank.to(torch.int32),
        cu_num_tokens=out_start,
        num_reqs=num_reqs,
    )
