"""The host boundary: ``make_batch`` turns the scheduler's arrays into a ``SchedulerBatch``.

This is the one place that reads values on the host. It validates the
scheduler's per-request arrays, computes the number of local tokens per rank
(O(R) integer arithmetic on arrays the host already has, like vLLM's
``get_num_tokens_for_dispatch``), picks the smallest bucket that holds the
batch, pads the arrays to the bucket's request rows and moves them to the
device in ONE host-to-device copy. Per-token work all happens on the device.

    >>> cfg = PCPConfig(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=32)
    >>> b = make_batch(cfg, [1, 5, 8], [7, 0, 0], [3, 5, 8])
    >>> b.bucket                       # 3 requests, 1 + 4 + 4 = 9 local tokens
    Bucket(num_reqs=4, num_tokens=16)
    >>> b.num_scheduled.tolist()       # padded with empty requests
    [1, 5, 8, 0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .config import Bucket, PCPConfig
from .pytree import pytree_dataclass, static_field

_INT32_MAX = np.iinfo(np.int32).max


@pytree_dataclass
class SchedulerBatch:
    """One step's scheduler inputs, padded to ``bucket.num_reqs`` rows (``R_b``).

    Fields (int32 unless said otherwise):
        bucket: static :class:`Bucket`; every output shape derives from it.
        num_reqs: 0-d, real requests (rows past it are empty requests).
        num_scheduled: ``[R_b]`` tokens scheduled this step (before the split).
        num_computed: ``[R_b]`` tokens already in the KV cache.
        num_prompt: ``[R_b]`` prompt lengths.
    """

    bucket: Bucket = static_field()
    num_reqs: torch.Tensor
    num_scheduled: torch.Tensor
    num_computed: torch.Tensor
    num_prompt: torch.Tensor


ArrayLike = Sequence[int] | np.ndarray | torch.Tensor


def _as_host_ints(name: str, values: ArrayLike) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per request), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(arr < 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name}[{i}] = {arr[i]} is negative; counts must be >= 0")
    big = np.flatnonzero(arr > _INT32_MAX)
    if big.size:
        i = int(big[0])
        raise ValueError(f"{name}[{i}] = {arr[i]} exceeds the int32 limit {_INT32_MAX}")
    return arr


def classify_decodes(
    config: PCPConfig,
    num_scheduled: np.ndarray,
    num_computed: np.ndarray,
    num_prompt: np.ndarray,
) -> np.ndarray:
    """Host twin of the device classification: decode = has context, at most
    ``decode_threshold`` scheduled tokens, and the prompt done."""
    done = num_computed >= num_prompt
    if config.pd_decode_recompute:
        done |= num_computed == num_prompt - 1
    return (num_computed > 0) & (num_scheduled <= config.decode_threshold) & done


def local_token_counts(config: PCPConfig, num_scheduled: np.ndarray, is_decode: np.ndarray) -> np.ndarray:
    """Tokens each request puts on every rank (the same on all ranks).

    Decodes are replicated (``n``); prefills are padded to ``2P`` and each rank
    takes two chunks (``2 * ceil(n / 2P)``); with ``P == 1`` nothing changes.

    The hybrid layout uses the same count: its FA layers work on these DCS
    rows, and its linear rows (``ceil(n / P) <= 2 * ceil(n / 2P)`` per prefill
    on the fullest rank) never need more, so one bucket holds both.
    """
    m = config.pad_multiple
    split = -(-num_scheduled // m) * m // config.pcp_size
    return np.where(is_decode | (config.pcp_size == 1), num_scheduled, split)


def make_batch(
    config: PCPConfig,
    num_scheduled_tokens: ArrayLike,
    num_computed_tokens: ArrayLike,
    num_prompt_tokens: ArrayLike,
    device: torch.device | str | None = None,
    *,
    bucket: Bucket | None = None,
) -> SchedulerBatch:
    """Validate the scheduler's per-request arrays and build a device batch.

    Args:
        num_scheduled_tokens, num_computed_tokens, num_prompt_tokens: one entry
            per request, decodes first (the runner's order).
        device: where the batch lives (default CPU).
        bucket: force this bucket (it must hold the batch); default the
            smallest configured one.

    Raises:
        ValueError: arrays of different lengths or not 1-D integers, a negative
            count, more than ``max_num_reqs`` requests, more than
            ``max_num_tokens`` tokens, a decode after a prefill, or a ``bucket``
            too small. The message names the field and the limit.
    """
    sched = _as_host_ints("num_scheduled_tokens", num_scheduled_tokens)
    comp = _as_host_ints("num_computed_tokens", num_computed_tokens)
    prompt = _as_host_ints("num_prompt_tokens", num_prompt_tokens)
    if not (sched.size == comp.size == prompt.size):
        raise ValueError(
            "per-request arrays differ in length: "
            f"num_scheduled_tokens has {sched.size}, num_computed_tokens has {comp.size}, "
            f"num_prompt_tokens has {prompt.size}"
        )
    num_reqs = sched.size
    if num_reqs > config.max_num_reqs:
        raise ValueError(f"the batch has {num_reqs} requests; max_num_reqs is {config.max_num_reqs}")
    total = int(sched.sum())
    if total > config.max_num_tokens:
        raise ValueError(
            f"num_scheduled_tokens sums to {total} tokens; max_num_tokens is {config.max_num_tokens}"
        )
    is_decode = classify_decodes(config, sched, comp, prompt)
    prefills = np.flatnonzero(~is_decode)
    if prefills.size and is_decode[prefills[0] :].any():
        late = prefills[0] + int(np.flatnonzero(is_decode[prefills[0] :])[0])
        raise ValueError(
            f"request {late} is a decode (num_computed_tokens={comp[late]}, "
            f"num_scheduled_tokens={sched[late]} <= decode_threshold={config.decode_threshold}, "
            f"num_prompt_tokens={prompt[late]}) but comes after prefill request {prefills[0]}; "
            "decodes must come first"
        )
    num_local = int(local_token_counts(config, sched, is_decode).sum())
    if bucket is None:
        bucket = config.bucket_for(num_reqs, num_local)
    else:
        if not isinstance(bucket, Bucket):
            raise ValueError(f"bucket must be a Bucket, got {type(bucket).__name__}")
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

    Rb = bucket.num_reqs
    host = np.zeros(3 * Rb + 1, dtype=np.int32)
    host[0:num_reqs] = sched
    host[Rb : Rb + num_reqs] = comp
    host[2 * Rb : 2 * Rb + num_reqs] = prompt
    host[3 * Rb] = num_reqs
    dev = torch.from_numpy(host).to(torch.device(device) if device is not None else "cpu")  # the one copy
    return SchedulerBatch(
        bucket=bucket,
        num_reqs=dev[3 * Rb],
        num_scheduled=dev[0:Rb],
        num_computed=dev[Rb : 2 * Rb],
        num_prompt=dev[2 * Rb : 3 * Rb],
    )
