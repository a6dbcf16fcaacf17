"""``FunctionalDCSManager``: a drop-in for vllm-ascend 0.23's ``PCPManager`` (``worker/pcp_utils.py``).

Same constructor, same methods and the attributes ``model_runner_v1.py`` reads;
the layout is computed by pcp_fn instead of host numpy:

- ``init_batch_info`` builds the step: the host twin (:mod:`._host`, O(R)
  numpy on the runner's arrays) for every value the runner reads on the host,
  and one device step (:func:`._ops.device_step`: ``update_tokens``, logits
  indices, attention index tensors, the hybrid index maps), one graph per
  bucket of a ladder made at construction (:class:`._ops.DeviceGraphs`;
  ``PCP_FN_GRAPH_BACKEND``, :mod:`pcp_fn.adapters.backend`), bound to a
  persistent staging buffer and writing its outputs into the persistent
  buffers (:mod:`._buffers`) inside the graph;
- every later call reads the frozen step record (:mod:`._record`), those
  buffers, or runs a small pcp_fn op (the padded slot mapping per KV cache
  group, the MTP mask, the spec-decode and multimodal helpers).

Call order (the runner's ``_prepare_inputs`` / ``_build_attention_metadata`` /
``execute_model``): ``init_batch_info`` -> ``generate_pcp_mtp_input`` (spec
decode) -> ``update_tokens_for_pcp`` -> ``rebuild_async_spec_decode_inputs`` ->
``get_logits_indices`` (or the runner's spec metadata with
``num_pcp_pads_cpu`` and ``adjust_cu_num_scheduled_tokens_for_pcp``) ->
``get_padded_slot_mapping`` per KV cache group -> ``generate_pcp_metadata`` ->
forward -> ``get_restore_hidden_states`` -> the proposer's helpers. A
``_dummy_run`` (graph capture, and the runs between steps) calls
``init_batch_info`` -> ``get_padded_slot_mapping`` -> ``generate_pcp_metadata``
without ``update_tokens_for_pcp``: its metadata is the real step's of the dummy batch.

Differences from the reference (see the README's table): the restore index
and metadata index tensors are views of device buffers built by pcp_fn (the
host ``.np`` copies are not kept); ``pcp_unpad_mask`` in the metadata is the
device mask; the MTP attention mask is the interleave-aware one (with the
reference's buffer semantics: rows it does not recompute keep their last values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ....core.checks import INT32_MAX, host_row
from ...backend import GraphStats, default_graph_backend, package_cache_dir, resolve_graph_backend
from . import _buffers, _host, _ops
from ._metadata import MetadataMethods
from ._multimodal import MultimodalMethods
from ._record import StepRecord
from ._settings import read_settings
from ._spec_inputs import SpecInputMethods
from ._spec_proposer import ProposerMethods


def _pcp_all_gather(x: torch.Tensor) -> torch.Tensor:
    from vllm.distributed.parallel_state import get_pcp_group

    return get_pcp_group().all_gather(x, 0)


_new = object.__new__


def graph_backend(capture: bool | None, compile_backend: str | None, device: torch.device) -> str | None:
    """The backend of the manager's graphs (``None``: plain calls).

    ``capture`` / ``compile_backend`` given: ``capture=False`` plain calls; ``capture=True``
    graphs with ``compile_backend`` (default ``"inductor"``: device graphs on CUDA / NPU,
    ``torch.compile`` on the CPU); ``compile_backend`` alone that backend. Neither:
    ``$PCP_FN_GRAPH_BACKEND`` (:func:`pcp_fn.adapters.backend.resolve_graph_backend`: ``auto``,
    the default, captures device graphs on CUDA / NPU and makes plain calls on the CPU).
    """
    if capture is False:
        return None
    if capture is True:
        return compile_backend or "inductor"
    if compile_backend is not None:
        return compile_backend
    return resolve_graph_backend(default_graph_backend(), device)


class FunctionalDCSManager(MetadataMethods, SpecInputMethods, ProposerMethods, MultimodalMethods):
    """vllm-ascend 0.23 ``PCPManager`` on pcp_fn (DualChunkSwap; hybrid attention; spec decode).

    Args (as ``PCPManager``'s; ``vllm_config`` is read once, see :mod:`._settings`):
        pcp_world_size, pcp_rank, dcp_world_size, dcp_rank, max_buffer_num_tokens,
        max_num_reqs, device, vllm_config, use_async_scheduling, pin_memory, use_sparse.

    Keyword-only additions:
        capture, compile_backend: override ``$PCP_FN_GRAPH_BACKEND`` (:func:`graph_backend`):
            ``capture=True`` makes one graph per bucket with :func:`pcp_fn.graph.capture`
            (``torch.npu.NPUGraph`` on an NPU, ``torch.cuda.CUDAGraph`` on CUDA,
            ``torch.compile(backend=compile_backend)`` elsewhere, AOTInductor packages
            cached in ``$PCP_FN_CACHE_DIR`` for ``compile_backend="aoti"``),
            ``capture=False`` plain calls. Every graph is made here, for every
            bucket of the ladder (:attr:`graph_stats`), never at a step.
        check_syncs: run every device-path call under :func:`pcp_fn.no_host_syncs`.
        request_buckets, token_buckets: the ladder's bucket sizes (token sizes default to
            powers of two from 16 up to the local capacity; each with ``min(L_b, R)``
            request rows, rounded up to ``request_buckets`` when given).
        all_gather: ``x -> all_gather(x, dim 0)`` over the PCP group; default
            vLLM's ``get_pcp_group().all_gather`` (imported when first used).

    Raises:
        ValueError: a bad constructor field, or (from ``init_batch_info``) counts
            that are not 1-D integers, negative, beyond ``max_num_reqs`` /
            ``max_num_batched_tokens``; the message names the field and the limit.
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
        vllm_config: Any,
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
    ) -> None:
        s = read_settings(
            pcp_world_size,
            pcp_rank,
            dcp_world_size,
            dcp_rank,
            max_buffer_num_tokens,
            max_num_reqs,
            device,
            vllm_config,
            use_async_scheduling,
            pin_memory,
            use_sparse,
        )
        self.settings = s
        self.config = _ops.make_config(s, request_buckets, token_buckets)
        self.device = s.device
        self._buffers = b = _buffers.allocate(
            s, _ops.output_capacities(self.config), _ops.gathered_capacity(self.config)
        )
        backend = graph_backend(capture, compile_backend, s.device)
        self._graphs = _ops.DeviceGraphs(
            self.config,
            s.device,
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
        # rows of each padded slot mapping past which it holds -1 (the graphs write the bucket's)
        self._slots_dirty = [b.padded_slot_capacity if backend is not None else 0]
        self._metadata_cls: Any = None
        self._empty_indices: dict[str, torch.Tensor] | None = None
        self._pads: tuple[Any, np.ndarray] = (
            None,
            np.zeros(s.max_num_reqs, dtype=np.int64),
        )  # (its update, it)
        self._last_views: dict[Any, tuple[int, Any]] = {}  # _view's
        self._cpu_state = _ops.init_state(self.config, "cpu")  # the ops reading the CPU token table
        # the ops tied to no step (any length up to the capacity): the capacity bucket's rows
        self._capacity_state = _ops.init_state(self.config, s.device)
        self._record = StepRecord(state=_ops.init_state(self.config, s.device))
        self._all_gather = all_gather or _pcp_all_gather
        # constants the reference exposes under these names
        self.pcp_world_size, self.pcp_world_rank = s.pcp_size, s.pcp_rank
        self.dcp_world_size, self.dcp_world_rank = s.dcp_size, s.dcp_rank
        self.speculative_config = vllm_config.speculative_config
        self.decode_threshold = s.decode_threshold
        self.max_num_tokens, self.max_num_reqs = s.max_num_tokens, s.max_num_reqs
        self.use_async_scheduling, self.use_sparse = s.use_async_scheduling, s.use_sparse
        self.pcp_use_hybrid_attn = s.hybrid_attn
        self.pd_decode_recompute_scheduler_enabled = s.pd_decode_recompute
        self.pcp_padded_slot_mapping_list = self._buffers.padded_slot_mappings
        self.query_lens_pcp_full = self._buffers.query_lens_pcp_full
        self.input_ids_pcp_full = self._buffers.input_ids_pcp_full
        self.query_start_loc_pcp_full = self._buffers.query_start_loc_pcp_full
        self.positions_pcp_full = self._buffers.positions_pcp_full
        self.positions_pcp_full_np = (
            None if self.positions_pcp_full is None else self.positions_pcp_full.numpy()
        )
        self.dcp_mtp_attn_mask = self._buffers.dcp_mtp_attn_mask
        step = self._buffers.step
        self.pcp_allgather_restore_idx = _buffers.DeviceBuffer.of(step["restore"])
        self.pcp_unpad_mask = step["unpad_mask"]
        self.logits_indices_gpu = step["logits"]
        self.pcp_enter_fa_restore_idx = step.get("enter")
        self.pcp_fa_padding_restore_idx = step.get("fa_padding")
        self.pcp_fa_query_idx = step.get("fa_query")
        self.pcp_exit_fa_scatter_idx = _buffers.DeviceBuffer.of(step["exit"]) if "exit" in step else None

    # ---------------------------------------------------------------- step record views
    @property
    def record(self) -> StepRecord:
        """The frozen record of the last call (read-only)."""
        return self._record

    def _set(self, **changes: Any) -> None:
        # dataclasses.replace of the frozen record, without its per-field Python loop
        record = _new(StepRecord)
        record.__dict__.update(self._record.__dict__)
        record.__dict__.update(changes)
        self._record = record

    def _view(self, key: Any, buffer: torch.Tensor, rows: int) -> torch.Tensor:
        """``buffer[:rows]``, the same view object as last time when ``rows`` is (a view costs a
        few microseconds; a steady decode batch asks the same ones every step)."""
        last = self._last_views.get(key)
        if last is not None and last[0] == rows:
            return last[1]
        view = buffer[:rows]
        self._last_views[key] = (rows, view)
        return view

    def _host(self) -> _host.HostLayout:
        if self._record.host is None:
            raise RuntimeError("init_batch_info must run before this call")
        return self._record.host

    def _bucket(self) -> _ops.Bucket:
        if self._record.batch is None:
            raise RuntimeError("init_batch_info must run before this call")
        return self._record.batch.bucket

    @property
    def num_graphs(self) -> int:
        """Device graphs made (at construction: one per function and bucket of the ladder)."""
        return self._graphs.num_graphs

    @property
    def graph_stats(self) -> GraphStats:
        """Graphs prepared at construction and their time (``loaded``: AOTInductor packages found
        in the cache), steps, steps run eagerly for want of a graph (``fallbacks``)."""
        return self._graphs.stats

    @property
    def num_reqs(self) -> int:
        return 0 if self._record.host is None else self._record.host.num_reqs

    @property
    def num_decode_reqs(self) -> int:
        return 0 if self._record.host is None else self._record.host.num_decode_reqs

    @property
    def num_prefill_reqs(self) -> int:
        return 0 if self._record.host is None else self._record.host.num_prefill_reqs

    @property
    def num_decode_tokens(self) -> int:
        return 0 if self._record.host is None else self._record.host.num_decode_tokens

    @property
    def decode_req_mask(self) -> np.ndarray | None:
        return None if self._record.host is None else self._record.host.is_decode.copy()

    def _per_request(self, values: np.ndarray | None, dtype: type) -> np.ndarray:
        out = np.zeros(self.max_num_reqs, dtype=dtype)
        if values is not None:
            out[: values.shape[0]] = values
        return out

    @property
    def num_pcp_pads_cpu(self) -> np.ndarray:
        """``[R]`` int64 pads per request of the last ``update_tokens_for_pcp``, zero past its requests:
        one persistent array, like vllm-ascend's attribute (written when first read after an update;
        the runner reads it per KV cache group)."""
        u, (last, out) = self._record.updated, self._pads
        if last is not u:
            n = 0 if u is None else u.num_reqs
            if u is not None:
                out[:n] = u.num_pads
            out[n : max(n, 0 if last is None else last.num_reqs)] = 0
            self._pads = (u, out)
        return out

    @property
    def pcp_tokens(self) -> np.ndarray:
        """``[R]`` int32 DualChunkSwap rows per request of the last update."""
        u = self._record.updated
        return self._per_request(None if u is None else u.pcp_tokens, np.int32)

    @property
    def num_scheduled_tokens_padded(self) -> np.ndarray | None:
        """``[n]`` int32: the scheduled counts after ``init_batch_info``; the DualChunkSwap rows
        per request after ``update_tokens_for_pcp`` (with hybrid attention the FA query lengths)."""
        h, u = self._record.host, self._record.updated
        if h is None:
            return None
        return (u.pcp_tokens if u is h else h.num_scheduled).copy()

    @property
    def pcp_tokens_padded(self) -> np.ndarray | None:
        u = self._record.updated
        return None if u is None or not self.pcp_use_hybrid_attn else u.pcp_tokens.copy()

    @property
    def pcp_padded_tokens_length(self) -> int:
        """Rows of the padded gathered order of the last update (``P * N``)."""
        u = self._record.updated
        return 0 if u is None else self.pcp_world_size * u.num_tokens

    @property
    def total_num_sampled_tokens_pcp(self) -> int:
        """Local tokens of the last update (with hybrid attention: the scheduled tokens)."""
        u = self._record.updated
        if u is None:
            return 0
        return int(u.num_scheduled.sum()) if self.pcp_use_hybrid_attn else u.num_tokens

    def _hybrid_update(self) -> _host.HostLayout | None:
        u = self._record.updated
        return u if self.pcp_use_hybrid_attn and u is not None else None

    @property
    def max_num_tokens_across_pcp(self) -> int:
        u = self._hybrid_update()
        return 0 if u is None else u.max_tokens_across_pcp

    @property
    def pcp_padded_tokens_fla(self) -> int:
        u = self._hybrid_update()
        return 0 if u is None else u.padded_tokens_fla

    @property
    def total_pcp_padding_tokens_fla(self) -> int:
        u = self._hybrid_update()
        return 0 if u is None else u.total_padding_tokens_fla

    @property
    def total_num_scheduled_tokens(self) -> int:
        u = self._hybrid_update()
        return 0 if u is None else u.num_linear_tokens

    @property
    def num_actual_tokens_pcp_padded(self) -> int:
        return self._record.num_actual_tokens_pcp_padded

    @property
    def long_seq_metadata(self) -> Any:
        return self._record.long_seq_metadata

    # ---------------------------------------------------------------- the step
    def classify_decode_request_mask(
        self,
        num_scheduled_tokens: Any,
        num_computed_tokens: Any,
        num_prompt_tokens: Any,
        decode_threshold: int,
    ) -> np.ndarray:
        """vllm-ascend ``classify_decode_request_mask`` (numpy)."""
        s = dataclasses.replace(self.settings, num_spec_tokens=decode_threshold - 1)
        return _host.classify_decodes(
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

        The arrays are the runner's (decodes first); only their first ``num_reqs``
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
        h = _host.host_layout(self.settings, sched, computed, prompt, self._record.host)
        # make_batch's checks from the counts' bound; make_batch itself names a bad field
        if h.bound < 0 or 2 * h.bound > INT32_MAX or h.total_scheduled > self.max_num_tokens:
            _ops.make_batch(self.config, h, "cpu")
        graphs = self._graphs
        rung = graphs.rung_for(n, h.num_tokens)
        staged = graphs.stage(h)
        graphs.step(rung)
        # query_lens_pcp_full: the scheduled tokens, zero past them (the step writes its device half)
        self._buffers.query_lens_pcp_full.np[:] = staged
        self._set(state=rung.state, host=h, batch=rung.batch)

    def update_tokens_for_pcp(
        self, num_scheduled_tokens: np.ndarray, arange_np: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens per request on this rank [n] int32, local positions)`` of the step.

        DualChunkSwap: ``pcp_tokens`` and the int32 offsets of the local rows;
        hybrid attention: the linear split's counts and int64 offsets. ``arange_np``
        is accepted for the reference's signature and not needed.
        """
        h = self._host()
        given = np.asarray(num_scheduled_tokens)
        if given.ndim != 1 or not _host.same_ints(given, h.num_scheduled):
            raise ValueError(
                "num_scheduled_tokens passed to update_tokens_for_pcp differs from init_batch_info's "
                f"({given.tolist()} vs {h.num_scheduled.tolist()})"
            )
        self._set(updated=h)
        if self.pcp_use_hybrid_attn:
            return h.linear_tokens.copy(), h.linear_rows.copy()
        return h.pcp_tokens.copy(), h.dcs_rows.copy()  # copies: the layout's are shared

    def get_logits_indices(
        self, cu_num_tokens: np.ndarray, num_reqs: int, tokens_original: list[int] | None = None
    ) -> torch.Tensor:
        """``[num_reqs]`` int64 CPU tensor of restored rows to sample (the runner pins and copies it).

        The same rows are on the device in ``logits_indices_gpu`` (hybrid form with hybrid attention).
        """
        h = self._host()
        hybrid_form = self.pcp_use_hybrid_attn and tokens_original is not None
        logits = h.logits_hybrid if hybrid_form else h.logits  # shared: the caller gets a copy
        return torch.from_numpy(logits[:num_reqs].copy())

    def adjust_cu_num_scheduled_tokens_for_pcp(
        self, cu_num_scheduled_tokens: np.ndarray, num_pcp_pads: np.ndarray
    ) -> np.ndarray:
        """Hybrid-attention spec decode: cumulative tokens in the restored FA order (numpy)."""
        return _host.adjust_cu(self._host(), cu_num_scheduled_tokens)

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
        """The group's padded slot mapping: ``[num_tokens_padded * P]`` int32 (pad rows -1), at most
        ``max_buffer_num_tokens`` rows (the runner's size for it).

        ``slot_mapping`` holds the step's slots in scheduler order (the runner
        passes exactly ``sum(num_scheduled_tokens)``; only those are read).
        """
        rec = self._record
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
            self._view("slots_in", staging, count).copy_(src)
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
        return self._view(("slots", kv_cache_group_id), buf, min(length, self.settings.max_buffer_num_tokens))

    def get_restore_hidden_states(
        self, hidden_states: torch.Tensor, num_input_tokens: int | None = None
    ) -> torch.Tensor:
        """All-gather the ranks' hidden states and put them in request order.

        DualChunkSwap: the first ``num_input_tokens`` rows (default this step's
        local tokens) are gathered and reordered by the restore index. Hybrid
        attention: the linear rows, padded to ``M`` per rank, are gathered and
        reordered into the compact full-attention input.
        """
        P = self.pcp_world_size
        u = self._hybrid_update()
        if u is None:
            local = (
                num_input_tokens if num_input_tokens is not None else self.num_actual_tokens_pcp_padded // P
            )
            gathered = self._all_gather(hidden_states[:local])
            index = self._view("restore", self.pcp_allgather_restore_idx.gpu, gathered.shape[0])
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
