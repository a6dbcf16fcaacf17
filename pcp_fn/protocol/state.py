"""`PCPState`: the frozen pytree every facade op takes and returns, whatever the layout.

The config and the bucket of the last update are static tree structure; the
leaves are device tensors whose shapes depend on the config alone. What a
state holds is the per-request record of the last `update_tokens` (`[R]`
rows, the tail past `num_reqs` zero) and the bucket it was built for, so the
consumer ops (`get_logits_indices(state)`, `padded_slot_mapping(state,
slots)`, `restore_hidden_states(state, gathered)`, the spec-decode and
attention ops) return bucket-shaped outputs with no size argument: they
rebuild the per-token indices they need from the record, at the bucket's size.

The entry ops (`update_tokens`, `step`, `spec_step`) read only the
incoming state's `ENTRY_FIELDS` (its rank and constant tables), so a state
coming out of any step may be fed to the graph of any bucket.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from ..core.buckets import Bucket
from ..core.checks import check_device
from ..core.pytree import pytree_dataclass, static_field
from ..core.rank import rank_leaf
from .batch import SchedulerBatch
from .canonical import check_new_layout
from .config import PCPConfig


@pytree_dataclass
class PCPState:
    """PCP state of one rank.

    Attributes:
        config: static [`PCPConfig`][pcp_fn.PCPConfig].
        bucket: static [`Bucket`][pcp_fn.Bucket] of the last update (`config.capacity`
            for a fresh state): the shapes the consumer ops return.
        rank: `None` (the rank is `config.pcp_rank`, static) or a 0-d int64
            tensor (rank as data: every rank traces the same graph and
            `torch.func.vmap` can map over it).
        num_reqs: 0-d int64, requests of the last update.
        num_scheduled: `[R]` int32, scheduled tokens per request before the split.
        num_computed: `[R]` int32, tokens of each request already in the KV cache
            (a layout may balance its split on them).
        is_decode: `[R]` bool, decode requests of the last update (a prefix).
        constants: small int64 tables that depend on the config only, the layout's
            (its optional `constants(config)` hook: DualChunkSwap's chunk multipliers and
            attention index coefficients; none for a [`pcp_fn.PartitionLayout`][]),
            made on the device once here so that no op copies host data to the device
            (a synchronous, uncapturable copy inside a CUDA graph).
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
    """A state for `config` on `device`: an empty batch at the capacity bucket.

    `rank=None` keeps the rank static (`config.pcp_rank`). Passing a rank
    (an int or a 0-d integer tensor, checked against `pcp_size` here) makes
    it a tensor leaf instead; `config.pcp_rank` is then ignored by the ops.

    The first state of a config whose layout is not a built-in runs the layout once on a few
    canonical batches, eagerly, on the CPU ([`pcp_fn.protocol.canonical`][]): a layout that
    breaks a rule of [`pcp_fn.Layout`][] there is refused with a `ValueError`
    ([`pcp_fn.protocol.LayoutError`][]) before anything is served.
    """
    state = fresh_state(config, device, rank=rank)
    check_new_layout(config, fresh_state)
    return state


def fresh_state(
    config: PCPConfig,
    device: torch.device | str | None = None,
    *,
    rank: torch.Tensor | int | None = None,
) -> PCPState:
    """[`init_state`][pcp_fn.init_state] without its first run of a new layout on the canonical batches
    ([`pcp_fn.testing.check_layout`][] runs its own rules on the batches that run refused)."""
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
            for name, values in layout_constants(config).items()
        },
    )


def check_state(state: object, op: str) -> None:
    """`state` must be a [`PCPState`][pcp_fn.PCPState] (`TypeError` naming `op`, not an attribute error
    deep inside it)."""
    if not isinstance(state, PCPState):
        raise TypeError(f"{op} takes a PCPState (from init_state or an op), got {type(state).__name__}")


def check_batch(state: PCPState, batch: SchedulerBatch) -> None:
    """A batch built for another config, or a state that is not one, is an error.

    `make_batch` records the config it validated the batch for; a state of
    another config would silently truncate the layout.
    """
    if not isinstance(state, PCPState):
        raise TypeError(f"state must be a PCPState, got {type(state).__name__}")
    if not isinstance(batch, SchedulerBatch):
        raise TypeError(f"batch must be a SchedulerBatch, got {type(batch).__name__}")
    if batch.config != state.config.shared:
        raise ValueError(
            f"the batch was built for {batch.config}, the state is of {state.config} "
            "(ranks aside); build the batch with the state's config"
        )


def layout_constants(config: PCPConfig) -> dict[str, list]:
    """The config-only tables of `config`'s layout, as nested lists (its optional
    `constants(config)` hook; `{}` without one)."""
    tables = getattr(config.layout_impl, "constants", None)
    return {} if tables is None else tables(config)


def _to_capacity(x: torch.Tensor, rows: int) -> torch.Tensor:
    return F.pad(x, (0, rows - x.shape[0]))


def next_state(state: PCPState, batch: SchedulerBatch, is_decode: torch.Tensor) -> PCPState:
    """The state recording `batch`: its bucket, request count and per-request record at `[R]`.

    What a layout's `build` returns as the next state. Of `state` only the entry fields
    (rank, constants) are kept.
    """
    R = state.config.max_num_reqs
    return PCPState(
        config=state.config,
        bucket=batch.bucket,
        rank=state.rank,
        num_reqs=batch.num_reqs.to(torch.int64),
        num_scheduled=_to_capacity(batch.num_scheduled, R),
        num_computed=_to_capacity(batch.num_computed, R),
        is_decode=_to_capacity(is_decode, R),
        constants=state.constants,
    )
