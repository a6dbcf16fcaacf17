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
        self.empty_step: dcs_host.HostLayout | None = None  # the step before the first init_batch_info

    def generate(
        self, total: int, query_lens: torch.Tensor | npt.ArrayLike, input_batch: NPUInputBatch,
        num_scheduled: np.ndarray | None,
        num_reqs_padded: int, num_reqs: int, fixed_decode: np.ndarray | None,
    ) -> Any:  # fmt: skip
        """`generate_pcp_metadata`'s metadata (`None` when `pcp * dcp == 1`); recorded in the cell.

        Before the first `init_batch_info` it describes the empty step (no request: vllm-ascend's
        counts start at 0), its lists and index views empty whatever `query_lens` holds. In a
        `_dummy_run` (no `update_tokens_for_pcp` since `init_batch_info`) the index tensors and
        lists are vllm-ascend's over the dummy batch's counts taken as local rows (the runner runs
        the dummy batch through the model unsplit), `num_actual_tokens_pcp_padded` is `P` times
        the tokens passed; the other fields are the dummy batch's own step's.
        """
        s, h = self.settings, self.records.current.host
        P = s.pcp_size
        if h is None:  # no step yet: the empty one (updated: its layout is its own)
            h = u = self._empty_step()
            dummy, total = False, 0
        else:
            # a _dummy_run: no update_tokens_for_pcp since init_batch_info; the step's layout is h
            dummy = P > 1 and self.records.current.updated is not h
            u = h if dummy else self.records.current.updated
        if P > 1:
            _check_query_lens(query_lens, h.num_scheduled if dummy else h.pcp_tokens, dummy)
            if dummy and s.hybrid_attn:  # vllm-ascend's num_scheduled_tokens_padded: the dummy's counts
                total = h.total_scheduled
            elif s.hybrid_attn:  # the FA query lengths (update_tokens_for_pcp's layout is h)
                total = int(h.pcp_tokens.sum())
        num_actual = int(total) * P
        meta = None
        if s.cp_size > 1:
            s.require_interleave("generate_pcp_metadata")  # the context lengths per CP rank
            if num_scheduled is None:
                raise ValueError("num_scheduled_tokens is required when pcp * dcp > 1")
            computed_cpu = np.asarray(input_batch.num_computed_tokens_cpu)
            context = _context_lengths(h, computed_cpu, num_scheduled, fixed_decode)
            meta = self._metadata(self._fields(h, u, context, num_actual, num_reqs_padded))
            if P > 1:
                self._attach_attention_indices(meta, h, u, num_actual, dummy)
            if s.has_spec_config:
                meta.dcp_mtp_attn_mask = self._mtp_attention_mask(
                    h, computed_cpu, np.asarray(num_scheduled), fixed_decode, num_reqs
                )
            else:
                meta.dcp_mtp_attn_mask = None
        self.records.set(num_actual_tokens_pcp_padded=num_actual, long_seq_metadata=meta)
        return meta

    def _empty_step(self) -> dcs_host.HostLayout:
        """The host twin of a step of no request (made once)."""
        if self.empty_step is None:
            none = np.zeros(0, dtype=np.int32)
            twin = HybridHostLayout if self.settings.hybrid_attn else dcs_host.HostLayout
            self.empty_step = dcs_host.host_layout(self.settings, none, none, none, None, twin)
        return self.empty_step

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
        dummy: bool = False,
    ) -> None:
        step = self.buffers.step
        if dummy and h.num_prefill_reqs > 0:
            # a _dummy_run's forward runs the dummy batch unsplit: its counts are the local rows
            _attach_local_count_indices(meta, step, h, self.graphs)
        elif h.num_prefill_reqs == 0:  # a decode-only step: every index empty, every list too
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


def local_count_indices(
    local: np.ndarray, nd: int, P: int, rank: int
) -> tuple[dict[str, np.ndarray], dict[str, list[int]], np.ndarray]:
    """vllm-ascend's attention index tensors and lists for the prefills `local[nd:]` taken as the
    local rows per request (its `generate_pcp_metadata` over `query_lens`), on the host.

    Prefill `j` has `q` local rows, chunks of `c = q // 2` (head rows `[0, c)`, tail rows
    `[c, 2c)` from its first row; the rows start where the last prefill's `q` end), its K/V
    `P * q` rows of the gathered buffer. Returns the index arrays by their pcp_fn names (int64),
    the five cumulative lists, and the int32 chunk lengths.
    """
    h, t = rank, 2 * P - 1 - rank
    q = np.asarray(local[nd:], dtype=np.int64)
    c = q // 2
    q_off = np.cumsum(q) - q  # exclusive
    kv_off = P * q_off
    proj = c * (t + 1)
    proj_off = np.cumsum(proj) - proj
    head, tail = dcs_host.runs(q_off, c), dcs_host.runs(q_off + c, c)
    both = np.concatenate([head, tail])  # distinct rows: vllm-ascend's argsort of them is this one
    arrays = {
        "q_head_idx": head,
        "q_tail_idx": tail,
        "kv_with_q_head_nomask_idx": dcs_host.runs(kv_off, c * h),
        "kv_with_q_head_mask_idx": dcs_host.runs(kv_off + c * h, c),
        "kv_with_q_tail_nomask_idx": dcs_host.runs(kv_off, c * t),
        "kv_with_q_tail_mask_idx": dcs_host.runs(kv_off + c * t, c),
        "kv_tail_proj_idx": dcs_host.runs(kv_off, proj),
        "kv_with_q_head_attn_idx_in_tail": dcs_host.runs(proj_off, c * (h + 1)),
        "kv_with_q_tail_attn_idx_in_tail": dcs_host.runs(proj_off, proj),
        "q_full_idx": np.argsort(both, kind="stable"),
    }
    lists = {
        "attn_mask_seqlens": np.cumsum(c).tolist(),
        "head_attn_nomask_seqlens": np.cumsum(c * h).tolist(),
        "tail_attn_nomask_seqlens": np.cumsum(c * t).tolist(),
        "head_actual_seq_lengths_kv": np.cumsum(c * (h + 1)).tolist(),
        "tail_actual_seq_lengths_kv": np.cumsum(proj).tolist(),
    }
    return arrays, lists, c.astype(np.int32)


def _attach_local_count_indices(
    meta: Any, step: dict[str, torch.Tensor], h: dcs_host.HostLayout, graphs: _ops.DeviceGraphs
) -> None:
    """A `_dummy_run`'s index fields: `local_count_indices` of its scheduled counts (what the
    runner passes as `query_lens`, checked), written into the step's persistent buffers (the next
    `init_batch_info` rewrites them). They fit: the counts sum to at most `T`, and the local
    capacity `L` holds `T` rows (a batch of `T` decode tokens)."""
    arrays, lists, chunks = local_count_indices(h.num_scheduled, h.num_decode_reqs, h.pcp_size, h.pcp_rank)
    fields = {}
    with graphs.guard():
        for name, field in _ops.ATTENTION_INDEX_FIELDS.items():
            buf, host = step[name], torch.from_numpy(arrays[name])
            if host.shape[0] > buf.shape[0]:  # (never: see above)
                raise ValueError(
                    f"{field}: {host.shape[0]} rows for the dummy batch, {buf.shape[0]} in the buffer"
                )
            fields[field] = buf[: host.shape[0]]
            fields[field].copy_(host, non_blocking=True)
    meta.__dict__.update(fields)
    meta.__dict__.update(lists)
    meta.attn_chunk_seqlens = torch.from_numpy(chunks)


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
