"""Multimodal inputs under PCP: M-RoPE positions, prompt embeds, and the local encoder schedule.

Under PCP a rank holds a request's head and tail chunks, so its tokens are not
a contiguous slice of the request: everything indexed by token position must be
gathered by the rank's absolute positions (`step(...).positions`) instead of
sliced. Two kinds of helpers live here:

- device ops (fixed shapes, capturable): [`remap_mrope_positions`][pcp_fn.remap_mrope_positions] and
  [`gather_prompt_embeds`][pcp_fn.gather_prompt_embeds], fed by the host packers
  [`pack_mrope_tables`][pcp_fn.pack_mrope_tables] /
  [`pack_prompt_embeds`][pcp_fn.pack_prompt_embeds] (one copy each, where bad input raises
  `ValueError`);
- host helpers on the scheduler's Python objects (the encoder schedule is a
  dict of request ids, and the encoder runs eagerly anyway):
  [`local_schedule_layout`][pcp_fn.multimodal.local_schedule_layout],
  [`build_local_mm_schedule`][pcp_fn.multimodal.build_local_mm_schedule],
  [`gather_mm_embeddings`][pcp_fn.multimodal.gather_mm_embeddings] and
  [`localize_scheduler_output`][pcp_fn.multimodal.localize_scheduler_output]. They are
  pure: they return new objects and never mutate what they are given (vllm-ascend
  mutates the scheduler output and restores it afterwards).

`P = 2`, rank 0, one fresh prefill of 5 tokens padded to 8: the rank holds
positions `[0, 1, 6, 7]`; with a 5-column M-RoPE table `m` and delta `d`
its M-RoPE positions are `[m[:, 0], m[:, 1], 6 + d, 7 + d]` (positions past
the prompt are completion positions, shifted by the delta).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .core.checks import (
    INT64_MAX,
    check_device,
    check_host_buffer,
    check_int,
    check_int_tensor,
    check_not_meta,
    check_uint64_within,
    host_ints,
)
from .core.pytree import pytree_dataclass
from .core.ragged import masked_gather

# ---------------------------------------------------------------------------------------------
# M-RoPE positions (device)
# ---------------------------------------------------------------------------------------------


@pytree_dataclass
class MRopeTables:
    """Every request's `[3, n]` M-RoPE table packed into one buffer (`R_b` request rows).

    Attributes:
        positions: `[R_b, 3, M]` int64, request `i`'s table in columns
            `[:length[i]]` (0 after).
        length: `[R_b]` int64 columns of each table; 0 = the request has no
            table (its M-RoPE positions are its 1-D positions).
        delta: `[R_b]` int64 `mrope_position_delta` (0 when it has none).
    """

    positions: torch.Tensor
    length: torch.Tensor
    delta: torch.Tensor


def pack_mrope_tables(
    tables: Sequence[torch.Tensor | np.ndarray | None],
    deltas: Sequence[int | None],
    num_rows: int,
    max_len: int,
    device: torch.device | str | None = None,
) -> MRopeTables:
    """Host boundary: pack per-request M-RoPE tables into a `[num_rows, 3, max_len]` buffer.

    `tables[i]` is request `i`'s `req.mrope_positions` (`[3, n]` or
    `None`), `deltas[i]` its `mrope_position_delta`. `max_len` is static
    (use `max_model_len`) so the buffer's shape never changes.

        pack_mrope_tables([m0, None], [100, None], num_rows=2, max_len=6)
        # positions[0, :, :5] = m0, length [5, 0], delta [100, 0]

    Raises:
        ValueError: more tables than `num_rows`, `tables`/`deltas` of
            different lengths, a table that is not `[3, n]` integers, a
            `uint64` table holding a value past the int64 limit, a `meta`
            table, a table wider than `max_len` (the buffer could not serve its
            positions `max_len .. n-1`), a buffer larger than this machine's
            memory, or a `device` this machine does not have.
    """
    check_int("num_rows", num_rows, 1)
    check_int("max_len", max_len, 1)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    check_device("device", dev)
    check_host_buffer(
        "max_len", num_rows * 3 * max_len * 8, f"a [num_rows={num_rows}, 3, max_len={max_len}] int64 buffer"
    )
    if len(tables) != len(deltas):
        raise ValueError(f"tables has {len(tables)} entries but deltas has {len(deltas)}")
    if len(tables) > num_rows:
        raise ValueError(f"{len(tables)} M-RoPE tables do not fit in num_rows={num_rows}")
    for i, d in enumerate(deltas):
        if d is not None:  # a fractional delta would silently become another position
            check_int(f"deltas[{i}]", d, -(2**62), 2**62)
    host = torch.zeros(num_rows, 3, max_len, dtype=torch.int64)
    length = torch.zeros(num_rows, dtype=torch.int64)
    delta = torch.zeros(num_rows, dtype=torch.int64)
    for i, (table, d) in enumerate(zip(tables, deltas)):
        if d is not None:
            delta[i] = int(d)
        if table is None:
            continue
        t = torch.as_tensor(table)
        check_not_meta(f"tables[{i}]", t)
        if t.dim() != 2 or t.shape[0] != 3:
            raise ValueError(f"M-RoPE table of request {i} must be [3, n], got shape {tuple(t.shape)}")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"M-RoPE table of request {i} must hold integers, got {t.dtype}")
        if t.dtype == torch.uint64:  # the int64 cast below would wrap 2**63 to a negative position
            check_uint64_within(f"tables[{i}]", t.cpu().numpy(), INT64_MAX)
        n = t.shape[1]
        if n > max_len:
            raise ValueError(
                f"M-RoPE table of request {i} has {n} columns but the packed buffer holds max_len={max_len}: "
                f"it is shorter than the positions {max_len}..{n - 1} it must serve"
            )
        host[i, :, :n] = t.to(torch.int64)
        length[i] = n
    flat = torch.cat([host.flatten(), length, delta])
    moved = flat.to(dev)  # the one copy
    size = host.numel()
    return MRopeTables(
        positions=moved[:size].view(num_rows, 3, max_len),
        length=moved[size : size + num_rows],
        delta=moved[size + num_rows :],
    )


def _check_local_tokens(positions: object, request_index: object) -> None:
    """Static: `positions` and `request_index` are `[L]` integer tensors (one entry per local
    token). Their values are device data, never read here: `request_index` must lie in
    `[0, R_b)` (`layout.request_index` does), which is the caller's contract."""
    check_int_tensor("positions", positions)
    if positions.dim() != 1:
        raise ValueError(
            f"positions must be 1-D [L] (one per local token), got shape {tuple(positions.shape)}"
        )
    check_int_tensor("request_index", request_index, tuple(positions.shape), "[L], like positions")


def remap_mrope_positions(
    tables: MRopeTables,
    num_prompt: torch.Tensor,
    positions: torch.Tensor,
    request_index: torch.Tensor,
    num_tokens: torch.Tensor,
) -> torch.Tensor:
    """`[3, L]` int64 M-RoPE positions of the rank's tokens (vllm-ascend `remap_mrope_positions_for_pcp`).

    Args:
        tables: from [`pack_mrope_tables`][pcp_fn.pack_mrope_tables] (`R_b` rows).
        num_prompt: `[R_b]` prompt lengths (`batch.num_prompt`).
        positions: `[L]` absolute positions of the local tokens
            (`step(...).positions`).
        request_index: `[L]` request of each local token (`layout.request_index`).
        num_tokens: 0-d local token count; rows past it are 0.

    For a token at absolute position `x` of a request with an `n`-column
    table, prompt length `p` and delta `d`: `x < min(p, n)` -> column
    `x` of the table; `x >= p` (completion, and the PCP padding past the
    prompt) -> `x + d` in all three rows; otherwise (a table shorter than
    the prompt) -> the table's last column. A request without a table gets
    `x` in all three rows. `P = 2`, rank 0, requests `[5 (table m, d=100),
    2 (no table)]` at positions `[1, 3, 5 | 2, 4]` ->
    `[[m0_1, m0_3, 105, 2, 4], [m1_1, m1_3, 105, 2, 4], [m2_1, m2_3, 105, 2, 4]]`.

    Raises:
        TypeError, ValueError (static types and shapes only): `positions` and
            `request_index` not `[L]` integers, tables of another request count.
            `request_index` values in `[0, R_b)` are the caller's contract
            (device data, never read on the host; `layout.request_index` holds it).
    """
    if tables.positions.dim() != 3 or tables.positions.shape[1] != 3:
        raise ValueError(f"tables.positions must be [R, 3, M], got {tuple(tables.positions.shape)}")
    _check_local_tokens(positions, request_index)
    if tables.length.shape != num_prompt.shape:
        raise ValueError(
            f"tables hold {tables.length.shape[0]} request rows but num_prompt has "
            f"{tuple(num_prompt.shape)}; pack the tables with num_rows = the batch's request rows"
        )
    M = tables.positions.shape[2]
    x = positions.to(torch.int64)
    req = request_index.to(torch.int64)
    cols = tables.length[req]
    prompt = num_prompt.to(torch.int64)[req]
    in_prompt = x < torch.minimum(prompt, cols)
    col = torch.where(in_prompt, x, cols - 1).clamp(0, M - 1)  # past the table: its last column
    gathered = tables.positions.transpose(0, 1)[:, req, col]  # [3, L]
    value = torch.where(x >= prompt, x + tables.delta[req], gathered)
    value = torch.where(cols > 0, value, x)
    row = torch.arange(x.shape[0], device=x.device)
    return torch.where(row < num_tokens, value, 0)


# ---------------------------------------------------------------------------------------------
# Prompt embeds (device)
# ---------------------------------------------------------------------------------------------


@pytree_dataclass
class PromptEmbeds:
    """Every request's prompt embeds back to back in one `[E, H]` buffer (`R_b` request rows).

    Attributes:
        values: `[E, H]` the requests' embeds, request `i`'s at rows
            `start[i] : start[i] + length[i]`.
        start: `[R_b]` int64 first row of each request.
        length: `[R_b]` int64 rows of each request (0: no prompt embeds).
    """

    values: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor


def pack_prompt_embeds(
    embeds: Mapping[int, torch.Tensor] | Sequence[torch.Tensor | None],
    num_rows: int,
    hidden_size: int,
    capacity: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> PromptEmbeds:
    """Host boundary: pack `{request index: [E_i, H] embeds}` into a `[capacity, H]` buffer.

    `embeds` is the runner's `input_batch.req_prompt_embeds` (a dict by
    request index) or a list with `None` for requests without embeds.
    `capacity` is static (e.g. `max_num_reqs * max_model_len` or a bucket).

        pack_prompt_embeds({1: e1}, num_rows=2, hidden_size=H, capacity=8)
        # values[:len(e1)] = e1, start [0, 0], length [0, len(e1)]

    Raises:
        ValueError: a request index outside `[0, num_rows)`, embeds that are
            not 2-D, embeds of the wrong width (not `hidden_size`), `meta`
            embeds (no values to pack), mixed dtypes, more rows than `capacity`,
            a `[capacity, hidden_size]` buffer larger than this machine's memory
            (checked before it is allocated), or a `device` this machine does not have.
    """
    check_int("num_rows", num_rows, 1)
    check_int("hidden_size", hidden_size, 1)
    check_int("capacity", capacity, 1)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    check_device("device", dev)
    items = embeds.items() if isinstance(embeds, Mapping) else enumerate(embeds)
    items = list((i, e) for i, e in items if e is not None)
    for i, _ in items:
        check_int("prompt embeds request index", i, 0)
    items = sorted((int(i), e) for i, e in items)
    for i, e in items:
        if not 0 <= i < num_rows:
            raise ValueError(f"prompt embeds for request {i}, outside num_rows={num_rows}")
        if not isinstance(e, torch.Tensor) or e.dim() != 2:
            raise ValueError(f"prompt embeds of request {i} must be a 2-D tensor [E, H]")
        check_not_meta(f"embeds[{i}]", e)
        if e.shape[1] != hidden_size:
            raise ValueError(
                f"prompt embeds of request {i} have width {e.shape[1]}; the hidden size is {hidden_size}"
            )
    dtypes = {e.dtype for _, e in items}
    if dtype is None:
        if len(dtypes) > 1:
            raise ValueError(f"prompt embeds mix dtypes {sorted(map(str, dtypes))}; pass dtype=")
        dtype = dtypes.pop() if dtypes else torch.float32
    total = sum(e.shape[0] for _, e in items)
    if total > capacity:
        raise ValueError(f"prompt embeds hold {total} rows; capacity is {capacity}")
    check_host_buffer(
        "capacity",
        capacity * hidden_size * dtype.itemsize,
        f"a [capacity={capacity}, hidden_size={hidden_size}] {dtype} buffer",
    )
    values = torch.zeros(capacity, hidden_size, dtype=dtype)
    start = torch.zeros(num_rows, dtype=torch.int64)
    length = torch.zeros(num_rows, dtype=torch.int64)
    row = 0
    for i, e in items:
        values[row : row + e.shape[0]] = e.detach().to("cpu", dtype)
        start[i], length[i] = row, e.shape[0]
        row += e.shape[0]
    index = torch.cat([start, length]).to(dev)
    return PromptEmbeds(values=values.to(dev), start=index[:num_rows], length=index[num_rows:])


def gather_prompt_embeds(
    embeds: PromptEmbeds,
    positions: torch.Tensor,
    request_index: torch.Tensor,
    num_tokens: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """`[L, H]`: `out` with the rank's prompt embeds filled in (`fill_prompt_embeds_for_pcp`).

    A local token at absolute position `x` of request `i` takes
    `embeds` row `x` of request `i` when `x < length[i]`; every other
    row (no embeds, past the embeds, padding rows) keeps `out`'s value, as
    vllm-ascend leaves its buffer untouched there. `P = 2`, rank 0, one
    request with 6 embed rows `e` at positions `[0, 1, 6, 7]` ->
    `[e[0], e[1], out[2], out[3]]`. A masked gather: no boolean indexing.

    Raises:
        TypeError, ValueError (static types and shapes only): `positions` and
            `request_index` not `[L]` integers, `out` not `[L, H]` with the
            embeds' width and dtype. `request_index` values in `[0, R_b)`
            (`R_b`: the packed request rows) are the caller's contract: they are
            device data, never read on the host (`layout.request_index` holds it).
    """
    _check_local_tokens(positions, request_index)
    L = positions.shape[0]
    if out.dim() != 2 or out.shape[0] != L:
        raise ValueError(f"out must be [L={L}, H], got {tuple(out.shape)}")
    if out.shape[1] != embeds.values.shape[1]:
        raise ValueError(
            f"prompt embeds have width {embeds.values.shape[1]} but out has width {out.shape[1]}"
        )
    if out.dtype != embeds.values.dtype:
        raise ValueError(f"prompt embeds are {embeds.values.dtype} but out is {out.dtype}")
    x = positions.to(torch.int64)
    req = request_index.to(torch.int64)
    row = torch.arange(L, device=x.device)
    take = (row < num_tokens) & (x < embeds.length[req])
    return masked_gather(embeds.values, embeds.start[req] + x, take[:, None], out)


# ---------------------------------------------------------------------------------------------
# Host helpers on the scheduler's objects
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LocalScheduleLayout:
    """This rank's scheduled token counts (vllm-ascend `cache_local_schedule_layout` /
    `get_local_schedule_layout`, as a value instead of manager state).

    Attributes:
        num_scheduled_tokens: `[num_reqs]` read-only copy of the local counts
            (`layout.pcp_tokens`), or `None`.
        total_num_scheduled_tokens: their sum (the local token count), or `None`.
    """

    num_scheduled_tokens: np.ndarray | None
    total_num_scheduled_tokens: int | None


def local_schedule_layout(
    num_scheduled_tokens: np.ndarray | Sequence[int], num_reqs: int, total_num_scheduled_tokens: int
) -> LocalScheduleLayout:
    """Snapshot the rank's local schedule: `([1, 4, 4, x], 3, 9)` -> counts `[1, 4, 4]`, total 9."""
    counts = np.array(num_scheduled_tokens[:num_reqs], copy=True)
    counts.setflags(write=False)
    return LocalScheduleLayout(counts, int(total_num_scheduled_tokens))


def _embed_mask(pos_info: Any) -> np.ndarray | None:
    is_embed = pos_info.is_embed
    if is_embed is None:
        return None
    if isinstance(is_embed, torch.Tensor):
        return is_embed.detach().cpu().numpy().astype(bool)
    return np.asarray(is_embed, dtype=bool)


def _feature_hits(req_positions: np.ndarray, pos_info: Any) -> tuple[np.ndarray, np.ndarray]:
    """Local token indices inside a feature's window and their offsets in the feature."""
    lo = pos_info.offset
    inside = np.flatnonzero((req_positions >= lo) & (req_positions < lo + pos_info.length))
    return inside, req_positions[inside] - lo


def _local_counts(
    req_ids: Sequence[str], positions: np.ndarray, local_num_scheduled_tokens: np.ndarray | Sequence[int]
) -> np.ndarray:
    """The host checks of the local counts: 1-D integers >= 0 (int64 copy), at least one per
    request, and no more tokens than `positions` holds."""
    counts = host_ints("local_num_scheduled_tokens", local_num_scheduled_tokens)
    if counts.shape[0] < len(req_ids):
        raise ValueError(
            f"local_num_scheduled_tokens has {counts.shape[0]} entries for {len(req_ids)} requests"
        )
    used = int(counts[: len(req_ids)].sum())
    if len(positions) < used:
        raise ValueError(
            f"positions has {len(positions)} entries; local_num_scheduled_tokens gives the requests {used}"
        )
    return counts


def build_local_mm_schedule(
    req_ids: Sequence[str],
    requests: Mapping[str, Any],
    positions: np.ndarray,
    local_num_scheduled_tokens: np.ndarray,
    encoder_cache: Mapping[str, Any],
) -> tuple[dict[str, list[int]], set[str]]:
    """Which encoder inputs this rank needs (vllm-ascend `build_local_mm_schedule`).

    `positions` are the rank's absolute token positions, request after
    request (`local_num_scheduled_tokens[i]` each). A multimodal feature is
    needed when one of the rank's tokens falls in its window (and, with an
    `is_embed` mask, on an embedding slot). Returns `({req_id: [feature
    indices not in encoder_cache]}, {hashes of every needed feature})`.
    `P = 2`, rank 1 of a 16-token prompt holds positions `4..11`: an image
    at offsets `12..15` is not needed here, one at `8..9` is.

    Raises:
        ValueError: a negative local count, or fewer `positions` than the counts add up to.
    """
    counts = _local_counts(req_ids, positions, local_num_scheduled_tokens)
    scheduled: dict[str, list[int]] = {}
    needed: set[str] = set()
    start = 0
    for req_id, count in zip(req_ids, counts):
        k = int(count)
        if k == 0:
            continue
        req_positions = np.asarray(positions[start : start + k])
        missing = []
        for idx, feature in enumerate(requests[req_id].mm_features):
            inside, rel = _feature_hits(req_positions, feature.mm_position)
            is_embed = _embed_mask(feature.mm_position)
            if is_embed is not None:
                rel = rel[is_embed[rel]]
            if rel.size == 0:
                continue
            needed.add(feature.identifier)
            if feature.identifier not in encoder_cache:
                missing.append(idx)
        if missing:
            scheduled[req_id] = missing
        start += k
    return scheduled, needed


@dataclasses.dataclass(frozen=True)
class LocalMMEmbeddings:
    """What [`gather_mm_embeddings`][pcp_fn.multimodal.gather_mm_embeddings] returns.

    Attributes:
        embeds: the multimodal embedding rows this rank's tokens use, in the
            order its `is_mm_embed` mask lists them.
        is_mm_embed: `[num_local_tokens]` bool, tokens that take a
            multimodal embedding.
        should_sync_mrope_positions: as vllm-ascend's.
        should_sync_xdrope_positions: as vllm-ascend's.
        mrope_updates: `{req_id: (new mrope_positions, new delta)}` from the
            model's `recompute_mrope_positions` (multimodal pruning); the
            caller applies them (vllm-ascend writes them into the request state).
    """

    embeds: list[torch.Tensor]
    is_mm_embed: torch.Tensor
    should_sync_mrope_positions: bool
    should_sync_xdrope_positions: bool
    mrope_updates: dict[str, tuple[torch.Tensor, Any]]


def gather_mm_embeddings(
    req_ids: Sequence[str],
    requests: Mapping[str, Any],
    positions: np.ndarray,
    local_num_scheduled_tokens: np.ndarray,
    shift_computed_tokens: int,
    encoder_cache: Mapping[str, torch.Tensor],
    model: Any = None,
    is_multimodal_pruning_enabled: bool = False,
    uses_mrope: bool = False,
    warning_once: Callable[..., Any] | None = None,
) -> LocalMMEmbeddings:
    """The encoder outputs this rank's tokens consume (vllm-ascend `gather_mm_embeddings_for_pcp`).

    For each request, the rank's tokens (at `positions + shift_computed_tokens`)
    that fall in a feature's window (on an `is_embed` slot, if the feature
    has a mask) take the matching encoder-output row (the `k`-th embedding
    slot of the feature is row `k`). Overlapping features: the first one
    wins. Because a rank's positions are not monotonic (head chunk, then tail
    chunk), a request's rows are put in local token order. `P = 2`, rank 0
    of a fresh 8-token prompt holds positions `[0, 1, 6, 7]`; an image at
    `6..7` gives `embeds [enc[0:2]]`, `is_mm_embed [F, F, T, T]`.

    Raises:
        ValueError: fewer local counts than requests, a negative local count
            (`TypeError`: not integers), fewer `positions` than the counts add
            up to, or an encoder output missing from `encoder_cache` (vllm-ascend asserts).
    """
    counts = _local_counts(req_ids, positions, local_num_scheduled_tokens)
    is_mm_embed = torch.zeros(int(counts.sum()), dtype=torch.bool)
    embeds: list[torch.Tensor] = []
    updates: dict[str, tuple[torch.Tensor, Any]] = {}
    sync_mrope = False
    start = 0
    for req_id, count in zip(req_ids, counts):
        k = int(count)
        req_positions = np.asarray(positions[start : start + k]) + shift_computed_tokens
        req = requests[req_id]
        pieces: list[torch.Tensor] = []
        piece_rows: list[np.ndarray] = []
        for rows, piece in _feature_embeds(req_id, req.mm_features, req_positions, encoder_cache):
            pieces.append(piece)
            piece_rows.append(rows)
            is_mm_embed[start + torch.from_numpy(rows)] = True
        if is_multimodal_pruning_enabled and uses_mrope:
            if req.mrope_positions is None:
                raise ValueError(f"request {req_id} has no mrope_positions to recompute")
            sync_mrope = True
            pieces, new_positions, new_delta = model.recompute_mrope_positions(
                input_ids=req.prompt_token_ids,
                multimodal_embeddings=pieces,
                mrope_positions=req.mrope_positions,
                num_computed_tokens=req.num_computed_tokens,
            )
            updates[req_id] = (new_positions, new_delta)
        if len(pieces) > 1:
            pieces = _in_local_order(pieces, piece_rows, warning_once)
        embeds.extend(pieces)
        start += k
    return LocalMMEmbeddings(embeds, is_mm_embed, sync_mrope, False, updates)


def _feature_embeds(
    req_id: str, features: Sequence[Any], req_positions: np.ndarray, encoder_cache: Mapping[str, torch.Tensor]
) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
    """`(rows [k_f] int64, embeddings [k_f, ...])` of each feature a request's local tokens
    (at `req_positions`) take, in feature order: a token in the feature's window, on an
    `is_embed` slot if the feature has a mask, takes the encoder output's row of its embedding
    slot, unless an earlier feature gave it one; `rows` are the tokens' indices in
    `req_positions`.

    Raises:
        ValueError: a feature's encoder output is not in `encoder_cache`.
    """
    owner = np.zeros(req_positions.shape[0], dtype=bool)  # a local token already given a row
    for feature in features:
        inside, rel = _feature_hits(req_positions, feature.mm_position)
        if inside.size == 0:
            continue
        is_embed = _embed_mask(feature.mm_position)
        if is_embed is None:
            source = rel
        else:
            keep = is_embed[rel]
            if not keep.any():
                continue
            inside, rel = inside[keep], rel[keep]
            source = np.cumsum(is_embed, dtype=np.int64)[rel] - 1  # embedding slot of each offset
        fresh = ~owner[inside]
        if not fresh.any():
            continue
        inside, source = inside[fresh], source[fresh]
        owner[inside] = True
        encoded = encoder_cache.get(feature.identifier)
        if encoded is None:
            raise ValueError(f"encoder cache miss for {feature.identifier} (request {req_id})")
        index = torch.as_tensor(source, dtype=torch.int64, device=encoded.device)
        yield inside.astype(np.int64), encoded.index_select(0, index)


def _in_local_order(
    pieces: list[torch.Tensor], piece_rows: list[np.ndarray], warning_once: Callable[..., Any] | None
) -> list[torch.Tensor]:
    """A request's embedding pieces (feature order) as one tensor in local token order, the
    order its `is_mm_embed` rows list them (`piece_rows`: each piece's local rows). When
    the rows and the embeddings differ in number (the model's multimodal pruning), the pieces
    stay as they are, with vllm-ascend's warning."""
    num_rows = sum(r.size for r in piece_rows)
    num_embeds = sum(p.shape[0] for p in pieces)
    if num_rows == num_embeds and num_rows > 0:
        order = np.argsort(np.concatenate(piece_rows), kind="stable")
        joined = torch.cat(pieces)
        return [joined.index_select(0, torch.from_numpy(order).to(joined.device))]
    if warning_once is not None:
        warning_once(
            "PCP MM reorder skipped due to size mismatch: local_idx=%d, embed_rows=%d",
            num_rows,
            num_embeds,
        )
    return pieces


def localize_scheduler_output(
    scheduler_output: Any,
    req_ids: Sequence[str],
    requests: Mapping[str, Any],
    positions: np.ndarray,
    local_num_scheduled_tokens: np.ndarray | None,
    local_total_num_scheduled_tokens: int | None,
    encoder_cache: Mapping[str, Any],
) -> Any:
    """The scheduler output as this rank sees it for multimodal preprocessing.

    vllm-ascend's `maybe_localize_scheduler_output_for_mm_preprocess` rewrites
    the caller's object and `restore_scheduler_output_after_mm_preprocess`
    puts it back; this returns a NEW shallow copy with the local fields
    instead (or the same object when nothing differs) and never mutates the
    input, so there is nothing to restore. The copy has: the local token total;
    `num_scheduled_tokens` with the local counts; `scheduled_encoder_inputs`
    from [`build_local_mm_schedule`][pcp_fn.multimodal.build_local_mm_schedule]; and `free_encoder_mm_hashes`
    without any hash an active request still references or this rank needs.
    `P = 2`, a 16-token prefill scheduled whole: rank 0's copy has
    `total_num_scheduled_tokens = 8` and `num_scheduled_tokens {r: 8}`.
    """
    differs = (
        local_total_num_scheduled_tokens is not None
        and local_total_num_scheduled_tokens != scheduler_output.total_num_scheduled_tokens
    )
    if not differs and local_num_scheduled_tokens is not None:
        for req_id, count in zip(req_ids, local_num_scheduled_tokens):
            scheduled = scheduler_output.num_scheduled_tokens.get(req_id)
            if scheduled is None or int(scheduled) != int(count):
                differs = True
                break
    if not differs:
        return scheduler_output

    changes: dict[str, Any] = {}
    if local_total_num_scheduled_tokens is not None:
        changes["total_num_scheduled_tokens"] = local_total_num_scheduled_tokens
    if local_num_scheduled_tokens is not None:
        counts = dict(scheduler_output.num_scheduled_tokens)
        counts.update((r, int(k)) for r, k in zip(req_ids, local_num_scheduled_tokens))
        encoder_inputs, needed = build_local_mm_schedule(
            req_ids, requests, positions, local_num_scheduled_tokens, encoder_cache
        )
        # Under PCP the global free list can run ahead of this rank: keep every hash still in use.
        keep = needed | {f.identifier for req in requests.values() for f in req.mm_features}
        changes["num_scheduled_tokens"] = counts
        changes["scheduled_encoder_inputs"] = encoder_inputs
        changes["free_encoder_mm_hashes"] = [
            h for h in scheduler_output.free_encoder_mm_hashes if h not in keep
        ]
    local = copy.copy(scheduler_output)
    for name, value in changes.items():
        object.__setattr__(local, name, value)
    return local
