"""A slow, obvious reference for the DualChunkSwap layout: plain Python, one request at a time.

It shares no code with ``pcp_fn``: it lays every rank's tokens out explicitly
as lists of (padded row, position) pairs and reads every answer off those
lists. Restore indices are found by searching the lists, not by formula.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OracleStep:
    is_decode: list[bool]
    pcp_tokens: list[int]  # per request, same on every rank
    num_pads: list[int]
    positions: list[list[int]]  # [rank] -> local positions
    rows: list[list[int]]  # [rank] -> padded row of each local token
    unpad_mask: list[bool]  # over the padded rows
    logits: list[int]
    num_decode_tokens: int

    @property
    def num_tokens(self) -> int:
        return sum(self.pcp_tokens)

    def restore_index(self, rows_per_rank: int) -> list[int]:
        """Gathered row (rank * rows_per_rank + local) of every padded row."""
        where = {}
        for r, rows in enumerate(self.rows):
            for local, row in enumerate(rows):
                assert row not in where, "a padded row owned twice"
                where[row] = r * rows_per_rank + local
        assert sorted(where) == list(range(len(where))), "padded rows not covered exactly once"
        return [where[g] for g in range(len(where))]

    def padded_slot_mapping(self, slots: list[int], pad: int) -> list[int]:
        out, k = [], 0
        for real in self.unpad_mask:
            if real:
                out.append(slots[k])
                k += 1
            else:
                out.append(pad)
        return out


def is_decode(n: int, computed: int, prompt: int, threshold: int, pd_recompute: bool = False) -> bool:
    done = computed >= prompt or (pd_recompute and computed == prompt - 1)
    return computed > 0 and n <= threshold and done


def oracle_step(P, sched, computed, prompt, num_spec_tokens=0, pd_recompute=False) -> OracleStep:
    threshold = 1 + num_spec_tokens
    decode = [is_decode(n, c, p, threshold, pd_recompute) for n, c, p in zip(sched, computed, prompt)]
    positions = [[] for _ in range(P)]
    rows = [[] for _ in range(P)]
    pcp_tokens, pads, mask, logits = [], [], [], []
    start = 0  # first padded row of the request
    for n, dec in zip(sched, decode):
        if dec or P == 1:
            # every rank holds the whole request; rank r's copy is rows start + r*n ...
            padded = n * P
            for r in range(P):
                for j in range(n):
                    positions[r].append(j)
                    rows[r].append(start + r * n + j)
            mask += [o % P == 0 for o in range(padded)]
            pcp_tokens.append(n)
        else:
            padded = 2 * P * ((n + 2 * P - 1) // (2 * P))
            c = padded // (2 * P)
            for r in range(P):
                for chunk in (r, 2 * P - 1 - r):
                    for j in range(c):
                        positions[r].append(chunk * c + j)
                        rows[r].append(start + chunk * c + j)
            mask += [o < n for o in range(padded)]
            pcp_tokens.append(2 * c)
        pads.append(padded - n)
        logits.append(max(start + n - 1, 0))
        start += padded
    num_decode_tokens = sum(n for n, d in zip(sched, decode) if d)
    return OracleStep(decode, pcp_tokens, pads, positions, rows, mask, logits, num_decode_tokens)


def oracle_cp_local_seq_lens(seq_lens, pcp, dcp, interleave):
    """Deal each request's KV tokens round-robin in blocks of ``interleave`` to pcp*dcp ranks."""
    out = []
    C = pcp * dcp
    for s in seq_lens:
        held = [0] * C
        for t in range(s):
            held[(t // interleave) % C] += 1
        out.append([[held[p * dcp + d] for d in range(dcp)] for p in range(pcp)])
    return out
