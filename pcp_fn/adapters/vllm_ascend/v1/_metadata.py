"""``generate_pcp_metadata``: vllm-ascend's ``AscendPrefillContextParallelMetadata`` from the step.

The device fields are views of the manager's persistent buffers, filled by the
step's pcp_fn ops (``attention_metadata``'s index tensors, the layout's restore
index and unpad mask, the hybrid index maps, ``spec.mtp_attention_mask``); the
host fields (per-request lists, context lengths per CP rank) come from the
host twin. The metadata class is vllm-ascend's when importable, a plain
attribute holder otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import _host, _ops


class _LongSeqMetadata:
    """Stand-in for vllm-ascend's ``AscendPrefillContextParallelMetadata`` when it is not importable."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def _metadata_class() -> Callable[..., Any]:
    try:
        from vllm_ascend.attention.utils import AscendPrefillContextParallelMetadata
    except ImportError:
        return _LongSeqMetadata
    return AscendPrefillContextParallelMetadata


def _check_query_lens(query_lens: Any, expected: np.ndarray, dummy: bool) -> None:
    """``query_lens[:n]`` equals ``expected`` (read only when it is on the host: no device sync)."""
    if isinstance(query_lens, torch.Tensor):
        if not query_lens.is_cpu:
            return
        got = query_lens.numpy()
    else:
        got = np.asarray(query_lens)
    n = expected.shape[0]
    if got.ndim != 1 or got.shape[0] < n or not _host.same_ints(got[:n], expected):
        what = "the dummy batch's scheduled tokens" if dummy else "the step's local tokens per request"
        raise ValueError(
            f"query_lens must start with {what} {expected.tolist()}, got {got.tolist()} "
            "(model_runner_v1 passes update_tokens_for_pcp's counts, or num_scheduled_tokens_padded)"
        )


class MetadataMethods:
    """Mixin of :class:`FunctionalDCSManager`: the attention metadata of a step."""

    def generate_pcp_metadata(
        self,
        total_num_scheduled_tokens: int,
        query_lens: torch.Tensor,
        input_batch: Any,
        num_scheduled_tokens: np.ndarray | None,
        block_table_tensor: torch.Tensor,
        num_reqs_padded: int,
        num_reqs: int,
        fixed_decode_seq_lens_cpu: np.ndarray | None = None,
    ) -> tuple[Any, torch.Tensor]:
        """vllm-ascend's ``AscendPrefillContextParallelMetadata`` of the step, and the block table.

        Reads ``input_batch.num_computed_tokens_cpu`` (the context of the
        prefills, and of the decodes without ``fixed_decode_seq_lens_cpu``).
        Device fields are views of the manager's persistent buffers.

        ``query_lens`` (host) must hold the step's local token counts per request
        (``update_tokens_for_pcp``'s, or ``num_scheduled_tokens_padded`` with hybrid
        attention), as the runner passes them. In a ``_dummy_run``
        (``init_batch_info`` without ``update_tokens_for_pcp``; the runner then passes
        the dummy batch's own counts, checked against them) the metadata is the
        one the real step of the dummy batch gets: every field, the hybrid index
        fields included, shaped as that step's (a graph captured in a dummy run
        sees what a real step of that batch sees).

        Raises:
            ValueError: ``query_lens`` (or ``num_scheduled_tokens``) missing, or not those counts.
        """
        s, h = self.settings, self._host()
        P = s.pcp_size
        # a _dummy_run: no update_tokens_for_pcp since init_batch_info; the step's layout is h
        dummy = P > 1 and self._record.updated is not h
        u = h if dummy else self._record.updated
        if P > 1:
            _check_query_lens(query_lens, h.num_scheduled if dummy else h.pcp_tokens, dummy)
            if dummy:
                total_num_scheduled_tokens = h.num_tokens
            elif self.pcp_use_hybrid_attn:
                total_num_scheduled_tokens = int(self.num_scheduled_tokens_padded.sum())
        num_actual = int(total_num_scheduled_tokens) * P
        meta = None
        if s.cp_size > 1:
            if num_scheduled_tokens is None:
                raise ValueError("num_scheduled_tokens is required when pcp * dcp > 1")
            nd, n = h.num_decode_reqs, h.num_reqs
            computed_cpu = np.asarray(input_batch.num_computed_tokens_cpu)
            if fixed_decode_seq_lens_cpu is not None:
                decode_context = np.asarray(fixed_decode_seq_lens_cpu)[:nd]
            else:
                decode_context = computed_cpu[:nd] + np.asarray(num_scheduled_tokens)[:nd]
            prefill_context = computed_cpu[nd:n]
            if prefill_context.size or decode_context.dtype != prefill_context.dtype:
                context = np.concatenate([decode_context, prefill_context])
            else:  # only decodes: nothing to join (a fresh array already)
                context = decode_context if fixed_decode_seq_lens_cpu is None else decode_context.copy()
            ori_query_lens = self._view("query_lens", self.query_lens_pcp_full.cpu, num_reqs_padded)
            ql = self.query_lens_pcp_full.np[:num_reqs_padded]  # the same memory, read by numpy
            fla = u.padded_tokens_fla if self.pcp_use_hybrid_attn and u is not None else 0
            fields = dict(
                pcp_use_hybrid_attn=self.pcp_use_hybrid_attn,
                num_actual_tokens_pcp_padded=num_actual,
                num_computed_tokens_of_pcp_dcp=_host.cp_local_seq_lens(context, P, s.dcp_size, s.interleave),
                pcp_unpad_mask=self._view(
                    "unpad_mask", self.pcp_unpad_mask, 0 if u is None else P * u.num_tokens
                ),
                pcp_padded_tokens_fla=fla,
                query_lens_pcp_full_cpu=ori_query_lens,
                max_query_len_pcp_full=int(ql.max()) if ql.size else ori_query_lens.max().item(),
            )
            if self._metadata_cls is None:  # found once (an import attempt per step costs)
                self._metadata_cls = _metadata_class()
            meta = self._metadata_cls(**fields)
            if P > 1:
                self._attach_attention_indices(meta, h, u, num_actual)
            if s.has_spec_config and num_scheduled_tokens is not None:
                meta.dcp_mtp_attn_mask = self._mtp_attention_mask(
                    h, computed_cpu, np.asarray(num_scheduled_tokens), fixed_decode_seq_lens_cpu, num_reqs
                )
            else:
                meta.dcp_mtp_attn_mask = None
        self._set(num_actual_tokens_pcp_padded=num_actual, long_seq_metadata=meta)
        return meta, block_table_tensor

    def _attach_attention_indices(
        self, meta: Any, h: _host.HostLayout, u: _host.HostLayout | None, num_actual: int
    ) -> None:
        step = self._buffers.step
        if h.num_prefill_reqs == 0:  # a decode-only step: every index empty, every list too
            views = self._empty_indices
            if views is None:  # made once (a view costs microseconds; ten of them, every step)
                views = self._empty_indices = {f: step[k][:0] for k, f in _ops.ATTENTION_INDEX_FIELDS.items()}
            meta.__dict__.update(views)
            meta.attn_mask_seqlens, meta.head_attn_nomask_seqlens, meta.tail_attn_nomask_seqlens = [], [], []
            meta.head_actual_seq_lengths_kv, meta.tail_actual_seq_lengths_kv = [], []
            meta.attn_chunk_seqlens = torch.from_numpy(_host.NO_CHUNKS)
        else:
            lists = h.attention  # shared with the steps of the same shape: copies handed out
            C = lists.lengths["q_head_idx"]  # every length is a multiple of it
            last = self._last_views.get("indices")
            if last is None or last[0] != C:
                views = {f: step[k][: lists.lengths[k]] for k, f in _ops.ATTENTION_INDEX_FIELDS.items()}
                last = self._last_views["indices"] = (C, views)
            meta.__dict__.update(last[1])
            meta.attn_mask_seqlens = list(lists.attn_mask_seqlens)
            meta.head_attn_nomask_seqlens = list(lists.head_attn_nomask_seqlens)
            meta.tail_attn_nomask_seqlens = list(lists.tail_attn_nomask_seqlens)
            meta.head_actual_seq_lengths_kv = list(lists.head_actual_seq_lengths_kv)
            meta.tail_actual_seq_lengths_kv = list(lists.tail_actual_seq_lengths_kv)
            meta.attn_chunk_seqlens = torch.from_numpy(lists.chunk_seqlens.copy())
        meta.pcp_allgather_restore_idx = self._view("restore", self.pcp_allgather_restore_idx.gpu, num_actual)
        if self.pcp_use_hybrid_attn and u is not None:
            P, D = self.pcp_world_size, u.num_decode_tokens
            meta.pcp_exit_fa_scatter_idx = self.pcp_exit_fa_scatter_idx.gpu[: u.num_linear_tokens - D]
            meta.pcp_fa_query_idx = self.pcp_fa_query_idx[: num_actual // P - D]
            meta.pcp_enter_fa_restore_idx = self.pcp_enter_fa_restore_idx[: u.enter_fa_len]
            meta.pcp_fa_padding_restore_idx = (
                self.pcp_fa_padding_restore_idx[:num_actual] if u.enter_fa_len < num_actual else None
            )
            meta.max_num_tokens_across_pcp = u.max_tokens_across_pcp
            meta.total_num_scheduled_tokens = u.num_linear_tokens

    def _mtp_attention_mask(
        self,
        h: _host.HostLayout,
        computed_cpu: np.ndarray,
        num_scheduled: np.ndarray,
        fixed_decode_seq_lens_cpu: np.ndarray | None,
        num_reqs: int,
    ) -> torch.Tensor:
        """``dcp_mtp_attn_mask.gpu[:rows]``: the decodes' rows (or ``num_reqs`` rows without decodes).

        The buffer semantics of vllm-ascend's ``generate_pcp_metadata`` /
        ``generate_mtp_attention_mask_for_decode``: rows ``[:nd]`` are rewritten
        (each decode's mask, all False for a decode with no local key) only when
        some decode's last token ``h + n - 1`` reaches this CP rank
        (``>= pcp_rank * dcp_size + dcp_rank``); otherwise, and in a step without
        decodes, the rows returned are what the buffer last held (the rows last
        written, zeros where never written). The values written are the
        interleave-aware mask (for ``cp_kv_cache_interleave_size = 1`` vllm-ascend's).
        """
        buf = self._buffers.dcp_mtp_attn_mask
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
                corrected = not _host.same_ints(decode_computed, h.num_computed[:nd])
                if corrected:
                    # async spec decode corrected the histories: the [R_b] counts staged
                    Rb = self._record.batch.bucket.num_reqs
                    host = np.zeros(Rb, dtype=np.int32)  # the batch's dtype: the same graph serves both
                    host[: h.num_reqs] = h.num_computed
                    host[:nd] = decode_computed
                    with self._graphs.guard():
                        self._buffers.computed_in[:Rb].copy_(torch.from_numpy(host), non_blocking=True)
                self._graphs.mtp_mask(corrected)  # rows [:nd], at the step's bucket
        return buf.gpu[: nd if nd > 0 else num_reqs]
