"""`FunctionalPCPManager`'s methods, over any `PCPManager` base: vLLM's, or a test stand-in.

vLLM builds its model runner V2's manager as `pcp_manager_cls(pcp_world_size,
pcp_rank, device, ...)` and calls its public methods; this module is the class
body a drop-in needs on top of vLLM's base, and nothing else: every method
forwards to the composed [`MRV2Bookkeeper`][pcp_fn.adapters.vllm.MRV2Bookkeeper]
(which holds the state), and the vLLM attribute names vLLM's own code and tests
read (`_input_buffers`, `_block_tables`, `draft_prefill_batch`, ...) are
views of the bookkeeper's. The methods whose names or signatures differ between
vLLM releases come from [`pcp_fn.adapters.vllm.contract`][].

The concrete class is `contract.methods + FunctionalPCPManagerMixin + PCPManager`
([`pcp_fn.adapters.vllm.FunctionalPCPManager`][] over the installed vLLM;
[`make_functional_manager`][pcp_fn.adapters.vllm.make_functional_manager] over any base).

`validate_config` accepts FULL CUDA graphs for mixed prefill + decode batches:
the bookkeeping is inside a graph, nothing in it depends on the batch's composition.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch

from ..backend import GraphStats, default_graph_backend
from ..schedule_cache import ScheduleCache
from .bookkeeper import EngineNames, MRV2Bookkeeper
from .engine_types import BatchExecutionDescriptor, BlockTables, InputBatch, InputBuffers, VllmConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class VllmApi(EngineNames):
    """The engine's names ([`EngineNames`][pcp_fn.adapters.vllm.EngineNames]) and the base
    class, `PCPManager` (`vllm.v1.worker.gpu.pcp_manager.PCPManager`)."""

    PCPManager: type


class _Override:
    """A read-only view of `inner` with some attributes replaced (for `validate_config`)."""

    def __init__(self, inner: object, **overrides: object) -> None:
        self._inner = inner
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_inner"], name)


class BookkeeperAttribute:
    """A vLLM attribute name of the manager whose value is the bookkeeper's `name`: one copy of
    the state. Before the bookkeeper exists (vLLM's constructor runs first) it is a plain attribute."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj: FunctionalPCPManagerMixin | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        bookkeeper = obj.__dict__.get("bookkeeper")
        if bookkeeper is None:
            return obj.__dict__.get(self.attr)
        return getattr(bookkeeper, self.name)

    def __set__(self, obj: FunctionalPCPManagerMixin, value: object) -> None:
        bookkeeper = obj.__dict__.get("bookkeeper")
        if bookkeeper is None:
            obj.__dict__[self.attr] = value
        else:
            setattr(bookkeeper, self.name, value)


class FunctionalPCPManagerMixin:
    """Drop-in for vLLM's MRV2 `PCPManager`: the same constructor, methods and results
    (checked in lockstep), with the bookkeeping in one captured graph per bucket.

    The constructor is vLLM's (`pcp_manager_cls(pcp_world_size, pcp_rank, device, ...)`); its
    arguments go to the [`MRV2Bookkeeper`][pcp_fn.adapters.vllm.MRV2Bookkeeper], which holds
    the state.

    Args:
        pcp_world_size: `P`, the PCP group's size.
        pcp_rank: this rank of the PCP group.
        device: where the persistent buffers and the graphs live.
        shard_decode_requests: each decode on one rank, round-robin (vLLM
            `pcp_shard_decode_requests`); otherwise decodes are replicated on every rank.
        max_num_reqs: `R`, global requests per step; without it or `max_num_tokens` nothing is
            allocated (like vLLM's).
        max_num_tokens: `T`, global scheduled tokens per step.
        block_tables: vLLM's `BlockTables` (vLLM 0.33+: `None`, set later by the runner).
        dcp_world_size: decode context-parallel ranks.
        dcp_rank: this rank's decode context-parallel rank.
        cp_interleave: the KV interleave size.
        moe_gathers_tokens: the MoE all-gathers PCP tokens to route them (vLLM 0.33+; a
            `ValueError` on a vLLM without the MoE routing mask).
        record_schedule: record every step's schedule to this trace file (default
            `$PCP_FN_RECORD_SCHEDULE`; [`pcp_fn.adapters.recording`][]): `pcp-fn replay` replays
            it. Only the recording process writes (global rank 0); serving never waits on it.
        layout: the registered layout to serve (default `$PCP_FN_PCP_LAYOUT`, else `"mrv2"`,
            vLLM's own): any [`pcp_fn.MRV2Partition`][], the built-in `"round-robin"` and
            `"cost-balanced"` among them; decodes stay where vLLM's
            `pcp_shard_decode_requests` puts them. Any other layout is a `ValueError` naming why
            ([`pcp_fn.adapters.vllm.served`][]).

    The class attributes, from `vllm_api` to `check_host_syncs`, are set on a subclass or the
    class to change every instance.

    Attributes:
        vllm_api: the engine's names and base ([`VllmApi`][pcp_fn.adapters.vllm.VllmApi]).
        bookkeeper_cls: the bookkeeper class (a subclass changes a policy, e.g.
            [`full_rows`][pcp_fn.adapters.vllm.MRV2Bookkeeper.full_rows]).
        graph_backend: `"auto"`, `"aoti"`, a `torch.compile` backend, or
            `None` for plain calls (default `$PCP_FN_GRAPH_BACKEND`, else
            `auto`; [`pcp_fn.adapters.backend.resolve_graph_backend`][]). Every
            graph is made in the constructor (the engine's start-up), never at a step.
        token_buckets: the graph ladder's token sizes (default powers of two
            from 16; [`pcp_fn.adapters.backend.graph_ladder`][]).
        check_host_syncs: run the device part under [`pcp_fn.no_host_syncs`][].
        bookkeeper: the [`MRV2Bookkeeper`][pcp_fn.adapters.vllm.MRV2Bookkeeper].
    """

    vllm_api: VllmApi
    bookkeeper_cls: type[MRV2Bookkeeper] = MRV2Bookkeeper
    graph_backend: str | None = default_graph_backend()
    token_buckets: tuple[int, ...] | None = None
    check_host_syncs = False

    # vLLM's names for the bookkeeper's state
    _input_buffers = BookkeeperAttribute("input_buffers")
    _block_tables = BookkeeperAttribute("block_tables")
    _local_block_tables = BookkeeperAttribute("local_block_tables")
    _local_block_table_ptrs = BookkeeperAttribute("local_block_table_ptrs")
    _global_batch = BookkeeperAttribute("last_global_batch")
    _local_batch = BookkeeperAttribute("last_local_batch")
    draft_prefill_batch = BookkeeperAttribute("draft_prefill_batch")
    cp_interleave = BookkeeperAttribute("cp_interleave")

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: torch.device,
        shard_decode_requests: bool,
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: BlockTables | None = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
        moe_gathers_tokens: bool = False,
        *,
        record_schedule: str | os.PathLike[str] | None = None,
        layout: str | None = None,
    ) -> None:
        api = self.vllm_api
        if moe_gathers_tokens and not api.contract.moe_mask:
            raise ValueError(
                f"moe_gathers_tokens=True: vLLM {api.contract.name}'s PCPManager has no MoE routing mask"
            )
        # vLLM's own state first, without its capacities: the base allocates no buffer, and every
        # attribute its inherited helpers (_build_batch_layout, ...) read or write exists as in
        # vLLM; the block tables are attached by the bookkeeper (vLLM 0.33+: by the runner, later)
        api.PCPManager.__init__(
            self,
            **api.contract.base_init_keywords(
                pcp_world_size,
                pcp_rank,
                device,
                shard_decode_requests,
                dcp_world_size,
                dcp_rank,
                cp_interleave,
            ),
        )
        self.pcp_world_size, self.pcp_rank, self.device = pcp_world_size, pcp_rank, torch.device(device)
        self.dcp_world_size, self.dcp_rank = dcp_world_size, dcp_rank
        if api.contract.shards_decodes:  # (vLLM 0.30's manager has no such attribute)
            self.shard_decode_requests = shard_decode_requests
        self.max_num_reqs, self.max_num_tokens = max_num_reqs, max_num_tokens
        for name in _BOOKKEEPER_ATTRIBUTES:  # vLLM's constructor's values: the bookkeeper's from now on
            self.__dict__.pop(name, None)
        self.bookkeeper = self.bookkeeper_cls(
            pcp_world_size=pcp_world_size,
            pcp_rank=pcp_rank,
            device=device,
            shard_decode_requests=shard_decode_requests,
            max_num_reqs=max_num_reqs,
            max_num_tokens=max_num_tokens,
            block_tables=block_tables,
            dcp_world_size=dcp_world_size,
            dcp_rank=dcp_rank,
            cp_interleave=cp_interleave,
            moe_gathers_tokens=moe_gathers_tokens,
            engine=api,
            graph_backend=self.graph_backend,
            token_buckets=self.token_buckets,
            check_host_syncs=self.check_host_syncs,
            record_schedule=record_schedule,
            manager_name=type(self).__name__,
            layout=layout,
        )

    @classmethod
    def validate_config(cls, vllm_config: VllmConfig, supports_mm_inputs: bool) -> None:
        """vLLM's checks, except that FULL CUDA graphs serve mixed batches too.

        vLLM rejects `FULL` (one FULL routine for every batch) with PCP; the
        bookkeeping here is one graph per bucket, so the base class checks the
        config as if it said `FULL_DECODE_ONLY`, which passes every other
        check unchanged (the mode is still not `NONE`).
        """
        Mode = cls.vllm_api.CUDAGraphMode
        if vllm_config.compilation_config.cudagraph_mode == Mode.FULL:
            compilation = _Override(vllm_config.compilation_config, cudagraph_mode=Mode.FULL_DECODE_ONLY)
            vllm_config = _Override(vllm_config, compilation_config=compilation)
        cls.vllm_api.PCPManager.validate_config(vllm_config, supports_mm_inputs)

    # ------------------------------------------------------------ state

    @property
    def input_buffers(self) -> InputBuffers:
        """The persistent local `InputBuffers` (`2 * max_num_reqs` rows, `max_num_tokens`)."""
        self.bookkeeper.require("input_buffers")
        return self.bookkeeper.input_buffers

    @property
    def global_batch(self) -> InputBatch:
        """The global `InputBatch` of the last `partition_batch`."""
        return self.bookkeeper.global_batch

    @property
    def schedule_cache(self) -> ScheduleCache:
        """What repeated schedules reuse ([`pcp_fn.adapters.schedule_cache`][]): its `made`
        counts, by table, what was computed rather than looked up."""
        return self.bookkeeper.schedule_cache

    @property
    def graph_stats(self) -> GraphStats:
        """Graphs prepared at construction and their time, steps partitioned, eager fallbacks."""
        return self.bookkeeper.graph_stats

    def persistent_buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent device buffer by name (their `data_ptr()`s never change)."""
        return self.bookkeeper.persistent_buffers()

    # ------------------------------------------------------------ vLLM's methods

    def get_num_tokens_for_dispatch(self, num_scheduled_tokens: np.ndarray, is_prefilling: np.ndarray) -> int:
        """The largest real rank-local batch before graph padding (host twin, no loop)."""
        return self.bookkeeper.get_num_tokens_for_dispatch(num_scheduled_tokens, is_prefilling)

    def partition_batch(self, input_batch: InputBatch, batch_desc: BatchExecutionDescriptor) -> InputBatch:
        """This rank's local `InputBatch`
        ([`MRV2Bookkeeper.partition_batch`][pcp_fn.adapters.vllm.MRV2Bookkeeper.partition_batch])."""
        return self.bookkeeper.partition_batch(input_batch, batch_desc)

    def prepare_attn(self, input_batch: InputBatch) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Local block tables (gathered into the persistent tables) and the gathered slot mappings
        (this class's
        [`prepare_slot_mappings`][pcp_fn.adapters.vllm.FunctionalPCPManager.prepare_slot_mappings]:
        a subclass's override is honoured)."""
        return self.bookkeeper.gather_block_tables(input_batch), self.prepare_slot_mappings()

    def prepare_slot_mappings(self) -> torch.Tensor:
        """`[K, P * Lp]`: the KV slot of every all-gathered row (`PAD_SLOT_ID`: must not write)."""
        return self.bookkeeper.prepare_slot_mappings()

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        """Zeroed views of the persistent local block tables (capture and dummy runs)."""
        return self.bookkeeper.get_dummy_block_tables(num_reqs)

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        """The persistent gathered slot mappings, all `PAD_SLOT_ID`, `[K, num_tokens * P]`."""
        return self.bookkeeper.get_dummy_slot_mappings(num_tokens)

    def restore_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """All-gather the ranks' `[Lp, ...]` rows, in global token order `[num_tokens, ...]`."""
        return self.bookkeeper.restore_hidden_states(hidden_states)

    def restore_for_sampling(
        self, hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, InputBatch]:
        """Restored hidden (and auxiliary) states with the global batch to sample with."""
        return self.bookkeeper.restore_for_sampling(hidden_states, aux_hidden_states)

    def prepare_draft_prefill(self, input_batch: InputBatch, input_ids: torch.Tensor) -> None:
        """Point the drafter at this rank's rows of `input_ids` (global order)."""
        self.bookkeeper.prepare_draft_prefill(input_batch, input_ids)

    def restore_draft_prefill(
        self, last_hidden_states: torch.Tensor, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Restore the drafter's outputs to global order (once when both are the same tensor)."""
        return self.bookkeeper.restore_draft_prefill(last_hidden_states, hidden_states)


_BOOKKEEPER_ATTRIBUTES = tuple(
    name for name, value in vars(FunctionalPCPManagerMixin).items() if isinstance(value, BookkeeperAttribute)
)


def make_functional_manager(api: VllmApi, name: str = "FunctionalPCPManager") -> type:
    """`class name(api.contract.methods, FunctionalPCPManagerMixin, api.PCPManager)` with
    `vllm_api = api`: the drop-in over any base (the installed vLLM's is
    [`pcp_fn.adapters.vllm.FunctionalPCPManager`][]). Its `graph_backend` is
    `$PCP_FN_GRAPH_BACKEND` now (the class built next follows the switch)."""
    bases = (api.contract.methods, FunctionalPCPManagerMixin, api.PCPManager)
    return type(name, bases, class_namespace(name, FunctionalPCPManagerMixin, vllm_api=api))


def class_namespace(name: str, mixin: type, **attributes: object) -> dict[str, object]:
    """The namespace of a drop-in class built over a base at run time: `mixin`'s docstring,
    this module's name and `graph_backend` read from the environment now."""
    return {
        "__doc__": mixin.__doc__,
        "__module__": mixin.__module__,
        "__qualname__": name,
        "graph_backend": default_graph_backend(),
        **attributes,
    }
