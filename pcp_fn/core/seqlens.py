"""Per-rank KV lengths under context parallelism."""

from __future__ import annotations

import torch


def cp_local_seq_lens(
    seq_lens: torch.Tensor, pcp_size: int, dcp_size: int = 1, interleave: int = 1
) -> torch.Tensor:
    """``[N] -> [N, pcp_size, dcp_size]``: KV tokens of each request held by each CP rank.

    KV is dealt round-robin to the ``C = pcp_size * dcp_size`` ranks in blocks of
    ``interleave`` tokens (vllm-ascend ``_get_cp_local_seq_lens``). ``seq_lens = [129]``,
    ``pcp_size = 2``, ``interleave = 128``: rank 0 holds 128, rank 1 holds 1.
    """
    C, I = pcp_size * dcp_size, interleave
    s = seq_lens.unsqueeze(-1)
    base = s // I // C * I
    rank_start = torch.arange(C, dtype=seq_lens.dtype, device=seq_lens.device) * I
    rest = torch.clamp(s - base * C - rank_start, 0, I)
    return (base + rest).reshape(*seq_lens.shape, pcp_size, dcp_size)
