"""The runner-side speculative-decode (MTP) methods of the vllm-ascend manager, on pcp_fn.spec.

`model_runner_v1.py` calls these two while it prepares a step:

| vllm-ascend `PCPManager`           | pcp_fn                                         |
|------------------------------------|------------------------------------------------|
| `generate_pcp_mtp_input`           | `spec.full_input_ids` (on the CPU token table) |
| `_update_input_ids_pcp_full_ids`   | `spec.repair_full_input_ids`                   |
| `rebuild_async_spec_decode_inputs` | `spec.rebuild_spec_positions` (device branch)  |

They keep the reference's signatures and side effects (the full-input
buffers, `mtp_slot_pad`, the block table's slot-mapping calls, the runner's
positions), and the state they carry to later calls (the async layout, the
MTP slot rows) lives in the manager's frozen record (its `pcp_fn.adapters.vllm_ascend.v1._record.RecordCell`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ....dcs import host as dcs_host
from . import _ops
from ._parts import ManagerParts
from ._record import FullLayout
from .engine_types import DeviceEvent, MultiGroupBlockTable, NPUInputBatch

if TYPE_CHECKING:  # the vLLM objects' protocols, for annotations only (no other adapter imported)
    from ...vllm.engine_types import CpuGpuBuffer, SchedulerOutput


@dataclasses.dataclass(frozen=True)
class PCPAsyncSpecDecodeRebuildResult:
    """Whether the async rebuild ran, and whether it left the positions on the device."""

    rebuilt: bool
    positions_ready_on_device: bool


@dataclasses.dataclass(frozen=True)
class AsyncRebuildArgs:
    """The arguments of `rebuild_async_spec_decode_inputs` the rebuild reads (the runner's names)."""

    use_async_spec_decode: bool
    valid_sampled_token_count_gpu: torch.Tensor | None
    prev_req_id_to_index: dict[str, int] | None
    prev_positions_gpu: torch.Tensor | None
    with_prefill: bool
    enable_prompt_embeds: bool
    has_req_prompt_embeds: bool
    supports_mm_inputs: bool
    num_reqs: int
    total_num_scheduled_tokens: int
    positions: torch.Tensor
    positions_np: np.ndarray
    num_computed_tokens: torch.Tensor
    num_computed_tokens_cpu: np.ndarray
    prev_positions_np: np.ndarray
    prev_num_draft_tokens_np: np.ndarray
    valid_sampled_token_count_event: DeviceEvent | None
    valid_sampled_token_count_cpu: torch.Tensor | None
    input_batch: NPUInputBatch
    input_ids: CpuGpuBuffer
    scheduler_output: SchedulerOutput
    cu_num_tokens: np.ndarray
    draft_token_ids: torch.Tensor | None
    prepare_input_ids: Callable[[SchedulerOutput, int, int, np.ndarray], None]  # the runner's


def _draft_slot_fn(block_table: MultiGroupBlockTable, num_rows: int, on_host: bool) -> _ops.SlotFn:
    """`slot_fn` over the runner's block table: its `compute_slot_mapping_draft` on the real rows.

    Reads `block_table.block_tables[0].slot_mapping.cpu` (host rows) or `.gpu`.
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


class SpecInputsBuilder:
    """The runner-side spec-decode inputs of
    [`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager]
    (`generate_pcp_mtp_input`, `rebuild_async_spec_decode_inputs`).

    Holds what it reads and writes: the settings and config, the persistent buffers (the
    full-input buffers, `mtp_slot_pad`), the device graphs (their sync guard), the
    manager's record cell (the step; the layouts it records for later calls) and the
    CPU-side state the ops over the CPU token table read.
    """

    def __init__(self, parts: ManagerParts) -> None:
        self.settings, self.config, self.buffers = parts.settings, parts.config, parts.buffers
        self.graphs, self.records, self.cpu_state = parts.graphs, parts.records, parts.cpu_state

    # ------------------------------------------------------------ generate_pcp_mtp_input
    def generate(
        self, total: int, num_scheduled_tokens: dict[str, int], with_prefill: bool,
        input_batch: NPUInputBatch, req_indices: np.ndarray | None, cu_num_tokens: np.ndarray | None,
        draft_token_ids: torch.Tensor | None, precomputed_positions_np: np.ndarray | None,
        prev_positions: torch.Tensor | None,
    ) -> None:  # fmt: skip
        """`generate_pcp_mtp_input` (the arguments it reads)."""
        s, h = self.settings, self.records.host()
        if self.buffers.input_ids_pcp_full is None:
            raise RuntimeError("generate_pcp_mtp_input needs a speculative config and pcp * dcp > 1")
        n, P = h.num_reqs, s.pcp_size
        counts = np.array([num_scheduled_tokens[r] for r in list(input_batch.req_ids)[:n]], dtype=np.int32)
        if not np.array_equal(counts, h.num_scheduled):
            raise ValueError(
                f"num_scheduled_tokens {counts.tolist()} differ from init_batch_info's "
                f"{h.num_scheduled.tolist()}"
            )
        cu = np.cumsum(counts)
        bucket = self.records.bucket()
        computed_b = np.zeros(bucket.num_reqs, dtype=np.int64)
        computed_b[:n] = _first_positions(counts, cu, precomputed_positions_np, input_batch, n)
        builds_mtp = s.decode_threshold > 2 and (not with_prefill or (P == 1 and s.dcp_size > 1))
        rows = dcs_host.mtp_rows(h, s.decode_threshold) if builds_mtp else None
        slot_fn = _draft_slot_fn(input_batch.block_table, rows, on_host=True) if builds_mtp else None
        full = _ops.full_inputs(
            _ops.host_state(self.cpu_state, h, bucket),
            input_batch.token_ids_cpu_tensor,
            torch.from_numpy(computed_b),
            slot_fn,
        )
        self._write_full(full, int(counts.sum()), bucket)
        changes: dict[str, Any] = {"cu_num_tokens_pcp_full": cu}
        if s.use_async_scheduling and precomputed_positions_np is None:
            changes["async_full"] = FullLayout(
                np.array(req_indices, copy=True), np.array(cu_num_tokens, copy=True), int(total)
            )
        if builds_mtp:
            self.buffers.mtp_slot_pad[: rows * P].copy_(full.mtp.slot_mapping[: rows * P], non_blocking=True)
            changes["mtp_rows"] = rows
        self.records.set(**changes)
        if s.use_async_scheduling:
            self._repair_full_input_ids(input_batch, draft_token_ids, prev_positions)

    def _write_full(self, full: _ops.FullInputs, total: int, bucket: _ops.Bucket) -> None:
        """The scheduler-order inputs into `input_ids_pcp_full` (both halves),
        `query_start_loc_pcp_full` (-1 past the bucket's rows) and `positions_pcp_full`."""
        b = self.buffers
        ids, qsl = b.input_ids_pcp_full, b.query_start_loc_pcp_full
        ids.cpu[:total] = full.input_ids[:total]
        ids.copy_to_gpu(total)
        qsl.cpu[: bucket.num_reqs + 1] = full.query_start_loc
        qsl.cpu[bucket.num_reqs + 1 :] = -1
        qsl.copy_to_gpu()
        b.positions_pcp_full[:total] = full.positions[:total]

    def _repair_full_input_ids(
        self,
        input_batch: NPUInputBatch,
        draft_token_ids: torch.Tensor | None,
        prev_positions: torch.Tensor | None,
    ) -> None:
        """vllm-ascend `_update_input_ids_pcp_full_ids`: last step's sampled and draft tokens into the ids.

        Without `prev_positions` each request's previous row comes from
        `input_batch.req_id_to_index` and `prev_req_id_to_index` (host, O(R)),
        and a decode's drafts are its `n - 1` spec tokens (the reference counts
        `scheduled_spec_decode_tokens`: the same when the scheduler schedules
        `1 + drafts` tokens, as vLLM's does).
        """
        if input_batch.prev_sampled_token_ids is None or input_batch.prev_req_id_to_index is None:
            return
        h, rec = self.records.host(), self.records.current
        n, bucket = h.num_reqs, self.records.bucket()
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
            prev_dev = torch.from_numpy(prev).to(self.settings.device)
        else:
            prev_dev = F.pad(prev_positions[:n].to(torch.int64), (0, Rb - n), value=-1)
        rows = _ops.full_rows(self.config, bucket)
        with self.graphs.guard():
            ids = self.buffers.input_ids_pcp_full.gpu[:rows]
            ids.copy_(
                _ops.repair_full_ids(
                    rec.state, ids, input_batch.prev_sampled_token_ids, draft_token_ids, prev_dev
                )
            )

    # ------------------------------------------------------------ rebuild_async_spec_decode_inputs
    def rebuild(self, args: AsyncRebuildArgs) -> PCPAsyncSpecDecodeRebuildResult:
        """`rebuild_async_spec_decode_inputs` (its keyword arguments in `args`)."""
        s, h = self.settings, self.records.host()
        if not (
            s.cp_size > 1
            and args.use_async_spec_decode
            and args.valid_sampled_token_count_gpu is not None
            and bool(args.prev_req_id_to_index)
            and h.num_decode_reqs > 0
        ):
            return PCPAsyncSpecDecodeRebuildResult(rebuilt=False, positions_ready_on_device=False)
        full = self.records.current.async_full
        if full is None:
            raise RuntimeError("generate_pcp_mtp_input (async scheduling) must run before the rebuild")
        on_device = (
            args.prev_positions_gpu is not None
            and not args.with_prefill
            and not args.enable_prompt_embeds
            and not args.has_req_prompt_embeds
            and not args.supports_mm_inputs
        )
        if not on_device:
            self._rebuild_on_host(h, full, args)
            return PCPAsyncSpecDecodeRebuildResult(rebuilt=True, positions_ready_on_device=False)
        self._rebuild_on_device(full, args)
        return PCPAsyncSpecDecodeRebuildResult(rebuilt=True, positions_ready_on_device=True)

    def _rebuild_on_device(self, full: FullLayout, args: AsyncRebuildArgs) -> None:
        s, n, P = self.settings, args.num_reqs, self.settings.pcp_size
        bucket = self.records.bucket()
        extra = s.decode_threshold - 2
        builds_mtp = extra > 0 and not args.with_prefill
        rows = full.num_tokens + n * extra if builds_mtp else 0
        slot_fn = _draft_slot_fn(args.input_batch.block_table, rows, on_host=False) if builds_mtp else None
        computed = F.pad(args.num_computed_tokens[:n].to(torch.int64), (0, bucket.num_reqs - n))
        # The draft slots are computed first (inside rebuild_positions) and the main model's last:
        # vllm-ascend's BlockTable writes both into slot_mapping.gpu for device inputs, and the
        # runner reads that buffer for the main model's padded slot mapping. (vllm-ascend calls
        # them the other way round, so its main model gets the MTP layout: a deviation listed in
        # docs/adapters/vllm-ascend.md.)
        out = _ops.rebuild_positions(self.records.current.state, computed, slot_fn)
        total = args.total_num_scheduled_tokens
        args.positions[:total].copy_(out.positions[:total])
        if P > 1:
            args.input_batch.block_table.compute_slot_mapping(
                n, out.query_start_loc_full[: n + 1], out.positions_full[: full.num_tokens]
            )
        if builds_mtp:
            self.buffers.mtp_slot_pad[: rows * P].copy_(out.mtp.slot_mapping[: rows * P])
            self.records.set(mtp_rows=rows)

    def _rebuild_on_host(self, h: dcs_host.HostLayout, full: FullLayout, args: AsyncRebuildArgs) -> None:
        n, total = h.num_reqs, args.total_num_scheduled_tokens
        base = np.array(args.num_computed_tokens_cpu[:n], copy=True)
        event, valid_count_cpu = args.valid_sampled_token_count_event, args.valid_sampled_token_count_cpu
        if event is None or valid_count_cpu is None:
            raise ValueError("the host rebuild needs valid_sampled_token_count_event and _cpu")
        event.synchronize()
        _correct_optimistic_seq_lens()(
            base, args.prev_positions_np, args.prev_num_draft_tokens_np, valid_count_cpu.numpy(), n
        )
        # this rank's tokens: corrected counts plus the split's offsets (the host twin's)
        owners, offsets = h.local_tokens()
        positions_np = args.positions_np
        np.add(base[owners], offsets[:total], out=positions_np[:total])
        width = args.input_batch.token_ids_cpu.shape[1]
        token_indices = positions_np[:total] + owners * width
        torch.index_select(
            args.input_batch.token_ids_cpu_tensor.flatten(),
            0,
            torch.from_numpy(np.asarray(token_indices, dtype=np.int64)),
            out=args.input_ids.cpu[:total],
        )
        args.input_ids.copy_to_gpu(total)
        args.prepare_input_ids(args.scheduler_output, n, total, args.cu_num_tokens)
        positions_full = self._full_slots_on_host(full, base, args.input_batch, n)
        self.generate(
            full.num_tokens,
            args.scheduler_output.num_scheduled_tokens,
            args.with_prefill,
            args.input_batch,
            full.req_indices,
            full.cu_num_tokens,
            args.draft_token_ids,
            positions_full,
            args.prev_positions_gpu,
        )

    def _full_slots_on_host(
        self, full: FullLayout, base: np.ndarray, input_batch: NPUInputBatch, n: int
    ) -> np.ndarray:
        """The corrected scheduler-order positions; with `P > 1` the block table's slot mapping of them."""
        counts = np.diff(np.concatenate(([0], full.cu_num_tokens)))
        positions_full = base[full.req_indices] + (
            np.arange(full.num_tokens) - np.repeat(full.cu_num_tokens - counts, counts)
        )
        if self.settings.pcp_size > 1:
            device = self.settings.device
            qsl = torch.zeros(n + 1, dtype=torch.int32)
            qsl[1:] = torch.from_numpy(np.asarray(full.cu_num_tokens, dtype=np.int32))
            input_batch.block_table.compute_slot_mapping(
                n, qsl.to(device), torch.from_numpy(positions_full).to(device)
            )
        return positions_full


def _first_positions(
    counts: np.ndarray, cu: np.ndarray, precomputed: np.ndarray | None, input_batch: NPUInputBatch, n: int
) -> np.ndarray:
    """Each request's computed tokens: its first precomputed position when given (its corrected
    computed count), else `input_batch.num_computed_tokens_cpu`."""
    if precomputed is None:
        return np.asarray(input_batch.num_computed_tokens_cpu)[:n]
    first = np.minimum(cu - counts, max(int(counts.sum()) - 1, 0))
    return np.where(counts > 0, np.asarray(precomputed)[first], 0)
