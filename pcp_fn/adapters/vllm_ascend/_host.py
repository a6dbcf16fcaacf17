"""The host twin: every host value vllm-ascend's 0.23 runner reads, from O(R) numpy.

``model_runner_v1.py`` keeps part of its input preparation on the host: it
gathers input ids from its CPU token table with the positions the manager
returns, reads ``num_pcp_pads_cpu`` to build spec-decode logits indices, and
sizes buffers from Python ints. So the manager must hand it numpy arrays and
ints. They are computed here from the per-request arrays the runner passes in
(``num_scheduled_tokens``, ``num_computed_tokens``, ``num_prompt_tokens``):
O(R) integer arithmetic, the same the pcp_fn layout does on the device, never
a read-back of a device tensor. The only per-token host output is the local
positions array, which the runner needs on the host; it is expanded from O(R)
runs in one vectorised pass.

Everything here is a pure function of its arguments; a :class:`HostLayout` is
frozen and its arrays are never written after it is made. It runs every step,
so each function is a handful of numpy calls on ``[n]`` arrays (a call costs
about a microsecond whatever its size here): the hybrid split is only made
when read (:attr:`HostLayout.linear_counts`), the decode-only and ``P = 1``
steps take shorter paths.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ._settings import ManagerSettings

_ARANGE = np.arange(0, dtype=np.int64)
NO_CHUNKS = np.zeros(0, dtype=np.int32)  # the chunk rows of a step without prefills (empty)


def _arange(n: int) -> np.ndarray:
    """``arange(n)`` int64, a read-only view of a cached one (grown as needed)."""
    global _ARANGE
    if _ARANGE.shape[0] < n:
        _ARANGE = np.arange(max(n, 2 * _ARANGE.shape[0], 1024), dtype=np.int64)
        _ARANGE.flags.writeable = False
    return _ARANGE[:n]


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + length)`` runs: ``[3, 0], [2, 1] -> [3, 4, 0]`` (int64)."""
    lengths = lengths.astype(np.int64, copy=False)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if ends.shape[0] else 0
    # each run's offset from the arange: start - (end - length)
    return np.repeat(starts - ends + lengths, lengths) + _arange(total)


def classify_decodes(
    s: ManagerSettings, sched: np.ndarray, computed: np.ndarray, prompt: np.ndarray
) -> np.ndarray:
    """vllm-ascend ``classify_decode_request_mask``: context, ``<= 1 + k`` tokens, prompt done."""
    done = computed >= prompt
    if s.pd_decode_recompute:
        done = done | (computed == prompt - 1)
    return (computed > 0) & (sched <= s.decode_threshold) & done


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """One step's layout on this rank, per request (arrays ``[n]`` unless said otherwise).

    Fields:
        pcp_size, pcp_rank: ``P`` and this rank.
        num_scheduled, num_computed, num_prompt: int32 copies of the runner's arrays.
        device_prompt: ``num_prompt`` as handed to the device batch (see :func:`host_layout`).
        is_decode: bool, a prefix (decodes first).
        num_decode_reqs, num_decode_tokens: ints.
        num_padded: int64 rows of each request in the gathered, padded order
            (``n * P`` for a decode, ``n`` rounded up to ``2P`` for a prefill).
        pcp_tokens: int32 DualChunkSwap rows of each request on every rank.
        num_tokens: ``N``, their sum (the local token count of the non-hybrid layout).
        total_scheduled: the scheduled tokens, ``sum(num_scheduled)``.

    The hybrid attention split (made when first read): ``linear_counts`` ``[n, P]``
    int64 linear-split prefill tokens of every rank (0 for decodes); ``linear_tokens``
    int32 this rank's linear rows (``n`` for a decode); ``linear_offset`` int64 first
    token of each request this rank holds linearly; ``max_tokens_across_pcp``
    ``M = D + sum(linear_counts[:, 0])`` (0 without prefills: ``D``).
    """

    pcp_size: int
    pcp_rank: int
    num_scheduled: np.ndarray
    num_computed: np.ndarray
    num_prompt: np.ndarray
    device_prompt: np.ndarray
    is_decode: np.ndarray
    num_decode_reqs: int
    num_decode_tokens: int
    num_padded: np.ndarray
    pcp_tokens: np.ndarray
    num_tokens: int
    total_scheduled: int

    @functools.cached_property
    def linear_counts(self) -> np.ndarray:
        P = self.pcp_size
        n64 = self.num_scheduled.astype(np.int64)[:, None]
        counts = n64 // P + (np.arange(P, dtype=np.int64) < n64 % P)
        counts[: self.num_decode_reqs] = 0
        return counts

    @functools.cached_property
    def linear_tokens(self) -> np.ndarray:
        out = self.linear_counts[:, self.pcp_rank].astype(np.int32)
        out[: self.num_decode_reqs] = self.num_scheduled[: self.num_decode_reqs]
        return out

    @functools.cached_property
    def linear_offset(self) -> np.ndarray:
        return self.linear_counts[:, : self.pcp_rank].sum(axis=1)

    @functools.cached_property
    def max_tokens_across_pcp(self) -> int:
        return self.num_decode_tokens + int(self.linear_counts[:, 0].sum())

    @property
    def num_reqs(self) -> int:
        return int(self.num_scheduled.shape[0])

    @property
    def num_prefill_reqs(self) -> int:
        return self.num_reqs - self.num_decode_reqs

    @property
    def num_pads(self) -> np.ndarray:
        """int64 pads of each request (vllm-ascend ``num_pcp_pads_cpu[:n]``)."""
        return self.num_padded - self.num_scheduled

    @property
    def num_linear_tokens(self) -> int:
        """This rank's linear rows (vllm-ascend ``total_num_scheduled_tokens`` with hybrid attention)."""
        return int(self.linear_tokens.sum())

    @property
    def prefill_tokens(self) -> int:
        return int(self.num_scheduled[self.num_decode_reqs :].sum())

    @property
    def padded_tokens_fla(self) -> int:
        """``M - num_linear_tokens``: rows this rank pads its linear buffer with before the all-gather."""
        return self.max_tokens_across_pcp - self.num_linear_tokens

    @property
    def total_padding_tokens_fla(self) -> int:
        """``P * (M - D) - prefill tokens`` (0 without prefills)."""
        if self.num_prefill_reqs == 0:
            return 0
        return self.pcp_size * (self.max_tokens_across_pcp - self.num_decode_tokens) - self.prefill_tokens

    @property
    def enter_fa_len(self) -> int:
        """Rows of the compact full-attention input: ``P * D + prefill tokens``."""
        return self.pcp_size * self.num_decode_tokens + self.prefill_tokens


_FIELDS = tuple(f.name for f in dataclasses.fields(HostLayout))


def host_layout(
    s: ManagerSettings, sched: np.ndarray, computed: np.ndarray, prompt: np.ndarray
) -> HostLayout:
    """The host twin of a step (O(R)).

    The runner orders decodes first, so the decode mask is a prefix. A dummy
    run (``_dummy_run``) can hand stale ``num_computed_tokens`` that classify a
    request after a prefill as a decode; such a request is made a prefill here
    and, through ``device_prompt`` (``num_computed + 2``: the prompt is not
    done), on the device too, so the layout stays well formed.
    """
    sched = np.array(sched, dtype=np.int32)  # fresh: a layout's arrays are never written
    computed = np.array(computed, dtype=np.int32)
    prompt = np.array(prompt, dtype=np.int32)
    P, n = s.pcp_size, sched.shape[0]
    decode = classify_decodes(s, sched, computed, prompt)
    nd = int(np.count_nonzero(decode))
    device_prompt = prompt
    if 0 < nd < n and not decode[:nd].all():  # a decode after a prefill (stale dummy-run counts)
        nd = int(np.argmin(decode))
        late = decode.copy()
        late[:nd] = False
        decode[nd:] = False
        device_prompt = np.where(late, computed + 2, prompt).astype(np.int32)
    m = 2 * P if P > 1 else 1
    n64 = sched.astype(np.int64)
    num_padded = (n64 + (m - 1)) // m * m  # a prefill: padded to 2P
    num_padded[:nd] = n64[:nd] * P  # a decode: replicated
    pcp_tokens = (num_padded // P).astype(np.int32)
    layout = object.__new__(HostLayout)  # frozen: its __init__ sets field by field
    layout.__dict__.update(
        pcp_size=P,
        pcp_rank=s.pcp_rank,
        num_scheduled=sched,
        num_computed=computed,
        num_prompt=prompt,
        device_prompt=device_prompt,
        is_decode=decode,
        num_decode_reqs=nd,
        num_decode_tokens=int(n64[:nd].sum()),
        num_padded=num_padded,
        pcp_tokens=pcp_tokens,
        num_tokens=int(pcp_tokens.sum()),
        total_scheduled=int(n64.sum()),
    )
    return layout


def dcs_positions(h: HostLayout) -> np.ndarray:
    """int32 ``[N]``: offset of each local DualChunkSwap row inside its request's scheduled tokens.

    vllm-ascend ``update_tokens_for_pcp(...)[1]``: a decode's rows are ``0 .. n-1``;
    a prefill's are its head chunk ``r`` then its tail chunk ``2P-1-r``
    (chunks of ``pcp_tokens // 2``). ``P = 2``, tokens ``[1, 5, 8]``, rank 0:
    ``[0, 0, 1, 6, 7, 0, 1, 6, 7]``.
    """
    P, r, nd, n = h.pcp_size, h.pcp_rank, h.num_decode_reqs, h.num_reqs
    if P == 1 or nd == n:  # every request replicated: 0 .. n-1 each (int32 throughout)
        sched = h.num_scheduled
        ends = np.cumsum(sched, dtype=np.int32)
        total = int(ends[-1]) if n else 0
        return _arange(total).astype(np.int32) - np.repeat(ends - sched, sched)
    c = (h.pcp_tokens // 2).astype(np.int64)
    c[:nd] = h.num_scheduled[:nd]
    starts = np.empty(2 * n, dtype=np.int64)  # [head_0, tail_0, head_1, tail_1, ...]
    lengths = np.empty(2 * n, dtype=np.int64)
    np.multiply(c, r, out=starts[0::2])
    np.multiply(c, 2 * P - 1 - r, out=starts[1::2])
    lengths[0::2] = c
    lengths[1::2] = c
    starts[0 : 2 * nd : 2] = 0
    lengths[1 : 2 * nd : 2] = 0  # a decode has no tail
    return _runs(starts, lengths).astype(np.int32)


def linear_positions(h: HostLayout) -> np.ndarray:
    """int64 ``[num_linear_tokens]``: offsets of this rank's linear rows (the hybrid-attention form)."""
    return _runs(h.linear_offset, h.linear_tokens)


def local_tokens(h: HostLayout, hybrid: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(request, offset)`` int64 of each local row: the linear split with hybrid attention, else
    DualChunkSwap (both are the scheduled tokens themselves at ``P = 1``)."""
    counts = h.linear_tokens if hybrid else h.pcp_tokens
    offsets = linear_positions(h) if hybrid else dcs_positions(h).astype(np.int64)
    return np.repeat(np.arange(h.num_reqs, dtype=np.int64), counts), offsets


def logits_indices(h: HostLayout, hybrid_form: bool) -> np.ndarray:
    """int64 ``[n]`` rows to sample (vllm-ascend ``get_logits_indices``).

    DualChunkSwap: the last real token in the padded order, ``padded_start + n - 1``
    (``cu * P - num_pcp_pads - 1``). Hybrid form (``tokens_original`` given):
    ``cumsum(n + (P - 1) * is_decode) - 1``.
    """
    n = h.num_scheduled.astype(np.int64)
    if hybrid_form:
        return np.cumsum(n + (h.pcp_size - 1) * h.is_decode) - 1
    return np.cumsum(h.num_padded) - h.num_padded + n - 1


def adjust_cu(h: HostLayout, cu: np.ndarray) -> np.ndarray:
    """vllm-ascend ``adjust_cu_num_scheduled_tokens_for_pcp``: prefills end at ``P * cu[D-1] + cumsum(n)``.

    Decode rows are kept; the input comes back as it is without prefills.
    """
    nd = h.num_decode_reqs
    if h.num_prefill_reqs <= 0:
        return cu
    base = int(cu[nd - 1]) if nd > 0 else 0
    out = cu.copy()
    out[nd : h.num_reqs] = h.pcp_size * base + np.cumsum(h.num_scheduled[nd:].astype(np.int64))
    return out


def cp_local_seq_lens(seq_lens: np.ndarray, P: int, D: int, interleave: int) -> np.ndarray:
    """``[n] -> [n, P, D]``: KV tokens of each (pcp, dcp) rank, dealt round-robin in ``interleave`` blocks.

    vllm-ascend ``_get_cp_local_seq_lens``, in the input's dtype.
    """
    C = P * D
    s = seq_lens[:, None]
    if interleave == 1:  # s // C each, and one more on the first s % C ranks
        out = s // C + (s % C > np.arange(C, dtype=seq_lens.dtype))
        return out.astype(seq_lens.dtype, copy=False).reshape(-1, P, D)
    base = s // interleave // C * interleave
    rest = np.clip(s - base * C - np.arange(C, dtype=seq_lens.dtype) * interleave, 0, interleave)
    return (base + rest).astype(seq_lens.dtype).reshape(-1, P, D)


@dataclasses.dataclass(frozen=True)
class AttentionLists:
    """The host fields of vllm-ascend's ``AscendPrefillContextParallelMetadata`` for ``P > 1``.

    ``chunk_seqlens``: int32 ``[num_prefill]`` chunk rows ``c`` of each prefill;
    the lists are inclusive cumulative sums of ``c``, ``h*c``, ``t*c``,
    ``(h+1)*c`` and ``(t+1)*c`` (``h`` this rank, ``t = 2P-1-h``); ``lengths``
    maps each index tensor to its real length.
    """

    chunk_seqlens: np.ndarray
    attn_mask_seqlens: list[int]
    head_attn_nomask_seqlens: list[int]
    tail_attn_nomask_seqlens: list[int]
    head_actual_seq_lengths_kv: list[int]
    tail_actual_seq_lengths_kv: list[int]
    lengths: dict[str, int]


def attention_lists(h: HostLayout) -> AttentionLists:
    """The per-request lists and index lengths of the attention metadata (O(R))."""
    P, hd = h.pcp_size, h.pcp_rank
    t = 2 * P - 1 - hd
    c = h.pcp_tokens[h.num_decode_reqs :] // 2
    cum = np.cumsum(c, dtype=np.int64)  # each list is a multiple of it
    C = int(cum[-1]) if cum.shape[0] else 0
    lengths = {
        "q_head_idx": C,
        "q_tail_idx": C,
        "q_full_idx": 2 * C,
        "kv_with_q_head_nomask_idx": hd * C,
        "kv_with_q_head_mask_idx": C,
        "kv_with_q_tail_nomask_idx": t * C,
        "kv_with_q_tail_mask_idx": C,
        "kv_tail_proj_idx": (t + 1) * C,
        "kv_with_q_head_attn_idx_in_tail": (hd + 1) * C,
        "kv_with_q_tail_attn_idx_in_tail": (t + 1) * C,
    }
    return AttentionLists(
        chunk_seqlens=c,
        attn_mask_seqlens=cum.tolist(),
        head_attn_nomask_seqlens=(cum * hd).tolist(),
        tail_attn_nomask_seqlens=(cum * t).tolist(),
        head_actual_seq_lengths_kv=(cum * (hd + 1)).tolist(),
        tail_actual_seq_lengths_kv=(cum * (t + 1)).tolist(),
        lengths=lengths,
    )


def mtp_rows(h: HostLayout, decode_threshold: int) -> int:
    """Rows of the MTP slot layout: every request's tokens plus ``decode_threshold - 2`` extra."""
    return h.total_scheduled + h.num_reqs * max(decode_threshold - 2, 0)
