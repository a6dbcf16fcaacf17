"""Static configuration of the MRV2 PCP layout (vLLM ``v1/worker/gpu/pcp_manager.py``).

Plain, hashable Python: the static half of every MRV2 pytree, so
``torch.compile``, ``torch.export`` and ``graph.capture`` specialise on it.

Capacities (``P = pcp_size``, ``R = max_num_reqs``, ``T = max_num_tokens``)::

    local tokens per rank     Lp <= T        a rank's chunks of a request are disjoint
                                             pieces of it, so no rank holds more than
                                             the T scheduled tokens
    local request rows        Rl <= 2R       a request puts at most two segments
                                             (head and tail chunk) on a rank
                                             (vLLM ``PCPManager``'s ``2 * max_num_reqs``
                                             local input buffers)
    gathered rows             P * Lp

A graph bucket is a :class:`pcp_fn.Bucket` ``(num_reqs=Rl, num_tokens=Lp)``:
local request rows (the FULL-graph request capacity, vLLM
``PCPManager.partition_batch``'s ``num_reqs_after_padding``) and local tokens
per rank (its ``padded_num_tokens``). The global batch keeps ``[R]`` request
rows and ``F_b = min(T, P * Lp)`` token rows (:func:`pcp_fn.mrv2.token_rows`).
"""

from __future__ import annotations

import dataclasses

from ..core.buckets import Bucket, normalise_buckets, smallest_bucket
from ..core.checks import SHARED_INTS, check_config_fields


@dataclasses.dataclass(frozen=True)
class MRV2Config:
    """Static configuration of one rank of the MRV2 layout.

    Args:
        pcp_size: ``P``, prefill context-parallel ranks.
        pcp_rank: this rank, ``0 <= pcp_rank < P`` (or give the rank as a 0-d
            tensor to :func:`pcp_fn.mrv2.init_state`: rank as data).
        max_num_reqs: ``R``, global requests per step.
        max_num_tokens: ``T``, global scheduled tokens per step.
        shard_decode_requests: each decode goes to exactly one rank,
            round-robin over the decodes of the step (vLLM
            ``pcp_shard_decode_requests``); otherwise decodes are replicated on
            every rank and rank 0 writes their KV.
        dcp_size, dcp_rank: decode context parallelism. With ``dcp_size > 1``,
            prefills too short to fill all ``2P`` chunks are replicated, and the
            local batch carries the DCP sequence-length upper bound.
            ``dcp_rank`` does not change the layout (kept for completeness).
        cp_interleave: KV interleave size (``cp_kv_cache_interleave_size``).
        moe_gathers_tokens: the MoE all-gathers PCP tokens to route them (no
            expert-parallel all2all); the local batch then carries the padding
            mask over the ``P * Lp`` gathered rows.
        pad_slot_id: slot of gathered rows that must not write the KV cache
            (vLLM ``PAD_SLOT_ID``).
        request_buckets, token_buckets: allowed local request rows and local
            tokens per rank. Default: powers of two, then the capacity.

    Raises:
        ValueError: a field out of range, or ``shard_decode_requests`` with
            ``dcp_size > 1``: vLLM never combines them
            (``ParallelConfig.pcp_shard_decode_requests`` is False when DCP > 1),
            and vLLM's ``PCPManager`` would leave the KV of a replicated short prefill owned
            by a rank other than 0 unwritten and its hidden-restore rows unset.
    """

    pcp_size: int
    pcp_rank: int
    max_num_reqs: int
    max_num_tokens: int
    shard_decode_requests: bool = dataclasses.field(default=False, kw_only=True)
    dcp_size: int = dataclasses.field(default=1, kw_only=True)
    dcp_rank: int = dataclasses.field(default=0, kw_only=True)
    cp_interleave: int = dataclasses.field(default=1, kw_only=True)
    moe_gathers_tokens: bool = dataclasses.field(default=False, kw_only=True)
    pad_slot_id: int = dataclasses.field(default=-1, kw_only=True)
    request_buckets: tuple[int, ...] | None = dataclasses.field(default=None, kw_only=True)
    token_buckets: tuple[int, ...] | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        check_config_fields(
            self, dict(SHARED_INTS, cp_interleave=1), ("shard_decode_requests", "moe_gathers_tokens")
        )
        if self.shard_decode_requests and self.dcp_size > 1:
            raise ValueError(
                f"shard_decode_requests requires dcp_size == 1, got dcp_size={self.dcp_size}: "
                "DCP needs decode queries on every rank (vLLM's pcp_shard_decode_requests is "
                "False when DCP > 1)"
            )
        object.__setattr__(
            self,
            "request_buckets",
            normalise_buckets("request_buckets", self.request_buckets, self.max_local_reqs),
        )
        object.__setattr__(
            self,
            "token_buckets",
            normalise_buckets("token_buckets", self.token_buckets, self.max_local_tokens),
        )

    @property
    def num_chunks(self) -> int:
        """``2P``: a split prefill is cut into this many chunks."""
        return 2 * self.pcp_size

    @property
    def max_local_tokens(self) -> int:
        """Most local tokens a rank can hold: ``T`` (module docstring)."""
        return self.max_num_tokens

    @property
    def max_local_reqs(self) -> int:
        """Most local request rows (segments) a rank can hold: ``2R``."""
        return 2 * self.max_num_reqs

    @property
    def capacity(self) -> Bucket:
        """The largest bucket ``(2R, T)``."""
        return Bucket(self.max_local_reqs, self.max_local_tokens)

    def bucket_for(self, num_local_reqs: int, num_local_tokens: int) -> Bucket:
        """Smallest configured bucket holding ``num_local_reqs`` rows and ``num_local_tokens`` tokens."""
        if num_local_reqs > self.max_local_reqs:
            raise ValueError(
                f"{num_local_reqs} local requests exceed the local request capacity "
                f"2 * max_num_reqs = {self.max_local_reqs}"
            )
        if num_local_tokens > self.max_local_tokens:
            raise ValueError(
                f"{num_local_tokens} local tokens exceed the local token capacity "
                f"max_num_tokens = {self.max_local_tokens}"
            )
        return smallest_bucket(self.request_buckets, self.token_buckets, num_local_reqs, num_local_tokens)

    def buckets(self) -> list[Bucket]:
        """Every configured bucket (for capturing up front)."""
        return [Bucket(r, t) for r in self.request_buckets for t in self.token_buckets]
