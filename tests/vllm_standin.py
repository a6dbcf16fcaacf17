"""A small stand-in for the vLLM 0.32.0 classes the PCP manager touches, so the default suite needs no vllm.

It is NOT vLLM and holds none of vLLM's PCP logic. It mirrors only the
*interfaces* ``pcp_fn.adapters`` uses, field for field:

- ``InputBatch`` / ``InputBuffers``: the dataclass and the persistent buffers of
  ``vllm/v1/worker/gpu/input_batch.py`` (same field names, dtypes, order);
  ``InputBatch.make_dummy`` splits the tokens evenly like vLLM's.
- ``BatchExecutionDescriptor``, ``CUDAGraphMode``, ``PAD_SLOT_ID``: the values
  ``partition_batch`` reads.
- ``BlockTables``: block-table gather and slot mapping in plain torch. vLLM's
  are Triton kernels (no CPU backend), so the real-vLLM lockstep test uses this
  one too; both managers then get the same tables.
- ``FakePCPGroup``: an ``all_gather`` that returns what the test staged (one
  process plays every rank).
- ``PCPManager``: an empty base class (its constructor takes vLLM's arguments
  and keeps nothing) whose ``validate_config`` only records what it was asked
  (a spy); the adapter reimplements every method. ``PCPManager033`` /
  ``PCPManager034`` and ``PCPBatchMetadata`` are the names vLLM 0.33 and 0.34
  add (``set_block_tables``, ``moe_gathers_tokens``, ``sync_drafts``, the
  per-step metadata class; no logic): :func:`release` gives each release's.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any

import numpy as np
import torch

PAD_SLOT_ID = -1


class CUDAGraphMode(enum.Enum):
    """The modes of ``vllm.config.compilation.CUDAGraphMode`` and the two predicates the adapter uses."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (2, 0)
    FULL_AND_PIECEWISE = (2, 1)

    def separate_routine(self) -> bool:
        return isinstance(self.value, tuple)

    def has_full_cudagraphs(self) -> bool:
        return (max(self.value) if self.separate_routine() else self.value) == 2

    def __bool__(self) -> bool:
        return self is not CUDAGraphMode.NONE


@dataclasses.dataclass(frozen=True)
class BatchExecutionDescriptor:
    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1


class InputBuffers:
    def __init__(self, max_num_reqs: int, max_num_tokens: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.device = device
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.is_padding = torch.zeros(max_num_tokens, dtype=torch.bool, device=device)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.dcp_local_seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)


@dataclasses.dataclass
class InputBatch:
    req_ids: list[str]
    num_reqs: int
    num_reqs_after_padding: int
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    expanded_idx_mapping: torch.Tensor
    expanded_local_pos: torch.Tensor
    num_scheduled_tokens: np.ndarray
    num_tokens: int
    num_tokens_after_padding: int
    num_draft_tokens: int
    num_draft_tokens_per_req: np.ndarray | None
    query_start_loc: torch.Tensor
    query_start_loc_np: np.ndarray
    seq_lens: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor
    dcp_local_seq_lens: torch.Tensor | None
    num_computed_tokens_np: np.ndarray
    prefill_len_np: np.ndarray
    num_computed_prefill_tokens_np: np.ndarray
    is_prefilling_np: np.ndarray
    has_prefill: bool
    decode_graph_eligible: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    is_padding: torch.Tensor
    logits_indices: torch.Tensor
    cu_num_logits: torch.Tensor
    cu_num_logits_np: np.ndarray
    has_structured_output_reqs: bool
    prompt_lens: torch.Tensor | None
    max_seq_len_np: np.ndarray | None = None
    max_query_len: int | None = None
    fast_prefill: Any = None
    dcp_local_seq_lens_cpu_upper_bound: torch.Tensor | None = None
    prefill_runs_as_decode_np: np.ndarray | None = None
    pcp: Any = None  # vLLM 0.33+: PCPBatchMetadata

    @classmethod
    def make_dummy(
        cls, num_reqs: int, num_tokens: int, input_buffers: InputBuffers, max_query_len: int | None = None
    ) -> InputBatch:
        """A capture/profile batch: ``num_tokens`` split evenly over ``num_reqs`` (extra tokens last)."""
        device = input_buffers.device
        sched = np.full(num_reqs, num_tokens // num_reqs, dtype=np.int32)
        if num_tokens % num_reqs:
            sched[-(num_tokens % num_reqs) :] += 1
        qsl_np = np.zeros(num_reqs + 1, dtype=np.int32)
        np.cumsum(sched, out=qsl_np[1:])
        input_buffers.seq_lens[:num_reqs] = torch.from_numpy(sched)
        input_buffers.seq_lens[num_reqs:] = 0
        input_buffers.query_start_loc[: num_reqs + 1] = torch.from_numpy(qsl_np)
        input_buffers.query_start_loc[num_reqs + 1 :] = num_tokens
        input_buffers.is_padding[:num_tokens].fill_(True)
        qsl = input_buffers.query_start_loc[: num_reqs + 1]
        idx = torch.arange(num_reqs, dtype=torch.int64, device=device)
        values = dict(
            req_ids=[f"dummy_{i}" for i in range(num_reqs)],
            num_reqs=num_reqs,
            num_reqs_after_padding=num_reqs,
            idx_mapping=idx,
            idx_mapping_np=np.arange(num_reqs, dtype=np.intp),
            expanded_idx_mapping=idx,
            expanded_local_pos=torch.zeros(num_reqs, dtype=torch.int32, device=device),
            num_scheduled_tokens=sched,
            num_tokens=num_tokens,
            num_tokens_after_padding=num_tokens,
            num_draft_tokens=0,
            num_draft_tokens_per_req=None,
            query_start_loc=qsl,
            query_start_loc_np=qsl_np,
            seq_lens=input_buffers.seq_lens[:num_reqs],
            seq_lens_cpu_upper_bound=torch.from_numpy(sched.copy()),
            dcp_local_seq_lens=None,
            num_computed_tokens_np=np.zeros(num_reqs, dtype=np.int32),
            prefill_len_np=np.zeros(num_reqs, dtype=np.int32),
            num_computed_prefill_tokens_np=np.zeros(num_reqs, dtype=np.int32),
            is_prefilling_np=np.zeros(num_reqs, dtype=np.bool_),
            has_prefill=False,
            decode_graph_eligible=True,
            input_ids=input_buffers.input_ids[:num_tokens].zero_(),
            positions=input_buffers.positions[:num_tokens].zero_(),
            is_padding=input_buffers.is_padding[:num_tokens],
            logits_indices=qsl[1:] - 1,
            cu_num_logits=torch.arange(num_reqs + 1, dtype=torch.int32, device=device),
            cu_num_logits_np=np.arange(num_reqs + 1, dtype=np.int32),
            has_structured_output_reqs=False,
            prompt_lens=None,
            max_query_len=max_query_len,
        )
        names = {f.name for f in dataclasses.fields(cls)}  # (InputBatch030 has fewer fields)
        return cls(**{k: v for k, v in values.items() if k in names})


#: vLLM 0.32+'s fields of ``InputBatch`` that vLLM 0.30's lacks (``pcp``: 0.33+)
_FIELDS_SINCE_032 = ("decode_graph_eligible", "max_seq_len_np", "prefill_runs_as_decode_np", "pcp")

InputBatch030 = dataclasses.make_dataclass(
    "InputBatch030",
    [(f.name, f.type, f) for f in dataclasses.fields(InputBatch) if f.name not in _FIELDS_SINCE_032],
    namespace={"make_dummy": InputBatch.__dict__["make_dummy"]},
)
InputBatch030.__doc__ = "vLLM 0.30's ``InputBatch``: 0.32's without its graph fields (and the 0.33+ ``pcp``)."


class HostMirrored:
    """vLLM's ``UvaBackedTensor``: one buffer seen as ``.gpu`` (a tensor) and ``.np`` (numpy)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.gpu = tensor
        self.np = tensor.numpy()  # CPU only: the stand-in's tables live on the CPU


class BlockTables:
    """Paged block tables in plain torch (the interface of ``vllm/v1/worker/gpu/block_table.py``).

    ``tables[g]`` is ``[max_num_reqs, max_blocks]`` int32 block ids per request
    state; ``num_blocks[g, r]`` the valid entries of row ``r``. Slot of a token
    at ``position``: ``table[r, position // block_size] * block_size +
    position % block_size`` (``cp_size == 1``), or the interleaved local slot
    under DCP (tokens owned by another DCP rank get ``PAD_SLOT_ID``).
    """

    def __init__(
        self,
        block_sizes: list[int],
        max_num_reqs: int,
        max_num_batched_tokens: int,
        max_num_blocks_per_group: list[int],
        device: torch.device,
        cp_size: int = 1,
        cp_rank: int = 0,
        cp_interleave: int = 1,
    ) -> None:
        self.block_sizes = block_sizes
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.cp_size, self.cp_rank, self.cp_interleave = cp_size, cp_rank, cp_interleave
        self.num_kv_cache_groups = len(block_sizes)
        self.tables = [
            torch.zeros(max_num_reqs, b, dtype=torch.int32, device=device) for b in max_num_blocks_per_group
        ]
        self.num_blocks = HostMirrored(
            torch.zeros(self.num_kv_cache_groups, max_num_reqs, dtype=torch.int32, device=device)
        )
        self.input_block_tables = [torch.zeros_like(t) for t in self.tables]
        self.slot_mappings = torch.zeros(
            self.num_kv_cache_groups, max_num_batched_tokens, dtype=torch.int64, device=device
        )

    def set_row(self, req_state_idx: int, block_ids: list[list[int]]) -> None:
        for g, ids in enumerate(block_ids):
            self.tables[g][req_state_idx, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
            self.num_blocks.gpu[g, req_state_idx] = len(ids)

    def gather_block_tables(
        self,
        idx_mapping: torch.Tensor,
        num_reqs_padded: int,
        out: tuple[torch.Tensor, ...] | None = None,
        out_ptrs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        out = tuple(self.input_block_tables) if out is None else out
        n = idx_mapping.shape[0]
        for g, (src, dst) in enumerate(zip(self.tables, out)):
            cols = torch.arange(src.shape[1], device=src.device)
            rows = src[idx_mapping]
            valid = cols[None, :] < self.num_blocks.gpu[g, idx_mapping][:, None]
            dst[:n] = torch.where(valid, rows, dst[:n])  # the kernel copies the valid blocks only
            dst[n:num_reqs_padded] = 0
        return tuple(t[:num_reqs_padded] for t in out)

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[:num_reqs].zero_() for t in self.input_block_tables)

    def compute_slot_mappings(
        self,
        idx_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        positions: torch.Tensor,
        num_tokens_padded: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = self.slot_mappings if out is None else out
        n = idx_mapping.shape[0]
        qsl = query_start_loc[: n + 1].to(torch.int64)
        total = int(qsl[-1])
        req = torch.repeat_interleave(torch.arange(n, device=qsl.device), qsl[1:] - qsl[:-1])
        pos = positions[:total]
        state = idx_mapping[req]
        out.fill_(PAD_SLOT_ID)
        for g, (table, bs) in enumerate(zip(self.tables, self.block_sizes)):
            local, mine = pos, torch.ones_like(pos, dtype=torch.bool)
            if self.cp_size > 1:
                span = bs * self.cp_size
                block, off = pos // span, pos % span
                mine = (off // self.cp_interleave) % self.cp_size == self.cp_rank
                local = (
                    block * bs
                    + (off // (self.cp_interleave * self.cp_size)) * self.cp_interleave
                    + (off % self.cp_interleave)
                )
            slot = table[state, local // bs].to(torch.int64) * bs + local % bs
            out[g, :total] = torch.where(mine & (state >= 0), slot, PAD_SLOT_ID)
        return out[:, :num_tokens_padded]

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        self.slot_mappings.fill_(PAD_SLOT_ID)
        return self.slot_mappings[:, :num_tokens]


class FakePCPGroup:
    """``all_gather`` for one process playing every rank: :meth:`stage` registers the ranks'
    local tensors; gathering any of them returns their rank-major concatenation."""

    def __init__(self) -> None:
        self._staged: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.broadcast_from: list[torch.Tensor] = []
        self.calls = 0

    def stage(self, locals_: list[torch.Tensor]) -> torch.Tensor:
        gathered = torch.cat(locals_)
        for t in locals_:
            self._staged[id(t)] = (t, gathered)  # keep t alive: its id stays unique
        return gathered

    def clear(self) -> None:
        self._staged.clear()

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s tensor (``broadcast_from[src]``, set by the test), in ``tensor``'s shape."""
        self.calls += 1
        source = self.broadcast_from[src]
        assert source.shape == tensor.shape, (source.shape, tensor.shape)
        return source.clone()

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        assert dim == 0 and id(tensor) in self._staged, "all_gather of a tensor no rank staged"
        self.calls += 1
        return self._staged[id(tensor)][1]


PCP_GROUP = FakePCPGroup()


def get_pcp_group() -> FakePCPGroup:
    return PCP_GROUP


def vllm_api_fields(**overrides: Any) -> dict[str, Any]:
    """The stand-in's names for ``pcp_fn.adapters.vllm.manager.VllmApi``
    (``VllmApi(**vllm_api_fields())``), with ``overrides`` replacing some."""
    fields = dict(
        PCPManager=PCPManager,
        InputBuffers=InputBuffers,
        CUDAGraphMode=CUDAGraphMode,
        PAD_SLOT_ID=PAD_SLOT_ID,
        get_pcp_group=get_pcp_group,
    )
    return fields | overrides


class PCPManager:
    """Stand-in base class: no behaviour. ``validate_config`` records its arguments (a spy)."""

    validated: list[tuple[Any, bool]] = []  # noqa: RUF012

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's constructor signature; the stand-in keeps no state (vLLM's sets its own)."""

    @staticmethod
    def validate_config(vllm_config: Any, supports_mm_inputs: bool) -> None:
        PCPManager.validated.append((vllm_config, supports_mm_inputs))


class PCPManager030(PCPManager):
    """vLLM 0.30's ``partition_batch`` form (the padded sizes; no logic: the drop-in overrides it)."""

    def partition_batch(
        self, input_batch: Any, padded_num_tokens: Any = None, padded_num_reqs: Any = None
    ) -> Any:
        raise NotImplementedError("a stand-in: the drop-in's own partition_batch serves")


class PCPManager033(PCPManager):
    """vLLM 0.33's constructor: ``moe_gathers_tokens``, and the block tables attached through
    ``set_block_tables`` (which vLLM's constructor calls too)."""

    def __init__(self, *args: Any, moe_gathers_tokens: bool = False, **kwargs: Any) -> None:
        self.set_block_tables(None)

    def set_block_tables(self, block_tables: Any) -> None:
        self._block_tables = block_tables


class PCPManager034(PCPManager033):
    """vLLM 0.34 adds ``sync_drafts`` (a broadcast of rank 0's drafts; nothing to broadcast here)."""

    def sync_drafts(self, draft_tokens: Any, idx_mapping: Any, draft_logits: Any) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class PCPBatchMetadata:
    """``vllm.v1.worker.gpu.pcp_manager.PCPBatchMetadata`` (vLLM 0.33+), its fields."""

    global_num_tokens: int
    global_query_lens_np: np.ndarray
    global_seq_lens_cpu_upper_bound_np: np.ndarray
    dcp_local_seq_lens_cpu_upper_bound: torch.Tensor | None = None


#: release -> (its PCPManager stand-in, whether its module has PCPBatchMetadata)
_RELEASES = {
    "0.30": (PCPManager030, False),
    "0.32": (PCPManager, False),
    "0.33-dev": (PCPManager033, False),
    "0.33": (PCPManager033, True),
    "0.34": (PCPManager034, True),
}


def release(name: str) -> tuple[type, Any]:
    """The stand-in ``PCPManager`` class and ``pcp_manager`` module (its names only) of vLLM release
    ``name`` (``"0.30"``, ``"0.32"``, ``"0.33-dev"``, ``"0.33"``, ``"0.34"``), for
    ``pcp_fn.adapters.vllm.contract.detect``."""
    cls, has_metadata = _RELEASES[name]
    module = types.SimpleNamespace(PCPManager=cls)
    if has_metadata:
        module.PCPBatchMetadata = PCPBatchMetadata
    return cls, module


# ------------------------------------------------------------------ vllm-ascend main (model runner V2)
# The fields and names of vllm_ascend/worker/v2 the Ascend PCP manager reads or writes; no Ascend logic.


class AscendAttentionState(enum.Enum):
    """``vllm_ascend.attention.attention_v1.AscendAttentionState`` (names only)."""

    PrefillNoCache = 0
    PrefillCacheHit = 1
    DecodeOnly = 2
    ChunkedPrefill = 3
    SpecDecoding = 4


def build_attn_state(
    vllm_config: Any,
    seq_lens_np: np.ndarray,
    num_reqs: int,
    num_scheduled_tokens: np.ndarray,
    num_valid_tokens: np.ndarray,
) -> AscendAttentionState:
    """Stand-in of ``vllm_ascend.worker.v2.attn_utils.build_attn_state`` (its signature; a simple
    rule over the same host arrays, so a wrong argument gives a wrong state)."""
    seq, sched, valid = seq_lens_np[:num_reqs], num_scheduled_tokens[:num_reqs], num_valid_tokens[:num_reqs]
    if np.array_equal(seq, sched):
        return AscendAttentionState.PrefillNoCache
    if np.all(sched == 1):
        return AscendAttentionState.DecodeOnly
    if np.all(valid == 1):
        return AscendAttentionState.SpecDecoding
    return AscendAttentionState.ChunkedPrefill


def ascend_classes(input_batch: type, input_buffers: type) -> tuple[type, type]:
    """vllm-ascend's ``AscendInputBatch`` and ``AscendInputBuffers``
    (``vllm_ascend/worker/v2/input_batch.py``) over vLLM's ``input_batch`` / ``input_buffers``
    (the stand-in's, or the installed vLLM's): the host sequence lengths and the attention
    state on the batch; one more ``query_start_loc`` entry (a FIA padding slot) and host
    ``seq_lens_cpu`` with its numpy view ``seq_lens_np`` on the buffers."""

    @dataclasses.dataclass
    class AscendInputBatch(input_batch):  # type: ignore[valid-type,misc]
        seq_lens_np: np.ndarray | None = None
        attn_state: Any = None
        is_dummy: bool = False

    class AscendInputBuffers(input_buffers):  # type: ignore[valid-type,misc]
        def __init__(self, max_num_reqs: int, max_num_tokens: int, device: torch.device):
            super().__init__(max_num_reqs, max_num_tokens, device)
            self.query_start_loc = torch.zeros(max_num_reqs + 2, dtype=torch.int32, device=device)
            self.seq_lens_cpu = torch.zeros(max_num_reqs, dtype=torch.int32)
            self.seq_lens_np = self.seq_lens_cpu.numpy()

    return AscendInputBatch, AscendInputBuffers


AscendInputBatch, AscendInputBuffers = ascend_classes(InputBatch, InputBuffers)


class AscendBlockTables(BlockTables):
    """Block tables whose slot mappings are int32 (the Ascend cache-write operators' dtype)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot_mappings = self.slot_mappings.to(torch.int32)


class PPGroup:
    """``get_pp_group()``: ``is_last_rank`` (set it to play another stage)."""

    is_last_rank = True


PP_GROUP = PPGroup()


def get_pp_group() -> PPGroup:
    return PP_GROUP


# ------------------------------------------------------------------ the release contracts, signatures only
# vLLM 0.32.0 / 0.34.0's PCPManager public methods and maybe_build_pcp_manager, as callers see them
# (names, kinds, defaults; no behaviour): what pcp_fn.adapters.vllm.contract's canary compares.


class SignaturesPCPManager032:
    """vLLM 0.32.0's ``PCPManager`` public API (signatures only)."""

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: Any,
        shard_decode_requests: bool,
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: Any = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
    ) -> None: ...

    @staticmethod
    def validate_config(vllm_config: Any, supports_mm_inputs: bool) -> None: ...

    @property
    def input_buffers(self) -> Any: ...

    @property
    def global_batch(self) -> Any: ...

    def replicated_requests(self, num_scheduled_tokens: Any, is_prefilling: Any) -> Any: ...
    def get_num_tokens_for_dispatch(self, num_scheduled_tokens: Any, is_prefilling: Any) -> int: ...
    def partition_batch(self, input_batch: Any, batch_desc: Any) -> Any: ...
    def prepare_inputs_to_capture(self, input_batch: Any) -> Any: ...
    def get_dummy_block_tables(self, num_reqs: int) -> Any: ...
    def prepare_attn(self, input_batch: Any) -> Any: ...
    def prepare_slot_mappings(self) -> Any: ...
    def get_dummy_slot_mappings(self, num_tokens: int) -> Any: ...
    def restore_hidden_states(self, hidden_states: Any) -> Any: ...
    def get_draft_input_buffers(self, input_buffers: Any) -> Any: ...
    def prepare_draft_prefill(self, input_batch: Any, input_ids: Any) -> None: ...
    def restore_draft_prefill(self, last_hidden_states: Any, hidden_states: Any) -> Any: ...
    def restore_for_sampling(self, hidden_states: Any, aux_hidden_states: Any) -> Any: ...


class SignaturesPCPManager030(SignaturesPCPManager032):
    """vLLM 0.30.0's: no decode sharding, the padded sizes, no auxiliary restores, no ``global_batch``."""

    global_batch = None  # type: ignore[assignment]  (0.32's addition)

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: Any,
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: Any = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
    ) -> None: ...

    def partition_batch(
        self, input_batch: Any, padded_num_tokens: Any = None, padded_num_reqs: Any = None
    ) -> Any: ...
    def restore_for_sampling(self, hidden_states: Any) -> Any: ...  # type: ignore[override]


class SignaturesPCPManager034(SignaturesPCPManager032):
    """vLLM 0.34.0's: the MoE flag, late block tables, the 0.33 capture and draft names, ``sync_drafts``."""

    prepare_inputs_to_capture = None  # type: ignore[assignment]  (gone in 0.33)

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: Any,
        shard_decode_requests: bool,
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: Any = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
        moe_gathers_tokens: bool = False,
    ) -> None: ...

    def set_block_tables(self, block_tables: Any) -> None: ...
    def prepare_inputs_for_capture_or_profile(self, input_batch: Any) -> Any: ...
    def moe_is_padding(self, is_padding: Any) -> Any: ...
    def get_draft_input_buffers(self, input_buffers: Any, num_tokens: int) -> Any: ...
    def sync_drafts(self, draft_tokens: Any, idx_mapping: Any, draft_logits: Any) -> None: ...


def maybe_build_pcp_manager_030(
    vllm_config: Any, device: Any, supports_mm_inputs: bool, block_tables: Any, cls: type = PCPManager
) -> Any:
    """vLLM 0.30.0's ``maybe_build_pcp_manager``: no ``shard_decode_requests``."""
    return cls(
        pcp_world_size=2,
        pcp_rank=0,
        device=device,
        max_num_reqs=1,
        max_num_tokens=1,
        block_tables=block_tables,
        dcp_world_size=1,
        dcp_rank=0,
        cp_interleave=1,
    )


def maybe_build_pcp_manager_032(
    vllm_config: Any, device: Any, supports_mm_inputs: bool, block_tables: Any, cls: type = PCPManager
) -> Any:
    """vLLM 0.32.0's ``maybe_build_pcp_manager``: the keywords it passes the manager class."""
    return cls(
        pcp_world_size=2,
        pcp_rank=0,
        device=device,
        shard_decode_requests=True,
        max_num_reqs=1,
        max_num_tokens=1,
        block_tables=block_tables,
        dcp_world_size=1,
        dcp_rank=0,
        cp_interleave=1,
    )


def maybe_build_pcp_manager_034(
    vllm_config: Any, device: Any, supports_mm_inputs: bool, block_tables: Any = None, cls: type = PCPManager
) -> Any:
    """vLLM 0.34.0's ``maybe_build_pcp_manager`` (0.33's too)."""
    return cls(
        pcp_world_size=2,
        pcp_rank=0,
        device=device,
        shard_decode_requests=True,
        max_num_reqs=1,
        max_num_tokens=1,
        block_tables=block_tables,
        dcp_world_size=1,
        dcp_rank=0,
        cp_interleave=1,
        moe_gathers_tokens=False,
    )
