"""The checks of what vLLM hands the drop-in: constructor arguments, block tables, descriptors, the
global batch's device tensors, restore and draft inputs.

The project's rule for bad input: a `ValueError` (or `TypeError` for a wrong type) at the
boundary naming the field and the limit, before anything is written; nothing cast, clamped or
truncated. Where vLLM's `PCPManager` raises (`index_select` into its int32 / int64 buffers
refuses any other dtype, or another device), so does the drop-in, here and by name.

The per-step checks ([`check_token_tensors`][pcp_fn.adapters.vllm.inputs.check_token_tensors],
[`check_num_tokens`][pcp_fn.adapters.vllm.inputs.check_num_tokens],
[`check_gathered_input`][pcp_fn.adapters.vllm.inputs.check_gathered_input],
[`check_draft_ids`][pcp_fn.adapters.vllm.inputs.check_draft_ids]) read host attributes only (dtype,
`ndim`, device, ints), never a device value; the bookkeeper calls them only when its O(1) test of
the same attributes fails, so a good step pays that test alone. This module imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...core.checks import INT32_MAX, check_bool, check_device, check_host_buffer, check_int
from .engine_types import BatchExecutionDescriptor, BlockTables, CUDAGraphModes

MAX_NUM_REQS = INT32_MAX // 2
"""The largest `max_num_reqs`: the `2 * max_num_reqs` local request rows are int32 values (`cu_num_logits`,
the staged request rows)."""
MAX_NUM_TOKENS = INT32_MAX
"""The largest `max_num_tokens`: token counts and sequence ends are int32."""
BLOCK_TABLE_DTYPE = torch.int32
"""vLLM's block-table dtype (`vllm/v1/worker/gpu/block_table.py`): its gather kernel writes the local tables
through their addresses as int32."""
SLOT_DTYPES = (torch.int64, torch.int32)
"""The slot dtypes of the cache-write kernels (vLLM's int64, vllm-ascend's int32)."""


def check_flags(shard_decode_requests: object, moe_gathers_tokens: object) -> None:
    """The constructor's flags are bools: `"False"` would read as true."""
    check_bool("shard_decode_requests", shard_decode_requests)
    check_bool("moe_gathers_tokens", moe_gathers_tokens)


def persistent_bytes(P: int, R: int | None, T: int | None, num_groups: int) -> int:
    """A lower bound on the persistent buffers' bytes for `P` ranks, `R` requests, `T`
    tokens and `num_groups` KV-cache groups (what the constructor allocates at capacity)."""
    if T is None:
        return 0
    tokens = P * T  # the MoE mask [P*T] bool, allocated with max_num_tokens alone
    if R is None:
        return tokens
    per_token = 4 + 8 + 1 + 8 + 2 * 4  # ids, positions, padding, restore index, staged ids / positions
    per_gathered = 8 + 1 + 8 + 1  # gather index, write mask, slot index, MoE mask
    slots = 8 * num_groups * (T + 1 + P * T)  # global and gathered slot mappings
    return per_token * T + per_gathered * P * T + slots + 2 * R * (4 * 5 + 8)


def check_capacities(
    max_num_reqs: object, max_num_tokens: object, device: torch.device, P: int, num_groups: int
) -> None:
    """`max_num_reqs` / `max_num_tokens`, when given: ints (not bools) in `[1, MAX_NUM_REQS]`
    / `[1, MAX_NUM_TOKENS]`, and on the CPU buffers that fit this machine's memory (named here,
    not in an allocator)."""
    if max_num_reqs is not None:
        check_int("max_num_reqs", max_num_reqs, 1, MAX_NUM_REQS)
    if max_num_tokens is not None:
        check_int("max_num_tokens", max_num_tokens, 1, MAX_NUM_TOKENS)
    if device.type == "cpu":
        nbytes = persistent_bytes(P, max_num_reqs, max_num_tokens, num_groups)  # type: ignore[arg-type]
        what = f"persistent buffers (max_num_reqs={max_num_reqs}, pcp_world_size={P})"
        check_host_buffer("max_num_tokens", nbytes, what)


def check_block_tables(block_tables: BlockTables | None, device: torch.device) -> None:
    """vLLM's `BlockTables` as the drop-in reads them: `input_block_tables`, one 2-D int32
    tensor per KV-cache group (`num_kv_cache_groups` of them) on the manager's device, an
    integer `cp_interleave >= 1` and, when present, `slot_mappings` of a slot dtype."""
    if block_tables is None:
        return
    name = "block_tables"
    tables = getattr(block_tables, "input_block_tables", None)
    if not isinstance(tables, Sequence) or not all(isinstance(t, torch.Tensor) for t in tables):
        raise TypeError(
            f"{name}.input_block_tables must be a sequence of tensors, got {type(tables).__name__}"
        )
    groups = getattr(block_tables, "num_kv_cache_groups", None)
    check_int(f"{name}.num_kv_cache_groups", groups, 0)
    if len(tables) != groups:
        raise ValueError(
            f"{name}.input_block_tables has {len(tables)} tables; {name}.num_kv_cache_groups is {groups}"
        )
    for g, t in enumerate(tables):
        where = f"{name}.input_block_tables[{g}]"
        if t.dtype != BLOCK_TABLE_DTYPE:
            raise TypeError(f"{where} must be {BLOCK_TABLE_DTYPE} (vLLM's block ids), got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{where} must be 2-D [requests, blocks], got shape {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{where} is on {t.device}; the manager's device is {device}")
    check_int(f"{name}.cp_interleave", getattr(block_tables, "cp_interleave", 1), 1)
    slots = getattr(block_tables, "slot_mappings", None)
    if slots is not None and getattr(slots, "dtype", None) not in SLOT_DTYPES:
        raise TypeError(
            f"{name}.slot_mappings must be int64 or int32 slots, got {getattr(slots, 'dtype', slots)}"
        )


def resolve_device(device: torch.device) -> torch.device:
    """`device` with its index, as a tensor made there reports it (`cuda` -> `cuda:0`): the
    device the per-step checks compare with."""
    if device.index is not None or device.type in ("cpu", "meta"):
        return device
    check_device("device", device)  # a missing GPU named here, not in a torch internal
    return torch.empty(0, device=device).device


def check_descriptor(batch_desc: BatchExecutionDescriptor, Mode: CUDAGraphModes) -> None:
    """A descriptor's fields the partition reads: `cg_mode` a member of vLLM's `CUDAGraphMode`;
    unless `NONE`, `num_tokens` an int `>= 0`; for `FULL`, `num_reqs` `None` or an
    int `>= 1`; `max_query_len` / `uniform_token_count` `None` or ints `>= 1`. Called
    once per distinct descriptor."""
    mode = batch_desc.cg_mode
    if not isinstance(mode, type(Mode.NONE)):
        raise TypeError(
            f"batch_desc.cg_mode must be a CUDAGraphMode member, got {type(mode).__name__} {mode!r}"
        )
    if mode == Mode.NONE:
        return
    check_int("batch_desc.num_tokens", batch_desc.num_tokens, 0)
    if mode == Mode.FULL and batch_desc.num_reqs is not None:
        check_int("batch_desc.num_reqs", batch_desc.num_reqs, 1)
    for field in ("max_query_len", "uniform_token_count"):
        value = getattr(batch_desc, field, None)
        if value is not None:
            check_int(f"batch_desc.{field}", value, 1)


def check_tensor_1d(name: str, value: Any, dtype: torch.dtype, device: torch.device) -> None:
    """`value` is a 1-D `dtype` tensor on `device` (`name` names it in the error)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(
            f"{name} must be {dtype} (vLLM's InputBuffers dtype: vLLM's manager refuses any other), "
            f"got {value.dtype}"
        )
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D [num_tokens_after_padding], got shape {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}; the manager's device is {device}")


def check_token_tensors(
    input_ids: Any, positions: Any, device: torch.device, what: str = "input_batch"
) -> None:
    """`input_ids` int32 and `positions` int64, 1-D, on the manager's device: vLLM's own
    `index_select` into its buffers raises for anything else. Ids are int32 by dtype, so an id
    past int32 cannot reach the staging (no value is read)."""
    check_tensor_1d(f"{what}.input_ids", input_ids, torch.int32, device)
    check_tensor_1d(f"{what}.positions", positions, torch.int64, device)


def check_num_tokens(num_tokens: object, total: int) -> None:
    """`input_batch.num_tokens` is the scheduled total (the restores return that many rows, and
    the slot mappings cover them): an int equal to `sum(num_scheduled_tokens)`."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int | np.integer):
        raise TypeError(
            f"input_batch.num_tokens must be an int, got {type(num_tokens).__name__} {num_tokens!r}"
        )
    if num_tokens != total:
        raise ValueError(
            f"input_batch.num_tokens={num_tokens} disagrees with sum(input_batch.num_scheduled_tokens)"
            f"={total}: PCP lays out the scheduled tokens (vLLM's adaptive verification, whose per-request "
            "counts are known only on the device when its draft budget binds, cannot be partitioned)"
        )


def check_req_ids(req_ids: Any, num_reqs: int) -> None:
    """`input_batch.req_ids` has one entry per request."""
    if len(req_ids) != num_reqs:
        raise ValueError(f"input_batch.req_ids has {len(req_ids)} entries; the batch has {num_reqs} requests")


def check_upper_bounds(upper: Any, num_reqs: int) -> None:
    """`input_batch.seq_lens_cpu_upper_bound` has an entry per request (vLLM 0.33+'s per-step
    metadata indexes it by the local rows' requests)."""
    if len(upper) < num_reqs:
        name = "input_batch.seq_lens_cpu_upper_bound"
        raise ValueError(f"{name} has {len(upper)} entries; the batch has {num_reqs} requests")


def check_gathered_input(op: str, name: str, value: Any, device: torch.device) -> None:
    """A restore's local input `[Lp, ...]`: a tensor of at least one dimension on the manager's
    device (checked before the all-gather: a bad one fails here, not inside a collective)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a tensor, got {type(value).__name__}")
    if value.dim() == 0:
        raise ValueError(f"{op}: {name} must be [Lp, ...] (the local rows first), got a 0-d tensor")
    if value.device != device:
        raise ValueError(f"{op}: {name} is on {value.device}; the manager's device is {device}")


def check_draft_ids(input_ids: Any, num_tokens: int, device: torch.device) -> None:
    """The drafter's global `input_ids`: int32 (vLLM's `index_select` into the int32 local ids
    refuses any other dtype), 1-D, on the manager's device, covering the `num_tokens` tokens of
    the partitioned batch (vLLM's gather raises past them)."""
    check_tensor_1d("prepare_draft_prefill: input_ids", input_ids, torch.int32, device)
    if input_ids.shape[0] < num_tokens:
        raise ValueError(
            f"prepare_draft_prefill: input_ids has {input_ids.shape[0]} rows; it must cover the "
            f"{num_tokens} tokens of the partitioned batch"
        )


def check_capture(input_batch: Any, max_reqs: int, max_tokens: int) -> tuple[int, int]:
    """A capture / dummy batch's padded sizes `(rows, tokens)`: ints within the local request
    rows and `max_num_tokens`."""
    rows, tokens = input_batch.num_reqs_after_padding, input_batch.num_tokens_after_padding
    check_int("input_batch.num_reqs_after_padding", rows, 1, max_reqs)
    check_int("input_batch.num_tokens_after_padding", tokens, 0, max_tokens)
    return rows, tokens
