"""The body of ``FunctionalAscendPCPManager``: vllm-ascend main's ``AscendPCPManager`` (model runner V2,
``vllm_ascend/worker/v2/pcp_manager.py``) on top of ``FunctionalPCPManager``.

vllm-ascend's manager subclasses vLLM's MRV2 ``PCPManager`` and adds, on the
host: slot-mapping buffers in the block tables' slot dtype, local input buffers
of vllm-ascend's ``AscendInputBuffers`` (host ``seq_lens_cpu`` / ``seq_lens_np``
views), FULL_DECODE_ONLY request padding of decode-only batches, the local
batch's ``seq_lens_np`` and ``attn_state`` (vllm-ascend's ``build_attn_state``),
the local draft-token counts of a speculative batch, its own
``validate_config``, ``is_last_pp_rank`` and
``broadcast_replicated_hidden_states``. The class built here has the same
constructor and those methods over the bookkeeping of
:func:`pcp_fn.adapters.vllm_manager.make_functional_manager` (one graph per
bucket, persistent buffers, host fields from the numpy twin).

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

from ..vllm_manager import VllmApi, make_functional_manager

#: The speculative methods vllm-ascend's MRV2 PCP accepts.
SPEC_METHODS = ("mtp", "eagle3", "dspark")


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
    """

    AscendInputBuffers: type
    build_attn_state: Callable[..., Any]
    get_pp_group: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class _Desc:
    """The base manager's batch descriptor (``cg_mode``, ``num_tokens``, ``num_reqs``)."""

    cg_mode: Any
    num_tokens: int
    num_reqs: int | None


def make_functional_ascend_manager(
    vllm_api: VllmApi, ascend_api: AscendApi, name: str = "FunctionalAscendPCPManager"
) -> type:
    """A subclass of ``make_functional_manager(vllm_api)`` with vllm-ascend's ``AscendPCPManager``
    constructor and additions."""
    Mode = vllm_api.CUDAGraphMode

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

        def restore_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
            """As the base class on the last PP stage; unchanged on the others."""
            if not self.is_last_pp_rank:
                return hidden_states
            return super().restore_hidden_states(hidden_states)

        def persistent_buffers(self) -> dict[str, torch.Tensor]:
            named = super().persistent_buffers()
            named["seq_lens_cpu"] = self._input_buffers.seq_lens_cpu  # host twin of seq_lens_np
            return named

        # ------------------------------------------------------------ partition

        def partition_batch(
            self,
            input_batch: Any,
            padded_num_tokens: int | None = None,
            padded_num_reqs: int | None = None,
        ) -> Any:
            """This rank's local ``AscendInputBatch`` (vllm-ascend ``partition_batch``).

            Local tokens are padded to ``padded_num_tokens`` (default: the largest rank's);
            a decode-only batch to the global ``num_tokens_after_padding`` and its request rows
            to the graph's (``num_tokens_after_padding`` for a FULL_DECODE_ONLY graph without
            drafts, else ``num_reqs_after_padding``). Unlike vllm-ascend, ``padded_num_reqs``
            pads the request rows of a mixed batch too (a FULL graph). ``seq_lens_np``,
            ``attn_state`` and the local draft counts come from host arrays only.

            Raises:
                NotImplementedError: draft tokens on a prefill request.
                ValueError: as the base class (capacities, array lengths, padded sizes).
            """
            g = input_batch
            prefilling = np.asarray(g.is_prefilling_np)
            drafts = g.num_draft_tokens_per_req
            if g.num_draft_tokens > 0:
                if drafts is None:
                    raise ValueError(
                        "input_batch.num_draft_tokens_per_req is required when num_draft_tokens > 0"
                    )
                if np.any(np.asarray(drafts)[prefilling] != 0):
                    raise NotImplementedError(
                        "PCP speculative decoding does not support draft tokens on prefill requests."
                    )
            num_tokens = padded_num_tokens
            if num_tokens is None:
                num_tokens = self.get_num_tokens_for_dispatch(g.num_scheduled_tokens, prefilling)
            num_reqs = padded_num_reqs
            if not prefilling.any():  # the decode graph's fixed layout
                config = self.vllm_config
                mode = None if config is None else config.compilation_config.cudagraph_mode
                token_sized = mode == Mode.FULL_DECODE_ONLY and g.num_draft_tokens == 0
                graph_reqs = g.num_tokens_after_padding if token_sized else g.num_reqs_after_padding
                num_tokens = max(num_tokens, g.num_tokens_after_padding)
                num_reqs = max(num_reqs or 0, graph_reqs)
            desc = _Desc(Mode.PIECEWISE if num_reqs is None else Mode.FULL, num_tokens, num_reqs)
            local = super().partition_batch(g, desc)

            n, padded = local.num_reqs, local.num_reqs_after_padding
            seq_lens = local.num_computed_tokens_np + local.num_scheduled_tokens
            if padded > n:
                buf = self._input_buffers.seq_lens_np
                buf[:n] = seq_lens
                buf[n:padded] = 0
                local.seq_lens_np = buf[:padded]
            else:
                local.seq_lens_np = seq_lens
            valid = local.num_scheduled_tokens
            if g.num_draft_tokens > 0:
                local_drafts = np.asarray(drafts, dtype=np.int32)[self._local_rows]
                local.num_draft_tokens = int(local_drafts.sum())
                local.num_draft_tokens_per_req = local_drafts
                valid = valid - local_drafts
            local.attn_state = ascend_api.build_attn_state(
                self.vllm_config, seq_lens, n, local.num_scheduled_tokens, valid
            )
            return local

    FunctionalAscendPCPManager.__name__ = FunctionalAscendPCPManager.__qualname__ = name
    return FunctionalAscendPCPManager
