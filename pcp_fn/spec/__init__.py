"""Speculative-decode (MTP) preparation under PCP as pure, fixed-shape functions.

vllm-ascend prepares the MTP drafter's inputs on the host (`PCPManager`'s
spec-decode methods and the runner's `_calc_spec_decode_metadata`); here
every piece is an op on fixed-shape device buffers with its length beside it:

| vllm-ascend                       | pcp_fn                                                            |
|-----------------------------------|-------------------------------------------------------------------|
| `_calc_spec_decode_metadata`      | [`pcp_fn.spec_decode_indices`][]                                  |
| `generate_pcp_mtp_input`          | [`pcp_fn.full_input_ids`][]                                       |
| `_update_input_ids_pcp_full_ids`  | [`pcp_fn.repair_full_input_ids`][]                                |
| `get_spec_decode_decode_hidden`   | [`pcp_fn.decode_hidden_states`][]                                 |
| `_split_spec_decode_pcp_prefill`  | [`pcp_fn.split_prefill_for_draft`][] (-> [`pcp_fn.DraftSplit`][]) |
| `prepare_spec_decode_first_pass`  | [`pcp_fn.first_pass_inputs`][]                                    |
| `_get_spec_decode_mtp_slot_in..`  | [`pcp_fn.mtp_slot_inputs`][]                                      |
| `prepare_spec_decode_mtp_draft..` | [`pcp_fn.mtp_drafting_inputs`][]                                  |
| `generate_mtp_attention_mask..`   | [`pcp_fn.mtp_attention_mask`][]                                   |
| `mask_spec_decode_restore_idx..`  | [`pcp_fn.mask_restore_index_for_graph`][]                         |
| `update_spec_decode_drafting_cp`  | [`pcp_fn.drafting_cp_seq_lens`][]                                 |
| `rebuild_async_spec_decode_in..`  | [`pcp_fn.rebuild_spec_positions`][] (device branch)               |

[`make_spec_batch`][pcp_fn.make_spec_batch] is the host boundary (draft counts, token table
shape, slot mapping); [`spec_step`][pcp_fn.spec_step] composes [`pcp_fn.step`][pcp_fn.step.step] with the
pre-forward spec inputs into one capturable entry op. The ops take no size:
they read the bucket of the state's last update, and every per-request or
per-token input must have exactly its rows (capacities: [`pcp_fn.spec.inputs`][]).

What depends on the layout (local rows, where each request sits in the
restored hidden states, the drafter's prefill split) comes from the config's
[`pcp_fn.Layout`][] ([`pcp_fn.layout_of`][]): verified against the
vllm-ascend references for DualChunkSwap and hybrid attention
(`PCPConfig(..., hybrid_attn=True)`), and for every layout (`"mrv2"`, a
researcher's [`pcp_fn.PartitionLayout`][]) by [`pcp_fn.testing.check_layout`][]'s
spec-decode rule: the sampled rows, the decode hidden states and the drafter's
first pass, token by token. The MTP attention-mask and KV-split helpers
([`pcp_fn.spec.mtp`][]) read no layout; [`pcp_fn.attention_metadata`][] keeps the
DualChunkSwap chunk rules.
"""

from .draft import (
    DraftSplit,
    FirstPassInputs,
    decode_hidden_states,
    first_pass_inputs,
    split_prefill_for_draft,
)
from .full import (
    FullInputs,
    MTPLayout,
    RebuiltPositions,
    full_input_ids,
    rebuild_spec_positions,
    repair_full_input_ids,
)
from .indices import SpecDecodeIndices, spec_decode_indices
from .inputs import (
    SpecInputs,
    draft_rows,
    make_spec_batch,
    mtp_rows,
    sampled_rows,
    token_rows,
)
from .mtp import (
    DraftingSeqLens,
    MTPAttentionMask,
    MTPBlockedKeys,
    MTPDraftingInputs,
    MTPSlotInputs,
    drafting_cp_seq_lens,
    mask_restore_index_for_graph,
    mtp_attention_mask,
    mtp_blocked_keys,
    mtp_drafting_inputs,
    mtp_slot_inputs,
)
from .step import PrevStep, SpecStepOutputs, spec_step

__all__ = [
    "DraftSplit",
    "DraftingSeqLens",
    "FirstPassInputs",
    "FullInputs",
    "MTPAttentionMask",
    "MTPBlockedKeys",
    "MTPDraftingInputs",
    "MTPLayout",
    "MTPSlotInputs",
    "PrevStep",
    "RebuiltPositions",
    "SpecDecodeIndices",
    "SpecInputs",
    "SpecStepOutputs",
    "decode_hidden_states",
    "draft_rows",
    "drafting_cp_seq_lens",
    "first_pass_inputs",
    "full_input_ids",
    "make_spec_batch",
    "mask_restore_index_for_graph",
    "mtp_attention_mask",
    "mtp_blocked_keys",
    "mtp_drafting_inputs",
    "mtp_rows",
    "mtp_slot_inputs",
    "rebuild_spec_positions",
    "repair_full_input_ids",
    "sampled_rows",
    "spec_decode_indices",
    "spec_step",
    "split_prefill_for_draft",
    "token_rows",
]
