"""Static tables of the DualChunkSwap layout, per ``P`` (config-only).

``init_state`` puts them on the device once (``state.constants``) so that the
layout ops read them instead of rebuilding small constant vectors from
``arange`` every step (each such vector costs kernels in an eager graph). See
:mod:`pcp_fn.dcs.layout` for what they encode.
"""

from __future__ import annotations


def layout_constants(P: int) -> dict[str, list]:
    """The layout tables for ``P`` ranks, as nested lists.

    ``dcs_chunks`` ``[4, 2P]``, one column per chunk ``k`` of a request's padded rows:

    - ``k + 1`` and ``min(k + 1, P)``: chunks up to ``k``, counted in chunks of a
      split request and in copies of a replicated one (whose chunks ``>= P`` are empty);
    - the rank holding chunk ``k`` (``k`` for a head, ``2P - 1 - k`` for a tail);
    - ``beta_k``: the chunk's local offset on that rank minus its padded offset,
      in chunk rows (``-k`` for a head, ``1 - k`` for a tail).

    ``dcs_ranks`` ``[P, 2]``: row ``r`` holds the chunks rank ``r`` owns before
    its head and its tail, less the head for the tail (``[r, 2P - 2 - r]``):
    a local row's position is ``row - local_start + that * chunk``.

    ``dcs_sizes`` ``[10, 5]``: every per-request size of the layout as an integer
    combination of ``(n, rl, q, d, dl)``: scheduled tokens, the replicated
    length (``n`` of a decode, else 0), ``q = -prefill_chunk`` (``(rl - n) // m``, ``m`` the pad
    multiple ``2P``: minus ``ceil(n / m)`` for a split request, 0 for a replicated one), the
    decode flag and the decode tokens. Rows:
    ``n``, ``num_padded = P (rl + 2c)``, ``local = rl + 2c``, ``num_pads =
    num_padded - n``, ``prefill_chunk = c``, ``is_decode``, ``decode_len``,
    ``chunk = rl + c``, ``rl``, and ``local - num_padded`` (``c = -q``).
    """
    ks = range(2 * P)
    return {
        "dcs_chunks": [
            [k + 1 for k in ks],
            [min(k + 1, P) for k in ks],
            [k if k < P else 2 * P - 1 - k for k in ks],
            [-k if k < P else 1 - k for k in ks],
        ],
        "dcs_ranks": [[r, 2 * P - 2 - r] for r in range(P)],
        "dcs_sizes": [
            [1, 0, 0, 0, 0],
            [0, P, -2 * P, 0, 0],
            [0, 1, -2, 0, 0],
            [-1, P, -2 * P, 0, 0],
            [0, 0, -1, 0, 0],
            [0, 0, 0, 1, 0],
            [0, 0, 0, 0, 1],
            [0, 1, -1, 0, 0],
            [0, 1, 0, 0, 0],
            [0, 1 - P, 2 * (P - 1), 0, 0],
        ],
    }
