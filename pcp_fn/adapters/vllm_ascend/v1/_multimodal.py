"""The multimodal helpers of the vllm-ascend manager, on [`pcp_fn.multimodal`][].

The runner hands these the scheduler's Python objects (request states, the
encoder cache, the scheduler output) and its host buffers, and expects the
reference's side effects on them (the localized scheduler output, the
`is_mm_embed` mask, the M-RoPE buffer); pcp_fn's helpers are pure, so the
helpers here apply their results to those objects.

Duck-typed reads: a request state's `mm_features` (`identifier`,
`mm_position.offset/length/is_embed`), `mrope_positions`,
`mrope_position_delta`, `prompt_token_ids`, `prompt_embeds`,
`num_computed_tokens`; the scheduler output's `total_num_scheduled_tokens`,
`num_scheduled_tokens`, `scheduled_encoder_inputs`, `free_encoder_mm_hashes`;
`input_batch.req_ids`; `mrope_positions.cpu`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import _ops
from ._record import RecordCell
from .engine_types import NPUInputBatch

if TYPE_CHECKING:  # the vLLM objects' protocols, for annotations only (no other adapter imported)
    from ...vllm.engine_types import (
        CachedRequestState,
        CpuGpuBuffer,
        SchedulerOutput,
        SupportsMultiModalPruning,
    )

_LOCALIZED_FIELDS = (
    "total_num_scheduled_tokens",
    "num_scheduled_tokens",
    "scheduled_encoder_inputs",
    "free_encoder_mm_hashes",
)


def _prompt_length(req: CachedRequestState) -> int:
    try:
        from vllm.utils import length_from_prompt_token_ids_or_embeds
    except ImportError:
        ids = req.prompt_token_ids
        return len(ids) if ids is not None else int(req.prompt_embeds.shape[0])
    return int(length_from_prompt_token_ids_or_embeds(req.prompt_token_ids, req.prompt_embeds))


class Multimodal:
    """Prompt embeds, M-RoPE and the local encoder schedule of
    [`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager].

    Holds the manager's record cell (`cache_local_schedule_layout`'s snapshot is kept there);
    the rest works on what the runner hands it.
    """

    def __init__(self, records: RecordCell) -> None:
        self.records = records

    def cache_layout(self, num_scheduled_tokens: np.ndarray, num_reqs: int, total: int) -> None:
        """`cache_local_schedule_layout`: a read-only snapshot of this rank's scheduled counts."""
        self.records.set(local_schedule=_ops.local_schedule_layout(num_scheduled_tokens, num_reqs, total))

    def layout(self) -> tuple[np.ndarray | None, int | None]:
        """`get_local_schedule_layout`."""
        snap = self.records.current.local_schedule
        if snap is None:
            return None, None
        return snap.num_scheduled_tokens, snap.total_num_scheduled_tokens

    @staticmethod
    def fill_prompt_embeds(embeds: torch.Tensor, positions: np.ndarray, dst: torch.Tensor) -> None:
        """`fill_prompt_embeds_for_pcp`: rows past the embeds are left as they are."""
        if embeds.shape[0] == 0 or dst.shape[0] == 0:
            return
        dst.copy_(_ops.gather_prompt_embeds(embeds, positions, dst))

    @staticmethod
    def mrope(
        positions_np: np.ndarray,
        counts: np.ndarray,
        input_batch: NPUInputBatch,
        requests: dict[str, CachedRequestState],
        out: CpuGpuBuffer,
    ) -> None:
        """`remap_mrope_positions_for_pcp` into `out.cpu[:, :num_local_tokens]`."""
        req_ids = list(input_batch.req_ids)
        counts = np.asarray(counts[: len(req_ids)], dtype=np.int64)
        tables, deltas, prompts = [], [], []
        for req_id in req_ids:
            req = requests[req_id]
            table = req.mrope_positions
            has_table = table is not None and table.shape[1] > 0
            tables.append(table if has_table else None)
            deltas.append(req.mrope_position_delta if has_table else None)
            prompts.append(_prompt_length(req) if has_table else 0)
        total = int(counts.sum())
        out.cpu[:, :total] = _ops.remap_mrope(
            tables, deltas, np.asarray(prompts), positions_np[:total], counts
        )

    @staticmethod
    def gather_embeddings(
        req_ids: list[str], requests: dict[str, CachedRequestState], positions_np: np.ndarray,
        local_counts: np.ndarray, shift: int, encoder_cache: dict[str, torch.Tensor],
        is_mm_embed: torch.Tensor, model: SupportsMultiModalPruning, pruning: bool, uses_mrope: bool,
        warning_once: Callable[..., Any] | None,
    ) -> tuple[list[torch.Tensor], bool, bool]:  # fmt: skip
        """`gather_mm_embeddings_for_pcp`: marks `is_mm_embed`, writes the M-RoPE updates."""
        got = _ops.gather_mm_embeddings(
            req_ids, requests, positions_np, local_counts, shift, encoder_cache, model, pruning, uses_mrope,
            warning_once,
        )  # fmt: skip
        k = got.is_mm_embed.shape[0]
        is_mm_embed[:k] |= got.is_mm_embed.to(is_mm_embed.device)
        for req_id, (positions, delta) in got.mrope_updates.items():
            requests[req_id].mrope_positions.copy_(positions)
            requests[req_id].mrope_position_delta = delta
        return got.embeds, got.should_sync_mrope_positions, got.should_sync_xdrope_positions

    @staticmethod
    def localize(
        scheduler_output: SchedulerOutput, req_ids: list[str], requests: dict[str, CachedRequestState],
        positions_np: np.ndarray, local_counts: np.ndarray | None, local_total: int | None,
        encoder_cache: dict[str, torch.Tensor],
    ) -> dict[str, Any] | None:  # fmt: skip
        """`maybe_localize_scheduler_output_for_mm_preprocess`: `scheduler_output` made this rank's
        view in place; what the restore needs, or `None` when nothing differs."""
        local = _ops.localize_scheduler_output(
            scheduler_output, req_ids, requests, positions_np, local_counts, local_total, encoder_cache
        )
        if local is scheduler_output:
            return None
        saved = {name: getattr(scheduler_output, name) for name in _LOCALIZED_FIELDS}
        for name in _LOCALIZED_FIELDS:
            setattr(scheduler_output, name, getattr(local, name))
        return saved

    @staticmethod
    def restore(scheduler_output: SchedulerOutput, restore_state: dict[str, Any] | None) -> None:
        """`restore_scheduler_output_after_mm_preprocess`."""
        if restore_state is None:
            return
        for name in _LOCALIZED_FIELDS:
            setattr(scheduler_output, name, restore_state[name])
