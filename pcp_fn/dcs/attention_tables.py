"""Static run tables of the attention index metadata, per ``P`` (config-only).

``init_state`` puts them on the device once (``state.constants``) so that
:func:`pcp_fn.attention_metadata` never copies host data to the device. See
:mod:`pcp_fn.dcs.attention` for what the runs paint.
"""

from __future__ import annotations


def range_tables(P: int) -> tuple[list[int], list[list[list[int]]], list[list[list[int]]]]:
    """Capacities (in chunk rows ``C_b``) and the run tables ``A + B*h`` of every index tensor.

    Request ``i`` of tensor ``k`` is three runs ``e = 0, 1, 2`` (``b = c_before[i]``,
    ``c = c[i]``). Run ``e`` starts at local slot ``sb*b + sc*c`` and holds
    ``slot + hb*b + hc*c + ht*total``; ``(sb, sc, hb, hc, ht)`` are rows of the
    tables, each entry ``A + B*h``. A plain range (length ``m*c``, first value
    ``a*b + beta*c``) is runs 0 and 1 at ``m*b`` with shift ``(a-m)*b + beta*c``.
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


def attention_constants(P: int) -> dict[str, list]:
    """The static tables of :func:`attention_metadata` for ``P`` ranks, as nested lists.

    :func:`pcp_fn.init_state` puts them on the device once (``state.constants``),
    so the op itself never copies host data to the device.
    """
    if P == 1:
        return {}
    caps_c, A, B = range_tables(P)
    return {
        "attn_coef_a": A,  # [10, 5, 3]
        "attn_coef_b": B,
        "attn_caps": caps_c,  # [10] capacities in chunk rows
        "attn_sums_a": [1, 0, 2 * P - 1, 1, 2 * P],  # [5] cumulative-length scales, A + B*h
        "attn_sums_b": [0, 1, -1, 1, -1],
    }
