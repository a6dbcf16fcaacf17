"""A slow, obvious reference for the MRV2 PCP layout: plain Python, one request at a time.

It shares no code with ``pcp_fn``. Every rank's rows are built as explicit
lists of global token indices ("pieces"); every answer is read off those
lists, and the restore index is found by searching the gathered rows.

The rules (vLLM ``PCPManager``): a prefilling request is cut into ``2P`` chunks
of ``ceil(n / 2P)`` tokens (the last ones shorter or empty); rank ``q`` takes
chunks ``q`` and ``2P-1-q``. A request that is not prefilling -- or, with DCP,
a prefill whose last chunk would be empty -- is replicated: on every rank, KV
written by rank 0; or, with sharding, on rank ``k % P`` for the ``k``-th such
non-empty request. Each rank lists its non-prefilling requests first.

Fixed shapes: a bucket ``(Rl, Lp)`` pads every rank to ``Lp`` local rows and
the global token rows to ``min(T, P * Lp)`` (each global token is written by
one copy on one rank, so there are at most ``P * Lp`` of them); padding gathers
global token 0 and restores from gathered row 0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Piece:
    req: int  # global batch row
    prefilling: bool
    tokens: list[int]  # global token indices, in order
    writes: bool  # this copy writes the KV cache


def balanced_cuts(n, k, P) -> list[int]:
    """``[b_0 .. b_P]``: the cost-balanced cuts of a prefill of ``n`` tokens behind ``k``, by
    scanning every ``b`` (the largest ``b`` whose first tokens cost at most ``q/P`` of the work;
    token ``j`` attends ``k + j + 1`` keys)."""
    cost = [0]
    for j in range(n):
        cost.append(cost[-1] + k + j + 1)
    return [max(b for b in range(n + 1) if P * cost[b] <= q * cost[n]) for q in range(P + 1)]


def split_runs(split, P, q, tokens, computed) -> list[list[int]]:
    """Rank ``q``'s runs of a split prefill's ``tokens`` (global ids), in ascending order."""
    n = len(tokens)
    if split == "cost-balanced":
        cuts = balanced_cuts(n, computed, P)
        return [tokens[cuts[q] : cuts[q + 1]]]
    size = -(-n // (2 * P))
    chunks = [tokens[c * size : (c + 1) * size] for c in range(2 * P)]
    held = (q, 2 * P - 1 - q) if split == "head-tail" else (q, P + q)  # round-robin: chunks q, P+q
    return [chunks[c] for c in held]


def rank_pieces(
    P, sched, prefilling, shard=False, dcp=1, split="head-tail", computed=None
) -> list[list[Piece]]:
    """Every rank's pieces, in the rank's local order (``split``: vLLM's head-tail chunks,
    ``"round-robin"`` or ``"cost-balanced"``, which reads ``computed``)."""
    ranks: list[list[Piece]] = [[] for _ in range(P)]
    computed = computed or [0] * len(sched)
    first = 0
    replicated_seen = 0
    for i, n in enumerate(sched):
        tokens = list(range(first, first + n))
        first += n
        if n == 0:
            continue
        size = -(-n // (2 * P))
        chunks = [tokens[k * size : (k + 1) * size] for k in range(2 * P)]
        too_short = dcp > 1 and not chunks[-1]
        if prefilling[i] and not too_short:
            for q in range(P):
                for run in split_runs(split, P, q, tokens, computed[i]):
                    if run:
                        ranks[q].append(Piece(i, True, run, True))
        elif shard:
            owner = replicated_seen % P
            replicated_seen += 1
            ranks[owner].append(Piece(i, bool(prefilling[i]), tokens, True))
        else:
            for q in range(P):
                ranks[q].append(Piece(i, bool(prefilling[i]), tokens, q == 0))
    return [[p for p in ps if not p.prefilling] + [p for p in ps if p.prefilling] for ps in ranks]


@dataclass
class OracleLayout:
    per_rank_num_tokens: list[int]
    hidden_restore_idx: list[int]  # [num global tokens]
    padded_gather_idx: list[int]  # [P * Lp]
    write_mask: list[bool]  # [P * Lp]
    global_rows: int | None = None  # min(T, P * Lp) when T is given

    def padded_restore_idx(self) -> list[int]:
        """``[global_rows]``: the restore index, then gathered row 0 for every padding row."""
        assert self.global_rows is not None, "oracle_layout(..., T=...) sets the global rows"
        return self.hidden_restore_idx + [0] * (self.global_rows - len(self.hidden_restore_idx))

    def restore(self, gathered: list) -> list:
        """The restored rows ``[global_rows]`` of a gathered list ``[P * Lp]`` (row by row)."""
        return [gathered[row] for row in self.padded_restore_idx()]


def oracle_layout(
    P, sched, prefilling, Lp, shard=False, dcp=1, T=None, split="head-tail", computed=None
) -> OracleLayout:
    """Every rank's rows padded to ``Lp``; with ``T`` the global rows ``min(T, P * Lp)`` too."""
    ranks = rank_pieces(P, sched, prefilling, shard, dcp, split, computed)
    gather, write = [], []
    for pieces in ranks:
        rows = [(t, p.writes) for p in pieces for t in p.tokens]
        assert len(rows) <= Lp, "a rank holds more tokens than the bucket"
        rows += [(0, False)] * (Lp - len(rows))
        gather += [t for t, _ in rows]
        write += [w for _, w in rows]
    restore = []
    for g in range(sum(sched)):
        hits = [row for row, (t, w) in enumerate(zip(gather, write)) if w and t == g]
        assert len(hits) == 1, f"global token {g} is written {len(hits)} times"
        restore.append(hits[0])
    rows = None
    if T is not None:
        rows = min(T, P * Lp)
        assert len(restore) <= rows, "more global tokens than the bucket's global rows"
    return OracleLayout([sum(len(p.tokens) for p in ps) for ps in ranks], restore, gather, write, rows)


def dcp_rank0_share(seq_len, dcp, interleave):
    """KV tokens DCP rank 0 holds when blocks of ``interleave`` tokens are dealt round-robin."""
    return sum(1 for t in range(seq_len) if (t // interleave) % dcp == 0)


@dataclass
class OracleLocal:
    num_reqs: int
    num_tokens: int
    global_batch_req_idx: list[int]
    idx_mapping: list[int]
    num_scheduled_tokens: list[int]
    num_computed_tokens: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    seq_lens_cpu_upper_bound: list[int]
    dcp_bound: list[int] | None
    prefill_len: list[int]
    num_computed_prefill_tokens: list[int]
    is_prefilling: list[bool]
    input_ids: list[int]
    positions: list[int]
    is_padding: list[bool]
    moe_is_padding: list[bool] | None
    logits_indices: list[int]
    cu_num_logits: list[int]
    gather_idx: list[int]


def oracle_local(
    P,
    rank,
    batch,
    Lp,
    Rl,
    *,
    shard=False,
    dcp=1,
    interleave=1,
    moe=False,
    split="head-tail",
) -> OracleLocal:
    """Rank ``rank``'s local batch; ``batch`` holds the global lists (scheduler order):
    sched, computed, prefill_len, prefilling, idx_mapping, input_ids, positions."""
    sched = batch["sched"]

    def at(name, i):  # the fixed-shape batch pads its request rows with zeros
        values = batch[name]
        return values[i] if i < len(values) else 0

    ranks = rank_pieces(P, sched, batch["prefilling"], shard, dcp, split, batch["computed"])
    pieces = ranks[rank]
    request_first = [sum(sched[:i]) for i in range(len(sched))]
    tokens = [t for p in pieces for t in p.tokens]
    pad = Lp - len(tokens)
    rows = pieces if pieces else [Piece(0, False, [], False)]  # the placeholder row
    real = len(pieces)

    req, length, start, plen, seq, qsl = [], [], [], [], [], [0]
    for p in rows:
        req.append(p.req)
        length.append(len(p.tokens))
        offset = p.tokens[0] - request_first[p.req] if p.tokens else 0
        start.append(at("computed", p.req) + offset)
        plen.append(at("prefill_len", p.req))
        qsl.append(qsl[-1] + len(p.tokens))
        seq.append(batch["positions"][p.tokens[-1]] + 1 if p.tokens else 0)
    live, dead = len(rows), Rl - len(rows)
    qsl += [qsl[-1]] * dead
    dcp_bound = None
    if dcp > 1:
        dcp_bound = [dcp_rank0_share(at("computed", r) + at("sched", r), dcp, interleave) for r in req] + [
            0
        ] * dead
    moe_mask = None
    if moe:
        counts = [sum(len(p.tokens) for p in ps) for ps in ranks]
        moe_mask = [l >= counts[q] for q in range(P) for l in range(Lp)]
    return OracleLocal(
        num_reqs=live,
        num_tokens=len(tokens),
        global_batch_req_idx=req + [0] * dead,
        idx_mapping=[at("idx_mapping", r) for r in req] + [0] * dead,
        num_scheduled_tokens=length + [0] * dead,
        num_computed_tokens=start + [0] * dead,
        query_start_loc=qsl,
        seq_lens=seq + [0] * dead,
        seq_lens_cpu_upper_bound=[s + n for s, n in zip(start, length)] + [0] * dead,
        dcp_bound=dcp_bound,
        prefill_len=plen + [0] * dead,
        num_computed_prefill_tokens=[min(s, p) for s, p in zip(start, plen)] + [0] * dead,
        is_prefilling=[s < p for s, p in zip(start, plen)] + [False] * dead,
        input_ids=[batch["input_ids"][t] for t in tokens] + [0] * pad,
        positions=[batch["positions"][t] for t in tokens] + [0] * pad,
        is_padding=[False] * len(tokens) + [True] * pad,
        moe_is_padding=moe_mask,
        logits_indices=[x - 1 for x in qsl[1:]],
        cu_num_logits=[min(k, real) for k in range(Rl + 1)],
        gather_idx=tokens + [0] * pad,
    )


def oracle_dispatch(
    P, sched, prefilling, shard=False, dcp=1, split="head-tail", computed=None
) -> tuple[int, int]:
    """(largest rank-local token count, most local request rows of a rank, at least 1)."""
    ranks = rank_pieces(P, sched, prefilling, shard, dcp, split, computed)
    return max(sum(len(p.tokens) for p in ps) for ps in ranks), max(1, max(len(ps) for ps in ranks))
