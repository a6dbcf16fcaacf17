"""Attention runs: any layout's local rows as variable-length causal attention sequences.

A rank's local query rows are, request by request, runs of consecutive tokens:
DualChunkSwap gives a prefill's head and tail chunk, MRV2 its chunks, a
replicated decode one run, a [`pcp_fn.PartitionLayout`][] whatever its
`segments` say. A run of `q` query rows whose last token sits at position
`p` attends, causally, the request's first `p + 1` keys in the paged cache
(after the K/V all-gather every rank's cache holds the whole request). That is
one sequence of a variable-length attention kernel with bottom-right causal
alignment (FlashAttention's `flash_attn_varlen_func(..., causal=True)`: query
`i` of a run sees keys `< seq_len - q + i + 1`), with the request's block
table. vLLM's model runner V2 hands its attention backend the same "virtual
requests" (`PCPManager.partition_batch`: one local request row per chunk).

`P = 2`, the `"dcs"` layout, tokens `[1, 5, 8]`, request 0 a decode behind 7
cached tokens, requests 1 and 2 fresh prefills (request 1 padded to 8); rank 0:

    local rows (request, position)   (0,7) | (1,0) (1,1) | (1,6) (1,7) | (2,0) (2,1) | (2,6) (2,7) | . ...
    runs                               0         1          2 (pads)        3             4
    query_start_loc   [0, 1, 3, 5, 7, 9, 9, ...]       (L_b + 1 entries: the bucket's)
    seq_lens          [8, 2, 5, 2, 8, 0, ...]          (last position + 1; the pad run: the request's 5)
    request           [0, 1, 1, 2, 2, 0, ...]          (the block-table row of each run)
    is_padding        [F, F, T, F, F, F, ...]

The `"mrv2"` layout cuts request 1 at its end (no pad run): `query_start_loc
[0, 1, 3, 5, 7, 7, ...]`, `seq_lens [8, 2, 2, 8, 0, ...]`.

A new run starts where the request changes, the position does not follow the
previous row's, or real rows give way to a layout's pad rows (offsets past the
request's scheduled tokens). A pad run attends the request's real keys; its
rows are dropped by the restore and never written to the cache. Runs past
`num_runs` are empty (`query_start_loc` repeats the local token count,
`seq_lens` 0), so the shapes are the bucket's: `[L_b]` runs at most, one per
local row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .core.pytree import pytree_dataclass
from .core.ragged import scatter_to, take
from .protocol.layout import layout_of
from .protocol.state import PCPState, check_state


@pytree_dataclass
class AttentionRuns:
    """This rank's local rows as varlen causal attention sequences (`L_b` from the state's bucket).

    Attributes:
        num_runs: 0-d int64 runs (sequences) on this rank.
        query_start_loc: `[L_b + 1]` int32 first local row of each run (the kernel's
            `cu_seqlens_q`); entries past `num_runs` equal the local token count.
        seq_lens: `[L_b]` int32 keys each run attends (`seqused_k`): its last
            position + 1, the request's `num_computed + num_scheduled` for a pad run;
            0 past `num_runs`.
        request: `[L_b]` int64 batch row of each run (its block-table row); 0 past `num_runs`.
        is_padding: `[L_b]` bool runs of a layout's pad rows.
    """

    num_runs: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    request: torch.Tensor
    is_padding: torch.Tensor


def attention_runs(state: PCPState) -> tuple[PCPState, AttentionRuns]:
    """The attention runs of the rank's rows for the state's last batch (module docstring).

    Works for every [`pcp_fn.Layout`][]: it reads only the layout's
    `state_local_rows` and the state's record (`num_scheduled`, `num_computed`);
    the state passes through unchanged. With the `"hybrid"` layout the rows are its
    linear-attention rows (its FA layers take [`pcp_fn.attention_metadata`][]).
    Key counts are the request's, before any DCP split of the cache: a DCP kernel
    takes each DCP rank's share ([`pcp_fn.cp_local_seq_lens`][]).

    A capture reads the static maxima from the bucket: `max_seqlen_q = L_b` and the
    model's length for `max_seqlen_k`.
    """
    check_state(state, "attention_runs")
    rows = layout_of(state.config).state_local_rows(state)
    req, offset, valid = rows.request, rows.position, rows.valid
    Lb = req.shape[0]
    slot = torch.arange(Lb, dtype=torch.int64, device=req.device)
    n, computed = (
        take(torch.stack([state.num_scheduled, state.num_computed], 1), req).to(torch.int64).unbind(1)
    )
    real = valid & (offset < n)
    pos = computed + offset  # absolute
    keys = torch.where(real, pos + 1, computed + n)  # a real row sees up to itself; a pad row, the request
    first = valid & _starts_run(req, real, pos - slot + Lb, state.bucket.num_reqs)
    num_runs = first.sum()
    run_first = scatter_to(torch.cumsum(first, 0) - 1, first, slot, Lb)  # [L_b] first row of each run
    has = slot < num_runs
    total = valid.sum()
    qsl = torch.cat([torch.where(has, run_first, total), total.reshape(1)])
    # request, real and keys are constant over a run (keys: its last row's)
    last = take(torch.stack([req, real.to(torch.int64), keys], 1), qsl[1:] - 1)
    run_req, run_real, run_keys = torch.where(has[:, None], last, 0).unbind(1)
    return state, AttentionRuns(
        num_runs=num_runs,
        query_start_loc=qsl.to(torch.int32),
        seq_lens=run_keys.to(torch.int32),
        request=run_req,
        is_padding=has & (run_real == 0),
    )


def _starts_run(req: torch.Tensor, real: torch.Tensor, shift: torch.Tensor, Rb: int) -> torch.Tensor:
    """`[L_b]` bool: the row's (request, real, position - row) differs from the previous row's.

    `shift = position - row + L_b` is in `(0, 2^33)` (a real position is below `INT32_MAX`, a
    pad row's a few rows past its request's end; `L_b <= 2 * INT32_MAX`), so one int64 code holds
    the three when the request fits the 30 bits left (`R_b <= 2^29`, static: every real bucket);
    a larger bucket compares them one by one (its code would wrap).
    """
    if Rb <= 2**29:
        code = ((req << 1) + real) << 33 | shift
        return code != F.pad(code[:-1], (1, 0), value=-1)
    key = torch.stack([req, real.to(torch.int64), shift])
    return (key != F.pad(key[:, :-1], (1, 0), value=-1)).any(0)
