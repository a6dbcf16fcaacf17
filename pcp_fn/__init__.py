"""pcp_fn: Prefill Context Parallelism step bookkeeping as pure, capturable torch functions.

Every op is ``op(state, ...) -> (state, outputs)`` on fixed-shape device
tensors; a whole step traces with ``torch.compile(fullgraph=True)``, exports,
vmaps and captures into one CUDA/ACL graph. See README.md.
"""

from . import graph, mrv2, ranks
from .batch import SchedulerBatch, make_batch
from .config import Bucket, PCPConfig
from .layout import TokenLayout, update_tokens
from .logits import get_logits_indices
from .mrv2 import MRV2Config
from .restore import restore_hidden_states
from .seqlens import cp_local_seq_lens
from .slots import padded_slot_mapping
from .state import PCPState, init_state
from .step import StepOutputs, step
from .sync import HostSyncError, assert_no_host_syncs, count_aten_ops, no_host_syncs

__all__ = [
    "Bucket",
    "HostSyncError",
    "MRV2Config",
    "PCPConfig",
    "PCPState",
    "SchedulerBatch",
    "StepOutputs",
    "TokenLayout",
    "assert_no_host_syncs",
    "count_aten_ops",
    "cp_local_seq_lens",
    "get_logits_indices",
    "graph",
    "init_state",
    "make_batch",
    "mrv2",
    "no_host_syncs",
    "padded_slot_mapping",
    "ranks",
    "restore_hidden_states",
    "step",
    "update_tokens",
]

__version__ = "0.1.0"
