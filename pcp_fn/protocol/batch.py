"""The host boundary: `make_batch` turns the scheduler's arrays into a `SchedulerBatch`.

This is the one place that reads values on the host. It validates the
scheduler's per-request arrays, computes the number of local tokens per rank
(O(R) integer arithmetic on arrays the host already has, like vLLM's
`get_num_tokens_for_dispatch`), picks the smallest bucket that holds the
batch, packs the arrays (padded to the bucket's request rows) and the slot
mapping (padded to its token rows) into ONE host buffer and moves it to the
device in ONE copy: on a GPU or NPU a non-blocking copy from a pinned buffer
that no earlier copy still reads ([`pcp_fn.core.staging`][]). Every check is
vectorised (a handful of numpy reductions over the arrays); the loops that
name a bad entry run only once a check has failed. Per-token work all happens
on the device.

    >>> cfg = PCPConfig(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=32)
    >>> b = make_batch(cfg, [1, 5, 8], [7, 0, 0], [3, 5, 8])
    >>> b.bucket                       # 3 requests, 1 + 4 + 4 = 9 local tokens
    Bucket(num_reqs=4, num_tokens=16)
    >>> b.num_scheduled.tolist()       # padded with empty requests
    [1, 5, 8, 0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np
import torch

from ..core.buckets import Bucket
from ..core.checks import ArrayLike, check_sequence_ends, host_int_rows
from ..core.pytree import pytree_dataclass, static_field
from ..core.staging import host_buffer, to_device
from .config import PCPConfig
from .registry import LayoutError

A = TypeVar("A", np.ndarray, torch.Tensor)


@pytree_dataclass
class SchedulerBatch:
    """One step's scheduler inputs, padded to `bucket.num_reqs` rows (`R_b`).

    Fields are int32 unless said otherwise.

    Attributes:
        config: static [`PCPConfig`][pcp_fn.PCPConfig] the batch was validated for, with
            the ranks zeroed (`config.shared`: one batch serves every rank);
            an op given a state of another config raises.
        bucket: static [`Bucket`][pcp_fn.Bucket]; every output shape derives from it.
        num_reqs: 0-d, real requests (rows past it are empty requests).
        num_scheduled: `[R_b]` tokens scheduled this step (before the split).
        num_computed: `[R_b]` tokens already in the KV cache.
        num_prompt: `[R_b]` prompt lengths.
        slot_mapping: `[F_b]` int64 KV slots of the scheduled tokens in
            scheduler order, `pad_slot_id` past them (`F_b`:
            [`token_rows`][pcp_fn.spec.token_rows]); `None` when `make_batch` was given none.
    """

    config: PCPConfig = static_field()
    bucket: Bucket = static_field()
    num_reqs: torch.Tensor
    num_scheduled: torch.Tensor
    num_computed: torch.Tensor
    num_prompt: torch.Tensor
    slot_mapping: torch.Tensor | None = None


def token_rows(config: PCPConfig, bucket: Bucket) -> int:
    """`F_b`: scheduler-order (pre-split) token rows of a bucket, `min(T, P * L_b)`.

    Every rank holds at least `1/P` of each request's tokens in its `L_b`
    rows, so a batch of the bucket has at most `P * L_b` (and `T`) tokens.
    """
    return min(config.max_num_tokens, config.pcp_size * bucket.num_tokens)


def check_token_input(
    name: str, values: torch.Tensor, config: PCPConfig, bucket: Bucket, device: torch.device | None = None
) -> None:
    """A per-token input in scheduler order must be `[F_b]`, padded on the host
    (`make_batch(..., slot_mapping=...)`), never truncated or extended inside an op; a KV slot
    mapping, so int32 or int64 (a float or a bool would pass through the gather silently, a
    narrower integer could not hold `pad_slot_id`), on `device` (the state's or the batch's)
    when given. Static checks (type, dtype, shape, device): capturable."""
    rows = token_rows(config, bucket)
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(values).__name__}")
    if values.dim() != 1 or values.shape[0] != rows:
        raise ValueError(
            f"{name} must have the bucket's {rows} scheduler-order token rows, 1-D ([F_b], F_b = "
            f"min(max_num_tokens, pcp_size * {bucket.num_tokens})), got shape {tuple(values.shape)}; pad it "
            "on the host (make_batch(..., slot_mapping=...))"
        )
    dtype = values.dtype
    if dtype is not torch.int64 and dtype is not torch.int32:  # (identity: a third of `in`'s cost)
        raise TypeError(f"{name} must be an int64 or int32 tensor of KV slots, got {dtype}")
    if device is not None and values.device != device:
        raise ValueError(f"{name} is on {values.device}, the batch's tensors on {device}")


def _host_slots(values: ArrayLike, num_tokens: int) -> np.ndarray:
    """The scheduler's slot mapping as a 1-D integer array of `num_tokens` entries (checked)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    arr = values if type(values) is np.ndarray else np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"slot_mapping must be 1-D (one slot per scheduled token), got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"slot_mapping must hold integers, got dtype {arr.dtype}")
    if arr.shape[0] != num_tokens:
        raise ValueError(
            f"slot_mapping has {arr.shape[0]} entries; the batch schedules {num_tokens} tokens "
            "(one slot each)"
        )
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.uint64(2**63 - 1):
        raise ValueError(f"slot_mapping holds {int(arr.max())}, past the int64 limit")
    return arr


class DecodeRule(Protocol):
    """What decides a decode: a [`PCPConfig`][pcp_fn.PCPConfig], or an engine's settings with the same two."""

    @property
    def decode_threshold(self) -> int: ...  # most scheduled tokens of a decode: 1 + num_spec_tokens

    @property
    def pd_decode_recompute(self) -> bool: ...  # num_computed == num_prompt - 1 also counts as done


def classify_decodes(config: DecodeRule, num_scheduled: A, num_computed: A, num_prompt: A) -> A:
    """Decode requests: context, at most `decode_threshold` scheduled tokens, prompt done.

    vllm-ascend `classify_decode_request_mask`. Works on numpy arrays (the
    host boundary, the host twins) and on tensors (inside ops) alike; empty padding
    rows (no context) are prefills.
    """
    # context (computed > 0) and prompt done (computed >= prompt, or >= prompt - 1 with the
    # recompute scheduler): computed >= max(prompt [- 1], 1), one comparison
    done_at = num_prompt - 1 if config.pd_decode_recompute else num_prompt
    if isinstance(done_at, np.ndarray):
        done_at = np.maximum(done_at, 1)
    else:
        done_at = done_at.clip(min=1)
    return (num_computed >= done_at) & (num_scheduled <= config.decode_threshold)


def make_batch(
    config: PCPConfig,
    num_scheduled_tokens: ArrayLike,
    num_computed_tokens: ArrayLike,
    num_prompt_tokens: ArrayLike,
    device: torch.device | str | None = None,
    *,
    slot_mapping: ArrayLike | None = None,
    bucket: Bucket | None = None,
) -> SchedulerBatch:
    """Validate the scheduler's per-request arrays and build a device batch.

    Args:
        num_scheduled_tokens: tokens scheduled this step, one entry per request, decodes first
            (the runner's order).
        num_computed_tokens: tokens already computed (the context), one entry per request, in
            the same order.
        num_prompt_tokens: prompt length, one entry per request, in the same order.
        device: where the batch lives (default CPU).
        slot_mapping: optional `[sum(num_scheduled_tokens)]` KV slots in
            scheduler order; carried padded to `[F_b]` (`pad_slot_id`).
        bucket: force this bucket (it must hold the batch); default the
            smallest configured one.

    Raises:
        ValueError: arrays of different lengths or not 1-D integers, a negative
            count, more than `max_num_reqs` requests, more than
            `max_num_tokens` tokens, a decode after a prefill, or a `bucket`
            too small. The message names the field and the limit.
    """
    counts = (num_scheduled_tokens, num_computed_tokens, num_prompt_tokens)
    return build_batch(config, _COUNTS, counts, device, slot_mapping, bucket)[0]


def build_batch(
    config: PCPConfig,
    names: tuple[str, ...],
    counts: tuple[ArrayLike, ...],
    device: torch.device | str | None = None,
    slot_mapping: ArrayLike | None = None,
    bucket: Bucket | None = None,
    check: Callable[[np.ndarray, int], None] | None = None,
) -> tuple[SchedulerBatch, list[torch.Tensor]]:
    """[`make_batch`][pcp_fn.make_batch] of `counts` (scheduled, computed, prompt, then any extra rows).

    A boundary built on `make_batch` (the spec-decode one) sends more per-request counts with
    the batch in its one copy: `counts[3:]` (named by `names[3:]`; `names[:3]` name the
    three counts) are checked with the three in one pass (1-D integers in `[0, INT32_MAX]`, the
    batch's length) and come back as one `[R_b]` int32 device tensor each, zero past
    `num_reqs`. `check(rows, bound)` runs once every `make_batch` check passed, before
    anything is copied (`rows`: `[len(counts), n]` int64, `bound` >= every entry, from
    [`pcp_fn.core.checks.host_int_rows`][]): the boundary's own checks.
    """
    if not isinstance(config, PCPConfig):
        raise TypeError(f"config must be a PCPConfig, got {type(config).__name__}")
    arrays, rows, bound = host_int_rows(names, counts)
    sched, comp, prompt = arrays[:3]  # each holds values in [0, INT32_MAX]: arithmetic below cannot wrap
    num_reqs = rows.shape[1]
    check_sequence_ends(rows, bound, "the sequence length of request {i}")
    if num_reqs > config.max_num_reqs:
        raise ValueError(f"the batch has {num_reqs} requests; max_num_reqs is {config.max_num_reqs}")
    total = int(np.add.reduce(sched))
    if total > config.max_num_tokens:
        raise ValueError(
            f"num_scheduled_tokens sums to {total} tokens; max_num_tokens is {config.max_num_tokens}"
        )
    is_decode = classify_decodes(config, sched, comp, prompt)
    num_decodes = np.count_nonzero(is_decode)
    # decodes must be a prefix (trivially so when every request, or none, is a decode)
    if 0 < num_decodes < num_reqs and np.count_nonzero(is_decode[:num_decodes]) != num_decodes:
        raise _decode_after_prefill(config, is_decode, sched, comp, prompt)
    # the config's layout bounds the rows a rank holds (pcp_fn.Layout.num_local_tokens)
    num_local = config.layout_impl.num_local_tokens(config, rows[0], num_decodes, rows[1])
    # the host's check of the layout's bound: an int, >= ceil(total / P), <= L (check_local_bound)
    if type(num_local) is not int or num_local * config.pcp_size < total or num_local > config.L:
        num_local = check_local_bound(config, num_local, total)
    if bucket is None:
        bucket = config.bucket_for(num_reqs, num_local)
    else:
        _check_bucket(config, bucket, num_reqs, num_local)
    slots = None if slot_mapping is None else _host_slots(slot_mapping, total)
    if check is not None:
        check(rows, bound)
    if device is not None:
        device = torch.device(device)
    slot_part, sched_d, comp_d, prompt_d, extra_d, reqs_d = _stage(config, bucket, rows, slots, device)
    batch = _new(SchedulerBatch)  # its fields are checked above: no __init__ to repeat them
    fields = batch.__dict__
    fields["config"] = config.shared
    fields["bucket"] = bucket
    fields["num_reqs"] = reqs_d
    fields["num_scheduled"] = sched_d
    fields["num_computed"] = comp_d
    fields["num_prompt"] = prompt_d
    fields["slot_mapping"] = slot_part
    return batch, extra_d


def check_local_bound(config: PCPConfig, num_local: object, total: int) -> int:
    """The layout's `num_local_tokens` for a valid batch of `total` tokens, as an int: an
    integer, at least `ceil(total / P)` (the ranks hold every token between them, so one holds
    that many) and at most the local capacity `L` (the protocol's promise for a valid batch).

    What the host can check of the layout's bound without the device: that it is at least every
    rank's rows is [`pcp_fn.testing.check_layout`][]'s capacity rule (a bound one short cuts
    a run, and a token, at the bucket's end).
    """
    name = config.layout_name
    if isinstance(num_local, bool) or not isinstance(num_local, int | np.integer):
        raise TypeError(
            f"layout {name!r}: num_local_tokens must return an int, got "
            f"{type(num_local).__name__} {num_local!r}"
        )
    num_local, P = int(num_local), config.pcp_size
    least = -(-total // P)
    if num_local < least:
        raise LayoutError(
            f"layout {name!r}: num_local_tokens says {num_local} local rows for a batch of {total} tokens, "
            f"but the {P} ranks hold every token between them, so one holds at least "
            f"ceil({total} / {P}) = {least} (pcp_fn.Layout.num_local_tokens bounds every rank's rows)",
            "capacity",
        )
    if num_local > config.max_local_tokens:
        raise LayoutError(
            f"layout {name!r}: num_local_tokens says {num_local} local rows for a batch within "
            f"max_num_reqs and max_num_tokens, past the local capacity L={config.max_local_tokens} "
            "that every valid batch must fit (pcp_fn.Layout.num_local_tokens)",
            "capacity",
        )
    return num_local


def _decode_after_prefill(
    config: PCPConfig, is_decode: np.ndarray, sched: np.ndarray, comp: np.ndarray, prompt: np.ndarray
) -> ValueError:
    """The error naming the first decode that comes after a prefill (`is_decode [n]` is not a
    prefix; decodes come first in the runner's order)."""
    first = int(np.argmin(is_decode))
    late = first + int(np.argmax(is_decode[first:]))
    return ValueError(
        f"request {late} is a decode (num_computed_tokens={comp[late]}, "
        f"num_scheduled_tokens={sched[late]} <= decode_threshold={config.decode_threshold}, "
        f"num_prompt_tokens={prompt[late]}) but comes after prefill request {first}; "
        "decodes must come first"
    )


def _check_bucket(config: PCPConfig, bucket: Bucket, num_reqs: int, num_local: int) -> None:
    """A forced `bucket` holds the batch's requests and `num_local` local tokens, within the
    config's capacity."""
    if not isinstance(bucket, Bucket):
        raise TypeError(f"bucket must be a Bucket, got {type(bucket).__name__}")
    if bucket.num_reqs < num_reqs or bucket.num_reqs > config.max_num_reqs:
        raise ValueError(
            f"bucket.num_reqs={bucket.num_reqs} must hold the batch's {num_reqs} requests "
            f"and not exceed max_num_reqs={config.max_num_reqs}"
        )
    if bucket.num_tokens < num_local or bucket.num_tokens > config.max_local_tokens:
        raise ValueError(
            f"bucket.num_tokens={bucket.num_tokens} must hold the batch's {num_local} local tokens "
            f"and not exceed the local capacity L={config.max_local_tokens}"
        )


def _stage(
    config: PCPConfig, bucket: Bucket, rows: np.ndarray, slots: np.ndarray | None, device: torch.device | None
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Pack `rows` (`[C, n]`, padded to `[C, R_b]`) and the `slots` (padded to `[F_b]`
    with `pad_slot_id`) into one host buffer and move it to `device` (default CPU) in one
    copy. Returns views of it: the `[F_b]` int64 slots (or `None`), the three `[R_b]`
    int32 counts, the extra rows, and the 0-d `num_reqs`.
    """
    C, num_reqs = rows.shape
    # One host buffer, one copy: [F_b int64 slots (as int32 pairs) | 3 R_b int32 counts | the extra
    # rows, R_b each | num_reqs]
    Rb = bucket.num_reqs
    F = 0 if slots is None else token_rows(config, bucket)
    on_cpu = device is None or device.type == "cpu"  # (a torch.device attribute read costs ~0.3 us)
    size = 2 * F + C * Rb + 1
    host = np.empty(size, np.int32) if on_cpu else host_buffer(size, np.int32, device)
    if slots is not None:
        padded = host[: 2 * F].view(np.int64)
        padded[: slots.shape[0]] = slots
        padded[slots.shape[0] :] = config.pad_slot_id
    per_request = host[2 * F : 2 * F + C * Rb].reshape(C, Rb)
    per_request[:, :num_reqs] = rows
    if num_reqs < Rb:
        per_request[:, num_reqs:] = 0
    host[-1] = num_reqs
    if on_cpu:  # the tensors are views of the fresh host buffer
        from_numpy = torch.from_numpy
        return (
            None if slots is None else from_numpy(padded),
            from_numpy(per_request[0]),
            from_numpy(per_request[1]),
            from_numpy(per_request[2]),
            [from_numpy(per_request[i]) for i in range(3, C)] if C > 3 else [],
            from_numpy(host[-1:].reshape(())),
        )
    # one copy, then views of the device buffer
    slot_part, sched_d, comp_d, prompt_d, *extra_d, reqs_d = to_device(host, device).split_with_sizes(
        [2 * F, *[Rb] * C, 1]
    )
    return (
        None if slots is None else slot_part.view(torch.int64),
        sched_d,
        comp_d,
        prompt_d,
        extra_d,
        reqs_d.view(()),
    )


def batch_is_decode(config: PCPConfig, batch: SchedulerBatch) -> torch.Tensor:
    """`[R_b]` bool decode requests of `batch` (vllm-ascend `classify_decode_request_mask`)."""
    return classify_decodes(config, batch.num_scheduled, batch.num_computed, batch.num_prompt)


_new = object.__new__
_COUNTS = ("num_scheduled_tokens", "num_computed_tokens", "num_prompt_tokens")
