"""The vLLM model-runner-V2 PCP layout (`v1/worker/gpu/pcp_manager.py`, `PCPManager`) as pure,
fixed-shape functions.

    cfg = MRV2Config(pcp_size=2, pcp_rank=0, max_num_reqs=256, max_num_tokens=8192)
    state = init_state(cfg)                                   # empty layout, smallest bucket
    batch = make_batch(cfg, num_scheduled, num_computed, prefill_len,
                       input_ids=ids, positions=pos)          # host: validates, picks the bucket
    state, local = partition_batch(state, batch)              # layout + this rank's LocalBatch
    state, slots = gathered_slot_mappings(state, global_slots)      # [K, F_b] -> [K, P*Lp]
    state, hidden = restore_hidden_states(state, all_gathered)      # [P*Lp, H] -> [F_b, H]

Unlike the DualChunkSwap layout (`pcp_fn.update_tokens`), prefills are not
padded (chunks are cut at the request's end), decodes are replicated or sharded,
every rank orders its rows decodes first, and the gathered buffer is mapped by
`padded_gather_idx` / `hidden_restore_idx` with a KV write mask.

[`LAYOUT`][pcp_fn.mrv2.LAYOUT] and [`SHARDED_LAYOUT`][pcp_fn.mrv2.SHARDED_LAYOUT]
([`MRV2Partition`][pcp_fn.MRV2Partition]) serve the same partition to the facade, as the built-in
`"mrv2"` and `"mrv2-sharded"` [`pcp_fn.Layout`][]; the chunk and replication rules are written once,
in [`pcp_fn.mrv2.chunks`][]. The same machinery serves any prefill split of at most two
contiguous runs per rank ([`pcp_fn.mrv2.splits`][], `MRV2Config(split=...)`): besides vLLM's
head and tail chunks, [`ROUND_ROBIN_LAYOUT`][pcp_fn.mrv2.ROUND_ROBIN_LAYOUT] and
[`COST_BALANCED_LAYOUT`][pcp_fn.mrv2.COST_BALANCED_LAYOUT] are built in (`"round-robin"`,
`"cost-balanced"`), and the vLLM drop-in serves each of them.

Sizes come with the data: `partition_batch` and `build_layout` (entry
ops: they read only the state's config and rank) record the batch's bucket
`(Rl, Lp)` in the state, and every consumer shapes its outputs from it
(`F_b = token_rows(config, bucket) = min(T, P * Lp)` global token rows).
"""

from .batch import (
    GlobalBatch,
    check_bucket,
    make_batch,
    num_tokens_for_dispatch,
    rank_counts,
    token_rows,
    unpack_batch,
)
from .config import MRV2Config
from .facade import MRV2Partition
from .layout import MRV2Layout, MRV2State, build_layout, init_state
from .packing import REQUESTS
from .partition import LocalBatch, expand_moe_padding, partition_batch
from .restore import (
    DraftHiddenStates,
    SamplingInputs,
    gathered_slot_mappings,
    prepare_draft_prefill,
    restore_draft_prefill,
    restore_for_sampling,
    restore_hidden_states,
)
from .splits import COST_BALANCED, HEAD_TAIL, ROUND_ROBIN, CostBalanced, HeadTail, PrefillSplit, RoundRobin

LAYOUT = MRV2Partition()
"""The built-in `"mrv2"` layout of the facade (`pcp_fn.PCPConfig(layout="mrv2")`): decodes replicated."""
SHARDED_LAYOUT = MRV2Partition(shard_decode_requests=True)
"""The built-in `"mrv2-sharded"` layout of the facade: decode requests dealt round-robin to the ranks."""
ROUND_ROBIN_LAYOUT = MRV2Partition(split=ROUND_ROBIN)
"""The built-in `"round-robin"` layout: the `2P` chunks of a prefill dealt in turn, rank `q`
holds chunks `q` and `P+q` ([`RoundRobin`][pcp_fn.mrv2.splits.RoundRobin]); decodes replicated."""
COST_BALANCED_LAYOUT = MRV2Partition(split=COST_BALANCED)
"""The built-in `"cost-balanced"` layout: one run of each prefill per rank, equal causal work
([`CostBalanced`][pcp_fn.mrv2.splits.CostBalanced]); decodes replicated."""
ROUND_ROBIN_SHARDED_LAYOUT = MRV2Partition(split=ROUND_ROBIN, shard_decode_requests=True)
"""`"round-robin-sharded"`: `"round-robin"` with decode requests dealt to the ranks (vLLM's
`pcp_shard_decode_requests`, what a drop-in serving `"round-robin"` does then)."""
COST_BALANCED_SHARDED_LAYOUT = MRV2Partition(split=COST_BALANCED, shard_decode_requests=True)
"""`"cost-balanced-sharded"`: `"cost-balanced"` with decode requests dealt to the ranks."""

__all__ = [
    "COST_BALANCED",
    "COST_BALANCED_LAYOUT",
    "COST_BALANCED_SHARDED_LAYOUT",
    "HEAD_TAIL",
    "LAYOUT",
    "REQUESTS",
    "ROUND_ROBIN",
    "ROUND_ROBIN_LAYOUT",
    "ROUND_ROBIN_SHARDED_LAYOUT",
    "SHARDED_LAYOUT",
    "CostBalanced",
    "DraftHiddenStates",
    "GlobalBatch",
    "HeadTail",
    "LocalBatch",
    "MRV2Config",
    "MRV2Layout",
    "MRV2Partition",
    "MRV2State",
    "PrefillSplit",
    "RoundRobin",
    "SamplingInputs",
    "build_layout",
    "check_bucket",
    "expand_moe_padding",
    "gathered_slot_mappings",
    "init_state",
    "make_batch",
    "num_tokens_for_dispatch",
    "partition_batch",
    "prepare_draft_prefill",
    "rank_counts",
    "restore_draft_prefill",
    "restore_for_sampling",
    "restore_hidden_states",
    "token_rows",
    "unpack_batch",
]
