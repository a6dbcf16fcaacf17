"""pcp_fn: Prefill Context Parallelism step bookkeeping as pure, capturable torch functions.

Every op is ``op(state, ...) -> (state, outputs)`` on fixed-shape device
tensors; a whole step traces with ``torch.compile(fullgraph=True)``, exports,
vmaps and captures into one CUDA/ACL graph. See README.md.
"""

from . import graph, ranks, spec
from .batch import SchedulerBatch, make_batch
from .config import Bucket, PCPConfig
from .layout import TokenLayout, update_tokens
from .logits import get_logits_indices
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

__all__ = [
    "Bucket",
    "HostSyncError",
    "PCPConfig",
    "PCPState",
    "PrevStep",
    "SchedulerBatch",
    "SpecInputs",
    "SpecStepOutputs",
    "StepOutputs",
    "TokenLayout",
    "assert_no_host_syncs",
    "count_aten_ops",
    "cp_local_seq_lens",
    "decode_hidden_states",
    "drafting_cp_seq_lens",
    "first_pass_inputs",
    "full_input_ids",
    "get_logits_indices",
    "graph",
    "init_state",
    "make_batch",
    "make_spec_batch",
    "mask_restore_index_for_graph",
    "mtp_attention_mask",
    "mtp_drafting_inputs",
    "mtp_slot_inputs",
    "no_host_syncs",
    "padded_slot_mapping",
    "ranks",
    "rebuild_spec_positions",
    "repair_full_input_ids",
    "restore_hidden_states",
    "spec",
    "spec_decode_indices",
    "spec_step",
    "split_prefill_for_draft",
    "step",
    "update_tokens",
]

__version__ = "0.1.0"
