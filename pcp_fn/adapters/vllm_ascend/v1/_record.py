"""The manager's step record: everything it carries from one call to the next, frozen.

vllm-ascend's `PCPManager` keeps its per-step state in mutable attributes
(some reset by `init_batch_info`, some only by `update_tokens_for_pcp`, some
kept across steps: the async spec-decode layout, the last MTP slot mapping).
The adapter keeps one `ManagerRecord` instead and replaces it
(`dataclasses.replace`) at each call that changes it; the runner-facing
attributes are read-only views of it. The only mutable part of the manager is
its persistent buffers (`pcp_fn.adapters.vllm_ascend.v1._buffers`, and the staging and record buffers of
its graphs), whose contents the record describes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ....dcs.host import HostLayout
from . import _ops


@dataclasses.dataclass(frozen=True)
class FullLayout:
    """The scheduler-order layout `generate_pcp_mtp_input` saw, for the async rebuild of the same step.

    vllm-ascend `async_rebuild_req_indices_full` / `..._cu_num_tokens_full` / `..._num_tokens_full`.
    """

    req_indices: np.ndarray  # [F] request of each scheduler-order token
    cu_num_tokens: np.ndarray  # [n] inclusive cumulative tokens
    num_tokens: int  # F


@dataclasses.dataclass(frozen=True)
class ManagerRecord:
    """What the manager knows after its last call.

    Attributes:
        state: the device [`pcp_fn.PCPState`][] of the last `init_batch_info` (its bucket
            static; its tensors views of the persistent record the step's graph writes).
        host: the host twin of the last `init_batch_info` (`None` before the first).
        batch: the device batch of that step (its bucket shapes every device buffer write; its
            tensors views of the persistent staging buffer).
        updated: the host twin of the last `update_tokens_for_pcp`; the attributes the
            reference sets there (pads, `pcp_tokens`, the hybrid counts...) read it.
        num_actual_tokens_pcp_padded: set by `generate_pcp_metadata` (read by the restore).
        cu_num_tokens_pcp_full: scheduler-order cumulative tokens of `generate_pcp_mtp_input`.
        async_full: the layout saved for `rebuild_async_spec_decode_inputs`.
        mtp_rows: rows of the MTP slot mapping last built (`None`: never built).
        local_schedule: `cache_local_schedule_layout`'s snapshot.
        long_seq_metadata: the last `generate_pcp_metadata` result.
    """

    state: _ops.PCPState
    host: HostLayout | None = None
    batch: _ops.SchedulerBatch | None = None
    updated: HostLayout | None = None
    num_actual_tokens_pcp_padded: int = 0
    cu_num_tokens_pcp_full: np.ndarray | None = None
    async_full: FullLayout | None = None
    mtp_rows: int | None = None
    local_schedule: _ops.LocalScheduleLayout | None = None
    long_seq_metadata: Any = None  # vllm-ascend's AscendPrefillContextParallelMetadata: handed out


_new = object.__new__


class RecordCell:
    """The manager's current `ManagerRecord`, shared with its helpers (the one place it is replaced).

    `current` is read-only to its readers; `set` replaces it by a copy with some fields
    changed. `host` and `bucket` are the last `init_batch_info`'s, or a
    `RuntimeError` before the first.
    """

    __slots__ = ("current",)

    def __init__(self, record: ManagerRecord) -> None:
        self.current = record

    def set(self, **changes: object) -> None:
        # dataclasses.replace of the frozen record, without its per-field Python loop
        record = _new(ManagerRecord)
        record.__dict__.update(self.current.__dict__)
        record.__dict__.update(changes)
        self.current = record

    def host(self) -> HostLayout:
        if self.current.host is None:
            raise RuntimeError("init_batch_info must run before this call")
        return self.current.host

    def bucket(self) -> _ops.Bucket:
        if self.current.batch is None:
            raise RuntimeError("init_batch_info must run before this call")
        return self.current.batch.bucket
