"""Every call the vllm-ascend adapter makes into pcp_fn, in one place.

The manager's modules never touch pcp_fn's ops themselves: they call the
functions here (so a change of pcp_fn's signatures is one edit in this file).
Two kinds:

- the device step functions (:func:`device_step`, :func:`device_padded_slots`,
  :func:`device_mtp_mask`): fixed shapes per bucket, no host sync, captured
  once per bucket by :class:`DeviceRunner` on a graph device;
- thin wrappers of the spec-decode and multimodal ops the manager's helpers
  use, run eagerly (inside the proposer's own graph when it captures one).

pcp_fn's size convention holds throughout: an op takes no size argument (it
reads the bucket of the state's last update, ``state.bucket``), and every
per-request input has exactly ``R_b`` rows, every scheduler-order per-token
input exactly ``F_b = token_rows(config, bucket)``. The runner hands the
manager tensors of its own lengths, so the wrappers here pad them to those
rows (or, for inputs tied to no step, to the capacity state's) and slice the
results back.
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
from pcp_fn.core.entry import entry_op
from pcp_fn.dcs.batch import token_rows

from ._host import HostLayout
from ._settings import ManagerSettings

# The index tensors of the attention metadata, by their pcp_fn names; vllm-ascend's
# AscendPrefillContextParallelMetadata field is the value.
ATTENTION_INDEX_FIELDS = pcp_fn.dcs.attention.VLLM_ASCEND_INDEX_FIELDS

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


def full_rows(cfg: PCPConfig, bucket: Bucket) -> int:
    """``F_b = min(T, P * L_b)``: scheduler-order (pre-split) token rows of a bucket."""
    return token_rows(cfg, bucket)


def host_state(base: PCPState, h: HostLayout, bucket: Bucket) -> PCPState:
    """A CPU state holding the step's per-request record at ``bucket`` (the batch's), for the ops
    that read the CPU token table; what ``update_tokens`` records, without building the layout."""
    R = base.config.max_num_reqs
    sched = np.zeros(R, dtype=np.int32)
    sched[: h.num_reqs] = h.num_scheduled
    decode = np.zeros(R, dtype=bool)
    decode[: h.num_reqs] = h.is_decode
    return dataclasses.replace(
        base,
        bucket=bucket,
        num_reqs=torch.full((), h.num_reqs, dtype=torch.int64),
        num_scheduled=torch.from_numpy(sched),
        is_decode=torch.from_numpy(decode),
    )


def _pad_rows(x: torch.Tensor, rows: int, name: str, value: int = 0) -> torch.Tensor:
    """``x`` padded with ``value`` to ``rows`` rows (dim 0); more than ``rows`` is a ``ValueError``."""
    n = x.shape[0]
    if n > rows:
        raise ValueError(f"{name} has {n} rows; the step's bucket holds {rows}")
    if n == rows:
        return x
    return torch.cat([x, x.new_full((rows - n, *x.shape[1:]), value)])


# ------------------------------------------------------------------ the device step (captured)
def _restride(index: torch.Tensor, old: int, new: torch.Tensor) -> torch.Tensor:
    """``rank * old + row -> rank * new + row``: pcp_fn addresses fixed ``[L_b]`` rank buffers,
    vllm-ascend compact ones (``new`` rows per rank, a 0-d tensor)."""
    return index // old * new + index % old


@entry_op
def device_step(state: PCPState, batch: SchedulerBatch) -> tuple[PCPState, dict[str, torch.Tensor]]:
    """One step's device results for this rank, every shape from ``(config, bucket)``.

    An entry op (:mod:`pcp_fn.core.entry`): of ``state`` it reads only the
    config and rank (``update_tokens`` starts the step), so a captured graph
    is keyed by the batch's bucket alone, whatever bucket the last step had.

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
    P, Lb = cfg.pcp_size, batch.bucket.num_tokens
    state, layout = pcp_fn.update_tokens(state, batch)
    state, logits = pcp_fn.get_logits_indices(state)
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
            _, picked = pcp_fn.decode_hidden_states(state, rows)
            out["decode_rows"] = picked[:, 0]
    return state, out


def device_padded_slots(state: PCPState, slots: torch.Tensor) -> torch.Tensor:
    """``[P * L_b]`` int32 padded slot mapping (vllm-ascend ``get_padded_slot_mapping``) of the
    ``[F_b]`` scheduler-order slots (padded with ``pad_slot_id`` past the step's tokens)."""
    _, padded = pcp_fn.padded_slot_mapping(state, slots)
    return padded.to(torch.int32)


def device_mtp_mask(state: PCPState, num_computed: torch.Tensor, num_cols: int) -> torch.Tensor:
    """``[R_b, 1 + k, num_cols]`` bool MTP attention mask of the decodes (interleave-aware);
    ``num_computed`` is ``[R_b]``."""
    _, mask = pcp_spec.mtp_attention_mask(state, num_computed, num_cols)
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


def full_inputs(state: PCPState, token_ids: torch.Tensor, num_computed: torch.Tensor, slot_fn: SlotFn | None):
    """Scheduler-order ids, positions and query starts (and the MTP slots) of the step;
    ``num_computed`` is ``[R_b]``, the outputs ``[F_b]`` / ``[R_b + 1]`` / ``[M_b * P]``."""
    _, full = pcp_spec.full_input_ids(state, token_ids, num_computed, slot_fn=slot_fn)
    return full


def repair_full_ids(
    state: PCPState,
    ids: torch.Tensor,
    prev_sampled: torch.Tensor,
    draft: torch.Tensor | None,
    prev_positions: torch.Tensor,
) -> torch.Tensor:
    """``[F_b]`` ids with the previous step's sampled and draft tokens (``prev_positions`` ``[R_b]``)."""
    _, out = pcp_spec.repair_full_input_ids(state, ids, prev_sampled, draft, prev_positions)
    return out


def rebuild_positions(state: PCPState, num_computed: torch.Tensor, slot_fn: SlotFn | None):
    """Local, scheduler-order and MTP positions from the corrected ``[R_b]`` counts."""
    _, out = pcp_spec.rebuild_spec_positions(state, num_computed, slot_fn=slot_fn)
    return out


def first_pass_selection(
    state: PCPState, ids_full: torch.Tensor, tis: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids [L_b], restored rows [L_b], token_indices_to_sample [R_b])`` of the first draft pass.

    ``ids_full`` is ``[F_b]``, ``tis`` ``[R_b]``; ``logits`` are the runner's
    logits indices, all real (at most ``S_b = R_b * (1 + k)``: padded here).
    The rows are :func:`pcp_fn.first_pass_inputs` applied to the row numbers
    of the restored buffer, so the caller gathers its own hidden states once.
    """
    cfg, bucket = state.config, state.bucket
    P, Lb = cfg.pcp_size, bucket.num_tokens
    device = tis.device
    rows = torch.arange(P * Lb, dtype=torch.int64, device=device)[:, None]
    positions = torch.zeros(Lb, dtype=torch.int64, device=device)
    num_logits = int(logits.shape[0])
    logits = _pad_rows(logits, pcp_spec.sampled_rows(cfg, bucket), "logits_indices")
    _, out = pcp_spec.first_pass_inputs(state, ids_full, positions, rows, tis, logits, num_logits)
    return out.input_ids, out.hidden_states[:, 0], out.token_indices_to_sample


def split_prefill(state: PCPState, ids_full: torch.Tensor, restored: torch.Tensor):
    """This rank's share of the prefills for the drafter (:func:`pcp_fn.spec.split_prefill_for_draft`).

    ``ids_full``: ``[F_b]`` the batch's ids in scheduler order; ``restored``: the
    restored hidden states, any number of rows up to the real ones (the rows past
    ``P * L_b`` are never read; fewer are padded with zeros).
    """
    rows = state.config.pcp_size * state.bucket.num_tokens
    _, out = pcp_spec.split_prefill_for_draft(
        state, ids_full, _pad_rows(restored[:rows], rows, "hidden_states")
    )
    return out


def mtp_rows(cfg: PCPConfig, bucket: Bucket) -> int:
    """``M_b``: rows of the MTP slot layout of a bucket (the slot mapping has ``M_b * P``)."""
    return pcp_spec.mtp_rows(cfg, bucket)


def mtp_slot_indices(
    state: PCPState, tis: torch.Tensor, slot_mapping: torch.Tensor, num_reqs: int, k: int
) -> torch.Tensor:
    """``[R_b * P]`` slot indices; ``tis`` ``[R_b]``, ``slot_mapping`` ``[M_b * P]``."""
    _, out = pcp_spec.mtp_slot_inputs(state, tis, slot_mapping, num_reqs=num_reqs, num_speculative_tokens=k)
    return out.slot_indices


def mask_restore(capacity_state: PCPState, index: torch.Tensor) -> torch.Tensor:
    """``index`` with the rows a graph-padded draft batch never reads zeroed (any length up to ``G``).

    The mask depends on the row number only, so it runs at the capacity state's
    ``[P * L]`` rows and the result is cut back to ``index``'s length.
    """
    rows = capacity_state.config.pcp_size * capacity_state.bucket.num_tokens
    _, out = pcp_spec.mask_restore_index_for_graph(capacity_state, _pad_rows(index, rows, "restore index"))
    return out[: index.shape[0]]


def drafting_lens(capacity_state: PCPState, seq_lens: torch.Tensor, draft_index: int):
    """Per-rank KV lengths at a draft step, for ``seq_lens`` of any length up to ``R``.

    Elementwise per request, so it runs at the capacity state's ``[R]`` rows
    (on ``seq_lens``' device) and the results are cut back to its length.
    """
    n = seq_lens.shape[0]
    padded = _pad_rows(seq_lens, capacity_state.bucket.num_reqs, "seq_lens")
    _, out = pcp_spec.drafting_cp_seq_lens(capacity_state, padded, draft_index)
    return dataclasses.replace(
        out,
        cp_seq_len=out.cp_seq_len[:n],
        num_computed_tokens_of_pcp_dcp=out.num_computed_tokens_of_pcp_dcp[:n],
    )


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
