"""pcp_fn: Prefill Context Parallelism step bookkeeping as pure, capturable torch functions.

Every op is ``op(state, ...) -> (state, outputs)`` on fixed-shape device
tensors; a whole step traces with ``torch.compile(fullgraph=True)``, exports,
vmaps and captures into one CUDA/ACL graph. See README.md.
"""

from . import graph, mrv2, multimodal, ranks, spec
from .attention import AttentionMetadata, PaddedIndex, attention_metadata
from .batch import SchedulerBatch, make_batch
from .config import Bucket, PCPConfig
from .distributed import all_gather_and_restore, process_group_all_gather
from .draft_hybrid import DraftSplit, split_prefill_for_draft_hybrid
from .hybrid import HybridLayout, adjust_cu_num_scheduled_tokens
from .layout import TokenLayout, update_tokens
from .logits import get_logits_indices
from .mrv2 import MRV2Config
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
from .spec import (
    PrevStep,
    SpecInputs,
    SpecStepOutputs,
    decode_hidden_states,
    drafting_cp_seq_lens,
    first_pass_inputs,
    full_input_ids,
    make_spec_batch,
    mask_restore_index_for_graph,
    mtp_attention_mask,
    mtp_drafting_inputs,
    mtp_slot_inputs,
    rebuild_spec_positions,
    repair_full_input_ids,
    spec_decode_indices,
    spec_step,
    split_prefill_for_draft,
)
from .state import PCPState, init_state
from .step import StepOutputs, step
from .sync import HostSyncError, assert_no_host_syncs, count_aten_ops, no_host_syncs
from .trace import read_trace, replay, write_trace

__all__ = [
    "AttentionMetadata",
    "Bucket",
    "DraftSplit",
    "HostSyncError",
    "HybridLayout",
    "MRV2Config",
    "MRopeTables",
    "PCPConfig",
    "PCPState",
    "PaddedIndex",
    "PrevStep",
    "PromptEmbeds",
    "SchedulerBatch",
    "SpecInputs",
    "SpecStepOutputs",
    "StepOutputs",
    "TokenLayout",
    "adjust_cu_num_scheduled_tokens",
    "all_gather_and_restore",
    "assert_no_host_syncs",
    "attention_metadata",
    "count_aten_ops",
    "cp_local_seq_lens",
    "decode_hidden_states",
    "drafting_cp_seq_lens",
    "first_pass_inputs",
    "full_input_ids",
    "gather_prompt_embeds",
    "get_logits_indices",
    "graph",
    "init_state",
    "make_batch",
    "make_spec_batch",
    "mask_restore_index_for_graph",
    "mrv2",
    "mtp_attention_mask",
    "mtp_drafting_inputs",
    "mtp_slot_inputs",
    "multimodal",
    "no_host_syncs",
    "pack_mrope_tables",
    "pack_prompt_embeds",
    "padded_slot_mapping",
    "process_group_all_gather",
    "ranks",
    "read_trace",
    "rebuild_spec_positions",
    "remap_mrope_positions",
    "repair_full_input_ids",
    "replay",
    "restore_hidden_states",
    "spec",
    "spec_decode_indices",
    "spec_step",
    "split_prefill_for_draft",
    "split_prefill_for_draft_hybrid",
    "step",
    "update_tokens",
    "write_trace",
]

__version__ = "0.1.0"
