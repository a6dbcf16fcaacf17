"""Small helpers the spec-decode modules share (static checks, the geometry at ``R_b`` rows, ranks)."""

from __future__ import annotations

import torch

from ..core.buckets import Bucket
from ..core.seqlens import cp_local_seq_lens
from ..dcs.layout import RequestGeometry, request_geometry
from ..dcs.state import PCPState


def bucket_of(state: PCPState, bucket: Bucket | None) -> Bucket:
    """The bucket an op shapes its outputs for (default: the config's capacity)."""
    return state.config.capacity if bucket is None else bucket


def check_rows(name: str, tensor: torch.Tensor, rows: int, *, at_least: bool = False) -> None:
    """Static shape check: ``tensor`` has ``rows`` (or at least ``rows``) entries along dim 0."""
    if tensor.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d tensor")
    n = tensor.shape[0]
    if (n < rows) if at_least else (n != rows):
        need = f"at least {rows}" if at_least else f"{rows}"
        raise ValueError(f"{name} must have {need} rows (the bucket's), got shape {tuple(tensor.shape)}")


def geometry(state: PCPState, bucket: Bucket) -> tuple[RequestGeometry, torch.Tensor]:
    """Layout geometry of the state's last update at ``R_b`` rows, and ``[R_b]`` real-request mask."""
    Rb = bucket.num_reqs
    geo = request_geometry(state.config, state.num_scheduled[:Rb], state.is_decode[:Rb])
    real = torch.arange(Rb, device=state.device) < state.num_reqs
    return geo, real


def take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` along dim 0 with ``index`` clamped in range (fixed shape, never out of bounds)."""
    return values[index.clamp(0, max(values.shape[0] - 1, 0))]


def my_cp_lens(state: PCPState, seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(all, mine)``: :func:`pcp_fn.cp_local_seq_lens` of ``seq_lens`` and this rank's entry.

    ``all`` is ``[..., P, dcp]``, ``mine`` is ``[...]``; the rank may be data (a 0-d tensor).
    """
    cfg = state.config
    lens = cp_local_seq_lens(seq_lens, cfg.pcp_size, cfg.dcp_size, cfg.cp_kv_cache_interleave_size)
    per_pcp = lens.select(-1, cfg.dcp_rank)
    rank = state.pcp_rank
    if isinstance(rank, int):
        return lens, per_pcp.select(-1, rank)
    return lens, per_pcp.index_select(-1, rank.reshape(1)).squeeze(-1)
