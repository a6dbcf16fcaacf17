"""What differs between the vLLM releases ``FunctionalPCPManager`` serves, in one place.

vLLM's model-runner-V2 ``PCPManager`` (``vllm/v1/worker/gpu/pcp_manager.py``)
changed its contract between 0.32.0 and 0.34.0:

=======================  =====================================  ==========================================
                         0.32                                   0.33 / 0.34
=======================  =====================================  ==========================================
block tables             constructor                            constructor gets ``None``; the runner
                                                                calls ``set_block_tables`` after KV init
MoE routing mask         (none)                                 ``moe_gathers_tokens``: the local batch's
                                                                ``is_padding`` is the gathered
                                                                ``[P * Lp]`` mask; ``moe_is_padding``
capture / dummy staging  ``prepare_inputs_to_capture``          ``prepare_inputs_for_capture_or_profile``
draft inputs             ``get_draft_input_buffers(buffers)``   ``get_draft_input_buffers(buffers,
                                                                num_tokens) -> (inputs, is_padding)``
per-step metadata        ``dcp_local_seq_lens_cpu_upper_bound``  ``pcp: PCPBatchMetadata`` (0.33+)
drafts after sampling    (none)                                 ``sync_drafts`` (0.34; vLLM's, inherited)
=======================  =====================================  ==========================================

(vLLM main between 0.32 and 0.33 had the second column but the per-step
metadata of the first.) :func:`detect` reads which contract the installed vLLM
has from its ``PCPManager`` class and module, never from a user switch; the
manager (:mod:`pcp_fn.adapters.vllm.manager`) is one class over it: the
public methods whose names or signatures differ are a mixin picked here, and
the local batch's metadata fields come from :meth:`VllmContract.metadata_fields`.
This module imports no vLLM.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import numpy as np
import torch

from .engine_types import BlockTables, InputBatch, InputBuffers

#: The vLLM release series the drop-in is checked against (the current release and the two before
#: it); development builds of a series (``0.33.1.dev4+g...``) count as that series.
SUPPORTED_SERIES = ("0.32", "0.33", "0.34")


def vllm_series(version: str) -> str | None:
    """``"0.34"`` of ``"0.34.0"``, ``"0.32.0+cpu"`` or ``"0.33.1.dev4+gabc"``; ``None`` if unparsable."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return None if match is None else f"{int(match[1])}.{int(match[2])}"


def unsupported_reason(version: str) -> str | None:
    """Why the installed vLLM ``version`` is refused, or ``None`` when it is supported."""
    if vllm_series(version) in SUPPORTED_SERIES:
        return None
    supported = ", ".join(f"{s}.x" for s in SUPPORTED_SERIES)
    return (
        f"pcp_fn's FunctionalPCPManager supports vLLM {supported}; the installed vLLM is {version}. "
        "Install a supported vLLM or unset PCP_FN_PCP_MANAGER to use vLLM's own PCPManager."
    )


# --------------------------------------------------------------------------- the public methods


class _Methods032:
    """vLLM 0.32's names: block tables at construction, no MoE mask."""

    def prepare_inputs_to_capture(self, input_batch: InputBatch) -> InputBatch:
        """Stage a capture or dummy batch in the persistent local buffers (vLLM 0.32)."""
        return self.bookkeeper.stage_capture(input_batch)  # type: ignore[attr-defined]

    def get_draft_input_buffers(self, input_buffers: InputBuffers) -> InputBatch | InputBuffers:
        """The local batch while a draft prefill is prepared, else ``input_buffers`` (vLLM 0.32)."""
        return self.bookkeeper.draft_input_buffers(input_buffers)  # type: ignore[attr-defined]


class _Methods033:
    """vLLM 0.33's names (and vLLM main's between 0.32 and 0.33): late block tables, MoE mask."""

    def set_block_tables(self, block_tables: BlockTables | None) -> None:
        """Attach the KV block tables (the runner calls it after KV-cache init): the local block
        tables and slot-mapping buffers are allocated for them, once."""
        bookkeeper = self.__dict__.get("bookkeeper")
        if bookkeeper is None:  # from vLLM's constructor: its attributes as vLLM's leave them
            super().set_block_tables(block_tables)  # type: ignore[misc]
        else:
            bookkeeper.set_block_tables(block_tables)

    def moe_is_padding(self, is_padding: torch.Tensor) -> torch.Tensor:
        """A capture/dummy padding mask ``[n]``, the same on every rank, as the ``[P * n]`` rows the
        MoE routes (rank-major), in the persistent MoE mask; unchanged without ``moe_gathers_tokens``."""
        return self.bookkeeper.moe_is_padding(is_padding)  # type: ignore[attr-defined]

    def prepare_inputs_for_capture_or_profile(self, input_batch: InputBatch) -> InputBatch:
        """Stage a capture or dummy batch in the persistent local buffers; its ``is_padding`` is
        the MoE's gathered mask when the MoE all-gathers the tokens."""
        bookkeeper = self.bookkeeper  # type: ignore[attr-defined]
        staged = bookkeeper.stage_capture(input_batch)
        return dataclasses.replace(staged, is_padding=bookkeeper.moe_is_padding(staged.is_padding))

    def get_draft_input_buffers(
        self, input_buffers: InputBuffers, num_tokens: int
    ) -> tuple[InputBatch | InputBuffers, torch.Tensor]:
        """The draft inputs and their MoE routing mask: the local batch while a draft prefill is
        prepared, else ``input_buffers`` with its first ``num_tokens`` rows' mask."""
        return self.bookkeeper.draft_input_buffers(input_buffers, num_tokens)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the contract


@dataclasses.dataclass(frozen=True)
class VllmContract:
    """One vLLM release's ``PCPManager`` contract.

    Fields:
        name: ``"0.32"``, ``"0.33"`` or ``"0.34"`` (``"0.33-dev"``: vLLM main
            between 0.32 and 0.33, the 0.33 methods without the metadata class).
        methods: the mixin of the public methods whose names or signatures differ.
        moe_mask: the constructor takes ``moe_gathers_tokens``.
        batch_metadata: ``PCPBatchMetadata`` (the local batch's ``pcp`` field), or
            ``None`` (its ``dcp_local_seq_lens_cpu_upper_bound`` field).
    """

    name: str
    methods: type
    moe_mask: bool
    batch_metadata: type | None = None

    def metadata_fields(
        self,
        global_batch: InputBatch,
        num_scheduled: np.ndarray,
        rows: np.ndarray,
        dcp_upper: torch.Tensor | None,
    ) -> dict[str, Any]:
        """The local batch's per-step PCP metadata: ``rows [n]`` each local row's global request,
        ``dcp_upper`` the DCP rank 0 sequence-length bound ``[Rpad]`` (``None`` without DCP)."""
        if self.batch_metadata is None:
            return {"dcp_local_seq_lens_cpu_upper_bound": dcp_upper}
        upper = global_batch.seq_lens_cpu_upper_bound
        upper = upper.numpy() if isinstance(upper, torch.Tensor) else np.asarray(upper)
        return {
            "pcp": self.batch_metadata(
                global_num_tokens=global_batch.num_tokens,
                global_query_lens_np=num_scheduled[rows],
                global_seq_lens_cpu_upper_bound_np=upper[rows],
                dcp_local_seq_lens_cpu_upper_bound=dcp_upper,
            )
        }


VLLM_0_32 = VllmContract("0.32", _Methods032, moe_mask=False)


def detect(manager_cls: type, module: object) -> VllmContract:
    """The contract of a vLLM whose ``PCPManager`` is ``manager_cls``, defined in ``module``
    (``vllm.v1.worker.gpu.pcp_manager``; only its ``PCPBatchMetadata`` is read): read from what
    they provide."""
    if not hasattr(manager_cls, "set_block_tables"):
        return VLLM_0_32
    params = inspect.signature(manager_cls.__init__).parameters
    if "moe_gathers_tokens" not in params:
        raise ValueError(
            f"{manager_cls.__qualname__} has set_block_tables but no moe_gathers_tokens: a vLLM "
            "between the supported releases that pcp_fn was not checked against"
        )
    metadata = getattr(module, "PCPBatchMetadata", None)
    if hasattr(manager_cls, "sync_drafts"):
        # sync_drafts is vLLM's own (a broadcast of rank 0's drafts: nothing of the layout in it)
        return VllmContract("0.34", _Methods033, moe_mask=True, batch_metadata=metadata)
    return VllmContract(
        "0.33" if metadata else "0.33-dev", _Methods033, moe_mask=True, batch_metadata=metadata
    )
