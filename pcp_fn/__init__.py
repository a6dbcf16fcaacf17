"""pcp_fn: Prefill Context Parallelism step bookkeeping as pure, capturable torch functions.

Every op is `op(state, ...) -> (state, outputs)` on fixed-shape device
tensors; a whole step traces with `torch.compile(fullgraph=True)`, exports,
vmaps and captures into one CUDA/ACL graph. Documentation: `docs/` (`mkdocs serve`).

The facade (this module) serves any [`Layout`][pcp_fn.Layout] (the public layout protocol,
[`pcp_fn.protocol`][]: the config, state, batch and row types every layout shares),
chosen by `PCPConfig(..., layout=name)`: `"dcs"` (DualChunkSwap, the default),
`"hybrid"` (`hybrid_attn`), `"mrv2"` / `"mrv2-sharded"` (model runner V2's unpadded
chunks, decodes replicated / dealt round-robin) or a
researcher's (checked by [`pcp_fn.testing.check_layout`][]). Peers and tools:

- [`pcp_fn.protocol`][]: what every layout shares, and [`PartitionLayout`][pcp_fn.PartitionLayout];
- [`pcp_fn.dcs`][], [`pcp_fn.hybrid`][], [`pcp_fn.mrv2`][]: the built-in layouts, one package each;
- [`pcp_fn.spec`][]: speculative-decode (MTP) prep; [`pcp_fn.multimodal`][];
- [`pcp_fn.graph`][]: capture per bucket, export, host-sync checks;
- [`pcp_fn.sim`][] (not imported here): the simulator, traces and the CLI.
"""

from . import dcs, graph, hybrid, mrv2, multimodal, spec
from .attention_runs import AttentionRuns, attention_runs
from .core.buckets import Bucket
from .core.rank import all_ranks
from .core.seqlens import cp_local_seq_lens
from .dcs import AttentionMetadata, PaddedIndex, attention_metadata
from .distributed import all_gather_and_restore, process_group_all_gather
from .graph import HostSyncError, assert_no_host_syncs, count_aten_ops, no_host_syncs
from .hybrid import HybridLayout, adjust_cu_num_scheduled_tokens
from .logits import get_logits_indices
from .mrv2 import MRV2Config, MRV2Partition
from .multimodal import (
    MRopeTables,
    PromptEmbeds,
    gather_prompt_embeds,
    pack_mrope_tables,
    pack_prompt_embeds,
    remap_mrope_positions,
)
from .protocol import (
    GatheredOrder,
    Layout,
    LayoutUpdate,
    LocalRows,
    PackageLayout,
    PartitionLayout,
    PCPConfig,
    PCPState,
    RequestGeometry,
    Requests,
    RestoredSpans,
    SchedulerBatch,
    TokenLayout,
    available_layouts,
    get_layout,
    init_state,
    layout_of,
    make_batch,
    register_layout,
    rows_from_segments,
    unregister_layout,
)
from .restore import restore_hidden_states
from .slots import padded_slot_mapping
from .spec import (
    DraftSplit,
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
from .step import StepOutputs, step
from .update_tokens import update_tokens

__all__ = [
    "AttentionMetadata",
    "AttentionRuns",
    "Bucket",
    "DraftSplit",
    "GatheredOrder",
    "HostSyncError",
    "HybridLayout",
    "Layout",
    "LayoutUpdate",
    "LocalRows",
    "MRV2Config",
    "MRV2Partition",
    "MRopeTables",
    "PCPConfig",
    "PCPState",
    "PackageLayout",
    "PaddedIndex",
    "PartitionLayout",
    "PrevStep",
    "PromptEmbeds",
    "RequestGeometry",
    "Requests",
    "RestoredSpans",
    "SchedulerBatch",
    "SpecInputs",
    "SpecStepOutputs",
    "StepOutputs",
    "TokenLayout",
    "adjust_cu_num_scheduled_tokens",
    "all_gather_and_restore",
    "all_ranks",
    "assert_no_host_syncs",
    "attention_metadata",
    "attention_runs",
    "available_layouts",
    "count_aten_ops",
    "cp_local_seq_lens",
    "dcs",
    "decode_hidden_states",
    "drafting_cp_seq_lens",
    "first_pass_inputs",
    "full_input_ids",
    "gather_prompt_embeds",
    "get_layout",
    "get_logits_indices",
    "graph",
    "hybrid",
    "init_state",
    "layout_of",
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
    "rebuild_spec_positions",
    "register_layout",
    "remap_mrope_positions",
    "repair_full_input_ids",
    "restore_hidden_states",
    "rows_from_segments",
    "spec",
    "spec_decode_indices",
    "spec_step",
    "split_prefill_for_draft",
    "step",
    "unregister_layout",
    "update_tokens",
]

__version__ = "0.1.0"
