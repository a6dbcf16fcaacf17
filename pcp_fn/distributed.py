"""The all-gather that PCP needs, as an injectable callable, and restore-after-gather.

An ``AllGather`` takes this rank's fixed-size local buffer ``[L_b, ...]`` and
returns the ``P`` ranks' buffers stacked rank-major ``[P * L_b, ...]``:

- :func:`process_group_all_gather` uses ``torch.distributed``'s functional
  collectives (``all_gather_tensor``), which ``torch.compile`` traces into the
  graph; it works on any backend (gloo on the CPU, NCCL on CUDA, HCCL on Ascend),
  nothing here is backend-specific.
- :class:`ThreadedAllGather` simulates ``P`` ranks inside one process (one
  thread per rank, a barrier per collective), for tests and tools.

    gather = process_group_all_gather()               # after init_process_group
    state, hidden = all_gather_and_restore(state, local_hidden, gather)
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from .dcs.state import PCPState
from .restore import restore_hidden_states

AllGather = Callable[[torch.Tensor], torch.Tensor]


def process_group_all_gather(group: object = None) -> AllGather:
    """All-gather along dim 0 over ``group`` (default: the world) with functional collectives."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    def all_gather(local: torch.Tensor) -> torch.Tensor:
        pg = group if group is not None else dist.group.WORLD
        out = funcol.all_gather_tensor(local.contiguous(), gather_dim=0, group=pg)
        # eager mode returns an AsyncCollectiveTensor; wait so callers get a plain tensor
        return funcol.wait_tensor(out) if isinstance(out, funcol.AsyncCollectiveTensor) else out

    return all_gather


class ThreadedAllGather:
    """``P`` ranks in one process: ``gather.for_rank(r)`` is rank ``r``'s ``AllGather``.

    Every rank's thread must call its collective the same number of times, in
    the same order (as with a real process group).
    """

    def __init__(self, world_size: int, timeout: float = 60.0) -> None:
        self.world_size = world_size
        self._slots: list[torch.Tensor | None] = [None] * world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout)

    def for_rank(self, rank: int) -> AllGather:
        def all_gather(local: torch.Tensor) -> torch.Tensor:
            self._slots[rank] = local
            self._barrier.wait()  # everyone has deposited
            out = torch.cat([t for t in self._slots if t is not None])
            self._barrier.wait()  # everyone has read before the next collective overwrites
            return out

        return all_gather


def all_gather_and_restore(
    state: PCPState, local: torch.Tensor, all_gather: AllGather
) -> tuple[PCPState, torch.Tensor]:
    """All-gather this rank's ``[L_b, ...]`` local buffer and restore request order.

    Returns ``[P * L_b, ...]`` like :func:`pcp_fn.restore_hidden_states`: rows
    ``[:P * num_tokens]`` in padded request order.
    """
    return restore_hidden_states(state, all_gather(local))
