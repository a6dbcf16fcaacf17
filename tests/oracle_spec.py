"""A slow, obvious reference for the spec-decode (MTP) preparation: plain Python, one request at a time.

It shares no code with ``pcp_fn``. The token layout comes from the core oracle
(``oracle.oracle_step``: every rank's local tokens as explicit (padded row,
position) lists); everything else is read off explicit per-request lists:
"the last ``s`` tokens of the request", "this rank's local rows of the
request", "the MTP rows of the request", found by search, not by formula.
The MTP mask is built from the explicit round-robin deal of KV blocks to
ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from oracle import OracleStep, oracle_cp_local_seq_lens


@dataclass
class LocalToken:
    request: int
    offset: int  # offset inside the request's padded tokens (>= n on pad rows)
    padded_row: int  # row of the restored (padded request order) buffer


def local_tokens(orc: OracleStep, rank: int) -> list[LocalToken]:
    """This rank's local rows in order."""
    owners = [i for i, k in enumerate(orc.pcp_tokens) for _ in range(k)]
    return [LocalToken(i, p, g) for i, p, g in zip(owners, orc.positions[rank], orc.rows[rank])]


def padded_row_of(orc: OracleStep, request: int, offset: int) -> int:
    """Restored row of a real token: rank 0's copy of a decode, the owning rank's row of a prefill."""
    hits = []
    for rank in range(len(orc.rows)):
        for t in local_tokens(orc, rank):
            if t.request == request and t.offset == offset:
                hits.append(t.padded_row)
    assert hits, "token not found"
    return min(hits)  # a decode's copies are rank-major: rank 0's row comes first


def request_starts(counts: list[int]) -> list[int]:
    out, s = [], 0
    for c in counts:
        out.append(s)
        s += c
    return out + [s]


# ------------------------------------------------------------- spec_decode_indices
def oracle_spec_indices(orc: OracleStep, rank: int, sched, drafts, local_ids):
    """The runner's spec metadata; a request with no token samples the row before it (>= 0)."""
    mine = local_tokens(orc, rank)
    starts = request_starts([n + pads for n, pads in zip(sched, orc.num_pads)])  # padded request starts
    logits, local_logits, target, bonus, cu_d, cu_s, draft_ids = [], [], [], [], [], [], []
    total_s = total_d = 0
    for i, n in enumerate(sched):
        s_i = drafts[i] + 1
        rows_i = [k for k, t in enumerate(mine) if t.request == i]
        if n == 0:
            logits.append(max(starts[i] - 1, 0))
            before = [k for k, t in enumerate(mine) if t.request < i]
            local_logits.append(before[-1] if before else 0)
        else:
            for t in range(n - s_i, n):
                logits.append(padded_row_of(orc, i, t))
            local_logits += rows_i[-s_i:]
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
def oracle_decode_hidden_rows(orc: OracleStep, sched):
    return [padded_row_of(orc, i, t) for i, n in enumerate(sched) if orc.is_decode[i] for t in range(n)]


def oracle_draft_rows(orc: OracleStep, rank: int, sched, full_ids):
    """(input id, restored row) of each of the rank's local rows (a decode reads rank 0's copy)."""
    qsl = request_starts(sched)
    out = []
    for t in local_tokens(orc, rank):
        real = t.offset < sched[t.request]
        row = padded_row_of(orc, t.request, t.offset) if orc.is_decode[t.request] else t.padded_row
        out.append((full_ids[qsl[t.request] + t.offset] if real else 0, row))
    return out


def oracle_split(orc: OracleStep, rank: int, sched, full_ids):
    rows = oracle_draft_rows(orc, rank, sched, full_ids)
    mine = local_tokens(orc, rank)
    prefill = [(r, t) for r, t in zip(rows, mine) if not orc.is_decode[t.request]]
    lens = [orc.pcp_tokens[i] for i in range(len(sched)) if not orc.is_decode[i]]
    return dict(
        ids=[r[0] for r, _ in prefill],
        rows=[r[1] for r, _ in prefill],
        seq_lens=lens,
        cu=request_starts(lens),
        max_query_len=max(lens, default=0),
    )


def oracle_first_pass(orc: OracleStep, rank: int, sched, full_ids, tis, logits, thr, seq_lens):
    P = len(orc.rows)
    n_reqs = len(sched)
    if P == 1:
        return dict(
            ids=full_ids[: sum(sched)], rows=list(range(sum(sched))), tis=list(tis), seq_lens=seq_lens
        )
    rows = oracle_draft_rows(orc, rank, sched, full_ids)
    num_prefill = sum(1 for d in orc.is_decode if not d)
    new_tis = list(tis)
    prefill_k = 0
    for i in range(n_reqs):
        if orc.is_decode[i]:
            new_tis[i] = logits[tis[i]]
        else:
            new_tis[i] = logits[len(logits) - num_prefill + prefill_k]
            prefill_k += 1
    new_seq = [orc.pcp_tokens[i] if not orc.is_decode[i] else seq_lens[i] for i in range(n_reqs)]
    prefill_lens = [orc.pcp_tokens[i] for i in range(n_reqs) if not orc.is_decode[i]]
    if prefill_lens:
        max_q = max(thr, max(prefill_lens))
    else:
        max_q = max([n for n, d in zip(sched, orc.is_decode) if d], default=0)
    return dict(
        ids=[r[0] for r in rows],
        rows=[r[1] for r in rows],
        tis=new_tis,
        seq_lens=new_seq,
        qsl=request_starts(orc.pcp_tokens),
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
            continue  # the seed's guard: a query with no local key is left unmasked
        for k, t in enumerate(held):
            if k < cols and t > h + q:
                mask[q][k] = True
    return mask


def oracle_mask_restore(index, P, thr):
    return [0 if j % (P * thr) >= thr else v for j, v in enumerate(index)]


def oracle_drafting_seq_lens(seq_lens, draft_index, pcp, dcp, interleave, pcp_rank, dcp_rank):
    lens = oracle_cp_local_seq_lens([s + draft_index + 1 for s in seq_lens], pcp, dcp, interleave)
    return lens, [row[pcp_rank][dcp_rank] for row in lens]


def oracle_rebuild(orc: OracleStep, rank: int, sched, computed):
    local = [computed[t.request] + t.offset for t in local_tokens(orc, rank)]
    full = [computed[i] + j for i, n in enumerate(sched) for j in range(n)]
    return local, full
