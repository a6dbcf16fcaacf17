"""The DualChunkSwap request geometry: every per-request size of the layout from one scan.

A request of `n` scheduled tokens is either replicated (a decode when `P > 1`; every
request when `P == 1`: `n` rows on each rank, `n * P` in the gathered order) or split
(a prefill: padded to `2P` chunks of `c = ceil(n / 2P)`, two chunks a rank). `P = 2`,
tokens `[1, 5, 8]`, request 0 a decode:

    num_scheduled  [1, 5, 8]       local (per rank)   [1, 4, 4]     chunk          [1, 2, 2]
    num_padded     [2, 8, 8]       num_pads           [1, 3, 0]     prefill_chunk  [0, 2, 2]
    padded_start   [0, 2, 10, 18]  local_start        [0, 1, 5, 9]  token_start    [0, 1, 6, 14]

[`request_geometry`][pcp_fn.dcs.request_geometry] returns the layout-neutral
[`pcp_fn.protocol.rows.RequestGeometry`][pcp_fn.RequestGeometry] with this layout's own sizes,
[`ChunkGeometry`][pcp_fn.dcs.ChunkGeometry], in its `own` field.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.ragged import arange_of, offsets
from ..protocol.config import PCPConfig
from ..protocol.rows import RequestGeometry
from .layout_tables import SIZES


class ChunkGeometry(NamedTuple):
    """DualChunkSwap's own per-request sizes (`RequestGeometry.own`); `[R_b]` int64, `*_start`
    `[R_b + 1]` (each request's first row, then the total)."""

    num_padded: torch.Tensor  # rows in the gathered, padded order: n*P (replicated) or ceil(n/2P)*2P
    chunk: torch.Tensor  # rows per chunk: n (replicated) or local // 2
    padded_start: torch.Tensor  # first padded-order row of each request, then the total
    num_pads: torch.Tensor  # num_padded - num_scheduled (vllm-ascend's num_pcp_pads)
    replicated_len: torch.Tensor  # num_scheduled of a replicated request, else 0
    prefill_chunk: torch.Tensor  # chunk of a split request, else 0
    pads_start: torch.Tensor  # pads before each request, then the total (padded_start - token_start)
    prefill_chunk_start: torch.Tensor  # cumulative prefill_chunk, exclusive, then the total
    local_less_padded_start: torch.Tensor  # local_start - padded_start


def pad_multiple(pcp_size: int) -> int:
    """Prefills are padded to a multiple of this: `2P` (`1` when `P == 1`)."""
    return 2 * pcp_size if pcp_size > 1 else 1


def request_geometry(
    config: PCPConfig,
    num_scheduled: torch.Tensor,
    is_decode: torch.Tensor,
    constants: dict[str, torch.Tensor],
    arange: torch.Tensor | None = None,
) -> RequestGeometry:
    """The geometry of requests `[n]` (`num_scheduled` int32 or int64, `is_decode` bool).

    Each size is an integer combination of five per-request quantities
    ([`pcp_fn.dcs.layout_tables.BASE`][]), so one multiply-and-sum with
    `constants["dcs_sizes"]` (`state.constants`) makes them all, in int64, and one
    scan makes their starts. `arange`: a longer int64 arange the caller shares
    ([`pcp_fn.core.ragged.arange_of`][]); its head is `request_ids`.
    """
    P = config.pcp_size
    n = num_scheduled
    if P > 1:
        replicated = is_decode
        rl = dl = n * is_decode  # replicated length, decode tokens
    else:
        replicated = torch.ones_like(is_decode)
        rl, dl = n, n * is_decode
    # -ceil(n / 2P) for a split request, 0 for a replicated one (no overflow in int32: n >= 0)
    minus_chunk = (rl - n) // pad_multiple(P)
    base = torch.stack([n, rl, minus_chunk, is_decode, dl])  # [5, n], in BASE's order
    table = (constants["dcs_sizes"][:, :, None] * base).sum(1)  # [len(SIZES), n] int64
    sizes = dict(zip(SIZES, table.unbind()))
    starts = dict(zip(SIZES, offsets(table).unbind()))  # the one scan
    return RequestGeometry(
        num_scheduled=sizes["num_scheduled"],
        replicated=replicated,
        token_start=starts["num_scheduled"],
        local=sizes["local"],
        local_start=starts["local"],
        request_ids=arange_of(n.shape[0], n.device, arange),
        num_decode_reqs=starts["is_decode"][-1],
        num_decode_tokens=starts["decode_len"][-1],
        own=ChunkGeometry(
            num_padded=sizes["num_padded"],
            chunk=sizes["chunk"],
            padded_start=starts["num_padded"],
            num_pads=sizes["num_pads"],
            replicated_len=sizes["replicated_len"],
            prefill_chunk=sizes["prefill_chunk"],
            pads_start=starts["num_pads"],
            prefill_chunk_start=starts["prefill_chunk"],
            local_less_padded_start=starts["local_less_padded"],
        ),
    )
