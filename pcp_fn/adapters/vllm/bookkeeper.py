"""The MRV2 bookkeeper: vLLM's `PCPManager` step work without vLLM, over one graph per bucket.

vLLM's model runner V2 `PCPManager` (`vllm/v1/worker/gpu/pcp_manager.py`)
rewrites each step's global `InputBatch` into this rank's DualChunkSwap rows
with Python loops over requests and segments, and allocates fresh index
tensors every step, so vLLM only captures FULL graphs for decode-only batches.
[`MRV2Bookkeeper`][pcp_fn.adapters.vllm.MRV2Bookkeeper] does the same work with the same method names and
results (checked in lockstep against vLLM's class), but:

- host fields (request ids, query start locations, sequence-length upper
  bounds, counts) come from the numpy twin of the layout rules, `O(P * R)`
  vectorised, never from reading a device tensor;
- per-token indices come from `pcp_fn.mrv2` captured once per bucket
  ([`pcp_fn.adapters.vllm.graphs.StepGraphs`][pcp_fn.adapters.vllm.StepGraphs], the only module that calls
  `pcp_fn`) and are copied into persistent buffers allocated once here; the
  returned local `InputBatch` holds views of them, so a captured model graph
  sees the same addresses every step.

It imports no vLLM: the few engine names it needs (`InputBuffers`,
`CUDAGraphMode`, `PAD_SLOT_ID`, the PCP group, the capture sizes and the
release's contract) come in its constructor as [`EngineNames`][pcp_fn.adapters.vllm.EngineNames]. vLLM's
manager class is
[`pcp_fn.adapters.vllm.manager.FunctionalPCPManagerMixin`][pcp_fn.adapters.vllm.FunctionalPCPManagerMixin]
over vLLM's base, forwarding each public method here.

Example (`P = 2`, two requests: a decode and a fresh prefill of 7 tokens;
`shard_decode_requests=False`, so the decode is on every rank; the prefill's
`2P = 4` chunks `[p0 p1 | p2 p3 | p4 p5 | p6]` go head and tail to rank 0,
the middle two to rank 1):

    num_scheduled_tokens  [1, 7]       is_prefilling_np  [F, T]
    rank 0's rows         [t0] [p0 p1] [p6]       requests [0, 1, 1]  offsets [0, 0, 6]
    rank 1's rows         [t0] [p2 p3] [p4 p5]    requests [0, 1, 1]  offsets [0, 2, 4]
    get_num_tokens_for_dispatch -> 5  (the ranks hold 4 and 5 tokens)

`partition_batch` on rank 0 then returns a local batch of three request rows,
`num_scheduled_tokens [1, 2, 1]`, whose `input_ids` / `positions` are views
of the persistent buffers holding `[t0 p0 p1 p6]` padded to the step's `Lp`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ...core.checks import check_int, host_ints, host_row
from ...mrv2.host import largest_rank
from ...mrv2.splits import HeadTail
from ...protocol.config import PCPConfig
from ...sim.trace import BatchDesc, EngineInfo
from ..backend import GraphStats, capture_ladder, package_cache_dir, resolve_graph_backend
from ..recording import TraceRecorder, is_recording_process, record_path
from ..schedule_cache import ScheduleCache
from .contract import VLLM_0_32, VllmContract
from .engine_types import (
    BatchExecutionDescriptor,
    BlockTables,
    CUDAGraphModes,
    GroupCoordinator,
    InputBatch,
    InputBuffers,
    InputBuffersFactory,
)
from .graphs import Destinations, HostSegments, StepGraphs, StepPlan
from .inputs import (
    check_block_tables,
    check_capacities,
    check_capture,
    check_descriptor,
    check_draft_ids,
    check_flags,
    check_gathered_input,
    check_num_tokens,
    check_req_ids,
    check_token_tensors,
    check_upper_bounds,
    resolve_device,
)
from .replace import dict_copy_ok, replace_fields
from .served import ServedLayout, served_split


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineNames:
    """The engine's names the bookkeeper uses (vLLM's, or a test stand-in's).

    Attributes:
        InputBuffers: `vllm.v1.worker.gpu.input_batch.InputBuffers` (`(max_num_reqs,
            max_num_tokens, device)`), or a factory with that signature.
        CUDAGraphMode: `vllm.config.compilation.CUDAGraphMode` (`NONE`, `FULL`, ...).
        PAD_SLOT_ID: `vllm.v1.attention.backends.utils.PAD_SLOT_ID`.
        get_pcp_group: returns the PCP group (`all_gather(tensor, dim=0)`); called at
            each restore, so a patched group is honoured.
        capture_sizes: the engine's CUDA-graph capture sizes, when it has them (vLLM:
            `compilation_config.cudagraph_capture_sizes` of the current config), so the
            graph ladder pads a batch once, not twice.
        contract: what differs between the vLLM releases
            ([`pcp_fn.adapters.vllm.contract.detect`][pcp_fn.adapters.vllm.detect]); default vLLM 0.32's.
        compilation_config: returns the engine's compilation config, when it has one (vLLM:
            the current config's `compilation_config`), read at construction; its
            `cudagraph_mode` (resolved later by vLLM, in place) says whether the FULL graphs
            are mixed ones ([`MRV2Bookkeeper.full_rows`][pcp_fn.adapters.vllm.MRV2Bookkeeper.full_rows]).
    """

    InputBuffers: InputBuffersFactory
    CUDAGraphMode: CUDAGraphModes
    PAD_SLOT_ID: int
    get_pcp_group: Callable[[], GroupCoordinator]
    capture_sizes: Callable[[], Sequence[int] | None] | None = None
    contract: VllmContract = VLLM_0_32
    compilation_config: Callable[[], Any] | None = None


_INT_FIELDS = ("num_computed_tokens_np", "prefill_len_np", "idx_mapping_np")
_NO_ROW = np.zeros(1, dtype=np.intp)  # the placeholder row of a rank without tokens (read only)
_NO_TOKENS = np.zeros(1, dtype=np.int64)
_NO_ROW.flags.writeable = _NO_TOKENS.flags.writeable = False
_I32, _I64 = np.dtype(np.int32), np.dtype(np.int64)


def _check_schedule(num_scheduled: np.ndarray, is_prefilling: np.ndarray) -> None:
    """Integer counts, none negative, and bool prefill flags (`ValueError` naming the field)."""
    if num_scheduled.dtype.kind not in "iu" or is_prefilling.dtype != np.bool_:
        bad = ("num_scheduled_tokens", num_scheduled, "integers")
        if num_scheduled.dtype.kind in "iu":
            bad = ("is_prefilling_np", is_prefilling, "bools")
        raise ValueError(f"input_batch.{bad[0]} must hold {bad[2]}, got {bad[1].dtype}")
    if num_scheduled.size and int(np.bitwise_or.reduce(num_scheduled)) < 0:
        host_ints("num_scheduled_tokens", num_scheduled)  # raises, naming the negative entry


def recorded_desc(batch_desc: BatchExecutionDescriptor) -> BatchDesc:
    """A recorded step's [`BatchDesc`][pcp_fn.sim.trace.BatchDesc] of vLLM's descriptor."""
    return BatchDesc(
        batch_desc.cg_mode.name,
        batch_desc.num_tokens,
        batch_desc.num_reqs,
        getattr(batch_desc, "max_query_len", None),
        getattr(batch_desc, "uniform_token_count", None),
    )


class StepShape(NamedTuple):
    """What a step's schedule (`num_scheduled_tokens`, `is_prefilling_np`) and descriptor
    decide, made once per distinct pair: the plan and device views, this rank's local rows and
    the host fields that depend on nothing else (each step's batch gets copies)."""

    plan: StepPlan  # the graphs' (Lp, Rpad, bucket, graph, ...)
    fixed: dict[str, Any]  # the local batch's fields that only the shape decides (device views, sizes)
    rows: np.ndarray  # [n] intp: each local row's global request (request 0 on a rank without tokens)
    row_list: list[int]  # rows.tolist()
    offset: np.ndarray  # [n]: the row's first token inside its request
    num_scheduled: np.ndarray  # [n] int32
    query_start_loc: np.ndarray  # [Rpad + 1] int32
    cu_num_logits: np.ndarray  # [n + 1] int32
    total: int  # scheduled tokens of the global batch
    shifted: bool  # some row starts inside its request (a split prefill's chunk)
    decode_only: bool  # no global request is prefilling


GlobalArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""The global batch's host arrays, checked
([`MRV2Bookkeeper.check`][pcp_fn.adapters.vllm.MRV2Bookkeeper.check]), in the staging order of
[`pcp_fn.mrv2.packing.REQUESTS`][pcp_fn.mrv2.REQUESTS]:
`(num_scheduled, num_computed, prefill_len, is_prefilling, idx_mapping)`, each `[num_reqs]` (a plain
tuple: it is made every step)."""


class MRV2Bookkeeper:
    """One rank's vLLM MRV2 PCP bookkeeping: the persistent buffers, the host twin, the graphs.

    Args:
        pcp_world_size: `P`, the PCP group's size (this argument and the ten after it are vLLM
            `PCPManager`'s constructor arguments).
        pcp_rank: this rank of the PCP group.
        device: where the persistent buffers and the graphs live.
        shard_decode_requests: each decode on one rank, round-robin (vLLM
            `pcp_shard_decode_requests`); otherwise decodes are replicated on every rank.
        max_num_reqs: `R`, global requests per step. Without it or `max_num_tokens` nothing is
            allocated (like vLLM's): the host methods work, the device path raises naming them.
        max_num_tokens: `T`, global scheduled tokens per step (see `max_num_reqs`).
        block_tables: vLLM's `BlockTables`, gathered into the local tables; `None`: set later
            ([`set_block_tables`][pcp_fn.adapters.vllm.MRV2Bookkeeper.set_block_tables], vLLM
            0.33+).
        dcp_world_size: decode context-parallel ranks.
        dcp_rank: this rank's decode context-parallel rank.
        cp_interleave: the KV interleave size (the block tables' `cp_interleave` replaces it).
        moe_gathers_tokens: the MoE all-gathers PCP tokens to route them: the local batch
            carries the padding mask (vLLM 0.33+).
        engine: the engine's names ([`EngineNames`][pcp_fn.adapters.vllm.EngineNames]).
        graph_backend: `"auto"`, `"aoti"`, a `torch.compile` backend or `None`
            ([`pcp_fn.adapters.backend.resolve_graph_backend`][]); every graph is made
            here, never at a step.
        token_buckets: the graph ladder's token sizes (default: the engine's capture sizes
            on a device, else powers of two; [`pcp_fn.adapters.backend.graph_ladder`][]).
        check_host_syncs: run the device part under [`pcp_fn.no_host_syncs`][].
        record_schedule: the trace file to record every step's schedule to
            ([`pcp_fn.adapters.recording`][]).
        manager_name: the manager class's name, for a recorded trace's header.
        layout: the registered layout to serve ([`served_split`][pcp_fn.adapters.vllm.served.served_split]:
            default `$PCP_FN_PCP_LAYOUT`, else vLLM's own `"mrv2"`).

    State after each step (read by the manager and its subclasses): `last_global_batch`,
    `last_local_batch`, `local_rows` (each local row's global request), `decode_only`
    (the global batch had no prefill), `draft_prefill_batch`.

    `compilation_config`: the engine's compilation config (`engine.compilation_config()` at
    construction; `None`: unknown), whose `cudagraph_mode`
    [`full_rows`][pcp_fn.adapters.vllm.MRV2Bookkeeper.full_rows] reads.

    Raises:
        TypeError, ValueError: a constructor argument or the block tables out of their limits
            ([`pcp_fn.adapters.vllm.inputs`][]), naming it, before anything is allocated.
    """

    serves_other_splits = True
    """Serves a layout of another prefill split (`layout=`); a subclass whose engine's attention
    is not checked against one says `False`, and refuses them."""

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
        engine: EngineNames,
        graph_backend: str | None = "auto",
        token_buckets: Sequence[int] | None = None,
        check_host_syncs: bool = False,
        record_schedule: str | os.PathLike[str] | None = None,
        manager_name: str = "FunctionalPCPManager",
        layout: str | None = None,
    ) -> None:
        check_flags(shard_decode_requests, moe_gathers_tokens)
        self._layout, self._manager_name = layout, manager_name  # (set_shard_decode_requests serves again)
        self.served = self._served(layout, bool(shard_decode_requests), dcp_world_size, manager_name)
        # a split that reads the contexts (cost-balanced) is keyed and cut by num_computed too
        self.reads_context = self.served.split.reads_context
        if moe_gathers_tokens and not engine.contract.moe_mask:
            raise ValueError(
                f"moe_gathers_tokens=True: vLLM {engine.contract.name}'s PCPManager has no MoE routing mask"
            )
        self.engine = engine
        self.pcp_world_size, self.pcp_rank, self.device = pcp_world_size, pcp_rank, torch.device(device)
        self.shard_decode_requests = shard_decode_requests
        self.dcp_world_size, self.dcp_rank, self.cp_interleave = dcp_world_size, dcp_rank, cp_interleave
        self.max_num_reqs, self.max_num_tokens = max_num_reqs, max_num_tokens
        self.graph_backend, self.token_buckets = graph_backend, token_buckets
        self.check_host_syncs = check_host_syncs
        self.last_global_batch: InputBatch | None = None
        self.last_local_batch: InputBatch | None = None
        self.draft_prefill_batch: InputBatch | None = None
        self.block_tables = block_tables
        self.input_buffers: InputBuffers | None = None
        self.local_block_tables: tuple[torch.Tensor, ...] | None = None
        self.local_block_table_ptrs: torch.Tensor | None = None
        self.local_rows: np.ndarray = _NO_ROW
        self.decode_only = False
        self.graphs: StepGraphs | None = None
        self.host = self._host_segments()  # (its config checks the sizes and ranks, naming them)
        # the device a tensor made there reports (cuda -> cuda:0): what the inputs are checked against
        self.resolved_device = resolve_device(self.device)
        check_block_tables(block_tables, self.resolved_device)
        num_groups = 0 if block_tables is None else block_tables.num_kv_cache_groups
        check_capacities(max_num_reqs, max_num_tokens, self.device, pcp_world_size, num_groups)
        make_config = engine.compilation_config
        self.compilation_config = None if make_config is None else make_config()
        self._metadata_reads_upper = engine.contract.batch_metadata is not None
        self._graph_fields = engine.contract.graph_fields
        self._init_cache()
        # (rows asked, rows staged) of the last capture batch: get_dummy_block_tables follows it
        self._capture_rows = (0, 0)
        self._dict_copy_class: type | None = None  # the batch class replace_fields may copy by __dict__
        self.moe: torch.Tensor | None = None  # the MoE's gathered padding mask [P * T]
        if max_num_tokens is not None:
            # the graph writes the gathered MoE mask every step; it is the local batch's
            # is_padding only with moe_gathers_tokens (vLLM 0.33+), all True like vLLM's until a
            # step. Like vLLM's it needs only max_num_tokens (moe_is_padding serves a draft run's
            # mask on a manager without the request capacity).
            self.moe_mask = torch.ones(pcp_world_size * max_num_tokens, dtype=torch.bool, device=self.device)
            self.moe = self.moe_mask if moe_gathers_tokens else None
        self.recorder: TraceRecorder | None = None
        if max_num_reqs is not None and max_num_tokens is not None:
            self._allocate()
            self._allocate_block_tables(block_tables)
            self._build_graphs()
            self.recorder = self._recorder(record_path(record_schedule), manager_name)

    def _served(self, layout: str | None, shard: bool, dcp_size: int, manager_name: str) -> ServedLayout:
        """The layout to serve ([`served_split`][pcp_fn.adapters.vllm.served.served_split]), and
        none but vLLM's own chunks when this class does not serve other splits."""
        served = served_split(layout, shard_decode_requests=shard, dcp_size=dcp_size)
        if not self.serves_other_splits and not isinstance(served.split, HeadTail):
            raise ValueError(
                f"layout {served.name!r}: {manager_name} serves vLLM's own head and tail chunks "
                "only ('mrv2'); its engine's attention backends are not checked against another split"
            )
        return served

    def _recorder(self, path: str | None, manager_name: str) -> TraceRecorder | None:
        """The [`TraceRecorder`][pcp_fn.adapters.recording.TraceRecorder] of this process, when asked
        for one and this is the recording process ([`pcp_fn.adapters.recording`][])."""
        if path is None or not is_recording_process(self.pcp_rank):
            return None
        config = PCPConfig(
            self.pcp_world_size,
            0,
            self.max_num_reqs,
            self.max_num_tokens,
            dcp_size=self.dcp_world_size,
            cp_kv_cache_interleave_size=self.cp_interleave,
            pad_slot_id=int(self.engine.PAD_SLOT_ID),
            layout=self.served.name,
        )
        vllm = sys.modules.get("vllm")
        version = getattr(vllm, "__version__", None) or self.engine.contract.name
        engine = EngineInfo("vllm", str(version), manager_name, self.moe is not None)
        return TraceRecorder(path, config, engine, describe=recorded_desc)

    def _init_cache(self) -> None:
        """What a repeated schedule reuses ([`pcp_fn.adapters.schedule_cache`][]): the twin's
        segments, descriptor ids, shapes and views here, the plans and views of the graphs;
        cleared when the block tables or the layout rules change."""
        self.schedule_cache = ScheduleCache()
        self._segments_of = self.schedule_cache.table("segments")
        self._desc_ids = self.schedule_cache.table("descriptors")
        self._shapes = self.schedule_cache.table("shapes")
        self._views = self.schedule_cache.table("views")
        # (the last descriptor, its id)
        self._last_desc: tuple[BatchExecutionDescriptor | None, int] = (None, -1)
        self._desc_count = itertools.count()  # ids are never reused: one never goes stale

    def _allocate(self) -> None:
        """The persistent local buffers: a request puts at most a head and a tail segment on a
        rank, so `2R` local rows."""
        P, R2, T, dev = self.pcp_world_size, 2 * self.max_num_reqs, self.max_num_tokens, self.device
        self.input_buffers = self.engine.InputBuffers(R2, T, dev)
        self.idx_mapping = torch.zeros(R2, dtype=torch.int64, device=dev)
        self.expanded_local_pos = torch.zeros(R2, dtype=torch.int32, device=dev)  # stays zero
        self.logits_indices = torch.zeros(R2, dtype=torch.int32, device=dev)
        self.cu_num_logits = torch.zeros(R2 + 1, dtype=torch.int32, device=dev)
        self.hidden_restore_idx = torch.zeros(T, dtype=torch.int64, device=dev)
        self.padded_gather_idx = torch.zeros(P * T, dtype=torch.int64, device=dev)
        self.kv_write_mask = torch.zeros(P * T, dtype=torch.bool, device=dev)
        self.slot_gather_idx = torch.zeros(P * T, dtype=torch.int64, device=dev)

    def _layout_rules(self) -> dict[str, Any]:
        """The layout's keyword arguments (the host twin's and the graphs')."""
        return dict(
            shard_decode_requests=bool(self.shard_decode_requests),
            dcp_size=self.dcp_world_size,
            dcp_rank=self.dcp_rank,
            cp_kv_cache_interleave_size=self.cp_interleave,
            split=self.served.split,
        )

    def _host_segments(self) -> HostSegments:
        """The host twin (serves get_num_tokens_for_dispatch with or without capacities)."""
        return HostSegments(self.pcp_world_size, self.pcp_rank, **self._layout_rules())

    def _allocate_block_tables(self, block_tables: BlockTables | None) -> None:
        """The local block tables `[2R, width]` per KV-cache group and the slot-mapping
        buffers for `block_tables` (none without them)."""
        P, R2, T, dev = self.pcp_world_size, 2 * self.max_num_reqs, self.max_num_tokens, self.device
        self.block_tables = block_tables
        self.local_block_tables = self.local_block_table_ptrs = None
        num_groups = 0 if block_tables is None else block_tables.num_kv_cache_groups
        if block_tables is not None:
            self.local_block_tables = tuple(
                t.new_zeros((R2, t.shape[1])) for t in block_tables.input_block_tables
            )
            # vLLM's gather kernel writes through these addresses
            self.local_block_table_ptrs = torch.tensor(
                [t.data_ptr() for t in self.local_block_tables], dtype=torch.uint64, device=dev
            )
        # the slot dtype of the cache-write kernels: the block tables' (vllm-ascend's are int32)
        # when they have one, else vLLM's int64
        slot_dtype = getattr(getattr(block_tables, "slot_mappings", None), "dtype", torch.int64)
        # zeros like vLLM's, and one pad column past the T tokens' (column T, PAD_SLOT_ID: the
        # graphs fill it): a gathered row that must not write reads it, so the gathered slot
        # mappings are one gather
        self.global_slot_mappings = torch.zeros(num_groups, T + 1, dtype=slot_dtype, device=dev)
        self.gathered_slot_mappings = torch.full(
            (num_groups, P * T), self.engine.PAD_SLOT_ID, dtype=slot_dtype, device=dev
        )

    def _build_graphs(self) -> None:
        """The step graphs over the persistent buffers, made now (start-up)."""
        ib, dev = self.input_buffers, self.device
        backend = resolve_graph_backend(self.graph_backend, dev)
        out = Destinations(
            input_ids=ib.input_ids,
            positions=ib.positions,
            is_padding=ib.is_padding,
            query_start_loc=ib.query_start_loc,
            seq_lens=ib.seq_lens,
            idx_mapping=self.idx_mapping,
            logits_indices=self.logits_indices,
            cu_num_logits=self.cu_num_logits,
            hidden_restore_idx=self.hidden_restore_idx,
            padded_gather_idx=self.padded_gather_idx,
            kv_write_mask=self.kv_write_mask,
            slot_gather_idx=self.slot_gather_idx,
            global_slot_mappings=self.global_slot_mappings,
            gathered_slot_mappings=self.gathered_slot_mappings,
            moe_is_padding=self.moe_mask,
        )
        self.graphs = StepGraphs(
            self.pcp_world_size,
            self.pcp_rank,
            self.max_num_reqs,
            self.max_num_tokens,
            **self._layout_rules(),
            pad_slot_id=self.engine.PAD_SLOT_ID,
            device=dev,
            out=out,
            backend=backend,
            check_host_syncs=self.check_host_syncs,
            token_buckets=self._ladder_tokens(backend),
            package_dir=package_cache_dir() if backend == "aoti" else None,
            cache=self.schedule_cache,
        )
        # the graphs were made on an empty batch: the buffers start as vLLM's do
        ib.is_padding.zero_()
        self.moe_mask.fill_(True)

    def _ladder_tokens(self, backend: str | None) -> Sequence[int] | None:
        """The ladder's token sizes: `token_buckets`, else (device graphs) the engine's capture
        sizes up to `T` then powers of two (vLLM pads `Lp` to a capture size: a rung of that
        size replays it without a second padding), else the default."""
        if self.token_buckets is not None:
            return self.token_buckets
        if backend is None or self.device.type == "cpu" or self.engine.capture_sizes is None:
            return None
        return capture_ladder(self.engine.capture_sizes(), self.max_num_tokens)

    def set_block_tables(self, block_tables: BlockTables | None) -> None:
        """vLLM 0.33+'s `set_block_tables`: new local block tables and slot-mapping buffers
        (the persistent addresses a captured model graph sees from then on), and the block
        tables' `cp_interleave` (a different one rebuilds the graphs)."""
        check_block_tables(block_tables, self.resolved_device)
        interleave = self.cp_interleave if block_tables is None else block_tables.cp_interleave
        if self.graphs is None:  # no capacities: nothing allocated, like vLLM's
            self.block_tables, self.cp_interleave = block_tables, interleave
            self.host = self._host_segments()
            return
        self._allocate_block_tables(block_tables)
        self.schedule_cache.clear()  # the plans hold views of the old slot mappings
        if interleave != self.cp_interleave:
            self.cp_interleave = interleave
            self.host = self._host_segments()
            self._build_graphs()
        else:
            self.graphs.set_slot_mappings(self.global_slot_mappings, self.gathered_slot_mappings)

    def set_shard_decode_requests(self, shard_decode_requests: bool) -> None:
        """Place the decodes of every later step sharded (one rank each, round-robin) or replicated:
        for an engine that decides after building its manager (vllm-ascend 0.30's runner sets the
        manager's `vllm_config`, which decides, after its KV-cache init). A change serves the layout
        again (`mrv2` or `mrv2-sharded`), rebuilds the host twin and the graphs (start-up work) and
        starts a recording afresh, which must not have recorded a step yet.

        Raises:
            TypeError: `shard_decode_requests` is not a bool.
            ValueError: sharded decodes with `dcp_world_size > 1`, or a layout that cannot serve
                this placement ([`served_split`][pcp_fn.adapters.vllm.served.served_split]).
            RuntimeError: the recording already holds steps of the other placement.
        """
        check_flags(shard_decode_requests, self.moe is not None)
        if shard_decode_requests == self.shard_decode_requests:
            return
        recorder = self.recorder
        if recorder is not None and recorder.stats.steps_recorded:
            raise RuntimeError(
                f"shard_decode_requests={shard_decode_requests}: the decode placement changed after "
                f"{recorder.stats.steps_recorded} steps were recorded to {recorder.path}"
            )
        served = self._served(self._layout, shard_decode_requests, self.dcp_world_size, self._manager_name)
        self.served, self.shard_decode_requests = served, shard_decode_requests
        self.host = self._host_segments()
        self.schedule_cache.clear()  # the plans and segments are the other placement's
        if self.graphs is not None:
            self._build_graphs()
        if recorder is not None:  # its header names the layout served: one of this placement
            recorder.close()
            os.unlink(recorder.path)
            self.recorder = self._recorder(recorder.path, self._manager_name)

    def full_rows(self, num_reqs: int, num_tokens: int, max_query_len: int | None) -> int:
        """The local request rows of the FULL graph of `num_tokens` tokens that vLLM sizes for
        `num_reqs` requests with queries up to `max_query_len` tokens.

        vLLM's mixed FULL graphs (`CudaGraphManager._init_candidates`) hold
        `min(num_tokens, max_num_seqs)` requests, and its dispatcher checks the *global*
        request count; a split prefill puts a head and a tail row on a rank, so a rank of such
        a graph can hold up to `min(num_tokens, 2 * max_num_seqs)` rows (each row has a
        token). A mixed graph (vLLM's capture promises it `max_query_len = num_tokens`, and
        its descriptor has no query bound) whose request count is capped at `max_num_seqs`
        gets those rows. Decode graphs keep vLLM's count: their descriptor's
        `uniform_token_count` / `max_query_len` bounds the queries, and vLLM's runner
        hands them decode-only batches (one row per request); so do graphs below the cap.

        A decode graph's bound can equal its tokens (`max_num_seqs` below the decode query
        length: 3 requests of 1 + 3 speculative tokens, a 4-token graph), which the capture
        batch alone does not tell from a mixed graph: the engine's `cudagraph_mode`
        ([`compilation_config`][pcp_fn.adapters.vllm.MRV2Bookkeeper]) does. Mixed FULL graphs exist
        only under `FULL`; under a separate decode routine every FULL graph is a decode graph.
        Without a known mode such a graph is sized as a mixed one, at capture and replay alike (they
        call this with the same arguments). A subclass for an engine that sizes its own graphs' rows
        returns `num_reqs`.
        """
        R = self.max_num_reqs
        if max_query_len != num_tokens or not num_reqs == R < num_tokens:
            return num_reqs
        mode = getattr(self.compilation_config, "cudagraph_mode", None)
        if mode is not None and mode != self.engine.CUDAGraphMode.FULL:  # FULL graphs decode only
            return num_reqs
        return min(num_tokens, 2 * R)

    def require(self, what: str) -> StepGraphs:
        """The graphs, or a `RuntimeError` naming `what` needs the capacities (vLLM's
        manager asserts its buffers there too)."""
        if self.graphs is None:
            raise RuntimeError(
                f"{what} needs the max_num_reqs and max_num_tokens given to the constructor "
                "(the persistent buffers are allocated once, at capacity)"
            )
        return self.graphs

    def guard(self) -> Any:
        """The host-sync guard for device work on the persistent buffers (`check_host_syncs`)."""
        return self.require("guard").guard()

    @property
    def has_layout(self) -> bool:
        """Whether a batch was partitioned (the restores need its layout)."""
        return self.graphs is not None and self.graphs.has_layout

    @property
    def layout_tokens(self) -> int:
        """`Lp`: the local token rows of the last partitioned batch's layout."""
        return self.require("layout_tokens").current_plan().Lp

    @property
    def graph_stats(self) -> GraphStats:
        """The graphs' [`pcp_fn.adapters.backend.GraphStats`][] (empty without capacities)."""
        return GraphStats() if self.graphs is None else self.graphs.stats

    @property
    def global_batch(self) -> InputBatch:
        """The global `InputBatch` of the last `partition_batch`."""
        if self.last_global_batch is None:
            raise RuntimeError("global_batch: no batch was partitioned yet")
        return self.last_global_batch

    def persistent_buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent device buffer by name (their `data_ptr()`s never change)."""
        self.require("persistent_buffers")
        ib = self.input_buffers
        named = {
            "input_ids": ib.input_ids,
            "positions": ib.positions,
            "is_padding": ib.is_padding,
            "moe_is_padding": self.moe_mask,
            "query_start_loc": ib.query_start_loc,
            "seq_lens": ib.seq_lens,
            "dcp_local_seq_lens": ib.dcp_local_seq_lens,
            "idx_mapping": self.idx_mapping,
            "expanded_local_pos": self.expanded_local_pos,
            "logits_indices": self.logits_indices,
            "cu_num_logits": self.cu_num_logits,
            "hidden_restore_idx": self.hidden_restore_idx,
            "padded_gather_idx": self.padded_gather_idx,
            "kv_write_mask": self.kv_write_mask,
            "slot_gather_idx": self.slot_gather_idx,
            "global_slot_mappings": self.global_slot_mappings,
            "gathered_slot_mappings": self.gathered_slot_mappings,
        }
        named.update({f"block_table_{group}": t for group, t in enumerate(self.local_block_tables or ())})
        return named

    # ------------------------------------------------------------ dispatch and partition

    def get_num_tokens_for_dispatch(self, num_scheduled_tokens: np.ndarray, is_prefilling: np.ndarray) -> int:
        """The largest real rank-local batch before graph padding (host twin, no loop)."""
        num_scheduled = host_row("input_batch.num_scheduled_tokens", num_scheduled_tokens)
        prefilling = host_row("input_batch.is_prefilling_np", is_prefilling, num_scheduled.size)
        if self.reads_context:  # vLLM gives no contexts here: the most any context puts on a rank
            _check_schedule(num_scheduled, prefilling)
            total = int(np.add.reduce(num_scheduled, dtype=np.int64))
            return largest_rank(self.host.config, num_scheduled, prefilling, total)[0] if total else 0
        return self.segments(num_scheduled, prefilling)[1]

    def segments(
        self, num_scheduled: np.ndarray, is_prefilling: np.ndarray, num_computed: np.ndarray | None = None
    ) -> tuple[Any, int]:
        """The host twin's segments of a schedule (every rank's counts, this rank's rows) and
        the largest rank's token count, remembered: vLLM's runner asks
        `get_num_tokens_for_dispatch` and then `partition_batch` of the same schedule, and
        a busy server's decode steps repeat theirs. The cached arrays are only read.
        `num_computed`: the contexts, for a split that reads them (part of the key then)."""
        key = (num_scheduled.dtype, is_prefilling.dtype, num_scheduled.tobytes(), is_prefilling.tobytes())
        if num_computed is not None:
            key = (*key, num_computed.tobytes())
        found = self._segments_of.get(key)
        if found is None:
            _check_schedule(num_scheduled, is_prefilling)
            seg = self.host.segments(num_scheduled, is_prefilling, num_computed)
            # max over P ints in Python: a numpy reduction costs more than the list
            widest = max(seg.per_rank_num_tokens.tolist()) if num_scheduled.size else 0
            found = self.schedule_cache.put("segments", key, (seg, widest))
        return found

    def partition_batch(self, input_batch: InputBatch, batch_desc: BatchExecutionDescriptor) -> InputBatch:
        """This rank's local `InputBatch` of the global `input_batch` (vLLM `partition_batch`).

        `batch_desc.cg_mode`: `NONE` pads the local tokens to the largest
        rank; `PIECEWISE`/`FULL` to `batch_desc.num_tokens`; `FULL`
        also pads the local request rows to `batch_desc.num_reqs` -- for
        mixed prefill + decode batches too, unlike vLLM -- or, for a mixed
        FULL graph capped at `max_num_reqs` requests, to the rows a split
        prefill can give a rank ([`full_rows`][pcp_fn.adapters.vllm.MRV2Bookkeeper.full_rows]; the
        capture stages the same rows).

        Raises:
            ValueError: more requests or tokens than the capacities, arrays
                of the wrong length, a padded size below what a rank holds
                or beyond the buffers.
        """
        graphs = self.graphs
        if graphs is None:
            self.require("partition_batch")
        global_batch = input_batch
        arrays = self.check(global_batch)
        num_scheduled, _, _, is_prefilling, _ = arrays
        shape = self.plan(num_scheduled, is_prefilling, batch_desc, arrays[1] if self.reads_context else None)
        num_tokens = global_batch.num_tokens  # what the restores return and the slot mappings cover
        if num_tokens.__class__ is not int or num_tokens != shape.total:
            check_num_tokens(num_tokens, shape.total)
        graphs.partition(arrays, global_batch.input_ids, global_batch.positions, shape.total, shape.plan)
        if self.recorder is not None:  # the step as the engine gave it, accepted (values checked)
            self._record(arrays, batch_desc)
        self.decode_only = shape.decode_only  # of the global batch just partitioned
        fields = self.host_fields(global_batch, shape, arrays)
        return self.local_batch(global_batch, fields, shape.fixed)

    def _record(self, arrays: GlobalArrays, batch_desc: BatchExecutionDescriptor) -> None:
        """The step to the recorder: the bytes this step already made of its arrays (the plan's
        key, the graphs' idx_mapping check) where they are in the frame's dtype, else the arrays."""
        num_scheduled, computed, prefill_len, is_prefilling, idx_mapping = arrays
        key = self._plan_key  # (dtype, num_scheduled bytes, is_prefilling bytes, ...)
        sched = key[1] if key[0] is _I32 else num_scheduled
        idx = idx_mapping
        if idx_mapping.dtype is _I64 and self.graphs is not None:
            idx = self.graphs.checked_idx_bytes or idx_mapping
        self.recorder.record(sched, computed, prefill_len, key[2], idx, batch_desc)

    # The phases of partition_batch, one method each (benchmarks/bench_vllm.py times them):
    # check, twin + plan, staging + graph (StepGraphs.partition), host fields, local batch.

    def check(self, global_batch: InputBatch) -> GlobalArrays:
        """The global batch's host arrays, checked."""
        R = self.max_num_reqs
        num_scheduled = host_row("input_batch.num_scheduled_tokens", global_batch.num_scheduled_tokens)
        num_reqs = num_scheduled.size
        if num_reqs > R:
            raise ValueError(f"input_batch has {num_reqs} requests; max_num_reqs is {R}")
        computed = host_row(
            "input_batch.num_computed_tokens_np", global_batch.num_computed_tokens_np, num_reqs
        )
        prefilling = host_row("input_batch.is_prefilling_np", global_batch.is_prefilling_np, num_reqs)
        prefill_len = host_row("input_batch.prefill_len_np", global_batch.prefill_len_np, num_reqs)
        idx_mapping = host_row("input_batch.idx_mapping_np", global_batch.idx_mapping_np, num_reqs)
        if prefilling.dtype != np.bool_:
            raise ValueError(f"input_batch.is_prefilling_np must hold bools, got {prefilling.dtype}")
        if not (
            computed.dtype.kind in "iu" and prefill_len.dtype.kind in "iu" and idx_mapping.dtype.kind in "iu"
        ):
            ints = (computed, prefill_len, idx_mapping)
            name, arr = next((k, a) for k, a in zip(_INT_FIELDS, ints) if a.dtype.kind not in "iu")
            raise ValueError(f"input_batch.{name} must hold integers, got {arr.dtype}")
        # their values (none negative or past int32) are checked where they are staged, and
        # num_scheduled's dtype where a new schedule's segments are made (segments)
        # the device token tensors: int32 ids, int64 positions, 1-D, on the manager's device (what
        # vLLM's index_select takes), by their host attributes alone; inputs.py names a bad one
        ids, positions, dev = global_batch.input_ids, global_batch.positions, self.resolved_device
        try:
            bad = (
                ids.dtype is not torch.int32
                or positions.dtype is not torch.int64
                or ids.ndim != 1
                or positions.ndim != 1
                or ids.device != dev
                or positions.device != dev
            )
        except AttributeError:  # not a tensor
            bad = True
        if bad:
            check_token_tensors(ids, positions, dev)
        if len(global_batch.req_ids) != num_reqs:
            check_req_ids(global_batch.req_ids, num_reqs)
        # vLLM 0.33+'s metadata indexes the upper bounds by the local rows' requests
        if self._metadata_reads_upper and len(global_batch.seq_lens_cpu_upper_bound) < num_reqs:
            check_upper_bounds(global_batch.seq_lens_cpu_upper_bound, num_reqs)
        return num_scheduled, computed, prefill_len, prefilling, idx_mapping

    def plan(
        self,
        num_scheduled: np.ndarray,
        is_prefilling: np.ndarray,
        batch_desc: BatchExecutionDescriptor,
        num_computed: np.ndarray | None = None,
    ) -> StepShape:
        """The step's [`StepShape`][pcp_fn.adapters.vllm.bookkeeper.StepShape]: made from the host
        twin's segments and vLLM's padded sizes `(Lp, Rpad)` (checked against what the ranks hold)
        the first time this schedule and descriptor are seen, then looked up (a busy server's decode
        steps repeat their
        schedule: all ones, none prefilling)."""
        last_desc, desc_id = self._last_desc
        if batch_desc is not last_desc:  # vLLM's dispatcher hands out one object per graph
            desc_id = self._desc_id(batch_desc)
        # (is_prefilling: one byte a request, so its length is the request count)
        key = (num_scheduled.dtype, num_scheduled.tobytes(), is_prefilling.tobytes(), desc_id)
        if num_computed is not None:  # a split that reads the contexts
            key = (*key, num_computed.dtype, num_computed.tobytes())
        self._plan_key = key  # (the recorder reuses its bytes)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self.schedule_cache.put(
                "shapes", key, self._new_shape(num_scheduled, is_prefilling, batch_desc, num_computed)
            )
        return shape  # (StepGraphs.partition checks input_ids and positions hold its tokens)

    def _desc_id(self, batch_desc: BatchExecutionDescriptor) -> int:
        """A small int naming what `batch_desc` says of the step's sizes (equal descriptors,
        one id), remembered with the object: the shape key's part for it."""
        fields = (
            batch_desc.cg_mode,
            batch_desc.num_tokens,
            batch_desc.num_tokens.__class__,  # (8.0 == 8: a float is checked, not matched)
            batch_desc.num_reqs,
            getattr(batch_desc, "max_query_len", None),
            getattr(batch_desc, "uniform_token_count", None),
        )
        desc_id = self._desc_ids.get(fields)
        if desc_id is None:
            check_descriptor(batch_desc, self.engine.CUDAGraphMode)  # once per distinct descriptor
            desc_id = self.schedule_cache.put("descriptors", fields, next(self._desc_count))
        self._last_desc = (batch_desc, desc_id)
        return desc_id

    def _padded_sizes(self, widest: int, batch_desc: BatchExecutionDescriptor) -> tuple[int, int | None]:
        """`(Lp, FULL graph rows or None)` of a descriptor, `Lp` checked against the largest
        rank's `widest` tokens and the capacity."""
        Mode = self.engine.CUDAGraphMode
        Lp, pad_reqs = widest, None
        mode = batch_desc.cg_mode
        if mode != Mode.NONE:
            Lp = batch_desc.num_tokens
            if mode == Mode.FULL and batch_desc.num_reqs is not None:
                # the query bound vLLM's capture gave this graph (prepare_inputs_to_capture): a
                # decode graph's, else the graph's tokens
                bound = (
                    getattr(batch_desc, "max_query_len", None)
                    or getattr(batch_desc, "uniform_token_count", None)
                    or Lp
                )
                pad_reqs = self.full_rows(batch_desc.num_reqs, Lp, bound)
        if Lp < widest:
            raise ValueError(
                "PCP padded token count is smaller than the largest rank-local batch: "
                f"{Lp} < {widest} (batch_desc.num_tokens)."
            )
        if Lp > self.max_num_tokens:
            raise ValueError(f"batch_desc.num_tokens={Lp} exceeds max_num_tokens={self.max_num_tokens}")
        return Lp, pad_reqs

    def _check_rows(self, rows: int, n: int) -> None:
        """A FULL graph's `rows` must hold this rank's `n` request rows and fit the buffers."""
        if rows < n:
            raise ValueError(
                f"batch_desc.num_reqs={rows} (the FULL graph's request capacity) must cover "
                f"the {n} rank-local request rows (a split prefill gives a head and a tail row)"
            )
        if rows > 2 * self.max_num_reqs:
            raise ValueError(
                f"batch_desc.num_reqs={rows} exceeds the local request capacity "
                f"2 * max_num_reqs = {2 * self.max_num_reqs}"
            )

    def _new_shape(
        self,
        num_scheduled: np.ndarray,
        is_prefilling: np.ndarray,
        batch_desc: BatchExecutionDescriptor,
        num_computed: np.ndarray | None = None,
    ) -> StepShape:
        total = int(np.add.reduce(num_scheduled, dtype=np.int64))  # (R int32 counts can pass int32)
        if total > self.max_num_tokens:
            raise ValueError(
                f"input_batch.num_scheduled_tokens sums to {total} tokens; "
                f"max_num_tokens is {self.max_num_tokens}"
            )
        seg, widest = self.segments(num_scheduled, is_prefilling, num_computed)
        Lp, pad_reqs = self._padded_sizes(widest, batch_desc)
        rows, offset, length = seg.request, seg.offset, seg.length
        n = rows.size
        if n == 0:  # a rank without tokens keeps one empty row of request 0, like vLLM
            rows, offset, length, n = _NO_ROW, _NO_TOKENS, _NO_TOKENS, 1
        Rpad = n if pad_reqs is None else pad_reqs
        self._check_rows(Rpad, n)
        # the graph bucket holds every rank's rows (the layout covers all ranks) and vLLM's sizes
        widest_rows = max(seg.per_rank_num_reqs.tolist()) if num_scheduled.size else 1
        key = (Lp, Rpad, n, widest_rows)
        plan, views = self._views.get(key) or self._step_views(key)
        local_scheduled = length.astype(np.int32)
        num_local_tokens = int(np.add.reduce(length))
        qsl = np.empty(Rpad + 1, dtype=np.int32)
        qsl[0] = 0
        np.add.accumulate(local_scheduled, out=qsl[1 : n + 1])
        qsl[n + 1 :] = num_local_tokens
        cu = np.arange(n + 1, dtype=np.int32) if num_local_tokens else np.zeros(n + 1, np.int32)
        fixed = dict(
            views,
            num_reqs=n,
            num_reqs_after_padding=Rpad,
            num_tokens=num_local_tokens,
            num_tokens_after_padding=Lp,
            num_draft_tokens=0,
            num_draft_tokens_per_req=None,
            dcp_local_seq_lens=None,
            prompt_lens=None,
        )
        if self.engine.contract.graph_fields:  # vLLM 0.32+'s InputBatch
            fixed.update(max_seq_len_np=None, prefill_runs_as_decode_np=None)
        shifted = bool(np.count_nonzero(offset))
        decode_only = not np.count_nonzero(is_prefilling)
        return StepShape(
            plan=plan,
            fixed=fixed,
            rows=rows,
            row_list=rows.tolist(),
            offset=offset,
            num_scheduled=local_scheduled,
            query_start_loc=qsl,
            cu_num_logits=cu,
            total=total,
            shifted=shifted,
            decode_only=decode_only,
        )

    def host_fields(self, global_batch: InputBatch, shape: StepShape, arrays: GlobalArrays) -> dict[str, Any]:
        """The local batch's host fields: the shape's (copied), and the per-request values of
        this step's local rows (never a device read)."""
        num_scheduled, computed, prefill_len, _, idx_mapping = arrays
        rows, local_scheduled = shape.rows, shape.num_scheduled
        n, Rpad = rows.size, shape.plan.Rpad
        start = computed[rows] if computed.dtype == np.int32 else computed[rows].astype(np.int32)
        if shape.shifted:  # a segment starting inside its request (a split prefill's chunk)
            np.add(start, shape.offset, out=start, casting="unsafe")
        local_prefill_len = prefill_len[rows]
        computed_prefill = np.minimum(start, local_prefill_len)
        if Rpad == n:  # (no padding rows: one numpy call per field fewer)
            is_prefilling = np.less(computed_prefill, local_prefill_len)
            upper = np.add(start, local_scheduled)
        else:
            is_prefilling = np.zeros(Rpad, dtype=np.bool_)
            np.less(computed_prefill, local_prefill_len, out=is_prefilling[:n])
            upper = np.zeros(Rpad, dtype=np.int32)
            np.add(start, local_scheduled, out=upper[:n])
        has_prefill = bool(np.count_nonzero(is_prefilling))  # (cheaper than ndarray.any)
        dcp_upper = None
        if self.dcp_world_size > 1:
            # DCP rank 0's share of the whole request's KV, the same on every PCP rank
            dcp_upper = torch.zeros(Rpad, dtype=torch.int32)
            whole = (computed + num_scheduled)[rows]
            dcp_upper[:n] = torch.from_numpy(self.graphs.dcp_rank0_seq_lens(whole).astype(np.int32))
        req_ids = global_batch.req_ids
        self.local_rows = rows  # each local row's global request (host)
        fields = dict(
            req_ids=[req_ids[i] for i in shape.row_list],
            idx_mapping_np=idx_mapping[rows],
            num_scheduled_tokens=local_scheduled.copy(),
            query_start_loc_np=shape.query_start_loc.copy(),
            seq_lens_cpu_upper_bound=torch.from_numpy(upper),
            **self.engine.contract.metadata_fields(global_batch, num_scheduled, rows, dcp_upper),
            num_computed_tokens_np=start,
            prefill_len_np=local_prefill_len,
            num_computed_prefill_tokens_np=computed_prefill,
            is_prefilling_np=is_prefilling,
            has_prefill=has_prefill,
            cu_num_logits_np=shape.cu_num_logits.copy(),
        )
        if self._graph_fields:  # vLLM 0.32+'s InputBatch
            fields["decode_graph_eligible"] = not has_prefill
        return fields

    def local_batch(
        self, global_batch: InputBatch, fields: dict[str, Any], fixed: dict[str, Any]
    ) -> InputBatch:
        """The local `InputBatch`: the global one with the shape's fields (`fixed`: the
        device views, the sizes) and this step's host fields."""
        # the keys of fixed and fields are the same every step: checked once per batch class
        cls = type(global_batch)
        checked = cls is self._dict_copy_class
        if not checked and dict_copy_ok(cls, fixed, fields):
            self._dict_copy_class, checked = cls, True
        self.last_local_batch = replace_fields(global_batch, fixed, fields, checked=checked)
        self.last_global_batch = global_batch
        self._capture_rows = (0, 0)
        # draft_prefill_batch is left as it is, like vLLM's partition_batch (a draft prefill
        # that was prepared but not restored stays prepared until prepare_draft_prefill)
        return self.last_local_batch

    def _step_views(self, key: tuple[int, int, int, int]) -> tuple[StepPlan, dict[str, torch.Tensor]]:
        """The graphs' plan and the local batch's device fields (views of the persistent
        buffers) for a step of these sizes: made once, steady steps repeat their sizes."""
        Lp, Rpad, n, rows = key
        ib = self.input_buffers
        idx_mapping = self.idx_mapping[:n]
        # the MoE's gathered rank-major mask when it all-gathers the tokens (vLLM 0.33+)
        moe = self.moe
        is_padding = ib.is_padding[:Lp] if moe is None else moe[: self.pcp_world_size * Lp]
        views = dict(
            idx_mapping=idx_mapping,
            expanded_idx_mapping=idx_mapping,
            expanded_local_pos=self.expanded_local_pos[:n],
            query_start_loc=ib.query_start_loc[: Rpad + 1],
            seq_lens=ib.seq_lens[:Rpad],
            input_ids=ib.input_ids[:Lp],
            positions=ib.positions[:Lp],
            is_padding=is_padding,
            logits_indices=self.logits_indices[:Rpad],
            cu_num_logits=self.cu_num_logits[: n + 1],
        )
        return self.schedule_cache.put("views", key, (self.graphs.plan(Lp, Rpad, rows), views))

    # ------------------------------------------------------------ attention

    def gather_block_tables(self, input_batch: InputBatch) -> tuple[torch.Tensor, ...]:
        """The local batch's block tables, gathered into the persistent local tables (the first
        half of vLLM's `prepare_attn`; the manager adds its slot mappings)."""
        if self.block_tables is None or self.local_block_table_ptrs is None:
            raise RuntimeError("prepare_attn needs the block_tables given to the constructor")
        return self.block_tables.gather_block_tables(
            input_batch.idx_mapping,
            input_batch.num_reqs_after_padding,
            out=self.local_block_tables,
            out_ptrs=self.local_block_table_ptrs,
        )

    def prepare_slot_mappings(self) -> torch.Tensor:
        """`[K, P * Lp]`: the KV slot of every all-gathered row (`PAD_SLOT_ID` where it must
        not write: padding, and replicated rows other than rank 0's)."""
        if self.block_tables is None:
            raise RuntimeError("prepare_slot_mappings needs the block_tables given to the constructor")
        global_batch = self.global_batch
        # vLLM's kernel writes the first num_tokens columns of the persistent [K, T + 1] buffer
        # (and PAD_SLOT_ID after them: the pad column stays PAD_SLOT_ID)
        self.block_tables.compute_slot_mappings(
            global_batch.idx_mapping,
            global_batch.query_start_loc,
            global_batch.positions,
            global_batch.num_tokens,
            out=self.global_slot_mappings,
        )
        return self.graphs.gathered_slot_mappings(global_batch.num_tokens)

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        """Zeroed views of the persistent local block tables (capture and dummy runs)."""
        if self.local_block_tables is None:
            raise RuntimeError(
                "get_dummy_block_tables needs the block_tables, max_num_reqs and max_num_tokens "
                "given to the constructor"
            )
        check_int("get_dummy_block_tables: num_reqs", num_reqs, 0, 2 * self.max_num_reqs)
        asked, staged = self._capture_rows
        rows = staged if num_reqs == asked else num_reqs  # the capture batch's rows
        return tuple(t[:rows].zero_() for t in self.local_block_tables)

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        """The persistent gathered slot mappings, all `PAD_SLOT_ID`, `[K, num_tokens * P]`."""
        self.require("get_dummy_slot_mappings")
        check_int("get_dummy_slot_mappings: num_tokens", num_tokens, 0, self.max_num_tokens)
        self.gathered_slot_mappings.fill_(self.engine.PAD_SLOT_ID)
        return self.gathered_slot_mappings[:, : num_tokens * self.pcp_world_size]

    def stage_capture(self, input_batch: InputBatch) -> InputBatch:
        """Stage a capture or dummy batch in the persistent local buffers; a mixed FULL graph's
        batch gets the rows `partition_batch` pads its steps to
        ([`full_rows`][pcp_fn.adapters.vllm.MRV2Bookkeeper.full_rows])."""
        self.require("the capture staging")
        ib = self.input_buffers
        r, t = check_capture(input_batch, 2 * self.max_num_reqs, self.max_num_tokens)
        bound = getattr(input_batch, "max_query_len", None)  # None: no FULL capture
        if bound is None and not self.engine.contract.capture_bounds_queries:
            # vLLM 0.30 stages every capture unbounded: under cudagraph_mode=FULL (full_rows reads
            # the mode) that is a mixed graph's, which promises queries as long as the graph
            bound = t
        rows = self.full_rows(r, t, bound)
        self._capture_rows = (r, rows)
        if rows > r:
            input_batch = type(input_batch).make_dummy(rows, t, ib, max_query_len=bound)
            r = rows
        return dataclasses.replace(
            input_batch,
            input_ids=ib.input_ids[:t].copy_(input_batch.input_ids),
            positions=ib.positions[:t].copy_(input_batch.positions),
            is_padding=ib.is_padding[:t].copy_(input_batch.is_padding),
            query_start_loc=ib.query_start_loc[: r + 1].copy_(input_batch.query_start_loc),
            seq_lens=ib.seq_lens[:r].copy_(input_batch.seq_lens),
        )

    def moe_is_padding(self, is_padding: torch.Tensor) -> torch.Tensor:
        """A capture/dummy padding mask `[n]`, the same on every rank, as the `[P * n]` rows the
        MoE routes (rank-major), in the persistent MoE mask; unchanged without `moe_gathers_tokens`."""
        if self.moe is None:
            return is_padding
        n, T = is_padding.shape[0], self.max_num_tokens
        if n > T:
            raise ValueError(f"moe_is_padding: the mask has {n} rows; max_num_tokens is {T}")
        out = self.moe[: self.pcp_world_size * n]
        out.view(self.pcp_world_size, -1).copy_(is_padding)
        return out

    # ------------------------------------------------------------ hidden states

    def restore_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """All-gather the ranks' `[Lp, ...]` rows and put them in global token order
        `[num_tokens, ...]` (unchanged before the first `partition_batch`)."""
        if not self.has_layout:
            return hidden_states
        try:  # (the local rows: checked before the collective, by their host attributes)
            bad = not hidden_states.ndim or hidden_states.device != self.resolved_device
        except AttributeError:  # not a tensor
            bad = True
        if bad:
            self._check_restore_inputs("restore_hidden_states", hidden_states, None)
        gathered = self.engine.get_pcp_group().all_gather(hidden_states, dim=0)
        return self.graphs.restore(gathered, self.global_batch.num_tokens)

    def restore_for_sampling(
        self, hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, InputBatch]:
        """Restored hidden (and auxiliary) states with the global batch to sample with."""
        global_batch = self.global_batch
        try:  # (the local rows: checked before the collectives, by their host attributes)
            bad = (
                aux_hidden_states is not None
                or not hidden_states.ndim
                or hidden_states.device != self.resolved_device
            )
        except AttributeError:  # not a tensor
            bad = True
        if bad:
            self._check_restore_inputs("restore_for_sampling", hidden_states, aux_hidden_states)
        group = self.engine.get_pcp_group()
        gathered = group.all_gather(hidden_states, dim=0)  # collectives in vLLM's order
        aux = None if aux_hidden_states is None else [group.all_gather(a, dim=0) for a in aux_hidden_states]
        graphs = self.require("restore_for_sampling")
        hidden, aux = graphs.restore_for_sampling(gathered, aux, global_batch.num_tokens)
        return hidden, aux, global_batch

    def _check_restore_inputs(
        self, op: str, hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None
    ) -> None:
        """The local rows a restore all-gathers: tensors with a row dimension on the manager's
        device (checked before the collectives: a bad one fails here, not inside one)."""
        dev = self.resolved_device
        check_gathered_input(op, "hidden_states", hidden_states, dev)
        for i, aux in enumerate(aux_hidden_states or ()):
            check_gathered_input(op, f"aux_hidden_states[{i}]", aux, dev)

    # ------------------------------------------------------------ drafter

    def prepare_draft_prefill(self, input_batch: InputBatch, input_ids: torch.Tensor) -> None:
        """Point the drafter at this rank's rows of `input_ids` (global order), when
        `input_batch` is the batch last partitioned (`input_ids` checked first: a bad one
        leaves the prepared draft as it was)."""
        current = input_batch is self.last_global_batch and self.last_local_batch is not None
        if current:
            check_draft_ids(input_ids, input_batch.num_tokens, self.resolved_device)
        self.draft_prefill_batch = None
        if not current:
            return
        local = self.last_local_batch
        self.graphs.draft_input_ids(input_ids, local.input_ids)
        self.draft_prefill_batch = local

    def draft_input_buffers(
        self, input_buffers: InputBuffers, num_tokens: int | None = None
    ) -> InputBatch | InputBuffers | tuple[InputBatch | InputBuffers, torch.Tensor]:
        """vLLM `get_draft_input_buffers`: the local batch while a draft prefill is prepared,
        else `input_buffers`; with `num_tokens` (vLLM 0.33+) also the MoE routing mask."""
        batch = self.draft_prefill_batch
        if num_tokens is None:
            return batch if batch is not None else input_buffers
        if batch is not None:
            return batch, batch.is_padding
        return input_buffers, self.moe_is_padding(input_buffers.is_padding[:num_tokens])

    def restore_draft_prefill(
        self, last_hidden_states: torch.Tensor, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Restore the drafter's outputs to global order (once when both are the same tensor)."""
        if self.draft_prefill_batch is None:
            return last_hidden_states, hidden_states
        dev, op = self.resolved_device, "restore_draft_prefill"
        check_gathered_input(op, "last_hidden_states", last_hidden_states, dev)
        if hidden_states is not last_hidden_states:
            check_gathered_input(op, "hidden_states", hidden_states, dev)
        group = self.engine.get_pcp_group()
        last = group.all_gather(last_hidden_states, dim=0)
        other = last if hidden_states is last_hidden_states else group.all_gather(hidden_states, dim=0)
        self.draft_prefill_batch = None
        return self.graphs.restore_draft_prefill(last, other, self.global_batch.num_tokens)
