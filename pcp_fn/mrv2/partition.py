"""The rank-local batch of the MRV2 layout: `partition_batch` (vLLM `PCPManager.partition_batch`).

Each of this rank's segments becomes one local request row: a split prefill
gives two rows (head and tail chunk), a decode one. `P = 2`, scheduled
`[3, 8]` (request 0 a 3-token decode at position 16, request 1 a fresh
prefill), rank 1, bucket `(4, 8)`:

    segments          decode 0 (16..18)   prefill chunk 1 (2, 3)   chunk 2 (4, 5)
    input rows        g0 g1 g2            g5 g6                    g7 g8          . (padding)
    query_start_loc   [0, 3, 5, 7, 7]     (entries past the rows = the token count)
    positions         [16, 17, 18, 2, 3, 4, 5, 0]
    seq_lens          [19, 4, 6, 0]       (last local position + 1)
    num_computed      [16, 2, 4, 0]       (host start of each segment)
    is_prefilling     [F, T, T, F]        (start < prefill_len)
    logits_indices    [2, 4, 6, 6]        (query_start_loc[1:] - 1)

A rank with no segment keeps one placeholder row (global row 0, no tokens),
as vLLM's `PCPManager.partition_batch` does.
"""

from __future__ import annotations

import torch

from ..core.buckets import Bucket
from ..core.entry import entry_op
from ..core.pytree import pytree_dataclass, static_field
from ..core.ragged import take
from ..core.rank import select_rank
from ..core.seqlens import cp_local_seq_lens
from .batch import GlobalBatch, check_global_batch
from .config import MRV2Config
from .layout import MRV2State, Segments, build, check_state


@pytree_dataclass
class LocalBatch:
    """This rank's batch (`Rl, Lp` = the bucket's request rows and local tokens).

    Per-request fields are `[Rl]` and hold 0 (False) past `num_reqs`;
    vLLM keeps the unpadded ones `[num_reqs]` long.

    Attributes:
        bucket: static `(Rl, Lp)` (vLLM's `num_reqs_after_padding`,
            `num_tokens_after_padding`).
        num_reqs: 0-d int64 local request rows, at least 1 (placeholder).
        num_tokens: 0-d int64 real local tokens.
        global_batch_req_idx: `[Rl]` int64 global batch row of each local row.
        idx_mapping: `[Rl]` request-state index (`idx_mapping[global row]`).
        num_scheduled_tokens: `[Rl]` int32 tokens of each local row.
        num_computed_tokens: `[Rl]` int32 host start position of the segment
            (`num_computed + offset inside the request`).
        query_start_loc: `[Rl + 1]` int32; entries past the rows equal
            `num_tokens`.
        seq_lens: `[Rl]` int32 last local position + 1 (from the device
            positions); 0 past the real rows and when the rank has no token.
        seq_lens_cpu_upper_bound: `[Rl]` int32 `num_computed + num_scheduled`.
        dcp_local_seq_lens_cpu_upper_bound: `[Rl]` int32 DCP rank 0's share
            of the whole request's KV (`dcp_size > 1`), else `None`.
        prefill_len: `[Rl]` int32 prompt length of the request.
        num_computed_prefill_tokens: `[Rl]` int32 `min(num_computed, prefill_len)`.
        is_prefilling: `[Rl]` bool, the segment starts inside the prompt.
        has_prefill: 0-d bool, any local row prefilling (decode graph not eligible).
        input_ids: `[Lp]` global ids of the local rows; 0 on padding rows.
        positions: `[Lp]` int64 global positions of the local rows; 0 on padding.
        is_padding: `[Lp]` bool, rows past `num_tokens`.
        moe_is_padding: `[P*Lp]` bool padding of the gathered rows the MoE
            routes (`moe_gathers_tokens`; vLLM hands it to the runner as
            the local batch's `is_padding`), else `None`.
        logits_indices: `[Rl]` int32 `query_start_loc[1:] - 1` (never
            sampled: sampling uses the restored global hidden states).
        cu_num_logits: `[Rl + 1]` int32 `0, 1, ..` up to the real rows, then flat.
        gather_idx: `[Lp]` int64 global token of each local row (0 on padding).
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


def expand_moe_padding(config: MRV2Config, is_padding: torch.Tensor) -> torch.Tensor:
    """vLLM `PCPManager.moe_is_padding`: a capture/dummy mask `[L]`, identical on every
    rank, tiled to the `[P*L]` rows the MoE routes; unchanged without
    `moe_gathers_tokens`. `P = 2`: `[F, T]` -> `[F, T, F, T]`."""
    return is_padding.repeat(config.pcp_size) if config.moe_gathers_tokens else is_padding


@entry_op
def partition_batch(state: MRV2State, global_batch: GlobalBatch) -> tuple[MRV2State, LocalBatch]:
    """Build the layout of `global_batch` and this rank's local batch from it.

    vLLM `PCPManager.partition_batch` (with `_build_batch_layout`). An
    entry op: reads only `state.config` and `state.rank`, and returns the
    state with the new layout and bucket (for the slot mappings, restores and
    draft prefill). The bucket is `global_batch.bucket`, checked on the host
    by [`pcp_fn.mrv2.make_batch`][] for every rank. A mixed prefill + decode
    batch is served in any bucket that holds it (vLLM's FULL graphs take
    decode-only batches). Example: the module docstring.

    Raises:
        TypeError: `state` / `global_batch` of the wrong type.
        ValueError: `global_batch` built for another config, its bucket past
            the capacities, or its leaves of the wrong rows.
    """
    check_state(state, "partition_batch")
    cfg = state.config
    check_global_batch(cfg, global_batch)
    built = build(cfg, global_batch)
    lay = built.layout
    P, Lp, Rl = cfg.pcp_size, global_batch.bucket.num_tokens, global_batch.bucket.num_reqs
    rank = state.pcp_rank
    mine = Segments(*select_rank(built.table, rank, 1))  # [Rl] each (one select for a tensor rank)
    qsl = select_rank(built.query_start_loc, rank)
    count = select_rank(built.count, rank)

    # token rows: gather the global arrays, zero the padding
    gather_idx = select_rank(lay.padded_gather_idx.view(P, Lp), rank)
    valid = select_rank(built.valid.view(P, Lp), rank)
    input_ids = global_batch.input_ids.index_select(0, gather_idx) * valid
    positions = global_batch.positions.index_select(0, gather_idx) * valid

    # request rows: the segments come compacted in local order; row 0 of a rank without any is
    # the placeholder (global row 0, no token), rows past num_reqs are 0
    k = built.ids[: Rl + 1]
    real = k[:Rl] < count
    # last local position + 1 of each real row
    qsl32 = qsl.to(torch.int32)
    last = qsl32[1:] - 1
    seq_lens = torch.addcmul(real, take(positions, last), real)
    computed_prefill = torch.minimum(mine.start, mine.prefill_len)
    is_prefilling = computed_prefill < mine.prefill_len

    dcp_bound = None
    if cfg.dcp_size > 1:
        # the largest DCP shard (DCP rank 0's) of the whole request, the same on every PCP rank
        shard = cp_local_seq_lens(mine.request_len, 1, cfg.dcp_size, cfg.cp_kv_cache_interleave_size)[:, 0, 0]
        dcp_bound = shard.to(torch.int32)
    moe = ~built.valid if cfg.moe_gathers_tokens else None

    i32 = torch.int32
    local = LocalBatch(
        bucket=global_batch.bucket,
        num_reqs=count.clamp(min=1),
        num_tokens=qsl[-1],
        global_batch_req_idx=mine.request.to(torch.int64),
        idx_mapping=mine.idx_mapping,
        num_scheduled_tokens=mine.length,
        num_computed_tokens=mine.start,
        query_start_loc=qsl32,
        seq_lens=seq_lens.to(i32),
        seq_lens_cpu_upper_bound=mine.start + mine.length,
        dcp_local_seq_lens_cpu_upper_bound=dcp_bound,
        prefill_len=mine.prefill_len,
        num_computed_prefill_tokens=computed_prefill,
        is_prefilling=is_prefilling,
        has_prefill=is_prefilling.any(),
        input_ids=input_ids,
        positions=positions,
        is_padding=~valid,
        moe_is_padding=moe,
        logits_indices=last,
        cu_num_logits=k.clamp(max=count),
        gather_idx=gather_idx,
    )
    return MRV2State(config=cfg, bucket=global_batch.bucket, rank=state.rank, layout=lay), local
