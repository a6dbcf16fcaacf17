"""A host-sync detector: run a function and fail on anything a graph cannot capture.

`no_host_syncs()` is a `TorchDispatchMode` that raises [`HostSyncError`][pcp_fn.HostSyncError]
on the aten calls that read a device value on the host or give a
data-dependent shape:

- `_local_scalar_dense` (`.item()`, `int(t)`, `bool(t)`, `if t:`),
  `is_nonzero`, `equal`;
- `nonzero`, `argwhere`, `masked_select`, every `unique` variant,
  `bincount` and `repeat_interleave` without `output_size`, and
  `index` / `index_put` with a boolean mask (they call `nonzero` inside);
- any copy that lands on the CPU from another device, and any copy of host
  memory to another device.

A `TorchFunctionMode` beside it catches, at the Python API, what never
reaches the dispatcher on a CPU tensor: `.tolist()`, `.numpy()`, and
tensors built from host data (`torch.tensor`, `torch.as_tensor`,
`torch.from_numpy`): on a GPU that is a synchronous host-to-device copy,
which a CUDA graph cannot capture, even for a constant. Keep constants in the
state (`init_state` makes them once) or derive them with `arange`.

    with no_host_syncs():
        state, layout = update_tokens(state, batch)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

R = TypeVar("R")

aten = torch.ops.aten


class HostSyncError(RuntimeError):
    """An op inside a captured region would sync with the host or has a data-dependent shape."""


_ALWAYS = {
    "_local_scalar_dense": "reads a device value on the host (.item(), int(t), bool(t), if t:)",
    "is_nonzero": "reads a device value on the host (bool(t))",
    "equal": "returns a Python bool computed from device values",
    "nonzero": "has a data-dependent output shape",
    "argwhere": "has a data-dependent output shape",
    "masked_select": "has a data-dependent output shape",
    "_unique": "has a data-dependent output shape",
    "_unique2": "has a data-dependent output shape",
    "unique_dim": "has a data-dependent output shape",
    "unique_consecutive": "has a data-dependent output shape",
    "unique_dim_consecutive": "has a data-dependent output shape",
    "bincount": "has an output shape that depends on the largest value",
}


def _has_bool_index(indices: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in (indices or ()))


def _device_of(x: Any) -> torch.device | None:
    return x.device if isinstance(x, torch.Tensor) else None


def _why(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    name = func._overloadpacket.__name__
    if name in _ALWAYS:
        return _ALWAYS[name]
    if name == "repeat_interleave":
        # the overloads taking a tensor of repeats need output_size (keyword-only) to know their length
        tensor_repeats = func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor)
        if tensor_repeats and kwargs.get("output_size") is None:
            return "has a data-dependent output shape without output_size"
        return None
    if name in ("index", "_unsafe_index") and _has_bool_index(args[1] if len(args) > 1 else None):
        return "indexes with a boolean mask (data-dependent shape)"
    if name in ("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put") and _has_bool_index(
        args[1] if len(args) > 1 else None
    ):
        return "assigns through a boolean mask (data-dependent shape)"
    if name in ("_to_copy", "to", "copy_", "copy"):
        if name in ("_to_copy", "to"):
            src, dst = _device_of(args[0]), kwargs.get("device")
            dst = torch.device(dst) if dst is not None else src
        else:
            dst, src = _device_of(args[0]), _device_of(args[1]) if len(args) > 1 else None
        if src is not None and dst is not None:
            if dst.type == "cpu" and src.type not in ("cpu", "meta"):
                return "copies a device tensor to the CPU"
            if src.type == "cpu" and dst.type not in ("cpu", "meta"):
                return "copies host memory to the device (synchronous; not capturable in a graph)"
    return None


class _Detector(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        why = _why(func, args, kwargs)
        if why is not None:
            raise HostSyncError(f"{func} {why}; not allowed inside a PCP op")
        return func(*args, **kwargs)


_HOST_DATA = {
    torch.tensor: "builds a tensor from host data (a host-to-device copy on a GPU)",
    torch.as_tensor: "builds a tensor from host data (a host-to-device copy on a GPU)",
    torch.from_numpy: "builds a tensor from a numpy array (host data)",
    torch.Tensor.tolist: "reads a tensor into a Python list",
    torch.Tensor.numpy: "reads a tensor into a numpy array",
    torch.Tensor.item: "reads a device value on the host",
    torch.Tensor.__bool__: "reads a device value on the host (if t:, bool(t))",
    torch.Tensor.__int__: "reads a device value on the host (int(t))",
    torch.Tensor.__float__: "reads a device value on the host (float(t))",
    torch.Tensor.__index__: "reads a device value on the host (a tensor used as a Python int)",
}


class _HostDataDetector(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        why = _HOST_DATA.get(func)
        if why is not None:
            raise HostSyncError(f"{getattr(func, '__qualname__', func)} {why}; not allowed inside a PCP op")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_host_syncs() -> Iterator[None]:
    """Context manager: raise [`HostSyncError`][pcp_fn.HostSyncError] on any host sync inside."""
    with _HostDataDetector(), _Detector():
        yield


def assert_no_host_syncs(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run `fn(*args, **kwargs)` under [`no_host_syncs`][pcp_fn.no_host_syncs] and return its result."""
    with no_host_syncs():
        return fn(*args, **kwargs)


def is_view_op(func: Any) -> bool:
    """`func` (an aten overload) only makes a view: its first output aliases an input, read-only.

    `view`, `slice`, `select`, `unsqueeze`, `expand`, `unbind`, `split`,
    `transpose`, `as_strided`, `alias`...: metadata on the host, no device kernel.
    """
    returns = func._schema.returns
    alias = returns[0].alias_info if returns else None
    return alias is not None and not alias.is_write


class OpCounter(TorchDispatchMode):
    """Count the aten ops a function dispatches (`counter.total`, `counter.counts`).

    `counter.kernels` leaves out the view ops ([`is_view_op`][pcp_fn.graph.is_view_op]): what an
    eager replay launches on the device, one kernel each (an ACL graph of
    eager ops replays exactly these).
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.views: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def kernels(self) -> int:
        return self.total - sum(self.views.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        key = str(func)
        self.counts[key] = self.counts.get(key, 0) + 1
        if is_view_op(func):
            self.views[key] = self.views.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def count_aten_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Number of aten ops `fn(*args, **kwargs)` dispatches."""
    with OpCounter() as counter:
        fn(*args, **kwargs)
    return counter.total


def count_kernels(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Kernel-launching aten ops `fn(*args, **kwargs)` dispatches: [`count_aten_ops`][pcp_fn.count_aten_ops]
    minus the view ops ([`is_view_op`][pcp_fn.graph.is_view_op])."""
    with OpCounter() as counter:
        fn(*args, **kwargs)
    return counter.kernels
