"""The proposer-side speculative-decode (MTP) methods of the vllm-ascend manager, on pcp_fn.spec.

vllm-ascend's MTP proposer calls these after the target model's forward:

| vllm-ascend `PCPManager`                  | pcp_fn                                        |
|-------------------------------------------|-----------------------------------------------|
| `get_spec_decode_decode_hidden_states`    | `decode_hidden_states` (rows from the step)   |
| `prepare_spec_decode_first_pass_inputs`   | `spec.first_pass_inputs` (+ the hybrid split) |
| `prepare_spec_decode_mtp_drafting_inputs` | `spec.mtp_slot_inputs`                        |
| `mask_spec_decode_restore_idx_for_graph`  | `spec.mask_restore_index_for_graph`           |
| `update_spec_decode_drafting_cp_metadata` | `spec.drafting_cp_seq_lens`                   |

Each keeps the reference's signature, return type (same field names) and side
effects on the objects it is handed (`common_attn_metadata`, the caller's
`token_indices_to_sample` and restore index).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from ....dcs import host as dcs_host
from . import _ops
from ._parts import ManagerParts
from .engine_types import AscendCommonAttentionMetadata, DraftAttentionMetadata


@dataclasses.dataclass(frozen=True)
class PCPSpecDecodeMTPInputs:
    """Device-side PCP state of the MTP draft steps (vllm-ascend's fields)."""

    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor | None
    slot_indices: torch.Tensor
    slot_mapping: torch.Tensor


@dataclasses.dataclass(frozen=True)
class PCPSpecDecodeFirstPassInputs:
    """PCP-adjusted inputs of the first draft pass (vllm-ascend's fields)."""

    num_tokens: int
    input_ids: torch.Tensor
    target_positions: torch.Tensor
    target_hidden_states: torch.Tensor
    token_indices_to_sample: torch.Tensor
    long_seq_args: tuple[torch.Tensor | None, torch.Tensor | None] | None


def _isinstance_of(obj: object, module: str, name: str) -> bool:
    """`isinstance(obj, module.name)` when vllm-ascend is importable, else `False`."""
    try:
        cls = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return False
    return isinstance(obj, cls)


class Proposer:
    """The proposer-side spec-decode helpers of
    [`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager].

    Holds what it reads and writes: the settings and config, the persistent buffers (the
    step's decode rows and restore index, the full query lengths, `mtp_slot_pad`), the
    device graphs (their sync guard), the manager's record cell (the step and its MTP slot
    rows), and the states the ops tied to no step read (the CPU's and the capacity bucket's).
    """

    def __init__(self, parts: ManagerParts) -> None:
        self.settings, self.config, self.buffers = parts.settings, parts.config, parts.buffers
        self.graphs, self.records = parts.graphs, parts.records
        self.cpu_state, self.capacity_state = parts.cpu_state, parts.capacity_state

    def decode_hidden_states(self, hidden: torch.Tensor, num_decode_tokens: int | None) -> torch.Tensor:
        """`get_spec_decode_decode_hidden_states`."""
        if num_decode_tokens is None:
            host = self.records.current.host
            num_decode_tokens = 0 if host is None else host.num_decode_tokens
        D = num_decode_tokens
        if D == 0:
            return hidden
        if self.settings.hybrid_attn or self.settings.pcp_size == 1:
            return hidden[:D]
        with self.graphs.guard():
            return hidden.index_select(0, self.buffers.step["decode_rows"][:D])

    def first_pass(
        self, input_ids: torch.Tensor, target_positions: torch.Tensor, hidden: torch.Tensor,
        tis: torch.Tensor, common_attn_metadata: AscendCommonAttentionMetadata,
        long_seq_metadata: object | None, logits_indices: torch.Tensor, num_tokens: int,
        num_prefill_reqs: int, num_decode_reqs: int, uses_mrope: bool,
    ) -> PCPSpecDecodeFirstPassInputs:  # fmt: skip
        """`prepare_spec_decode_first_pass_inputs` (`tis`: `token_indices_to_sample`;
        `long_seq_metadata`: `generate_pcp_metadata`'s, set on `common_attn_metadata`)."""
        s = self.settings
        unchanged = PCPSpecDecodeFirstPassInputs(num_tokens, input_ids, target_positions, hidden, tis, None)
        if s.cp_size <= 1:
            return unchanged
        if long_seq_metadata is None:
            raise ValueError("long_seq_metadata is required when pcp * dcp > 1")
        common_attn_metadata.prefill_context_parallel_metadata = long_seq_metadata
        long_seq_args = (self.buffers.query_lens_pcp_full.cpu[:num_decode_reqs], tis.clone())
        if s.pcp_size <= 1:
            return dataclasses.replace(unchanged, long_seq_args=long_seq_args)
        h = self.records.host()
        N = h.num_tokens  # this rank's rows: the decodes' tokens and its prefill chunks
        n = num_decode_reqs + num_prefill_reqs
        with self.graphs.guard():
            new_ids, new_hidden = self._first_pass_rows(
                h, input_ids, hidden, tis, logits_indices, num_tokens, n, num_prefill_reqs
            )
        if num_prefill_reqs:
            self._first_pass_metadata(common_attn_metadata, h, num_decode_reqs, N)
        positions = target_positions[:, :N] if uses_mrope else target_positions[:N]
        return PCPSpecDecodeFirstPassInputs(N, new_ids, positions, new_hidden, tis, long_seq_args)

    def _first_pass_rows(
        self, h: dcs_host.HostLayout, input_ids: torch.Tensor, hidden: torch.Tensor, tis: torch.Tensor,
        logits_indices: torch.Tensor, num_tokens: int, n: int, num_prefill_reqs: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """This rank's ids and hidden rows of the first pass; `tis[:n]` rewritten in place."""
        bucket, state = self.records.bucket(), self.records.current.state
        D, N = h.num_decode_tokens, h.num_tokens
        ids_full = F.pad(input_ids[:num_tokens], (0, _ops.full_rows(self.config, bucket) - num_tokens))
        tis_b = F.pad(tis[:n].to(torch.int64), (0, bucket.num_reqs - n))
        ids, rows, new_tis = _ops.first_pass_selection(state, ids_full, tis_b, logits_indices)
        if not self.settings.hybrid_attn:
            new_ids = ids[:N]
            new_hidden = hidden.index_select(0, rows[:N])
        else:  # decodes replicated (FA order, rank-major), prefills split linearly for the drafter
            new_ids, new_hidden = input_ids[:D], hidden[:D]
            if num_prefill_reqs:
                # vllm-ascend's _split_spec_decode_pcp_prefill_input_hybrid takes the prefill parts
                # (ids from token D, restored rows from D * P); the op takes the whole buffers
                split = _ops.split_prefill(state, ids_full, hidden)
                new_ids = torch.cat([new_ids, split.input_ids[: N - D]])
                new_hidden = torch.cat([new_hidden, split.hidden_states[: N - D]])
        tis[:n].copy_(new_tis[:n])
        return new_ids, new_hidden

    def _first_pass_metadata(
        self,
        common_attn_metadata: AscendCommonAttentionMetadata,
        h: dcs_host.HostLayout,
        nd: int,
        num_tokens: int,
    ) -> None:
        seq_p = h.pcp_tokens[nd:]
        k = seq_p.shape[0]
        common_attn_metadata.num_actual_tokens = num_tokens
        common_attn_metadata.max_query_len = max(self.settings.decode_threshold, int(seq_p.max()))
        lens = torch.from_numpy(seq_p.copy())
        common_attn_metadata.seq_lens[-k:] = lens
        if common_attn_metadata.seq_lens_cpu is not None:
            common_attn_metadata.seq_lens_cpu[-k:] = lens
        if getattr(common_attn_metadata, "_seq_lens_cpu", None) is not None:
            common_attn_metadata._seq_lens_cpu[-k:] = lens
        qsl = torch.from_numpy(
            np.cumsum(seq_p, dtype=np.int64) + int(common_attn_metadata.query_start_loc_cpu[nd])
        )
        common_attn_metadata.query_start_loc[-k:] = qsl
        common_attn_metadata.query_start_loc_cpu[-k:] = qsl

    def mtp_drafting(
        self, common_attn_metadata: AscendCommonAttentionMetadata, attn_metadata: object,
        ori_tis: torch.Tensor | None, batch_size: int, num_decode_reqs: int, is_prefill_batch: bool, k: int,
    ) -> PCPSpecDecodeMTPInputs | None:  # fmt: skip
        """`prepare_spec_decode_mtp_drafting_inputs` (`k`: `num_speculative_tokens`)."""
        s = self.settings
        decode_only = num_decode_reqs > 0 and not is_prefill_batch
        dcp_prefill = s.pcp_size == 1 and s.dcp_size > 1 and is_prefill_batch
        if k <= 1 or not (decode_only or dcp_prefill):
            return None
        if ori_tis is None:
            raise ValueError("ori_token_indices_to_sample is required for the MTP drafting inputs")
        slot_mapping = self.buffers.mtp_slot_view(self.records.current.mtp_rows, s.pcp_size)
        if slot_mapping is None:
            raise RuntimeError("no MTP slot mapping was built (generate_pcp_mtp_input of a decode batch)")
        bucket = self.records.bucket()
        num_reqs = batch_size if dcp_prefill else num_decode_reqs
        with self.graphs.guard():
            tis = F.pad(ori_tis[:num_reqs].to(torch.int64), (0, bucket.num_reqs - num_reqs))
            # the op checks the layout's [M_b * P] rows; only the step's real rows are ever built
            layout_rows = _ops.mtp_rows(self.config, bucket) * s.pcp_size
            slot_indices = _ops.mtp_slot_indices(
                self.records.current.state, tis, self.buffers.mtp_slot_pad[:layout_rows], num_reqs, k
            )[: num_reqs * s.pcp_size]
        seq_lens, seq_lens_cpu = _draft_seq_lens(attn_metadata, batch_size)
        common_attn_metadata.block_table_tensor = common_attn_metadata.block_table_tensor[:batch_size]
        return PCPSpecDecodeMTPInputs(seq_lens, seq_lens_cpu, slot_indices, slot_mapping)

    def mask_restore(self, pcp_allgather_restore_idx: torch.Tensor) -> None:
        """`mask_spec_decode_restore_idx_for_graph`."""
        buf = self.buffers.step["restore"]
        length = pcp_allgather_restore_idx.shape[0]
        if length > buf.shape[0]:
            raise ValueError(f"the restore index has {length} rows; the buffer holds {buf.shape[0]}")
        with self.graphs.guard():
            pcp_allgather_restore_idx.copy_(_ops.mask_restore(self.capacity_state, pcp_allgather_restore_idx))
            buf[:length].copy_(pcp_allgather_restore_idx)
            buf[length:].zero_()

    def drafting_cp_metadata(
        self, attn_metadata: DraftAttentionMetadata, kv_cache_spec: object, seq_lens: torch.Tensor,
        draft_index: int, seq_lens_cpu: torch.Tensor | None, attn_metadata_builder: object | None,
    ) -> None:  # fmt: skip
        """`update_spec_decode_drafting_cp_metadata`."""
        self.settings.require_interleave("update_spec_decode_drafting_cp_metadata")
        is_mla = _isinstance_of(
            kv_cache_spec, "vllm_ascend.core.kv_cache_interface", "AscendMLAAttentionSpec"
        )
        is_sfa = attn_metadata_builder is not None and _isinstance_of(
            attn_metadata_builder,
            "vllm_ascend.attention.context_parallel.sfa_cp",
            "AscendSFADCPMetadataBuilder",
        )
        lens_in = seq_lens if is_mla or seq_lens_cpu is None else seq_lens_cpu
        state = self.cpu_state if lens_in.device.type == "cpu" else self.capacity_state
        out = _ops.drafting_lens(state, lens_in, draft_index)
        if is_sfa:
            target = attn_metadata.dcp_context.seq_lens
            k = out.cp_seq_len.shape[0]
            target[:k].copy_(out.cp_seq_len.to(device=target.device, dtype=target.dtype), non_blocking=True)
            target[k:].fill_(0)
        elif is_mla:
            attn_metadata.decode.cp_seq_len = out.cp_seq_len
        else:
            attn_metadata.decode_meta.num_computed_tokens_of_pcp_dcp = (
                out.num_computed_tokens_of_pcp_dcp.numpy()
            )


def _draft_seq_lens(attn_metadata: object, batch_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Copies of the draft batch's `seq_lens` (`seq_lens_cpu` where it has none) and `seq_lens_cpu`
    (any attention metadata: both are read with getattr)."""
    seq_lens = getattr(attn_metadata, "seq_lens", None)
    seq_lens_cpu = getattr(attn_metadata, "seq_lens_cpu", None)
    if seq_lens is None:
        if seq_lens_cpu is None:
            raise ValueError("attn_metadata has neither seq_lens nor seq_lens_cpu")
        seq_lens = seq_lens_cpu
    seq_lens = seq_lens[:batch_size].clone()
    if seq_lens_cpu is not None:
        seq_lens_cpu = seq_lens_cpu[:batch_size].clone()
    return seq_lens, seq_lens_cpu
