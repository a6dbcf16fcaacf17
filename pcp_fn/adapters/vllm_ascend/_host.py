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
frozen and its arrays are never written after it is made.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._settings import ManagerSettings


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + length)`` runs: ``[3, 0], [2, 1] -> [3, 4, 0]`` (int64)."""
    lengths = lengths.astype(np.int64)
    first = np.cumsum(lengths) - lengths
    return np.repeat(starts.astype(np.int64) - first, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def _interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.stack([a, b], axis=-1).reshape(-1)


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
        linear_counts: ``[n, P]`` int64 linear-split prefill tokens of every rank (0 for decodes).
        linear_tokens: int32 this rank's linear rows (``n`` for a decode).
        linear_offset: int64 first token of each request this rank holds linearly.
        max_tokens_across_pcp: ``M = D + sum(linear_counts[:, 0])`` (0 without prefills: ``D``).
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
    linear_counts: np.ndarray
    linear_tokens: np.ndarray
    linear_offset: np.ndarray
    max_tokens_across_pcp: int

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
    sched = np.array(sched, dtype=np.int32)
    computed = np.array(computed, dtype=np.int32)
    prompt = np.array(prompt, dtype=np.int32)
    P, rank = s.pcp_size, s.pcp_rank
    decode = classify_decodes(s, sched, computed, prompt)
    first_prefill = int(np.argmin(decode)) if not decode.all() else decode.size
    late = decode.copy()
    late[:first_prefill] = False
    decode[first_prefill:] = False
    device_prompt = np.where(late, computed + 2, prompt).astype(np.int32)
    nd = first_prefill
    n64 = sched.astype(np.int64)
    m = 2 * P if P > 1 else 1
    num_padded = np.where(decode | (P == 1), n64 * P, -(-n64 // m) * m)
    pcp_tokens = (num_padded // P).astype(np.int32)
    q = np.arange(P, dtype=np.int64)
    counts = np.where(decode[:, None], 0, n64[:, None] // P + (q < n64[:, None] % P))
    linear = np.where(decode, n64, counts[:, rank]).astype(np.int32)
    offset = np.where(decode, 0, counts[:, :rank].sum(axis=1))
    D = int(n64[:nd].sum())
    return HostLayout(
        pcp_size=P,
        pcp_rank=rank,
        num_scheduled=sched,
        num_computed=computed,
        num_prompt=prompt,
        device_prompt=device_prompt,
        is_decode=decode,
        num_decode_reqs=nd,
        num_decode_tokens=D,
        num_padded=num_padded,
        pcp_tokens=pcp_tokens,
        num_tokens=int(pcp_tokens.sum()),
        linear_counts=counts,
        linear_tokens=linear,
        linear_offset=offset.astype(np.int64),
        max_tokens_across_pcp=D + int(counts[:, 0].sum()),
    )


def dcs_positions(h: HostLayout) -> np.ndarray:
    """int32 ``[N]``: offset of each local DualChunkSwap row inside its request's scheduled tokens.

    vllm-ascend ``update_tokens_for_pcp(...)[1]``: a decode's rows are ``0 .. n-1``;
    a prefill's are its head chunk ``r`` then its tail chunk ``2P-1-r``
    (chunks of ``pcp_tokens // 2``). ``P = 2``, tokens ``[1, 5, 8]``, rank 0:
    ``[0, 0, 1, 6, 7, 0, 1, 6, 7]``.
    """
    P, r = h.pcp_size, h.pcp_rank
    rep = h.is_decode | (P == 1)
    c = np.where(rep, h.num_scheduled, h.pcp_tokens // 2).astype(np.int64)
    head_start = np.where(rep, 0, r * c)
    tail_start = (2 * P - 1 - r) * c
    tail_len = np.where(rep, 0, c)
    return _runs(_interleave(head_start, tail_start), _interleave(c, tail_len)).astype(np.int32)


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
    c = (h.pcp_tokens[h.num_decode_reqs :] // 2).astype(np.int64)
    C = int(c.sum())

    def cum(scale: int) -> list[int]:
        return np.cumsum(scale * c).tolist()

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
        chunk_seqlens=c.astype(np.int32),
        attn_mask_seqlens=cum(1),
        head_attn_nomask_seqlens=cum(hd),
        tail_attn_nomask_seqlens=cum(t),
        head_actual_seq_lengths_kv=cum(hd + 1),
        tail_actual_seq_lengths_kv=cum(t + 1),
        lengths=lengths,
    )


def mtp_rows(h: HostLayout, decode_threshold: int) -> int:
    """Rows of the MTP slot layout: every request's tokens plus ``decode_threshold - 2`` extra."""
    return int(h.num_scheduled.sum()) + h.num_reqs * max(decode_threshold - 2, 0)
