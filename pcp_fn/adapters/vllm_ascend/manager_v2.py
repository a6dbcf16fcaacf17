"""The body of ``FunctionalAscendPCPManager``: vllm-ascend main's ``AscendPCPManager`` (model runner V2,
``vllm_ascend/worker/v2/pcp_manager.py``) on top of ``FunctionalPCPManager``.

vllm-ascend's manager subclasses vLLM's MRV2 ``PCPManager`` (decodes replicated
on every rank) and adds:

- slot-mapping buffers in the block tables' slot dtype, and local input buffers
  of vllm-ascend's ``AscendInputBuffers`` (host ``seq_lens_cpu`` / ``seq_lens_np``);
- ``partition_batch(input_batch, padded_num_tokens, padded_num_reqs)``: the
  local rows of a speculative batch (draft counts by request, the layout at the
  largest rank), the padding of a decode-only batch to its graph (tokens to the
  global ``num_tokens_after_padding``, request rows to it too for a
  FULL_DECODE_ONLY graph without drafts, else to ``num_reqs_after_padding``;
  the local query start locations are then the global ones, FIA dummy request
  included), the local batch's ``seq_lens_np`` and ``attn_state``;
- ``prepare_slot_mappings``: when a decode-only graph pads past the layout, the
  gathered slot mappings rank by rank in the graph's layout
  ``[rank 0 rows | rank 0 padding | rank 1 rows | ...]``;
- ``restore_hidden_states`` (and so ``restore_for_sampling`` and
  ``restore_draft_prefill``): unchanged off the last pipeline stage; the
  global graph rows with the padding rows zeroed when the global batch is
  padded; ``restore_hidden_state_buffer`` restores a model-owned buffer in place;
- ``prepare_dummy_attn`` (dummy inputs staged in the persistent buffers),
  ``get_dummy_block_tables`` (bounded), ``build_attention_context`` (the global
  view attention metadata builders read: global batch, block tables and slot
  mappings, the layout's index maps);
- its own ``validate_config``, ``is_last_pp_rank``,
  ``broadcast_replicated_hidden_states``.

The class built here has the same constructor and methods over the bookkeeping
of :func:`pcp_fn.adapters.vllm_manager.make_functional_manager` (one graph per
bucket, persistent buffers, host fields from the numpy twin); everything
vllm-ascend adds is host arithmetic on the scheduler's arrays or fixed-shape
device copies into those buffers. Differences from vllm-ascend, on purpose:
``validate_config`` accepts ``FULL`` graphs, and ``padded_num_reqs`` pads the
request rows of a mixed batch (a FULL graph; vllm-ascend ignores the argument);
bad sizes are ``ValueError`` naming the field (vllm-ascend: ``RuntimeError`` or
an assertion).

:func:`make_functional_ascend_manager` imports neither vLLM nor vllm-ascend: it
takes their names (:class:`~pcp_fn.adapters.vllm_manager.VllmApi`,
:class:`AscendApi`), so the default suite builds it over a stand-in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..vllm_manager import VllmApi, _replace, make_functional_manager

#: The speculative methods vllm-ascend's MRV2 PCP accepts.
SPEC_METHODS = ("mtp", "eagle3", "dspark")


@dataclasses.dataclass(frozen=True)
class PCPAttentionContext:
    """The global PCP view of one attention step (the fields of vllm-ascend's
    ``AscendPCPAttentionContext``; used when vllm-ascend is absent).

    Fields:
        global_batch: the global (or dummy) batch.
        global_block_tables: the global rows' block tables, ``[R, B]`` per KV-cache group.
        global_slot_mappings: ``[K, num_tokens_after_padding]`` global slot mappings.
        hidden_restore_idx: ``[rows]`` int64 gathered row of each global token.
        padded_gather_idx: ``[P*Lp]`` int64 global token of each gathered row (``None`` for a dummy).
        gathered_kv_write_mask: ``[P*Lp]`` bool (``None`` for a dummy).
        global_block_table_num_blocks: ``[K, num_reqs]`` allocated blocks per global request
            (DCP with a prefill only).
    """

    global_batch: Any
    global_block_tables: tuple[torch.Tensor, ...]
    global_slot_mappings: torch.Tensor
    hidden_restore_idx: torch.Tensor
    padded_gather_idx: torch.Tensor | None = None
    gathered_kv_write_mask: torch.Tensor | None = None
    global_block_table_num_blocks: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class AscendApi:
    """The vllm-ascend (and vLLM) names the Ascend additions use.

    Fields:
        AscendInputBuffers: ``vllm_ascend.worker.v2.input_batch.AscendInputBuffers``
            (keyword constructor ``max_num_reqs, max_num_tokens, device``; host
            ``seq_lens_np``).
        build_attn_state: ``vllm_ascend.worker.v2.attn_utils.build_attn_state``
            ``(vllm_config, seq_lens_np, num_reqs, num_scheduled_tokens, num_valid_tokens)``.
        get_pp_group: ``vllm.distributed.get_pp_group`` (``is_last_rank``).
        AttentionContext: ``vllm_ascend.worker.v2.pcp_manager.AscendPCPAttentionContext``
            (keyword constructor with :class:`PCPAttentionContext`'s fields).
    """

    AscendInputBuffers: type
    build_attn_state: Callable[..., Any]
    get_pp_group: Callable[[], Any]
    AttentionContext: type = PCPAttentionContext


@dataclasses.dataclass(frozen=True)
class _Desc:
    """The base manager's batch descriptor (``cg_mode``, ``num_tokens``, ``num_reqs``)."""

    cg_mode: Any
    num_tokens: int
    num_reqs: int | None


def _zero_padding_rows(restored: torch.Tensor, num_tokens: int, rows: int) -> torch.Tensor:
    """``[rows, ...]``: the first ``num_tokens < rows`` rows of ``restored``, zeros after (in
    place when ``restored`` already has ``rows`` rows)."""
    if restored.shape[0] == rows:
        restored[num_tokens:rows].zero_()
        return restored
    out = restored.new_zeros((rows, *restored.shape[1:]))
    out[:num_tokens].copy_(restored[:num_tokens])
    return out


def make_functional_ascend_manager(
    vllm_api: VllmApi, ascend_api: AscendApi, name: str = "FunctionalAscendPCPManager"
) -> type:
    """A subclass of ``make_functional_manager(vllm_api)`` with vllm-ascend's ``AscendPCPManager``
    constructor and additions."""
    Mode = vllm_api.CUDAGraphMode
    PAD = vllm_api.PAD_SLOT_ID

    def local_input_buffers(max_num_reqs: int, max_num_tokens: int, device: torch.device) -> Any:
        buffers = ascend_api.AscendInputBuffers(
            max_num_reqs=max_num_reqs, max_num_tokens=max_num_tokens, device=device
        )
        # vllm-ascend reserves one more query_start_loc entry (a FIA padding slot) that PCP never
        # uses: expose the vLLM-sized view, like vllm-ascend's manager
        buffers.query_start_loc = buffers.query_start_loc[: max_num_reqs + 1]
        return buffers

    base = make_functional_manager(dataclasses.replace(vllm_api, InputBuffers=local_input_buffers))

    class FunctionalAscendPCPManager(base):  # type: ignore[valid-type,misc]
        """Drop-in for vllm-ascend main's ``AscendPCPManager`` (model runner V2).

        Attributes:
            vllm_config: set by the runner (as for vllm-ascend's manager); read for the
                CUDA-graph mode and passed to ``build_attn_state``.
            req_states: the constructor's ``req_states`` (kept, unused: the
                bookkeeping needs none of it).
        """

        vllm_config: Any = None

        def __init__(
            self,
            pcp_world_size: int,
            pcp_rank: int,
            device: torch.device,
            req_states: Any = None,
            max_num_reqs: int | None = None,
            max_num_tokens: int | None = None,
            block_tables: Any = None,
            dcp_world_size: int = 1,
            dcp_rank: int = 0,
            cp_interleave: int = 1,
        ) -> None:
            # vllm-ascend's base lays decode requests replicated on every rank
            super().__init__(
                pcp_world_size,
                pcp_rank,
                device,
                False,
                max_num_reqs,
                max_num_tokens,
                block_tables,
                dcp_world_size,
                dcp_rank,
                cp_interleave,
            )
            self.req_states = req_states
            # a dummy batch's restore rows (build_attention_context): views of one arange (none
            # without capacities: like the base's buffers)
            self._dummy_restore_idx = (
                None
                if self.max_num_tokens is None
                else torch.arange(pcp_world_size * self.max_num_tokens, dtype=torch.int64, device=self.device)
            )
            # build_attention_context's views of the persistent buffers, by their sizes (a slice
            # costs a torch op; a steady batch asks the same ones every step): in the manager's
            # schedule cache
            self._fn_context_views = self.schedule_cache.table("contexts")

        # ------------------------------------------------------------ config

        @staticmethod
        def validate_config(vllm_config: Any, supports_mm_inputs: bool) -> None:
            """vllm-ascend's checks, except that FULL CUDA graphs serve mixed batches too.

            Raises ``NotImplementedError`` (as vllm-ascend does) naming the feature PCP does not
            support here: encoder-decoder models, multimodal inputs, LoRA, speculative methods
            other than MTP / Eagle3 / DSpark or non-greedy draft sampling, data parallelism or
            sparse MLA with CUDA graphs other than ``FULL_DECODE_ONLY``, and full CUDA graphs
            other than ``FULL`` / ``FULL_DECODE_ONLY``. vllm-ascend also refuses ``FULL``; the
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
            spec = vllm_config.speculative_config
            if spec is not None:
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
            mode = vllm_config.compilation_config.cudagraph_mode
            decode_only_graphs = mode in (Mode.NONE, Mode.FULL_DECODE_ONLY)
            if parallel.data_parallel_size > 1 and not decode_only_graphs:
                raise NotImplementedError(
                    f"MRV2 PCP with data parallelism (data_parallel_size={parallel.data_parallel_size}) "
                    f"supports eager mode or FULL_DECODE_ONLY CUDA graphs only; got {mode.name}."
                )
            if hasattr(model.hf_text_config, "index_topk") and not decode_only_graphs:
                raise NotImplementedError(
                    f"MRV2 sparse MLA PCP supports eager mode or FULL_DECODE_ONLY CUDA graphs only; "
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
            return bool(ascend_api.get_pp_group().is_last_rank)

        @property
        def global_batch(self) -> Any:
            """The global batch of the last ``partition_batch``."""
            if self._global_batch is None:
                raise RuntimeError("PCP global batch is unavailable before partition_batch().")
            return self._global_batch

        @staticmethod
        def broadcast_replicated_hidden_states(
            last_hidden_states: torch.Tensor,
            hidden_states: torch.Tensor,
            num_tokens: int,
            replicated_pcp: bool,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """PCP rank 0's first ``num_tokens`` draft hidden rows on every rank, when the target's
            PCP rows are replicated (else both unchanged); broadcast once when both are one tensor."""
            if not replicated_pcp:
                return last_hidden_states, hidden_states
            group = vllm_api.get_pcp_group()
            last = group.broadcast(last_hidden_states[:num_tokens].contiguous(), src=0)
            if hidden_states is last_hidden_states:
                return last, last
            return last, group.broadcast(hidden_states[:num_tokens].contiguous(), src=0)

        def persistent_buffers(self) -> dict[str, torch.Tensor]:
            named = super().persistent_buffers()
            named["seq_lens_cpu"] = self._input_buffers.seq_lens_cpu  # host twin of seq_lens_np
            named["dummy_restore_idx"] = self._dummy_restore_idx
            return named

        def _fn_full_rows(self, num_reqs: int, num_tokens: int, max_query_len: int | None) -> int:
            """``padded_num_reqs`` as given: vllm-ascend's runner passes the rows of its own graph
            (vLLM's MRV2 dispatcher, whose mixed FULL graphs the base class widens, is not in play)."""
            return num_reqs

        # ------------------------------------------------------------ partition

        def partition_batch(
            self,
            input_batch: Any,
            padded_num_tokens: int | None = None,
            padded_num_reqs: int | None = None,
        ) -> Any:
            """This rank's local ``AscendInputBatch`` (vllm-ascend ``partition_batch``).

            The layout pads the local tokens to ``padded_num_tokens`` (default, and
            always for a speculative batch: the largest rank's). A decode-only batch
            is then padded to its graph: tokens to the global
            ``num_tokens_after_padding``, request rows to it as well for a
            FULL_DECODE_ONLY graph without drafts (else to the global
            ``num_reqs_after_padding``), with the global ``query_start_loc_np`` as the
            local one. Like vllm-ascend, ``padded_num_reqs`` is ignored for a
            decode-only batch; unlike vllm-ascend, it pads the request rows of a
            mixed batch (a FULL graph). ``seq_lens_np``, ``attn_state`` and the local
            draft counts come from host arrays only.

            Raises:
                NotImplementedError: draft tokens on a prefill request.
                ValueError: no ``num_draft_tokens_per_req`` with draft tokens, a graph
                    larger than the local buffers, a global ``query_start_loc_np``
                    shorter than the graph's rows, and as the base class.
            """
            g = input_batch
            prefilling = np.asarray(g.is_prefilling_np)
            spec = g.num_draft_tokens > 0
            drafts = g.num_draft_tokens_per_req
            if spec:
                if drafts is None:
                    raise ValueError(
                        "input_batch.num_draft_tokens_per_req is required when num_draft_tokens > 0"
                    )
                drafts = np.asarray(drafts)
                if np.any(drafts[prefilling] != 0):
                    raise NotImplementedError(
                        "PCP speculative decoding does not support draft tokens on prefill requests."
                    )
            if padded_num_reqs is not None and prefilling.any():  # a FULL graph of a mixed batch
                tokens = padded_num_tokens
                if tokens is None:
                    tokens = self.get_num_tokens_for_dispatch(g.num_scheduled_tokens, prefilling)
                desc = _Desc(Mode.FULL, tokens, padded_num_reqs)
            elif spec or padded_num_tokens is None:
                desc = _Desc(Mode.NONE, 0, None)
            else:
                desc = _Desc(Mode.PIECEWISE, padded_num_tokens, None)
            local = super().partition_batch(g, desc)  # also self._local_batch (the drafter's)
            decode_only = self._fn_decode_only  # of the batch just partitioned (its shape's, memoised)
            changes: dict[str, Any] = {}
            ib = self._input_buffers
            n, num_local = local.num_reqs, local.num_tokens
            if spec:
                Lp = local.num_tokens_after_padding
                if Lp > num_local:  # vllm-ascend re-gathers the ids: padding rows read global token 0
                    with self._fn_pcp.guard():
                        ib.input_ids[num_local:Lp].copy_(g.input_ids[:1].expand(Lp - num_local))
                local_drafts = drafts.astype(np.int32)[self._fn_local_rows]
                changes.update(
                    num_draft_tokens=int(local_drafts.sum()), num_draft_tokens_per_req=local_drafts
                )

            # the global batch's padding rows have no segment: their restore rows read gathered row 0
            restore_rows = int(g.query_start_loc_np[-1])
            if restore_rows > g.num_tokens:
                if restore_rows > self._fn_hidden_restore_idx.shape[0]:
                    raise ValueError(
                        f"input_batch.query_start_loc_np ends at {restore_rows} tokens; "
                        f"max_num_tokens is {self.max_num_tokens}"
                    )
                with self._fn_pcp.guard():
                    self._fn_hidden_restore_idx[g.num_tokens : restore_rows].zero_()

            graph_tokens = g.num_tokens_after_padding
            token_sized = (
                decode_only
                and not spec
                and self.vllm_config is not None
                and self.vllm_config.compilation_config.cudagraph_mode == Mode.FULL_DECODE_ONLY
            )
            graph_reqs = graph_tokens if token_sized else g.num_reqs_after_padding
            if decode_only and (
                graph_tokens > local.num_tokens_after_padding or graph_reqs > local.num_reqs_after_padding
            ):
                changes.update(self._pad_to_graph(g, local, graph_tokens, graph_reqs))

            padded = changes.get("num_reqs_after_padding", local.num_reqs_after_padding)
            seq_lens = local.num_computed_tokens_np + local.num_scheduled_tokens
            if padded > n:
                buf = ib.seq_lens_np
                buf[:n] = seq_lens
                buf[n:padded] = 0
                changes["seq_lens_np"] = buf[:padded]
            else:
                changes["seq_lens_np"] = seq_lens
            valid = local.num_scheduled_tokens
            if spec:
                valid = valid - changes["num_draft_tokens_per_req"]
            changes["attn_state"] = ascend_api.build_attn_state(
                self.vllm_config, seq_lens, n, local.num_scheduled_tokens, valid
            )
            if spec or "num_tokens_after_padding" in changes:
                # a new batch: the drafter keeps the layout's (as vllm-ascend's base does)
                return _replace(local, changes)
            for field, value in changes.items():
                setattr(local, field, value)
            return local

        def _pad_to_graph(self, g: Any, local: Any, tokens: int, reqs: int) -> dict[str, Any]:
            """The local batch's fields padded to a decode-only graph of ``tokens`` tokens and
            ``reqs`` request rows (decodes are replicated: the global query layout is the local one).
            """
            ib = self._input_buffers
            if tokens > self.max_num_tokens:
                raise ValueError(
                    f"input_batch.num_tokens_after_padding={tokens} (the decode graph's tokens) exceeds "
                    f"max_num_tokens={self.max_num_tokens}"
                )
            if reqs > 2 * self.max_num_reqs:
                raise ValueError(
                    f"the decode graph's {reqs} request rows exceed the local request capacity "
                    f"2 * max_num_reqs = {2 * self.max_num_reqs}"
                )
            qsl_np = g.query_start_loc_np[: reqs + 1]
            if qsl_np.shape[0] != reqs + 1:
                raise ValueError(
                    f"input_batch.query_start_loc_np has {g.query_start_loc_np.shape[0]} entries; the "
                    f"decode graph's {reqs} request rows need {reqs + 1}"
                )
            num_local, n = local.num_tokens, local.num_reqs
            qsl = ib.query_start_loc[: reqs + 1]
            with self._fn_pcp.guard():  # fixed-shape device writes only
                ib.input_ids[num_local:tokens].zero_()
                ib.positions[num_local:tokens].zero_()
                ib.is_padding[num_local:tokens].fill_(True)
                ib.seq_lens[n:reqs].zero_()
                if g.query_start_loc.shape[0] > reqs:  # the device twin of query_start_loc_np
                    qsl.copy_(g.query_start_loc[: reqs + 1])
            if g.query_start_loc.shape[0] <= reqs:
                qsl.copy_(torch.from_numpy(qsl_np), non_blocking=True)
            upper = torch.zeros(reqs, dtype=local.seq_lens_cpu_upper_bound.dtype)
            upper[:n] = local.seq_lens_cpu_upper_bound[:n]
            return dict(
                num_reqs_after_padding=reqs,
                num_tokens_after_padding=tokens,
                query_start_loc=qsl,
                query_start_loc_np=qsl_np,
                seq_lens=ib.seq_lens[:reqs],
                seq_lens_cpu_upper_bound=upper,
                dcp_local_seq_lens=None,
                input_ids=ib.input_ids[:tokens],
                positions=ib.positions[:tokens],
                is_padding=ib.is_padding[:tokens],
            )

        # ------------------------------------------------------------ attention

        def prepare_slot_mappings(self) -> torch.Tensor:
            """The gathered slot mappings; for a decode-only batch padded past the layout, in the
            graph's rank-major layout ``[K, P * num_tokens_after_padding]`` (each rank's rows, then
            ``PAD_SLOT_ID`` up to the graph's tokens)."""
            slots = super().prepare_slot_mappings()
            g = self._global_batch
            graph = g.num_tokens_after_padding
            if not self._fn_decode_only or graph <= g.num_tokens:
                return slots
            P, K = self.pcp_world_size, slots.shape[0]
            width = slots.shape[1] // P  # the layout's local tokens
            out = self._fn_gathered_slot_mappings[:, : P * graph]
            if width == graph:
                return out
            if width > graph:
                raise ValueError(
                    f"the layout's {width} local tokens exceed the decode graph's "
                    f"input_batch.num_tokens_after_padding={graph}"
                )
            with self._fn_pcp.guard():
                compact = slots.view(K, P, width).clone()  # the source overlaps the destination
                grid = out.view(K, P, graph)
                grid[:, :, width:].fill_(PAD)
                grid[:, :, :width].copy_(compact)
            return out

        def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
            """Zeroed views of the persistent local block tables (capture and dummy runs)."""
            if not self._local_block_tables:
                raise RuntimeError("get_dummy_block_tables needs the block_tables given to the constructor")
            rows = self._local_block_tables[0].shape[0]
            if num_reqs > rows:
                raise ValueError(f"num_reqs={num_reqs} exceeds the local block tables' {rows} rows")
            return super().get_dummy_block_tables(num_reqs)

        def prepare_dummy_attn(self, input_batch: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
            """Stage a dummy batch in the persistent local buffers (a FULL graph reads them) and
            return its zeroed block tables and ``PAD_SLOT_ID`` slot mappings."""
            ib = self._input_buffers
            t, r = input_batch.num_tokens_after_padding, input_batch.num_reqs_after_padding
            with self._fn_pcp.guard():
                torch._foreach_copy_(
                    [
                        ib.input_ids[:t],
                        ib.positions[:t],
                        ib.is_padding[:t],
                        ib.query_start_loc[: r + 1],
                        ib.seq_lens[:r],
                    ],
                    [
                        input_batch.input_ids,
                        input_batch.positions,
                        input_batch.is_padding,
                        input_batch.query_start_loc,
                        input_batch.seq_lens,
                    ],
                )
            ib.seq_lens_np[:r] = input_batch.seq_lens_np[:r]
            return self.get_dummy_block_tables(r), self.get_dummy_slot_mappings(t)

        def build_attention_context(
            self,
            input_batch: Any = None,
            block_tables: tuple[torch.Tensor, ...] | None = None,
            slot_mappings: torch.Tensor | None = None,
        ) -> Any:
            """The global PCP view attention metadata builders read.

            A dummy batch (``input_batch.is_dummy``: capture, idle DP rank) is its own
            global batch: ``block_tables`` and this rank's slice of ``slot_mappings``
            (``[K, P * num_tokens_after_padding]``), restore rows ``rank * L .. rank * L + L``.
            Otherwise the last partitioned global batch, its block tables (the runner's
            tables, gathered), its slot mappings (``prepare_attn`` computed them), the
            layout's ``hidden_restore_idx``, ``padded_gather_idx`` and KV write mask, and
            with DCP and a prefill the allocated blocks of each global request.
            """
            Context = ascend_api.AttentionContext
            if input_batch is not None and input_batch.is_dummy:
                if block_tables is None or slot_mappings is None:
                    raise ValueError(
                        "build_attention_context: a dummy batch needs block_tables and slot_mappings"
                    )
                L, P, rank = input_batch.num_tokens_after_padding, self.pcp_world_size, self.pcp_rank
                if L > self.max_num_tokens:
                    raise ValueError(
                        f"input_batch.num_tokens_after_padding={L} exceeds "
                        f"max_num_tokens={self.max_num_tokens}"
                    )
                return Context(
                    global_batch=input_batch,
                    global_block_tables=block_tables,
                    global_slot_mappings=slot_mappings.view(slot_mappings.shape[0], P, L)[:, rank],
                    hidden_restore_idx=self._dummy_restore_idx[rank * L : rank * L + L],
                )
            g = self.global_batch
            tables = self._block_tables
            if tables is None:
                raise RuntimeError("build_attention_context needs the block_tables given to the constructor")
            num_blocks = None
            if self.dcp_world_size > 1 and np.asarray(g.is_prefilling_np).any():
                host = tables.num_blocks.np[:, g.idx_mapping_np[: g.num_reqs]]
                num_blocks = torch.from_numpy(host).to(device=self.device, non_blocking=True)
            width = self._fn_pcp.current_plan().Lp * self.pcp_world_size
            key = (g.num_tokens_after_padding, int(g.query_start_loc_np[-1]), width)
            views = self._fn_context_views.get(key)
            if views is None:
                views = self.schedule_cache.put(
                    "contexts",
                    key,
                    (
                        self._fn_global_slot_mappings[:, : key[0]],
                        self._fn_hidden_restore_idx[: key[1]],
                        self._fn_padded_gather_idx[:width],
                        self._fn_kv_write_mask[:width],
                    ),
                )
            return Context(
                global_batch=g,
                global_block_tables=tables.gather_block_tables(g.idx_mapping, g.num_reqs_after_padding),
                global_slot_mappings=views[0],
                hidden_restore_idx=views[1],
                padded_gather_idx=views[2],
                gathered_kv_write_mask=views[3],
                global_block_table_num_blocks=num_blocks,
            )

        # ------------------------------------------------------------ hidden states

        def _restored_rows(self) -> tuple[int, int]:
            """``(num_tokens, rows)``: the global tokens and the rows a restore returns (the
            global graph's ``num_tokens_after_padding`` when the global batch is padded)."""
            g = self.global_batch
            n, padded = g.num_tokens, g.num_tokens_after_padding
            if n == padded:
                return n, n
            rows = int(g.query_start_loc_np[-1])  # the layout's restore rows (FIA padding included)
            if rows != padded:
                raise RuntimeError(
                    "PCP restored hidden-state length does not match the global graph layout: "
                    f"{rows} != {padded} (input_batch.query_start_loc_np[-1] must be "
                    "num_tokens_after_padding)."
                )
            return n, rows

        def _padded(self, restored: torch.Tensor, n: int, rows: int) -> torch.Tensor:
            """A restore's ``[rows, ...]`` result with its rows past the ``n`` global tokens (the
            global graph's padding) zero; unchanged when there are none (the steady case)."""
            if n == rows:
                return restored
            with self._fn_pcp.guard():
                return _zero_padding_rows(restored, n, rows)

        def _layout_rows(self, gathered: torch.Tensor) -> torch.Tensor:
            """``gathered`` at the layout's ``P * Lp`` rows: a decode graph padded past the layout
            gathers ``P * num_tokens_after_padding`` rows, whose restored rows are all rank 0's."""
            P, Lp, g = self.pcp_world_size, self._fn_pcp.current_plan().Lp, self._global_batch
            rows = gathered.shape[0]
            if rows == P * Lp or g is None or not self._fn_decode_only:
                return gathered
            graph = g.num_tokens_after_padding
            return gathered[: P * Lp] if graph > Lp and rows == P * graph else gathered

        def restore_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
            """All-gather the ranks' local rows and put them in global order: ``[num_tokens, ...]``,
            or the global graph's ``[num_tokens_after_padding, ...]`` with zero padding rows.
            Unchanged off the last pipeline stage and before the first ``partition_batch``."""
            if not self.is_last_pp_rank or not self._fn_pcp.has_layout:
                return hidden_states
            gathered = vllm_api.get_pcp_group().all_gather(hidden_states, dim=0)
            n, rows = self._restored_rows()
            return self._padded(self._fn_pcp.restore(self._layout_rows(gathered), rows), n, rows)

        def restore_hidden_state_buffer(self, hidden_states: torch.Tensor) -> None:
            """Restore a model-owned buffer in place: its first ``Lp`` rows (the layout's local
            tokens) are this rank's; the restored global rows overwrite its head."""
            if not self.is_last_pp_rank:
                return
            if not self._fn_pcp.has_layout:
                raise RuntimeError("restore_hidden_state_buffer: no batch was partitioned yet")
            restored = self.restore_hidden_states(hidden_states[: self._fn_pcp.current_plan().Lp])
            hidden_states[: restored.shape[0]].copy_(restored)

        def restore_for_sampling(
            self, hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None
        ) -> tuple[torch.Tensor, list[torch.Tensor] | None, Any]:
            """Restored hidden (and auxiliary) states, as :meth:`restore_hidden_states`, with the
            global batch to sample with."""
            g = self.global_batch
            if not self.is_last_pp_rank:
                return hidden_states, aux_hidden_states, g
            group = vllm_api.get_pcp_group()
            gathered = self._layout_rows(group.all_gather(hidden_states, dim=0))
            aux = (
                None
                if aux_hidden_states is None
                else [self._layout_rows(group.all_gather(a, dim=0)) for a in aux_hidden_states]
            )
            n, rows = self._restored_rows()
            hidden, aux = self._fn_pcp.restore_for_sampling(gathered, aux, rows)
            if aux is not None:
                aux = [self._padded(a, n, rows) for a in aux]
            return self._padded(hidden, n, rows), aux, g

        def restore_draft_prefill(
            self, last_hidden_states: torch.Tensor, hidden_states: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """The drafter's outputs restored as :meth:`restore_hidden_states` (once when both are
            the same tensor), when a draft prefill was prepared."""
            if self.draft_prefill_batch is None:
                return last_hidden_states, hidden_states
            self.draft_prefill_batch = None
            if not self.is_last_pp_rank:
                return last_hidden_states, hidden_states
            group = vllm_api.get_pcp_group()
            last = self._layout_rows(group.all_gather(last_hidden_states, dim=0))
            same = hidden_states is last_hidden_states
            other = last if same else self._layout_rows(group.all_gather(hidden_states, dim=0))
            n, rows = self._restored_rows()
            last, other = self._fn_pcp.restore_draft_prefill(last, other, rows)
            last = self._padded(last, n, rows)
            return last, last if same else self._padded(other, n, rows)

    FunctionalAscendPCPManager.__name__ = FunctionalAscendPCPManager.__qualname__ = name
    return FunctionalAscendPCPManager
