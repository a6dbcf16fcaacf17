"""``PCPState``: the frozen pytree every op takes and returns.

The config is static tree structure; the leaves are device tensors whose shapes
depend on the config alone, never on a batch or its bucket. So any state can be
fed to a step compiled, exported or captured for any bucket: the state's
signature never changes from one step to the next.

What a state holds is the per-request record of the last ``update_tokens``
(``[R]`` rows, the tail past ``num_reqs`` zero). Ops that need per-token
indices rebuild them from it at the size they are asked for (a few index
kernels), so nothing ``[G]``-sized is carried between ops.
"""

from __future__ import annotations

import torch

from .config import PCPConfig
from .pytree import pytree_dataclass, static_field


@pytree_dataclass
class PCPState:
    """PCP state of one rank.

    Fields:
        config: static :class:`PCPConfig`.
        rank: ``None`` (the rank is ``config.pcp_rank``, static) or a 0-d int64
            tensor (rank as data: every rank traces the same graph and
            ``torch.func.vmap`` can map over it).
        num_reqs: 0-d int64, requests of the last update.
        num_scheduled: ``[R]`` int32, scheduled tokens per request before the split.
        is_decode: ``[R]`` bool, decode requests of the last update (a prefix).
        constants: small int64 tables that depend on the config only (the
            attention index coefficients), made on the device once here so
            that no op copies host data to the device (a synchronous,
            uncapturable copy inside a CUDA graph).
    """

    config: PCPConfig = static_field()
    rank: torch.Tensor | None
    num_reqs: torch.Tensor
    num_scheduled: torch.Tensor
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
    """Allocate a state for ``config`` on ``device``, every buffer at capacity.

    ``rank=None`` keeps the rank static (``config.pcp_rank``). Passing a rank
    (an int or a 0-d tensor) makes it a tensor leaf instead; ``config.pcp_rank``
    is then ignored by the ops.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    R = config.max_num_reqs
    rank_leaf = None
    if isinstance(rank, int) and not 0 <= rank < config.pcp_size:
        raise ValueError(f"rank must be in [0, pcp_size={config.pcp_size}), got {rank}")
    if rank is not None:
        rank_leaf = torch.as_tensor(rank, dtype=torch.int64).to(device)
        if rank_leaf.dim() != 0:
            raise ValueError(f"rank must be a 0-d tensor or an int, got shape {tuple(rank_leaf.shape)}")
    from .attention import attention_constants  # the only tables so far

    return PCPState(
        config=config,
        rank=rank_leaf,
        num_reqs=torch.zeros((), dtype=torch.int64, device=device),
        num_scheduled=torch.zeros(R, dtype=torch.int32, device=device),
        is_decode=torch.zeros(R, dtype=torch.bool, device=device),
        constants={
            name: torch.tensor(values, dtype=torch.int64, device=device)
            for name, values in attention_constants(config.pcp_size).items()
        },
    )
