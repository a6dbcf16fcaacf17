"""The DualChunkSwap host twin: every host value vllm-ascend's 0.23 runner reads, from O(R) numpy.

`model_runner_v1.py` keeps part of its input preparation on the host: it
gathers input ids from its CPU token table with the positions the manager
returns, reads `num_pcp_pads_cpu` to build spec-decode logits indices, and
sizes buffers from Python ints. So the manager must hand it numpy arrays and
ints. They are computed here from the per-request arrays the runner passes in
(`num_scheduled_tokens`, `num_computed_tokens`, `num_prompt_tokens`):
O(R) integer arithmetic, the same the pcp_fn layout does on the device, never
a read-back of a device tensor. The only per-token host output is the local
positions array, which the runner needs on the host; it is expanded from O(R)
runs in one vectorised pass. The hybrid layout's twin (its linear split) extends it
([`pcp_fn.hybrid.host.HybridHostLayout`][]).

Everything here is a pure function of its arguments; a [`HostLayout`][pcp_fn.dcs.host.HostLayout] is
frozen and its arrays are never written after it is made. It runs every step,
so each function is a handful of numpy calls on `[n]` arrays (a call costs
about a microsecond whatever its size here): what is derived is only made
when read (cached properties), the decode-only and `P = 1` steps take
shorter paths.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Protocol, TypeVar

import numpy as np

from ..core.checks import INT32_MAX
from ..protocol.batch import DecodeRule, classify_decodes

_ARANGES: dict[type, np.ndarray] = {}
_add_reduce = np.add.reduce  # np.sum without its Python wrapper
NO_CHUNKS = np.zeros(0, dtype=np.int32)  # the chunk rows of a step without prefills (empty)


def _arange(n: int, dtype: type = np.int64) -> np.ndarray:
    """`arange(n, dtype=dtype)`, a read-only view of a cached one (grown as needed)."""
    cached = _ARANGES.get(dtype)
    if cached is None or cached.shape[0] < n:
        size = max(n, 1024) if cached is None else max(n, 2 * cached.shape[0])
        cached = _ARANGES[dtype] = np.arange(size, dtype=dtype)
        cached.flags.writeable = False
    return cached[:n]


def runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated `arange(start, start + length)` runs: `[3, 0], [2, 1] -> [3, 4, 0]` (int64)."""
    lengths = lengths.astype(np.int64, copy=False)
    ends = lengths.cumsum()
    total = int(ends[-1]) if ends.shape[0] else 0
    # each run's offset from the arange: start - (end - length)
    return (starts - ends + lengths).repeat(lengths) + _arange(total)


class HostRule(DecodeRule, Protocol):
    """What the twin reads of its config: a [`pcp_fn.PCPConfig`][], or an engine's settings
    with the same names."""

    @property
    def pcp_size(self) -> int: ...

    @property
    def pcp_rank(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """One step's layout on this rank, per request (arrays `[n]` unless said otherwise).

    Attributes:
        pcp_size: `P`.
        pcp_rank: this rank.
        counts: `[3, n]` int32 copy of the runner's arrays (scheduled, computed, prompt).
        num_scheduled: its first row.
        num_computed: its second row.
        num_prompt: its third row.
        bound: `>=` every count, negative if one is (their bitwise or; 0 without requests).
        device_prompt: `num_prompt` as handed to the device batch (see
            [`host_layout`][pcp_fn.dcs.host.host_layout]).
        is_decode: bool, a prefix (decodes first).
        num_decode_reqs: int, the decode requests.
        num_decode_tokens: int, their tokens.
        pcp_tokens: int32 DualChunkSwap rows of each request on every rank (`n` for a
            decode, `n` rounded up to `2P`, over `P`, for a prefill).
        num_tokens: `N`, their sum (the local token count of the non-hybrid layout).
        total_scheduled: the scheduled tokens, `sum(num_scheduled)`.

    Everything but the counts, the decode mask and `device_prompt` depends on the
    scheduled counts and the number of decodes alone ([`SHAPE`][pcp_fn.dcs.host.HostLayout.SHAPE]):
    a step with the same ones as the last (a steady decode batch) takes them from it
    ([`host_layout`][pcp_fn.dcs.host.host_layout]'s `previous`); the arrays are shared, so a caller
    gets copies.
    """

    pcp_size: int
    pcp_rank: int
    counts: np.ndarray
    bound: int
    num_scheduled: np.ndarray
    num_computed: np.ndarray
    num_prompt: np.ndarray
    device_prompt: np.ndarray
    is_decode: np.ndarray
    num_decode_reqs: int
    num_decode_tokens: int
    pcp_tokens: np.ndarray
    num_tokens: int
    total_scheduled: int

    @functools.cached_property
    def num_padded(self) -> np.ndarray:
        """int64 rows of each request in the gathered, padded order (`n * P` for a decode,
        `n` rounded up to `2P` for a prefill: past int32 for a prefill near `INT32_MAX`)."""
        return self.pcp_tokens.astype(np.int64) * self.pcp_size

    @functools.cached_property
    def dcs_rows(self) -> np.ndarray:
        """[`dcs_positions`][pcp_fn.dcs.host.dcs_positions] (shared: never written)."""
        return dcs_positions(self)

    @functools.cached_property
    def logits(self) -> np.ndarray:
        """[`logits_indices`][pcp_fn.dcs.host.logits_indices] (shared: never written)."""
        return logits_indices(self, False)

    @functools.cached_property
    def logits_hybrid(self) -> np.ndarray:
        """[`logits_indices`][pcp_fn.dcs.host.logits_indices] in the hybrid form (shared: never written)."""
        return logits_indices(self, True)

    @functools.cached_property
    def attention(self) -> AttentionLists:
        """[`attention_lists`][pcp_fn.dcs.host.attention_lists] (shared: its lists and arrays are
        never written)."""
        return attention_lists(self)

    @property
    def num_reqs(self) -> int:
        return int(self.num_scheduled.shape[0])

    @property
    def num_prefill_reqs(self) -> int:
        return self.num_reqs - self.num_decode_reqs

    @functools.cached_property
    def num_pads(self) -> np.ndarray:
        """int32 pads of each request (vllm-ascend `num_pcp_pads_cpu[:n]`; fewer than `2P`)."""
        return (self.num_padded - self.num_scheduled).astype(np.int32)

    @property
    def prefill_tokens(self) -> int:
        return int(self.num_scheduled[self.num_decode_reqs :].sum())

    def local_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """`(request, offset)` int64 of each local row (the scheduled tokens themselves at `P = 1`)."""
        request = np.repeat(np.arange(self.num_reqs, dtype=np.int64), self.pcp_tokens)
        return request, self.dcs_rows.astype(np.int64)

    SHAPE: ClassVar[tuple[str, ...]] = (
        "pcp_tokens",
        "num_tokens",
        "num_decode_tokens",
        "total_scheduled",
        "num_padded",
        "num_pads",
        "dcs_rows",
        "logits",
        "logits_hybrid",
        "attention",
    )
    """What a layout derives from its scheduled counts and number of decodes alone (fields and
    cached values): a step repeating the last one's takes them from it
    ([`host_layout`][pcp_fn.dcs.host.host_layout])."""


H = TypeVar("H", bound="HostLayout")


def host_layout(
    s: HostRule,
    sched: np.ndarray,
    computed: np.ndarray,
    prompt: np.ndarray,
    previous: H | None = None,
    cls: type[H] = HostLayout,  # type: ignore[assignment]
) -> H:
    """The host twin of a step (O(R)).

    The runner orders decodes first, so the decode mask is a prefix. A dummy
    run (`_dummy_run`) can hand stale `num_computed_tokens` that classify a
    request after a prefill as a decode; such a request is made a prefill here
    and, through `device_prompt` (`num_computed + 2`: the prompt is not
    done), on the device too, so the layout stays well formed.

    `previous` (the last step's layout, of the same settings and class): when this step has
    its scheduled counts and number of decodes, everything in `cls.SHAPE` it made is reused.
    `cls`: [`HostLayout`][pcp_fn.dcs.host.HostLayout] or a subclass (the hybrid layout's twin).
    """
    # one fresh [3, n] copy (a layout's arrays are never written; the runner's are, later)
    counts = np.array((sched, computed, prompt), dtype=np.int32)
    sched, computed, prompt = counts[0], counts[1], counts[2]
    P, n = s.pcp_size, sched.shape[0]
    bound = int(np.bitwise_or.reduce(counts, axis=None)) if n else 0
    decode = classify_decodes(s, sched, computed, prompt)
    nd = int(np.count_nonzero(decode))
    device_prompt = prompt
    if 0 < nd < n and not decode[:nd].all():  # a decode after a prefill (stale dummy-run counts)
        nd = int(np.argmin(decode))
        late = decode.copy()
        late[:nd] = False
        decode[nd:] = False
        device_prompt = np.where(late, computed + 2, prompt).astype(np.int32)
    layout = object.__new__(cls)  # frozen: its __init__ sets field by field
    fields = layout.__dict__
    fields.update(
        pcp_size=P,
        pcp_rank=s.pcp_rank,
        counts=counts,
        bound=bound,
        num_scheduled=sched,
        num_computed=computed,
        num_prompt=prompt,
        device_prompt=device_prompt,
        is_decode=decode,
        num_decode_reqs=nd,
    )
    if (
        previous is not None
        and previous.num_decode_reqs == nd
        and previous.num_scheduled.tobytes() == sched.tobytes()
    ):  # the last step's shape (a steady decode batch)
        last = previous.__dict__
        fields.update({name: last[name] for name in cls.SHAPE if name in last})
        return layout
    # int32 sums where they cannot wrap (each of the n counts <= bound; a local count <= 2 * it):
    # numpy's default widening to int64 makes a reduction twice as slow
    acc = np.int32 if 0 <= 2 * bound * n <= INT32_MAX else np.int64
    total = int(_add_reduce(sched, dtype=acc))
    if P > 1 and nd < n:  # a prefill: padded to 2P, two chunks here; a decode: replicated
        # 2 * ceil(n / 2P) as ((n - 1) // 2P + 1) * 2: n - 1 cannot pass int32 where n + 2P - 1 can
        pcp_tokens = sched - 1
        pcp_tokens //= 2 * P
        pcp_tokens += 1
        pcp_tokens *= 2
        pcp_tokens[:nd] = sched[:nd]
        num_tokens = int(_add_reduce(pcp_tokens, dtype=acc))
        decode_tokens = int(_add_reduce(sched[:nd], dtype=acc))
    else:  # P = 1, or only decodes: every request's tokens as they are
        pcp_tokens, num_tokens = sched, total
        decode_tokens = total if nd == n else int(_add_reduce(sched[:nd], dtype=acc))
    fields.update(
        num_decode_tokens=decode_tokens, pcp_tokens=pcp_tokens, num_tokens=num_tokens, total_scheduled=total
    )
    return layout


def dcs_positions(h: HostLayout) -> np.ndarray:
    """int32 `[N]`: offset of each local DualChunkSwap row inside its request's scheduled tokens.

    vllm-ascend `update_tokens_for_pcp(...)[1]`: a decode's rows are `0 .. n-1`;
    a prefill's are its head chunk `r` then its tail chunk `2P-1-r`
    (chunks of `pcp_tokens // 2`). `P = 2`, tokens `[1, 5, 8]`, rank 0:
    `[0, 0, 1, 6, 7, 0, 1, 6, 7]`.
    """
    P, r, nd, n = h.pcp_size, h.pcp_rank, h.num_decode_reqs, h.num_reqs
    if P == 1 or nd == n:  # every request replicated: 0 .. n-1 each (int32 throughout)
        sched = h.num_scheduled
        return _arange(h.total_scheduled, np.int32) - (sched.cumsum(dtype=np.int32) - sched).repeat(sched)
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
    return runs(starts, lengths).astype(np.int32)


def logits_indices(h: HostLayout, hybrid_form: bool) -> np.ndarray:
    """int64 `[n]` rows to sample (vllm-ascend `get_logits_indices`).

    DualChunkSwap: the last real token in the padded order, `padded_start + n - 1`
    (`cu * P - num_pcp_pads - 1`). Hybrid form (`tokens_original` given):
    `cumsum(n + (P - 1) * is_decode) - 1`.
    """
    if hybrid_form:
        return np.cumsum(h.num_scheduled.astype(np.int64) + (h.pcp_size - 1) * h.is_decode) - 1
    return h.num_padded.cumsum(dtype=np.int64) - h.num_pads - 1  # end - pads - 1


def adjust_cu(h: HostLayout, cu: np.ndarray) -> np.ndarray:
    """vllm-ascend `adjust_cu_num_scheduled_tokens_for_pcp`: prefills end at `P * cu[D-1] + cumsum(n)`.

    Decode rows are kept; the input comes back as it is without prefills.
    """
    nd = h.num_decode_reqs
    if h.num_prefill_reqs <= 0:
        return cu
    base = int(cu[nd - 1]) if nd > 0 else 0
    out = cu.copy()
    out[nd : h.num_reqs] = h.pcp_size * base + np.cumsum(h.num_scheduled[nd:].astype(np.int64))
    return out


@dataclasses.dataclass(frozen=True)
class AttentionLists:
    """The host fields of vllm-ascend's `AscendPrefillContextParallelMetadata` for `P > 1`.

    `chunk_seqlens`: int32 `[num_prefill]` chunk rows `c` of each prefill;
    the lists are inclusive cumulative sums of `c`, `h*c`, `t*c`,
    `(h+1)*c` and `(t+1)*c` (`h` this rank, `t = 2P-1-h`); `lengths`
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
    """Rows of the MTP slot layout: every request's tokens plus `decode_threshold - 2` extra."""
    return h.total_scheduled + h.num_reqs * max(decode_threshold - 2, 0)
