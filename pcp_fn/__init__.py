"""pcp_fn: Prefill Context Parallelism step bookkeeping as pure, capturable torch functions.

Every op is ``op(state, ...) -> (state, outputs)`` on fixed-shape device
tensors; a whole step traces with ``torch.compile(fullgraph=True)``, exports,
vmaps and captures into one CUDA/ACL graph. See README.md.
"""

from . import graph, multimodal, ranks
from .attention import AttentionMetadata, PaddedIndex, attention_metadata
from .batch import SchedulerBatch, make_batch
from .config import Bucket, PCPConfig
from .layout import TokenLayout, update_tokens
from .logits import get_logits_indices
from .multimodal import (
    MRopeTables,
    PromptEmbeds,
    gather_prompt_embeds,
    pack_mrope_tables,
    pack_prompt_embeds,
    remap_mrope_positions,
)
from .restore import restore_hidden_states
from .seqlens import cp_local_seq_lens
from .slots import padded_slot_mapping
from .state import PCPState, init_state
from .step import StepOutputs, step
from .sync import HostSyncError, assert_no_host_syncs, count_aten_ops, no_host_syncs

__all__ = [
    "AttentionMetadata",
    "Bucket",
    "HostSyncError",
    "MRopeTables",
    "PCPConfig",
    "PCPState",
    "PaddedIndex",
    "PromptEmbeds",
    "SchedulerBatch",
    "StepOutputs",
    "TokenLayout",
    "assert_no_host_syncs",
    "attention_metadata",
    "count_aten_ops",
    "cp_local_seq_lens",
    "gather_prompt_embeds",
    "get_logits_indices",
    "graph",
    "init_state",
    "make_batch",
    "multimodal",
    "no_host_syncs",
    "pack_mrope_tables",
    "pack_prompt_embeds",
    "padded_slot_mapping",
    "ranks",
    "remap_mrope_positions",
    "restore_hidden_states",
    "step",
    "update_tokens",
]

__version__ = "0.1.0"
