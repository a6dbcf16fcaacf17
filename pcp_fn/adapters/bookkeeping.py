"""Everything the vLLM adapter asks of ``pcp_fn``, in one place: host twin, captured MRV2 graph, restores.

The adapter (:mod:`pcp_fn.adapters.vllm_manager`) speaks vLLM; this module
speaks ``pcp_fn.mrv2``. No other adapter module calls into ``pcp_fn`` (keep it
that way: when the ``mrv2`` signatures change, only this file changes).

Per step:

1. ``segments``: the host twin (:func:`pcp_fn.mrv2.host.local_segments`),
   numpy on the scheduler's ``[R]`` arrays: every rank's counts and this rank's
   segments, for the bucket choice and the host fields.
2. ``partition``: the per-request arrays go to the device in one copy (packed
   ``[5R + 1]`` int32, the layout of :func:`pcp_fn.mrv2.make_batch`, whose
   checks the adapter has already made), the global token ids and positions
   into persistent ``[T]`` buffers; then :func:`pcp_fn.mrv2.partition_batch`
   runs captured once per graph bucket ``(Rb, Lb)`` by
   :func:`pcp_fn.graph.capture` (a CUDA/NPU graph, ``torch.compile`` on the
   CPU, or plain calls with ``backend=None``), and one ``_foreach_copy_`` moves
   its bucket-shaped results into the caller's persistent buffers, sliced to
   vLLM's sizes. The graph bucket is a power of two at least vLLM's padded
   sizes ``(Rpad, Lp)``, so a handful of graphs serve every step; gathered row
   ``q * Lb + l`` of the bucket is row ``q * Lp + l`` of vLLM's all-gather
   (rewritten on the copy).
3. ``gathered_slot_mappings``, ``restore``, ``draft_input_ids``: the layout
   consumers, run on a state whose layout *is* the persistent buffers (views).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import graph, mrv2
from ..config import Bucket
from ..mrv2 import host
from ..sync import no_host_syncs


class Destinations(NamedTuple):
    """Persistent device buffers the partition writes, at capacity (``R' = 2 * max_num_reqs``
    local rows, ``T`` tokens, ``P`` ranks). Their addresses never change.

    input_ids ``[T]`` int32, positions ``[T]`` int64, is_padding ``[T]`` bool,
    query_start_loc ``[R'+1]`` int32, seq_lens ``[R']`` int32 (vLLM ``InputBuffers``);
    idx_mapping ``[R']`` int64, logits_indices ``[R']`` int32, cu_num_logits ``[R'+1]`` int32;
    hidden_restore_idx ``[T]`` int64, padded_gather_idx ``[P*T]`` int64,
    kv_write_mask ``[P*T]`` bool.
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


class StepSizes(NamedTuple):
    """vLLM's sizes of one step (host ints): ``Lp`` local tokens per rank after padding,
    ``Rpad`` local request rows after padding, ``num_local_reqs`` real local rows
    (at least 1), ``num_tokens`` global tokens."""

    Lp: int
    Rpad: int
    num_local_reqs: int
    num_tokens: int


def _partition_step(
    state: mrv2.MRV2State,
    packed: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    bucket: Bucket,
) -> tuple[Any, ...]:
    """The captured function: ``mrv2.partition_batch`` of the staged global batch and the outputs
    the adapter copies (bucket shapes ``[Lb]``, ``[Rb(+1)]``, ``[T]``, ``[P*Lb]``).

    ``packed [5R + 1]`` int32: num_scheduled, num_computed, prefill_len,
    is_prefilling, idx_mapping (``[R]`` each, zero past the requests), then
    num_reqs; ``input_ids [T]`` int32, ``positions [T]`` int64.
    """
    R = state.config.max_num_reqs
    batch = mrv2.GlobalBatch(
        bucket=bucket,
        num_reqs=packed[5 * R],
        num_scheduled=packed[0:R],
        num_computed=packed[R : 2 * R],
        prefill_len=packed[2 * R : 3 * R],
        is_prefilling=packed[3 * R : 4 * R].bool(),
        idx_mapping=packed[4 * R : 5 * R],
        input_ids=input_ids,
        positions=positions,
    )
    state, local = mrv2.partition_batch(state, batch)
    lay = state.layout
    return (
        local.input_ids,
        local.positions,
        local.is_padding,
        local.query_start_loc,
        local.seq_lens,
        local.idx_mapping.to(torch.int64),
        local.logits_indices,
        local.cu_num_logits,
        lay.hidden_restore_idx,
        lay.padded_gather_idx,
        lay.gathered_kv_write_mask,
        lay.per_rank_num_tokens,
        lay.num_tokens,
    )


class Bookkeeping:
    """One rank's MRV2 bookkeeping for the adapter.

    Args:
        pcp_size, pcp_rank, max_num_reqs, max_num_tokens, shard_decode_requests,
            dcp_size, dcp_rank, cp_interleave, pad_slot_id: the manager's
            constructor arguments (they make the static
            :class:`pcp_fn.mrv2.MRV2Config`; its ``ValueError`` names a bad one).
        device: where the graphs run.
        out: the persistent buffers (:class:`Destinations`).
        backend: ``torch.compile`` backend on the CPU (``"inductor"``,
            ``"eager"``, ...) or ``None`` for plain calls (no capture). CUDA and
            NPU devices always capture device graphs unless ``None``.
        check_host_syncs: run the device part under :func:`pcp_fn.no_host_syncs`.
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
        cp_interleave: int,
        pad_slot_id: int,
        device: torch.device,
        out: Destinations,
        backend: str | None,
        check_host_syncs: bool = False,
    ) -> None:
        self.config = mrv2.MRV2Config(
            pcp_size,
            pcp_rank,
            max_num_reqs,
            max_num_tokens,
            shard_decode_requests=shard_decode_requests,
            dcp_size=dcp_size,
            dcp_rank=dcp_rank,
            cp_interleave=cp_interleave,
            pad_slot_id=pad_slot_id,
        )
        self.device = device
        self.out = out
        self.backend = backend
        self.check_host_syncs = check_host_syncs
        self._state0 = mrv2.init_state(self.config, device)
        self._graphs: dict[Bucket, graph.Captured] = {}
        self._view: mrv2.MRV2State | None = None
        R, T = max_num_reqs, max_num_tokens
        # staging: what the captured graphs read (persistent, so each bucket's graph sees one address)
        self._packed = torch.zeros(5 * R + 1, dtype=torch.int32, device=device)
        self._input_ids = torch.zeros(T, dtype=torch.int32, device=device)
        self._positions = torch.zeros(T, dtype=torch.int64, device=device)
        self._pin = device.type == "cuda"
        self._buckets: dict[tuple[int, int], Bucket] = {}
        self._views: dict[StepSizes, list[torch.Tensor]] = {}

    @property
    def num_graphs(self) -> int:
        """Graphs captured so far (one per bucket)."""
        return len(self._graphs)

    # ---------------------------------------------------------------- host twin

    def segments(self, num_scheduled: np.ndarray, is_prefilling: np.ndarray) -> host.LocalSegments:
        """This rank's segments and every rank's counts (host, ``O(P * R)``)."""
        return host.local_segments(self.config, self.config.pcp_rank, num_scheduled, is_prefilling)

    def dcp_rank0_seq_lens(self, seq_lens: np.ndarray) -> np.ndarray:
        return host.dcp_rank0_seq_lens(seq_lens, self.config.dcp_size, self.config.cp_interleave)

    def bucket(self, num_reqs: int, num_tokens: int) -> Bucket:
        """The graph bucket holding ``num_reqs`` local rows and ``num_tokens`` local tokens."""
        key = (num_reqs, num_tokens)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = self.config.bucket_for(num_reqs, num_tokens)
        return bucket

    def _destinations(self, sizes: StepSizes) -> list[torch.Tensor]:
        """The persistent views one step writes (cached: steady decoding repeats its sizes)."""
        views = self._views.get(sizes)
        if views is None:
            if len(self._views) > 256:  # bounded: sizes vary with the batch
                self._views.clear()
            Lp, Rpad, n, total = sizes
            P, o = self.config.pcp_size, self.out
            views = self._views[sizes] = [
                o.input_ids[:Lp],
                o.positions[:Lp],
                o.is_padding[:Lp],
                o.query_start_loc[: Rpad + 1],
                o.seq_lens[:Rpad],
                o.idx_mapping[:n],
                o.logits_indices[:Rpad],
                o.cu_num_logits[: n + 1],
                o.padded_gather_idx[: P * Lp].view(P, Lp),
                o.kv_write_mask[: P * Lp].view(P, Lp),
                o.hidden_restore_idx[:total],
                o.padded_gather_idx[: P * Lp],
                o.kv_write_mask[: P * Lp],
            ]
        return views

    # ---------------------------------------------------------------- device

    def _sync_guard(self) -> contextlib.AbstractContextManager[None]:
        return no_host_syncs() if self.check_host_syncs else contextlib.nullcontext()

    def _run(self, bucket: Bucket) -> tuple[Any, ...]:
        """The partition of the staged batch in ``bucket``'s graph (captured on first use)."""
        args = (self._state0, self._packed, self._input_ids, self._positions)
        if self.backend is None:
            return _partition_step(*args, bucket=bucket)
        captured = self._graphs.get(bucket)
        if captured is None:
            fn = functools.partial(_partition_step, bucket=bucket)
            captured = self._graphs[bucket] = graph.capture(fn, *args, backend=self.backend)
        return captured(*args)

    def _stage(
        self,
        arrays: tuple[np.ndarray, ...],
        num_tokens: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """One host-to-device copy of the per-request arrays, two device copies of the tokens."""
        R, n = self.config.max_num_reqs, arrays[0].size
        host_packed = torch.zeros(5 * R + 1, dtype=torch.int32, pin_memory=self._pin)
        view = host_packed.numpy()
        for k, values in enumerate(arrays):
            view[k * R : k * R + n] = values
        view[5 * R] = n
        # non_blocking from pinned memory: the host allocator keeps the block until the copy ran
        self._packed.copy_(host_packed, non_blocking=self._pin)
        # rows past num_tokens stay stale: the layout never reads them (padding rows are masked)
        self._input_ids[:num_tokens].copy_(input_ids[:num_tokens])
        self._positions[:num_tokens].copy_(positions[:num_tokens])

    def partition(
        self,
        num_scheduled: np.ndarray,
        num_computed: np.ndarray,
        prefill_len: np.ndarray,
        is_prefilling: np.ndarray,
        idx_mapping: np.ndarray,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        bucket: Bucket,
        sizes: StepSizes,
    ) -> None:
        """Lay out the global batch on every rank and write this rank's rows into ``out``.

        The per-request arrays are ``[num_reqs]`` (checked by the caller: at most
        ``max_num_reqs``, ints); ``input_ids`` / ``positions`` the global
        ``[>= num_tokens]`` device tensors (not read on the host). ``bucket``
        must hold every rank (rows and tokens) and ``(Rpad, Lp)``.
        """
        P, Lb = self.config.pcp_size, bucket.num_tokens
        Lp, Rpad, n, total = sizes
        arrays = (num_scheduled, num_computed, prefill_len, is_prefilling, idx_mapping)
        self._stage(arrays, total, input_ids, positions)
        views = self._destinations(sizes)
        with self._sync_guard():
            ids, pos, pad, qsl, seq, idx, logits, cu, restore, gather, write, per_rank, num = self._run(
                bucket
            )
            src = [
                ids[:Lp],
                pos[:Lp],
                pad[:Lp],
                qsl[: Rpad + 1],
                seq[:Rpad],
                idx[:n],
                logits[:Rpad],
                cu[: n + 1],
                gather.view(P, Lb)[:, :Lp],
                write.view(P, Lb)[:, :Lp],
            ]
            restore = restore[:total]
            if Lp == Lb:
                torch._foreach_copy_(views[:11], [*src, restore])
            else:  # bucket row q * Lb + l is vLLM's all-gather row q * Lp + l
                torch._foreach_copy_(views[:10], src)
                torch.add(
                    restore, torch.div(restore, Lb, rounding_mode="floor"), alpha=Lp - Lb, out=views[10]
                )
        layout = mrv2.MRV2Layout(
            padded_num_tokens=Lp,
            per_rank_num_tokens=per_rank,
            num_tokens=num,
            hidden_restore_idx=views[10],
            padded_gather_idx=views[11],
            gathered_kv_write_mask=views[12],
        )
        self._view = dataclasses.replace(self._state0, layout=layout)

    @property
    def has_layout(self) -> bool:
        return self._view is not None

    def _state(self) -> mrv2.MRV2State:
        if self._view is None:
            raise RuntimeError("no batch was partitioned yet")
        return self._view

    def gathered_slot_mappings(self, global_slot_mappings: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``[K, >= num_tokens] -> out[:, :P*Lp]``: the KV slot of each gathered row,
        ``pad_slot_id`` where the row must not write."""
        with self._sync_guard():
            _, slots = mrv2.gathered_slot_mappings(self._state(), global_slot_mappings)
            view = out[:, : slots.shape[1]]
            view.copy_(slots)
        return view

    def restore(self, gathered: torch.Tensor) -> torch.Tensor:
        """``[P*Lp, ...] -> [num_tokens, ...]``: all-gathered rows in global token order."""
        with self._sync_guard():
            return mrv2.restore_hidden_states(self._state(), gathered)[1]

    def restore_for_sampling(
        self, gathered: torch.Tensor, aux_gathered: Sequence[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        with self._sync_guard():
            _, out = mrv2.restore_for_sampling(self._state(), gathered, aux_gathered)
        return out.hidden_states, None if out.aux_hidden_states is None else list(out.aux_hidden_states)

    def restore_draft_prefill(
        self, last_gathered: torch.Tensor, gathered: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both restored; pass the same object twice to restore once (the result is shared)."""
        with self._sync_guard():
            _, out = mrv2.restore_draft_prefill(self._state(), last_gathered, gathered)
        return out.last_hidden_states, out.hidden_states

    def draft_input_ids(self, local_batch: Any, input_ids: torch.Tensor) -> torch.Tensor:
        """``[Lp]``: the drafter's global ``input_ids`` at this rank's rows (padding rows read token 0).
        ``local_batch`` is any dataclass with an ``input_ids`` field (its dtype is kept)."""
        with self._sync_guard():
            _, batch = mrv2.prepare_draft_prefill(self._state(), local_batch, input_ids)
        return batch.input_ids
