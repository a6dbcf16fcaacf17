"""Static tables of the DualChunkSwap layout, per `P` (config-only).

`init_state` puts them on the device once (`state.constants`) so that the
layout ops read them instead of rebuilding small constant vectors from
`arange` every step (each such vector costs kernels in an eager graph). See
[`pcp_fn.dcs.layout`][] for what they encode.
"""

from __future__ import annotations


def layout_constants(P: int) -> dict[str, list]:
    """The layout tables for `P` ranks, as nested lists.

    `dcs_chunks` `[4, 2P]`, one column per chunk `k` of a request's padded rows:

    - `k + 1` and `min(k + 1, P)`: chunks up to `k`, counted in chunks of a
      split request and in copies of a replicated one (whose chunks `>= P` are empty);
    - the rank holding chunk `k` (`k` for a head, `2P - 1 - k` for a tail);
    - `beta_k`: the chunk's local offset on that rank minus its padded offset,
      in chunk rows (`-k` for a head, `1 - k` for a tail).

    `dcs_ranks` `[P, 2]`: row `r` holds the chunks rank `r` owns before
    its head and its tail, less the head for the tail (`[r, 2P - 2 - r]`):
    a local row's position is `row - local_start + that * chunk`.

    `dcs_sizes` `[len(SIZES), 5]`: every per-request size of the layout as an integer
    combination of the [`BASE`][pcp_fn.dcs.layout_tables.BASE] quantities, one row per entry of
    [`SIZES`][pcp_fn.dcs.layout_tables.SIZES] (in its
    order: [`pcp_fn.dcs.geometry.request_geometry`][pcp_fn.dcs.request_geometry] names the rows it
    unbinds by it).
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
        "dcs_sizes": [coefficients(P) for coefficients in SIZES.values()],
    }


BASE = ("n", "rl", "minus_chunk", "d", "dl")
"""The five per-request quantities every size combines: scheduled tokens `n`, the replicated length `rl`
(`n` of a decode, else 0), `minus_chunk = (rl - n) // 2P` (minus `c = ceil(n / 2P)` for a split request,
0 for a replicated one), the decode flag `d` and the decode tokens `dl`."""

SIZES = {
    "num_scheduled": lambda P: [1, 0, 0, 0, 0],  # n
    "num_padded": lambda P: [0, P, -2 * P, 0, 0],  # P (rl + 2c): rows in the gathered, padded order
    "local": lambda P: [0, 1, -2, 0, 0],  # rl + 2c: rows on each rank
    "num_pads": lambda P: [-1, P, -2 * P, 0, 0],  # num_padded - n
    "prefill_chunk": lambda P: [0, 0, -1, 0, 0],  # c
    "is_decode": lambda P: [0, 0, 0, 1, 0],  # d
    "decode_len": lambda P: [0, 0, 0, 0, 1],  # dl
    "chunk": lambda P: [0, 1, -1, 0, 0],  # rl + c: rows per chunk
    "replicated_len": lambda P: [0, 1, 0, 0, 0],  # rl
    "local_less_padded": lambda P: [0, 1 - P, 2 * (P - 1), 0, 0],  # local - num_padded
}
"""Each size's coefficients over [`BASE`][pcp_fn.dcs.layout_tables.BASE], for `P` ranks
(`c = -minus_chunk`)."""
