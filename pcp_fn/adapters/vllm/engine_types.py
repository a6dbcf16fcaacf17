"""The vLLM objects pcp_fn reads, as typing protocols: one per vLLM class, naming the attributes
and methods the adapters read of it and nothing else.

The drop-ins take vLLM's objects and the tests' stand-ins alike (duck typing): these protocols
are annotations only, nothing checks an object against them. The classes vllm-ascend adds are
in [`pcp_fn.adapters.vllm_ascend.v1.engine_types`][] (vllm-ascend 0.23's `model_runner_v1`)
and [`pcp_fn.adapters.vllm_ascend.v2.engine_types`][] (vllm-ascend main's model runner V2);
they read vLLM's too, so a protocol here may name an attribute only one of them reads (the
comment beside it says which). This module imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

# ------------------------------------------------------------------ model runner V2: the step


class CUDAGraphMode(Protocol):
    """A member of vLLM's `CUDAGraphMode` enum (`vllm/config/compilation.py`)."""

    name: str

    def has_full_cudagraphs(self) -> bool: ...  # (the vllm-ascend V2 manager's validate_config)


class CUDAGraphModes(Protocol):
    """vLLM's `CUDAGraphMode` enum class itself: the members a mode is compared with."""

    NONE: CUDAGraphMode
    PIECEWISE: CUDAGraphMode
    FULL: CUDAGraphMode
    FULL_DECODE_ONLY: CUDAGraphMode


class BatchExecutionDescriptor(Protocol):
    """vLLM's `BatchExecutionDescriptor` (`vllm/v1/worker/gpu/cudagraph_utils.py`)."""

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None
    # max_query_len and uniform_token_count are read with getattr: a descriptor without them
    # (the vllm-ascend V2 manager's own) bounds a FULL graph's queries by its tokens


class InputBuffers(Protocol):
    """vLLM's `InputBuffers` (`vllm/v1/worker/gpu/input_batch.py`): persistent step inputs."""

    input_ids: torch.Tensor  # [T] int32
    positions: torch.Tensor  # [T] int64
    is_padding: torch.Tensor  # [T] bool
    query_start_loc: torch.Tensor  # [R + 1] int32
    seq_lens: torch.Tensor  # [R] int32
    dcp_local_seq_lens: torch.Tensor  # [R] int32


InputBuffersFactory = Callable[[int, int, torch.device], InputBuffers]
"""What makes the local `InputBuffers`: `(max_num_reqs, max_num_tokens, device)`, vLLM's constructor or a
factory with its signature."""


class InputBatch(Protocol):
    """vLLM's `InputBatch` dataclass (`vllm/v1/worker/gpu/input_batch.py`), global or local.

    A dataclass: the local batch is the global one with fields replaced
    ([`pcp_fn.adapters.vllm.replace.replace_fields`][]); those fields are not listed here.
    """

    req_ids: list[str]
    num_reqs_after_padding: int
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    num_scheduled_tokens: np.ndarray
    num_tokens: int
    num_tokens_after_padding: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor
    num_computed_tokens_np: np.ndarray
    prefill_len_np: np.ndarray
    is_prefilling_np: np.ndarray
    input_ids: torch.Tensor
    positions: torch.Tensor
    is_padding: torch.Tensor
    # max_query_len is read with getattr (a capture batch's query bound; None without one)

    @classmethod
    def make_dummy(
        cls, num_reqs: int, num_tokens: int, input_buffers: InputBuffers, max_query_len: int | None = None
    ) -> InputBatch: ...


class UvaBackedTensor(Protocol):
    """vLLM's `UvaBackedTensor` (`vllm/v1/worker/gpu/buffer_utils.py`): a host array the device reads."""

    np: np.ndarray


class BlockTables(Protocol):
    """vLLM's `BlockTables` (`vllm/v1/worker/gpu/block_table.py`): the KV-cache block tables."""

    num_kv_cache_groups: int
    input_block_tables: list[torch.Tensor]  # [max_num_reqs, blocks] per KV-cache group
    cp_interleave: int
    num_blocks: UvaBackedTensor  # [K, max_num_reqs] (the vllm-ascend V2 manager's DCP prefills)
    # slot_mappings is read with getattr: its dtype is the slot dtype (vLLM's int64 without it)

    def gather_block_tables(
        self,
        idx_mapping: torch.Tensor,
        num_reqs_padded: int,
        out: tuple[torch.Tensor, ...] | None = None,
        out_ptrs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]: ...

    def compute_slot_mappings(
        self,
        idx_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        positions: torch.Tensor,
        num_tokens_padded: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


class GroupCoordinator(Protocol):
    """vLLM's `GroupCoordinator` (`vllm/distributed/parallel_state.py`): the PCP or pipeline group."""

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor: ...

    def broadcast(self, input_: torch.Tensor, src: int = 0) -> torch.Tensor: ...  # (vllm-ascend V2)

    @property
    def is_last_rank(self) -> bool: ...  # (vllm-ascend V2: of the pipeline group)


# ------------------------------------------------------------------ the config


class CompilationConfig(Protocol):
    """vLLM's `CompilationConfig` (`vllm/config/compilation.py`)."""

    cudagraph_mode: CUDAGraphMode
    cudagraph_capture_sizes: list[int]


class ParallelConfig(Protocol):
    """vLLM's `ParallelConfig` (`vllm/config/parallel.py`)."""

    prefill_context_parallel_size: int  # (vllm-ascend V2)
    data_parallel_size: int  # (vllm-ascend V2)
    cp_kv_cache_interleave_size: int  # (vllm-ascend 0.23)


class SchedulerConfig(Protocol):
    """vLLM's `SchedulerConfig` (`vllm/config/scheduler.py`)."""

    max_num_seqs: int
    max_num_batched_tokens: int


class PretrainedConfig(Protocol):
    """transformers' `PretrainedConfig`: a model's `hf_config`."""

    model_type: str


class ModelConfig(Protocol):
    """vLLM's `ModelConfig` (`vllm/config/model.py`)."""

    hf_config: PretrainedConfig  # (vllm-ascend 0.23: hybrid attention by model type)
    hf_text_config: object  # only asked whether it has `index_topk` (vllm-ascend V2: sparse MLA)
    is_encoder_decoder: bool  # (vllm-ascend V2)
    max_model_len: int  # (vllm-ascend 0.23)


class SpeculativeConfig(Protocol):
    """vLLM's `SpeculativeConfig` (`vllm/config/speculative.py`)."""

    method: str | None  # (vllm-ascend V2)
    draft_sample_method: str  # (vllm-ascend V2)
    num_speculative_tokens: int  # (vllm-ascend 0.23)


class VllmConfig(Protocol):
    """vLLM's `VllmConfig` (`vllm/config/vllm.py`)."""

    compilation_config: CompilationConfig
    parallel_config: ParallelConfig
    scheduler_config: SchedulerConfig
    model_config: ModelConfig
    speculative_config: SpeculativeConfig | None
    lora_config: object | None  # only compared with None (vllm-ascend V2)


# ------------------------------------------------------------------ vllm-ascend 0.23's model_runner_v1


class CpuGpuBuffer(Protocol):
    """vLLM's `CpuGpuBuffer` (`vllm/v1/utils.py`): a host tensor and its device twin."""

    cpu: torch.Tensor
    gpu: torch.Tensor

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor: ...


class SchedulerOutput(Protocol):
    """vLLM's `SchedulerOutput` (`vllm/v1/core/sched/output.py`): the fields a rank localizes."""

    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_encoder_inputs: dict[str, list[int]]
    free_encoder_mm_hashes: list[str]


class PlaceholderRange(Protocol):
    """vLLM's `PlaceholderRange` (`vllm/multimodal/inputs.py`): a feature's tokens in its prompt."""

    offset: int
    length: int
    is_embed: torch.Tensor | None


class MultiModalFeatureSpec(Protocol):
    """vLLM's `MultiModalFeatureSpec` (`vllm/multimodal/inputs.py`): one encoder input of a request."""

    identifier: str
    mm_position: PlaceholderRange


class CachedRequestState(Protocol):
    """vLLM's `CachedRequestState` (`vllm/v1/worker/gpu_input_batch.py`): one request's state."""

    prompt_token_ids: list[int] | None
    prompt_embeds: torch.Tensor | None
    num_computed_tokens: int
    mm_features: list[MultiModalFeatureSpec]
    mrope_positions: torch.Tensor | None  # rewritten in place by the multimodal pruning
    mrope_position_delta: int | None


class SupportsMultiModalPruning(Protocol):
    """vLLM's `SupportsMultiModalPruning` model interface (`vllm/model_executor/models/interfaces.py`)."""

    def recompute_mrope_positions(
        self,
        input_ids: list[int] | torch.Tensor,
        multimodal_embeddings: Sequence[torch.Tensor],
        mrope_positions: torch.Tensor,
        num_computed_tokens: int,
    ) -> tuple[Sequence[torch.Tensor], torch.Tensor, int]: ...
