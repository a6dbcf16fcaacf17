"""Consumers of the MRV2 layout: KV slot mappings, hidden-state restore, draft prefill, sampling.

They read the layout a previous ``build_layout`` / ``partition_batch`` left in
the state. The collective is the caller's: hidden states come in as
``gathered [P*Lp, ...]``, the ``P`` ranks' fixed-size ``[Lp, ...]`` local
buffers stacked rank-major (what ``all_gather(local, dim=0)`` yields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ..core.pytree import pytree_dataclass
from .layout import MRV2State, rank_row
from .partition import LocalBatch


def gathered_slot_mappings(
    state: MRV2State, global_slot_mappings: torch.Tensor
) -> tuple[MRV2State, torch.Tensor]:
    """``[K, T'] -> [K, P*Lp]``: the KV slot of every gathered row.

    Seed ``_convert_to_gathered_slot_mappings``: gathers each KV-cache group's
    global slot mapping by ``padded_gather_idx`` and puts ``pad_slot_id`` where
    the row must not write (padding, and the copies of a replicated request on
    ranks other than 0). ``T'`` must cover the global tokens. ``P = 2``, three
    decodes with slots ``[[123, 456, 789]]``: replicated, ``Lp = 3`` ->
    ``[[123, 456, 789, -1, -1, -1]]``; sharded (rank 0 owns requests 0 and 2,
    rank 1 request 1), ``Lp = 2`` -> ``[[123, 789, 456, -1]]``.
    """
    layout = state.require_layout("gathered_slot_mappings")
    if global_slot_mappings.dim() != 2:
        raise ValueError(
            "global_slot_mappings must be [num_kv_cache_groups, num_tokens], "
            f"got shape {tuple(global_slot_mappings.shape)}"
        )
    rows = global_slot_mappings.index_select(1, layout.padded_gather_idx)
    return state, torch.where(layout.gathered_kv_write_mask, rows, state.config.pad_slot_id)


def _restore(state: MRV2State, gathered: torch.Tensor, num_tokens: int | None, op: str) -> torch.Tensor:
    layout = state.require_layout(op)
    rows = state.config.pcp_size * layout.padded_num_tokens
    if gathered.dim() < 1 or gathered.shape[0] != rows:
        raise ValueError(
            f"{op}: gathered must stack the {state.config.pcp_size} ranks' [{layout.padded_num_tokens}, ...] "
            f"buffers ({rows} rows), got shape {tuple(gathered.shape)}"
        )
    index = layout.hidden_restore_idx
    if num_tokens is not None:
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
            raise ValueError(f"{op}: num_tokens must be a static int, got {type(num_tokens).__name__}")
        if not 0 <= num_tokens <= index.shape[0]:
            raise ValueError(f"{op}: num_tokens={num_tokens} must be in [0, max_num_tokens={index.shape[0]}]")
        index = index[:num_tokens]
    return gathered.index_select(0, index)


def restore_hidden_states(
    state: MRV2State, gathered: torch.Tensor, num_tokens: int | None = None
) -> tuple[MRV2State, torch.Tensor]:
    """``[P*Lp, ...] -> [T, ...]``: the all-gathered hidden states in global token order.

    ``gathered[hidden_restore_idx]`` (seed ``restore_hidden_states`` after its
    all-gather): row ``g`` is the writing copy of global token ``g``; rows past
    the real tokens repeat gathered row 0. ``num_tokens`` (static) keeps only
    the first rows. ``P = 2``, sharded decodes ``[1, 1, 1]``, ``Lp = 2``,
    gathered ``[h0, h2, h1, _]`` -> ``[h0, h1, h2, ...]``.
    """
    return state, _restore(state, gathered, num_tokens, "restore_hidden_states")


def prepare_draft_prefill(
    state: MRV2State, local_batch: LocalBatch, input_ids: torch.Tensor
) -> tuple[MRV2State, LocalBatch]:
    """The local batch with the drafter's ids ``input_ids[local gather index]``.

    Seed ``prepare_draft_prefill``. ``input_ids`` is in global token order
    (``[T']``, covering the tokens). Like the seed, every one of the ``Lp``
    rows is gathered, so padding rows take ``input_ids[0]`` (the seed does not
    zero them here). ``P = 2``, rank 1 of a 7-token prefill (rows
    ``[2, 3, 4, 5]``), ids ``[10 .. 16]`` -> ``[12, 13, 14, 15]``.
    """
    layout = state.require_layout("prepare_draft_prefill")
    P, Lp = state.config.pcp_size, layout.padded_num_tokens
    rows = rank_row(layout.padded_gather_idx.view(P, Lp), state.pcp_rank)
    ids = input_ids.index_select(0, rows).to(local_batch.input_ids.dtype)
    return state, dataclasses.replace(local_batch, input_ids=ids)


@pytree_dataclass
class DraftHiddenStates:
    """Restored draft-prefill hidden states, ``[T, ...]`` each (the same tensor when given once)."""

    last_hidden_states: torch.Tensor
    hidden_states: torch.Tensor


def restore_draft_prefill(
    state: MRV2State,
    last_hidden_states: torch.Tensor,
    hidden_states: torch.Tensor,
    num_tokens: int | None = None,
) -> tuple[MRV2State, DraftHiddenStates]:
    """Restore the drafter's gathered outputs (seed ``restore_draft_prefill``).

    When ``hidden_states`` is ``last_hidden_states`` (the same object) it is
    restored once and both fields hold the result, like the seed. The seed
    skips this when no draft prefill was prepared; here the caller decides.
    """
    last = _restore(state, last_hidden_states, num_tokens, "restore_draft_prefill")
    if hidden_states is last_hidden_states:
        return state, DraftHiddenStates(last, last)
    hidden = _restore(state, hidden_states, num_tokens, "restore_draft_prefill")
    return state, DraftHiddenStates(last, hidden)


@pytree_dataclass
class SamplingInputs:
    """Global-order hidden states for sampling: ``[T, H]`` and the auxiliary ones (or ``None``)."""

    hidden_states: torch.Tensor
    aux_hidden_states: tuple[torch.Tensor, ...] | None


def restore_for_sampling(
    state: MRV2State,
    hidden_states: torch.Tensor,
    aux_hidden_states: Sequence[torch.Tensor] | None = None,
    num_tokens: int | None = None,
) -> tuple[MRV2State, SamplingInputs]:
    """Restore the gathered hidden states (and each auxiliary one) to global order
    (seed ``restore_for_sampling``); the caller samples with its global batch."""
    hidden = _restore(state, hidden_states, num_tokens, "restore_for_sampling")
    aux = None
    if aux_hidden_states is not None:
        aux = tuple(_restore(state, a, num_tokens, "restore_for_sampling") for a in aux_hidden_states)
    return state, SamplingInputs(hidden, aux)
