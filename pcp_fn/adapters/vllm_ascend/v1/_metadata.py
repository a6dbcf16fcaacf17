"""`generate_pcp_metadata`: vllm-ascend's `AscendPrefillContextParallelMetadata` from the step.

The device fields are views of the manager's persistent buffers, filled by the
step's pcp_fn ops (`attention_metadata`'s index tensors, the layout's restore
index and unpad mask, the hybrid index maps, `spec.mtp_attention_mask`); the
host fields (per-request lists, context lengths per CP rank) come from the
host twin. The metadata class is vllm-ascend's when importable, a plain
attribute holder otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ....core.checks import same_ints
from ....core.seqlens import host_cp_local_seq_lens
from ....dcs import host as dcs_host
from ....hybrid.host import HybridHostLayout
from . import _ops
from ._parts import ManagerParts
from .engine_types import NPUInputBatch


class _LongSeqMetadata:
    """Stand-in for vllm-ascend's `AscendPrefillContextParallelMetadata` when it is not importable."""

    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


def _metadata_class() -> Callable[..., Any]:
    try:
        from vllm_ascend.attention.utils import AscendPrefillContextParallelMetadata
    except ImportError:
        return _LongSeqMetadata
    return AscendPrefillContextParallelMetadata


def _check_query_lens(query_lens: torch.Tensor | npt.ArrayLike, expected: np.ndarray, dummy: bool) -> None:
    """`query_lens[:n]` equals `expected` (read only when it is on the host: no device sync)."""
    if isinstance(query_lens, torch.Tensor):
        if not query_lens.is_cpu:
            return
        got = query_lens.numpy()
    else:
        got = np.asarray(query_lens)
    n = expected.shape[0]
    if got.ndim != 1 or got.shape[0] < n or not same_ints(got[:n], expected):
        what = "the dummy batch's scheduled tokens" if dummy else "the step's local tokens per request"
        raise ValueError(
            f"query_lens must start with {what} {expected.tolist()}, got {got.tolist()} "
            "(model_runner_v1 passes update_tokens_for_pcp's counts, or num_scheduled_tokens_padded)"
        )


class MetadataBuilder:
    """The attention metadata of a step (`generate_pcp_metadata`), for
    [`FunctionalDCSManager`][pcp_fn.adapters.vllm_ascend.FunctionalDCSManager].

    Holds what it reads: the settings, the persistent buffers (the step's index tensors, the
    full query lengths, the MTP mask and its staging), the device graphs (the MTP mask's), the
    manager's record cell (the step it describes; it records the metadata there) and view cache;
    its own: vllm-ascend's metadata class (found on first use) and the decode-only step's empty
    index views (made once).
    """

    def __init__(self, parts: ManagerParts) -> None:
        self.settings, self.buffers, self.graphs = parts.settings, parts.buffers, parts.graphs
        self.records, self.views = parts.records, parts.views
        self.metadata_cls: Any = None
        self.empty_indices: dict[str, torch.Tensor] | None = None

    def generate(
        self, total: int, query_lens: torch.Tensor | npt.ArrayLike, input_batch: NPUInputBatch,
        num_scheduled: np.ndarray | None,
        num_reqs_padded: int, num_reqs: int, fixed_decode: np.ndarray | None,
    ) -> Any:  # fmt: skip
        """`generate_pcp_metadata`'s metadata (`None` when `pcp * dcp == 1`); recorded in the cell."""
        s, h = self.settings, self.records.host()
        P = s.pcp_size
        # a _dummy_run: no update_tokens_for_pcp since init_batch_info; the step's layout is h
        dummy = P > 1 and self.records.current.updated is not h
        u = h if dummy else self.records.current.updated
        if P > 1:
            _check_query_lens(query_lens, h.num_scheduled if dummy else h.pcp_tokens, dummy)
            if dummy:
                total = h.num_tokens
            elif s.hybrid_attn:  # the FA query lengths (update_tokens_for_pcp's layout is h)
                total = int(h.pcp_tokens.sum())
        num_actual = int(total) * P
        meta = None
        if s.cp_size > 1:
            if num_scheduled is None:
                raise ValueError("num_scheduled_tokens is required when pcp * dcp > 1")
            computed_cpu = np.asarray(input_batch.num_computed_tokens_cpu)
            context = _context_lengths(h, computed_cpu, num_scheduled, fixed_decode)
            meta = self._metadata(self._fields(h, u, context, num_actual, num_reqs_padded))
            if P > 1:
                self._attach_attention_indices(meta, h, u, num_actual)
            if s.has_spec_config:
                meta.dcp_mtp_attn_mask = self._mtp_attention_mask(
                    h, computed_cpu, np.asarray(num_scheduled), fixed_decode, num_reqs
                )
            else:
                meta.dcp_mtp_attn_mask = None
        self.records.set(num_actual_tokens_pcp_padded=num_actual, long_seq_metadata=meta)
        return meta

    def _fields(
        self, h: dcs_host.HostLayout, u: HybridHostLayout | None, context: np.ndarray, num_actual: int,
        num_reqs_padded: int,
    ) -> dict[str, Any]:  # fmt: skip
        s, P = self.settings, self.settings.pcp_size
        full = self.buffers.query_lens_pcp_full
        ori_query_lens = self.views.view("query_lens", full.cpu, num_reqs_padded)
        ql = full.np[:num_reqs_padded]  # the same memory, read by numpy
        fla = u.padded_tokens_fla if s.hybrid_attn and u is not None else 0
        unpad = self.buffers.step["unpad_mask"]
        return dict(
            pcp_use_hybrid_attn=s.hybrid_attn,
            num_actual_tokens_pcp_padded=num_actual,
            num_computed_tokens_of_pcp_dcp=host_cp_local_seq_lens(context, P, s.dcp_size, s.interleave),
            pcp_unpad_mask=self.views.view("unpad_mask", unpad, 0 if u is None else P * u.num_tokens),
            pcp_padded_tokens_fla=fla,
            query_lens_pcp_full_cpu=ori_query_lens,
            max_query_len_pcp_full=int(ql.max()) if ql.size else ori_query_lens.max().item(),
        )

    def _metadata(self, fields: dict[str, Any]) -> Any:
        if self.metadata_cls is None:  # found once (an import attempt per step costs)
            self.metadata_cls = _metadata_class()
        return self.metadata_cls(**fields)

    def _attach_attention_indices(
        self,
        meta: Any,  # vllm-ascend's AscendPrefillContextParallelMetadata (or _LongSeqMetadata): written only
        h: dcs_host.HostLayout,
        u: HybridHostLayout | None,
        num_actual: int,
    ) -> None:
        step = self.buffers.step
        if h.num_prefill_reqs == 0:  # a decode-only step: every index empty, every list too
            views = self.empty_indices
            if views is None:  # made once (a view costs microseconds; ten of them, every step)
                views = self.empty_indices = {f: step[k][:0] for k, f in _ops.ATTENTION_INDEX_FIELDS.items()}
            meta.__dict__.update(views)
            meta.attn_mask_seqlens, meta.head_attn_nomask_seqlens, meta.tail_attn_nomask_seqlens = [], [], []
            meta.head_actual_seq_lengths_kv, meta.tail_actual_seq_lengths_kv = [], []
            meta.attn_chunk_seqlens = torch.from_numpy(dcs_host.NO_CHUNKS)
        else:
            lists = h.attention  # shared with the steps of the same shape: copies handed out
            C = lists.lengths["q_head_idx"]  # every length is a multiple of it
            views = self.views.get("indices", C)
            if views is None:
                views = {f: step[k][: lists.lengths[k]] for k, f in _ops.ATTENTION_INDEX_FIELDS.items()}
                self.views.put("indices", C, views)
            meta.__dict__.update(views)
            meta.attn_mask_seqlens = list(lists.attn_mask_seqlens)
            meta.head_attn_nomask_seqlens = list(lists.head_attn_nomask_seqlens)
            meta.tail_attn_nomask_seqlens = list(lists.tail_attn_nomask_seqlens)
            meta.head_actual_seq_lengths_kv = list(lists.head_actual_seq_lengths_kv)
            meta.tail_actual_seq_lengths_kv = list(lists.tail_actual_seq_lengths_kv)
            meta.attn_chunk_seqlens = torch.from_numpy(lists.chunk_seqlens.copy())
        meta.pcp_allgather_restore_idx = self.views.view("restore", step["restore"], num_actual)
        if self.settings.hybrid_attn and u is not None:
            _attach_hybrid_indices(meta, step, u, num_actual, self.settings.pcp_size)

    def _mtp_attention_mask(
        self,
        h: dcs_host.HostLayout,
        computed_cpu: np.ndarray,
        num_scheduled: np.ndarray,
        fixed_decode_seq_lens_cpu: np.ndarray | None,
        num_reqs: int,
    ) -> torch.Tensor:
        """`dcp_mtp_attn_mask.gpu[:rows]`: the decodes' rows (or `num_reqs` rows without decodes).

        The buffer semantics of vllm-ascend's `generate_pcp_metadata` /
        `generate_mtp_attention_mask_for_decode`: rows `[:nd]` are rewritten
        (each decode's mask, all False for a decode with no local key) only when
        some decode's last token `h + n - 1` reaches this CP rank
        (`>= pcp_rank * dcp_size + dcp_rank`); otherwise, and in a step without
        decodes, the rows returned are what the buffer last held (the rows last
        written, zeros where never written). The values written are the
        interleave-aware mask (for `cp_kv_cache_interleave_size = 1` vllm-ascend's).
        """
        buf = self.buffers.dcp_mtp_attn_mask
        assert buf is not None
        s = self.settings
        nd = h.num_decode_reqs
        if nd > 0:
            if fixed_decode_seq_lens_cpu is not None:
                decode_computed = np.asarray(fixed_decode_seq_lens_cpu)[:nd] - num_scheduled[:nd]
            else:
                decode_computed = computed_cpu[:nd]
            cp_rank = s.pcp_rank * s.dcp_size + s.dcp_rank
            if (decode_computed + num_scheduled[:nd] - 1 >= cp_rank).any():
                corrected = not same_ints(decode_computed, h.num_computed[:nd])
                if corrected:
                    # async spec decode corrected the histories: the [R_b] counts staged
                    Rb = self.records.bucket().num_reqs
                    host = np.zeros(Rb, dtype=np.int32)  # the batch's dtype: the same graph serves both
                    host[: h.num_reqs] = h.num_computed
                    host[:nd] = decode_computed
                    with self.graphs.guard():
                        self.buffers.computed_in[:Rb].copy_(torch.from_numpy(host), non_blocking=True)
                self.graphs.mtp_mask(corrected)  # rows [:nd], at the step's bucket
        return buf.gpu[: nd if nd > 0 else num_reqs]


def _context_lengths(
    h: dcs_host.HostLayout,
    computed_cpu: np.ndarray,
    num_scheduled: npt.ArrayLike,
    fixed_decode: np.ndarray | None,
) -> np.ndarray:
    """Each request's context: the decodes' (`fixed_decode_seq_lens_cpu`, else computed plus
    scheduled), then the prefills' computed tokens."""
    nd, n = h.num_decode_reqs, h.num_reqs
    if fixed_decode is not None:
        decode_context = np.asarray(fixed_decode)[:nd]
    else:
        decode_context = computed_cpu[:nd] + np.asarray(num_scheduled)[:nd]
    prefill_context = computed_cpu[nd:n]
    if prefill_context.size or decode_context.dtype != prefill_context.dtype:
        return np.concatenate([decode_context, prefill_context])
    # only decodes: nothing to join (a fresh array already)
    return decode_context if fixed_decode is None else decode_context.copy()


def _attach_hybrid_indices(
    meta: Any,  # vllm-ascend's AscendPrefillContextParallelMetadata (or _LongSeqMetadata): written only
    step: dict[str, torch.Tensor],
    u: HybridHostLayout,
    num_actual: int,
    P: int,
) -> None:
    """Hybrid attention's index fields (views of the step's buffers) and counts."""
    D = u.num_decode_tokens
    meta.pcp_exit_fa_scatter_idx = step["exit"][: u.num_linear_tokens - D]
    meta.pcp_fa_query_idx = step["fa_query"][: num_actual // P - D]
    meta.pcp_enter_fa_restore_idx = step["enter"][: u.enter_fa_len]
    meta.pcp_fa_padding_restore_idx = step["fa_padding"][:num_actual] if u.enter_fa_len < num_actual else None
    meta.max_num_tokens_across_pcp = u.max_tokens_across_pcp
    meta.total_num_scheduled_tokens = u.num_linear_tokens
