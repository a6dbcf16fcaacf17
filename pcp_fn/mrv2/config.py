"""Static configuration of the MRV2 PCP layout (vLLM `v1/worker/gpu/pcp_manager.py`).

Plain, hashable Python: the static half of every MRV2 pytree, so
`torch.compile`, `torch.export` and `graph.capture` specialise on it.

Capacities (`P = pcp_size`, `R = max_num_reqs`, `T = max_num_tokens`):

    local tokens per rank     Lp <= T        a rank's chunks of a request are disjoint
                                             pieces of it, so no rank holds more than
                                             the T scheduled tokens
    local request rows        Rl <= 2R       a request puts at most two segments
                                             (head and tail chunk) on a rank
                                             (vLLM PCPManager's 2 * max_num_reqs
                                             local input buffers)
    gathered rows             P * Lp

A graph bucket is a [`pcp_fn.Bucket`][] `(num_reqs=Rl, num_tokens=Lp)`:
local request rows (the FULL-graph request capacity, vLLM
`PCPManager.partition_batch`'s `num_reqs_after_padding`) and local tokens
per rank (its `padded_num_tokens`). The global batch keeps `[R]` request
rows and `F_b = min(T, P * Lp)` token rows ([`pcp_fn.mrv2.token_rows`][]).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ..core.config import RankConfig
from .splits import HEAD_TAIL, HeadTail, PrefillSplit


@dataclasses.dataclass(frozen=True)
class MRV2Config(RankConfig):
    """Static configuration of one rank of the MRV2 layout.

    Args:
        pcp_size: `P`, prefill context-parallel ranks.
        pcp_rank: this rank, `0 <= pcp_rank < P` (or give the rank as a 0-d
            tensor to [`pcp_fn.mrv2.init_state`][]: rank as data).
        max_num_reqs: `R`, global requests per step.
        max_num_tokens: `T`, global scheduled tokens per step.
        shard_decode_requests: each decode goes to exactly one rank,
            round-robin over the decodes of the step (vLLM
            `pcp_shard_decode_requests`); otherwise decodes are replicated on
            every rank and rank 0 writes their KV.
        dcp_size: decode context-parallel ranks. With `dcp_size > 1`, prefills too short to
            fill all `2P` chunks are replicated, and the local batch carries the DCP
            sequence-length upper bound.
        dcp_rank: this rank's decode context-parallel rank; it does not change the layout
            (kept for completeness).
        cp_kv_cache_interleave_size: KV interleave size (vLLM's `cp_interleave`).
        moe_gathers_tokens: the MoE all-gathers PCP tokens to route them (no
            expert-parallel all2all); the local batch then carries the padding
            mask over the `P * Lp` gathered rows.
        pad_slot_id: slot of gathered rows that must not write the KV cache
            (vLLM `PAD_SLOT_ID`).
        split: how a split prefill is cut over the ranks (a
            [`PrefillSplit`][pcp_fn.mrv2.splits.PrefillSplit]): vLLM's head and tail chunks
            ([`HEAD_TAIL`][pcp_fn.mrv2.splits.HEAD_TAIL], the default), or another split of at
            most two contiguous runs per rank.
        request_buckets: allowed local request rows. Default: powers of two, then the capacity.
        token_buckets: allowed local tokens per rank. Default: powers of two, then the capacity.

    Raises:
        ValueError: a field out of range, or `shard_decode_requests` with
            `dcp_size > 1`: vLLM never combines them
            (`ParallelConfig.pcp_shard_decode_requests` is False when DCP > 1),
            and vLLM's `PCPManager` would leave the KV of a replicated short prefill owned
            by a rank other than 0 unwritten and its hidden-restore rows unset; or a
            `split` other than head-tail with `dcp_size > 1`: vLLM's DCP replicates the
            prefills too short for head and tail chunks, and its sparse-MLA backends
            (`_split_pcp_dcp_prefill_chunks`, FlashMLA-sparse's `gathered_prefill_shards`)
            read each rank's rows as those chunks.
    """

    shard_decode_requests: bool = dataclasses.field(default=False, kw_only=True)
    moe_gathers_tokens: bool = dataclasses.field(default=False, kw_only=True)
    split: PrefillSplit = dataclasses.field(default=HEAD_TAIL, kw_only=True)

    OWN_FLAGS: ClassVar[tuple[str, ...]] = ("shard_decode_requests", "moe_gathers_tokens")
    CAPACITY_NAMES: ClassVar[tuple[str, str, str]] = (
        "local requests",
        "the local request capacity 2 * max_num_reqs = {}",
        "the local token capacity max_num_tokens = {}",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shard_decode_requests and self.dcp_size > 1:
            raise ValueError(
                f"shard_decode_requests requires dcp_size == 1, got dcp_size={self.dcp_size}: "
                "DCP needs decode queries on every rank (vLLM's pcp_shard_decode_requests is "
                "False when DCP > 1)"
            )
        if not isinstance(self.split, PrefillSplit):
            raise ValueError(f"split must be a pcp_fn.mrv2.PrefillSplit, got {type(self.split).__name__}")
        if self.dcp_size > 1 and not isinstance(self.split, HeadTail):
            raise ValueError(
                f"split {self.split.name!r} requires dcp_size == 1, got dcp_size={self.dcp_size}: "
                "vLLM's DCP reads each rank's prefill rows as head and tail chunks (its sparse-MLA "
                "backends' _split_pcp_dcp_prefill_chunks and gathered_prefill_shards)"
            )
        self._normalise_buckets()

    @property
    def num_chunks(self) -> int:
        """`2P`: a split prefill is cut into this many chunks."""
        return 2 * self.pcp_size

    @property
    def max_local_tokens(self) -> int:
        """Most local tokens a rank can hold: `T` (module docstring)."""
        return self.max_num_tokens

    @property
    def max_local_reqs(self) -> int:
        """Most local request rows (segments) a rank can hold: `2R`."""
        return 2 * self.max_num_reqs
