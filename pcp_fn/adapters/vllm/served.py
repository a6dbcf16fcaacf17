"""Which registered layout the vLLM drop-in serves: `FunctionalPCPManager(layout=NAME)`.

    PCP_FN_PCP_MANAGER=1 PCP_FN_PCP_LAYOUT=cost-balanced python serve.py

vLLM's model runner V2 serves a partition of the prefills only if it has this shape
(read off vLLM 0.32-0.34's runner, attention backends, DCP, MoE mask and drafts):

- each local request row is one contiguous, ascending run of one request: the attention
  metadata builders derive a row's positions and causal mask from `seq_lens` and
  `query_start_loc` alone (`seq_len - query_len + j`), and the KV of a row is the request's
  prefix up to it;
- a rank holds at most `2 * max_num_reqs` rows (the `InputBuffers` the runner and its
  attention builders allocate): at most two runs of a request per rank;
- decodes come first and whole, on every rank or dealt as `pcp_shard_decode_requests`
  says (FULL decode graphs, the draft model's `sync_drafts`);
- with `dcp_size > 1` every rank's prefill rows are vLLM's own head and tail chunks: DCP
  replicates the prefills too short for them, and the sparse-MLA backends
  (`_split_pcp_dcp_prefill_chunks` of the indexer, FlashMLA-sparse's
  `gathered_prefill_shards`) read each rank's rows as those chunks.

A layout of that shape is a [`pcp_fn.MRV2Partition`][] (a
[`PrefillSplit`][pcp_fn.mrv2.splits.PrefillSplit] of at most two runs per rank): the built-in
`"mrv2"` (vLLM's own), `"round-robin"` and `"cost-balanced"`, or a researcher's registered
`MRV2Partition(split=...)`. Every other layout is refused at construction, naming why:
[`served_split`][pcp_fn.adapters.vllm.served.served_split].
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from ...mrv2 import MRV2Partition
from ...mrv2.splits import HeadTail, PrefillSplit
from ...protocol.registry import available_layouts, get_layout

LAYOUT_ENV = "PCP_FN_PCP_LAYOUT"
"""The environment variable naming the layout a drop-in serves when its constructor names none."""

DEFAULT_LAYOUT = "mrv2"

REFUSED: dict[str, str] = {
    "dcs": "it pads every prefill to 2P chunks: pad rows inside a request, which vLLM's attention "
    "reads as tokens (each local row must be a contiguous run of real tokens)",
    "hybrid": "its prefill rows are DualChunkSwap's padded chunks (see 'dcs'), its decodes "
    "vllm-ascend's per-rank KV shards",
}
"""The built-in layouts vLLM's model runner V2 cannot serve, and why (module docstring)."""


class ServedLayout(NamedTuple):
    """What the drop-in serves: the layout's registry name (as a recorded trace names it) and
    its prefill split."""

    name: str
    split: PrefillSplit


def served_split(
    layout: str | None,
    *,
    shard_decode_requests: bool,
    dcp_size: int,
    environ: Mapping[str, str] = os.environ,
) -> ServedLayout:
    """The layout a drop-in serves, checked: `layout`, else `$PCP_FN_PCP_LAYOUT`, else `"mrv2"`.

    Decode placement is vLLM's (`pcp_shard_decode_requests`): a layout named without
    `-sharded` serves decodes as vLLM's config says, and when they are dealt the returned name
    is its registered `-sharded` twin (`"round-robin"` -> `"round-robin-sharded"`), what a
    recorded trace names and replays.

    Raises:
        ValueError: an unknown name (listing the registered ones); a layout that is not a
            [`pcp_fn.MRV2Partition`][] (the built-in `"dcs"` and `"hybrid"` with their reason);
            a `-sharded` layout while vLLM replicates decodes, or a layout without a registered
            `-sharded` twin while vLLM deals them; a split other than vLLM's head and tail
            chunks with `dcp_size > 1`.
    """
    name = layout if layout is not None else (environ.get(LAYOUT_ENV) or DEFAULT_LAYOUT)
    source = "layout" if layout is not None else LAYOUT_ENV
    if not isinstance(name, str):
        raise ValueError(f"{source} must be a layout's name, got {type(name).__name__}")
    if name in REFUSED:
        raise ValueError(f"{source}={name!r}: vLLM's model runner V2 cannot serve it: {REFUSED[name]}")
    try:
        found = get_layout(name)
    except (KeyError, ValueError):
        raise ValueError(
            f"{source}={name!r} is not a registered layout; registered: {', '.join(available_layouts())}"
        ) from None
    if not isinstance(found, MRV2Partition):
        raise ValueError(
            f"{source}={name!r}: vLLM's model runner V2 serves only a pcp_fn.MRV2Partition (each local "
            "row one contiguous run of a request, at most two runs of a request on a rank); register "
            "MRV2Partition(split=...) with a pcp_fn.mrv2.PrefillSplit"
        )
    if found.shard_decode_requests and not shard_decode_requests:
        raise ValueError(
            f"{source}={name!r} deals decodes to the ranks, but vLLM's pcp_shard_decode_requests is "
            f"False: name {name.removesuffix('-sharded')!r} (decode placement is vLLM's config)"
        )
    split = found.split
    if dcp_size > 1 and not isinstance(split, HeadTail):
        raise ValueError(
            f"{source}={name!r} requires dcp_size == 1, got {dcp_size}: vLLM's DCP reads each rank's "
            "prefill rows as head and tail chunks (the sparse-MLA backends' "
            "_split_pcp_dcp_prefill_chunks and gathered_prefill_shards)"
        )
    if not shard_decode_requests or found.shard_decode_requests:
        return ServedLayout(name, split)
    # vLLM deals the decodes: serve (and record) the layout's sharded twin
    twin = f"{name}-sharded"
    try:
        sharded = get_layout(twin)
    except (KeyError, ValueError):
        sharded = None
    if not (isinstance(sharded, MRV2Partition) and sharded.shard_decode_requests and sharded.split == split):
        raise ValueError(
            f"{source}={name!r}: vLLM deals decodes to the ranks (pcp_shard_decode_requests), and no "
            f"layout {twin!r} = MRV2Partition(split=..., shard_decode_requests=True) with the same split "
            "is registered; register it (a recorded trace names it), or turn pcp_shard_decode_requests off"
        )
    return ServedLayout(twin, split)
