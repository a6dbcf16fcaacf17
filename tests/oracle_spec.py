"""A slow, obvious reference for the spec-decode (MTP) preparation: plain Python, one request at a time.

It shares no code with ``pcp_fn``. The token layout comes from the core
oracles (``oracle.oracle_step`` for DualChunkSwap, ``oracle_hybrid`` for the
hybrid-attention layout: every rank's local tokens as explicit lists), turned
into one explicit :class:`SpecView` per rank: the local rows, the row of the
restored hidden states holding each token, and the rows of the drafter's
first pass. Everything else is read off explicit per-request lists: "the last
``s`` tokens of the request", "this rank's local rows of the request", "the
MTP rows of the request", found by search, not by formula. The MTP mask is
built from the explicit round-robin deal of KV blocks to ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from oracle import oracle_cp_local_seq_lens, oracle_step
from oracle_hybrid import oracle_hybrid


@dataclass
class SpecView:
    """What the spec-decode prep reads of one step's layout on one rank, as explicit lists."""

    P: int
    sched: list[int]
    is_decode: list[bool]
    local: list[tuple[int, int]]  # (request, offset) of each local row, in order
    restored: dict[tuple[int, int], int]  # (request, offset) -> row of the restored hidden states
    # (rank 0's copy of a decode token; DualChunkSwap pads have rows too, hybrid pads none)
    empty_start: dict[int, int]  # where a request with no token would start in the restored rows
    first_pass: list[tuple[int, int]]  # (request, offset) of each row of the drafter's first pass

    @property
    def local_counts(self) -> list[int]:
        return [sum(1 for i, _ in self.local if i == r) for r in range(len(self.sched))]

    @property
    def first_pass_counts(self) -> list[int]:
        return [sum(1 for i, _ in self.first_pass if i == r) for r in range(len(self.sched))]

    def restored_start(self, i: int) -> int:
        return self.restored[(i, 0)] if self.sched[i] else self.empty_start[i]


def _padded(n: int, P: int) -> int:
    multiple = 2 * P if P > 1 else 1
    return (n + multiple - 1) // multiple * multiple


def dcs_view(P, sched, comp, prompt, spec, rank) -> SpecView:
    orc = oracle_step(P, sched, comp, prompt, spec)
    owners = [i for i, k in enumerate(orc.pcp_tokens) for _ in range(k)]
    per_rank = [list(zip(owners, orc.positions[r])) for r in range(P)]
    restored: dict[tuple[int, int], int] = {}
    for r in range(P):
        for tok, row in zip(per_rank[r], orc.rows[r]):
            restored[tok] = min(restored.get(tok, row), row)  # a decode's copies: rank 0's comes first
    starts = request_starts([n + pads for n, pads in zip(sched, orc.num_pads)])
    empty = {i: starts[i] for i, n in enumerate(sched) if n == 0}
    local = per_rank[rank]
    return SpecView(P, list(sched), list(orc.is_decode), local, restored, empty, local)


def hybrid_view(P, sched, comp, prompt, spec, rank) -> SpecView:
    h = oracle_hybrid(P, sched, comp, prompt, spec)
    restored: dict[tuple[int, int], int] = {}
    for g, (q, tok) in enumerate(h.fa_order()):
        if q == 0 or not h.decode[tok[0]]:  # rank 0's copy of a decode token; a prefill token's one row
            restored[tok] = g
    D = h.num_decode_tokens
    empty = {}
    for i, n in enumerate(sched):
        if n == 0:  # where its tokens would go: after the earlier decodes' rank-0 rows / earlier prefills
            before = sum(m for m, d in zip(sched[:i], h.decode) if d == h.decode[i])
            empty[i] = (before * (1 if spec else P)) if h.decode[i] else P * D + before
    first_pass = []
    for i, n in enumerate(sched):
        if h.decode[i]:
            first_pass += [(i, t) for t in range(n)]
    for i, n in enumerate(sched):
        if not h.decode[i]:  # the rank's linear slice of the request padded to 2P
            k = _padded(n, P) // P
            first_pass += [(i, rank * k + j) for j in range(k)]
    return SpecView(P, list(sched), list(h.decode), list(h.linear[rank]), restored, empty, first_pass)


def spec_view(hybrid: bool, P, sched, comp, prompt, spec, rank) -> SpecView:
    return (hybrid_view if hybrid else dcs_view)(P, sched, comp, prompt, spec, rank)


def request_starts(counts: list[int]) -> list[int]:
    out, s = [], 0
    for c in counts:
        out.append(s)
        s += c
    return out + [s]


# ------------------------------------------------------------- spec_decode_indices
def oracle_spec_indices(view: SpecView, drafts, local_ids):
    """The runner's spec metadata; a request with no token samples the row before it (>= 0)."""
    mine = view.local
    logits, local_logits, target, bonus, cu_d, cu_s, draft_ids = [], [], [], [], [], [], []
    total_s = total_d = 0
    for i, n in enumerate(view.sched):
        s_i = drafts[i] + 1
        rows_i = [k for k, t in enumerate(mine) if t[0] == i]
        if n == 0:
            logits.append(max(view.restored_start(i) - 1, 0))
        else:
            for t in range(n - s_i, n):
                logits.append(view.restored[(i, t)])
        # the last s local rows up to the request's end: its own, or (a request with fewer rows on this
        # rank: empty, or a hybrid prefill's linear share) the rows before it, 0 before the first row
        upto = [k for k, t in enumerate(mine) if t[0] <= i][-s_i:]
        local_logits += [0] * (s_i - len(upto)) + upto
        for k in range(drafts[i]):
            target.append(total_s + k)
            draft_ids.append(local_ids[rows_i[-s_i:][k + 1]])
        total_s += s_i
        total_d += drafts[i]
        bonus.append(total_s - 1)
        cu_s.append(total_s)
        cu_d.append(total_d)
    return dict(
        logits=logits,
        local_logits=local_logits,
        target=target,
        bonus=bonus,
        cu_draft=cu_d,
        cu_sampled=cu_s,
        draft_ids=draft_ids,
    )


# ------------------------------------------------------------- full inputs
def oracle_full_inputs(sched, comp, table, k, P, slot_fn=None, pad=-1):
    ids, positions = [], []
    for i, n in enumerate(sched):
        for j in range(n):
            ids.append(table[i][comp[i] + j])
            positions.append(comp[i] + j)
    qsl = request_starts(sched)
    extra = max(k - 1, 0)
    mtp = [(i, comp[i] + j) for i, n in enumerate(sched) for j in range(n + extra)] if extra else None
    slots = None
    if mtp is not None and slot_fn is not None:
        slots = []
        for i, p in mtp:
            slots += [slot_fn(i, p)] + [pad] * (P - 1)
    return dict(ids=ids, positions=positions, qsl=qsl, mtp=mtp, mtp_slots=slots)


def oracle_repair(sched, is_decode, ids, prev_sampled, draft, prev_positions, k):
    out = list(ids)
    qsl = request_starts(sched)
    for i, n in enumerate(sched):
        prev = prev_positions[i]
        if prev < 0 or n == 0:
            continue
        drafts = n - 1 if is_decode[i] else 0
        first = qsl[i + 1] - 1 - drafts
        out[first] = prev_sampled[prev][0]
        if draft is not None and k:
            flat = [t for row in draft for t in row]
            for j in range(min(drafts, k)):
                out[first + 1 + j] = flat[prev * k + j]
    return out


# ------------------------------------------------------------- draft first pass
def oracle_decode_hidden_rows(view: SpecView):
    return [view.restored[(i, t)] for i, n in enumerate(view.sched) if view.is_decode[i] for t in range(n)]


def oracle_draft_rows(view: SpecView, full_ids):
    """(input id, restored row or None) of each first-pass row; a pad reads id 0, and no row where
    the restored buffer has none (hybrid)."""
    qsl = request_starts(view.sched)
    out = []
    for i, off in view.first_pass:
        real = off < view.sched[i]
        out.append((full_ids[qsl[i] + off] if real else 0, view.restored.get((i, off))))
    return out


def oracle_split(view: SpecView, full_ids):
    rows = oracle_draft_rows(view, full_ids)
    prefill = [r for r, (i, _) in zip(rows, view.first_pass) if not view.is_decode[i]]
    counts = view.first_pass_counts
    lens = [counts[i] for i in range(len(view.sched)) if not view.is_decode[i]]
    return dict(
        ids=[r[0] for r in prefill],
        rows=[r[1] for r in prefill],
        seq_lens=lens,
        cu=request_starts(lens),
        max_query_len=max(lens, default=0),
    )


def oracle_first_pass(view: SpecView, full_ids, tis, logits, thr, seq_lens):
    sched, P = view.sched, view.P
    n_reqs = len(sched)
    if P == 1:
        return dict(
            ids=full_ids[: sum(sched)], rows=list(range(sum(sched))), tis=list(tis), seq_lens=seq_lens
        )
    rows = oracle_draft_rows(view, full_ids)
    counts = view.first_pass_counts
    num_prefill = sum(1 for d in view.is_decode if not d)
    new_tis = list(tis)
    prefill_k = 0
    for i in range(n_reqs):
        if view.is_decode[i]:
            new_tis[i] = logits[tis[i]]
        else:
            new_tis[i] = logits[len(logits) - num_prefill + prefill_k]
            prefill_k += 1
    new_seq = [counts[i] if not view.is_decode[i] else seq_lens[i] for i in range(n_reqs)]
    prefill_lens = [counts[i] for i in range(n_reqs) if not view.is_decode[i]]
    if prefill_lens:
        max_q = max(thr, max(prefill_lens))
    else:
        max_q = max([n for n, d in zip(sched, view.is_decode) if d], default=0)
    return dict(
        ids=[r[0] for r in rows],
        rows=[r[1] for r in rows],
        tis=new_tis,
        seq_lens=new_seq,
        qsl=request_starts(counts),
        max_query_len=max_q,
    )


# ------------------------------------------------------------- MTP
def oracle_mtp_slot_indices(sched, comp, tis, k, P, num_reqs):
    """Find each request's last accepted token among the MTP rows; its P token-strided entries."""
    extra = max(k - 1, 0)
    mtp = [(i, comp[i] + j) for i, n in enumerate(sched) for j in range(n + extra)]
    qsl = request_starts(sched)
    out = []
    for i in range(num_reqs):
        accepted_offset = tis[i] - qsl[i]  # the last accepted token's offset in the request
        row = mtp.index((i, comp[i] + accepted_offset))
        out += [row * P + r for r in range(P)]
    return out


def local_kv_positions(total: int, C: int, c: int, interleave: int) -> list[int]:
    """Global positions of a request's first ``total`` tokens held by CP rank ``c`` (round-robin blocks)."""
    return [t for t in range(total) if (t // interleave) % C == c]


def oracle_mtp_mask(h: int, n: int, thr: int, cols: int, C: int, c: int, interleave: int):
    """``[thr][cols]`` True = blocked: query q (token h+q) may not see a local key at a later position."""
    held = local_kv_positions(h + n, C, c, interleave)
    mask = [[False] * cols for _ in range(thr)]
    for q in range(min(n, thr)):
        seen = [t for t in held if t <= h + q]
        if not seen:
            continue  # vllm-ascend's guard: a query with no local key is left unmasked
        for k, t in enumerate(held):
            if k < cols and t > h + q:
                mask[q][k] = True
    return mask


def oracle_mask_restore(index, P, thr):
    return [0 if j % (P * thr) >= thr else v for j, v in enumerate(index)]


def oracle_drafting_seq_lens(seq_lens, draft_index, pcp, dcp, interleave, pcp_rank, dcp_rank):
    lens = oracle_cp_local_seq_lens([s + draft_index + 1 for s in seq_lens], pcp, dcp, interleave)
    return lens, [row[pcp_rank][dcp_rank] for row in lens]


def oracle_rebuild(view: SpecView, computed):
    local = [computed[i] + off for i, off in view.local]
    full = [computed[i] + j for i, n in enumerate(view.sched) for j in range(n)]
    return local, full
