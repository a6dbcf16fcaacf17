"""The host boundary of the MRV2 layout: `make_batch`, `num_tokens_for_dispatch` and the bucket checks.

The only place that reads values on the host. It validates the scheduler's
per-request arrays, counts every rank's local tokens and segments (O(P * R)
integer arithmetic on arrays the host already has, vLLM's
`PCPManager.get_num_tokens_for_dispatch`), picks or checks the graph bucket,
pads the per-token arrays to the bucket's `F_b` global token rows and moves
everything to the device in one copy (from a pinned staging buffer on a GPU or
NPU, [`pcp_fn.core.staging`][]). Per-token work all happens on the device,
except the default positions (`num_computed + offset`).

    >>> cfg = MRV2Config(pcp_size=2, pcp_rank=0, max_num_reqs=4, max_num_tokens=16)
    >>> num_tokens_for_dispatch(cfg, [3, 8], [False, True])   # decode 3 + prefill 8 -> 3 + 4
    7
    >>> b = make_batch(cfg, [3, 8], [16, 0], [4, 8])
    >>> b.bucket                                              # rank 0: decode, head, tail
    Bucket(num_reqs=4, num_tokens=8)
    >>> token_rows(cfg, b.bucket), b.input_ids.shape          # F_b = min(T, P * Lp)
    (16, torch.Size([16]))
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..core.buckets import Bucket
from ..core.checks import (
    INT32_MAX,
    ArrayLike,
    check_same_length,
    check_sequence_ends,
    host_bools,
    host_int_rows,
    host_ints,
)
from ..core.packing import PackedRequests
from ..core.pytree import pytree_dataclass, static_field
from ..core.staging import host_buffer, to_device
from . import host
from .config import MRV2Config
from .packing import REQUESTS


@pytree_dataclass
class GlobalBatch:
    """One step's global (scheduler-order) batch in fixed shapes.

    Fields (`R = max_num_reqs`, `F_b = token_rows(config, bucket)`; rows
    past the real requests / tokens are 0 / False):
        config: static [`MRV2Config`][pcp_fn.MRV2Config] the batch was validated for; an op
            given a state of another config raises `ValueError`.
        bucket: static [`pcp_fn.Bucket`][] `(local request rows, local
            tokens per rank)` the local batch is padded to.
        num_reqs: 0-d int32, real requests.
        num_scheduled: `[R]` int32 tokens scheduled this step.
        num_computed: `[R]` int32 tokens already computed (host cursor).
        prefill_len: `[R]` int32 prompt (prefill) length.
        is_prefilling: `[R]` bool, the request still prefills.
        idx_mapping: `[R]` int32 persistent request-state index of each row.
        input_ids: `[F_b]` int32 token ids in scheduler order (vLLM's
            `input_ids` buffers are int32).
        positions: `[F_b]` int64 absolute positions (the device cursor).
    """

    config: MRV2Config = static_field()
    bucket: Bucket = static_field()
    num_reqs: torch.Tensor
    num_scheduled: torch.Tensor
    num_computed: torch.Tensor
    prefill_len: torch.Tensor
    is_prefilling: torch.Tensor
    idx_mapping: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor


def token_rows(config: MRV2Config, bucket: Bucket) -> int:
    """`F_b`: global (scheduler-order) token rows of a bucket, `min(T, P * Lp)`.

    Every global token is written by exactly one rank's copy, so a batch whose
    ranks each hold at most `Lp` tokens has at most `P * Lp` (and `T`)
    tokens. `P = 2`, `T = 16`: `Bucket(4, 4)` -> 8, `Bucket(4, 16)` -> 16.
    The global inputs (`GlobalBatch.input_ids`, the slot mappings of
    [`pcp_fn.mrv2.gathered_slot_mappings`][], the drafter's ids of
    [`pcp_fn.mrv2.prepare_draft_prefill`][]) and the restored hidden states
    have this many rows.
    """
    return min(config.max_num_tokens, config.pcp_size * bucket.num_tokens)


def rank_counts(
    config: MRV2Config,
    num_scheduled: np.ndarray,
    is_prefilling: np.ndarray,
    num_computed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`([P], [P])`: local tokens and local segments (request rows) of every rank.

    The host twin of the device layout ([`pcp_fn.mrv2.host.local_segments`][], vLLM
    `PCPManager._iter_rank_chunks` for every rank). `P = 2`, scheduled
    `[3, 8]`, request 1 prefilling: the decode is replicated (3 tokens on each
    rank), the prefill is cut in 4 chunks of 2, rank 0 takes chunks 0 and 3, rank 1
    chunks 1 and 2: tokens `[7, 7]`, segments `[3, 3]`. `num_computed` `[R]`: read by a
    split that [`reads_context`][pcp_fn.mrv2.splits.PrefillSplit] (required then).
    """
    return host.counts(config, num_scheduled, is_prefilling, num_computed)


def num_tokens_for_dispatch(
    config: MRV2Config,
    num_scheduled_tokens: ArrayLike,
    is_prefilling: ArrayLike,
    num_computed_tokens: ArrayLike | None = None,
) -> int:
    """The largest real rank-local batch, before graph padding.

    vLLM `PCPManager.get_num_tokens_for_dispatch`.

    `P = 2`: `[8]` prefill -> 4; `[7]` prefill -> 4; `[3]` decode -> 3;
    `[3, 8]` decode + prefill -> 7. `P = 4`, `[2, 9]` -> 5 (replicated
    decodes) or 4 (sharded: rank 0 takes the decode, rank 3 has 3 tokens).

    A split that [`reads_context`][pcp_fn.mrv2.splits.PrefillSplit] without
    `num_computed_tokens` (vLLM's runner passes none): the most any context can put on a rank.
    """
    _check_config(config)
    sched = host_ints("num_scheduled_tokens", num_scheduled_tokens)
    prefilling = host_bools("is_prefilling", is_prefilling)
    computed = None
    if num_computed_tokens is not None:
        computed = host_ints("num_computed_tokens", num_computed_tokens)
        check_same_length(num_scheduled_tokens=sched, num_computed_tokens=computed)
    check_same_length(num_scheduled_tokens=sched, is_prefilling=prefilling)
    if not sched.size:
        return 0
    return host.largest_rank(config, sched, prefilling, int(sched.sum()), computed)[0]


def check_bucket(config: MRV2Config, bucket: Bucket, num_local_tokens: int, num_local_reqs: int) -> None:
    """vLLM's capture validations (`PCPManager._build_batch_layout`,
    `_resolve_num_reqs_after_padding`), as `ValueError`\\ s.

    Args:
        num_local_tokens: the largest rank-local batch (`num_tokens_for_dispatch`).
        num_local_reqs: the most local request rows of any rank (at least 1:
            a rank without tokens keeps one placeholder row, like vLLM).

    A mixed prefill + decode batch is allowed in every bucket that holds it
    (vLLM only lets decode-only batches into FULL graphs). `P = 2`, three
    replicated one-token decodes (3 tokens and 3 rows on each rank):
    `Bucket(4, 2)` raises "... smaller than the largest rank-local batch: 2 < 3";
    `Bucket(2, 4)` raises "... request capacity must cover the rank-local batch".

    Raises:
        TypeError: `bucket` is not a [`pcp_fn.Bucket`][].
    """
    if not isinstance(bucket, Bucket):
        raise TypeError(f"bucket must be a pcp_fn.Bucket, got {type(bucket).__name__}")
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


def _check_config(config: object) -> None:
    if not isinstance(config, MRV2Config):
        raise TypeError(f"config must be an MRV2Config, got {type(config).__name__}")


def _token_array(
    name: str,
    values: ArrayLike,
    total: int,
    T: int,
    rows: int,
    dtypes: tuple[torch.dtype, ...],
    maximum: int,
    device: torch.device,
) -> tuple[np.ndarray | None, torch.Tensor | None]:
    """Validate a per-token array of `total <= n <= T` entries.

    Host data (lists, numpy arrays, CPU tensors) is read and checked value by
    value (`[0, maximum]`) and returned as int64 numpy, its first `rows` entries; a tensor on
    another device is never read: its dtype must be one of `dtypes` (no cast
    that could wrap a value), and it is returned as a `[rows]` device tensor.
    Only padding entries (past `total <= rows`) are cut or added.
    """
    shape = tuple(values.shape) if isinstance(values, torch.Tensor) else np.shape(values)
    if len(shape) != 1:
        raise ValueError(f"{name} must be 1-D (one entry per scheduled token), got shape {shape}")
    n = shape[0]
    if not total <= n <= T:
        raise ValueError(
            f"{name} has {n} entries; it must cover the {total} scheduled tokens "
            f"and not exceed max_num_tokens={T}"
        )
    if isinstance(values, torch.Tensor) and values.device.type not in ("cpu", "meta"):
        if values.dtype not in dtypes:
            raise TypeError(
                f"{name} is a {values.dtype} {values.device.type} tensor; it must be "
                f"{' or '.join(map(str, dtypes))} (a device tensor is not read on the host, so a "
                "narrowing cast could wrap values silently); pass host data to have it checked"
            )
        out = values[:rows].to(device=device, dtype=dtypes[0])
        return None, torch.nn.functional.pad(out, (0, rows - out.shape[0]))
    return host_ints(name, values, maximum=maximum)[:rows], None


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
    """Validate the global batch, pick or check its bucket, and build a
    [`GlobalBatch`][pcp_fn.mrv2.GlobalBatch].

    Args:
        num_scheduled_tokens: tokens scheduled this step, one entry per request, in the
            scheduler's order (any mix of decodes and prefills).
        num_computed_tokens: tokens already computed, one entry per request, in the same order.
        prefill_len: each request's prefill length (vLLM's), in the same order.
        is_prefilling: default `num_computed < prefill_len` (vLLM's
            `is_prefilling_np`).
        idx_mapping: persistent request-state index per request; default
            `arange`.
        input_ids: a per-token array covering at least the scheduled tokens, at most `T`
            entries; carried as `[F_b]` ([`token_rows`][pcp_fn.mrv2.token_rows]): zeros added,
            or padding entries past `F_b` dropped. Host data (lists, numpy, CPU tensors) is
            checked value by value: ids must fit int32 (vLLM's `input_ids` buffers are int32).
            A tensor on another device is never read: it must then be int32. Default: zeros.
        positions: a per-token array like `input_ids`, carried the same way. Host data is
            checked value by value: positions must be below `2**31 - 1` (the int32 `seq_lens`
            are `position + 1`). A tensor on another device is never read: it must then be
            int64 or int32. Default: `num_computed + offset inside the request`.
        bucket: the graph bucket `(local request rows, local tokens per
            rank)`; default the smallest configured one holding every rank.
        device: where the batch lives (default CPU). Everything the host
            supplies is packed into one buffer and moved in one copy (on a GPU
            or NPU, one non-blocking copy from a pinned staging buffer that is
            not refilled while the copy may still read it); every leaf of the
            batch is a view of the device buffer (a captured graph refreshes
            it with one copy).

    Raises:
        TypeError: `config` not an [`MRV2Config`][pcp_fn.MRV2Config], `bucket` not a
            [`pcp_fn.Bucket`][], non-integer arrays (non-bool
            `is_prefilling`), or a device `input_ids` not int32.
        ValueError: arrays of different lengths, not 1-D, negative or past
            int32 (an `input_ids` entry past int32 names its index);
            `num_computed_tokens + num_scheduled_tokens` (a sequence length,
            vLLM's `seq_lens_cpu_upper_bound`) past int32; more than
            `max_num_reqs` requests or `max_num_tokens` tokens; a token
            array too short or too long; a bucket smaller than the largest
            rank-local batch ("smaller than the largest rank-local batch"), a
            request capacity below the local requests of a rank, or a bucket
            beyond the capacities.
    """
    if type(config) is not MRV2Config:
        _check_config(config)
    counts = (num_scheduled_tokens, num_computed_tokens, prefill_len)
    if idx_mapping is None:
        names = _COUNTS
    else:
        names, counts = _COUNTS_AND_MAPPING, (*counts, idx_mapping)
    rows, sched, pf, total = _check_counts(config, names, counts, is_prefilling)
    bucket = _local_bucket(config, bucket, sched, pf, total, rows[1])
    dev = _CPU if device is None else torch.device(device)
    tokens = _token_inputs(config, bucket, input_ids, positions, total, dev)
    return _global_batch(config, bucket, _pack(config, rows, pf, tokens, dev), tokens, dev)


def _check_counts(
    config: MRV2Config, names: tuple[str, ...], counts: tuple[ArrayLike, ...], is_prefilling: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The per-request arrays (`counts` named by `names`, and `is_prefilling`) checked: one
    length, integers in int32, sequence ends in int32, within `max_num_reqs` requests and
    `max_num_tokens` tokens. Returns `([k, n] int64 rows of counts, its [n] scheduled row,
    [n] bool is_prefilling (default `num_computed < prefill_len`), the scheduled tokens)`."""
    arrays, rows, bound = host_int_rows(names, counts)  # [k, n] int64, each in [0, bound <= INT32_MAX]
    num_reqs = rows.shape[1]
    if is_prefilling is not None:
        pf = host_bools("is_prefilling", is_prefilling)
        if pf.shape[0] != num_reqs:
            check_same_length(**dict(zip(names, arrays)), is_prefilling=pf)
    check_sequence_ends(rows, bound, "request {i}'s sequence length, vLLM's seq_lens_cpu_upper_bound")
    R, T = config.max_num_reqs, config.max_num_tokens
    if num_reqs > R:
        raise ValueError(f"the batch has {num_reqs} requests; max_num_reqs is {R}")
    sched = rows[0]
    total = int(np.add.reduce(sched))
    if total > T:
        raise ValueError(f"num_scheduled_tokens sums to {total} tokens; max_num_tokens is {T}")
    if is_prefilling is None:
        pf = rows[1] < rows[2]
    return rows, sched, pf, total


def _local_bucket(
    config: MRV2Config,
    bucket: Bucket | None,
    sched: np.ndarray,
    pf: np.ndarray,
    total: int,
    computed: np.ndarray,
) -> Bucket:
    """The graph bucket of the largest rank-local batch (vLLM `get_num_tokens_for_dispatch`) of
    `sched [n]` scheduled tokens (`total` in all), `pf [n]` prefilling: the smallest
    configured one, or `bucket` checked ([`check_bucket`][pcp_fn.mrv2.check_bucket])."""
    if config.shard_decode_requests or np.count_nonzero(pf):
        need_tokens, need_reqs = host.largest_rank(config, sched, pf, total, computed)
    else:  # no prefill, replicated: every rank holds every non-empty request
        need_tokens, need_reqs = total, np.count_nonzero(sched)
    need_reqs = max(need_reqs, 1)  # a rank without tokens keeps a placeholder row
    if bucket is None:
        return config.bucket_for(need_reqs, need_tokens)
    check_bucket(config, bucket, need_tokens, need_reqs)
    return bucket


# What make_batch's steps hand on, as plain tuples: a NamedTuple costs ~0.15 us to build, on a
# path that runs every step.
# _token_inputs: (F_b = token_rows(config, bucket), the scheduled tokens, then ids and positions,
# each as host int64 numpy (at most F_b entries) and as an [F_b] tensor on another device, None
# where not given or given on the other side)
_TokenInputs = tuple[int, int, np.ndarray | None, torch.Tensor | None, np.ndarray | None, torch.Tensor | None]
# _pack: (the int32 words moved in one copy, then views of them: [F_b] int64 positions, the
# per-request rows and num_reqs of mrv2.packing.REQUESTS, [F_b] int32 input ids, [R] bool
# is_prefilling; a part a device tensor supplies is empty)
_HostWords = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _token_inputs(
    config: MRV2Config,
    bucket: Bucket,
    input_ids: ArrayLike | None,
    positions: ArrayLike | None,
    total: int,
    dev: torch.device,
) -> _TokenInputs:
    """`input_ids` (int32 values) and `positions` (below `INT32_MAX`), each covering the
    `total` scheduled tokens, carried as the bucket's `F_b` rows (`_TokenInputs`)."""
    T = config.max_num_tokens
    F = min(T, config.pcp_size * bucket.num_tokens)  # token_rows(config, bucket)
    ids, dev_ids = (None, None)
    if input_ids is not None:
        ids, dev_ids = _token_array("input_ids", input_ids, total, T, F, (torch.int32,), INT32_MAX, dev)
    pos, dev_pos = (None, None)
    if positions is not None:
        pos, dev_pos = _token_array(
            "positions", positions, total, T, F, (torch.int64, torch.int32), INT32_MAX - 1, dev
        )
    return F, total, ids, dev_ids, pos, dev_pos


def _pack(
    config: MRV2Config, rows: np.ndarray, pf: np.ndarray, tokens: _TokenInputs, dev: torch.device
) -> _HostWords:
    """Everything the host supplies in one buffer (pinned and rotated off the CPU,
    [`pcp_fn.core.staging.host_buffer`][]), zero past the real requests and tokens; the
    positions default to `num_computed + offset inside the request`, the ids to 0. Returns the
    buffer and its parts (`_HostWords`)."""
    R = config.max_num_reqs
    F, total, ids, dev_ids, pos, dev_pos = tokens
    num_reqs = rows.shape[1]
    # [F int64 positions | the per-request rows and num_reqs (mrv2.packing.REQUESTS) | F input ids |
    # R bools is_prefilling]; the parts a device tensor supplies are left out.
    pos_words = 0 if dev_pos is not None else 2 * F
    ids_words = 0 if dev_ids is not None else F
    ids_at = pos_words + REQUESTS.size(R)
    flags_at = ids_at + ids_words
    words = host_buffer(flags_at + (R + 3) // 4, np.int32, dev)
    host_pos = words[:pos_words].view(np.int64)
    if dev_pos is None:
        if pos is not None:
            _fill_padded(host_pos, pos)
        else:
            _default_positions(host_pos, rows, int(rows[0].max()) if num_reqs else 0, total)
    per_request = words[pos_words:ids_at]
    mapping = rows[3] if rows.shape[0] > 3 else _arange(R)[:num_reqs]
    REQUESTS.pack(per_request, R, num_reqs, (rows[0], rows[1], rows[2], pf, mapping), (num_reqs,))
    host_ids = words[ids_at:flags_at]
    if dev_ids is None:
        if ids is not None:
            _fill_padded(host_ids, ids)
        else:
            host_ids.fill(0)
    flags = words[flags_at:].view(np.bool_)[:R]
    flags[:num_reqs] = pf
    flags[num_reqs:] = False
    return words, host_pos, per_request, host_ids, flags


def _fill_padded(out: np.ndarray, values: np.ndarray) -> None:
    """`out [F_b]`: `values` then zeros."""
    out[: values.shape[0]] = values
    out[values.shape[0] :] = 0


def _global_batch(
    config: MRV2Config, bucket: Bucket, buf: _HostWords, tokens: _TokenInputs, dev: torch.device
) -> GlobalBatch:
    """The [`GlobalBatch`][pcp_fn.mrv2.GlobalBatch] over `buf` moved to `dev` in one copy (staged
    through pinned memory off the CPU): every leaf a view of the device buffer, or the device tensor
    given."""
    R = config.max_num_reqs
    words, host_pos, per_request, host_ids, flags = buf
    _, _, _, dev_ids, _, dev_pos = tokens
    if dev.type == "cpu":  # the tensors are views of the fresh host buffer
        from_numpy = torch.from_numpy
        views = REQUESTS.unpack(from_numpy(per_request), R)
        sched_d, comp_d, plen_d = views["num_scheduled"], views["num_computed"], views["prefill_len"]
        mapping_d, reqs_d = views["idx_mapping"], views["num_reqs"]
        flags_d = from_numpy(flags)
        if dev_pos is None:
            dev_pos = from_numpy(host_pos)
        if dev_ids is None:
            dev_ids = from_numpy(host_ids)
    else:  # one copy, then views of the device buffer
        parts = to_device(words, dev).split_with_sizes(
            [2 * host_pos.shape[0], *REQUESTS.sizes(R), host_ids.shape[0], (R + 3) // 4]
        )
        pos_part, sched_d, comp_d, plen_d, _, mapping_d, reqs_d, ids_part, flags_part = parts
        reqs_d, flags_d = reqs_d.view(()), flags_part.view(torch.bool)[:R]
        if dev_pos is None:
            dev_pos = pos_part.view(torch.int64)
        if dev_ids is None:
            dev_ids = ids_part
    batch = _new(GlobalBatch)  # validated by make_batch: no dataclass __init__ to repeat the work
    fields = batch.__dict__
    fields["config"] = config
    fields["bucket"] = bucket
    fields["num_reqs"] = reqs_d
    fields["num_scheduled"] = sched_d
    fields["num_computed"] = comp_d
    fields["prefill_len"] = plen_d
    fields["is_prefilling"] = flags_d
    fields["idx_mapping"] = mapping_d
    fields["input_ids"] = dev_ids
    fields["positions"] = dev_pos
    return batch


def _default_positions(out: np.ndarray, rows: np.ndarray, most: int, total: int) -> None:
    """`out [F]` int64: `num_computed + offset inside the request` for the `total` tokens, then 0."""
    sched, comp = rows[0], rows[1]
    if most <= 1 and total == sched.shape[0]:  # one token a request: its position is num_computed
        out[:total] = comp
    elif total:  # token t of the request starting at token s: num_computed + t - s
        shift = comp + sched
        shift -= sched.cumsum()
        np.add(shift.repeat(sched), _arange(total), out=out[:total])
    out[total:] = 0


_ARANGES: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    """A shared read-only `np.arange(n)` int64 (callers slice it)."""
    got = _ARANGES.get(n)
    if got is None:
        got = _ARANGES[n] = np.arange(n, dtype=np.int64)
        got.flags.writeable = False
    return got


_new = object.__new__
_CPU = torch.device("cpu")
_COUNTS = ("num_scheduled_tokens", "num_computed_tokens", "prefill_len")
_COUNTS_AND_MAPPING = (*_COUNTS, "idx_mapping")


def unpack_batch(
    config: MRV2Config,
    bucket: Bucket,
    packed: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    layout: PackedRequests = REQUESTS,
) -> GlobalBatch:
    """The [`GlobalBatch`][pcp_fn.mrv2.GlobalBatch] over a buffer packed in `layout`
    ([`REQUESTS`][pcp_fn.mrv2.REQUESTS], what [`make_batch`][pcp_fn.mrv2.make_batch] copies, or one
    with more scalars after its own): views, no copy; `input_ids [F]` int32, `positions [F]`. What a
    captured adapter staging its own buffer calls inside its graph."""
    views = layout.unpack(packed, config.max_num_reqs)
    return GlobalBatch(
        config=config,
        bucket=bucket,
        num_reqs=views["num_reqs"],
        num_scheduled=views["num_scheduled"],
        num_computed=views["num_computed"],
        prefill_len=views["prefill_len"],
        is_prefilling=views["is_prefilling"].bool(),
        idx_mapping=views["idx_mapping"],
        input_ids=input_ids,
        positions=positions,
    )


def check_global_batch(config: MRV2Config, batch: object, name: str = "global_batch") -> None:
    """`batch` is a [`GlobalBatch`][pcp_fn.mrv2.GlobalBatch] of `config`, its bucket within
    capacity, its leaves of the shapes `make_batch` gives (checked on static shapes only: nothing is
    read).

    Raises:
        TypeError: not a [`GlobalBatch`][pcp_fn.mrv2.GlobalBatch].
        ValueError: built for another config (the differing fields are named),
            a bucket past the capacities, or a leaf of the wrong rows.
    """
    if not isinstance(batch, GlobalBatch):
        raise TypeError(f"{name} must be an mrv2.GlobalBatch, got {type(batch).__name__}")
    if batch.config != config:
        diff = [
            f"{f.name} ({getattr(batch.config, f.name)!r} vs {getattr(config, f.name)!r})"
            for f in dataclasses.fields(MRV2Config)
            if getattr(batch.config, f.name) != getattr(config, f.name)
        ]
        raise ValueError(
            f"{name} was built for another MRV2Config than the state's: it differs in "
            f"{', '.join(diff) or 'its type'}; build the batch with the state's config"
        )
    if not config.capacity.holds(batch.bucket):
        raise ValueError(
            f"{name}.bucket {batch.bucket} exceeds the capacity {config.capacity} "
            "(2 * max_num_reqs local request rows, max_num_tokens local tokens per rank)"
        )
    R, F = config.max_num_reqs, token_rows(config, batch.bucket)
    for field, rows in (
        ("num_scheduled", R),
        ("num_computed", R),
        ("prefill_len", R),
        ("is_prefilling", R),
        ("idx_mapping", R),
        ("input_ids", F),
        ("positions", F),
    ):
        shape = tuple(getattr(batch, field).shape)
        if shape != (rows,):
            raise ValueError(f"{name}.{field} must be [{rows}], got shape {shape}; build it with make_batch")
