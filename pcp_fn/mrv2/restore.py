"""Consumers of the MRV2 layout: KV slot mappings, hidden-state restore, draft prefill, sampling.

They read the layout and bucket the last `build_layout` / `partition_batch`
left in the state, and take no size argument: every shape comes from the
state's bucket (`Lp` local rows per rank, `F_b = min(T, P * Lp)` global
token rows, [`pcp_fn.mrv2.token_rows`][]). An input of the wrong rows is a
`ValueError` naming the argument and the rows expected; nothing is
truncated or extended. The collective is the caller's: hidden states come in
as `gathered [P*Lp, ...]`, the `P` ranks' fixed-size `[Lp, ...]` local
buffers stacked rank-major (what `all_gather(local, dim=0)` yields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ..core.pytree import pytree_dataclass
from ..core.rank import select_rank
from .batch import token_rows
from .layout import MRV2State, check_state
from .partition import LocalBatch


def _check_rows(op: str, name: str, value: object, state: MRV2State, gathered: bool, dim: int = 0) -> None:
    """`value` is a tensor with the state's gathered (`P * Lp`) or global (`F_b`) rows in
    `dim` (the message is only made on an error: the consumers run every step)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a tensor, got {type(value).__name__}")
    cfg, Lp = state.config, state.bucket.num_tokens
    rows = cfg.pcp_size * Lp if gathered else token_rows(cfg, state.bucket)
    if value.dim() <= dim or value.shape[dim] != rows:
        if gathered:
            what = f"the {cfg.pcp_size} ranks' [{Lp}, ...] buffers stacked"
        else:
            what = f"F_b = min(max_num_tokens, pcp_size * {Lp}) global tokens"
        raise ValueError(f"{op}: {name} must have {rows} rows ({what}), got shape {tuple(value.shape)}")


def gathered_slot_mappings(
    state: MRV2State, global_slot_mappings: torch.Tensor
) -> tuple[MRV2State, torch.Tensor]:
    """`[K, F_b] -> [K, P*Lp]`: the KV slot of every gathered row.

    vLLM `PCPManager._convert_to_gathered_slot_mappings`: gathers each
    KV-cache group's global slot mapping by `padded_gather_idx` and puts
    `pad_slot_id` where the row must not write (padding, and the copies of
    a replicated request on ranks other than 0). `global_slot_mappings`
    must have the bucket's `F_b` global token rows (slice vLLM's
    `[K, max_num_tokens]` buffer). `P = 2`, three one-token decodes with
    slots `123, 456, 789`: sharded (rank 0 owns requests 0 and 2, rank 1
    request 1), bucket `(2, 2)`: `[[123, 456, 789, 0]] -> [[123, 789, 456, -1]]`;
    replicated, bucket `(4, 4)`: `[[123, 456, 789, 0, 0, 0, 0, 0]] ->
    [[123, 456, 789, -1, -1, -1, -1, -1]]` (rank 0's copies write).
    """
    op = "gathered_slot_mappings"
    check_state(state, op)
    if not isinstance(global_slot_mappings, torch.Tensor) or global_slot_mappings.dim() != 2:
        got = getattr(global_slot_mappings, "shape", type(global_slot_mappings).__name__)
        raise ValueError(f"{op}: global_slot_mappings must be [num_kv_cache_groups, F_b], got {got}")
    _check_rows(op, "global_slot_mappings", global_slot_mappings, state, gathered=False, dim=1)
    layout = state.layout
    rows = global_slot_mappings.index_select(1, layout.padded_gather_idx)
    return state, torch.where(layout.gathered_kv_write_mask, rows, state.config.pad_slot_id)


def _restore(state: MRV2State, op: str, name: str, gathered: torch.Tensor) -> torch.Tensor:
    _check_rows(op, name, gathered, state, gathered=True)
    return gathered.index_select(0, state.layout.hidden_restore_idx)


def restore_hidden_states(state: MRV2State, gathered: torch.Tensor) -> tuple[MRV2State, torch.Tensor]:
    """`[P*Lp, ...] -> [F_b, ...]`: the all-gathered hidden states in global token order.

    `gathered[hidden_restore_idx]` (vLLM `PCPManager.restore_hidden_states`
    after its all-gather): row `g` is the writing copy of global token
    `g`; rows past the real tokens (`layout.num_tokens`) repeat gathered
    row 0 (vLLM returns exactly the real rows). `P = 2`, sharded decodes
    `[1, 1, 1]`, bucket `(2, 2)` (`Lp = 2`, `F_b = 4`), gathered
    `[h0, h2, h1, _]` -> `[h0, h1, h2, h0]`.
    """
    check_state(state, "restore_hidden_states")
    return state, _restore(state, "restore_hidden_states", "gathered", gathered)


def prepare_draft_prefill(
    state: MRV2State, local_batch: LocalBatch, input_ids: torch.Tensor
) -> tuple[MRV2State, LocalBatch]:
    """The local batch with the drafter's ids `input_ids[local gather index]`.

    vLLM `PCPManager.prepare_draft_prefill`. `input_ids` is `[F_b]`
    int32 (vLLM's `input_ids` buffers are int32) in global token order.
    Like vLLM, every one of the `Lp` rows is gathered, so padding rows take
    `input_ids[0]` (vLLM does not zero them here). `P = 2`, rank 1 of a
    7-token prefill (rows `[2, 3, 4, 5]`), ids `[10 .. 16, 0]` ->
    `[12, 13, 14, 15]`.

    Raises:
        TypeError: `input_ids` not an int32 tensor, `local_batch` not a
            [`LocalBatch`][pcp_fn.mrv2.LocalBatch].
        ValueError: `local_batch` of another bucket than the state's, or
            `input_ids` not `[F_b]`.
    """
    op = "prepare_draft_prefill"
    check_state(state, op)
    if not isinstance(local_batch, LocalBatch):
        raise TypeError(f"{op}: local_batch must be an mrv2.LocalBatch, got {type(local_batch).__name__}")
    if local_batch.bucket != state.bucket:
        raise ValueError(
            f"{op}: local_batch.bucket {local_batch.bucket} is not the state's bucket {state.bucket}; "
            "pass the local batch partition_batch returned with this state"
        )
    _check_rows(op, "input_ids", input_ids, state, gathered=False)
    if input_ids.dim() != 1 or input_ids.dtype != torch.int32:
        raise TypeError(
            f"{op}: input_ids must be a 1-D int32 tensor (the local batch's dtype; no cast that could "
            f"wrap a value), got {input_ids.dtype} of shape {tuple(input_ids.shape)}"
        )
    P, Lp = state.config.pcp_size, state.bucket.num_tokens
    rows = select_rank(state.layout.padded_gather_idx.view(P, Lp), state.pcp_rank)
    return state, dataclasses.replace(local_batch, input_ids=input_ids.index_select(0, rows))


@pytree_dataclass
class DraftHiddenStates:
    """Restored draft-prefill hidden states, `[F_b, ...]` each (the same tensor when given once)."""

    last_hidden_states: torch.Tensor
    hidden_states: torch.Tensor


def restore_draft_prefill(
    state: MRV2State, last_hidden_states: torch.Tensor, hidden_states: torch.Tensor
) -> tuple[MRV2State, DraftHiddenStates]:
    """Restore the drafter's gathered outputs, `[P*Lp, ...] -> [F_b, ...]` each
    (vLLM `PCPManager.restore_draft_prefill`).

    When `hidden_states` is `last_hidden_states` (the same object) it is
    restored once and both fields hold the result, like vLLM. vLLM skips this
    when no draft prefill was prepared; here the caller decides.
    """
    op = "restore_draft_prefill"
    check_state(state, op)
    last = _restore(state, op, "last_hidden_states", last_hidden_states)
    if hidden_states is last_hidden_states:
        return state, DraftHiddenStates(last, last)
    return state, DraftHiddenStates(last, _restore(state, op, "hidden_states", hidden_states))


@pytree_dataclass
class SamplingInputs:
    """Global-order hidden states for sampling: `[F_b, H]` and the auxiliary ones (or `None`)."""

    hidden_states: torch.Tensor
    aux_hidden_states: tuple[torch.Tensor, ...] | None


def restore_for_sampling(
    state: MRV2State,
    hidden_states: torch.Tensor,
    aux_hidden_states: Sequence[torch.Tensor] | None = None,
) -> tuple[MRV2State, SamplingInputs]:
    """Restore the gathered hidden states (and each auxiliary one) to global order,
    `[P*Lp, ...] -> [F_b, ...]` (vLLM `PCPManager.restore_for_sampling`); the
    caller samples with its global batch (rows past `layout.num_tokens` are padding)."""
    op = "restore_for_sampling"
    check_state(state, op)
    hidden = _restore(state, op, "hidden_states", hidden_states)
    aux = None
    if aux_hidden_states is not None:
        aux = tuple(
            _restore(state, op, f"aux_hidden_states[{i}]", a) for i, a in enumerate(aux_hidden_states)
        )
    return state, SamplingInputs(hidden, aux)
