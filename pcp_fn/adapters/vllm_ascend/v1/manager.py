"""`FunctionalDCSManager`: a drop-in for vllm-ascend 0.23's `PCPManager` (`worker/pcp_utils.py`).

Same constructor, same methods and the attributes `model_runner_v1.py` reads;
the layout is computed by pcp_fn instead of host numpy:

- `init_batch_info` builds the step: the host twin ([`pcp_fn.dcs.host`][], O(R)
  numpy on the runner's arrays) for every value the runner reads on the host,
  and one device step (`pcp_fn.adapters.vllm_ascend.v1._ops.device_step`: `update_tokens`, logits
  indices, attention index tensors, the hybrid index maps), one graph per
  bucket of a ladder made at construction (`pcp_fn.adapters.vllm_ascend.v1._ops.DeviceGraphs`;
  `PCP_FN_GRAPH_BACKEND`, [`pcp_fn.adapters.backend`][]), bound to a
  persistent staging buffer and writing its outputs into the persistent
  buffers (`pcp_fn.adapters.vllm_ascend.v1._buffers`) inside the graph;
- every later call reads the frozen step record (`pcp_fn.adapters.vllm_ascend.v1._record`), those
  buffers, or runs a small pcp_fn op (the padded slot mapping per KV cache
  group, the MTP mask, the spec-decode and multimodal helpers).

The attention metadata, the spec-decode inputs on the runner's and the proposer's
side and the multimodal helpers are four composed objects
(`pcp_fn.adapters.vllm_ascend.v1._metadata.MetadataBuilder`,
`pcp_fn.adapters.vllm_ascend.v1._spec_inputs.SpecInputsBuilder`,
`pcp_fn.adapters.vllm_ascend.v1._spec_proposer.Proposer`,
`pcp_fn.adapters.vllm_ascend.v1._multimodal.Multimodal`), each given what it reads at construction
(the settings, the buffers, the graphs, the record cell...); the manager's methods of those names
forward to them.

Call order (the runner's `_prepare_inputs` / `_build_attention_metadata` /
`execute_model`): `init_batch_info` -> `generate_pcp_mtp_input` (spec
decode) -> `update_tokens_for_pcp` -> `rebuild_async_spec_decode_inputs` ->
`get_logits_indices` (or the runner's spec metadata with
`num_pcp_pads_cpu` and `adjust_cu_num_scheduled_tokens_for_pcp`) ->
`get_padded_slot_mapping` per KV cache group -> `generate_pcp_metadata` ->
forward -> `get_restore_hidden_states` -> the proposer's helpers. A
`_dummy_run` (graph capture, and the runs between steps) calls
`init_batch_info` -> `get_padded_slot_mapping` -> `generate_pcp_metadata`
without `update_tokens_for_pcp`: its metadata is the real step's of the dummy batch.

Differences from vllm-ascend's `PCPManager` (docs/adapters/vllm-ascend.md's deviation
table): the restore index and metadata index tensors are views of device buffers built by pcp_fn (the
host `.np` copies are not kept); `pcp_unpad_mask` in the metadata is the
device mask; the MTP attention mask is the interleave-aware one (with the
reference's buffer semantics: rows it does not recompute keep their last values).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from ....core.checks import INT32_MAX, host_row, same_ints
from ....core.seqlens import cp_local_seq_lens
from ....dcs import host as dcs_host
from ....hybrid.host import HybridHostLayout
from ....protocol.batch import classify_decodes
from ....sim.trace import EngineInfo
from ...backend import GraphStats, default_graph_backend, package_cache_dir, resolve_graph_backend
from ...recording import TraceRecorder, is_recording_process, record_path
from . import _buffers, _ops
from ._metadata import MetadataBuilder
from ._multimodal import Multimodal
from ._parts import ManagerParts
from ._record import ManagerRecord, RecordCell
from ._settings import ManagerSettings, read_settings
from ._spec_inputs import AsyncRebuildArgs, PCPAsyncSpecDecodeRebuildResult, SpecInputsBuilder
from ._spec_proposer import PCPSpecDecodeFirstPassInputs, PCPSpecDecodeMTPInputs, Proposer
from .engine_types import AscendCommonAttentionMetadata, DeviceEvent, DraftAttentionMetadata, NPUInputBatch

if TYPE_CHECKING:  # the vLLM objects' protocols, for annotations only (no other adapter imported)
    from ...vllm.engine_types import (
        CachedRequestState,
        CpuGpuBuffer,
        SchedulerOutput,
        SupportsMultiModalPruning,
        VllmConfig,
    )


def _pcp_all_gather(x: torch.Tensor) -> torch.Tensor:
    from vllm.distributed.parallel_state import get_pcp_group

    return get_pcp_group().all_gather(x, 0)


def graph_backend(capture: bool | None, compile_backend: str | None, device: torch.device) -> str | None:
    """The backend of the manager's graphs (`None`: plain calls).

    `capture` / `compile_backend` given: `capture=False` plain calls; `capture=True`
    graphs with `compile_backend` (default `"inductor"`: device graphs on CUDA / NPU,
    `torch.compile` on the CPU); `compile_backend` alone that backend. Neither:
    `$PCP_FN_GRAPH_BACKEND` ([`pcp_fn.adapters.backend.resolve_graph_backend`][]: `auto`,
    the default, captures device graphs on CUDA / NPU and makes plain calls on the CPU).
    """
    if capture is False:
        return None
    if capture is True:
        return compile_backend or "inductor"
    if compile_backend is not None:
        return compile_backend
    return resolve_graph_backend(default_graph_backend(), device)


def _device_graphs(
    config: _ops.PCPConfig, device: torch.device, b: _buffers.Buffers, backend: str | None, check_syncs: bool
) -> _ops.DeviceGraphs:
    """The manager's graphs (all made here), bound to its persistent buffers."""
    return _ops.DeviceGraphs(
        config,
        device,
        step_out=b.step,
        query_lens=b.query_lens_pcp_full.gpu,
        slot_group=b.first_padded_slot_mapping,
        slots_in=b.slots_in,
        computed_in=b.computed_in,
        mtp_mask=None if b.dcp_mtp_attn_mask is None else b.dcp_mtp_attn_mask.gpu,
        mtp_cells=b.mtp_mask_cells,
        backend=backend,
        check_syncs=check_syncs,
        package_dir=package_cache_dir() if backend == "aoti" else None,
    )


def _host_field(name: str) -> property:
    """A count of the last `init_batch_info`'s host twin (`0` before the first)."""

    def get(self: FunctionalDCSManager) -> int:
        host = self._records.current.host
        return 0 if host is None else getattr(host, name)

    return property(get)


def _hybrid_field(name: str) -> property:
    """A count of the last `update_tokens_for_pcp`'s hybrid split (`0` without hybrid attention)."""

    def get(self: FunctionalDCSManager) -> int:
        u = self._hybrid_update()
        return 0 if u is None else getattr(u, name)

    return property(get)


class FunctionalDCSManager:
    """vllm-ascend 0.23 `PCPManager` on pcp_fn (DualChunkSwap; hybrid attention; spec decode).

    The constructor takes vllm-ascend's `PCPManager` arguments, in its order (up to
    `use_sparse`), then keyword-only additions; `vllm_config` is read once
    (`pcp_fn.adapters.vllm_ascend.v1._settings`).

    Args:
        pcp_world_size: `P`, the PCP group's size.
        pcp_rank: this rank of the PCP group.
        dcp_world_size: decode context-parallel ranks.
        dcp_rank: this rank's decode context-parallel rank.
        max_buffer_num_tokens: the runner's token buffer size (`T + 2 * P * R`).
        max_num_reqs: `R`, requests per step.
        device: where the buffers and the graphs live (an NPU, a CUDA device or the CPU).
        vllm_config: vLLM's `VllmConfig`, or any object with the attributes it reads:
            the speculative config, `T` and `R` from the scheduler config, the model type
            (hybrid attention) and `max_model_len`, the KV interleave size. A `unittest.mock`
            attribute (vllm-ascend's unit tests build configs from `MagicMock()`) is read as
            vllm-ascend's class reads it (`pcp_fn.adapters.vllm_ascend.v1._settings`): `R` and `T`
            from `max_num_reqs` and `max_buffer_num_tokens`, the calls that need the interleave
            size refuse a mock one; a real value out of range is a `ValueError` naming the field.
        use_async_scheduling: the runner schedules asynchronously (the spec-decode positions
            are rebuilt on the device).
        pin_memory: pin the host staging buffers (on a graph device).
        use_sparse: vllm-ascend's sparse-attention flag (kept in the settings).
        capture: `True`: one graph per bucket with
            [`pcp_fn.graph.capture`][pcp_fn.graph.capture.capture] (`torch.npu.NPUGraph` on
            an NPU, `torch.cuda.CUDAGraph` on CUDA, `torch.compile(backend=compile_backend)`
            elsewhere); `False`: plain calls. With `compile_backend`, it overrides
            `$PCP_FN_GRAPH_BACKEND`
            ([`graph_backend`][pcp_fn.adapters.vllm_ascend.v1.manager.graph_backend]). Every
            graph is made here, for every bucket of the ladder
            ([`graph_stats`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager.graph_stats]),
            never at a step.
        compile_backend: the graphs' backend (see `capture`); `"aoti"`: AOTInductor packages
            cached in `$PCP_FN_CACHE_DIR`.
        check_syncs: run every device-path call under [`pcp_fn.no_host_syncs`][].
        request_buckets: the ladder's request-row sizes: each token bucket gets `min(L_b, R)`
            request rows, rounded up to one of these when given.
        token_buckets: the ladder's token sizes (default: powers of two from 16 up to the
            local capacity).
        all_gather: `x -> all_gather(x, dim 0)` over the PCP group; default
            vLLM's `get_pcp_group().all_gather` (imported when first used).
        record_schedule: record every step's counts (`init_batch_info`) to this trace file
            (default `$PCP_FN_RECORD_SCHEDULE`; [`pcp_fn.adapters.recording`][]): it replays
            through `pcp_fn.step`, the functions this manager's graphs run.

    Raises:
        ValueError: a bad constructor field, or (from `init_batch_info`) counts
            that are not 1-D integers, negative, beyond `max_num_reqs` /
            `max_num_batched_tokens`; the message names the field and the limit.
    """

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        dcp_world_size: int,
        dcp_rank: int,
        max_buffer_num_tokens: int,
        max_num_reqs: int,
        device: torch.device | str,
        vllm_config: VllmConfig,
        use_async_scheduling: bool,
        pin_memory: bool = False,
        use_sparse: bool = False,
        *,
        capture: bool | None = None,
        compile_backend: str | None = None,
        check_syncs: bool = False,
        request_buckets: Sequence[int] | None = None,
        token_buckets: Sequence[int] | None = None,
        all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
        record_schedule: str | os.PathLike[str] | None = None,
    ) -> None:
        s = read_settings(
            vllm_config,
            device,
            pcp=(pcp_world_size, pcp_rank),
            dcp=(dcp_world_size, dcp_rank),
            max_buffer_num_tokens=max_buffer_num_tokens,
            max_num_reqs=max_num_reqs,
            use_async_scheduling=use_async_scheduling,
            pin_memory=pin_memory,
            use_sparse=use_sparse,
        )
        self.settings = s
        self.config = config = _ops.make_config(s, request_buckets, token_buckets)
        self.device = s.device
        self._buffers = b = _buffers.allocate(
            s, _ops.output_capacities(config), _ops.gathered_capacity(config)
        )
        backend = graph_backend(capture, compile_backend, s.device)
        self._graphs = graphs = _device_graphs(config, s.device, b, backend, check_syncs)
        # rows of each padded slot mapping past which it holds -1 (the graphs write the bucket's)
        self._slots_dirty = [b.padded_slot_capacity if backend is not None else 0]
        self._pads: tuple[dcs_host.HostLayout | None, np.ndarray] = (
            None,
            np.zeros(s.max_num_reqs, dtype=np.int64),
        )  # (its update, it)
        self._records = records = RecordCell(ManagerRecord(state=_ops.init_state(config, s.device)))
        self._all_gather = all_gather or _pcp_all_gather
        self._views = views = _buffers.ViewCache()  # shared with the metadata builder
        parts = ManagerParts(
            s,
            config,
            b,
            graphs,
            records,
            views,
            cpu_state=_ops.init_state(config, "cpu"),  # the ops reading the CPU token table
            # the ops tied to no step (any length up to the capacity): the capacity bucket's rows
            capacity_state=_ops.init_state(config, s.device),
        )
        self._metadata = MetadataBuilder(parts)
        self._spec_inputs = SpecInputsBuilder(parts)
        self._proposer = Proposer(parts)
        self._multimodal = Multimodal(records)
        self._expose(s, vllm_config, b)
        self.recorder = self._recorder(record_path(record_schedule))

    def _recorder(self, path: str | None) -> TraceRecorder | None:
        """This process's [`TraceRecorder`][pcp_fn.adapters.recording.TraceRecorder], when asked
        for one and this is the recording process (the global rank 0)."""
        if path is None or not is_recording_process(self.settings.pcp_rank):
            return None
        ascend = sys.modules.get("vllm_ascend")
        version = getattr(ascend, "__version__", None) or "0.23"
        return TraceRecorder(path, self.config, EngineInfo("vllm-ascend", str(version), type(self).__name__))

    def _expose(self, s: ManagerSettings, vllm_config: VllmConfig, b: _buffers.Buffers) -> None:
        """The constants and persistent buffers the reference exposes, under its names."""
        self.pcp_world_size, self.pcp_world_rank = s.pcp_size, s.pcp_rank
        self.dcp_world_size, self.dcp_world_rank = s.dcp_size, s.dcp_rank
        self.speculative_config = vllm_config.speculative_config
        self.decode_threshold = s.decode_threshold
        self.max_num_tokens, self.max_num_reqs = s.max_num_tokens, s.max_num_reqs
        self.use_async_scheduling, self.use_sparse = s.use_async_scheduling, s.use_sparse
        self.pcp_use_hybrid_attn = s.hybrid_attn
        self.pd_decode_recompute_scheduler_enabled = s.pd_decode_recompute
        self.pcp_padded_slot_mapping_list = b.padded_slot_mappings
        self.query_lens_pcp_full = b.query_lens_pcp_full
        self.input_ids_pcp_full = b.input_ids_pcp_full
        self.query_start_loc_pcp_full = b.query_start_loc_pcp_full
        self.positions_pcp_full = b.positions_pcp_full
        self.positions_pcp_full_np = (
            None if self.positions_pcp_full is None else self.positions_pcp_full.numpy()
        )
        self.dcp_mtp_attn_mask = b.dcp_mtp_attn_mask
        step = b.step
        self.pcp_allgather_restore_idx = _buffers.DeviceBuffer.of(step["restore"])
        self.pcp_unpad_mask = step["unpad_mask"]
        self.logits_indices_gpu = step["logits"]
        self.pcp_enter_fa_restore_idx = step.get("enter")
        self.pcp_fa_padding_restore_idx = step.get("fa_padding")
        self.pcp_fa_query_idx = step.get("fa_query")
        self.pcp_exit_fa_scatter_idx = _buffers.DeviceBuffer.of(step["exit"]) if "exit" in step else None

    # ---------------------------------------------------------------- step record views
    @property
    def num_graphs(self) -> int:
        """Device graphs made (at construction: one per function and bucket of the ladder)."""
        return self._graphs.num_graphs

    @property
    def graphs(self) -> _ops.DeviceGraphs:
        """The device graphs, all made at construction (their ladder, rungs and runtime): for
        inspection, like the vLLM drop-in's `bookkeeper.graphs`."""
        return self._graphs

    def persistent_buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent tensor by name (allocated once; their `data_ptr()`s never change):
        the device step's outputs by their keys (`restore`, `unpad_mask`, `logits`, the
        attention index tensors, ...), the staging buffers, each KV-cache group's padded slot
        mapping, and the spec-decode buffers under vllm-ascend's attribute names."""
        b = self._buffers
        named = dict(b.step)
        named["slots_in"], named["computed_in"] = b.slots_in, b.computed_in
        named["padded_slot_mapping_0"] = b.first_padded_slot_mapping  # bound to the graphs
        named.update({f"padded_slot_mapping_{i}": t for i, t in enumerate(b.padded_slot_mappings) if i})
        # the host and device halves under vllm-ascend's names (the last two: spec decode with CP)
        for name in ("query_lens_pcp_full", "input_ids_pcp_full", "query_start_loc_pcp_full"):
            buffer = getattr(b, name)
            if buffer is not None:
                named[f"{name}.cpu"], named[f"{name}.gpu"] = buffer.cpu, buffer.gpu
        if b.dcp_mtp_attn_mask is not None:
            named["dcp_mtp_attn_mask.gpu"] = b.dcp_mtp_attn_mask.gpu
        spec = {
            "positions_pcp_full": b.positions_pcp_full,
            "mtp_slot_pad": b.mtp_slot_pad,
            "mtp_mask_cells": b.mtp_mask_cells,
        }
        named.update({name: t for name, t in spec.items() if t is not None})
        return named

    @property
    def record(self) -> ManagerRecord:
        """The frozen record of the last call (read-only)."""
        return self._records.current

    @property
    def graph_stats(self) -> GraphStats:
        """Graphs prepared at construction and their time (`loaded`: AOTInductor packages found
        in the cache), steps, steps run eagerly for want of a graph (`fallbacks`)."""
        return self._graphs.stats

    num_reqs = _host_field("num_reqs")
    num_decode_reqs = _host_field("num_decode_reqs")
    num_prefill_reqs = _host_field("num_prefill_reqs")
    num_decode_tokens = _host_field("num_decode_tokens")

    @property
    def decode_req_mask(self) -> np.ndarray | None:
        host = self._records.current.host
        return None if host is None else host.is_decode.copy()

    @property
    def num_pcp_pads_cpu(self) -> np.ndarray:
        """`[R]` int64 pads per request of the last `update_tokens_for_pcp`, zero past its requests:
        one persistent array, like vllm-ascend's attribute (written when first read after an update;
        the runner reads it per KV cache group)."""
        u, (last, out) = self._records.current.updated, self._pads
        if last is not u:
            n = 0 if u is None else u.num_reqs
            if u is not None:
                out[:n] = u.num_pads
            out[n : max(n, 0 if last is None else last.num_reqs)] = 0
            self._pads = (u, out)
        return out

    @property
    def pcp_tokens(self) -> np.ndarray:
        """`[R]` int32 DualChunkSwap rows per request of the last update."""
        out = np.zeros(self.max_num_reqs, dtype=np.int32)
        u = self._records.current.updated
        if u is not None:
            out[: u.pcp_tokens.shape[0]] = u.pcp_tokens
        return out

    @property
    def num_scheduled_tokens_padded(self) -> np.ndarray | None:
        """`[n]` int32: the scheduled counts after `init_batch_info`; the DualChunkSwap rows
        per request after `update_tokens_for_pcp` (with hybrid attention the FA query lengths)."""
        h, u = self._records.current.host, self._records.current.updated
        if h is None:
            return None
        return (u.pcp_tokens if u is h else h.num_scheduled).copy()

    @property
    def pcp_tokens_padded(self) -> np.ndarray | None:
        u = self._records.current.updated
        return None if u is None or not self.pcp_use_hybrid_attn else u.pcp_tokens.copy()

    @property
    def pcp_padded_tokens_length(self) -> int:
        """Rows of the padded gathered order of the last update (`P * N`)."""
        u = self._records.current.updated
        return 0 if u is None else self.pcp_world_size * u.num_tokens

    @property
    def total_num_sampled_tokens_pcp(self) -> int:
        """Local tokens of the last update (with hybrid attention: the scheduled tokens)."""
        u = self._records.current.updated
        if u is None:
            return 0
        return int(u.num_scheduled.sum()) if self.pcp_use_hybrid_attn else u.num_tokens

    def _hybrid_update(self) -> HybridHostLayout | None:
        u = self._records.current.updated
        return u if self.pcp_use_hybrid_attn and u is not None else None

    max_num_tokens_across_pcp = _hybrid_field("max_tokens_across_pcp")
    pcp_padded_tokens_fla = _hybrid_field("padded_tokens_fla")
    total_pcp_padding_tokens_fla = _hybrid_field("total_padding_tokens_fla")
    total_num_scheduled_tokens = _hybrid_field("num_linear_tokens")

    @property
    def num_actual_tokens_pcp_padded(self) -> int:
        return self._records.current.num_actual_tokens_pcp_padded

    @property
    def long_seq_metadata(self) -> Any:
        return self._records.current.long_seq_metadata

    # ---------------------------------------------------------------- spec-decode record views
    @property
    def mtp_slot_pad(self) -> torch.Tensor | None:
        """`[M * P]` int32 MTP slot mapping last built (token-strided; a view of a persistent buffer)."""
        return self._buffers.mtp_slot_view(self._records.current.mtp_rows, self.pcp_world_size)

    @property
    def cu_num_tokens_pcp_full(self) -> np.ndarray | None:
        return self._records.current.cu_num_tokens_pcp_full

    @property
    def async_rebuild_req_indices_full(self) -> np.ndarray | None:
        full = self._records.current.async_full
        return None if full is None else full.req_indices

    @property
    def async_rebuild_cu_num_tokens_full(self) -> np.ndarray | None:
        full = self._records.current.async_full
        return None if full is None else full.cu_num_tokens

    @property
    def async_rebuild_num_tokens_full(self) -> int:
        full = self._records.current.async_full
        return 0 if full is None else full.num_tokens

    # ---------------------------------------------------------------- the step
    def classify_decode_request_mask(
        self,
        num_scheduled_tokens: npt.ArrayLike,
        num_computed_tokens: npt.ArrayLike,
        num_prompt_tokens: npt.ArrayLike,
        decode_threshold: int,
    ) -> np.ndarray:
        """vllm-ascend `classify_decode_request_mask` (numpy)."""
        s = dataclasses.replace(self.settings, num_spec_tokens=decode_threshold - 1)
        return classify_decodes(
            s,
            np.asarray(num_scheduled_tokens),
            np.asarray(num_computed_tokens),
            np.asarray(num_prompt_tokens),
        )

    def init_batch_info(
        self,
        num_scheduled_tokens: np.ndarray,
        num_reqs: int,
        num_computed_tokens: np.ndarray,
        num_prompt_tokens: np.ndarray,
    ) -> None:
        """Start a step: the host twin, the staged batch and the device step.

        The arrays are the runner's (decodes first); only their first `num_reqs`
        entries are read and nothing keeps a reference to them.
        """
        if isinstance(num_reqs, bool) or not isinstance(num_reqs, (int, np.integer)) or num_reqs < 0:
            raise ValueError(f"num_reqs must be an int >= 0, got {num_reqs!r}")
        if num_reqs > self.max_num_reqs:
            raise ValueError(f"num_reqs={num_reqs} exceeds max_num_reqs={self.max_num_reqs}")
        n = int(num_reqs)
        sched = host_row("num_scheduled_tokens", num_scheduled_tokens, n, longer_ok=True, integers=True)
        computed = host_row("num_computed_tokens", num_computed_tokens, n, longer_ok=True, integers=True)
        prompt = host_row("num_prompt_tokens", num_prompt_tokens, n, longer_ok=True, integers=True)
        twin = HybridHostLayout if self.settings.hybrid_attn else dcs_host.HostLayout
        h = dcs_host.host_layout(self.settings, sched, computed, prompt, self._records.current.host, twin)
        # make_batch's checks from the counts' bound; make_batch itself names a bad field
        if h.bound < 0 or 2 * h.bound > INT32_MAX or h.total_scheduled > self.max_num_tokens:
            _ops.make_batch(self.config, h, "cpu")
        graphs = self._graphs
        rung = graphs.rung_for(n, h.num_tokens)
        staged = graphs.stage(h)
        graphs.step(rung)
        # query_lens_pcp_full: the scheduled tokens, zero past them (the step writes its device half)
        self._buffers.query_lens_pcp_full.np[:] = staged
        self._records.set(state=rung.state, host=h, batch=rung.batch)
        if self.recorder is not None:  # the step accepted: the runner's counts, decodes first
            self.recorder.record(sched, computed, prompt)

    def update_tokens_for_pcp(
        self, num_scheduled_tokens: np.ndarray, arange_np: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(tokens per request on this rank [n] int32, local positions)` of the step.

        DualChunkSwap: `pcp_tokens` and the int32 offsets of the local rows;
        hybrid attention: the linear split's counts and int64 offsets. `arange_np`
        is accepted for the reference's signature and not needed.
        """
        h = self._records.host()
        given = np.asarray(num_scheduled_tokens)
        if given.ndim != 1 or not same_ints(given, h.num_scheduled):
            raise ValueError(
                "num_scheduled_tokens passed to update_tokens_for_pcp differs from init_batch_info's "
                f"({given.tolist()} vs {h.num_scheduled.tolist()})"
            )
        self._records.set(updated=h)
        if self.pcp_use_hybrid_attn:
            return h.linear_tokens.copy(), h.linear_rows.copy()
        return h.pcp_tokens.copy(), h.dcs_rows.copy()  # copies: the layout's are shared

    def get_logits_indices(
        self, cu_num_tokens: np.ndarray, num_reqs: int, tokens_original: list[int] | None = None
    ) -> torch.Tensor:
        """`[num_reqs]` int64 CPU tensor of restored rows to sample (the runner pins and copies it).

        The same rows are on the device in `logits_indices_gpu` (hybrid form with hybrid attention).
        """
        h = self._records.host()
        hybrid_form = self.pcp_use_hybrid_attn and tokens_original is not None
        logits = h.logits_hybrid if hybrid_form else h.logits  # shared: the caller gets a copy
        return torch.from_numpy(logits[:num_reqs].copy())

    def adjust_cu_num_scheduled_tokens_for_pcp(
        self, cu_num_scheduled_tokens: np.ndarray, num_pcp_pads: np.ndarray
    ) -> np.ndarray:
        """Hybrid-attention spec decode: cumulative tokens in the restored FA order (numpy)."""
        return dcs_host.adjust_cu(self._records.host(), cu_num_scheduled_tokens)

    def initialize_slot_mapping(self) -> None:
        """One padded slot mapping buffer per KV cache group (allocated once; the first up front,
        its graphs made at construction, the others' made here)."""
        buf = _buffers.new_padded_slot_mapping(self._buffers, self.device)
        if len(self._buffers.padded_slot_mappings) > 1:
            self._graphs.add_slot_group(buf)  # runs its graphs once: rows may hold slots
            self._slots_dirty.append(0 if self._graphs.backend is None else buf.shape[0])

    def get_padded_slot_mapping(
        self, num_tokens: int, num_tokens_padded: int, slot_mapping: torch.Tensor, kv_cache_group_id: int
    ) -> torch.Tensor:
        """The group's padded slot mapping: `[num_tokens_padded * P]` int32 (pad rows -1), at most
        `max_buffer_num_tokens` rows (the runner's size for it).

        `slot_mapping` holds the step's slots in scheduler order (the runner
        passes exactly `sum(num_scheduled_tokens)`; only those are read).
        """
        rec = self._records.current
        if rec.batch is None:
            raise RuntimeError("init_batch_info must run before get_padded_slot_mapping")
        if not 0 <= kv_cache_group_id < len(self._buffers.padded_slot_mappings):
            raise ValueError(
                f"kv_cache_group_id={kv_cache_group_id} has no buffer; "
                f"initialize_slot_mapping ran {len(self._buffers.padded_slot_mappings)} times"
            )
        buf = self._buffers.padded_slot_mappings[kv_cache_group_id]
        bucket, h = rec.batch.bucket, rec.host
        rows = self.pcp_world_size * bucket.num_tokens  # what the graph writes
        # the step's slots staged in scheduler order (rows past them are never read)
        count = min(int(slot_mapping.shape[0]), h.total_scheduled)
        staging = self._buffers.slots_in
        with self._graphs.guard():
            # (views reused: a steady batch stages the same count each step)
            src = slot_mapping if slot_mapping.shape[0] == count else slot_mapping[:count]
            self._views.view("slots_in", staging, count).copy_(src)
            if count < h.total_scheduled:
                staging[count : h.total_scheduled].fill_(self.config.pad_slot_id)
            dirty = self._slots_dirty[kv_cache_group_id]
            if dirty > rows:  # a larger bucket wrote rows the runner may read padded: -1 again
                buf[rows:dirty].fill_(-1)
        self._slots_dirty[kv_cache_group_id] = rows
        self._graphs.padded_slots(kv_cache_group_id)  # at the step's rung (bucket)
        u = self._hybrid_update()
        if u is not None and self.total_num_sampled_tokens_pcp == num_tokens_padded:
            length = u.num_tokens * self.pcp_world_size
        else:
            length = num_tokens_padded * self.pcp_world_size
        # the runner sizes this buffer max_buffer_num_tokens (T + 2PR >= every step's P * N real rows)
        return self._views.view(
            ("slots", kv_cache_group_id), buf, min(length, self.settings.max_buffer_num_tokens)
        )

    def get_restore_hidden_states(
        self, hidden_states: torch.Tensor, num_input_tokens: int | None = None
    ) -> torch.Tensor:
        """All-gather the ranks' hidden states and put them in request order.

        DualChunkSwap: the first `num_input_tokens` rows (default this step's
        local tokens) are gathered and reordered by the restore index. Hybrid
        attention: the linear rows, padded to `M` per rank, are gathered and
        reordered into the compact full-attention input.
        """
        P = self.pcp_world_size
        u = self._hybrid_update()
        if u is None:
            local = (
                num_input_tokens if num_input_tokens is not None else self.num_actual_tokens_pcp_padded // P
            )
            gathered = self._all_gather(hidden_states[:local])
            index = self._views.view("restore", self.pcp_allgather_restore_idx.gpu, gathered.shape[0])
            return torch.index_select(gathered, 0, index)
        if num_input_tokens is not None:
            hidden_states = hidden_states[:num_input_tokens]
        if hidden_states.shape[0] == u.num_linear_tokens and u.padded_tokens_fla > 0:
            hidden_states = F.pad(hidden_states, (0, 0, 0, u.padded_tokens_fla))
        if u.max_tokens_across_pcp > 0:
            hidden_states = hidden_states[: u.max_tokens_across_pcp]
        gathered = self._all_gather(hidden_states.contiguous())
        assert self.pcp_enter_fa_restore_idx is not None
        index = self.pcp_enter_fa_restore_idx[: gathered.shape[0] - u.total_padding_tokens_fla]
        return torch.index_select(gathered, 0, index)

    def _get_cp_local_seq_lens(
        self,
        seq_lens: torch.Tensor,
        pcp_world_size: int = 1,
        dcp_world_size: int = 1,
        cp_kv_cache_interleave_size: int = 1,
    ) -> torch.Tensor:
        """vllm-ascend's `_get_cp_local_seq_lens`: `[n] -> [n, pcp_world_size, dcp_world_size]`, the
        KV tokens of each sequence each CP rank holds, in `seq_lens`' dtype and device
        ([`pcp_fn.cp_local_seq_lens`][]; the sizes are the arguments, not the manager's)."""
        lens = cp_local_seq_lens(seq_lens, pcp_world_size, dcp_world_size, cp_kv_cache_interleave_size)
        return lens.reshape(-1, pcp_world_size, dcp_world_size)

    # ---------------------------------------------------------------- attention metadata (MetadataBuilder)
    def generate_pcp_metadata(
        self,
        total_num_scheduled_tokens: int,
        query_lens: torch.Tensor,
        input_batch: NPUInputBatch,
        num_scheduled_tokens: np.ndarray | None,
        block_table_tensor: torch.Tensor,
        num_reqs_padded: int,
        num_reqs: int,
        fixed_decode_seq_lens_cpu: np.ndarray | None = None,
    ) -> tuple[Any, torch.Tensor]:
        """vllm-ascend's `AscendPrefillContextParallelMetadata` of the step, and the block table.

        Reads `input_batch.num_computed_tokens_cpu` (the context of the
        prefills, and of the decodes without `fixed_decode_seq_lens_cpu`).
        Device fields are views of the manager's persistent buffers.

        `query_lens` (host) must hold the step's local token counts per request
        (`update_tokens_for_pcp`'s, or `num_scheduled_tokens_padded` with hybrid
        attention), as the runner passes them. In a `_dummy_run`
        (`init_batch_info` without `update_tokens_for_pcp`; the runner then passes
        the dummy batch's own counts, checked against them, and runs that batch
        through the model unsplit) the index tensors and lists are vllm-ascend's
        over those counts taken as each request's local rows (a graph captured
        there sees what a real step with that many local rows sees), and
        `num_actual_tokens_pcp_padded` is `P * total_num_scheduled_tokens`; the
        unpad mask, restore index and hybrid index fields are views of the dummy
        batch's own step. Before the first `init_batch_info`: the empty step's
        metadata (no request).

        Raises:
            ValueError: `query_lens` (or `num_scheduled_tokens`) missing, or not those counts.
        """
        return self._metadata.generate(
            total_num_scheduled_tokens,
            query_lens,
            input_batch,
            num_scheduled_tokens,
            num_reqs_padded,
            num_reqs,
            fixed_decode_seq_lens_cpu,
        ), block_table_tensor

    # ------------------------------------------------------------ runner-side spec decode (SpecInputsBuilder)
    def generate_pcp_mtp_input(
        self,
        total_num_scheduled_tokens: int,
        num_scheduled_tokens: dict[str, int],
        with_prefill: bool = True,
        input_batch: NPUInputBatch | None = None,
        arange_np: np.ndarray | None = None,
        req_indices: np.ndarray | None = None,
        positions_np: np.ndarray | None = None,
        cu_num_tokens: np.ndarray | None = None,
        draft_token_ids: torch.Tensor | None = None,
        scheduler_output: SchedulerOutput | None = None,  # (vllm-ascend's signature; not read)
        num_spec_tokens: int | None = None,
        precomputed_positions_np: np.ndarray | None = None,
        prev_positions: torch.Tensor | None = None,
    ) -> None:
        """Record the scheduler-order (pre-split) inputs the drafter shifts.

        Fills `input_ids_pcp_full` (`.cpu` and `.gpu`), `query_start_loc_pcp_full`
        and `positions_pcp_full` from `input_batch.token_ids_cpu_tensor` and
        `input_batch.num_computed_tokens_cpu` (or `precomputed_positions_np`);
        under async scheduling repairs the ids with the previous step's tokens;
        with `k >= 2` builds `mtp_slot_pad` through
        `input_batch.block_table.compute_slot_mapping_draft` (decode-only batches,
        or DCP-only prefills, as the reference).
        """
        self._spec_inputs.generate(
            total_num_scheduled_tokens,
            num_scheduled_tokens,
            with_prefill,
            input_batch,
            req_indices,
            cu_num_tokens,
            draft_token_ids,
            precomputed_positions_np,
            prev_positions,
        )

    def rebuild_async_spec_decode_inputs(
        self,
        *,
        use_async_spec_decode: bool,
        valid_sampled_token_count_gpu: torch.Tensor | None,
        prev_req_id_to_index: dict[str, int] | None,
        prev_positions_gpu: torch.Tensor | None,
        with_prefill: bool,
        enable_prompt_embeds: bool,
        has_req_prompt_embeds: bool,
        supports_mm_inputs: bool,
        num_reqs: int,
        total_num_scheduled_tokens: int,
        req_indices: np.ndarray,
        req_indices_gpu: torch.Tensor,
        position_pcp: np.ndarray | None,
        query_pos_gpu: torch.Tensor,
        query_pos_np: np.ndarray,
        positions: torch.Tensor,
        positions_np: np.ndarray,
        num_computed_tokens: torch.Tensor,
        num_computed_tokens_cpu: np.ndarray,
        prev_positions_np: np.ndarray,
        prev_num_draft_tokens_np: np.ndarray,
        valid_sampled_token_count_event: DeviceEvent | None,
        valid_sampled_token_count_cpu: torch.Tensor | None,
        input_batch: NPUInputBatch,
        input_ids: CpuGpuBuffer,
        scheduler_output: SchedulerOutput,
        arange_np: np.ndarray,
        cu_num_tokens: np.ndarray,
        draft_token_ids: torch.Tensor | None,
        num_spec_tokens: int,
        prepare_input_ids: Callable[[SchedulerOutput, int, int, np.ndarray], None],
    ) -> PCPAsyncSpecDecodeRebuildResult:
        """Recompute positions (and the drafter's inputs) once async scheduling corrected `num_computed`.

        Device branch (decode-only, no embeds or multimodal inputs):
        `spec.rebuild_spec_positions` on the corrected `num_computed_tokens`
        writes `positions` and rebuilds `mtp_slot_pad` (through
        `compute_slot_mapping_draft`), then hands the scheduler-order positions
        to `input_batch.block_table.compute_slot_mapping`, so the block table's
        `slot_mapping.gpu` ends with the main model's slots. Host branch: corrects
        the counts with vllm-ascend's `correct_optimistic_seq_lens_cpu`, refills the runner's host positions
        and input ids, and calls
        [`generate_pcp_mtp_input`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager.generate_pcp_mtp_input]
        again.
        """
        return self._spec_inputs.rebuild(
            AsyncRebuildArgs(
                use_async_spec_decode=use_async_spec_decode,
                valid_sampled_token_count_gpu=valid_sampled_token_count_gpu,
                prev_req_id_to_index=prev_req_id_to_index,
                prev_positions_gpu=prev_positions_gpu,
                with_prefill=with_prefill,
                enable_prompt_embeds=enable_prompt_embeds,
                has_req_prompt_embeds=has_req_prompt_embeds,
                supports_mm_inputs=supports_mm_inputs,
                num_reqs=num_reqs,
                total_num_scheduled_tokens=total_num_scheduled_tokens,
                positions=positions,
                positions_np=positions_np,
                num_computed_tokens=num_computed_tokens,
                num_computed_tokens_cpu=num_computed_tokens_cpu,
                prev_positions_np=prev_positions_np,
                prev_num_draft_tokens_np=prev_num_draft_tokens_np,
                valid_sampled_token_count_event=valid_sampled_token_count_event,
                valid_sampled_token_count_cpu=valid_sampled_token_count_cpu,
                input_batch=input_batch,
                input_ids=input_ids,
                scheduler_output=scheduler_output,
                cu_num_tokens=cu_num_tokens,
                draft_token_ids=draft_token_ids,
                prepare_input_ids=prepare_input_ids,
            )
        )

    # ---------------------------------------------------------------- proposer-side spec decode (Proposer)
    def get_spec_decode_decode_hidden_states(
        self,
        target_hidden_states_d_padded: torch.Tensor,
        num_decode_reqs: int,
        num_decode_tokens: int | None = None,
    ) -> torch.Tensor:
        """The decode tokens' rows of the restored hidden states (rank 0's copy of each)."""
        return self._proposer.decode_hidden_states(target_hidden_states_d_padded, num_decode_tokens)

    def prepare_spec_decode_first_pass_inputs(
        self,
        input_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        token_indices_to_sample: torch.Tensor,
        common_attn_metadata: AscendCommonAttentionMetadata,
        long_seq_metadata: object | None,  # generate_pcp_metadata's: set on common_attn_metadata
        req_scheduled_tokens: dict[str, int] | None,
        req_ids: list[str],
        logits_indices: torch.Tensor,
        num_tokens: int,
        num_prefill_reqs: int,
        num_decode_reqs: int,
        uses_mrope: bool,
    ) -> PCPSpecDecodeFirstPassInputs:
        """This rank's first draft pass: its own rows of the scheduler-order ids and restored hidden states.

        As the reference, it sets `common_attn_metadata.prefill_context_parallel_metadata`,
        rewrites `token_indices_to_sample` in place (decodes: `logits_indices[tis]`;
        prefills: the last `num_prefill_reqs` logits indices) and, with prefills,
        the metadata's `num_actual_tokens`, `max_query_len`, `seq_lens` and
        `query_start_loc` (host values from the twin). `input_ids` are the
        scheduler-order ids (`num_tokens` of them); `target_hidden_states` the
        restored rows; `token_indices_to_sample` has one entry per request.
        """
        return self._proposer.first_pass(
            input_ids,
            target_positions,
            target_hidden_states,
            token_indices_to_sample,
            common_attn_metadata,
            long_seq_metadata,
            logits_indices,
            num_tokens,
            num_prefill_reqs,
            num_decode_reqs,
            uses_mrope,
        )

    def prepare_spec_decode_mtp_drafting_inputs(
        self,
        common_attn_metadata: AscendCommonAttentionMetadata,
        attn_metadata: object,  # the draft step's: seq_lens / seq_lens_cpu read with getattr
        ori_token_indices_to_sample: torch.Tensor | None,
        batch_size: int,
        num_decode_reqs: int,
        is_prefill_batch: bool,
        num_speculative_tokens: int,
    ) -> PCPSpecDecodeMTPInputs | None:
        """MTP draft-step slots for decode-only batches (or DCP-only prefills); `None` otherwise."""
        return self._proposer.mtp_drafting(
            common_attn_metadata,
            attn_metadata,
            ori_token_indices_to_sample,
            batch_size,
            num_decode_reqs,
            is_prefill_batch,
            num_speculative_tokens,
        )

    def mask_spec_decode_restore_idx_for_graph(self, pcp_allgather_restore_idx: torch.Tensor) -> None:
        """Zero the restore rows a graph-padded draft batch never reads (in place), and make it the
        manager's restore index (the rest of the buffer zero)."""
        self._proposer.mask_restore(pcp_allgather_restore_idx)

    def update_spec_decode_drafting_cp_metadata(
        self,
        attn_metadata: DraftAttentionMetadata,
        kv_cache_spec: object,  # only asked whether it is vllm-ascend's AscendMLAAttentionSpec
        seq_lens: torch.Tensor,
        draft_index: int,
        seq_lens_cpu: torch.Tensor | None = None,
        attn_metadata_builder: object | None = None,  # only asked whether it is the SFA DCP builder
    ) -> None:
        """Per-draft-step CP sequence lengths into the drafter's attention metadata.

        MLA (`AscendMLAAttentionSpec`): `attn_metadata.decode.cp_seq_len`;
        SFA DCP builder: copied into `attn_metadata.dcp_context.seq_lens`;
        otherwise `attn_metadata.decode_meta.num_computed_tokens_of_pcp_dcp`
        (numpy, from `seq_lens_cpu` when given).
        """
        self._proposer.drafting_cp_metadata(
            attn_metadata, kv_cache_spec, seq_lens, draft_index, seq_lens_cpu, attn_metadata_builder
        )

    # ---------------------------------------------------------------- multimodal (Multimodal)
    def cache_local_schedule_layout(
        self, num_scheduled_tokens: np.ndarray, num_reqs: int, total_num_scheduled_tokens: int
    ) -> None:
        """Keep a read-only snapshot of this rank's scheduled counts (for the multimodal preprocess)."""
        self._multimodal.cache_layout(num_scheduled_tokens, num_reqs, total_num_scheduled_tokens)

    def get_local_schedule_layout(self) -> tuple[np.ndarray | None, int | None]:
        return self._multimodal.layout()

    def fill_prompt_embeds_for_pcp(
        self, req_embeds: torch.Tensor, req_positions_np: np.ndarray, dst_slice: torch.Tensor
    ) -> None:
        """Write one request's prompt embeds at its local positions into `dst_slice` (rows past the
        embeds are left as they are)."""
        self._multimodal.fill_prompt_embeds(req_embeds, req_positions_np, dst_slice)

    def remap_mrope_positions_for_pcp(
        self,
        positions_np: np.ndarray,
        num_scheduled_tokens: np.ndarray,
        num_reqs: int,
        input_batch: NPUInputBatch,
        requests: dict[str, CachedRequestState],
        mrope_positions: CpuGpuBuffer,
    ) -> None:
        """M-RoPE positions of this rank's tokens into `mrope_positions.cpu[:, :num_local_tokens]`."""
        self._multimodal.mrope(positions_np, num_scheduled_tokens, input_batch, requests, mrope_positions)

    def build_local_mm_schedule(
        self,
        req_ids: list[str],
        requests: dict[str, CachedRequestState],
        positions_np: np.ndarray,
        local_num_scheduled_tokens: np.ndarray,
        encoder_cache: dict[str, torch.Tensor],
    ) -> tuple[dict[str, list[int]], set[str]]:
        """Encoder inputs this rank's tokens need: `({req_id: [missing features]}, needed hashes)`."""
        return _ops.build_local_mm_schedule(
            req_ids, requests, positions_np, local_num_scheduled_tokens, encoder_cache
        )

    def gather_mm_embeddings_for_pcp(
        self,
        req_ids: list[str],
        requests: dict[str, CachedRequestState],
        positions_np: np.ndarray,
        local_num_scheduled_tokens: np.ndarray,
        shift_computed_tokens: int,
        encoder_cache: dict[str, torch.Tensor],
        is_mm_embed: torch.Tensor,
        model: SupportsMultiModalPruning,  # read only with multimodal pruning and M-RoPE
        is_multimodal_pruning_enabled: bool,
        uses_mrope: bool,
        warning_once: Callable[..., Any] | None = None,
    ) -> tuple[list[torch.Tensor], bool, bool]:
        """The encoder rows this rank's tokens consume, in local token order.

        Marks them in `is_mm_embed` and, with multimodal pruning and M-RoPE,
        writes the recomputed M-RoPE positions into the request states.
        """
        return self._multimodal.gather_embeddings(
            req_ids,
            requests,
            positions_np,
            local_num_scheduled_tokens,
            shift_computed_tokens,
            encoder_cache,
            is_mm_embed,
            model,
            is_multimodal_pruning_enabled,
            uses_mrope,
            warning_once,
        )

    def maybe_localize_scheduler_output_for_mm_preprocess(
        self,
        scheduler_output: SchedulerOutput,
        req_ids: list[str],
        requests: dict[str, CachedRequestState],
        positions_np: np.ndarray,
        local_num_scheduled_tokens: np.ndarray | None,
        local_total_num_scheduled_tokens: int | None,
        encoder_cache: dict[str, torch.Tensor],
    ) -> dict[str, Any] | None:
        """Make `scheduler_output` this rank's view for the multimodal preprocess (in place, as the
        runner reads the same object); returns what
        [`restore_scheduler_output_after_mm_preprocess`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager]
        needs, or `None` when nothing differs."""
        return self._multimodal.localize(
            scheduler_output,
            req_ids,
            requests,
            positions_np,
            local_num_scheduled_tokens,
            local_total_num_scheduled_tokens,
            encoder_cache,
        )

    def restore_scheduler_output_after_mm_preprocess(
        self, scheduler_output: SchedulerOutput, restore_state: dict[str, Any] | None
    ) -> None:
        self._multimodal.restore(scheduler_output, restore_state)
