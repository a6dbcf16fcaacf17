"""Host-to-device staging: a step's host inputs in ONE non-blocking copy from pinned memory.

A host boundary (`make_batch` and friends) packs everything a step needs into
one host buffer and moves it with one copy. On a GPU or NPU that copy must come
from pinned (page-locked) memory to be asynchronous: a pageable `.to(device)`
blocks the host until the copy is done. But an asynchronous copy reads its
source *later*: a pinned buffer refilled for the next step while the previous
step's copy is still queued hands the device the wrong step's inputs. (vllm-ascend
fixed this race twice: refilling a pinned buffer with no event between.)

[`HostStaging`][pcp_fn.core.staging.HostStaging] keeps two pinned buffers used in turn. After each copy it
records an event on the copying stream; a buffer is handed out again only once
the event of the copy that last read it has completed. With two buffers that
is the copy of two steps ago, long done unless the host runs two steps ahead
of the device (then the host waits, which is the point).

    staging = HostStaging("cuda")
    host = staging.host(n, np.int32)   # a free pinned buffer, as numpy
    host[:] = ...                      # pack the step's inputs
    dev = staging.to_device(host)      # one non-blocking copy; the buffer is now in flight

On the CPU there is nothing to stage: [`host_buffer`][pcp_fn.core.staging.host_buffer] gives fresh memory
and [`to_device`][pcp_fn.core.staging.to_device] wraps it (the device tensor *is* the host buffer, so it is
never reused). The MRV2 and spec-decode boundaries can adopt the same two calls.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from .checks import check_device

_TORCH_DTYPES = {
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.float32): torch.float32,
}


def _device_module(device: torch.device):
    """`torch.cuda` or `torch.npu` (`torch_npu` imported only then): `Event`, `current_stream`.

    Raises `ValueError` naming `device` when it is not on this machine, before any pinned
    memory is asked for (which would fail deep inside torch, without the device's name).
    """
    check_device("device", device)  # imports torch_npu for an npu
    return getattr(torch, device.type)


def _pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class HostStaging:
    """Pinned host buffers, used in turn, each guarded by the event of its last copy.

    Args:
        device: a `cuda` or `npu` device (the copies go to it, on its current stream).
        slots: buffers in the rotation (2: one being filled while one is in flight).
    """

    def __init__(self, device: torch.device | str, slots: int = 2) -> None:
        self.device = torch.device(device)
        if self.device.type == "cpu":
            raise ValueError("HostStaging is for a GPU or NPU; the CPU needs no staging (see host_buffer)")
        if slots < 2:
            raise ValueError(f"slots must be >= 2 (one filling, one in flight), got {slots}")
        self._mod = _device_module(self.device)
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list[object | None] = [None] * slots
        self._next = 0
        self._filling: int | None = None

    def host(self, numel: int, dtype: np.dtype | type = np.int32) -> np.ndarray:
        """A numpy view of `numel` elements of the next free pinned buffer (uninitialised).

        Blocks only while the copy that last read this buffer is still pending.
        """
        dtype = np.dtype(dtype)
        i = self._next
        event = self._events[i]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer is done: refill it
            self._events[i] = None
        nbytes = numel * dtype.itemsize
        buf = self._buffers[i]
        if buf is None or buf.numel() < nbytes:
            size = max(nbytes, 2 * (0 if buf is None else buf.numel()), 4096)
            buf = self._buffers[i] = _pinned(size)
        self._filling = i
        return buf[:nbytes].numpy().view(dtype)

    def to_device(self, host: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Copy `host` (the array [`host`][pcp_fn.core.staging.HostStaging.host] returned) to the
        device without blocking.

        Returns a fresh device tensor, or `out` (a device tensor of `host`'s size and
        dtype: a persistent buffer that graphs read) written; records the buffer's event on
        the current stream.
        """
        i = self._filling
        if i is None:
            raise RuntimeError("to_device needs the array from the last host() call")
        buf = self._buffers[i]
        assert buf is not None
        src = buf[: host.nbytes].view(_TORCH_DTYPES[host.dtype])
        dev = torch.empty(src.shape, dtype=src.dtype, device=self.device) if out is None else out
        dev.copy_(src, non_blocking=True)
        event = self._mod.Event()
        event.record(self._mod.current_stream(self.device))
        self._events[i] = event
        self._filling = None
        self._next = (i + 1) % len(self._buffers)
        return dev


_local = threading.local()


def staging_for(device: torch.device) -> HostStaging:
    """This thread's [`HostStaging`][pcp_fn.core.staging.HostStaging] for `device` (made on first use)."""
    table = getattr(_local, "staging", None)
    if table is None:
        table = _local.staging = {}
    staging = table.get(device)
    if staging is None:
        staging = table[device] = HostStaging(device)
    return staging


STAGED_DEVICES = ("cuda", "npu")  # devices with streams and pinned host memory


def host_buffer(numel: int, dtype: np.dtype | type, device: torch.device) -> np.ndarray:
    """Host memory for one step's inputs bound for `device`: pinned and rotated
    ([`HostStaging`][pcp_fn.core.staging.HostStaging]) on a GPU or NPU, fresh elsewhere (the CPU;
    `meta`, where shapes are all that is checked)."""
    if device.type not in STAGED_DEVICES:
        return np.empty(numel, dtype)
    return staging_for(device).host(numel, dtype)


def to_device(host: np.ndarray, device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """Move the array [`host_buffer`][pcp_fn.core.staging.host_buffer] returned to `device` in one
    copy (non-blocking off the CPU): a fresh tensor, or into `out` (`host`'s size and dtype, on
    `device`)."""
    if device.type not in STAGED_DEVICES:
        src = torch.from_numpy(host)
        return src.to(device) if out is None else out.copy_(src)
    return staging_for(device).to_device(host, out)
