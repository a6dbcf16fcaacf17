"""What the manager's helpers are given: the parts of one manager they read and write, made once.

[`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager] makes each part in its
constructor and hands this record to its helpers
(`pcp_fn.adapters.vllm_ascend.v1._metadata.MetadataBuilder`,
`pcp_fn.adapters.vllm_ascend.v1._spec_inputs.SpecInputsBuilder`,
`pcp_fn.adapters.vllm_ascend.v1._spec_proposer.Proposer`), each of which keeps, under its own
attributes, the parts it uses. The record is frozen: a helper never replaces a part (the record
cell's `current`, the buffers' contents and the view cache's entries are what change).
"""

from __future__ import annotations

import dataclasses

from . import _ops
from ._buffers import Buffers, ViewCache
from ._record import RecordCell
from ._settings import ManagerSettings


@dataclasses.dataclass(frozen=True)
class ManagerParts:
    """One manager's parts.

    Attributes:
        settings: the constructor's settings (`pcp_fn.adapters.vllm_ascend.v1._settings.read_settings`).
        config: the ops' config (`pcp_fn.adapters.vllm_ascend.v1._ops.make_config`).
        buffers: the persistent buffers (`pcp_fn.adapters.vllm_ascend.v1._buffers.allocate`).
        graphs: the device graphs over them (`pcp_fn.adapters.vllm_ascend.v1._ops.DeviceGraphs`).
        records: the cell of the current frozen step record.
        views: the cache of views of the buffers (a key names one buffer).
        cpu_state: the state of the ops that read the CPU token table.
        capacity_state: the capacity bucket's state, for the ops tied to no step.
    """

    settings: ManagerSettings
    config: _ops.PCPConfig
    buffers: Buffers
    graphs: _ops.DeviceGraphs
    records: RecordCell
    views: ViewCache
    cpu_state: _ops.PCPState
    capacity_state: _ops.PCPState
