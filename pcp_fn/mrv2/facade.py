"""`MRV2Partition`: vLLM model runner V2's partition as a [`pcp_fn.Layout`][] of the facade.

The built-in `"mrv2"` and `"mrv2-sharded"` layouts: `PCPConfig(..., layout="mrv2")` runs
[`pcp_fn.step`][pcp_fn.step.step], the spec-decode prep and every tool of the facade on MRV2's partition.
The chunk and replication rules are [`pcp_fn.mrv2.chunks`][]' (the device layout and the
host twin use the same functions); restore, slots and logits come from
[`pcp_fn.PartitionLayout`][], in scheduler order (the MRV2 `hidden_restore_idx` order).
The vLLM adapters use [`pcp_fn.mrv2`][]'s own config, state and API instead.

`P = 2`, tokens `[1, 5, 8]` (request 0 a decode): chunks of `c = ceil(n / 4)` cut at the
request's end, rank 0 holds `(0,0) (1,0) (1,1) (2,0) (2,1) (2,6) (2,7)`, rank 1 `(0,0)
(1,2) (1,3) (1,4) (2,2) .. (2,5)`; logits `[0, 5, 13]`.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..protocol.config import PCPConfig
from ..protocol.partition import PartitionLayout, Requests
from . import host
from .chunks import splits
from .config import MRV2Config
from .splits import HEAD_TAIL, HeadTail, PrefillSplit


class MRV2Partition(PartitionLayout):
    """vLLM model runner V2's partition (`vllm/v1/worker/gpu/pcp_manager.py`) as a facade layout.

    A prefill of `n` tokens is cut into `2P` chunks of `c = ceil(n / 2P)`; rank
    `q` holds chunk `q` (head) and `2P-1-q` (tail), each cut at the request's
    end (no pads). A decode, and with `dcp_size > 1` a prefill too short to fill
    all `2P` chunks (`(2P-1) * c >= n`, vLLM `replicated_requests`), is
    replicated on every rank (`"mrv2"`), or with `shard_decode_requests=True`
    (`"mrv2-sharded"`, vLLM's `pcp_shard_decode_requests`, its default when
    `dcp_size == 1`) given whole to rank `j % P`, `j` its ordinal among the
    non-empty replicated requests. The decode classification is the facade's
    ([`pcp_fn.protocol.batch.classify_decodes`][pcp_fn.protocol.classify_decodes]).

    `"mrv2-sharded"` refuses `dcp_size > 1` (vLLM never shards decodes under DCP)
    and speculative tokens ([`pcp_fn.spec`][] reads a decode's draft tokens from
    this rank's rows, where a sharded decode is not; vLLM MRV2 broadcasts rank 0's
    drafts instead).

    `split`: another [`PrefillSplit`][pcp_fn.mrv2.splits.PrefillSplit] of the prefills (the
    built-in `"round-robin"` and `"cost-balanced"`), named after it; it requires
    `dcp_size == 1` (vLLM's DCP reads head and tail chunks). The vLLM drop-in serves
    every layout of this class (`FunctionalPCPManager(layout=...)`).
    """

    name = "mrv2"

    def __init__(self, *, shard_decode_requests: bool = False, split: PrefillSplit = HEAD_TAIL) -> None:
        self.shard_decode_requests = shard_decode_requests
        self.split = split
        if not isinstance(split, HeadTail):
            self.name = split.name
        if shard_decode_requests:
            self.name = f"{self.name}-sharded"

    def check_config(self, config: PCPConfig) -> None:
        if not isinstance(self.split, HeadTail) and config.dcp_size > 1:
            raise ValueError(
                f"the {self.name!r} layout requires dcp_size == 1, got dcp_size={config.dcp_size}: "
                "vLLM's DCP reads each rank's prefill rows as head and tail chunks"
            )
        if self.shard_decode_requests and config.dcp_size > 1:
            raise ValueError(
                f"the {self.name!r} layout requires dcp_size == 1, got dcp_size={config.dcp_size}: DCP "
                "needs every decode on every rank (vLLM's pcp_shard_decode_requests is False then)"
            )
        if self.shard_decode_requests and config.num_spec_tokens:
            raise ValueError(
                f"the {self.name!r} layout does not serve num_spec_tokens={config.num_spec_tokens}: "
                "pcp_fn.spec reads a decode's draft tokens from this rank's rows, which a sharded "
                "decode is not on; use 'mrv2' (decodes replicated)"
            )

    def _whole(self, config: PCPConfig, requests: Requests) -> torch.Tensor:
        """vLLM `replicated_requests`: the requests not split (decodes; short prefills under DCP)."""
        prefilling = requests.request_ids >= requests.num_decode_reqs
        if not isinstance(self.split, HeadTail):
            return ~prefilling
        return ~splits(config, requests.num_scheduled, prefilling)

    def replicated(self, config: PCPConfig, requests: Requests) -> torch.Tensor:
        if config.pcp_size == 1:
            return requests.replicated
        whole = self._whole(config, requests)
        return torch.zeros_like(whole) if self.shard_decode_requests else whole  # dealt: one owner each

    def segments(
        self, config: PCPConfig, requests: Requests, rank: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        P = config.pcp_size
        n = requests.num_scheduled
        whole = self._whole(config, requests) | (P == 1)
        first, length = self.split.runs(n, requests.num_computed, rank, P)  # [R_b, 2]
        first = first * ~whole[:, None]
        mine = n
        if self.shard_decode_requests and P > 1:  # dealt round-robin over the non-empty ones
            dealt = whole & (n > 0)
            ordinal = torch.cumsum(dealt.to(torch.int64), 0) - dealt.to(torch.int64)
            mine = n * (ordinal % P == rank)
        length = torch.where(whole[:, None], torch.stack([mine, torch.zeros_like(n)], 1), length)
        return first, length

    def num_local_tokens(
        self, config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int, num_computed: np.ndarray
    ) -> int:
        """Host: the fullest rank's rows, by the host twin (vLLM `get_num_tokens_for_dispatch`)."""
        twin = _host_config(config.pcp_size, config.dcp_size, self.shard_decode_requests, self.split)
        prefilling = np.arange(num_scheduled.shape[0]) >= num_decodes
        total = int(np.add.reduce(num_scheduled))
        return host.largest_rank(twin, num_scheduled, prefilling, total, num_computed)[0]


@functools.cache
def _host_config(pcp_size: int, dcp_size: int, shard: bool, split: PrefillSplit) -> MRV2Config:
    """The MRV2 config the host twin reads (its rules read no capacity: nominal ones)."""
    return MRV2Config(pcp_size, 0, 1, 1, dcp_size=dcp_size, shard_decode_requests=shard, split=split)
