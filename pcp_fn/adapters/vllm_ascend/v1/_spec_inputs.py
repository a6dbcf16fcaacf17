"""The runner-side speculative-decode (MTP) methods of the vllm-ascend manager, on pcp_fn.spec.

``model_runner_v1.py`` calls these two while it prepares a step:

================================================  ==============================================
vllm-ascend ``PCPManager``                        pcp_fn
================================================  ==============================================
``generate_pcp_mtp_input``                        ``spec.full_input_ids`` (on the CPU token table)
``_update_input_ids_pcp_full_ids``                ``spec.repair_full_input_ids``
``rebuild_async_spec_decode_inputs``              ``spec.rebuild_spec_positions`` (device branch)
================================================  ==============================================

They keep the reference's signatures and side effects (the full-input
buffers, ``mtp_slot_pad``, the block table's slot-mapping calls, the runner's
positions), and the state they carry to later calls (the async layout, the
MTP slot rows) lives in the manager's frozen record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from . import _host, _ops
from ._record import FullLayout


@dataclasses.dataclass(frozen=True)
class PCPAsyncSpecDecodeRebuildResult:
    """Whether the async rebuild ran, and whether it left the positions on the device."""

    rebuilt: bool
    positions_ready_on_device: bool


def _draft_slot_fn(block_table: Any, num_rows: int, on_host: bool) -> Callable[..., torch.Tensor]:
    """``slot_fn`` over the runner's block table: its ``compute_slot_mapping_draft`` on the real rows.

    Reads ``block_table.block_tables[0].slot_mapping.cpu`` (host rows) or ``.gpu``.
    """

    def slot_fn(request: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        req, pos = request[:num_rows], positions[:num_rows]
        mapping = block_table.block_tables[0].slot_mapping
        if on_host:
            block_table.compute_slot_mapping_draft(req.numpy(), pos.numpy())
            got = mapping.cpu[:num_rows]
        else:
            block_table.compute_slot_mapping_draft(req, pos)
            got = mapping.gpu[:num_rows]
        got = got.to(device=request.device, dtype=torch.int32)
        return F.pad(got, (0, request.shape[0] - num_rows))

    return slot_fn


def _correct_optimistic_seq_lens() -> Callable[..., None]:
    from vllm_ascend.spec_decode.utils import correct_optimistic_seq_lens_cpu

    return correct_optimistic_seq_lens_cpu


class SpecInputMethods:
    """Mixin of :class:`FunctionalDCSManager`: the runner-side spec-decode methods."""

    # ------------------------------------------------------------ record views
    @property
    def mtp_slot_pad(self) -> torch.Tensor | None:
        """``[M * P]`` int32 MTP slot mapping last built (token-strided; a view of a persistent buffer)."""
        rows = self._record.mtp_rows
        if rows is None:
            return None
        return self._buffers.mtp_slot_pad[: rows * self.pcp_world_size]

    @property
    def cu_num_tokens_pcp_full(self) -> np.ndarray | None:
        return self._record.cu_num_tokens_pcp_full

    @property
    def async_rebuild_req_indices_full(self) -> np.ndarray | None:
        full = self._record.async_full
        return None if full is None else full.req_indices

    @property
    def async_rebuild_cu_num_tokens_full(self) -> np.ndarray | None:
        full = self._record.async_full
        return None if full is None else full.cu_num_tokens

    @property
    def async_rebuild_num_tokens_full(self) -> int:
        full = self._record.async_full
        return 0 if full is None else full.num_tokens

    # ------------------------------------------------------------ runner-side
    def generate_pcp_mtp_input(
        self,
        total_num_scheduled_tokens: int,
        num_scheduled_tokens: dict[str, int],
        with_prefill: bool = True,
        input_batch: Any = None,
        arange_np: np.ndarray | None = None,
        req_indices: np.ndarray | None = None,
        positions_np: np.ndarray | None = None,
        cu_num_tokens: np.ndarray | None = None,
        draft_token_ids: torch.Tensor | None = None,
        scheduler_output: Any = None,
        num_spec_tokens: int | None = None,
        precomputed_positions_np: np.ndarray | None = None,
        prev_positions: torch.Tensor | None = None,
    ) -> None:
        """Record the scheduler-order (pre-split) inputs the drafter shifts.

        Fills ``input_ids_pcp_full`` (``.cpu`` and ``.gpu``), ``query_start_loc_pcp_full``
        and ``positions_pcp_full`` from ``input_batch.token_ids_cpu_tensor`` and
        ``input_batch.num_computed_tokens_cpu`` (or ``precomputed_positions_np``);
        under async scheduling repairs the ids with the previous step's tokens;
        with ``k >= 2`` builds ``mtp_slot_pad`` through
        ``input_batch.block_table.compute_slot_mapping_draft`` (decode-only batches,
        or DCP-only prefills, as the reference).
        """
        s, h = self.settings, self._host()
        if self.input_ids_pcp_full is None:
            raise RuntimeError("generate_pcp_mtp_input needs a speculative config and pcp * dcp > 1")
        n, P = h.num_reqs, s.pcp_size
        counts = np.array([num_scheduled_tokens[r] for r in list(input_batch.req_ids)[:n]], dtype=np.int32)
        if not np.array_equal(counts, h.num_scheduled):
            raise ValueError(
                f"num_scheduled_tokens {counts.tolist()} differ from init_batch_info's "
                f"{h.num_scheduled.tolist()}"
            )
        total = int(counts.sum())
        cu = np.cumsum(counts)
        if precomputed_positions_np is not None:
            # a request's first position is its corrected computed count
            first = np.minimum(cu - counts, max(total - 1, 0))
            computed = np.where(counts > 0, np.asarray(precomputed_positions_np)[first], 0)
        else:
            computed = np.asarray(input_batch.num_computed_tokens_cpu)[:n]
        bucket = self._bucket()
        computed_b = np.zeros(bucket.num_reqs, dtype=np.int64)
        computed_b[:n] = computed
        builds_mtp = s.decode_threshold > 2 and (not with_prefill or (P == 1 and s.dcp_size > 1))
        rows = _host.mtp_rows(h, s.decode_threshold) if builds_mtp else None
        slot_fn = _draft_slot_fn(input_batch.block_table, rows, on_host=True) if builds_mtp else None
        full = _ops.full_inputs(
            _ops.host_state(self._cpu_state, h, bucket),
            input_batch.token_ids_cpu_tensor,
            torch.from_numpy(computed_b),
            slot_fn,
        )
        ids, qsl = self.input_ids_pcp_full, self.query_start_loc_pcp_full
        ids.cpu[:total] = full.input_ids[:total]
        ids.copy_to_gpu(total)
        qsl.cpu[: bucket.num_reqs + 1] = full.query_start_loc
        qsl.cpu[bucket.num_reqs + 1 :] = -1
        qsl.copy_to_gpu()
        self.positions_pcp_full[:total] = full.positions[:total]
        changes: dict[str, Any] = {"cu_num_tokens_pcp_full": cu}
        if self.use_async_scheduling and precomputed_positions_np is None:
            changes["async_full"] = FullLayout(
                np.array(req_indices, copy=True),
                np.array(cu_num_tokens, copy=True),
                int(total_num_scheduled_tokens),
            )
        if builds_mtp:
            self._buffers.mtp_slot_pad[: rows * P].copy_(full.mtp.slot_mapping[: rows * P], non_blocking=True)
            changes["mtp_rows"] = rows
        self._set(**changes)
        if self.use_async_scheduling:
            self._repair_full_input_ids(input_batch, draft_token_ids, prev_positions)

    def _repair_full_input_ids(
        self, input_batch: Any, draft_token_ids: torch.Tensor | None, prev_positions: torch.Tensor | None
    ) -> None:
        """vllm-ascend ``_update_input_ids_pcp_full_ids``: last step's sampled and draft tokens into the ids.

        Without ``prev_positions`` each request's previous row comes from
        ``input_batch.req_id_to_index`` and ``prev_req_id_to_index`` (host, O(R)),
        and a decode's drafts are its ``n - 1`` spec tokens (the reference counts
        ``scheduled_spec_decode_tokens``: the same when the scheduler schedules
        ``1 + drafts`` tokens, as vLLM's does).
        """
        if input_batch.prev_sampled_token_ids is None or input_batch.prev_req_id_to_index is None:
            return
        h, rec = self._host(), self._record
        n, bucket = h.num_reqs, self._bucket()
        Rb = bucket.num_reqs
        if prev_positions is None:
            prev = np.full(Rb, -1, dtype=np.int64)
            previous = input_batch.prev_req_id_to_index
            for req_id, cur in input_batch.req_id_to_index.items():
                p = previous.get(req_id)
                if p is not None and cur < n:
                    prev[cur] = p
            if (prev < 0).all():
                return
            prev_dev = torch.from_numpy(prev).to(self.device)
        else:
            prev_dev = F.pad(prev_positions[:n].to(torch.int64), (0, Rb - n), value=-1)
        rows = _ops.full_rows(self.config, bucket)
        with self._graphs.guard():
            ids = self.input_ids_pcp_full.gpu[:rows]
            ids.copy_(
                _ops.repair_full_ids(
                    rec.state, ids, input_batch.prev_sampled_token_ids, draft_token_ids, prev_dev
                )
            )

    def rebuild_async_spec_decode_inputs(
        self,
        *,
        use_async_spec_decode: bool,
        valid_sampled_token_count_gpu: torch.Tensor | None,
        prev_req_id_to_index: Any,
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
        valid_sampled_token_count_event: Any | None,
        valid_sampled_token_count_cpu: torch.Tensor | None,
        input_batch: Any,
        input_ids: Any,
        scheduler_output: Any,
        arange_np: np.ndarray,
        cu_num_tokens: np.ndarray,
        draft_token_ids: torch.Tensor | None,
        num_spec_tokens: int,
        prepare_input_ids: Callable[..., None],
    ) -> PCPAsyncSpecDecodeRebuildResult:
        """Recompute positions (and the drafter's inputs) once async scheduling corrected ``num_computed``.

        Device branch (decode-only, no embeds or multimodal inputs):
        ``spec.rebuild_spec_positions`` on the corrected ``num_computed_tokens``
        writes ``positions`` and rebuilds ``mtp_slot_pad`` (through
        ``compute_slot_mapping_draft``), then hands the scheduler-order positions
        to ``input_batch.block_table.compute_slot_mapping``, so the block table's
        ``slot_mapping.gpu`` ends with the main model's slots. Host branch: corrects
        the counts with vllm-ascend's ``correct_optimistic_seq_lens_cpu``, refills the runner's host positions
        and input ids, and calls :meth:`generate_pcp_mtp_input` again.
        """
        s, h = self.settings, self._host()
        if not (
            s.cp_size > 1
            and use_async_spec_decode
            and valid_sampled_token_count_gpu is not None
            and bool(prev_req_id_to_index)
            and h.num_decode_reqs > 0
        ):
            return PCPAsyncSpecDecodeRebuildResult(rebuilt=False, positions_ready_on_device=False)
        full = self._record.async_full
        if full is None:
            raise RuntimeError("generate_pcp_mtp_input (async scheduling) must run before the rebuild")
        n, P = num_reqs, s.pcp_size
        on_device = (
            prev_positions_gpu is not None
            and not with_prefill
            and not enable_prompt_embeds
            and not has_req_prompt_embeds
            and not supports_mm_inputs
        )
        if not on_device:
            self._rebuild_on_host(
                h, full, num_computed_tokens_cpu, prev_positions_np, prev_num_draft_tokens_np,
                valid_sampled_token_count_event, valid_sampled_token_count_cpu, total_num_scheduled_tokens,
                positions_np, input_batch, input_ids, scheduler_output, cu_num_tokens, prepare_input_ids,
                with_prefill, arange_np, draft_token_ids, num_spec_tokens, prev_positions_gpu,
            )  # fmt: skip
            return PCPAsyncSpecDecodeRebuildResult(rebuilt=True, positions_ready_on_device=False)

        bucket = self._bucket()
        extra = s.decode_threshold - 2
        builds_mtp = extra > 0 and not with_prefill
        rows = full.num_tokens + n * extra if builds_mtp else 0
        slot_fn = _draft_slot_fn(input_batch.block_table, rows, on_host=False) if builds_mtp else None
        computed = F.pad(num_computed_tokens[:n].to(torch.int64), (0, bucket.num_reqs - n))
        # The draft slots are computed first (inside rebuild_positions) and the main model's last:
        # vllm-ascend's BlockTable writes both into slot_mapping.gpu for device inputs, and the
        # runner reads that buffer for the main model's padded slot mapping. (vllm-ascend calls
        # them the other way round, so its main model gets the MTP layout: see the README.)
        out = _ops.rebuild_positions(self._record.state, computed, slot_fn)
        positions[:total_num_scheduled_tokens].copy_(out.positions[:total_num_scheduled_tokens])
        if P > 1:
            input_batch.block_table.compute_slot_mapping(
                n, out.query_start_loc_full[: n + 1], out.positions_full[: full.num_tokens]
            )
        if builds_mtp:
            self._buffers.mtp_slot_pad[: rows * P].copy_(out.mtp.slot_mapping[: rows * P])
            self._set(mtp_rows=rows)
        return PCPAsyncSpecDecodeRebuildResult(rebuilt=True, positions_ready_on_device=True)

    def _rebuild_on_host(
        self, h, full, num_computed_tokens_cpu, prev_positions_np, prev_num_draft_tokens_np, event,
        valid_count_cpu, total, positions_np, input_batch, input_ids, scheduler_output, cu_num_tokens,
        prepare_input_ids, with_prefill, arange_np, draft_token_ids, num_spec_tokens, prev_positions_gpu,
    ) -> None:  # fmt: skip
        n, P = h.num_reqs, self.pcp_world_size
        base = np.array(num_computed_tokens_cpu[:n], copy=True)
        if event is None or valid_count_cpu is None:
            raise ValueError("the host rebuild needs valid_sampled_token_count_event and _cpu")
        event.synchronize()
        _correct_optimistic_seq_lens()(
            base, prev_positions_np, prev_num_draft_tokens_np, valid_count_cpu.numpy(), n
        )
        # this rank's tokens: corrected counts plus the split's offsets (the host twin's)
        owners, offsets = _host.local_tokens(h, self.pcp_use_hybrid_attn)
        np.add(base[owners], offsets[:total], out=positions_np[:total])
        width = input_batch.token_ids_cpu.shape[1]
        token_indices = positions_np[:total] + owners * width
        torch.index_select(
            input_batch.token_ids_cpu_tensor.flatten(),
            0,
            torch.from_numpy(np.asarray(token_indices, dtype=np.int64)),
            out=input_ids.cpu[:total],
        )
        input_ids.copy_to_gpu(total)
        prepare_input_ids(scheduler_output, n, total, cu_num_tokens)
        counts = np.diff(np.concatenate(([0], full.cu_num_tokens)))
        positions_full = base[full.req_indices] + (
            np.arange(full.num_tokens) - np.repeat(full.cu_num_tokens - counts, counts)
        )
        if P > 1:
            qsl = torch.zeros(n + 1, dtype=torch.int32)
            qsl[1:] = torch.from_numpy(np.asarray(full.cu_num_tokens, dtype=np.int32))
            input_batch.block_table.compute_slot_mapping(
                n, qsl.to(self.device), torch.from_numpy(positions_full).to(self.device)
            )
        self.generate_pcp_mtp_input(
            full.num_tokens,
            scheduler_output.num_scheduled_tokens,
            with_prefill,
            input_batch,
            arange_np,
            full.req_indices,
            positions_full,
            full.cu_num_tokens,
            draft_token_ids,
            scheduler_output,
            num_spec_tokens,
            precomputed_positions_np=positions_full,
            prev_positions=prev_positions_gpu,
        )
