"""The public layout protocol (:class:`Layout`), its registry, and the facade's entry op.

A *layout* decides which rank holds which scheduled token, and everything that
follows from it: positions, the restore of the all-gathered hidden states, the
padded KV slot mapping, the logits rows, the spec-decode prep's row maps. The
facade ops (:func:`update_tokens`, :func:`pcp_fn.step`, :func:`pcp_fn.get_logits_indices`,
:func:`pcp_fn.padded_slot_mapping`, :func:`pcp_fn.restore_hidden_states`), the
spec-decode prep (:mod:`pcp_fn.spec`), :func:`pcp_fn.graph.capture` and
:func:`pcp_fn.all_ranks` talk to it only through :class:`Layout`; which one serves a
config is ``PCPConfig(..., layout=name)`` (default ``"dcs"``, or ``"hybrid"`` when
``hybrid_attn``), looked up in a registry keyed by name.

Built-in layouts: ``"dcs"`` (DualChunkSwap, :mod:`pcp_fn.dcs`), ``"hybrid"``
(:mod:`pcp_fn.hybrid`), ``"mrv2"`` and ``"mrv2-sharded"`` (the vLLM model-runner-V2
partition, unpadded chunks, decodes replicated or dealt round-robin,
:class:`pcp_fn.partition.MRV2Partition`). A new partitioning subclasses
:class:`pcp_fn.partition.PartitionLayout` (it writes only which local rows hold
which token; restore, slots, logits and the spec maps are inherited) and checks
itself with :func:`pcp_fn.testing.check_layout`.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from . import dcs, hybrid
from .core.entry import entry_op
from .core.layout_protocol import Layout, available_layouts, get_layout, register_layout
from .dcs.batch import SchedulerBatch, dcs_num_local_tokens
from .dcs.config import PCPConfig
from .dcs.layout import (
    GatheredOrder,
    RequestGeometry,
    TokenLayout,
    state_geometry,
    state_order,
)
from .dcs.state import PCPState
from .partition import MRV2_PARTITION, MRV2_SHARDED


class PackageLayout:
    """A :class:`Layout` served by a package's functions (the built-in ``dcs`` and ``hybrid``).

    Both keep the DualChunkSwap request geometry and KV order (the hybrid layout
    writes its FA layers' KV in the DualChunkSwap order too).
    """

    def __init__(self, name: str, package: ModuleType) -> None:
        self.name = name
        self.package = package
        # bound once: the facade calls them every step
        self.build = package.build
        self.logits_from_geometry = package.logits_from_geometry
        self.restore_index = package.restore_index
        self.state_local_rows = package.state_local_rows
        self.state_local_start = package.state_local_start
        self.restored_spans = package.restored_spans
        self.first_pass_rows = package.first_pass_rows

    def __repr__(self) -> str:
        return f"PackageLayout({self.name!r}, {self.package.__name__})"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return get_layout, (self.name,)  # pickled by name (a config that holds it pickles)

    def num_local_tokens(
        self, config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int, num_computed: np.ndarray
    ) -> int:
        return dcs_num_local_tokens(config, num_scheduled, num_decodes)

    def state_geometry(self, state: PCPState) -> RequestGeometry:
        return state_geometry(state)

    def gathered_order(self, state: PCPState) -> GatheredOrder:
        return state_order(state)


DCS = PackageLayout("dcs", dcs)
HYBRID = PackageLayout("hybrid", hybrid)
__all__ = [
    "DCS",
    "HYBRID",
    "Layout",
    "PackageLayout",
    "available_layouts",
    "check_batch",
    "get_layout",
    "layout_of",
    "register_layout",
    "update_tokens",
]


def layout_of(config: PCPConfig) -> Layout:
    """The :class:`Layout` serving ``config`` (``config.layout``, from the registry)."""
    return config.layout_impl


def check_batch(state: PCPState, batch: SchedulerBatch) -> None:
    """A batch built for another config, or a bucket past the state's capacity, is an error.

    ``make_batch`` records the config it validated the batch for; a state of
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


@entry_op
def update_tokens(state: PCPState, batch: SchedulerBatch) -> tuple[PCPState, TokenLayout]:
    """Split the batch's tokens across ranks.

    vllm-ascend ``PCPManager.init_batch_info`` + ``update_tokens_for_pcp``.
    Reads only the incoming state's config and rank (:mod:`pcp_fn.core.entry`),
    so the result does not depend on earlier steps; the returned state records
    the batch and its bucket for the consumer ops. Example, ``P = 2``, tokens
    ``[1, 5, 8]`` (request 0 a decode): rank 0 gets ``pcp_tokens [1, 4, 4]`` and
    positions ``[0, 0, 1, 6, 7, 0, 1, 6, 7]``; rank 1 ``[0, 2, 3, 4, 5, 2, 3, 4, 5]``.

    The layout is the config's (:func:`layout_of`): with ``config.hybrid_attn`` a
    :class:`pcp_fn.hybrid.HybridLayout` (the linear split for the local rows, plus
    the FA index maps).
    """
    check_batch(state, batch)
    up = layout_of(state.config).build(state, batch)
    return up.state, up.layout


register_layout(DCS)
register_layout(HYBRID)
register_layout(MRV2_PARTITION)
register_layout(MRV2_SHARDED)
