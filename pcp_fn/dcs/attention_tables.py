"""Static run tables of the attention index metadata, per `P` (config-only).

`init_state` puts them on the device once (`state.constants`) so that
[`pcp_fn.attention_metadata`][] never copies host data to the device. See
[`pcp_fn.dcs.attention`][] for what the runs paint.
"""

from __future__ import annotations


def range_tables(P: int) -> tuple[list[int], list[list[list[int]]], list[list[list[int]]]]:
    """Capacities (in chunk rows `C_b`) and the run tables `A + B*h` of every index tensor.

    Request `i` of tensor `k` is three runs `e = 0, 1, 2` (`b = c_before[i]`,
    `c = c[i]`). Run `e` starts at local slot `sb*b + sc*c` and holds
    `slot + hb*b + hc*c + ht*total`; `(sb, sc, hb, hc, ht)` are rows of the
    tables, each entry `A + B*h`. A plain range (length `m*c`, first value
    `a*b + beta*c`) is runs 0 and 1 at `m*b` with shift `(a-m)*b + beta*c`.
    Run 2 starts at the request's end and closes it (its values are made
    negative, i.e. padding, unless the next request starts there too).
    """
    T = 2 * P - 1  # t = T - h; every coefficient below is written as (A, B) for A + B*h
    one, zero, h, t, t1, h1 = (1, 0), (0, 0), (0, 1), (T, -1), (T + 1, -1), (1, 1)
    q, kv = (2, 0), (2 * P, 0)  # q_off = 2*b, kv_off = 2P*b

    def sub(a, b):
        return (a[0] - b[0], a[1] - b[1])

    def plain(m, a, beta):  # one range per request: length m*c, first value a*b + beta*c
        shift_b = sub(a, m)
        return [[m, m, m], [zero, zero, m], [shift_b, shift_b, zero], [beta, beta, zero], [zero, zero, zero]]

    rows = [
        plain(one, q, zero),  # q_head: rows [q_off, q_off + c)
        plain(one, q, one),  # q_tail: [q_off + c, q_off + 2c)
        plain(h, kv, zero),  # kv head nomask: chunks before h
        plain(one, kv, h),  # kv head mask: chunk h
        plain(t, kv, zero),  # kv tail nomask: chunks before t
        plain(one, kv, t),  # kv tail mask: chunk t
        plain(t1, kv, zero),  # tail projection: chunks 0..t
        plain(h1, t1, zero),  # head attn in tail: first (h+1)*c rows of the request's projection
        plain(t1, t1, zero),  # tail attn in tail: all (t+1)*c of them
        # q_full = argsort(q_head ++ q_tail): head row q_off + j <- slot b + j, tail row
        # q_off + c + j <- slot total + b + j
        [[q, q, q], [zero, one, q], [(-1, 0), (-1, 0), zero], [zero, (-1, 0), zero], [zero, one, zero]],
    ]
    caps = [1, 1, P - 1, 1, 2 * P - 1, 1, 2 * P, P, 2 * P, 2]
    A = [[[e[0] for e in coef] for coef in row] for row in rows]
    B = [[[e[1] for e in coef] for coef in row] for row in rows]
    return caps, A, B


def run_tables(P: int) -> list[list[list[list[list[list[int]]]]]]:
    """Per rank `h`: `[4, 2, 10, 1, 3]` multipliers of `(b, c, total, C_b)` for the
    (start, shift) of every run (tensor `k`, run `e`) of
    [`range_tables`][pcp_fn.dcs.attention_tables.range_tables], with the tensors' buffer offsets
    (`C_b` times the capacities before them) folded in.

    Run `e = 2` closes the request: its shift `-(sum(caps) + offset + 1) * C_b`
    turns every slot it covers negative (padding, clamped to 0), whatever the
    slot (`< sum(caps) * C_b`), as long as `C_b >= 1` (else there is no slot).
    """
    caps, A, B = range_tables(P)
    offset = [sum(caps[:k]) for k in range(len(caps))]
    out = []
    for h in range(P):
        coef = [[[a + b * h for a, b in zip(ra, rb)] for ra, rb in zip(ka, kb)] for ka, kb in zip(A, B)]
        sb, sc, hb, hc, ht = ([[c[i][e] for e in range(3)] for c in coef] for i in range(5))
        start_base = [[offset[k]] * 3 for k in range(len(caps))]
        shift_base = [[-offset[k], -offset[k], -(sum(caps) + offset[k] + 1)] for k in range(len(caps))]
        # the closing run's shift takes no b, c, total term
        hb, hc, ht = ([[*row[:2], 0] for row in x] for x in (hb, hc, ht))
        zero = [[0, 0, 0] for _ in caps]

        def tensor(rows):
            return [[row] for row in rows]  # [10, 1, 3]

        out.append(
            [
                [tensor(sb), tensor(hb)],  # times b
                [tensor(sc), tensor(hc)],  # times c
                [tensor(zero), tensor(ht)],  # times total
                [tensor(start_base), tensor(shift_base)],  # times C_b
            ]
        )
    return out


def sum_tables(P: int) -> list[list[list[int]]]:
    """Per rank `h`: `[2, 6]` multipliers of the prefill-chunk prefix sums before and
    through each prefill, giving `c` and the cumulative `c`, `h*c`, `t*c`,
    `(h+1)*c`, `(t+1)*c` (`t = 2P-1-h`)."""
    out = []
    for h in range(P):
        t = 2 * P - 1 - h
        out.append([[-1, 0, 0, 0, 0, 0], [1, 1, h, t, h + 1, t + 1]])
    return out


def attention_constants(P: int) -> dict[str, list]:
    """The static tables of [`attention_metadata`][pcp_fn.attention_metadata] for `P` ranks, as nested lists.

    [`pcp_fn.init_state`][] puts them on the device once (`state.constants`),
    so the op itself never copies host data to the device.
    """
    if P == 1:
        return {}
    return {
        "attn_runs": run_tables(P),  # [P, 4, 2, 10, 1, 3]
        "attn_sums": sum_tables(P),  # [P, 2, 6]
        "attn_pair": [[0], [1]],  # [2, 1]: a prefix sum before and through an entry
    }
