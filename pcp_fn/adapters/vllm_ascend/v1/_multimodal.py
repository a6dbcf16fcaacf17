"""The multimodal methods of the vllm-ascend manager, on :mod:`pcp_fn.multimodal`.

The runner hands these the scheduler's Python objects (request states, the
encoder cache, the scheduler output) and its host buffers, and expects the
reference's side effects on them (the localized scheduler output, the
``is_mm_embed`` mask, the M-RoPE buffer); pcp_fn's helpers are pure, so the
methods here apply their results to those objects.

Duck-typed reads: a request state's ``mm_features`` (``identifier``,
``mm_position.offset/length/is_embed``), ``mrope_positions``,
``mrope_position_delta``, ``prompt_token_ids``, ``prompt_embeds``,
``num_computed_tokens``; the scheduler output's ``total_num_scheduled_tokens``,
``num_scheduled_tokens``, ``scheduled_encoder_inputs``, ``free_encoder_mm_hashes``;
``input_batch.req_ids``; ``mrope_positions.cpu``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import _ops

_LOCALIZED_FIELDS = (
    "total_num_scheduled_tokens",
    "num_scheduled_tokens",
    "scheduled_encoder_inputs",
    "free_encoder_mm_hashes",
)


def _prompt_length(req: Any) -> int:
    try:
        from vllm.utils import length_from_prompt_token_ids_or_embeds
    except ImportError:
        ids = req.prompt_token_ids
        return len(ids) if ids is not None else int(req.prompt_embeds.shape[0])
    return int(length_from_prompt_token_ids_or_embeds(req.prompt_token_ids, req.prompt_embeds))


class MultimodalMethods:
    """Mixin of :class:`FunctionalDCSManager`: prompt embeds, M-RoPE and the local encoder schedule."""

    def cache_local_schedule_layout(
        self, num_scheduled_tokens: np.ndarray, num_reqs: int, total_num_scheduled_tokens: int
    ) -> None:
        """Keep a read-only snapshot of this rank's scheduled counts (for the multimodal preprocess)."""
        self._set(
            local_schedule=_ops.local_schedule_layout(
                num_scheduled_tokens, num_reqs, total_num_scheduled_tokens
            )
        )

    def get_local_schedule_layout(self) -> tuple[np.ndarray | None, int | None]:
        snap = self._record.local_schedule
        if snap is None:
            return None, None
        return snap.num_scheduled_tokens, snap.total_num_scheduled_tokens

    def fill_prompt_embeds_for_pcp(
        self, req_embeds: torch.Tensor, req_positions_np: np.ndarray, dst_slice: torch.Tensor
    ) -> None:
        """Write one request's prompt embeds at its local positions into ``dst_slice`` (rows past the
        embeds are left as they are)."""
        if req_embeds.shape[0] == 0 or dst_slice.shape[0] == 0:
            return
        dst_slice.copy_(_ops.gather_prompt_embeds(req_embeds, req_positions_np, dst_slice))

    def remap_mrope_positions_for_pcp(
        self,
        positions_np: np.ndarray,
        num_scheduled_tokens: np.ndarray,
        num_reqs: int,
        input_batch: Any,
        requests: dict[str, Any],
        mrope_positions: Any,
    ) -> None:
        """M-RoPE positions of this rank's tokens into ``mrope_positions.cpu[:, :num_local_tokens]``."""
        req_ids = list(input_batch.req_ids)
        counts = np.asarray(num_scheduled_tokens[: len(req_ids)], dtype=np.int64)
        tables, deltas, prompts = [], [], []
        for req_id in req_ids:
            req = requests[req_id]
            table = req.mrope_positions
            has_table = table is not None and table.shape[1] > 0
            tables.append(table if has_table else None)
            deltas.append(req.mrope_position_delta if has_table else None)
            prompts.append(_prompt_length(req) if has_table else 0)
        total = int(counts.sum())
        out = _ops.remap_mrope(tables, deltas, np.asarray(prompts), positions_np[:total], counts)
        mrope_positions.cpu[:, :total] = out

    def build_local_mm_schedule(
        self,
        req_ids: list[str],
        requests: dict[str, Any],
        positions_np: np.ndarray,
        local_num_scheduled_tokens: np.ndarray,
        encoder_cache: dict[str, torch.Tensor],
    ) -> tuple[dict[str, list[int]], set[str]]:
        """Encoder inputs this rank's tokens need: ``({req_id: [missing features]}, needed hashes)``."""
        return _ops.build_local_mm_schedule(
            req_ids, requests, positions_np, local_num_scheduled_tokens, encoder_cache
        )

    def gather_mm_embeddings_for_pcp(
        self,
        req_ids: list[str],
        requests: dict[str, Any],
        positions_np: np.ndarray,
        local_num_scheduled_tokens: np.ndarray,
        shift_computed_tokens: int,
        encoder_cache: dict[str, torch.Tensor],
        is_mm_embed: torch.Tensor,
        model: Any,
        is_multimodal_pruning_enabled: bool,
        uses_mrope: bool,
        warning_once: Callable[..., Any] | None = None,
    ) -> tuple[list[torch.Tensor], bool, bool]:
        """The encoder rows this rank's tokens consume, in local token order.

        Marks them in ``is_mm_embed`` and, with multimodal pruning and M-RoPE,
        writes the recomputed M-RoPE positions into the request states.
        """
        got = _ops.gather_mm_embeddings(
            req_ids,
            requests,
            positions_np,
            local_num_scheduled_tokens,
            shift_computed_tokens,
            encoder_cache,
            model,
            is_multimodal_pruning_enabled,
            uses_mrope,
            warning_once,
        )
        k = got.is_mm_embed.shape[0]
        is_mm_embed[:k] |= got.is_mm_embed.to(is_mm_embed.device)
        for req_id, (positions, delta) in got.mrope_updates.items():
            requests[req_id].mrope_positions.copy_(positions)
            requests[req_id].mrope_position_delta = delta
        return got.embeds, got.should_sync_mrope_positions, got.should_sync_xdrope_positions

    def maybe_localize_scheduler_output_for_mm_preprocess(
        self,
        scheduler_output: Any,
        req_ids: list[str],
        requests: dict[str, Any],
        positions_np: np.ndarray,
        local_num_scheduled_tokens: np.ndarray | None,
        local_total_num_scheduled_tokens: int | None,
        encoder_cache: dict[str, torch.Tensor],
    ) -> dict[str, Any] | None:
        """Make ``scheduler_output`` this rank's view for the multimodal preprocess (in place, as the
        runner reads the same object); returns what :meth:`restore_scheduler_output_after_mm_preprocess`
        needs, or ``None`` when nothing differs."""
        local = _ops.localize_scheduler_output(
            scheduler_output,
            req_ids,
            requests,
            positions_np,
            local_num_scheduled_tokens,
            local_total_num_scheduled_tokens,
            encoder_cache,
        )
        if local is scheduler_output:
            return None
        saved = {name: getattr(scheduler_output, name) for name in _LOCALIZED_FIELDS}
        for name in _LOCALIZED_FIELDS:
            setattr(scheduler_output, name, getattr(local, name))
        return saved

    def restore_scheduler_output_after_mm_preprocess(
        self, scheduler_output: Any, restore_state: dict[str, Any] | None
    ) -> None:
        if restore_state is None:
            return
        for name in _LOCALIZED_FIELDS:
            setattr(scheduler_output, name, restore_state[name])
