"""The body of ``FunctionalPCPManager``, built over any ``PCPManager`` base: vLLM's, or a test stand-in.

vLLM's model runner V2 ``PCPManager`` (``vllm/v1/worker/gpu/pcp_manager.py``)
rewrites each step's global ``InputBatch`` into this rank's DualChunkSwap rows
with Python loops over requests and segments, and allocates fresh index
tensors every step, so vLLM only captures FULL graphs for decode-only batches.
The manager built here has the same constructor and public methods, but:

- host fields (request ids, query start locations, sequence-length upper
  bounds, counts) come from the numpy twin of the layout rules, ``O(P * R)``
  vectorised, never from reading a device tensor;
- per-token indices come from ``pcp_fn.mrv2`` captured once per bucket
  (:mod:`pcp_fn.adapters.bookkeeping`, the only module that calls ``pcp_fn``)
  and are copied into persistent buffers allocated once in ``__init__``; the
  returned local ``InputBatch`` holds views of them, so a captured model graph
  sees the same addresses every step;
- ``validate_config`` accepts FULL CUDA graphs for mixed prefill + decode
  batches: the bookkeeping is inside a graph, nothing in it depends on the
  batch's composition.

:func:`make_functional_manager` takes a :class:`VllmApi` (the few vLLM names the
body needs) so the same class body runs over vLLM 0.32.0
(:mod:`pcp_fn.adapters.vllm`) and over the test stand-in (``tests/vllm_standin.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core.checks import host_ints, host_row
from .backend import (
    GraphStats,
    capture_ladder,
    default_graph_backend,
    package_cache_dir,
    resolve_graph_backend,
)
from .bookkeeping import Bookkeeping, Destinations, HostLayout
from .schedule_cache import ScheduleCache
from .vllm_contract import VLLM_0_32, VllmContract


@dataclasses.dataclass(frozen=True)
class VllmApi:
    """The vLLM names the manager body uses.

    Fields:
        PCPManager: the base class (``vllm.v1.worker.gpu.pcp_manager.PCPManager``).
        InputBuffers: ``vllm.v1.worker.gpu.input_batch.InputBuffers``.
        CUDAGraphMode: ``vllm.config.compilation.CUDAGraphMode``.
        PAD_SLOT_ID: ``vllm.v1.attention.backends.utils.PAD_SLOT_ID``.
        get_pcp_group: returns the PCP group (``all_gather(tensor, dim=0)``);
            called at each restore, so a patched group is honoured.
        capture_sizes: the engine's CUDA-graph capture sizes, when it has them
            (vLLM: ``compilation_config.cudagraph_capture_sizes`` of the
            current config), so the graph ladder pads a batch once, not twice.
        contract: what differs between the vLLM releases
            (:func:`pcp_fn.adapters.vllm_contract.detect`); default vLLM 0.32's.
    """

    PCPManager: type
    InputBuffers: type
    CUDAGraphMode: Any
    PAD_SLOT_ID: int
    get_pcp_group: Callable[[], Any]
    capture_sizes: Callable[[], Sequence[int] | None] | None = None
    contract: VllmContract = VLLM_0_32


class _Override:
    """A read-only view of ``inner`` with some attributes replaced (for ``validate_config``)."""

    def __init__(self, inner: Any, **overrides: Any) -> None:
        self._inner = inner
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_inner"], name)


_INT_FIELDS = ("num_computed_tokens_np", "prefill_len_np", "idx_mapping_np")
_NO_ROW = np.zeros(1, dtype=np.intp)  # the placeholder row of a rank without tokens (read only)
_NO_TOKENS = np.zeros(1, dtype=np.int64)
_NO_ROW.flags.writeable = _NO_TOKENS.flags.writeable = False


class _Shape(NamedTuple):
    """What a step's schedule (``num_scheduled_tokens``, ``is_prefilling_np``) and descriptor
    decide, made once per distinct pair: the plan and device views, this rank's local rows and
    the host fields that depend on nothing else (each step's batch gets copies)."""

    plan: Any  # the bookkeeping's StepPlan (Lp, Rpad, bucket, graph, ...)
    fixed: dict[str, Any]  # the local batch's fields that only the shape decides (device views, sizes)
    req: np.ndarray  # [n] intp: each local row's global request (request 0 on a rank without tokens)
    req_list: list[int]  # req.tolist()
    offset: np.ndarray  # [n]: the row's first token inside its request
    num_sched: np.ndarray  # [n] int32
    query_start_loc: np.ndarray  # [Rpad + 1] int32
    cu_num_logits: np.ndarray  # [n + 1] int32
    total: int  # scheduled tokens of the global batch
    shifted: bool  # some row starts inside its request (a split prefill's chunk)
    decode_only: bool  # no global request is prefilling


@functools.cache
def _plain_fields(cls: type) -> frozenset[str] | None:
    """The field names of ``cls`` when ``dataclasses.replace`` of one is a copy of its
    ``__dict__`` (a non-frozen dataclass without ``__post_init__``, slots or ``init=False``
    fields, like vLLM's ``InputBatch``), else ``None``."""
    if not dataclasses.is_dataclass(cls) or "__slots__" in cls.__dict__ or hasattr(cls, "__post_init__"):
        return None
    fields = dataclasses.fields(cls)
    if cls.__dataclass_params__.frozen or not all(f.init for f in fields):  # type: ignore[attr-defined]
        return None
    return frozenset(f.name for f in fields)


def _fast_replace_ok(cls: type, *changes: dict[str, Any]) -> bool:
    """Whether :func:`_replace` of a ``cls`` with dicts of these keys may copy ``__dict__``."""
    names = _plain_fields(cls)
    return names is not None and all(names.issuperset(c) for c in changes)


def _replace(obj: Any, *changes: dict[str, Any], checked: bool = False) -> Any:
    """``dataclasses.replace(obj, **changes[0], **changes[1], ...)`` (later dicts win), without
    the per-field Python loop when the class allows it (the local ``InputBatch`` has 36 fields;
    this runs every step). ``checked``: the caller knows :func:`_fast_replace_ok` holds."""
    cls = type(obj)
    if not (checked or _fast_replace_ok(cls, *changes)):
        merged: dict[str, Any] = {}
        for c in changes:
            merged.update(c)
        return dataclasses.replace(obj, **merged)  # raises on an unknown field
    merged = obj.__dict__.copy()  # one new dict, assigned whole: cheaper than updating __dict__
    for c in changes:
        merged.update(c)
    new = object.__new__(cls)
    new.__dict__ = merged
    return new


def make_functional_manager(api: VllmApi, name: str = "FunctionalPCPManager") -> type:
    """A subclass of ``api.PCPManager`` with every public method reimplemented over ``pcp_fn.mrv2``."""
    Mode = api.CUDAGraphMode
    contract = api.contract

    class FunctionalPCPManager(contract.methods, api.PCPManager):  # type: ignore[name-defined,misc]
        """Drop-in for vLLM's MRV2 ``PCPManager``: the same constructor, methods and results
        (checked in lockstep), with the bookkeeping in one captured graph per bucket.

        Class attributes (set on a subclass or the class to change every instance):
            graph_backend: ``"auto"``, ``"aoti"``, a ``torch.compile`` backend, or
                ``None`` for plain calls (default ``$PCP_FN_GRAPH_BACKEND``, else
                ``auto``; :func:`resolve_graph_backend`). Every graph is made in
                the constructor (the engine's start-up), never at a step.
            token_buckets: the graph ladder's token sizes (default powers of two
                from 16; :func:`pcp_fn.adapters.backend.graph_ladder`).
            check_host_syncs: run the device part under ``pcp_fn.no_host_syncs``.
        """

        vllm_api = api
        graph_backend: str | None = default_graph_backend()
        token_buckets: tuple[int, ...] | None = None
        check_host_syncs = False
        _fn_fast_replace: type | None = None  # the batch class _replace may copy by __dict__

        def __init__(
            self,
            pcp_world_size: int,
            pcp_rank: int,
            device: torch.device,
            shard_decode_requests: bool,
            max_num_reqs: int | None = None,
            max_num_tokens: int | None = None,
            block_tables: Any = None,
            dcp_world_size: int = 1,
            dcp_rank: int = 0,
            cp_interleave: int = 1,
            moe_gathers_tokens: bool = False,
        ) -> None:
            if moe_gathers_tokens and not contract.moe_mask:
                raise ValueError(
                    f"moe_gathers_tokens=True: vLLM {contract.name}'s PCPManager has no MoE routing mask"
                )
            # vLLM's own state first, without its capacities: the base allocates no buffer, and
            # every attribute its inherited helpers (_build_batch_layout, ...) read or write
            # exists as in vLLM. The drop-in's own state is under ``_fn_`` names, so those
            # helpers never touch it; the vLLM names it sets keep vLLM's meaning.
            api.PCPManager.__init__(
                self,
                pcp_world_size,
                pcp_rank,
                device,
                shard_decode_requests,
                None,
                None,
                None,  # the block tables are attached below (vLLM 0.33+: by the runner, later)
                dcp_world_size,
                dcp_rank,
                cp_interleave,
            )
            self.pcp_world_size = pcp_world_size
            self.pcp_rank = pcp_rank
            self.device = torch.device(device)
            self.dcp_world_size = dcp_world_size
            self.dcp_rank = dcp_rank
            self.cp_interleave = cp_interleave
            self.shard_decode_requests = shard_decode_requests
            self.max_num_reqs = max_num_reqs
            self.max_num_tokens = max_num_tokens
            self.draft_prefill_batch: Any = None
            self._global_batch: Any = None
            self._local_batch: Any = None
            self._block_tables = block_tables
            self._input_buffers: Any = None
            self._local_block_tables: tuple[torch.Tensor, ...] | None = None
            self._local_block_table_ptrs: torch.Tensor | None = None
            self._fn_local_rows: np.ndarray = _NO_ROW
            self._fn_decode_only = False  # whether the last partitioned global batch has no prefill
            self._fn_pcp: Any = None
            self._fn_moe: torch.Tensor | None = None  # the MoE's gathered padding mask [P * T]
            self._fn_moe_gathers_tokens = bool(moe_gathers_tokens)
            self._fn_host = self._fn_host_layout()
            # what a repeated schedule reuses (pcp_fn.adapters.schedule_cache): the twin's
            # segments, descriptor ids, shapes and views here, the plans and views of the
            # bookkeeping; cleared when the block tables or the layout rules change
            self._fn_cache = ScheduleCache()
            self._fn_segments_of = self._fn_cache.table("segments")
            self._fn_desc_ids = self._fn_cache.table("descriptors")
            self._fn_shapes = self._fn_cache.table("shapes")
            self._fn_views = self._fn_cache.table("views")
            self._fn_last_desc: tuple[Any, int] = (None, -1)  # (the last descriptor, its id)
            self._fn_desc_count = itertools.count()  # ids are never reused: one never goes stale
            # (rows asked, rows staged) of the last capture batch: get_dummy_block_tables follows it
            self._fn_capture_rows = (0, 0)
            self._fn_ready = True  # (set_block_tables from vLLM's constructor comes before this)
            if max_num_tokens is not None:
                # the graph writes the gathered MoE mask every step; it is the local batch's
                # is_padding only with moe_gathers_tokens (vLLM 0.33+), all True like vLLM's until
                # a step. Like vLLM's it needs only max_num_tokens (moe_is_padding serves a
                # draft run's mask on a manager without the request capacity).
                P, T = pcp_world_size, max_num_tokens
                self._fn_moe_mask = torch.ones(P * T, dtype=torch.bool, device=self.device)
                self._fn_moe = self._fn_moe_mask if moe_gathers_tokens else None
            if max_num_reqs is None or max_num_tokens is None:
                # like vLLM's: no buffers; the host methods work, the device path needs both
                self._block_tables = block_tables
                return

            P, R2, T, dev = pcp_world_size, 2 * max_num_reqs, max_num_tokens, self.device
            # a request puts at most a head and a tail segment on a rank: 2R local rows
            self._input_buffers = api.InputBuffers(R2, T, dev)
            self._fn_idx_mapping = torch.zeros(R2, dtype=torch.int64, device=dev)
            self._fn_expanded_local_pos = torch.zeros(R2, dtype=torch.int32, device=dev)  # stays zero
            self._fn_logits_indices = torch.zeros(R2, dtype=torch.int32, device=dev)
            self._fn_cu_num_logits = torch.zeros(R2 + 1, dtype=torch.int32, device=dev)
            self._fn_hidden_restore_idx = torch.zeros(T, dtype=torch.int64, device=dev)
            self._fn_padded_gather_idx = torch.zeros(P * T, dtype=torch.int64, device=dev)
            self._fn_kv_write_mask = torch.zeros(P * T, dtype=torch.bool, device=dev)
            self._fn_slot_gather_idx = torch.zeros(P * T, dtype=torch.int64, device=dev)
            self._fn_allocate_block_tables(block_tables)
            self._fn_build_bookkeeping()

        def _fn_layout_rules(self) -> dict[str, Any]:
            """The layout's keyword arguments (the host twin's and the bookkeeping's)."""
            return dict(
                shard_decode_requests=bool(self.shard_decode_requests),
                dcp_size=self.dcp_world_size,
                dcp_rank=self.dcp_rank,
                cp_interleave=self.cp_interleave,
            )

        def _fn_host_layout(self) -> HostLayout:
            """The host twin (serves get_num_tokens_for_dispatch with or without capacities)."""
            return HostLayout(self.pcp_world_size, self.pcp_rank, **self._fn_layout_rules())

        def _fn_allocate_block_tables(self, block_tables: Any) -> None:
            """The local block tables ``[2R, width]`` per KV-cache group and the slot-mapping
            buffers for ``block_tables`` (none without them)."""
            P, R2, T, dev = self.pcp_world_size, 2 * self.max_num_reqs, self.max_num_tokens, self.device
            self._block_tables = block_tables
            self._local_block_tables = self._local_block_table_ptrs = None
            num_groups = 0 if block_tables is None else block_tables.num_kv_cache_groups
            if block_tables is not None:
                self._local_block_tables = tuple(
                    t.new_zeros((R2, t.shape[1])) for t in block_tables.input_block_tables
                )
                # vLLM's gather kernel writes through these addresses
                self._local_block_table_ptrs = torch.tensor(
                    [t.data_ptr() for t in self._local_block_tables], dtype=torch.uint64, device=dev
                )
            # the slot dtype of the cache-write kernels: the block tables' (vllm-ascend's are int32)
            # when they have one, else vLLM's int64
            slot_dtype = getattr(getattr(block_tables, "slot_mappings", None), "dtype", torch.int64)
            # zeros like vLLM's, and one pad column past the T tokens' (column T, PAD_SLOT_ID: the
            # bookkeeping fills it): a gathered row that must not write reads it, so the gathered
            # slot mappings are one gather
            self._fn_global_slot_mappings = torch.zeros(num_groups, T + 1, dtype=slot_dtype, device=dev)
            self._fn_gathered_slot_mappings = torch.full(
                (num_groups, P * T), api.PAD_SLOT_ID, dtype=slot_dtype, device=dev
            )

        def _fn_build_bookkeeping(self) -> None:
            """The bookkeeping over the persistent buffers, its graphs made now (start-up)."""
            ib, dev = self._input_buffers, self.device
            backend = resolve_graph_backend(self.graph_backend, dev)
            out = Destinations(
                ib.input_ids,
                ib.positions,
                ib.is_padding,
                ib.query_start_loc,
                ib.seq_lens,
                self._fn_idx_mapping,
                self._fn_logits_indices,
                self._fn_cu_num_logits,
                self._fn_hidden_restore_idx,
                self._fn_padded_gather_idx,
                self._fn_kv_write_mask,
                self._fn_slot_gather_idx,
                self._fn_global_slot_mappings,
                self._fn_gathered_slot_mappings,
                self._fn_moe_mask,
            )
            self._fn_pcp = Bookkeeping(
                self.pcp_world_size,
                self.pcp_rank,
                self.max_num_reqs,
                self.max_num_tokens,
                **self._fn_layout_rules(),
                pad_slot_id=api.PAD_SLOT_ID,
                device=dev,
                out=out,
                backend=backend,
                check_host_syncs=self.check_host_syncs,
                token_buckets=self._fn_token_buckets(backend, self.max_num_tokens),
                package_dir=package_cache_dir() if backend == "aoti" else None,
                cache=self._fn_cache,
            )
            # the graphs were made on an empty batch: the buffers start as vLLM's do
            ib.is_padding.zero_()
            self._fn_moe_mask.fill_(True)

        def _fn_set_block_tables(self, block_tables: Any) -> None:
            """vLLM 0.33+'s ``set_block_tables``: new local block tables and slot-mapping buffers
            (the persistent addresses a captured model graph sees from then on), and the block
            tables' ``cp_interleave`` (a different one rebuilds the bookkeeping's graphs)."""
            if not self.__dict__.get("_fn_ready"):
                # from vLLM's constructor (no capacities): its attributes as vLLM's leave them;
                # ours attaches the block tables at the end of __init__
                api.PCPManager.set_block_tables(self, block_tables)
                return
            interleave = self.cp_interleave if block_tables is None else block_tables.cp_interleave
            if self._fn_pcp is None:  # no capacities: nothing allocated, like vLLM's
                self._block_tables, self.cp_interleave = block_tables, interleave
                self._fn_host = self._fn_host_layout()
                return
            self._fn_allocate_block_tables(block_tables)
            self._fn_cache.clear()  # the plans hold views of the old slot mappings
            if interleave != self.cp_interleave:
                self.cp_interleave = interleave
                self._fn_host = self._fn_host_layout()
                self._fn_build_bookkeeping()
            else:
                self._fn_pcp.set_slot_mappings(self._fn_global_slot_mappings, self._fn_gathered_slot_mappings)

        def _fn_full_rows(self, num_reqs: int, num_tokens: int, max_query_len: int | None) -> int:
            """The local request rows of the FULL graph of ``num_tokens`` tokens that vLLM sizes for
            ``num_reqs`` requests with queries up to ``max_query_len`` tokens.

            vLLM's mixed FULL graphs (``CudaGraphManager._init_candidates``) hold
            ``min(num_tokens, max_num_seqs)`` requests, and its dispatcher checks the *global*
            request count; a split prefill puts a head and a tail row on a rank, so a rank of
            such a graph can hold up to ``min(num_tokens, 2 * max_num_seqs)`` rows (each row has
            a token). A graph that can replay prefills (queries as long as the graph: vLLM's
            capture promises ``max_query_len = num_tokens`` to a mixed FULL graph) and whose
            request count is capped at ``max_num_seqs`` gets those rows; decode graphs (shorter
            queries, at most one row per request) and graphs below the cap keep vLLM's count.
            """
            R = self.max_num_reqs
            if max_query_len is not None and max_query_len >= num_tokens and num_reqs == R < num_tokens:
                return min(num_tokens, 2 * R)
            return num_reqs

        def _fn_token_buckets(self, backend: str | None, T: int) -> Sequence[int] | None:
            """The ladder's token sizes: the class attribute, else (device graphs) the engine's
            capture sizes up to ``T`` then powers of two (vLLM pads ``Lp`` to a capture size:
            a rung of that size replays it without a second padding), else the default."""
            if self.token_buckets is not None:
                return self.token_buckets
            if backend is None or self.device.type == "cpu" or api.capture_sizes is None:
                return None
            return capture_ladder(api.capture_sizes(), T)

        def _fn_bookkeeping(self, what: str) -> Any:
            """The bookkeeping, or a ``RuntimeError`` naming ``what`` needs the capacities (vLLM's
            manager asserts its buffers there too)."""
            if self._fn_pcp is None:
                raise RuntimeError(
                    f"{what} needs the max_num_reqs and max_num_tokens given to the constructor "
                    "(the persistent buffers are allocated once, at capacity)"
                )
            return self._fn_pcp

        # ------------------------------------------------------------ config

        @staticmethod
        def validate_config(vllm_config: Any, supports_mm_inputs: bool) -> None:
            """vLLM's checks, except that FULL CUDA graphs serve mixed batches too.

            vLLM rejects ``FULL`` (one FULL routine for every batch) with PCP; the
            bookkeeping here is one graph per bucket, so the base class checks the
            config as if it said ``FULL_DECODE_ONLY``, which passes every other
            check unchanged (the mode is still not ``NONE``).
            """
            mode = vllm_config.compilation_config.cudagraph_mode
            if mode == Mode.FULL:
                compilation = _Override(vllm_config.compilation_config, cudagraph_mode=Mode.FULL_DECODE_ONLY)
                vllm_config = _Override(vllm_config, compilation_config=compilation)
            api.PCPManager.validate_config(vllm_config, supports_mm_inputs)

        # ------------------------------------------------------------ buffers

        @property
        def input_buffers(self) -> Any:
            """The persistent local ``InputBuffers`` (``2 * max_num_reqs`` rows, ``max_num_tokens``)."""
            self._fn_bookkeeping("input_buffers")
            return self._input_buffers

        @property
        def global_batch(self) -> Any:
            """The global ``InputBatch`` of the last ``partition_batch``."""
            if self._global_batch is None:
                raise RuntimeError("global_batch: no batch was partitioned yet")
            return self._global_batch

        @property
        def schedule_cache(self) -> ScheduleCache:
            """What repeated schedules reuse (:mod:`pcp_fn.adapters.schedule_cache`): its ``made``
            counts, by table, what was computed rather than looked up."""
            return self._fn_cache

        @property
        def graph_stats(self) -> Any:
            """The bookkeeping's :class:`pcp_fn.adapters.backend.GraphStats`: graphs prepared at
            construction and their time, steps partitioned, steps run eagerly as fallbacks."""
            return GraphStats() if self._fn_pcp is None else self._fn_pcp.stats

        def persistent_buffers(self) -> dict[str, torch.Tensor]:
            """Every persistent device buffer by name (their ``data_ptr()``s never change)."""
            self._fn_bookkeeping("persistent_buffers")
            ib = self._input_buffers
            named = {
                "input_ids": ib.input_ids,
                "positions": ib.positions,
                "is_padding": ib.is_padding,
                "moe_is_padding": self._fn_moe_mask,
                "query_start_loc": ib.query_start_loc,
                "seq_lens": ib.seq_lens,
                "dcp_local_seq_lens": ib.dcp_local_seq_lens,
                "idx_mapping": self._fn_idx_mapping,
                "expanded_local_pos": self._fn_expanded_local_pos,
                "logits_indices": self._fn_logits_indices,
                "cu_num_logits": self._fn_cu_num_logits,
                "hidden_restore_idx": self._fn_hidden_restore_idx,
                "padded_gather_idx": self._fn_padded_gather_idx,
                "kv_write_mask": self._fn_kv_write_mask,
                "slot_gather_idx": self._fn_slot_gather_idx,
                "global_slot_mappings": self._fn_global_slot_mappings,
                "gathered_slot_mappings": self._fn_gathered_slot_mappings,
            }
            named.update({f"block_table_{g}": t for g, t in enumerate(self._local_block_tables or ())})
            return named

        # ------------------------------------------------------------ dispatch

        def get_num_tokens_for_dispatch(
            self, num_scheduled_tokens: np.ndarray, is_prefilling: np.ndarray
        ) -> int:
            """The largest real rank-local batch before graph padding (host twin, no loop)."""
            sched = host_row("input_batch.num_scheduled_tokens", num_scheduled_tokens)
            pf = host_row("input_batch.is_prefilling_np", is_prefilling, sched.size)
            return self._fn_segments(sched, pf)[1]

        def _fn_segments(self, sched: np.ndarray, pf: np.ndarray) -> tuple[Any, int]:
            """The host twin's segments of a schedule (every rank's counts, this rank's rows) and
            the largest rank's token count, remembered: vLLM's runner asks
            ``get_num_tokens_for_dispatch`` and then ``partition_batch`` of the same schedule,
            and a busy server's decode steps repeat theirs. The memo's arrays are only read."""
            key = (sched.dtype, pf.dtype, sched.tobytes(), pf.tobytes())
            found = self._fn_segments_of.get(key)
            if found is None:
                if sched.size and int(np.bitwise_or.reduce(sched)) < 0:  # a new schedule's counts
                    host_ints("num_scheduled_tokens", sched)  # raises, naming the negative entry
                seg = self._fn_host.segments(sched, pf)
                # max over P ints in Python: a numpy reduction costs more than the list
                widest = max(seg.per_rank_num_tokens.tolist()) if sched.size else 0
                found = self._fn_cache.put("segments", key, (seg, widest))
            return found

        def partition_batch(self, input_batch: Any, batch_desc: Any) -> Any:
            """This rank's local ``InputBatch`` of the global ``input_batch`` (vLLM ``partition_batch``).

            ``batch_desc.cg_mode``: ``NONE`` pads the local tokens to the largest
            rank; ``PIECEWISE``/``FULL`` to ``batch_desc.num_tokens``; ``FULL``
            also pads the local request rows to ``batch_desc.num_reqs`` -- for
            mixed prefill + decode batches too, unlike vLLM -- or, for a mixed
            FULL graph capped at ``max_num_reqs`` requests, to the rows a split
            prefill can give a rank (:meth:`_fn_full_rows`; the capture stages
            the same rows).

            Raises:
                ValueError: more requests or tokens than the capacities, arrays
                    of the wrong length, a padded size below what a rank holds
                    or beyond the buffers.
            """
            pcp = self._fn_bookkeeping("partition_batch")
            g = input_batch
            sched, computed, pf, plen, idx_np = self._fn_check(g)
            shape = self._fn_plan(sched, pf, batch_desc)
            ids, pos = g.input_ids, g.positions
            pcp.partition(sched, computed, plen, pf, idx_np, ids, pos, shape.total, shape.plan)
            self._fn_decode_only = shape.decode_only  # of the global batch just partitioned
            fields = self._fn_host_fields(g, shape, sched, computed, plen, idx_np)
            return self._fn_local_batch(g, fields, shape.fixed)

        # The phases of partition_batch, one method each (benchmarks/bench_vllm.py times them):
        # check, twin + plan, staging + graph (Bookkeeping.partition), host fields, local batch.

        def _fn_check(self, g: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            """The global batch's host arrays, checked: ``(num_scheduled, num_computed,
            is_prefilling, prefill_len, idx_mapping)`` (their sum is the shape's)."""
            R = self.max_num_reqs
            sched = host_row("input_batch.num_scheduled_tokens", g.num_scheduled_tokens)
            num_reqs = sched.size
            if num_reqs > R:
                raise ValueError(f"input_batch has {num_reqs} requests; max_num_reqs is {R}")
            computed = host_row("input_batch.num_computed_tokens_np", g.num_computed_tokens_np, num_reqs)
            pf = host_row("input_batch.is_prefilling_np", g.is_prefilling_np, num_reqs)
            plen = host_row("input_batch.prefill_len_np", g.prefill_len_np, num_reqs)
            idx_np = host_row("input_batch.idx_mapping_np", g.idx_mapping_np, num_reqs)
            if pf.dtype != np.bool_:
                raise ValueError(f"input_batch.is_prefilling_np must hold bools, got {pf.dtype}")
            if not (computed.dtype.kind in "iu" and plen.dtype.kind in "iu" and idx_np.dtype.kind in "iu"):
                named = zip(_INT_FIELDS, (computed, plen, idx_np))
                name, arr = next((k, a) for k, a in named if a.dtype.kind not in "iu")
                raise ValueError(f"input_batch.{name} must hold integers, got {arr.dtype}")
            # their values (none negative or past int32) are checked where they are staged
            return sched, computed, pf, plen, idx_np

        def _fn_plan(self, sched: np.ndarray, pf: np.ndarray, batch_desc: Any) -> _Shape:
            """The step's :class:`_Shape`: made from the host twin's segments and vLLM's padded
            sizes ``(Lp, Rpad)`` (checked against what the ranks hold) the first time this
            schedule and descriptor are seen, then looked up (a busy server's decode steps repeat
            their schedule: all ones, none prefilling)."""
            last_desc, desc_id = self._fn_last_desc
            if batch_desc is not last_desc:  # vLLM's dispatcher hands out one object per graph
                desc_id = self._fn_desc_id(batch_desc)
            # (pf: one byte a request, so its length is the request count)
            key = (sched.dtype, sched.tobytes(), pf.tobytes(), desc_id)
            shape = self._fn_shapes.get(key)
            if shape is None:
                shape = self._fn_cache.put("shapes", key, self._fn_new_shape(sched, pf, batch_desc))
            return shape  # (Bookkeeping.partition checks input_ids and positions hold its tokens)

        def _fn_desc_id(self, batch_desc: Any) -> int:
            """A small int naming what ``batch_desc`` says of the step's sizes (equal descriptors,
            one id), remembered with the object: the shape memo's key part for it."""
            fields = (
                batch_desc.cg_mode,
                batch_desc.num_tokens,
                batch_desc.num_reqs,
                getattr(batch_desc, "max_query_len", None),
                getattr(batch_desc, "uniform_token_count", None),
            )
            desc_id = self._fn_desc_ids.get(fields)
            if desc_id is None:
                desc_id = self._fn_cache.put("descriptors", fields, next(self._fn_desc_count))
            self._fn_last_desc = (batch_desc, desc_id)
            return desc_id

        def _fn_new_shape(self, sched: np.ndarray, pf: np.ndarray, batch_desc: Any) -> _Shape:
            total = int(np.add.reduce(sched, dtype=np.int64))  # (R int32 counts can pass int32)
            T = self.max_num_tokens
            if total > T:
                raise ValueError(
                    f"input_batch.num_scheduled_tokens sums to {total} tokens; max_num_tokens is {T}"
                )
            seg, widest = self._fn_segments(sched, pf)
            num_reqs = sched.size
            Lp, pad_reqs = widest, None
            mode = batch_desc.cg_mode
            if mode != Mode.NONE:
                Lp = batch_desc.num_tokens
                if mode == Mode.FULL and batch_desc.num_reqs is not None:
                    # the query bound vLLM's capture gave this graph (prepare_inputs_to_capture)
                    bound = (
                        getattr(batch_desc, "max_query_len", None)
                        or getattr(batch_desc, "uniform_token_count", None)
                        or Lp
                    )
                    pad_reqs = self._fn_full_rows(batch_desc.num_reqs, Lp, bound)
            if Lp < widest:
                raise ValueError(
                    "PCP padded token count is smaller than the largest rank-local batch: "
                    f"{Lp} < {widest} (batch_desc.num_tokens)."
                )
            if Lp > T:
                raise ValueError(f"batch_desc.num_tokens={Lp} exceeds max_num_tokens={T}")
            req, offset, length = seg.request, seg.offset, seg.length
            n = req.size
            if n == 0:  # a rank without tokens keeps one empty row of request 0, like vLLM
                req, offset, length, n = _NO_ROW, _NO_TOKENS, _NO_TOKENS, 1
            Rpad = n if pad_reqs is None else pad_reqs
            if Rpad < n:
                raise ValueError(
                    f"batch_desc.num_reqs={Rpad} (the FULL graph's request capacity) must cover "
                    f"the {n} rank-local request rows (a split prefill gives a head and a tail row)"
                )
            if Rpad > 2 * self.max_num_reqs:
                raise ValueError(
                    f"batch_desc.num_reqs={Rpad} exceeds the local request capacity "
                    f"2 * max_num_reqs = {2 * self.max_num_reqs}"
                )
            # the graph bucket holds every rank's rows (the layout covers all ranks) and vLLM's sizes
            rows = max(seg.per_rank_num_reqs.tolist()) if num_reqs else 1
            key = (Lp, Rpad, n, rows)
            cached = self._fn_views.get(key)
            if cached is None:
                cached = self._fn_step_views(key)
            plan, views = cached
            num_sched = length.astype(np.int32)
            num_local_tokens = int(np.add.reduce(length))
            qsl = np.empty(Rpad + 1, dtype=np.int32)
            qsl[0] = 0
            np.add.accumulate(num_sched, out=qsl[1 : n + 1])
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
                max_seq_len_np=None,
                prefill_runs_as_decode_np=None,
                prompt_lens=None,
            )
            shifted = bool(np.count_nonzero(offset))
            decode_only = not np.count_nonzero(pf)
            return _Shape(
                plan, fixed, req, req.tolist(), offset, num_sched, qsl, cu, total, shifted, decode_only
            )

        def _fn_host_fields(
            self,
            g: Any,
            shape: _Shape,
            sched: np.ndarray,
            computed: np.ndarray,
            plen: np.ndarray,
            idx_np: np.ndarray,
        ) -> dict[str, Any]:
            """The local batch's host fields: the shape's (copied), and the per-request values of
            this step's local rows (never a device read)."""
            req, num_sched = shape.req, shape.num_sched
            n, Rpad = req.size, shape.plan.Rpad
            start = computed[req] if computed.dtype == np.int32 else computed[req].astype(np.int32)
            if shape.shifted:  # a segment starting inside its request (a split prefill's chunk)
                np.add(start, shape.offset, out=start, casting="unsafe")
            local_plen = plen[req]
            computed_prefill = np.minimum(start, local_plen)
            if Rpad == n:  # (no padding rows: one numpy call per field fewer)
                is_prefilling = np.less(computed_prefill, local_plen)
                upper = np.add(start, num_sched)
            else:
                is_prefilling = np.zeros(Rpad, dtype=np.bool_)
                np.less(computed_prefill, local_plen, out=is_prefilling[:n])
                upper = np.zeros(Rpad, dtype=np.int32)
                np.add(start, num_sched, out=upper[:n])
            has_prefill = bool(np.count_nonzero(is_prefilling))  # (cheaper than ndarray.any)
            dcp_upper = None
            if self.dcp_world_size > 1:
                # DCP rank 0's share of the whole request's KV, the same on every PCP rank
                dcp_upper = torch.zeros(Rpad, dtype=torch.int32)
                whole = (computed + sched)[req]
                dcp_upper[:n] = torch.from_numpy(self._fn_pcp.dcp_rank0_seq_lens(whole).astype(np.int32))
            req_ids = g.req_ids
            self._fn_local_rows = req  # each local row's global request (host)
            return dict(
                req_ids=[req_ids[i] for i in shape.req_list],
                idx_mapping_np=idx_np[req],
                num_scheduled_tokens=num_sched.copy(),
                query_start_loc_np=shape.query_start_loc.copy(),
                seq_lens_cpu_upper_bound=torch.from_numpy(upper),
                **contract.metadata_fields(g, sched, req, dcp_upper),
                num_computed_tokens_np=start,
                prefill_len_np=local_plen,
                num_computed_prefill_tokens_np=computed_prefill,
                is_prefilling_np=is_prefilling,
                has_prefill=has_prefill,
                decode_graph_eligible=not has_prefill,
                cu_num_logits_np=shape.cu_num_logits.copy(),
            )

        def _fn_local_batch(self, g: Any, fields: dict[str, Any], fixed: dict[str, Any]) -> Any:
            """The local ``InputBatch``: the global one with the shape's fields (``fixed``: the
            device views, the sizes) and this step's host fields."""
            # the keys of fixed and fields are the same every step: checked once per batch class
            cls = type(g)
            checked = cls is self._fn_fast_replace
            if not checked and _fast_replace_ok(cls, fixed, fields):
                self._fn_fast_replace, checked = cls, True
            self._local_batch = _replace(g, fixed, fields, checked=checked)
            self._global_batch = g
            self._fn_capture_rows = (0, 0)
            # draft_prefill_batch is left as it is, like vLLM's partition_batch (a draft prefill
            # that was prepared but not restored stays prepared until prepare_draft_prefill)
            return self._local_batch

        def _fn_step_views(self, key: tuple[int, int, int, int]) -> tuple[Any, dict[str, torch.Tensor]]:
            """The bookkeeping's plan and the local batch's device fields (views of the persistent
            buffers) for a step of these sizes: made once, steady steps repeat their sizes."""
            Lp, Rpad, n, rows = key
            ib = self._input_buffers
            idx_mapping = self._fn_idx_mapping[:n]
            # the MoE's gathered rank-major mask when it all-gathers the tokens (vLLM 0.33+)
            moe = self._fn_moe
            is_padding = ib.is_padding[:Lp] if moe is None else moe[: self.pcp_world_size * Lp]
            views = dict(
                idx_mapping=idx_mapping,
                expanded_idx_mapping=idx_mapping,
                expanded_local_pos=self._fn_expanded_local_pos[:n],
                query_start_loc=ib.query_start_loc[: Rpad + 1],
                seq_lens=ib.seq_lens[:Rpad],
                input_ids=ib.input_ids[:Lp],
                positions=ib.positions[:Lp],
                is_padding=is_padding,
                logits_indices=self._fn_logits_indices[:Rpad],
                cu_num_logits=self._fn_cu_num_logits[: n + 1],
            )
            return self._fn_cache.put("views", key, (self._fn_pcp.plan(Lp, Rpad, rows), views))

        # ------------------------------------------------------------ attention

        def prepare_attn(self, input_batch: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
            """Local block tables (gathered into the persistent tables) and the gathered slot mappings."""
            if self._block_tables is None or self._local_block_table_ptrs is None:
                raise RuntimeError("prepare_attn needs the block_tables given to the constructor")
            block_tables = self._block_tables.gather_block_tables(
                input_batch.idx_mapping,
                input_batch.num_reqs_after_padding,
                out=self._local_block_tables,
                out_ptrs=self._local_block_table_ptrs,
            )
            return block_tables, self.prepare_slot_mappings()

        def prepare_slot_mappings(self) -> torch.Tensor:
            """``[K, P * Lp]``: the KV slot of every all-gathered row (``PAD_SLOT_ID`` where it must
            not write: padding, and replicated rows other than rank 0's)."""
            if self._block_tables is None:
                raise RuntimeError("prepare_slot_mappings needs the block_tables given to the constructor")
            g = self.global_batch
            # vLLM's kernel writes the first num_tokens columns of the persistent [K, T + 1] buffer
            # (and PAD_SLOT_ID after them: the pad column stays PAD_SLOT_ID)
            self._block_tables.compute_slot_mappings(
                g.idx_mapping, g.query_start_loc, g.positions, g.num_tokens, out=self._fn_global_slot_mappings
            )
            return self._fn_pcp.gathered_slot_mappings(g.num_tokens)

        def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
            """Zeroed views of the persistent local block tables (capture and dummy runs)."""
            if self._local_block_tables is None:
                raise RuntimeError(
                    "get_dummy_block_tables needs the block_tables, max_num_reqs and max_num_tokens "
                    "given to the constructor"
                )
            asked, staged = self._fn_capture_rows
            rows = staged if num_reqs == asked else num_reqs  # the capture batch's rows
            return tuple(t[:rows].zero_() for t in self._local_block_tables)

        def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
            """The persistent gathered slot mappings, all ``PAD_SLOT_ID``, ``[K, num_tokens * P]``."""
            self._fn_bookkeeping("get_dummy_slot_mappings")
            self._fn_gathered_slot_mappings.fill_(api.PAD_SLOT_ID)
            return self._fn_gathered_slot_mappings[:, : num_tokens * self.pcp_world_size]

        def _fn_stage_capture(self, input_batch: Any) -> Any:
            """Stage a capture or dummy batch in the persistent local buffers; a mixed FULL graph's
            batch gets the rows ``partition_batch`` pads its steps to (:meth:`_fn_full_rows`)."""
            ib = self.input_buffers
            r, t = input_batch.num_reqs_after_padding, input_batch.num_tokens_after_padding
            bound = getattr(input_batch, "max_query_len", None)  # None: no FULL capture
            rows = self._fn_full_rows(r, t, bound)
            self._fn_capture_rows = (r, rows)
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

        # ------------------------------------------------------------ hidden states

        def restore_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
            """All-gather the ranks' ``[Lp, ...]`` rows and put them in global token order
            ``[num_tokens, ...]`` (unchanged before the first ``partition_batch``)."""
            if self._fn_pcp is None or not self._fn_pcp.has_layout:
                return hidden_states
            gathered = api.get_pcp_group().all_gather(hidden_states, dim=0)
            return self._fn_pcp.restore(gathered, self.global_batch.num_tokens)

        def restore_for_sampling(
            self, hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None
        ) -> tuple[torch.Tensor, list[torch.Tensor] | None, Any]:
            """Restored hidden (and auxiliary) states with the global batch to sample with."""
            g = self.global_batch
            group = api.get_pcp_group()
            gathered = group.all_gather(hidden_states, dim=0)  # collectives in vLLM's order
            aux = (
                None if aux_hidden_states is None else [group.all_gather(a, dim=0) for a in aux_hidden_states]
            )
            hidden, aux = self._fn_pcp.restore_for_sampling(gathered, aux, g.num_tokens)
            return hidden, aux, g

        # ------------------------------------------------------------ drafter

        def prepare_draft_prefill(self, input_batch: Any, input_ids: torch.Tensor) -> None:
            """Point the drafter at this rank's rows of ``input_ids`` (global order), when
            ``input_batch`` is the batch last partitioned."""
            self.draft_prefill_batch = None
            if input_batch is not self._global_batch or self._local_batch is None:
                return
            local = self._local_batch
            self._fn_pcp.draft_input_ids(input_ids, local.input_ids)
            self.draft_prefill_batch = local

        def restore_draft_prefill(
            self, last_hidden_states: torch.Tensor, hidden_states: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """Restore the drafter's outputs to global order (once when both are the same tensor)."""
            if self.draft_prefill_batch is None:
                return last_hidden_states, hidden_states
            group = api.get_pcp_group()
            last = group.all_gather(last_hidden_states, dim=0)
            other = last if hidden_states is last_hidden_states else group.all_gather(hidden_states, dim=0)
            self.draft_prefill_batch = None
            return self._fn_pcp.restore_draft_prefill(last, other, self.global_batch.num_tokens)

    FunctionalPCPManager.__name__ = FunctionalPCPManager.__qualname__ = name
    return FunctionalPCPManager
