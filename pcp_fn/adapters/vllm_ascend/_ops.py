"""Every call the vllm-ascend adapter makes into pcp_fn, in one place.

The manager's modules never touch pcp_fn's ops themselves: they call the
functions here (so a change of pcp_fn's signatures is one edit in this file).
Two kinds:

- the device step functions (:func:`device_step`, :func:`device_padded_slots`,
  :func:`device_mtp_mask`): fixed shapes per bucket, no host sync, captured
  once per bucket by :class:`DeviceRunner` on a graph device;
- thin wrappers of the spec-decode and multimodal ops the manager's helpers
  use, run eagerly (inside the proposer's own graph when it captures one).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

import pcp_fn
from pcp_fn import graph as pcp_graph
from pcp_fn import multimodal as pcp_mm
from pcp_fn import spec as pcp_spec

from ._host import HostLayout
from ._settings import ManagerSettings

# The index tensors of the attention metadata, by their pcp_fn names; vllm-ascend's
# AscendPrefillContextParallelMetadata field is the value.
ATTENTION_INDEX_FIELDS = {
    "q_head_idx": "q_head_idx_tensor",
    "q_tail_idx": "q_tail_idx_tensor",
    "q_full_idx": "q_full_idx",
    "kv_with_q_head_nomask_idx": "kv_with_q_head_nomask_idx_tensor",
    "kv_with_q_head_mask_idx": "kv_with_q_head_mask_idx_tensor",
    "kv_with_q_tail_nomask_idx": "kv_with_q_tail_nomask_idx_tensor",
    "kv_with_q_tail_mask_idx": "kv_with_q_tail_mask_idx_tensor",
    "kv_tail_proj_idx": "kv_tail_proj_idx_tensor",
    "kv_with_q_head_attn_idx_in_tail": "kv_with_q_head_attn_idx_in_tail_tensor",
    "kv_with_q_tail_attn_idx_in_tail": "kv_with_q_tail_attn_idx_in_tail_tensor",
}

Bucket = pcp_fn.Bucket
PCPConfig = pcp_fn.PCPConfig
PCPState = pcp_fn.PCPState
SchedulerBatch = pcp_fn.SchedulerBatch


# ------------------------------------------------------------------ config, state, batch
def make_config(
    s: ManagerSettings, request_buckets: tuple[int, ...] | None, token_buckets: tuple[int, ...] | None
) -> PCPConfig:
    """The rank's :class:`pcp_fn.PCPConfig` (it validates ranks, sizes and buckets)."""
    return pcp_fn.PCPConfig(
        s.pcp_size,
        s.pcp_rank,
        s.max_num_reqs,
        s.max_num_tokens,
        dcp_size=s.dcp_size,
        dcp_rank=s.dcp_rank,
        num_spec_tokens=s.num_spec_tokens,
        cp_kv_cache_interleave_size=s.interleave,
        hybrid_attn=s.hybrid_attn,
        pd_decode_recompute=s.pd_decode_recompute,
        request_buckets=request_buckets,
        token_buckets=token_buckets,
    )


def init_state(cfg: PCPConfig, device: torch.device | str) -> PCPState:
    return pcp_fn.init_state(cfg, device)


def make_batch(cfg: PCPConfig, h: HostLayout, device: torch.device) -> SchedulerBatch:
    """The host boundary: validates (``ValueError`` naming field and limit), picks the bucket, one copy."""
    return pcp_fn.make_batch(cfg, h.num_scheduled, h.num_computed, h.device_prompt, device)


def host_state(base: PCPState, h: HostLayout) -> PCPState:
    """A CPU state holding the step's per-request record (for the ops that read the CPU token table)."""
    R = base.config.max_num_reqs
    sched = np.zeros(R, dtype=np.int32)
    sched[: h.num_reqs] = h.num_scheduled
    decode = np.zeros(R, dtype=bool)
    decode[: h.num_reqs] = h.is_decode
    return dataclasses.replace(
        base,
        num_reqs=torch.full((), h.num_reqs, dtype=torch.int64),
        num_scheduled=torch.from_numpy(sched),
        is_decode=torch.from_numpy(decode),
    )


# ------------------------------------------------------------------ the device step (captured)
def _restride(index: torch.Tensor, old: int, new: torch.Tensor) -> torch.Tensor:
    """``rank * old + row -> rank * new + row``: pcp_fn addresses fixed ``[L_b]`` rank buffers,
    vllm-ascend compact ones (``new`` rows per rank, a 0-d tensor)."""
    return index // old * new + index % old


def device_step(state: PCPState, batch: SchedulerBatch) -> tuple[PCPState, dict[str, torch.Tensor]]:
    """One step's device results for this rank, every shape from ``(config, bucket)``.

    Keys (``G_b = P * L_b``): ``restore`` ``[G_b]`` int64 (vllm-ascend
    ``pcp_allgather_restore_idx``: compact ``rank * N + row`` addressing),
    ``unpad_mask`` ``[G_b]``, ``logits`` ``[R_b]``; with hybrid attention
    ``enter`` ``[G_b]`` int32 (``rank * M + row``), ``fa_padding`` ``[G_b]``,
    ``fa_query`` ``[L_b]`` int32, ``exit`` ``[L_b]`` int64
    (``rank * (N_dcs - D) + query``); with ``P > 1`` the ten attention index
    tensors (int32, padded); with spec tokens (not hybrid) ``decode_rows``
    ``[L_b]``, the restored rows of the decode tokens.
    """
    cfg = state.config
    P, Rb, Lb = cfg.pcp_size, batch.bucket.num_reqs, batch.bucket.num_tokens
    state, layout = pcp_fn.update_tokens(state, batch)
    state, logits = pcp_fn.get_logits_indices(state, Rb)
    N = layout.num_tokens_padded if cfg.hybrid_attn else layout.num_tokens
    out = {
        "restore": _restride(layout.restore_index, Lb, N),
        "unpad_mask": layout.unpad_mask,
        "logits": logits,
    }
    if cfg.hybrid_attn:
        out["enter"] = _restride(layout.enter_fa_restore_idx, Lb, layout.max_num_tokens_across_pcp).to(
            torch.int32
        )
        out["fa_padding"] = layout.fa_padding_restore_idx.to(torch.int32)
        out["fa_query"] = layout.fa_query_idx.to(torch.int32)
        out["exit"] = _restride(layout.exit_fa_scatter_idx, Lb, layout.fa_query_len)
    if P > 1:
        state, meta = pcp_fn.attention_metadata(state, batch)
        out.update({name: getattr(meta, name).index for name in ATTENTION_INDEX_FIELDS})
        if cfg.num_spec_tokens > 0 and not cfg.hybrid_attn:
            # the decode rows are decode_hidden_states applied to the row numbers themselves
            rows = torch.arange(P * Lb, dtype=torch.int64, device=logits.device)[:, None]
            _, picked = pcp_fn.decode_hidden_states(state, rows, bucket=batch.bucket)
            out["decode_rows"] = picked[:, 0]
    return state, out


def device_padded_slots(state: PCPState, slots: torch.Tensor, rows_per_rank: int) -> torch.Tensor:
    """``[P * rows_per_rank]`` padded slot mapping (vllm-ascend ``get_padded_slot_mapping``), int32."""
    _, padded = pcp_fn.padded_slot_mapping(state, slots, rows_per_rank)
    return padded.to(torch.int32)


def device_mtp_mask(
    state: PCPState, num_computed: torch.Tensor, num_cols: int, bucket: Bucket
) -> torch.Tensor:
    """``[R_b, 1 + k, num_cols]`` bool MTP attention mask of the decodes (interleave-aware)."""
    _, mask = pcp_spec.mtp_attention_mask(state, num_computed, num_cols, bucket=bucket)
    return mask.mask


def gathered_capacity(cfg: PCPConfig) -> int:
    """``G = P * L``: rows of the padded gathered order any batch fits in."""
    return cfg.max_gathered_tokens


def output_capacities(cfg: PCPConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every :func:`device_step` output at the capacity bucket.

    Run on the ``meta`` device: the persistent buffers are sized by the ops themselves.
    """
    state = pcp_fn.init_state(cfg, "meta")
    batch = pcp_fn.make_batch(cfg, [], [], [], "meta", bucket=cfg.capacity)
    _, out = device_step(state, batch)
    return {k: (tuple(v.shape), v.dtype) for k, v in out.items()}


class DeviceRunner:
    """Runs the device step functions: one captured graph per bucket, or eagerly.

    ``capture=True`` uses :func:`pcp_fn.graph.capture` (``torch.cuda.CUDAGraph``
    on CUDA, ``torch.npu.NPUGraph`` on an Ascend NPU, ``torch.compile`` with
    ``backend`` elsewhere); each function keeps one graph per bucket. A graph's
    outputs are overwritten by its next replay, so callers copy them into
    their persistent buffers at once and :meth:`keep` what must last (the state).
    ``check_syncs=True`` runs every call under :func:`pcp_fn.no_host_syncs`.
    """

    def __init__(self, capture: bool, backend: str = "inductor", check_syncs: bool = False) -> None:
        self.capture = capture
        self.backend = backend
        self.check_syncs = check_syncs
        self._graphs: dict[str, pcp_graph.Captured] = {}

    @property
    def num_graphs(self) -> int:
        """Graphs captured so far, over every function and bucket."""
        return sum(len(g) for g in self._graphs.values())

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        return pcp_fn.no_host_syncs() if self.check_syncs else contextlib.nullcontext()

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not self.capture:
            with self.guard():
                return fn(*args)
        graph = self._graphs.get(fn.__name__)
        if graph is None:
            graph = self._graphs[fn.__name__] = pcp_graph.Captured(fn, backend=self.backend)
        return graph(*args)

    def keep(self, tree: Any) -> Any:
        """A copy of graph outputs that outlives the next replay (eager outputs are already fresh)."""
        if not self.capture:
            return tree
        with self.guard():
            return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


# ------------------------------------------------------------------ spec decode (eager)
SlotFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def full_rows(cfg: PCPConfig, bucket: Bucket) -> int:
    """``F_b``: rows of the scheduler-order (pre-split) buffers of a bucket."""
    return pcp_spec.full_rows(cfg, bucket)


def full_inputs(
    state: PCPState,
    token_ids: torch.Tensor,
    num_computed: torch.Tensor,
    bucket: Bucket,
    slot_fn: SlotFn | None,
):
    """Scheduler-order ids, positions and query starts (and the MTP slots) of the step."""
    _, full = pcp_spec.full_input_ids(state, token_ids, num_computed, bucket=bucket, slot_fn=slot_fn)
    return full


def repair_full_ids(
    state: PCPState,
    ids: torch.Tensor,
    prev_sampled: torch.Tensor,
    draft: torch.Tensor | None,
    prev_positions: torch.Tensor,
    bucket: Bucket,
) -> torch.Tensor:
    _, out = pcp_spec.repair_full_input_ids(state, ids, prev_sampled, draft, prev_positions, bucket=bucket)
    return out


def rebuild_positions(state: PCPState, num_computed: torch.Tensor, bucket: Bucket, slot_fn: SlotFn | None):
    _, out = pcp_spec.rebuild_spec_positions(state, num_computed, bucket=bucket, slot_fn=slot_fn)
    return out


def first_pass_selection(
    state: PCPState,
    ids_full: torch.Tensor,
    tis: torch.Tensor,
    logits: torch.Tensor,
    num_logits: int,
    bucket: Bucket,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids [L_b], restored rows [L_b], token_indices_to_sample [R_b])`` of the first draft pass.

    The rows are :func:`pcp_fn.first_pass_inputs` applied to the row numbers of
    the restored buffer, so the caller gathers its own hidden states once.
    """
    P, Lb = state.config.pcp_size, bucket.num_tokens
    device = tis.device
    rows = torch.arange(P * Lb, dtype=torch.int64, device=device)[:, None]
    positions = torch.zeros(Lb, dtype=torch.int64, device=device)
    _, out = pcp_spec.first_pass_inputs(
        state, ids_full, positions, rows, tis, logits, num_logits, bucket=bucket
    )
    return out.input_ids, out.hidden_states[:, 0], out.token_indices_to_sample


def split_prefill_hybrid(
    state: PCPState, prefill_lens: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor, rows: int
):
    _, out = pcp_fn.split_prefill_for_draft_hybrid(state, prefill_lens, ids, hidden, rows)
    return out


def mtp_slot_indices(
    state: PCPState, tis: torch.Tensor, slot_mapping: torch.Tensor, num_reqs: int, k: int, bucket: Bucket
) -> torch.Tensor:
    _, out = pcp_spec.mtp_slot_inputs(
        state, tis, slot_mapping, num_reqs=num_reqs, num_speculative_tokens=k, bucket=bucket
    )
    return out.slot_indices


def mask_restore(state: PCPState, index: torch.Tensor) -> torch.Tensor:
    _, out = pcp_spec.mask_restore_index_for_graph(state, index)
    return out


def drafting_lens(state: PCPState, seq_lens: torch.Tensor, draft_index: int):
    _, out = pcp_spec.drafting_cp_seq_lens(state, seq_lens, draft_index)
    return out


# ------------------------------------------------------------------ multimodal
def remap_mrope(
    tables: list[torch.Tensor | None],
    deltas: list[int | None],
    num_prompt: np.ndarray,
    positions: np.ndarray,
    counts: np.ndarray,
) -> torch.Tensor:
    """``[3, len(positions)]`` M-RoPE positions of the rank's tokens, on the CPU (the runner's buffer)."""
    n = len(tables)
    width = max([t.shape[1] for t in tables if t is not None] + [1])
    packed = pcp_mm.pack_mrope_tables(tables, deltas, num_rows=max(n, 1), max_len=width)
    prompt = np.zeros(max(n, 1), dtype=np.int64)
    prompt[:n] = num_prompt
    x = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
    owner = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), counts))
    return pcp_mm.remap_mrope_positions(
        packed, torch.from_numpy(prompt), x, owner, torch.full((), x.shape[0], dtype=torch.int64)
    )


def gather_prompt_embeds(req_embeds: torch.Tensor, positions: np.ndarray, out: torch.Tensor) -> torch.Tensor:
    """One request's prompt embeds at its local positions; rows past the embeds keep ``out``."""
    zero = torch.zeros(1, dtype=torch.int64)
    embeds = pcp_mm.PromptEmbeds(
        values=req_embeds, start=zero, length=torch.full((1,), req_embeds.shape[0], dtype=torch.int64)
    )
    x = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
    owner = torch.zeros_like(x)
    return pcp_mm.gather_prompt_embeds(embeds, x, owner, torch.full((), x.shape[0], dtype=torch.int64), out)


local_schedule_layout = pcp_mm.local_schedule_layout
build_local_mm_schedule = pcp_mm.build_local_mm_schedule
gather_mm_embeddings = pcp_mm.gather_mm_embeddings
localize_scheduler_output = pcp_mm.localize_scheduler_output
