"""The persistent buffers: allocated once at capacity, written in place, never reallocated.

A runner that captures its forward in a graph keeps the addresses of the
tensors it reads (the restore index, the padded slot mapping, the attention
index tensors...). Every device result of the manager is therefore copied
into one of these buffers, whose `data_ptr()` never changes; the manager
hands out views of them (`buffer[:length]`, the length a host int).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any, TypeVar

import numpy as np
import torch

from ._settings import ManagerSettings

Value = TypeVar("Value")


class DeviceBuffer:
    """A device tensor under `.gpu` (the attribute vllm's `CpuGpuBuffer` uses).

    The 0.23 manager also keeps a host copy (`.cpu` / `.np`) of some of its
    index buffers; the adapter builds them on the device and never reads them
    back, so there is none.
    """

    def __init__(self, size: tuple[int, ...] | int, dtype: torch.dtype, device: torch.device) -> None:
        self.gpu = torch.zeros(size, dtype=dtype, device=device)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> DeviceBuffer:
        """Wrap an existing persistent tensor."""
        buf = cls.__new__(cls)
        buf.gpu = tensor
        return buf


class HostDeviceBuffer:
    """vllm's `CpuGpuBuffer` interface: `.cpu`, its numpy view `.np`, `.gpu`, `copy_to_gpu`."""

    def __init__(
        self, size: tuple[int, ...] | int, dtype: torch.dtype, device: torch.device, pin_memory: bool = False
    ) -> None:
        self.cpu = torch.zeros(size, dtype=dtype, device="cpu", pin_memory=pin_memory)
        self.np: np.ndarray = self.cpu.numpy()
        self.gpu = torch.zeros(size, dtype=dtype, device=device)

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        if n is None:
            return self.gpu.copy_(self.cpu, non_blocking=True)
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


@dataclasses.dataclass
class Buffers:
    """Every persistent buffer of one manager (the one mutable part of it, by design).

    `step` maps each output of `_ops.device_step` to its buffer, sized from
    the output's shape at the capacity bucket. The rest are sized from the
    configuration (`T`, `R`, `k` and `max_model_len`).
    """

    step: dict[str, torch.Tensor]
    slots_in: torch.Tensor  # staging copy of the runner's slot mapping (fixed address for graphs)
    computed_in: torch.Tensor  # staging copy of corrected num_computed_tokens [R] (int32, as the batch's)
    padded_slot_mappings: list[torch.Tensor]  # one per KV cache group (initialize_slot_mapping)
    padded_slot_capacity: int
    first_padded_slot_mapping: torch.Tensor  # group 0's, made up front: the graphs are bound to it
    query_lens_pcp_full: HostDeviceBuffer
    input_ids_pcp_full: HostDeviceBuffer | None
    query_start_loc_pcp_full: HostDeviceBuffer | None
    positions_pcp_full: torch.Tensor | None  # host
    mtp_slot_pad: torch.Tensor | None
    dcp_mtp_attn_mask: DeviceBuffer | None
    # [R, 1 + k, k] int64: where each row's True entries of that mask may be (column 0 where none)
    mtp_mask_cells: torch.Tensor | None

    def mtp_slot_view(self, rows: int | None, pcp_size: int) -> torch.Tensor | None:
        """`mtp_slot_pad[: rows * P]`: the MTP slot mapping of `rows` rows (`None`: never built)."""
        if rows is None:
            return None
        return self.mtp_slot_pad[: rows * pcp_size]


class ViewCache:
    """Views of persistent buffers, the same view object as last time when its rows are (a view costs
    a few microseconds; a steady decode batch asks the same ones every step). One per manager,
    shared by its helpers: a key names one buffer."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[Hashable, Any]] = {}  # key -> (rows or tag, what is kept)

    def view(self, key: Hashable, buffer: torch.Tensor, rows: int) -> torch.Tensor:
        """`buffer[:rows]`."""
        last = self._last.get(key)
        if last is not None and last[0] == rows:
            return last[1]
        view = buffer[:rows]
        self._last[key] = (rows, view)
        return view

    def get(self, key: Hashable, tag: Hashable) -> Any:
        """What `put` last stored under `key` with this `tag`, else `None`."""
        last = self._last.get(key)
        return None if last is None or last[0] != tag else last[1]

    def put(self, key: Hashable, tag: Hashable, value: Value) -> Value:
        self._last[key] = (tag, value)
        return value


def allocate(
    s: ManagerSettings, capacities: dict[str, tuple[tuple[int, ...], torch.dtype]], gathered_rows: int
) -> Buffers:
    """Allocate everything once. `gathered_rows` is `P * L` (the padded gathered capacity)."""
    dev, R, T = s.device, s.max_num_reqs, s.max_num_tokens
    pin = s.pin_memory and s.graph_device
    spec_cp = s.has_spec_config and s.cp_size > 1
    extra = max(s.decode_threshold - 2, 0)
    return Buffers(
        step={k: torch.zeros(shape, dtype=dtype, device=dev) for k, (shape, dtype) in capacities.items()},
        # int32: the padded slot mapping's dtype (and vllm-ascend's block tables'), copied as it is
        slots_in=torch.zeros(max(gathered_rows, s.max_buffer_num_tokens), dtype=torch.int32, device=dev),
        computed_in=torch.zeros(R, dtype=torch.int32, device=dev),
        padded_slot_mappings=[],
        padded_slot_capacity=max(gathered_rows, s.max_buffer_num_tokens),
        first_padded_slot_mapping=torch.full(
            (max(gathered_rows, s.max_buffer_num_tokens),), -1, dtype=torch.int32, device=dev
        ),
        query_lens_pcp_full=HostDeviceBuffer(R, torch.int32, dev, pin),
        input_ids_pcp_full=HostDeviceBuffer(T, torch.int32, dev, pin) if spec_cp else None,
        query_start_loc_pcp_full=HostDeviceBuffer(R + 1, torch.int32, dev, pin) if spec_cp else None,
        positions_pcp_full=torch.zeros(T, dtype=torch.int64, pin_memory=pin) if spec_cp else None,
        mtp_slot_pad=(
            torch.full(((T + R * extra) * s.pcp_size,), -1, dtype=torch.int32, device=dev)
            if spec_cp and extra
            else None
        ),
        dcp_mtp_attn_mask=(
            DeviceBuffer((R, s.decode_threshold, s.max_model_len), torch.bool, dev) if spec_cp else None
        ),
        mtp_mask_cells=(
            # column 0 of each (row, query): the flat positions of a mask with no True entry
            (torch.arange(R * s.decode_threshold, dtype=torch.int64, device=dev) * s.max_model_len)
            .view(R, s.decode_threshold, 1)
            .expand(R, s.decode_threshold, s.decode_threshold - 1)
            .contiguous()
            if spec_cp
            else None
        ),
    )


def new_padded_slot_mapping(buffers: Buffers, device: torch.device) -> torch.Tensor:
    """One more KV cache group's padded slot mapping (vllm-ascend `initialize_slot_mapping`);
    the first is the one allocated up front."""
    if buffers.padded_slot_mappings:
        buf = torch.full((buffers.padded_slot_capacity,), -1, dtype=torch.int32, device=device)
    else:
        buf = buffers.first_padded_slot_mapping
    buffers.padded_slot_mappings.append(buf)
    return buf
