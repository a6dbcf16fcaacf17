"""Spec-decode inputs at the host boundary, and the capacities of every spec-decode buffer.

`make_spec_batch` is `make_batch` plus the per-request draft counts: it
validates them (and, given the token table, that the table is wide enough),
and moves everything to the device in one copy (`make_batch`'s packed,
staged host buffer, with the draft counts beside the other per-request rows). Inside the ops nothing reads a
value; each buffer has a static capacity derived from `(config, bucket)`:

| name           | rows                        | why it holds every batch               |
|----------------|-----------------------------|----------------------------------------|
| `token_rows`   | `F_b = min(T, P * L_b)`     | scheduler-order tokens: a request puts |
|                |                             | `n <= P * local` rows in the gathered  |
|                |                             | buffer, so `sum(n) <= P * L_b`; and    |
|                |                             | `sum(n) <= T`                          |
| `sampled_rows` | `S_b = R_b * (1 + k)`       | `1 + drafts <= 1 + k` rows per request |
| `draft_rows`   | `D_b = R_b * k`             | `drafts <= k` per request              |
| `mtp_rows`     | `M_b = F_b + R_b * (k - 1)` | each request's tokens plus `k - 1` MTP |
|                |                             | extras (only when `k >= 2`)            |

(`k = num_spec_tokens`, `R_b`/`L_b` the bucket's request/local-token rows,
`P = pcp_size`, `T = max_num_tokens`.) At `P = 1`, `F_b = L_b`.

The ops take no size: they read the bucket of the state's last update
(`state.bucket`; `spec_step`: the batch's), and every per-request or
per-token input must have exactly its bucket rows ([`check_rows`][pcp_fn.spec.inputs.check_rows]: a
`ValueError` naming the argument and the rows, never a silent truncation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from ..core.buckets import Bucket
from ..core.checks import ArrayLike, host_int_rows, host_ints
from ..core.pytree import pytree_dataclass, static_field
from ..protocol.batch import SchedulerBatch, build_batch, token_rows
from ..protocol.config import PCPConfig
from ..protocol.layout import layout_of
from ..protocol.rows import RequestGeometry
from ..protocol.state import PCPState


def sampled_rows(config: PCPConfig, bucket: Bucket) -> int:
    """`S_b`: sampled-token rows (draft tokens plus one bonus per request), `R_b * (1 + k)`."""
    return bucket.num_reqs * (1 + config.num_spec_tokens)


def draft_rows(config: PCPConfig, bucket: Bucket) -> int:
    """`D_b`: draft-token rows, `R_b * k`."""
    return bucket.num_reqs * config.num_spec_tokens


def mtp_extra_tokens(config: PCPConfig) -> int:
    """MTP slots each request gets past its scheduled tokens: `decode_threshold - 2` (`k - 1`), >= 0."""
    return max(config.decode_threshold - 2, 0)


def mtp_rows(config: PCPConfig, bucket: Bucket) -> int:
    """`M_b`: MTP draft-slot rows, `F_b + R_b * (k - 1)`."""
    return token_rows(config, bucket) + bucket.num_reqs * mtp_extra_tokens(config)


@pytree_dataclass
class SpecInputs:
    """The scheduler's spec-decode inputs of one step, padded to the bucket's `R_b` rows.

    Attributes:
        num_draft_tokens: `[R_b]` int32 draft tokens of each request (the
            runner's `num_draft_tokens`: `len(scheduled_spec_decode_tokens)`);
            0 past `num_reqs`.
        token_ids_shape: static `(rows, width)` of the token table
            [`make_spec_batch`][pcp_fn.make_spec_batch] checked the batch against (every request's
            `num_computed + num_scheduled` fits its width), or `None` when it
            was given none. [`pcp_fn.spec.spec_step`][pcp_fn.spec_step] refuses a table with
            fewer rows or columns. A static field: one per token-table shape (a
            runner's table is one fixed buffer), so it costs no graph per step.
    """

    num_draft_tokens: torch.Tensor
    token_ids_shape: tuple[int, int] | None = static_field(default=None)


def check_rows(name: str, tensor: object, rows: int, what: str, *, integer: bool = False) -> None:
    """An op's input must be `[rows, ...]`, the bucket's `what` rows: never truncated or extended.
    `integer`: a count or an index, an integer dtype (a float would pass through the integer
    arithmetic silently)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if tensor.dim() < 1 or tensor.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows ({what}), got shape {tuple(tensor.shape)}")
    if integer and (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool):
        raise TypeError(f"{name} must hold integers, got {tensor.dtype}")


def real_requests(state: PCPState) -> torch.Tensor:
    """`[R_b]` bool: the rows of the state's bucket that are requests of its last update."""
    return torch.arange(state.bucket.num_reqs, device=state.device) < state.num_reqs


class StateView(NamedTuple):
    """What every spec op reads of the state's last update, built once per op (`spec_step`: once,
    from its own step's geometry) rather than once per map it derives."""

    geo: RequestGeometry  # the request geometry at the bucket's R_b rows (one scan: every start)
    real: torch.Tensor  # [R_b] bool, rows that are requests of the last update


def state_view(state: PCPState, geometry: RequestGeometry | None = None) -> StateView:
    """[`StateView`][pcp_fn.spec.inputs.StateView] of `state`; `geometry`: its
    [`pcp_fn.dcs.layout.state_geometry`][pcp_fn.dcs.state_geometry] when the caller already has it
    (`spec_step`: the step's own)."""
    geo = layout_of(state.config).state_geometry(state) if geometry is None else geometry
    return StateView(geo, geo.request_ids < state.num_reqs)


def check_num_draft_tokens(config: PCPConfig, num_scheduled: np.ndarray, drafts: np.ndarray) -> None:
    """Host check: `0 <= drafts[i] <= num_spec_tokens` and `drafts[i] <= num_scheduled[i] - 1`."""
    if drafts.size != num_scheduled.size:
        raise ValueError(
            f"num_draft_tokens has {drafts.size} entries but the batch has {num_scheduled.size} requests"
        )
    over = np.flatnonzero(drafts > config.num_spec_tokens)
    if over.size:
        i = int(over[0])
        raise ValueError(
            f"num_draft_tokens[{i}] = {drafts[i]} exceeds num_spec_tokens={config.num_spec_tokens}"
        )
    short = np.flatnonzero(drafts > np.maximum(num_scheduled - 1, 0))
    if short.size:
        i = int(short[0])
        raise ValueError(
            f"num_draft_tokens[{i}] = {drafts[i]} needs at least {drafts[i] + 1} scheduled tokens "
            f"(the drafts plus one), but num_scheduled_tokens[{i}] = {num_scheduled[i]}"
        )


def check_token_table(
    shape: Sequence[int], num_scheduled: np.ndarray, num_computed: np.ndarray, name: str = "token_ids"
) -> None:
    """Host check: a `[rows, width]` token table has a row per request and a column per position read.

    Request `i` reads columns `num_computed[i] .. num_computed[i] + num_scheduled[i] - 1`.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2:
        raise ValueError(f"{name} must be a [num_rows, max_model_len] table, got shape {shape}")
    rows, width = shape
    if num_scheduled.size > rows:
        raise ValueError(f"{name} has {rows} rows but the batch has {num_scheduled.size} requests")
    ends = num_computed + num_scheduled
    wide = np.flatnonzero((num_scheduled > 0) & (ends > width))
    if wide.size:
        i = int(wide[0])
        raise ValueError(
            f"{name} is too narrow: it has {width} columns but request {i} reads position {ends[i] - 1} "
            f"(num_computed_tokens={num_computed[i]} + num_scheduled_tokens={num_scheduled[i]} - 1)"
        )


def make_spec_batch(
    config: PCPConfig,
    num_scheduled_tokens: ArrayLike,
    num_computed_tokens: ArrayLike,
    num_prompt_tokens: ArrayLike,
    num_draft_tokens: ArrayLike,
    device: torch.device | str | None = None,
    *,
    token_ids: torch.Tensor | Sequence[int] | None = None,
    slot_mapping: ArrayLike | None = None,
    bucket: Bucket | None = None,
) -> tuple[SchedulerBatch, SpecInputs]:
    """`make_batch` plus the draft counts, validated, in one host-to-device copy.

    The draft counts travel in `make_batch`'s packed host buffer (after the
    per-request counts): one copy for the batch, its slot mapping and the
    drafts, on a GPU or NPU a non-blocking one from a pinned staging buffer
    ([`pcp_fn.core.staging`][]). Every check is kept and vectorised; the
    loops that name a bad entry run only once a check failed.

    Args:
        num_scheduled_tokens: as for [`pcp_fn.make_batch`][].
        num_computed_tokens: as for [`pcp_fn.make_batch`][].
        num_prompt_tokens: as for [`pcp_fn.make_batch`][].
        num_draft_tokens: draft tokens per request (`0 .. num_spec_tokens`,
            and at most `num_scheduled - 1`).
        device: as for [`pcp_fn.make_batch`][].
        token_ids: the `[rows, max_model_len]` token table the spec ops will
            read, or just its shape; only the shape is looked at, and recorded
            (`SpecInputs.token_ids_shape`) for [`pcp_fn.spec.spec_step`][pcp_fn.spec_step].
        slot_mapping: as for [`pcp_fn.make_batch`][] (padded to `[F_b]`).
        bucket: as for [`pcp_fn.make_batch`][].

    Raises:
        ValueError: everything `make_batch` rejects; a draft count above
            `num_spec_tokens` or not leaving one scheduled token for the
            bonus; a token table with fewer rows than requests or too narrow
            for `num_computed + num_scheduled`.

    Example (`P = 2`, one spec token):

        batch, spec = make_spec_batch(cfg, [2, 2, 8], [6, 8, 0], [6, 8, 8], [1, 1, 0])
        spec.num_draft_tokens      # [1, 1, 0, 0]  (bucket of 4 requests)
    """
    counts = (num_scheduled_tokens, num_computed_tokens, num_prompt_tokens)
    shape = None
    if token_ids is not None:
        if isinstance(token_ids, torch.Tensor):
            shape = tuple(token_ids.shape)  # torch.Size: ints already
        else:
            shape = tuple(int(x) for x in token_ids)

    def check(rows: np.ndarray, bound: int) -> None:
        # the common case in two reductions: drafts < scheduled and drafts <= k everywhere, and
        # no request reads past the table (2 * bound >= computed + scheduled); anything else (an
        # empty request's 0 drafts too) takes the exact checks, which name the entry
        sched, drafts = rows[0], rows[3]
        if rows.shape[1] and (_smax(drafts - sched) >= 0 or _smax(drafts) > config.num_spec_tokens):
            check_num_draft_tokens(config, sched, drafts)
        if shape is not None and (len(shape) != 2 or rows.shape[1] > shape[0] or 2 * bound > shape[1]):
            check_token_table(shape, sched, rows[1])

    drafts = num_draft_tokens
    if not (_int_vector(drafts) and _int_vector(counts[0]) and drafts.shape[0] == counts[0].shape[0]):
        # not the runner's numpy arrays: the counts' own checks, then the drafts' (messages that
        # name them), then every check on the arrays as numpy
        counts = tuple(host_int_rows(_COUNTS, counts)[0])
        drafts = host_ints("num_draft_tokens", drafts)
        if drafts.shape[0] != counts[0].shape[0]:
            check_num_draft_tokens(config, counts[0], drafts)
    batch, (drafts_d,) = build_batch(config, _NAMES, (*counts, drafts), device, slot_mapping, bucket, check)
    spec = _new(SpecInputs)  # checked above: no __init__ to repeat it
    spec.__dict__.update(num_draft_tokens=drafts_d, token_ids_shape=shape)
    return batch, spec


def _int_vector(a: object) -> bool:
    """A 1-D numpy array of an integer type whose values an int64 holds (not uint64)."""
    return (
        type(a) is np.ndarray
        and a.ndim == 1
        and (a.dtype.kind == "i" or (a.dtype.kind == "u" and a.dtype.itemsize < 8))
    )


_new = object.__new__
_smax = np.maximum.reduce
_COUNTS = ("num_scheduled_tokens", "num_computed_tokens", "num_prompt_tokens")
_NAMES = (*_COUNTS, "num_draft_tokens")
