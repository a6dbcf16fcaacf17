"""Host-side validation: config fields and the scheduler's per-request integer arrays.

Everything here runs on the host, at a boundary (a config's `__post_init__`,
a `make_batch`), before anything is computed, and raises `ValueError` (or
`TypeError` for a wrong type) naming the field and the limit.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

INT32_MAX = int(np.iinfo(np.int32).max)
INT64_MAX = int(np.iinfo(np.int64).max)

ArrayLike = Sequence[int] | np.ndarray | torch.Tensor


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    """`value` is a Python int (not a bool) in `[minimum, maximum]`."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_not_meta(name: str, value: object) -> None:
    """A host boundary reads `value`'s entries: a `meta` tensor (shape only) has none."""
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor: the host boundary needs real values")


def _host_array(name: str, values: ArrayLike) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        check_not_meta(name, values)
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one entry per request), got shape {arr.shape}")
    return arr


def host_row(
    name: str, values: Any, n: int | None = None, *, longer_ok: bool = False, integers: bool = False
) -> np.ndarray:
    """An engine's per-request host array, its shape checked, its values not read: `values`
    itself when it is a 1-D numpy array (the engine's arrays, every step), else as one.

    `n`: the entries it must have (`longer_ok`: at least `n`, and its first `n` are
    returned: an engine's arrays at capacity). `integers`: its dtype must be an integer
    one. A tensor must be on the host.

    Raises:
        ValueError: naming `name`: not 1-D, the wrong length or dtype, or a tensor off
            the host.
    """
    arr = values
    if type(arr) is np.ndarray and arr.ndim == 1 and not (longer_ok or integers):  # the engine's
        if n is None or arr.shape[0] == n:
            return arr
    if type(arr) is not np.ndarray:
        if isinstance(arr, torch.Tensor):
            if arr.device.type != "cpu":
                raise ValueError(f"{name} must be on the host, got a tensor on {arr.device}")
            arr = arr.numpy()
        arr = np.asarray(arr)
    if arr.ndim != 1 or (integers and arr.size and arr.dtype.kind not in "iu"):
        kind = "a 1-D integer array" if integers else "1-D (one entry per request)"
        raise ValueError(f"{name} must be {kind}, got shape {arr.shape} dtype {arr.dtype}")
    if n is None:
        return arr
    if longer_ok:
        if arr.shape[0] < n:
            raise ValueError(f"{name} has {arr.shape[0]} entries but num_reqs is {n}")
        return arr[:n]
    if arr.shape[0] != n:
        raise ValueError(f"{name} must be 1-D with num_reqs={n} entries, got shape {arr.shape}")
    return arr


def host_ints(name: str, values: ArrayLike, *, maximum: int = INT32_MAX) -> np.ndarray:
    """`[n]` int64 copy of a per-request count array, each entry in `[0, maximum]`.

    Rejects bools (`[1, True]`), floats, objects and values past `maximum`
    (int32 by default: the device buffers are int32) with the index of the
    first bad entry.
    """
    if isinstance(values, list | tuple):
        # numpy would turn [1, True] into [1, 1]: a bool among counts is a caller's bug
        kinds = set(map(type, values))
        if bool in kinds or np.bool_ in kinds:
            i = next(i for i, v in enumerate(values) if isinstance(v, bool | np.bool_))
            raise TypeError(f"{name}[{i}] must be an int, got bool {values[i]!r}")
    arr = _host_array(name, values)
    if arr.dtype == object:
        for i, v in enumerate(arr.tolist()):
            check_int(f"{name}[{i}]", v, 0, maximum)
        return arr.astype(np.int64)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    check_uint64_within(name, arr, maximum)
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() > maximum):
        bad = np.flatnonzero(arr < 0)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{name}[{i}] = {arr[i]} is negative; counts must be >= 0")
        i = int(np.flatnonzero(arr > maximum)[0])
        raise ValueError(f"{name}[{i}] = {arr[i]} exceeds the limit {maximum}")
    return arr


def check_uint64_within(name: str, arr: np.ndarray, maximum: int) -> None:
    """A `uint64` array's entries are at most `maximum` (an int64 value), compared before any
    cast to int64, where `2**63` would wrap to a negative number; other dtypes pass."""
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.uint64(maximum):
        at = np.unravel_index(int(np.argmax(arr > np.uint64(maximum))), arr.shape)
        where = ", ".join(str(int(i)) for i in at)
        raise ValueError(f"{name}[{where}] = {int(arr[at])} exceeds the limit {maximum}")


# numpy integer type codes whose every value an int64 holds (every integer type but uint64)
_FAST_INTS = frozenset(
    np.dtype(t).char
    for t in np.typecodes["AllInteger"]
    if np.dtype(t).kind == "i" or np.dtype(t).itemsize < 8
)


def host_int_rows(
    names: tuple[str, ...], arrays: tuple[ArrayLike, ...], maximum: int = INT32_MAX
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """`(arrays, [k, n] int64 rows, a bound on their largest entry)`: per-request count
    arrays of one length (`names[i]` names `arrays[i]`), each checked like
    [`host_ints`][pcp_fn.core.checks.host_ints] (1-D integers in `[0, maximum]`) and by
    [`check_same_length`][pcp_fn.core.checks.check_same_length]; the arrays come back as numpy
    integer arrays (the caller's own when they already are).

    The common case (1-D numpy integer arrays) is checked all at once: one
    concatenation and one bitwise-or over it (the bound returned: no entry
    exceeds it, and a negative entry makes it negative). Any other kind of array,
    or a bound outside `[0, maximum]`, goes through [`host_ints`][pcp_fn.core.checks.host_ints], which
    raises with its exact message for a bad entry.
    """
    arrs = [
        a
        if type(a) is np.ndarray and a.ndim == 1 and a.dtype.char in _FAST_INTS
        else host_ints(name, a, maximum=maximum)  # lists, tensors, uint64 (checked before any cast)
        for name, a in zip(names, arrays)
    ]
    n = arrs[0].shape[0]
    for a in arrs:
        if a.shape[0] != n:
            check_same_length(**dict(zip(names, arrs)))
    flat = np.concatenate(arrs, dtype=np.int64)
    bound = int(np.bitwise_or.reduce(flat)) if n else 0  # >= every entry when none is negative
    if not 0 <= bound <= maximum:
        for name, arr in zip(names, arrs):
            host_ints(name, arr, maximum=maximum)  # raises for the first bad array, naming the entry
        bound = int(flat.max())  # every entry is in range, but their bits reach past maximum
    return arrs, flat.reshape(len(arrs), n), bound


def check_sequence_ends(rows: np.ndarray, bound: int, meaning: str) -> None:
    """`num_computed_tokens + num_scheduled_tokens` (`rows[1] + rows[0]` of
    [`host_int_rows`][pcp_fn.core.checks.host_int_rows]) must fit int32; `bound` is its bound on
    every entry, so the sums are only formed when two entries could overflow. `meaning` says what
    the sum is (`{i}` is the request) in the `ValueError`.
    """
    if 2 * bound <= INT32_MAX:
        return
    seq_end = rows[1] + rows[0]
    if seq_end.max() > INT32_MAX:
        i = int(np.argmax(seq_end > INT32_MAX))
        raise ValueError(
            f"num_computed_tokens[{i}] + num_scheduled_tokens[{i}] = {seq_end[i]} exceeds the int32 "
            f"limit {INT32_MAX} ({meaning.format(i=i)})"
        )


def host_bools(name: str, values: ArrayLike) -> np.ndarray:
    """`[n]` bool copy of a per-request flag array (dtype must be bool)."""
    arr = _host_array(name, values)
    if arr.size and arr.dtype != np.bool_:
        raise TypeError(f"{name} must hold bools, got dtype {arr.dtype}")
    return arr.astype(np.bool_)


def check_same_length(**arrays: np.ndarray) -> int:
    """All per-request arrays have one length; returns it."""
    sizes = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in sizes.items())
        raise ValueError(f"per-request arrays differ in length: {listed}")
    return next(iter(sizes.values()), 0)


def check_int_tensor(name: str, value: object, shape: tuple[int, ...] | None = None, what: str = "") -> None:
    """`value` is an integer tensor (not bool) of exactly `shape`, if given (`what` says what
    the shape is).

    Static (type, dtype and shape only): safe inside an op that is traced or captured.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got {value.dtype}")
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"{name} must be {list(shape)} ({what}), got shape {tuple(value.shape)}")


# devices check_device has found present: a boundary checks each device once per process
_PRESENT: set[torch.device] = set()


def check_device(name: str, device: torch.device) -> None:
    """A `cuda` or `npu` `device` must exist on this machine (checked once per device, then
    a set lookup); other device types pass (the CPU, `meta`)."""
    if device in _PRESENT or device.type not in ("cuda", "npu"):
        return
    if device.type == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError:
            raise ValueError(
                f"{name}={str(device)!r} needs torch_npu, which is not installed (pip install pcp_fn[npu])"
            ) from None
    module = getattr(torch, device.type)
    if not module.is_available():
        raise ValueError(
            f"{name}={str(device)!r} is not available: torch.{device.type}.is_available() is False "
            f"(no {device.type.upper()} device or driver on this machine)"
        )
    count = module.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(
            f"{name}={str(device)!r} is not available: this machine has {count} {device.type} devices"
        )
    _PRESENT.add(device)


@functools.cache  # fixed for the process's life; a syscall saved per packed step
def host_memory_bytes() -> int | None:
    """This machine's physical memory, or `None` where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_host_buffer(name: str, nbytes: int, what: str) -> None:
    """A host buffer of `nbytes` (sized by the argument `name`; `what` describes it) must fit
    in this machine's memory: refused with the sizes instead of failing in the allocator."""
    total = host_memory_bytes()
    if total is not None and nbytes > total:
        raise ValueError(
            f"{name} asks for {what} of {nbytes / 2**30:.1f} GiB, more than this machine's "
            f"{total / 2**30:.1f} GiB of memory"
        )


def same_ints(a: np.ndarray, b: np.ndarray) -> bool:
    """`a` and `b` hold the same integers (`np.array_equal`; their bytes compared when they
    share a dtype and a contiguous layout: a tenth of the cost)."""
    if a.dtype == b.dtype and a.shape == b.shape and a.flags.c_contiguous and b.flags.c_contiguous:
        return a.tobytes() == b.tobytes()
    return a.shape == b.shape and not (a != b).any()
