"""Everything the vLLM adapter asks of `pcp_fn`, in one place: host twin, captured MRV2 graph, restores.

The bookkeeper ([`pcp_fn.adapters.vllm.bookkeeper`][]) speaks vLLM; this module
speaks `pcp_fn.mrv2`. No other adapter module calls into `pcp_fn` (keep it
that way: when the `mrv2` signatures change, only this file changes).

Per step:

1. `segments`: the host twin ([`pcp_fn.mrv2.host.local_segments`][]),
   numpy on the scheduler's `[R]` arrays: every rank's counts and this rank's
   segments, for the bucket choice and the host fields.
2. `partition`: the per-request arrays and vLLM's padded local token count
   `Lp` go to the device in one copy ([`STEP`][pcp_fn.adapters.vllm.graphs.STEP]: `pcp_fn.mrv2.REQUESTS`
   and `Lp`, int32), the global
   token ids and positions into persistent `[T]` buffers; then one graph per
   bucket `(Rb, Lb)` ([`pcp_fn.adapters.runtime.GraphRuntime`][]: made at
   construction, bound once to those staging buffers: a CUDA/NPU graph,
   `torch.compile` or AOTInductor on the CPU, or plain calls with
   `backend=None`) builds the
   [`pcp_fn.mrv2.GlobalBatch`][] of the `F_b` global rows, runs
   [`pcp_fn.mrv2.partition_batch`][], rewrites the gathered-row maps from the
   bucket's `Lb` rows per rank to vLLM's `Lp` (gathered row `q * Lb + l`
   of the bucket is row `q * Lp + l` of vLLM's all-gather) and copies the
   bucket-shaped results into the first rows of the persistent buffers. The
   bucket is a power of two at least vLLM's padded sizes `(Rpad, Lp)`, so a
   handful of graphs serve every step; what a step of given sizes reuses (the
   bucket, the bound graph, the views) is a [`StepPlan`][pcp_fn.adapters.vllm.graphs.StepPlan], made once.
3. `gathered_slot_mappings`, `restore*`, `draft_input_ids`: the layout
   consumers. The slot mappings and restores run on a state whose layout *is*
   the persistent buffers at vLLM's `Lp` (made once per `Lp`); the draft
   ids on the bucket's own state and local batch from the graph.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ... import mrv2
from ...core.buckets import Bucket
from ...core.checks import INT32_MAX, check_sequence_ends, host_int_rows, host_ints
from ...core.packing import PackedRequests
from ...mrv2 import host
from ..backend import GraphStats, graph_ladder
from ..runtime import GraphCall, GraphRuntime, Staging
from ..schedule_cache import ScheduleCache

STEP: PackedRequests = mrv2.REQUESTS.with_scalars("Lp")
"""What a step stages: the global batch's per-request rows and request count
([`pcp_fn.mrv2.REQUESTS`][]), then vLLM's padded local token count `Lp`."""


class Destinations(NamedTuple):
    """Persistent device buffers the partition writes, at capacity (`R' = 2 * max_num_reqs`
    local rows, `T` tokens, `P` ranks). Their addresses never change.

    input_ids `[T]` int32, positions `[T]` int64, is_padding `[T]` bool,
    query_start_loc `[R'+1]` int32, seq_lens `[R']` int32 (vLLM `InputBuffers`);
    idx_mapping `[R']` int64, logits_indices `[R']` int32, cu_num_logits `[R'+1]` int32;
    hidden_restore_idx `[T]` int64, padded_gather_idx `[P*T]` int64,
    kv_write_mask `[P*T]` bool; slot_gather_idx `[P*T]` int64 (each gathered row's column
    of global_slot_mappings: `T`, the pad column, where the row must not write);
    global_slot_mappings `[K, T+1]` int64 (vLLM's kernel writes the first `num_tokens`
    columns; column `T` always reads `pad_slot_id`), gathered_slot_mappings `[K, P*T]` int64;
    moe_is_padding `[P*T]` bool: the padding mask of the all-gathered rows, rank-major (gathered
    row `q * Lp + l` is padding when `l >= ` rank `q`'s tokens), what an MoE layer that
    all-gathers the tokens routes with (vLLM 0.33+).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    is_padding: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    idx_mapping: torch.Tensor
    logits_indices: torch.Tensor
    cu_num_logits: torch.Tensor
    hidden_restore_idx: torch.Tensor
    padded_gather_idx: torch.Tensor
    kv_write_mask: torch.Tensor
    slot_gather_idx: torch.Tensor
    global_slot_mappings: torch.Tensor
    gathered_slot_mappings: torch.Tensor
    moe_is_padding: torch.Tensor


class StepPlan(NamedTuple):
    """Everything a step of given sizes reuses (made once per `(Lp, Rpad, rows)`): the graph
    bucket and its call ([`pcp_fn.adapters.runtime.GraphCall`][]), the state the consumers
    read (the persistent layout buffers at vLLM's `Lp`), and the slot-mapping views.

    `Lp` local tokens per rank after padding, `Rpad` local request rows after padding.
    """

    Lp: int
    Rpad: int
    bucket: Bucket
    graph: GraphCall
    view: mrv2.MRV2State
    gathered_slots: torch.Tensor  # [K, P*Lp] view of the persistent gathered slot mappings
    slot_idx: torch.Tensor  # [P*Lp] view of the persistent slot_gather_idx


def _to_vllm_rows(
    config: mrv2.MRV2Config, layout: mrv2.MRV2Layout, Lb: int, Lp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bucket's gathered-row maps (`Lb` rows per rank) at vLLM's `Lp <= Lb` rows per rank
    (a 0-d tensor: one graph serves every `Lp` of the bucket).

    Returns `padded_gather_idx [P*Lb]` and `gathered_kv_write_mask [P*Lb]`
    whose first `P*Lp` rows are vLLM's (0 / False after),
    `hidden_restore_idx [F_b]` pointing into vLLM's gathered rows, and the
    gathered padding mask `[P*Lb]` (True past the first `P*Lp` rows):

        P = 2, Lp = 3, per-rank tokens [3, 1]:  gathered rows  r0 r0 r0 | r1 r1 r1
                                                 padding        F  F  F  | F  T  T
    """
    P = config.pcp_size
    row = torch.arange(P * Lb, dtype=torch.int64, device=Lp.device)
    width = Lp.clamp(min=1)
    src = (row // width) * Lb + row % width  # vLLM row q*Lp + l <- bucket row q*Lb + l
    valid = row < P * Lp
    src = torch.where(valid, src, 0)
    gather = torch.where(valid, layout.padded_gather_idx[src], 0)
    write = valid & layout.gathered_kv_write_mask[src]
    restore = layout.hidden_restore_idx
    restore = restore + (restore // Lb) * (Lp - Lb)
    rank = (row // width).clamp(max=P - 1)
    padding = ~valid | (row % width >= layout.per_rank_num_tokens[rank])
    return gather, write, restore, padding


def _partition_step(
    bucket: Bucket,
    state: mrv2.MRV2State,
    out: Destinations,
    layout_out: tuple[torch.Tensor, torch.Tensor],
    packed: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    """The captured function (`bucket` bound; `state` and the persistent buffers too, but for
    AOTInductor, which needs every tensor as an argument and writes the buffers it is given):
    `mrv2.partition_batch` of the staged global batch, written into the persistent buffers.

    `packed`: the [`STEP`][pcp_fn.adapters.vllm.graphs.STEP] layout (the global batch's per-request rows,
    zero past the requests, num_reqs, vLLM's `Lp`); `input_ids [F_b]` int32, `positions [F_b]`
    int64. The bucket-shaped results go into the first rows of `out` (and
    `layout_out`: per-rank and global token counts), inside the graph, so a
    replay leaves them there. It returns nothing: a graph with outputs would
    hand back (AOTInductor: allocate) about 25 tensors a call that nobody reads.
    """
    cfg = state.config
    R, P, Rb, Lb = cfg.max_num_reqs, cfg.pcp_size, bucket.num_reqs, bucket.num_tokens
    # STEP begins with mrv2.REQUESTS, so the batch reads it as that: unpacking STEP would also
    # view Lp, a second select of the same word that a plain (eager) call pays for every step
    batch = mrv2.unpack_batch(cfg, bucket, packed, input_ids, positions)
    state, local = mrv2.partition_batch(state, batch)
    lay = state.layout
    Lp = packed[STEP.offset(R, "Lp")].to(torch.int64)
    gather, write, restore, padding = _to_vllm_rows(cfg, lay, Lb, Lp)
    # the gathered slot mappings are then one gather: a row that must not write reads the pad column
    slot_idx = torch.where(write, gather, cfg.max_num_tokens)
    per_rank_out, num_tokens_out = layout_out
    # (a persistent buffer's first rows, the bucket's result written there), one pair per buffer
    copies = (
        (out.input_ids[:Lb], local.input_ids),
        (out.positions[:Lb], local.positions),
        (out.is_padding[:Lb], local.is_padding),
        (out.query_start_loc[: Rb + 1], local.query_start_loc),
        (out.seq_lens[:Rb], local.seq_lens),
        (out.idx_mapping[:Rb], local.idx_mapping.to(torch.int64)),
        (out.logits_indices[:Rb], local.logits_indices),
        (out.cu_num_logits[: Rb + 1], local.cu_num_logits),
        (out.hidden_restore_idx[: restore.shape[0]], restore),
        (out.padded_gather_idx[: P * Lb], gather),
        (out.kv_write_mask[: P * Lb], write),
        (out.slot_gather_idx[: P * Lb], slot_idx),
        (out.moe_is_padding[: P * Lb], padding),
        (per_rank_out, lay.per_rank_num_tokens),
        (num_tokens_out, lay.num_tokens),
    )
    torch._foreach_copy_(*zip(*copies))  # (destinations, sources): no comprehension frames per call


# the vLLM InputBatch fields of StepGraphs.partition's per-request arrays, in its staging order
_FIELDS = tuple(
    f"input_batch.{name}"
    for name in ("num_scheduled_tokens", "num_computed_tokens_np", "prefill_len_np", "idx_mapping_np")
)


class HostSegments:
    """The host twin alone (no capacities, no device): what a manager constructed without
    `max_num_reqs` / `max_num_tokens` still answers (`get_num_tokens_for_dispatch`).
    The layout rules read no capacity, so the config carries nominal ones."""

    def __init__(
        self,
        pcp_size: int,
        pcp_rank: int,
        *,
        shard_decode_requests: bool,
        dcp_size: int,
        dcp_rank: int,
        cp_kv_cache_interleave_size: int,
        split: mrv2.PrefillSplit = mrv2.HEAD_TAIL,
    ) -> None:
        self.config = mrv2.MRV2Config(
            pcp_size=pcp_size,
            pcp_rank=pcp_rank,
            max_num_reqs=1,
            max_num_tokens=1,
            shard_decode_requests=shard_decode_requests,
            dcp_size=dcp_size,
            dcp_rank=dcp_rank,
            cp_kv_cache_interleave_size=cp_kv_cache_interleave_size,
            split=split,
        )

    def segments(
        self, num_scheduled: np.ndarray, is_prefilling: np.ndarray, num_computed: np.ndarray | None = None
    ) -> host.LocalSegments:
        """This rank's segments and every rank's counts (host, `O(P * R)`; `num_computed` for a
        split that reads the contexts)."""
        return host.local_segments(
            self.config, self.config.pcp_rank, num_scheduled, is_prefilling, num_computed
        )


class StepGraphs:
    """One rank's MRV2 step graphs: the host twin's segments staged, the captured partition, the restores.

    Args:
        pcp_size: `P` (this argument and the eight after it are the manager's constructor
            arguments: they make the static [`pcp_fn.mrv2.MRV2Config`][pcp_fn.MRV2Config], whose
            `ValueError` names a bad one).
        pcp_rank: this rank.
        max_num_reqs: `R`, global requests per step.
        max_num_tokens: `T`, global scheduled tokens per step.
        shard_decode_requests: each decode on one rank, round-robin (else replicated).
        dcp_size: decode context-parallel ranks.
        dcp_rank: this rank's decode context-parallel rank.
        cp_kv_cache_interleave_size: the KV interleave size.
        split: how prefills are cut over the ranks ([`pcp_fn.mrv2.splits`][]; vLLM's head and
            tail chunks by default).
        pad_slot_id: the slot of gathered rows that must not write the KV cache.
        device: where the graphs run.
        out: the persistent buffers ([`Destinations`][pcp_fn.adapters.vllm.graphs.Destinations]).
        backend: `"aoti"` (AOTInductor packages), a `torch.compile`
            backend on the CPU (`"inductor"`, `"eager"`, ...) or `None`
            for plain calls (no capture). CUDA and NPU devices capture device
            graphs unless `None` or `"aoti"`.
        check_host_syncs: run the device part under [`pcp_fn.graph.no_host_syncs`][pcp_fn.no_host_syncs].
        token_buckets: the ladder's token sizes ([`graph_ladder`][pcp_fn.adapters.backend.graph_ladder]).
        prepare: make every graph of the ladder now
            ([`prepare`][pcp_fn.adapters.vllm.StepGraphs.prepare]); with `False` nothing is ever
            compiled and every step runs eagerly (counted as a fallback when `backend` is set).
        package_dir: `backend="aoti"`: a directory caching one package per
            bucket ([`package_path`][pcp_fn.adapters.vllm.StepGraphs.package_path]): a later
            start-up with the same config, torch and pcp_fn loads them instead of compiling. `None`:
            packages in a new temporary directory, compiled every time.
        cache: the manager's [`ScheduleCache`][pcp_fn.adapters.schedule_cache.ScheduleCache]
            (its `plans`, `states` and buffer-prefix tables; default a new one).
    """

    def __init__(
        self,
        pcp_size: int,
        pcp_rank: int,
        max_num_reqs: int,
        max_num_tokens: int,
        *,
        shard_decode_requests: bool,
        dcp_size: int,
        dcp_rank: int,
        cp_kv_cache_interleave_size: int,
        pad_slot_id: int,
        device: torch.device,
        out: Destinations,
        split: mrv2.PrefillSplit = mrv2.HEAD_TAIL,
        backend: str | None,
        check_host_syncs: bool = False,
        token_buckets: Sequence[int] | None = None,
        prepare: bool = True,
        package_dir: str | None = None,
        cache: ScheduleCache | None = None,
    ) -> None:
        self.ladder = graph_ladder(2 * max_num_reqs, max_num_tokens, token_buckets)
        self._rungs = tuple(b.num_tokens for b in self.ladder)
        self.config = mrv2.MRV2Config(
            pcp_size,
            pcp_rank,
            max_num_reqs,
            max_num_tokens,
            shard_decode_requests=shard_decode_requests,
            dcp_size=dcp_size,
            dcp_rank=dcp_rank,
            cp_kv_cache_interleave_size=cp_kv_cache_interleave_size,
            pad_slot_id=pad_slot_id,
            split=split,
            request_buckets=sorted({b.num_reqs for b in self.ladder}),
            token_buckets=self._rungs,
        )
        self.device = device
        self.out = out
        self.cache = ScheduleCache() if cache is None else cache
        self._plans = self.cache.table("plans")
        self._views = self.cache.table("states")
        # views of the staging and restore buffers by row count (a step's slice costs a torch op)
        self._prefixes = {name: self.cache.table(name) for name in ("input_ids", "positions", "restore")}
        self._id_views, self._position_views = self._prefixes["input_ids"], self._prefixes["positions"]
        self._plan: StepPlan | None = None
        self.set_slot_mappings(out.global_slot_mappings, out.gathered_slot_mappings)
        self.backend = backend
        self.check_host_syncs = check_host_syncs
        self._state0 = mrv2.init_state(self.config, device)
        self._allocate_staging(max_num_reqs, max_num_tokens)
        self._add_calls(package_dir)
        if prepare:
            self.prepare()

    def _allocate_staging(self, R: int, T: int) -> None:
        """What the captured graphs read (persistent, so each bucket's graph sees one address) and
        the layout the consumers read at vLLM's sizes."""
        device, pcp_size = self.device, self.config.pcp_size
        self._staging = Staging(STEP.size(R), device)
        self._packed = self._staging.device_buffer
        # the CPU's host buffer is the device buffer, the same every step: one packer for it
        self._packer = STEP.packer(self._staging.host(), R) if self._staging.persistent else None
        self._staged_reqs = 0  # requests of the last step in a persistent host buffer (zero past them)
        self._checked_words = slice(STEP.offset(R, "num_computed"), STEP.offset(R, "num_reqs"))
        self._idx_checked = b""  # the bytes of the last wide idx_mapping checked (partition)
        self._input_ids = torch.zeros(T, dtype=torch.int32, device=device)
        self._positions = torch.zeros(T, dtype=torch.int64, device=device)
        self._draft_ids = torch.zeros(T, dtype=torch.int32, device=device)
        # the layout the consumers read, at vLLM's sizes: persistent too
        self._per_rank = torch.zeros(pcp_size, dtype=torch.int64, device=device)
        self._num_tokens = torch.zeros((), dtype=torch.int64, device=device)

    def _add_calls(self, package_dir: str | None) -> None:
        """The runtime and its one call per bucket: the partition, its results written into the
        persistent buffers."""
        self.runtime = GraphRuntime(
            self.backend,
            self.device,
            check_host_syncs=self.check_host_syncs,
            package_dir=package_dir,
            package_prefix="mrv2_partition",
            package_key=(self.config,),
        )
        self.stats: GraphStats = self.runtime.stats
        layout_out = (self._per_rank, self._num_tokens)
        self._calls = {
            bucket: self.runtime.add(
                ("mrv2 partition", bucket),
                functools.partial(_partition_step, bucket),
                fixed=(self._state0, self.out, layout_out),
                staged=(self._packed, *self._token_inputs(bucket)),
                graph_key=bucket,
                step=True,
            )
            for bucket in self.ladder
        }

    @property
    def num_graphs(self) -> int:
        """Graphs made so far (one per bucket; 0 with `backend=None`)."""
        return self.runtime.num_graphs

    def prepare(self) -> GraphStats:
        """Capture or compile the graph of every bucket of the ladder now (start-up), so that
        no step compiles. Idempotent; a no-op for `backend=None` (plain calls).

        Each graph is made on an empty staged batch, which it writes into the persistent
        buffers: call it before serving (the manager's constructor does), not between a
        step's partition and its consumers.
        """
        if self.backend is None:
            return self.stats
        self._packed.zero_()  # the example every graph is made on: an empty batch
        self._staged_reqs = 0
        return self.runtime.prepare()

    @property
    def package_dir(self) -> str | None:
        """Where `backend="aoti"` packages are cached (the runtime's)."""
        return self.runtime.package_dir

    @package_dir.setter
    def package_dir(self, value: str | None) -> None:
        self.runtime.package_dir = value

    def package_path(self, bucket: Bucket) -> str:
        """The AOTInductor package of `bucket`'s graph in
        [`package_dir`][pcp_fn.adapters.vllm.StepGraphs.package_dir], named by all it depends on:
        the config, the bucket, the device type, torch's version and pcp_fn's source."""
        return self.runtime.package_path(bucket)

    def guard(self) -> Any:
        """The host-sync guard of the device work around the graphs (`check_host_syncs`)."""
        return self.runtime.guard()

    def _prefix(self, name: str, buffer: torch.Tensor, n: int) -> torch.Tensor:
        """`buffer[:n]`: the view made the first time `n` rows were asked (steady steps ask
        the same sizes), in the cache's table `name`."""
        view = self._prefixes[name].get(n)
        if view is None:
            view = self.cache.put(name, n, buffer[:n])
        return view

    def _token_inputs(self, bucket: Bucket) -> tuple[torch.Tensor, torch.Tensor]:
        """The staged global token ids and positions at `bucket`'s `F_b` rows."""
        F = mrv2.token_rows(self.config, bucket)
        return self._input_ids[:F], self._positions[:F]

    def bucket_for(self, Lp: int, Rpad: int, rows: int) -> Bucket:
        """The ladder's bucket of a step padded to `Lp` tokens and `Rpad` rows whose ranks
        hold at most `rows` local rows (all within the capacities, checked by the caller)."""
        need = max(Lp, Rpad, rows, 1)
        rungs = self._rungs
        i = bisect.bisect_left(rungs, need)
        if i < len(rungs):
            bucket = self.ladder[i]
            if bucket.num_reqs >= max(Rpad, rows):
                return bucket
        return self.ladder[-1]  # rows past T (2R > T): the last rung holds every row

    # ---------------------------------------------------------------- host twin

    def dcp_rank0_seq_lens(self, seq_lens: np.ndarray) -> np.ndarray:
        return host.dcp_rank0_seq_lens(
            seq_lens, self.config.dcp_size, self.config.cp_kv_cache_interleave_size
        )

    # ---------------------------------------------------------------- plans (made once per size)

    def plan(self, Lp: int, Rpad: int, rows: int) -> StepPlan:
        """The plan of a step padded to `Lp` tokens and `Rpad` rows whose ranks hold at most
        `rows` local rows: the graph bucket holds every rank's rows and vLLM's sizes."""
        key = (Lp, Rpad, rows)
        plan = self._plans.get(key)
        if plan is None:
            bucket = self.bucket_for(Lp, Rpad, rows)
            P, o = self.config.pcp_size, self.out
            plan = StepPlan(
                Lp=Lp,
                Rpad=Rpad,
                bucket=bucket,
                graph=self._calls[bucket],
                view=self._view_state(Lp),
                gathered_slots=o.gathered_slot_mappings[:, : P * Lp],
                slot_idx=o.slot_gather_idx[: P * Lp],
            )
            self.cache.put("plans", key, plan)
        return plan

    def _view_state(self, Lp: int) -> mrv2.MRV2State:
        """The state the consumers read: the persistent buffers at vLLM's `Lp` (one per `Lp`)."""
        state = self._views.get(Lp)
        if state is None:
            P, o = self.config.pcp_size, self.out
            view_bucket = Bucket(self.config.max_local_reqs, max(Lp, 1))
            layout = mrv2.MRV2Layout(
                per_rank_num_tokens=self._per_rank,
                num_tokens=self._num_tokens,
                hidden_restore_idx=o.hidden_restore_idx[: mrv2.token_rows(self.config, view_bucket)],
                padded_gather_idx=o.padded_gather_idx[: P * Lp],
                gathered_kv_write_mask=o.kv_write_mask[: P * Lp],
            )
            state = mrv2.MRV2State(
                config=self.config, bucket=view_bucket, rank=self._state0.rank, layout=layout
            )
            self.cache.put("states", Lp, state)
        return state

    # ---------------------------------------------------------------- device

    def partition(
        self,
        rows: tuple[np.ndarray, ...],
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        num_tokens: int,
        plan: StepPlan,
    ) -> None:
        """Lay out the global batch on every rank and write this rank's rows into `out`.

        `rows`: the per-request arrays in [`STEP`][pcp_fn.adapters.vllm.graphs.STEP]'s row order
        (`num_scheduled, num_computed, prefill_len, is_prefilling, idx_mapping`), each `[num_reqs]`
        (checked by the caller: at most `max_num_reqs`, ints); `input_ids` / `positions` the global
        `[>= num_tokens]` device tensors (not read on the host). `plan`'s
        bucket must hold every rank (rows and tokens).
        """
        T = self.config.max_num_tokens
        num_ids, num_pos = input_ids.shape[0], positions.shape[0]
        if num_ids < num_tokens or num_pos < num_tokens:
            short, rows = ("input_ids", num_ids) if num_ids < num_tokens else ("positions", num_pos)
            raise ValueError(
                f"input_batch.{short} has {rows} rows; it must cover the {num_tokens} scheduled tokens"
            )
        host = self._stage(rows, plan.Lp)
        if num_ids > T or num_pos > T:
            input_ids, positions = input_ids[:num_tokens], positions[:num_tokens]
            num_ids = num_pos = num_tokens
        # the caller's whole (padded) tensors, into views of that size: no slicing per step;
        # rows past num_tokens are never read (padding rows are masked)
        ids, pos = self._id_views.get(num_ids), self._position_views.get(num_pos)
        if ids is None:
            ids = self._prefix("input_ids", self._input_ids, num_ids)
        if pos is None:
            pos = self._prefix("positions", self._positions, num_pos)
        # a `with` of the runtime's null guard costs three Python calls: only entered when set
        if self.runtime.check_host_syncs:
            with self.runtime.guard():
                self._copy_inputs(host, ids, input_ids, pos, positions)
        else:
            self._copy_inputs(host, ids, input_ids, pos, positions)
        self.runtime.run(plan.graph)
        self._plan = plan

    def _copy_inputs(
        self,
        host: np.ndarray,
        ids: torch.Tensor,
        input_ids: torch.Tensor,
        pos: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """The device part of [`partition`][pcp_fn.adapters.vllm.StepGraphs.partition] before the
        graph: the staging copies."""
        if not self._staging.persistent:  # (the CPU's host buffer is the device buffer)
            self._staging.commit(host)
        # two copies, not one _foreach_copy_: for two tensors its dispatch costs more
        ids.copy_(input_ids)
        pos.copy_(positions)

    def _stage(self, rows: tuple[np.ndarray, ...], Lp: int) -> np.ndarray:
        """Pack the step's per-request arrays `rows` (in
        [`STEP`][pcp_fn.adapters.vllm.graphs.STEP]'s row order) and `Lp` into a host buffer,
        checking the values the int32 staging could wrap; returns it."""
        num_scheduled, num_computed, prefill_len, _, idx_mapping = rows
        R, T, n = self.config.max_num_reqs, self.config.max_num_tokens, num_scheduled.size
        # rows past the requests must read zero: a fresh (pinned) buffer is zeroed there; the
        # persistent one (CPU) only where the last step had requests
        packer = self._packer
        if packer is None:
            packer = STEP.packer(self._staging.host(), R)
            packer.pack(n, rows, (n, Lp))
        else:
            packer.pack(n, rows, (n, Lp), self._staged_reqs)
        host = packer.buffer
        self._staged_reqs = n
        # the staged values at once, before anything runs: none negative, no sequence end past
        # int32 (one bitwise-or bounds them all); a wider dtype's values that the int32 staging
        # could wrap are checked whenever they change (vLLM's intp idx_mapping: a steady batch's)
        bound = int(np.bitwise_or.reduce(host[self._checked_words]))
        if bound < 0 or bound > INT32_MAX - T:  # a bad value, or one that may be: named exactly
            arrays = (num_scheduled, num_computed, prefill_len, idx_mapping)
            _, checked, bound = host_int_rows(_FIELDS, arrays)
            check_sequence_ends(checked, bound, "input_batch request {i}'s sequence length")
        if num_computed.itemsize > 4 or prefill_len.itemsize > 4:  # (vLLM's are int32)
            host_int_rows(_FIELDS[1:3], (num_computed, prefill_len))
        if idx_mapping.itemsize > 4:  # vLLM's intp: checked when its bytes change
            key = idx_mapping.tobytes()
            if key != self._idx_checked:
                host_ints(_FIELDS[3], idx_mapping)
                self._idx_checked = key
        return host

    @property
    def checked_idx_bytes(self) -> bytes:
        """The bytes of the last staged `idx_mapping` wider than int32 (vLLM's intp; `b""`
        before one): the step's own after a partition."""
        return self._idx_checked

    def set_slot_mappings(
        self, global_slot_mappings: torch.Tensor, gathered_slot_mappings: torch.Tensor
    ) -> None:
        """The persistent slot-mapping buffers (`[K, T + 1]` and `[K, P*T]`; at construction,
        and again when a manager's block tables are attached later). The graphs never read
        them; the plans' views of the old ones are dropped, so the next step plans again."""
        T = self.config.max_num_tokens
        if global_slot_mappings.shape[-1] != T + 1:
            raise ValueError(
                f"out.global_slot_mappings must be [K, max_num_tokens + 1] = [K, {T + 1}] "
                f"(its last column is the pad column), got {tuple(global_slot_mappings.shape)}"
            )
        global_slot_mappings[:, T] = self.config.pad_slot_id  # (no kernel writes it)
        self.out = self.out._replace(
            global_slot_mappings=global_slot_mappings, gathered_slot_mappings=gathered_slot_mappings
        )
        self.cache.clear()  # the plans hold views of the old slot mappings
        self._plan = None

    @property
    def has_layout(self) -> bool:
        return self._plan is not None

    def current_plan(self) -> StepPlan:
        """The plan of the last partitioned step (`RuntimeError` before the first)."""
        if self._plan is None:
            raise RuntimeError("no batch was partitioned yet")
        return self._plan

    def gathered_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        """`[K, P*Lp]`: the KV slot of each gathered row, `pad_slot_id` where the row must not
        write ([`pcp_fn.mrv2.gathered_slot_mappings`][]), gathered from the persistent global
        slot mappings' first `num_tokens` columns and their pad column (`slot_gather_idx`,
        from the graph) into the persistent gathered slot mappings: one kernel, nothing
        allocated."""
        plan = self.current_plan()
        out = plan.gathered_slots
        if num_tokens == 0:  # vLLM's Lp is 0 then: no gathered row
            return out
        if self.runtime.check_host_syncs:  # (see partition: the null guard is not free)
            with self.runtime.guard():
                torch.index_select(self.out.global_slot_mappings, 1, plan.slot_idx, out=out)
        else:
            torch.index_select(self.out.global_slot_mappings, 1, plan.slot_idx, out=out)
        return out

    def _restore_rows(self, op: str, name: str, gathered: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """`gathered [P*Lp, ...]` (checked) -> its first `num_tokens` rows in global order
        ([`pcp_fn.mrv2.restore_hidden_states`][], only the real rows gathered)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("no batch was partitioned yet")
        rows = self.config.pcp_size * plan.Lp
        if not isinstance(gathered, torch.Tensor) or gathered.dim() == 0 or gathered.shape[0] != rows:
            shape = tuple(gathered.shape) if isinstance(gathered, torch.Tensor) else type(gathered).__name__
            raise ValueError(
                f"{op}: {name} must have {rows} rows (the {self.config.pcp_size} ranks' "
                f"[{rows // self.config.pcp_size}, ...] buffers stacked), got {shape}"
            )
        idx = self._prefix("restore", self.out.hidden_restore_idx, num_tokens)
        # index_select, not vLLM's aten::index: cheaper on the host for a few rows, but slower
        # for hundreds of rows (benchmarks/bench_vllm.py)
        if self.runtime.check_host_syncs:  # (see partition: the null guard is not free)
            with self.runtime.guard():
                return gathered.index_select(0, idx)
        return gathered.index_select(0, idx)

    def restore(self, gathered: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """`[P*Lp, ...] -> [num_tokens, ...]`: all-gathered rows in global token order."""
        if num_tokens == 0:
            return gathered[:0]
        return self._restore_rows("restore_hidden_states", "gathered", gathered, num_tokens)

    def restore_for_sampling(
        self, gathered: torch.Tensor, aux_gathered: Sequence[torch.Tensor] | None, num_tokens: int
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Restore the hidden (and auxiliary) states for sampling, `[num_tokens, ...]` each."""
        if num_tokens == 0:
            return gathered[:0], None if aux_gathered is None else [a[:0] for a in aux_gathered]
        op = "restore_for_sampling"
        hidden = self._restore_rows(op, "hidden_states", gathered, num_tokens)
        if aux_gathered is None:
            return hidden, None
        return hidden, [
            self._restore_rows(op, f"aux_hidden_states[{i}]", a, num_tokens)
            for i, a in enumerate(aux_gathered)
        ]

    def restore_draft_prefill(
        self, last_gathered: torch.Tensor, gathered: torch.Tensor, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both restored; pass the same object twice to restore once (the result is shared)."""
        if num_tokens == 0:
            last = last_gathered[:0]
            return last, last if gathered is last_gathered else gathered[:0]
        op = "restore_draft_prefill"
        last = self._restore_rows(op, "last_hidden_states", last_gathered, num_tokens)
        if gathered is last_gathered:
            return last, last
        return last, self._restore_rows(op, "hidden_states", gathered, num_tokens)

    def draft_input_ids(self, input_ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the drafter's global `input_ids` (int32, at least one row) at this rank's rows
        into `out` (`[Lp]`; padding rows read token 0, like vLLM) and return `out`."""
        state = self.current_plan().view  # this rank's first Lp gathered rows are the bucket's
        if out.shape[0] == 0:
            return out
        F = mrv2.token_rows(self.config, state.bucket)
        k = min(int(input_ids.shape[0]), F)
        with self.runtime.guard():
            self._draft_ids[:k].copy_(input_ids[:k])  # rows past the real tokens are never read
            P, Lp = self.config.pcp_size, state.bucket.num_tokens
            rows = state.layout.padded_gather_idx.view(P, Lp)[self.config.pcp_rank]
            torch.index_select(self._draft_ids[:F], 0, rows[: out.shape[0]], out=out)
        return out
