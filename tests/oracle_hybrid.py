"""A slow, obvious reference for the hybrid-attention layout: plain Python, one token at a time.

It shares no code with ``pcp_fn``. Every rank's linear rows are listed as
``(request, token)`` pairs; the DualChunkSwap rows come from ``oracle.py``
(itself independent of ``pcp_fn``). Every index is found by *searching* those
lists for the token it must point at, never by formula.
"""

from __future__ import annotations

from dataclasses import dataclass

from oracle import is_decode, oracle_step


def split_evenly(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` consecutive pieces of ``n`` tokens, as equal as possible, larger pieces first."""
    sizes = [0] * parts
    for t in range(n):  # deal the tokens round-robin, then read the pieces as consecutive ranges
        sizes[t % parts] += 1
    return sizes


@dataclass
class OracleHybrid:
    P: int
    spec: int
    sched: list[int]
    decode: list[bool]
    linear: list[list[tuple[int, int]]]  # [rank] -> (request, token) of each local linear row
    dcs_rows: list[list[int]]  # [rank] -> DCS padded row of each local DCS row
    dcs_unpad_mask: list[bool]
    dcs_padded_start: list[int]  # first DCS padded row of each request

    @property
    def num_decode_tokens(self) -> int:
        return sum(n for n, d in zip(self.sched, self.decode) if d)

    @property
    def linear_tokens(self) -> list[list[int]]:
        """[rank] -> tokens of each request on the rank."""
        return [[sum(1 for i, _ in rows if i == r) for r in range(len(self.sched))] for rows in self.linear]

    @property
    def linear_positions(self) -> list[list[int]]:
        return [[t for _, t in rows] for rows in self.linear]

    @property
    def max_tokens(self) -> int:
        return max(len(rows) for rows in self.linear)

    def _find_linear(self, rank: int, token: tuple[int, int]) -> int:
        return self.linear[rank].index(token)

    def fa_order(self) -> list[tuple[int, tuple[int, int]]]:
        """(rank, (request, token)) of every compact FA-input row."""
        dec = [(i, t) for i, n in enumerate(self.sched) if self.decode[i] for t in range(n)]
        if self.spec:  # rank-major
            order = [(q, tok) for q in range(self.P) for tok in dec]
        else:  # token-major
            order = [(q, tok) for tok in dec for q in range(self.P)]
        for i, n in enumerate(self.sched):
            if not self.decode[i]:
                for t in range(n):
                    owner = next(q for q in range(self.P) if (i, t) in self.linear[q])
                    order.append((owner, (i, t)))
        return order

    def enter_fa(self, stride: int) -> list[int]:
        return [q * stride + self._find_linear(q, tok) for q, tok in self.fa_order()]

    @property
    def fa_padding(self) -> list[int]:
        D, fa_len = self.num_decode_tokens, len(self.fa_order())
        out, k = [], self.P * D
        for g, real in enumerate(self.dcs_unpad_mask):
            if g < self.P * D:
                out.append(g)
            elif real:
                out.append(k)
                k += 1
            else:
                out.append(fa_len)
        return out

    @property
    def fa_query(self) -> list[list[int]]:
        D = self.num_decode_tokens
        return [[row - self.P * D for row in rows[D:]] for rows in self.dcs_rows]

    def exit_fa(self, rank: int, stride: int) -> list[int]:
        D = self.num_decode_tokens
        out = []
        for i, t in self.linear[rank]:
            if self.decode[i]:
                continue
            row = self.dcs_padded_start[i] + t
            q = next(q for q in range(self.P) if row in self.dcs_rows[q])
            out.append(q * stride + self.dcs_rows[q].index(row) - D)
        return out

    @property
    def logits(self) -> list[int]:
        out, total = [], 0
        for n, d in zip(self.sched, self.decode):
            total += n + (self.P - 1 if d else 0)
            out.append(max(total - 1, 0))
        return out

    def adjust_cu(self, cu: list[int]) -> list[int]:
        num_dec = sum(self.decode)
        base = cu[num_dec - 1] if num_dec else 0
        out, total = [], 0
        for i, c in enumerate(cu):
            if self.decode[i]:
                out.append(c)
            else:
                total += self.sched[i]
                out.append(self.P * base + total)
        return out


def oracle_hybrid(P, sched, computed, prompt, num_spec_tokens=0) -> OracleHybrid:
    threshold = 1 + num_spec_tokens
    decode = [is_decode(n, c, p, threshold) for n, c, p in zip(sched, computed, prompt)]
    linear: list[list[tuple[int, int]]] = [[] for _ in range(P)]
    for i, (n, d) in enumerate(zip(sched, decode)):
        if d:
            for q in range(P):
                linear[q] += [(i, t) for t in range(n)]
        else:
            first = 0
            for q, size in enumerate(split_evenly(n, P)):
                linear[q] += [(i, t) for t in range(first, first + size)]
                first += size
    # linear rows: decodes first on every rank (the runner orders decodes first)
    dcs = oracle_step(P, sched, computed, prompt, num_spec_tokens)
    starts, s = [], 0
    for k in dcs.pcp_tokens:
        starts.append(s)
        s += k * P
    return OracleHybrid(P, num_spec_tokens, list(sched), decode, linear, dcs.rows, dcs.unpad_mask, starts)


@dataclass
class OracleDraft:
    input_ids: list
    hidden: list
    seq_lens: list[int]


def oracle_draft_split(P: int, rank: int, lens: list[int], ids: list, hidden: list) -> OracleDraft:
    """Pad each request with zeros to a multiple of 2P (none at P = 1); take this rank's linear slice."""
    out_ids, out_hidden, seq_lens, start = [], [], [], 0
    multiple = 2 * P if P > 1 else 1
    for n in lens:
        req_ids = list(ids[start : start + n])
        req_hidden = [list(h) for h in hidden[start : start + n]]
        width = len(hidden[0]) if hidden else 0
        while len(req_ids) % multiple:
            req_ids.append(0)
            req_hidden.append([0.0] * width)
        k = len(req_ids) // P
        out_ids += req_ids[rank * k : (rank + 1) * k]
        out_hidden += req_hidden[rank * k : (rank + 1) * k]
        seq_lens.append(k)
        start += n
    return OracleDraft(out_ids, out_hidden, seq_lens)
