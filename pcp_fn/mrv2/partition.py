"""The rank-local batch of the MRV2 layout: ``partition_batch`` (vLLM ``PCPManager.partition_batch``).

Each of this rank's segments becomes one local request row: a split prefill
gives two rows (head and tail chunk), a decode one. ``P = 2``, scheduled
``[3, 8]`` (request 0 a 3-token decode at position 16, request 1 a fresh
prefill), rank 1, bucket ``(4, 8)``::

    segments          decode 0 (16..18)   prefill chunk 1 (2, 3)   chunk 2 (4, 5)
    input rows        g0 g1 g2            g5 g6                    g7 g8          . (padding)
    query_start_loc   [0, 3, 5, 7, 7]     (entries past the rows = the token count)
    positions         [16, 17, 18, 2, 3, 4, 5, 0]
    seq_lens          [19, 4, 6, 0]       (last local position + 1)
    num_computed      [16, 2, 4, 0]       (host start of each segment)
    is_prefilling     [F, T, T, F]        (start < prefill_len)
    logits_indices    [2, 4, 6, 6]        (query_start_loc[1:] - 1)

A rank with no segment keeps one placeholder row (global row 0, no tokens),
as vLLM's ``PCPManager.partition_batch`` does.
"""

from __future__ import annotations

import torch

from ..core.buckets import Bucket
from ..core.entry import entry_op
from ..core.pytree import pytree_dataclass, static_field
from ..core.ragged import offsets, scatter_to
from ..core.rank import select_rank
from ..core.seqlens import cp_local_seq_lens
from .batch import GlobalBatch, check_global_batch
from .config import MRV2Config
from .layout import MRV2State, Segments, build, check_state


@pytree_dataclass
class LocalBatch:
    """This rank's batch (``Rl, Lp`` = the bucket's request rows and local tokens).

    Per-request fields are ``[Rl]`` and hold 0 (False) past ``num_reqs``;
    vLLM keeps the unpadded ones ``[num_reqs]`` long.

    Fields:
        bucket: static ``(Rl, Lp)`` (vLLM's ``num_reqs_after_padding``,
            ``num_tokens_after_padding``).
        num_reqs: 0-d int64 local request rows, at least 1 (placeholder).
        num_tokens: 0-d int64 real local tokens.
        global_batch_req_idx: ``[Rl]`` int64 global batch row of each local row.
        idx_mapping: ``[Rl]`` request-state index (``idx_mapping[global row]``).
        num_scheduled_tokens: ``[Rl]`` int32 tokens of each local row.
        num_computed_tokens: ``[Rl]`` int32 host start position of the segment
            (``num_computed + offset inside the request``).
        query_start_loc: ``[Rl + 1]`` int32; entries past the rows equal
            ``num_tokens``.
        seq_lens: ``[Rl]`` int32 last local position + 1 (from the device
            positions); 0 past the real rows and when the rank has no token.
        seq_lens_cpu_upper_bound: ``[Rl]`` int32 ``num_computed + num_scheduled``.
        dcp_local_seq_lens_cpu_upper_bound: ``[Rl]`` int32 DCP rank 0's share
            of the whole request's KV (``dcp_size > 1``), else ``None``.
        prefill_len: ``[Rl]`` int32 prompt length of the request.
        num_computed_prefill_tokens: ``[Rl]`` int32 ``min(num_computed, prefill_len)``.
        is_prefilling: ``[Rl]`` bool, the segment starts inside the prompt.
        has_prefill: 0-d bool, any local row prefilling (decode graph not eligible).
        input_ids: ``[Lp]`` global ids of the local rows; 0 on padding rows.
        positions: ``[Lp]`` int64 global positions of the local rows; 0 on padding.
        is_padding: ``[Lp]`` bool, rows past ``num_tokens``.
        moe_is_padding: ``[P*Lp]`` bool padding of the gathered rows the MoE
            routes (``moe_gathers_tokens``; vLLM hands it to the runner as
            the local batch's ``is_padding``), else ``None``.
        logits_indices: ``[Rl]`` int32 ``query_start_loc[1:] - 1`` (never
            sampled: sampling uses the restored global hidden states).
        cu_num_logits: ``[Rl + 1]`` int32 ``0, 1, ..`` up to the real rows, then flat.
        gather_idx: ``[Lp]`` int64 global token of each local row (0 on padding).
    """

    bucket: Bucket = static_field()
    num_reqs: torch.Tensor
    num_tokens: torch.Tensor
    global_batch_req_idx: torch.Tensor
    idx_mapping: torch.Tensor
    num_scheduled_tokens: torch.Tensor
    num_computed_tokens: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor
    dcp_local_seq_lens_cpu_upper_bound: torch.Tensor | None
    prefill_len: torch.Tensor
    num_computed_prefill_tokens: torch.Tensor
    is_prefilling: torch.Tensor
    has_prefill: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    is_padding: torch.Tensor
    moe_is_padding: torch.Tensor | None
    logits_indices: torch.Tensor
    cu_num_logits: torch.Tensor
    gather_idx: torch.Tensor


def gathered_padding(config: MRV2Config, per_rank_num_tokens: torch.Tensor, rows: int) -> torch.Tensor:
    """``[P*rows]`` bool: gathered row ``q*rows + l`` is padding (``l >= per_rank_num_tokens[q]``)."""
    row = torch.arange(config.pcp_size * rows, dtype=torch.int64, device=per_rank_num_tokens.device)
    return (row % rows) >= per_rank_num_tokens[row // rows]


def expand_moe_padding(config: MRV2Config, is_padding: torch.Tensor) -> torch.Tensor:
    """vLLM ``PCPManager.moe_is_padding``: a capture/dummy mask ``[L]``, identical on every
    rank, tiled to the ``[P*L]`` rows the MoE routes; unchanged without
    ``moe_gathers_tokens``. ``P = 2``: ``[F, T]`` -> ``[F, T, F, T]``."""
    return is_padding.repeat(config.pcp_size) if config.moe_gathers_tokens else is_padding


def _rank_row(seg: Segments, rank: int | torch.Tensor) -> Segments:
    return Segments(*(select_rank(t, rank) for t in seg))


@entry_op
def partition_batch(state: MRV2State, global_batch: GlobalBatch) -> tuple[MRV2State, LocalBatch]:
    """Build the layout of ``global_batch`` and this rank's local batch from it.

    vLLM ``PCPManager.partition_batch`` (with ``_build_batch_layout``). An
    entry op: reads only ``state.config`` and ``state.rank``, and returns the
    state with the new layout and bucket (for the slot mappings, restores and
    draft prefill). The bucket is ``global_batch.bucket``, checked on the host
    by :func:`pcp_fn.mrv2.make_batch` for every rank. A mixed prefill + decode
    batch is served in any bucket that holds it (vLLM's FULL graphs take
    decode-only batches). Example: the module docstring.

    Raises:
        TypeError: ``state`` / ``global_batch`` of the wrong type.
        ValueError: ``global_batch`` built for another config, its bucket past
            the capacities, or its leaves of the wrong rows.
    """
    check_state(state, "partition_batch")
    cfg = state.config
    check_global_batch(cfg, global_batch)
    built = build(cfg, global_batch)
    lay = built.layout
    P, Lp, Rl = cfg.pcp_size, global_batch.bucket.num_tokens, global_batch.bucket.num_reqs
    rank = state.pcp_rank
    mine = _rank_row(built.segments, rank)
    dev = lay.per_rank_num_tokens.device

    # token rows: gather the global arrays, zero the padding
    gather_idx = select_rank(lay.padded_gather_idx.view(P, Lp), rank)
    num_tokens = select_rank(lay.per_rank_num_tokens, rank)
    is_padding = torch.arange(Lp, device=dev) >= num_tokens
    input_ids = torch.where(is_padding, 0, global_batch.input_ids[gather_idx])
    positions = torch.where(is_padding, 0, global_batch.positions[gather_idx])

    # request rows: compact the non-empty segments (they are already in local order)
    nonempty = mine.length > 0
    dest = torch.cumsum(nonempty.to(torch.int64), 0) - nonempty.to(torch.int64)
    count = nonempty.sum()
    segment_ids = torch.arange(nonempty.shape[0], dtype=torch.int64, device=dev)
    seg_of_row = scatter_to(dest, nonempty & (dest < Rl), segment_ids, Rl)
    k = torch.arange(Rl, dtype=torch.int64, device=dev)
    real = k < count
    num_reqs = count.clamp(min=1)
    live = k < num_reqs  # the real rows, or the placeholder row 0 (global row 0, no tokens)
    req = torch.where(real, mine.request[seg_of_row], 0)
    length = torch.where(real, mine.length[seg_of_row], 0)
    start = torch.where(
        live, global_batch.num_computed[req] + torch.where(real, mine.offset[seg_of_row], 0), 0
    )

    qsl = offsets(length)
    last = (qsl[1:] - 1).clamp(0, Lp - 1)
    seq_lens = torch.where(real, positions[last] + 1, 0)
    prefill_len = torch.where(live, global_batch.prefill_len[req], 0)
    computed_prefill = torch.minimum(start, prefill_len)
    is_prefilling = live & (computed_prefill < prefill_len)

    dcp_bound = None
    if cfg.dcp_size > 1:
        # the largest DCP shard (DCP rank 0's) of the whole request, the same on every PCP rank
        request_len = global_batch.num_computed[req] + global_batch.num_scheduled[req]
        shard = cp_local_seq_lens(request_len, 1, cfg.dcp_size, cfg.cp_interleave)[:, 0, 0]
        dcp_bound = torch.where(live, shard, 0).to(torch.int32)
    moe = gathered_padding(cfg, lay.per_rank_num_tokens, Lp) if cfg.moe_gathers_tokens else None

    i32 = torch.int32
    qsl32 = qsl.to(i32)
    local = LocalBatch(
        bucket=global_batch.bucket,
        num_reqs=num_reqs,
        num_tokens=num_tokens,
        global_batch_req_idx=req,
        idx_mapping=torch.where(live, global_batch.idx_mapping[req], 0),
        num_scheduled_tokens=length.to(i32),
        num_computed_tokens=start.to(i32),
        query_start_loc=qsl32,
        seq_lens=seq_lens.to(i32),
        seq_lens_cpu_upper_bound=(start + length).to(i32),
        dcp_local_seq_lens_cpu_upper_bound=dcp_bound,
        prefill_len=prefill_len.to(i32),
        num_computed_prefill_tokens=computed_prefill.to(i32),
        is_prefilling=is_prefilling,
        has_prefill=is_prefilling.any(),
        input_ids=input_ids,
        positions=positions,
        is_padding=is_padding,
        moe_is_padding=moe,
        logits_indices=qsl32[1:] - 1,
        cu_num_logits=torch.arange(Rl + 1, dtype=i32, device=dev).clamp(max=count.to(i32)),
        gather_idx=gather_idx,
    )
    return MRV2State(config=cfg, bucket=global_batch.bucket, rank=state.rank, layout=lay), local
