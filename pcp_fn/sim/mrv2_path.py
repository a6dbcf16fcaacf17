"""The simulator's MRV2 side: every call the simulator makes into [`pcp_fn.mrv2`][].

vLLM's model runner V2 (`v1/worker/gpu/pcp_manager.py`, vllm-ascend's
`AscendPCPManager`) lays a step out without DualChunkSwap padding. The
engine's `Runner(layout="mrv2")` goes through [`MRV2Path`][pcp_fn.sim.mrv2_path.MRV2Path] only, so the
MRV2 API is used in this one module:

- [`MRV2Path.partition`][pcp_fn.sim.mrv2_path.MRV2Path.partition]: `mrv2.make_batch` (the host boundary: the
  scheduler's arrays and the global input ids) and `mrv2.partition_batch`;
- [`mrv2_wiring`][pcp_fn.sim.mrv2_path.mrv2_wiring]: `mrv2.gathered_slot_mappings` and
  `mrv2.restore_hidden_states` wired into the tiny model;
- [`engine_outputs`][pcp_fn.sim.mrv2_path.engine_outputs]: an engine's recorded steps
  ([`pcp_fn.adapters.recording`][]) through `mrv2.make_batch` and `mrv2.partition_batch`, the
  functions the vLLM drop-in's graph runs, in the engine's row order with its prefill flags.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .. import mrv2
from ..protocol.config import PCPConfig
from ..protocol.registry import get_layout
from .tiny_model import Wiring


def mrv2_wiring(
    state: mrv2.MRV2State,
    local: mrv2.LocalBatch,
    global_slots: torch.Tensor,
    request_of_token: torch.Tensor,
    last_token: torch.Tensor,
    trash: int,
) -> Wiring:
    """The MRV2 layout: every gathered row with a slot writes the cache (replicated rows only
    from rank 0), sampling reads the restored global order.

    Args:
        state: the state [`pcp_fn.mrv2.partition_batch`][] returned.
        local: the local batch [`pcp_fn.mrv2.partition_batch`][] returned.
        global_slots: `[T]` cache slot of each global token; `request_of_token`: `[T]` its
            batch row; `last_token`: `[S]` the global tokens to sample (each request's last;
            its last `drafts + 1` under spec decode).
    """
    # the host padded the slots to T; the graph reads the bucket's F_b = min(T, P * Lp) rows
    rows = mrv2.token_rows(state.config, state.bucket)
    _, slots = mrv2.gathered_slot_mappings(state, global_slots[:rows].unsqueeze(0))
    slots = slots[0].to(torch.int64)
    return Wiring(
        input_ids=local.input_ids.to(torch.int64),
        positions=local.positions,
        request=request_of_token[local.gather_idx],
        kv_dest=torch.where(slots == state.config.pad_slot_id, trash, slots),
        kv_rows=lambda local_rows, gathered: gathered,
        sample_rows=lambda gathered: mrv2.restore_hidden_states(state, gathered)[1][last_token],
    )


class MRV2Path:
    """One rank's MRV2 layout inside [`pcp_fn.sim.engine.Runner`][].

    `step_fn` replaces [`pcp_fn.mrv2.partition_batch`][] (a compiled one,
    say); it is called with the initial state every step, as
    `partition_batch` reads only the state's config and rank.
    """

    def __init__(
        self,
        config: PCPConfig,
        device: torch.device,
        step_fn: Callable[..., tuple[mrv2.MRV2State, mrv2.LocalBatch]] | None = None,
    ) -> None:
        self.config = mrv2.MRV2Config(
            config.pcp_size, config.pcp_rank, config.max_num_reqs, config.max_num_tokens
        )
        self.state = mrv2.init_state(self.config, device)
        self.step_fn = mrv2.partition_batch if step_fn is None else step_fn
        self.device = device

    def partition(
        self,
        num_scheduled: Sequence[int],
        num_computed: Sequence[int],
        num_prompt: Sequence[int],
        input_ids: Sequence[int],
    ) -> tuple[mrv2.MRV2State, mrv2.LocalBatch]:
        """This step's layout and this rank's [`pcp_fn.mrv2.LocalBatch`][]."""
        batch = mrv2.make_batch(
            self.config, num_scheduled, num_computed, num_prompt, input_ids=input_ids, device=self.device
        )
        return self.step_fn(self.state, batch)

    def wiring(
        self,
        state: mrv2.MRV2State,
        local: mrv2.LocalBatch,
        num_scheduled: Sequence[int],
        num_drafts: Sequence[int],
        slots: Sequence[int],
        trash: int,
    ) -> Wiring:
        """The tiny model's [`Wiring`][pcp_fn.sim.tiny_model.Wiring] for this step: global slots,
        the request of each global token, and the global tokens to sample, padded to `T` on the host
        (one copy)."""
        T, rows = self.config.max_num_tokens, len(num_scheduled)
        total = int(sum(num_scheduled))
        request_of_token = np.zeros(T, dtype=np.int64)
        request_of_token[:total] = np.repeat(np.arange(rows), num_scheduled)
        global_slots = np.zeros(T, dtype=np.int64)
        global_slots[:total] = slots
        # sample each request's last drafts + 1 global tokens (just the last without drafts)
        end = np.cumsum(num_scheduled)
        last = np.concatenate(
            [np.arange(e - d - 1, e) for e, d in zip(end, num_drafts)] or [np.zeros(0, np.int64)]
        ).astype(np.int64)
        host = torch.from_numpy(np.concatenate([request_of_token, global_slots, last])).to(self.device)
        return mrv2_wiring(state, local, host[T : 2 * T], host[:T], host[2 * T :], trash)


def engine_mrv2_config(config: PCPConfig, moe_gathers_tokens: bool = False) -> mrv2.MRV2Config:
    """The [`pcp_fn.MRV2Config`][] (rank 0) of an engine trace's header: `config.layout` (an
    [`pcp_fn.MRV2Partition`][]) says how prefills are split and whether decodes are sharded
    (`"mrv2-sharded"`, ...) or replicated (`"mrv2"`, ...); the buckets are `pcp_fn.mrv2`'s
    defaults (the graph ladder the recording engine used is not replayed)."""
    layout = get_layout(config.layout)
    if not isinstance(layout, mrv2.MRV2Partition):
        raise ValueError(f"layout {config.layout!r} is not a pcp_fn.MRV2Partition: no engine serves it")
    return mrv2.MRV2Config(
        config.pcp_size,
        0,
        config.max_num_reqs,
        config.max_num_tokens,
        shard_decode_requests=layout.shard_decode_requests,
        moe_gathers_tokens=moe_gathers_tokens,
        split=layout.split,
        dcp_size=config.dcp_size,
        cp_kv_cache_interleave_size=config.cp_kv_cache_interleave_size,
        pad_slot_id=config.pad_slot_id,
    )


def engine_batch(config: mrv2.MRV2Config, step: Any, device: torch.device | str = "cpu") -> mrv2.GlobalBatch:
    """A recorded step's global batch, as the drop-in stages it: the engine's row order,
    its `is_prefilling` and `idx_mapping`, positions from the computed tokens, zero input ids
    (a recording holds no token ids)."""
    return mrv2.make_batch(
        config,
        step.num_scheduled,
        step.num_computed,
        step.num_prompt,
        is_prefilling=step.is_prefilling,
        idx_mapping=step.idx_mapping,
        device=device,
    )


def engine_outputs(
    config: mrv2.MRV2Config, steps: Iterable[Any], run: Callable[..., Any], ranks: Sequence[int], device: Any
) -> Iterator[tuple[mrv2.MRV2Layout, mrv2.LocalBatch]]:
    """Each recorded step's `(layout, local batch)` of every rank in `ranks`, rank after rank;
    `run` is [`pcp_fn.mrv2.partition_batch`][] or a compiled one (it reads only the state's
    config and rank, so every step starts from the initial state)."""
    states = {r: mrv2.init_state(config, device, rank=r) for r in ranks}
    for s in steps:
        batch = engine_batch(config, s, device)
        for r in ranks:
            state, local = run(states[r], batch)
            yield state.layout, local
