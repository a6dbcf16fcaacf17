"""``PCPState``: the frozen pytree every DualChunkSwap-family op takes and returns.

The config and the bucket of the last update are static tree structure; the
leaves are device tensors whose shapes depend on the config alone. What a
state holds is the per-request record of the last ``update_tokens`` (``[R]``
rows, the tail past ``num_reqs`` zero) and the bucket it was built for, so the
consumer ops (``get_logits_indices(state)``, ``padded_slot_mapping(state,
slots)``, ``restore_hidden_states(state, gathered)``, the spec-decode and
attention ops) return bucket-shaped outputs with no size argument: they
rebuild the per-token indices they need from the record, at the bucket's size.

The entry ops (``update_tokens``, ``step``, ``spec_step``) read only the
incoming state's ``ENTRY_FIELDS`` (its rank and constant tables), so a state
coming out of any step may be fed to the graph of any bucket.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..core.buckets import Bucket
from ..core.checks import check_device
from ..core.pytree import pytree_dataclass, static_field
from ..core.rank import rank_leaf
from .attention_tables import attention_constants
from .config import PCPConfig
from .layout_tables import layout_constants


@pytree_dataclass
class PCPState:
    """PCP state of one rank.

    Fields:
        config: static :class:`PCPConfig`.
        bucket: static :class:`Bucket` of the last update (``config.capacity``
            for a fresh state): the shapes the consumer ops return.
        rank: ``None`` (the rank is ``config.pcp_rank``, static) or a 0-d int64
            tensor (rank as data: every rank traces the same graph and
            ``torch.func.vmap`` can map over it).
        num_reqs: 0-d int64, requests of the last update.
        num_scheduled: ``[R]`` int32, scheduled tokens per request before the split.
        num_computed: ``[R]`` int32, tokens of each request already in the KV cache
            (a :class:`pcp_fn.PartitionLayout` may balance its split on them).
        is_decode: ``[R]`` bool, decode requests of the last update (a prefix).
        constants: small int64 tables that depend on the config only (the
            layout's chunk multipliers, the attention index coefficients), made on the device once here so
            that no op copies host data to the device (a synchronous,
            uncapturable copy inside a CUDA graph).
    """

    ENTRY_FIELDS: ClassVar[tuple[str, ...]] = ("rank", "constants")

    config: PCPConfig = static_field()
    bucket: Bucket = static_field()
    rank: torch.Tensor | None
    num_reqs: torch.Tensor
    num_scheduled: torch.Tensor
    num_computed: torch.Tensor
    is_decode: torch.Tensor
    constants: dict[str, torch.Tensor]

    @property
    def pcp_rank(self) -> int | torch.Tensor:
        """The rank: the static int, or the 0-d tensor when the rank is data."""
        return self.config.pcp_rank if self.rank is None else self.rank

    @property
    def device(self) -> torch.device:
        return self.num_scheduled.device


def init_state(
    config: PCPConfig,
    device: torch.device | str | None = None,
    *,
    rank: torch.Tensor | int | None = None,
) -> PCPState:
    """A state for ``config`` on ``device``: an empty batch at the capacity bucket.

    ``rank=None`` keeps the rank static (``config.pcp_rank``). Passing a rank
    (an int or a 0-d integer tensor, checked against ``pcp_size`` here) makes
    it a tensor leaf instead; ``config.pcp_rank`` is then ignored by the ops.
    """
    if not isinstance(config, PCPConfig):
        raise TypeError(f"config must be a PCPConfig, got {type(config).__name__}")
    device = torch.device(device) if device is not None else torch.device("cpu")
    check_device("device", device)  # a missing GPU named here, not in a torch internal
    R = config.max_num_reqs
    return PCPState(
        config=config,
        bucket=config.capacity,
        rank=rank_leaf(config.pcp_size, rank, device),
        num_reqs=torch.zeros((), dtype=torch.int64, device=device),
        num_scheduled=torch.zeros(R, dtype=torch.int32, device=device),
        num_computed=torch.zeros(R, dtype=torch.int32, device=device),
        is_decode=torch.zeros(R, dtype=torch.bool, device=device),
        constants={
            name: torch.tensor(values, dtype=torch.int64, device=device)
            for tables in (layout_constants(config.pcp_size), attention_constants(config.pcp_size))
            for name, values in tables.items()
        },
    )
