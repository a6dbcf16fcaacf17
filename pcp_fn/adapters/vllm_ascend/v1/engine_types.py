"""The vllm-ascend 0.23 objects `model_runner_v1.py` hands
[`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager], as typing protocols: one
per vllm-ascend class, naming what the manager reads (or writes) of it.

The vLLM objects the runner hands it too (`VllmConfig`, `SchedulerOutput`, `CpuGpuBuffer`,
`CachedRequestState`, ...) are [`pcp_fn.adapters.vllm.engine_types`][]'; this line imports
them for annotations only (`TYPE_CHECKING`), so importing it imports no other adapter.
Annotations only: nothing checks an object against them. This module imports neither vLLM nor
vllm-ascend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from ...vllm.engine_types import CpuGpuBuffer


class BlockTable(Protocol):
    """vllm-ascend's `BlockTable` (`vllm_ascend/worker/block_table.py`): one KV-cache group's."""

    slot_mapping: CpuGpuBuffer  # the slots compute_slot_mapping(_draft) last wrote


class MultiGroupBlockTable(Protocol):
    """vllm-ascend's `MultiGroupBlockTable` (`vllm_ascend/worker/block_table.py`): the batch's."""

    block_tables: list[BlockTable]

    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor
    ) -> None: ...

    # host (numpy) indices write slot_mapping.cpu, device ones slot_mapping.gpu
    def compute_slot_mapping_draft(
        self, req_indices: np.ndarray | torch.Tensor, positions: np.ndarray | torch.Tensor
    ) -> None: ...


class NPUInputBatch(Protocol):
    """vllm-ascend's `NPUInputBatch` (`vllm_ascend/worker/npu_input_batch.py`): the runner's batch."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    num_computed_tokens_cpu: np.ndarray  # [max_num_reqs]
    token_ids_cpu: np.ndarray  # [max_num_reqs, max_model_len]
    token_ids_cpu_tensor: torch.Tensor  # the same memory
    block_table: MultiGroupBlockTable
    prev_sampled_token_ids: torch.Tensor | None  # async scheduling: last step's
    prev_req_id_to_index: dict[str, int] | None


class DeviceEvent(Protocol):
    """A device event (`torch.npu.Event` on an NPU): the async rebuild waits on it."""

    def synchronize(self) -> None: ...


class AscendCommonAttentionMetadata(Protocol):
    """vllm-ascend's `AscendCommonAttentionMetadata` (`vllm_ascend/attention/utils.py`): the drafter's."""

    prefill_context_parallel_metadata: object  # set to generate_pcp_metadata's result
    num_actual_tokens: int
    max_query_len: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor | None  # (_seq_lens_cpu too, with getattr, where it has one)
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    block_table_tensor: torch.Tensor


class AscendMLADecodeMetadata(Protocol):
    """vllm-ascend's `AscendMLADecodeMetadata` (`vllm_ascend/attention/mla_v1.py`)."""

    cp_seq_len: torch.Tensor


class AscendMLAMetadata(Protocol):
    """vllm-ascend's `AscendMLAMetadata` (`vllm_ascend/attention/mla_v1.py`): an MLA draft step's."""

    decode: AscendMLADecodeMetadata


class DCPContext(Protocol):
    """vllm-ascend's SFA `DCPContext` (`vllm_ascend.attention.context_parallel.sfa_cp`)."""

    seq_lens: torch.Tensor


class AscendSFADCPMetadata(Protocol):
    """vllm-ascend's `AscendSFADCPMetadata` (built by `AscendSFADCPMetadataBuilder`, `sfa_cp`)."""

    dcp_context: DCPContext


class AscendMetadataForDecode(Protocol):
    """vllm-ascend's `AscendMetadataForDecode` (`vllm_ascend/attention/context_parallel/common_cp.py`)."""

    num_computed_tokens_of_pcp_dcp: np.ndarray


class AscendMetadata(Protocol):
    """vllm-ascend's `AscendMetadata` (`vllm_ascend/attention/attention_v1.py`): a draft step's."""

    decode_meta: AscendMetadataForDecode


DraftAttentionMetadata = AscendMLAMetadata | AscendSFADCPMetadata | AscendMetadata
"""The drafter's attention metadata `update_spec_decode_drafting_cp_metadata` writes into, told apart by the
KV-cache spec (MLA) and the metadata builder (SFA with DCP)."""
