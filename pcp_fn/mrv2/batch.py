"""The host boundary of the MRV2 layout: ``make_batch``, ``num_tokens_for_dispatch`` and the bucket checks.

The only place that reads values on the host. It validates the scheduler's
per-request arrays, counts every rank's local tokens and segments (O(P * R)
integer arithmetic on arrays the host already has, the seed's
``get_num_tokens_for_dispatch``), picks or checks the graph bucket, and moves
the arrays to the device. Per-token work all happens on the device.

    >>> cfg = MRV2Config(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=16)
    >>> num_tokens_for_dispatch(cfg, [3, 8], [False, True])   # decode 3 + prefill 8 -> 3 + 4
    7
    >>> make_batch(cfg, [3, 8], [16, 0], [4, 8]).bucket       # rank 0: decode, head, tail
    Bucket(num_reqs=4, num_tokens=8)
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..batch import ArrayLike, _as_host_ints
from ..config import Bucket
from ..pytree import pytree_dataclass, static_field
from . import host
from .config import MRV2Config


@pytree_dataclass
class GlobalBatch:
    """One step's global (scheduler-order) batch in fixed shapes.

    Fields (``R = max_num_reqs``, ``T = max_num_tokens``; rows past the real
    requests / tokens are 0 / False):
        bucket: static :class:`pcp_fn.Bucket` ``(local request rows, local
            tokens per rank)`` the local batch is padded to.
        num_reqs: 0-d int32, real requests.
        num_scheduled: ``[R]`` int32 tokens scheduled this step.
        num_computed: ``[R]`` int32 tokens already computed (host cursor).
        prefill_len: ``[R]`` int32 prompt (prefill) length.
        is_prefilling: ``[R]`` bool, the request still prefills.
        idx_mapping: ``[R]`` int32 persistent request-state index of each row.
        input_ids: ``[T]`` int32 token ids in scheduler order.
        positions: ``[T]`` int64 absolute positions (the device cursor).
    """

    bucket: Bucket = static_field()
    num_reqs: torch.Tensor
    num_scheduled: torch.Tensor
    num_computed: torch.Tensor
    prefill_len: torch.Tensor
    is_prefilling: torch.Tensor
    idx_mapping: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor


def _as_host_bools(name: str, values: ArrayLike) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per request), got shape {arr.shape}")
    if arr.size and arr.dtype != np.bool_:
        raise ValueError(f"{name} must hold bools, got dtype {arr.dtype}")
    return arr.astype(np.bool_)


def rank_counts(
    config: MRV2Config, num_scheduled: np.ndarray, is_prefilling: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``([P], [P])``: local tokens and local segments (request rows) of every rank.

    Host twin of the device layout (:mod:`pcp_fn.mrv2.host`). ``P = 2``, scheduled
    ``[3, 8]``, request 1 prefilling: the decode is replicated (3 tokens on each
    rank), the prefill is cut in 4 chunks of 2, rank 0 takes chunks 0 and 3, rank 1
    chunks 1 and 2: tokens ``[7, 7]``, segments ``[3, 3]``.
    """
    return host.counts(config, num_scheduled, is_prefilling)


def num_tokens_for_dispatch(
    config: MRV2Config, num_scheduled_tokens: ArrayLike, is_prefilling: ArrayLike
) -> int:
    """The largest real rank-local batch, before graph padding (seed ``get_num_tokens_for_dispatch``).

    ``P = 2``: ``[8]`` prefill -> 4; ``[7]`` prefill -> 4; ``[3]`` decode -> 3;
    ``[3, 8]`` decode + prefill -> 7. ``P = 4``, ``[2, 9]`` -> 5 (replicated
    decodes) or 4 (sharded: rank 0 takes the decode, rank 3 has 3 tokens).
    """
    sched = _as_host_ints("num_scheduled_tokens", num_scheduled_tokens)
    prefilling = _as_host_bools("is_prefilling", is_prefilling)
    if sched.size != prefilling.size:
        raise ValueError(
            f"num_scheduled_tokens has {sched.size} entries but is_prefilling has {prefilling.size}"
        )
    tokens, _ = rank_counts(config, sched, prefilling)
    return int(tokens.max()) if tokens.size else 0


def check_bucket(config: MRV2Config, bucket: Bucket, num_local_tokens: int, num_local_reqs: int) -> None:
    """The seed's capture validations, as ``ValueError``\\ s.

    Args:
        num_local_tokens: the largest rank-local batch (``num_tokens_for_dispatch``).
        num_local_reqs: the most local request rows of any rank (at least 1:
            a rank without tokens keeps one placeholder row, like the seed).

    A mixed prefill + decode batch is allowed in every bucket that holds it
    (the seed only lets decode-only batches into FULL graphs). ``P = 2``, three
    replicated one-token decodes (3 tokens and 3 rows on each rank):
    ``Bucket(4, 2)`` raises "... smaller than the largest rank-local batch: 2 < 3";
    ``Bucket(2, 4)`` raises "... request capacity must cover the rank-local batch".
    """
    if not isinstance(bucket, Bucket):
        raise ValueError(f"bucket must be a pcp_fn.Bucket, got {type(bucket).__name__}")
    if bucket.num_tokens < num_local_tokens:
        raise ValueError(
            "PCP padded token count is smaller than the largest rank-local batch: "
            f"{bucket.num_tokens} < {num_local_tokens} (bucket.num_tokens)."
        )
    if bucket.num_tokens > config.max_local_tokens:
        raise ValueError(
            f"bucket.num_tokens={bucket.num_tokens} exceeds the local token capacity "
            f"max_num_tokens={config.max_local_tokens}"
        )
    if bucket.num_reqs < num_local_reqs:
        raise ValueError(
            "PCP graph request capacity must cover the rank-local batch: "
            f"{bucket.num_reqs} < {num_local_reqs} (bucket.num_reqs, the FULL-graph request "
            "capacity, must hold the local requests of every rank)."
        )
    if bucket.num_reqs > config.max_local_reqs:
        raise ValueError(
            f"bucket.num_reqs={bucket.num_reqs} exceeds the local request capacity "
            f"2 * max_num_reqs = {config.max_local_reqs}"
        )


def _token_array(
    name: str, values: ArrayLike | None, total: int, T: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Validate a per-token array and pad it to ``[T]`` (device tensors are not read)."""
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be 1-D (one entry per token), got shape {tuple(values.shape)}")
        if values.dtype == torch.bool or values.is_floating_point() or values.is_complex():
            raise ValueError(f"{name} must hold integers, got dtype {values.dtype}")
        n = values.shape[0]
        out = values
    else:
        arr = _as_host_ints(name, values)
        n = arr.size
        out = torch.from_numpy(arr)
    if not total <= n <= T:
        raise ValueError(
            f"{name} has {n} entries; it must cover the {total} scheduled tokens "
            f"and not exceed max_num_tokens={T}"
        )
    return F.pad(out.to(device=device, dtype=dtype), (0, T - n))


def make_batch(
    config: MRV2Config,
    num_scheduled_tokens: ArrayLike,
    num_computed_tokens: ArrayLike,
    prefill_len: ArrayLike,
    *,
    is_prefilling: ArrayLike | None = None,
    idx_mapping: ArrayLike | None = None,
    input_ids: ArrayLike | None = None,
    positions: ArrayLike | None = None,
    bucket: Bucket | None = None,
    device: torch.device | str | None = None,
) -> GlobalBatch:
    """Validate the global batch, pick or check its bucket, and build a :class:`GlobalBatch`.

    Args:
        num_scheduled_tokens, num_computed_tokens, prefill_len: one entry per
            request, in the scheduler's order (any mix of decodes and prefills).
        is_prefilling: default ``num_computed < prefill_len`` (vLLM's
            ``is_prefilling_np``).
        idx_mapping: persistent request-state index per request; default
            ``arange``.
        input_ids, positions: per-token arrays covering at least the scheduled
            tokens, at most ``T`` entries (padded to ``T``). Device tensors are
            used as they are, never read on the host. Defaults: zeros, and
            ``num_computed + offset inside the request``.
        bucket: the graph bucket ``(local request rows, local tokens per
            rank)``; default the smallest configured one holding every rank.
        device: where the batch lives (default CPU).

    Raises:
        ValueError: arrays of different lengths, not 1-D, not integers (bools
            for ``is_prefilling``), negative; more than ``max_num_reqs`` requests
            or ``max_num_tokens`` tokens; a token array too short or too long;
            a bucket smaller than the largest rank-local batch ("smaller than
            the largest rank-local batch"), a request capacity below the local
            requests of a rank, or a bucket beyond the capacities.
    """
    sched = _as_host_ints("num_scheduled_tokens", num_scheduled_tokens)
    comp = _as_host_ints("num_computed_tokens", num_computed_tokens)
    plen = _as_host_ints("prefill_len", prefill_len)
    pf = None if is_prefilling is None else _as_host_bools("is_prefilling", is_prefilling)
    mapping = None if idx_mapping is None else _as_host_ints("idx_mapping", idx_mapping)
    sizes = {
        "num_scheduled_tokens": sched.size,
        "num_computed_tokens": comp.size,
        "prefill_len": plen.size,
        "is_prefilling": sched.size if pf is None else pf.size,
        "idx_mapping": sched.size if mapping is None else mapping.size,
    }
    if len(set(sizes.values())) != 1:
        raise ValueError(
            "per-request arrays differ in length: " + ", ".join(f"{k} has {v}" for k, v in sizes.items())
        )
    if pf is None:
        pf = comp < plen
    if mapping is None:
        mapping = np.arange(sched.size, dtype=np.int64)
    num_reqs = sched.size
    R, T = config.max_num_reqs, config.max_num_tokens
    if num_reqs > R:
        raise ValueError(f"the batch has {num_reqs} requests; max_num_reqs is {R}")
    total = int(sched.sum())
    if total > T:
        raise ValueError(f"num_scheduled_tokens sums to {total} tokens; max_num_tokens is {T}")

    tokens, segments = rank_counts(config, sched, pf)
    need_tokens = int(tokens.max()) if num_reqs else 0
    need_reqs = max(int(segments.max()) if num_reqs else 0, 1)
    if bucket is None:
        bucket = config.bucket_for(need_reqs, need_tokens)
    else:
        check_bucket(config, bucket, need_tokens, need_reqs)

    dev = torch.device(device) if device is not None else torch.device("cpu")
    host = np.zeros(5 * R + 1, dtype=np.int32)
    for k, arr in enumerate((sched, comp, plen, pf, mapping)):
        host[k * R : k * R + num_reqs] = arr
    host[5 * R] = num_reqs
    packed = torch.from_numpy(host).to(dev)  # the one copy of the per-request arrays
    ids = _token_array("input_ids", input_ids, total, T, torch.int32, dev)
    pos = _token_array("positions", positions, total, T, torch.int64, dev)
    if ids is None:
        ids = torch.zeros(T, dtype=torch.int32, device=dev)
    if pos is None:
        starts = np.cumsum(sched) - sched
        offset = np.arange(total) - np.repeat(starts, sched)
        host_pos = np.zeros(T, dtype=np.int64)
        host_pos[:total] = np.repeat(comp, sched) + offset
        pos = torch.from_numpy(host_pos).to(dev)
    return GlobalBatch(
        bucket=bucket,
        num_reqs=packed[5 * R],
        num_scheduled=packed[0:R],
        num_computed=packed[R : 2 * R],
        prefill_len=packed[2 * R : 3 * R],
        is_prefilling=packed[3 * R : 4 * R].bool(),
        idx_mapping=packed[4 * R : 5 * R],
        input_ids=ids,
        positions=pos,
    )
