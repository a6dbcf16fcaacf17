"""The body of `FunctionalAscendPCPManager`: vllm-ascend main's `AscendPCPManager` (model runner V2,
`vllm_ascend/worker/v2/pcp_manager.py`) on top of `FunctionalPCPManager`.

vllm-ascend's manager subclasses vLLM's MRV2 `PCPManager` (decodes replicated
on every rank) and adds:

- slot-mapping buffers in the block tables' slot dtype, and local input buffers
  of vllm-ascend's `AscendInputBuffers` (host `seq_lens_cpu` / `seq_lens_np`);
- `partition_batch(input_batch, padded_num_tokens, padded_num_reqs)`: the
  local rows of a speculative batch (draft counts by request, the layout at the
  largest rank), the padding of a decode-only batch to its graph (tokens to the
  global `num_tokens_after_padding`, request rows to it too for a
  FULL_DECODE_ONLY graph without drafts, else to `num_reqs_after_padding`;
  the local query start locations are then the global ones, FIA dummy request
  included), the local batch's `seq_lens_np` and `attn_state`;
- `prepare_slot_mappings`: when a decode-only graph pads past the layout, the
  gathered slot mappings rank by rank in the graph's layout
  `[rank 0 rows | rank 0 padding | rank 1 rows | ...]`;
- `restore_hidden_states` (and so `restore_for_sampling` and
  `restore_draft_prefill`): unchanged off the last pipeline stage; the
  global graph rows with the padding rows zeroed when the global batch is
  padded; `restore_hidden_state_buffer` restores a model-owned buffer in place;
- `prepare_dummy_attn` (dummy inputs staged in the persistent buffers),
  `get_dummy_block_tables` (bounded), `build_attention_context` (the global
  view attention metadata builders read: global batch, block tables and slot
  mappings, the layout's index maps);
- its own `validate_config`, `is_last_pp_rank`,
  `broadcast_replicated_hidden_states`.

[`FunctionalAscendPCPManagerMixin`][pcp_fn.adapters.vllm_ascend.v2.FunctionalAscendPCPManagerMixin]
has the same constructor and methods over [`pcp_fn.adapters.vllm.FunctionalPCPManagerMixin`][] and
its bookkeeper's public hooks ([`MRV2Bookkeeper`][pcp_fn.adapters.vllm.MRV2Bookkeeper]: one graph
per bucket, persistent buffers, host fields from the numpy twin); everything
vllm-ascend adds is host arithmetic on the scheduler's arrays or fixed-shape
device copies into those buffers. Differences from vllm-ascend, on purpose:
`validate_config` accepts `FULL` graphs, and `padded_num_reqs` pads the
request rows of a mixed batch (a FULL graph; vllm-ascend ignores the argument);
bad sizes are `ValueError` naming the field (vllm-ascend: `RuntimeError` or
an assertion).

[`make_functional_ascend_manager`][pcp_fn.adapters.vllm_ascend.make_functional_ascend_manager]
imports neither vLLM nor vllm-ascend: it takes their names
([`VllmApi`][pcp_fn.adapters.vllm.VllmApi], [`AscendApi`][pcp_fn.adapters.vllm_ascend.AscendApi]),
so the default suite builds it over a stand-in.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ....core.checks import check_int
from ...vllm.bookkeeper import MRV2Bookkeeper
from ...vllm.engine_types import BlockTables, CUDAGraphMode, GroupCoordinator, SpeculativeConfig, VllmConfig
from ...vllm.manager import FunctionalPCPManagerMixin, VllmApi, class_namespace
from ...vllm.replace import replace_fields
from .ascend_030 import AscendMethods030
from .contract import ASCEND_MAIN, AscendContract
from .engine_types import AscendInputBatch, AscendInputBuffers, AscendInputBuffersFactory
from .graph_padding import decode_graph_fields, rank_by_rank_slots, zero_padding_rows

SPEC_METHODS = ("mtp", "eagle3", "dspark")
"""The speculative methods vllm-ascend's MRV2 PCP accepts."""


@dataclasses.dataclass(frozen=True)
class PCPAttentionContext:
    """The global PCP view of one attention step (the fields of vllm-ascend's
    `AscendPCPAttentionContext`; used when vllm-ascend is absent).

    Attributes:
        global_batch: the global (or dummy) batch.
        global_block_tables: the global rows' block tables, `[R, B]` per KV-cache group.
        global_slot_mappings: `[K, num_tokens_after_padding]` global slot mappings.
        hidden_restore_idx: `[rows]` int64 gathered row of each global token.
        padded_gather_idx: `[P*Lp]` int64 global token of each gathered row (`None` for a dummy).
        gathered_kv_write_mask: `[P*Lp]` bool (`None` for a dummy).
        global_block_table_num_blocks: `[K, num_reqs]` allocated blocks per global request
            (DCP with a prefill only).
    """

    global_batch: AscendInputBatch
    global_block_tables: tuple[torch.Tensor, ...]
    global_slot_mappings: torch.Tensor
    hidden_restore_idx: torch.Tensor
    padded_gather_idx: torch.Tensor | None = None
    gathered_kv_write_mask: torch.Tensor | None = None
    global_block_table_num_blocks: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class AscendApi:
    """The vllm-ascend (and vLLM) names the Ascend additions use.

    Attributes:
        AscendInputBuffers: `vllm_ascend.worker.v2.input_batch.AscendInputBuffers`
            (keyword constructor `max_num_reqs, max_num_tokens, device`; host
            `seq_lens_np`).
        build_attn_state: `vllm_ascend.worker.v2.attn_utils.build_attn_state`
            `(vllm_config, seq_lens_np, num_reqs, num_scheduled_tokens, num_valid_tokens)`.
        get_pp_group: `vllm.distributed.get_pp_group` (`is_last_rank`).
        AttentionContext: `vllm_ascend.worker.v2.pcp_manager.AscendPCPAttentionContext`
            (keyword constructor with
            [`PCPAttentionContext`][pcp_fn.adapters.vllm_ascend.PCPAttentionContext]'s fields).
        AscendPCPManager: vllm-ascend's `AscendPCPManager`, the base of the drop-in of a line that
            subclasses it ([`AscendContract`][pcp_fn.adapters.vllm_ascend.v2.contract.AscendContract]'s
            `subclasses_ascend`).
        decode_sharding: vllm-ascend's decode placement rule of a config
            (`is_pcp_decode_sharding_enabled`; vllm-ascend 0.30).
        current_vllm_config: the config the manager is built under (`None` outside one): its first
            guess of the decode placement, until the runner sets `vllm_config`.
    """

    AscendInputBuffers: AscendInputBuffersFactory
    # -> vllm-ascend's AscendAttentionState (the local batch's attn_state, not read here); vllm-ascend
    # 0.30's also takes kv_cache_config=
    build_attn_state: Callable[..., object]
    get_pp_group: Callable[[], GroupCoordinator]
    AttentionContext: type = PCPAttentionContext
    AscendPCPManager: type | None = None
    decode_sharding: Callable[[Any], bool] | None = None
    current_vllm_config: Callable[[], Any] = lambda: None


@dataclasses.dataclass(frozen=True)
class _Desc:
    """The base manager's batch descriptor (`cg_mode`, `num_tokens`, `num_reqs`)."""

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None


class AscendBookkeeper(MRV2Bookkeeper):
    """The MRV2 bookkeeper with vllm-ascend's graph rows: `padded_num_reqs` as the runner gives
    it (vllm-ascend's runner passes the rows of its own graph; vLLM's MRV2 dispatcher, whose
    mixed FULL graphs the base widens, is not in play)."""

    # vllm-ascend's NPU attention backends are not checked against another prefill split
    serves_other_splits = False
    input_buffers: AscendInputBuffers | None  # (ascend_input_buffers)
    last_global_batch: AscendInputBatch | None
    last_local_batch: AscendInputBatch | None

    def full_rows(self, num_reqs: int, num_tokens: int, max_query_len: int | None) -> int:
        return num_reqs


def ascend_input_buffers(ascend_api: AscendApi) -> Callable[[int, int, torch.device], AscendInputBuffers]:
    """The local `InputBuffers` factory: vllm-ascend's `AscendInputBuffers` (host
    `seq_lens_cpu` / `seq_lens_np`) at vLLM's `query_start_loc` size."""

    def local_input_buffers(
        max_num_reqs: int, max_num_tokens: int, device: torch.device
    ) -> AscendInputBuffers:
        buffers = ascend_api.AscendInputBuffers(
            max_num_reqs=max_num_reqs, max_num_tokens=max_num_tokens, device=device
        )
        # vllm-ascend reserves one more query_start_loc entry (a FIA padding slot) that PCP never
        # uses: expose the vLLM-sized view, like vllm-ascend's manager
        buffers.query_start_loc = buffers.query_start_loc[: max_num_reqs + 1]
        return buffers

    return local_input_buffers


class FunctionalAscendPCPManagerMixin:
    """Drop-in for vllm-ascend main's `AscendPCPManager` (model runner V2), placed before
    [`FunctionalPCPManagerMixin`][pcp_fn.adapters.vllm.FunctionalPCPManagerMixin] over vLLM's `PCPManager`.

    The constructor is vllm-ascend's `AscendPCPManager`'s: decodes are replicated on every
    rank (vllm-ascend's base), the rest goes to the vLLM drop-in's.

    Args:
        pcp_world_size: `P`, the PCP group's size.
        pcp_rank: this rank of the PCP group.
        device: where the persistent buffers and the graphs live.
        req_states: vLLM's request states (kept for the runner, never read here).
        max_num_reqs: `R`, global requests per step.
        max_num_tokens: `T`, global scheduled tokens per step.
        block_tables: vLLM's `BlockTables`.
        dcp_world_size: decode context-parallel ranks.
        dcp_rank: this rank's decode context-parallel rank.
        cp_interleave: the KV interleave size.
        record_schedule: record every step's schedule to this trace file (default
            `$PCP_FN_RECORD_SCHEDULE`; [`pcp_fn.adapters.recording`][]).

    Attributes:
        vllm_api: the engine's names (a class attribute:
            [`VllmApi`][pcp_fn.adapters.vllm.VllmApi]).
        ascend_api: vllm-ascend's names (a class attribute:
            [`AscendApi`][pcp_fn.adapters.vllm_ascend.AscendApi]).
        vllm_config: set by the runner (as for vllm-ascend's manager); read for the
            CUDA-graph mode and passed to `build_attn_state`.
        req_states: the constructor's `req_states` (kept, unused: the
            bookkeeping needs none of it).
    """

    vllm_api: VllmApi
    ascend_api: AscendApi
    bookkeeper: AscendBookkeeper
    bookkeeper_cls = AscendBookkeeper
    vllm_config: VllmConfig | None = None

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: torch.device,
        req_states: Any = None,  # vLLM's RequestState: kept for the runner, never read here
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: BlockTables | None = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
        *,
        record_schedule: str | os.PathLike[str] | None = None,
    ) -> None:
        # vllm-ascend's base lays decode requests replicated on every rank
        super().__init__(  # type: ignore[call-arg]
            pcp_world_size=pcp_world_size,
            pcp_rank=pcp_rank,
            device=device,
            shard_decode_requests=False,
            max_num_reqs=max_num_reqs,
            max_num_tokens=max_num_tokens,
            block_tables=block_tables,
            dcp_world_size=dcp_world_size,
            dcp_rank=dcp_rank,
            cp_interleave=cp_interleave,
            record_schedule=record_schedule,
        )
        self.req_states = req_states
        # a dummy batch's restore rows (build_attention_context): views of one arange (none
        # without capacities: like the base's buffers)
        self._dummy_restore_idx = (
            None
            if max_num_tokens is None
            else torch.arange(
                pcp_world_size * max_num_tokens, dtype=torch.int64, device=self.bookkeeper.device
            )
        )
        # build_attention_context's views of the persistent buffers, by their sizes (a slice
        # costs a torch op; a steady batch asks the same ones every step)
        self._context_views = self.bookkeeper.schedule_cache.table("contexts")

    # ------------------------------------------------------------ config

    @classmethod
    def validate_config(cls, vllm_config: VllmConfig, supports_mm_inputs: bool) -> None:
        """vllm-ascend's checks, except that FULL CUDA graphs serve mixed batches too.

        Raises `NotImplementedError` (as vllm-ascend does) naming the feature PCP does not
        support here: encoder-decoder models, multimodal inputs, LoRA, speculative methods
        other than MTP / Eagle3 / DSpark or non-greedy draft sampling, data parallelism or
        sparse MLA with CUDA graphs other than `FULL_DECODE_ONLY`, and full CUDA graphs
        other than `FULL` / `FULL_DECODE_ONLY`. vllm-ascend also refuses `FULL`; the
        bookkeeping here is one graph per bucket, whatever the batch's composition.
        Like vllm-ascend's (and unlike vLLM's), DCP and pipeline parallelism are accepted.
        """
        parallel = vllm_config.parallel_config
        model = vllm_config.model_config
        if parallel.prefill_context_parallel_size <= 1:
            return
        if model.is_encoder_decoder:
            raise NotImplementedError("MRV2 PCP does not support encoder-decoder models yet.")
        if supports_mm_inputs:
            raise NotImplementedError("MRV2 PCP does not support multimodal (MM) inputs yet.")
        if vllm_config.lora_config is not None:
            raise NotImplementedError("MRV2 PCP does not support LoRA yet.")
        _check_speculative(vllm_config.speculative_config)
        Mode = cls.vllm_api.CUDAGraphMode
        mode = vllm_config.compilation_config.cudagraph_mode
        decode_only_graphs = mode in (Mode.NONE, Mode.FULL_DECODE_ONLY)
        if parallel.data_parallel_size > 1 and not decode_only_graphs:
            raise NotImplementedError(
                f"MRV2 PCP with data parallelism (data_parallel_size={parallel.data_parallel_size}) "
                f"supports eager mode or FULL_DECODE_ONLY CUDA graphs only; got {mode.name}."
            )
        if hasattr(model.hf_text_config, "index_topk") and not decode_only_graphs:
            raise NotImplementedError(
                "MRV2 sparse MLA PCP supports eager mode or FULL_DECODE_ONLY CUDA graphs only; "
                f"got {mode.name}."
            )
        if mode.has_full_cudagraphs() and mode not in (Mode.FULL, Mode.FULL_DECODE_ONLY):
            raise NotImplementedError(
                f"MRV2 PCP supports FULL or FULL_DECODE_ONLY CUDA graphs only; got {mode.name}."
            )

    # ------------------------------------------------------------ parallel groups

    @property
    def is_last_pp_rank(self) -> bool:
        """Whether this manager belongs to the last pipeline-parallel stage."""
        return bool(self.ascend_api.get_pp_group().is_last_rank)

    @property
    def global_batch(self) -> AscendInputBatch:
        """The global batch of the last `partition_batch`."""
        if self.bookkeeper.last_global_batch is None:
            raise RuntimeError("PCP global batch is unavailable before partition_batch().")
        return self.bookkeeper.last_global_batch

    @classmethod
    def broadcast_replicated_hidden_states(
        cls,
        last_hidden_states: torch.Tensor,
        hidden_states: torch.Tensor,
        num_tokens: int,
        replicated_pcp: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PCP rank 0's first `num_tokens` draft hidden rows on every rank, when the target's
        PCP rows are replicated (else both unchanged); broadcast once when both are one tensor."""
        if not replicated_pcp:
            return last_hidden_states, hidden_states
        group = cls.vllm_api.get_pcp_group()
        last = group.broadcast(last_hidden_states[:num_tokens].contiguous(), src=0)
        if hidden_states is last_hidden_states:
            return last, last
        return last, group.broadcast(hidden_states[:num_tokens].contiguous(), src=0)

    def persistent_buffers(self) -> dict[str, torch.Tensor]:
        named = super().persistent_buffers()  # type: ignore[misc]
        named["seq_lens_cpu"] = self.bookkeeper.input_buffers.seq_lens_cpu  # host twin of seq_lens_np
        named["dummy_restore_idx"] = self._dummy_restore_idx
        return named

    # ------------------------------------------------------------ partition

    def partition_batch(
        self,
        input_batch: AscendInputBatch,
        padded_num_tokens: int | None = None,
        padded_num_reqs: int | None = None,
    ) -> AscendInputBatch:
        """This rank's local `AscendInputBatch` (vllm-ascend `partition_batch`).

        The layout pads the local tokens to `padded_num_tokens` (default, and
        always for a speculative batch: the largest rank's). A decode-only batch
        is then padded to its graph: tokens to the global
        `num_tokens_after_padding`, request rows to it as well for a
        FULL_DECODE_ONLY graph without drafts (else to the global
        `num_reqs_after_padding`), with the global `query_start_loc_np` as the
        local one. Like vllm-ascend, `padded_num_reqs` is ignored for a
        decode-only batch; unlike vllm-ascend, it pads the request rows of a
        mixed batch (a FULL graph). `seq_lens_np`, `attn_state` and the local
        draft counts come from host arrays only.

        Raises:
            NotImplementedError: draft tokens on a prefill request.
            ValueError: no `num_draft_tokens_per_req` with draft tokens, a graph
                larger than the local buffers, a global `query_start_loc_np`
                shorter than the graph's rows, and as the base class.
        """
        global_batch = input_batch
        drafts = _checked_drafts(global_batch)
        desc = self._descriptor(global_batch, drafts is not None, padded_num_tokens, padded_num_reqs)
        local = self.bookkeeper.partition_batch(global_batch, desc)  # also the bookkeeper's last local batch
        changes = {} if drafts is None else self._draft_fields(global_batch, local, drafts)
        self._zero_padding_restore_rows(global_batch)
        changes.update(self._graph_padding(global_batch, local, drafts is not None))
        changes.update(self._attention_fields(local, changes))
        if drafts is not None or "num_tokens_after_padding" in changes:
            # a new batch: the drafter keeps the layout's (as vllm-ascend's base does)
            return replace_fields(local, changes)
        for field, value in changes.items():
            setattr(local, field, value)
        return local

    def _descriptor(
        self,
        global_batch: AscendInputBatch,
        spec: bool,
        padded_num_tokens: int | None,
        padded_num_reqs: int | None,
    ) -> _Desc:
        """The base's batch descriptor of vllm-ascend's padded sizes (ints, named here when not)."""
        Mode = self.vllm_api.CUDAGraphMode
        if padded_num_tokens is not None and padded_num_tokens.__class__ is not int:
            check_int("padded_num_tokens", padded_num_tokens, 0)
        if padded_num_reqs is not None and padded_num_reqs.__class__ is not int:
            check_int("padded_num_reqs", padded_num_reqs, 1)
        if (
            padded_num_reqs is not None and np.asarray(global_batch.is_prefilling_np).any()
        ):  # a FULL graph, mixed batch
            tokens = padded_num_tokens
            if tokens is None:
                tokens = self.get_num_tokens_for_dispatch(
                    global_batch.num_scheduled_tokens, global_batch.is_prefilling_np
                )
            return _Desc(Mode.FULL, tokens, padded_num_reqs)
        if spec or padded_num_tokens is None:
            return _Desc(Mode.NONE, 0, None)
        return _Desc(Mode.PIECEWISE, padded_num_tokens, None)

    def _draft_fields(
        self, global_batch: AscendInputBatch, local: AscendInputBatch, drafts: np.ndarray
    ) -> dict[str, Any]:
        """A speculative batch's local draft counts; padding rows read global token 0 (vllm-ascend
        re-gathers the ids)."""
        bookkeeper = self.bookkeeper
        Lp, num_local = local.num_tokens_after_padding, local.num_tokens
        if Lp > num_local:
            with bookkeeper.guard():
                bookkeeper.input_buffers.input_ids[num_local:Lp].copy_(
                    global_batch.input_ids[:1].expand(Lp - num_local)
                )
        local_drafts = drafts.astype(np.int32)[bookkeeper.local_rows]
        return dict(num_draft_tokens=int(local_drafts.sum()), num_draft_tokens_per_req=local_drafts)

    def _zero_padding_restore_rows(self, global_batch: AscendInputBatch) -> None:
        """The global batch's padding rows have no segment: their restore rows read gathered row 0."""
        restore_rows = int(global_batch.query_start_loc_np[-1])
        if restore_rows <= global_batch.num_tokens:
            return
        restore_idx = self.bookkeeper.hidden_restore_idx
        if restore_rows > restore_idx.shape[0]:
            raise ValueError(
                f"input_batch.query_start_loc_np ends at {restore_rows} tokens; "
                f"max_num_tokens is {self.bookkeeper.max_num_tokens}"
            )
        with self.bookkeeper.guard():
            restore_idx[global_batch.num_tokens : restore_rows].zero_()

    def _graph_padding(
        self, global_batch: AscendInputBatch, local: AscendInputBatch, spec: bool
    ) -> dict[str, Any]:
        """A decode-only batch's fields padded to its graph (none when it fits the layout)."""
        decode_only = self.bookkeeper.decode_only  # of the batch just partitioned
        if not decode_only:
            return {}
        graph_tokens = global_batch.num_tokens_after_padding
        token_sized = (
            not spec
            and self.vllm_config is not None
            and self.vllm_config.compilation_config.cudagraph_mode
            == self.vllm_api.CUDAGraphMode.FULL_DECODE_ONLY
        )
        graph_reqs = graph_tokens if token_sized else global_batch.num_reqs_after_padding
        if graph_tokens > local.num_tokens_after_padding or graph_reqs > local.num_reqs_after_padding:
            return decode_graph_fields(self.bookkeeper, global_batch, local, graph_tokens, graph_reqs)
        return {}

    def _attention_fields(self, local: AscendInputBatch, changes: dict[str, Any]) -> dict[str, Any]:
        """The local batch's `seq_lens_np` (at the padded rows) and `attn_state`."""
        n = local.num_reqs
        padded = changes.get("num_reqs_after_padding", local.num_reqs_after_padding)
        seq_lens = local.num_computed_tokens_np + local.num_scheduled_tokens
        if padded > n:
            buf = self.bookkeeper.input_buffers.seq_lens_np
            buf[:n] = seq_lens
            buf[n:padded] = 0
            seq_lens_np = buf[:padded]
        else:
            seq_lens_np = seq_lens
        valid = local.num_scheduled_tokens
        if "num_draft_tokens_per_req" in changes:
            valid = valid - changes["num_draft_tokens_per_req"]
        state = self.ascend_api.build_attn_state(
            self.vllm_config, seq_lens, n, local.num_scheduled_tokens, valid
        )
        return dict(seq_lens_np=seq_lens_np, attn_state=state)

    # ------------------------------------------------------------ attention

    def prepare_slot_mappings(self) -> torch.Tensor:
        """The gathered slot mappings; for a decode-only batch padded past the layout, in the
        graph's rank-major layout `[K, P * num_tokens_after_padding]` (each rank's rows, then
        `PAD_SLOT_ID` up to the graph's tokens)."""
        bookkeeper = self.bookkeeper
        slots = bookkeeper.prepare_slot_mappings()
        global_batch = bookkeeper.last_global_batch
        graph = global_batch.num_tokens_after_padding
        if not bookkeeper.decode_only or graph <= global_batch.num_tokens:
            return slots
        return rank_by_rank_slots(bookkeeper, slots, graph, self.vllm_api.PAD_SLOT_ID)

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        """Zeroed views of the persistent local block tables (capture and dummy runs)."""
        tables = self.bookkeeper.local_block_tables
        if not tables:
            raise RuntimeError("get_dummy_block_tables needs the block_tables given to the constructor")
        rows = tables[0].shape[0]
        if num_reqs > rows:
            raise ValueError(f"num_reqs={num_reqs} exceeds the local block tables' {rows} rows")
        return super().get_dummy_block_tables(num_reqs)  # type: ignore[misc]

    def prepare_dummy_attn(
        self, input_batch: AscendInputBatch
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Stage a dummy batch in the persistent local buffers (a FULL graph reads them) and
        return its zeroed block tables and `PAD_SLOT_ID` slot mappings."""
        ib = self.bookkeeper.input_buffers
        t, r = input_batch.num_tokens_after_padding, input_batch.num_reqs_after_padding
        # each staged field's rows, by its name (the same in InputBuffers and InputBatch)
        rows = {"input_ids": t, "positions": t, "is_padding": t, "query_start_loc": r + 1, "seq_lens": r}
        with self.bookkeeper.guard():
            torch._foreach_copy_(
                [getattr(ib, name)[:size] for name, size in rows.items()],
                [getattr(input_batch, name) for name in rows],
            )
        ib.seq_lens_np[:r] = input_batch.seq_lens_np[:r]
        return self.get_dummy_block_tables(r), self.get_dummy_slot_mappings(t)

    def build_attention_context(
        self,
        input_batch: AscendInputBatch | None = None,
        block_tables: tuple[torch.Tensor, ...] | None = None,
        slot_mappings: torch.Tensor | None = None,
    ) -> Any:
        """The global PCP view attention metadata builders read.

        A dummy batch (`input_batch.is_dummy`: capture, idle DP rank) is its own
        global batch: `block_tables` and this rank's slice of `slot_mappings`
        (`[K, P * num_tokens_after_padding]`), restore rows `rank * L .. rank * L + L`.
        Otherwise the last partitioned global batch, its block tables (the runner's
        tables, gathered), its slot mappings (`prepare_attn` computed them), the
        layout's `hidden_restore_idx`, `padded_gather_idx` and KV write mask, and
        with DCP and a prefill the allocated blocks of each global request.
        """
        if input_batch is not None and input_batch.is_dummy:
            return self._dummy_attention_context(input_batch, block_tables, slot_mappings)
        bookkeeper = self.bookkeeper
        global_batch = self.global_batch
        tables = bookkeeper.block_tables
        if tables is None:
            raise RuntimeError("build_attention_context needs the block_tables given to the constructor")
        num_blocks = None
        if bookkeeper.dcp_world_size > 1 and np.asarray(global_batch.is_prefilling_np).any():
            host = tables.num_blocks.np[:, global_batch.idx_mapping_np[: global_batch.num_reqs]]
            num_blocks = torch.from_numpy(host).to(device=bookkeeper.device, non_blocking=True)
        width = bookkeeper.layout_tokens * bookkeeper.pcp_world_size
        num_tokens = global_batch.num_tokens_after_padding
        restore_rows = int(global_batch.query_start_loc_np[-1])
        key = (num_tokens, restore_rows, width)
        views = self._context_views.get(key)
        if views is None:  # the context's fields that are views of the persistent buffers, by name
            views = bookkeeper.schedule_cache.put(
                "contexts",
                key,
                {
                    "global_slot_mappings": bookkeeper.global_slot_mappings[:, :num_tokens],
                    "hidden_restore_idx": bookkeeper.hidden_restore_idx[:restore_rows],
                    "padded_gather_idx": bookkeeper.padded_gather_idx[:width],
                    "gathered_kv_write_mask": bookkeeper.kv_write_mask[:width],
                },
            )
        return self.ascend_api.AttentionContext(
            global_batch=global_batch,
            global_block_tables=tables.gather_block_tables(
                global_batch.idx_mapping, global_batch.num_reqs_after_padding
            ),
            **views,
            global_block_table_num_blocks=num_blocks,
        )

    def _dummy_attention_context(
        self,
        input_batch: AscendInputBatch,
        block_tables: tuple[torch.Tensor, ...] | None,
        slot_mappings: torch.Tensor | None,
    ) -> Any:
        """A dummy batch's attention context (its own global batch)."""
        if block_tables is None or slot_mappings is None:
            raise ValueError("build_attention_context: a dummy batch needs block_tables and slot_mappings")
        bookkeeper = self.bookkeeper
        L, P, rank = input_batch.num_tokens_after_padding, bookkeeper.pcp_world_size, bookkeeper.pcp_rank
        if L > bookkeeper.max_num_tokens:
            raise ValueError(
                f"input_batch.num_tokens_after_padding={L} exceeds max_num_tokens={bookkeeper.max_num_tokens}"
            )
        return self.ascend_api.AttentionContext(
            global_batch=input_batch,
            global_block_tables=block_tables,
            global_slot_mappings=slot_mappings.view(slot_mappings.shape[0], P, L)[:, rank],
            hidden_restore_idx=self._dummy_restore_idx[rank * L : rank * L + L],
        )

    # ------------------------------------------------------------ hidden states

    def _restored_rows(self) -> tuple[int, int]:
        """`(num_tokens, rows)`: the global tokens and the rows a restore returns (the
        global graph's `num_tokens_after_padding` when the global batch is padded)."""
        global_batch = self.global_batch
        n, padded = global_batch.num_tokens, global_batch.num_tokens_after_padding
        if n == padded:
            return n, n
        rows = int(global_batch.query_start_loc_np[-1])  # the layout's restore rows (FIA padding included)
        if rows != padded:
            raise RuntimeError(
                "PCP restored hidden-state length does not match the global graph layout: "
                f"{rows} != {padded} (input_batch.query_start_loc_np[-1] must be "
                "num_tokens_after_padding)."
            )
        return n, rows

    def _padded(self, restored: torch.Tensor, n: int, rows: int) -> torch.Tensor:
        """A restore's `[rows, ...]` result with its rows past the `n` global tokens (the
        global graph's padding) zero; unchanged when there are none (the steady case)."""
        if n == rows:
            return restored
        with self.bookkeeper.guard():
            return zero_padding_rows(restored, n, rows)

    def _layout_rows(self, gathered: torch.Tensor) -> torch.Tensor:
        """`gathered` at the layout's `P * Lp` rows: a decode graph padded past the layout
        gathers `P * num_tokens_after_padding` rows, whose restored rows are all rank 0's."""
        bookkeeper = self.bookkeeper
        P, Lp, global_batch = (
            bookkeeper.pcp_world_size,
            bookkeeper.layout_tokens,
            bookkeeper.last_global_batch,
        )
        rows = gathered.shape[0]
        if rows == P * Lp or global_batch is None or not bookkeeper.decode_only:
            return gathered
        graph = global_batch.num_tokens_after_padding
        return gathered[: P * Lp] if graph > Lp and rows == P * graph else gathered

    def _gather(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """All-gather `hidden_states` over the PCP group, at the layout's rows."""
        return self._layout_rows(self.vllm_api.get_pcp_group().all_gather(hidden_states, dim=0))

    def restore_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """All-gather the ranks' local rows and put them in global order: `[num_tokens, ...]`,
        or the global graph's `[num_tokens_after_padding, ...]` with zero padding rows.
        Unchanged off the last pipeline stage and before the first `partition_batch`."""
        if not self.is_last_pp_rank or not self.bookkeeper.has_layout:
            return hidden_states
        gathered = self._gather(hidden_states)
        n, rows = self._restored_rows()
        return self._padded(self.bookkeeper.graphs.restore(gathered, rows), n, rows)

    def restore_hidden_state_buffer(self, hidden_states: torch.Tensor) -> None:
        """Restore a model-owned buffer in place: its first `Lp` rows (the layout's local
        tokens) are this rank's; the restored global rows overwrite its head."""
        if not self.is_last_pp_rank:
            return
        if not self.bookkeeper.has_layout:
            raise RuntimeError("restore_hidden_state_buffer: no batch was partitioned yet")
        restored = self.restore_hidden_states(hidden_states[: self.bookkeeper.layout_tokens])
        hidden_states[: restored.shape[0]].copy_(restored)

    def restore_for_sampling(
        self, hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None, AscendInputBatch]:
        """Restored hidden (and auxiliary) states, as `restore_hidden_states`, with the
        global batch to sample with."""
        global_batch = self.global_batch
        if not self.is_last_pp_rank:
            return hidden_states, aux_hidden_states, global_batch
        gathered = self._gather(hidden_states)  # collectives in vllm-ascend's order
        aux = None if aux_hidden_states is None else [self._gather(a) for a in aux_hidden_states]
        n, rows = self._restored_rows()
        hidden, aux = self.bookkeeper.graphs.restore_for_sampling(gathered, aux, rows)
        if aux is not None:
            aux = [self._padded(a, n, rows) for a in aux]
        return self._padded(hidden, n, rows), aux, global_batch

    def restore_draft_prefill(
        self, last_hidden_states: torch.Tensor, hidden_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's outputs restored as `restore_hidden_states` (once when both are
        the same tensor), when a draft prefill was prepared."""
        bookkeeper = self.bookkeeper
        if bookkeeper.draft_prefill_batch is None:
            return last_hidden_states, hidden_states
        bookkeeper.draft_prefill_batch = None
        if not self.is_last_pp_rank:
            return last_hidden_states, hidden_states
        last = self._gather(last_hidden_states)
        same = hidden_states is last_hidden_states
        other = last if same else self._gather(hidden_states)
        n, rows = self._restored_rows()
        last, other = bookkeeper.graphs.restore_draft_prefill(last, other, rows)
        last = self._padded(last, n, rows)
        return last, last if same else self._padded(other, n, rows)


def _check_speculative(spec: SpeculativeConfig | None) -> None:
    """vllm-ascend's speculative-decoding checks (`validate_config`)."""
    if spec is None:
        return
    if spec.method not in SPEC_METHODS:
        raise NotImplementedError(
            f"Ascend MRV2 PCP supports speculative decoding only with MTP, Eagle3 and "
            f"DSpark; got speculative method {spec.method!r}."
        )
    if spec.draft_sample_method != "greedy":
        raise NotImplementedError(
            "Ascend MRV2 PCP speculative decoding requires greedy draft sampling; got "
            f"draft_sample_method={spec.draft_sample_method!r}."
        )


def _checked_drafts(global_batch: AscendInputBatch) -> np.ndarray | None:
    """A speculative batch's draft counts by request (`None` without drafts)."""
    if not global_batch.num_draft_tokens > 0:
        return None
    drafts = global_batch.num_draft_tokens_per_req
    if drafts is None:
        raise ValueError("input_batch.num_draft_tokens_per_req is required when num_draft_tokens > 0")
    drafts = np.asarray(drafts)
    if np.any(drafts[np.asarray(global_batch.is_prefilling_np)] != 0):
        raise NotImplementedError(
            "PCP speculative decoding does not support draft tokens on prefill requests."
        )
    return drafts


def make_functional_ascend_manager(
    vllm_api: VllmApi,
    ascend_api: AscendApi,
    name: str = "FunctionalAscendPCPManager",
    contract: AscendContract = ASCEND_MAIN,
) -> type:
    """The drop-in class of vllm-ascend's line `contract` over the engine's names.

    vllm-ascend 0.30 ([`ASCEND_0_30`][pcp_fn.adapters.vllm_ascend.v2.contract.ASCEND_0_30]):
    `class name(AscendMethods030, vllm 0.30's methods, FunctionalPCPManagerMixin, AscendPCPManager)`,
    vllm-ascend's own members in its namespace where the contract inherits them. Main at 01af1b74:
    `class name(FunctionalAscendPCPManagerMixin, contract.methods, FunctionalPCPManagerMixin,
    vllm_api.PCPManager)`. Either with vllm-ascend's input buffers.

    Raises:
        ValueError: the line does not stand on the vLLM contract of `vllm_api`, or (0.30) no
            `ascend_api.AscendPCPManager` to subclass.
    """
    if vllm_api.contract.name not in contract.vllm:
        raise ValueError(
            f"vllm-ascend {contract.name}'s AscendPCPManager stands on vLLM {' / '.join(contract.vllm)}; "
            f"the vLLM contract given is {vllm_api.contract.name}"
        )
    api = dataclasses.replace(vllm_api, InputBuffers=ascend_input_buffers(ascend_api))
    if not contract.subclasses_ascend:
        bases = (
            FunctionalAscendPCPManagerMixin,
            api.contract.methods,
            FunctionalPCPManagerMixin,
            api.PCPManager,
        )
        namespace = class_namespace(
            name, FunctionalAscendPCPManagerMixin, vllm_api=api, ascend_api=ascend_api
        )
        return type(name, bases, {**namespace, "ascend_contract": contract})
    base = ascend_api.AscendPCPManager
    if base is None:
        raise ValueError(f"vllm-ascend {contract.name}'s drop-in subclasses its AscendPCPManager: none given")
    api = dataclasses.replace(api, PCPManager=base)
    namespace = class_namespace(name, AscendMethods030, vllm_api=api, ascend_api=ascend_api)
    namespace["ascend_contract"] = contract
    for member in contract.inherited:  # vllm-ascend's own, as they are
        namespace[member] = inspect.getattr_static(base, member)
    return type(name, (AscendMethods030, api.contract.methods, FunctionalPCPManagerMixin, base), namespace)
