"""Per-rank KV lengths under context parallelism, on the device and on the host."""

from __future__ import annotations

import functools

import numpy as np
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
    if I == 1:  # rank j holds the tokens t < s with t % C == j: ceil((s - j) / C), 0 when s <= j
        lens = (s + torch.arange(C - 1, -1, -1, dtype=s.dtype, device=s.device)) // C
    else:  # q full rounds of C blocks, then rank j's share of the partial round
        q = s // (C * I)
        first = torch.arange(0, C * I, I, dtype=s.dtype, device=s.device)  # rank j's first token
        lens = torch.add(torch.add(s - first, q, alpha=-C * I).clamp(0, I), q, alpha=I)
    return lens.reshape(*seq_lens.shape, pcp_size, dcp_size)


@functools.cache
def _round_up_offsets(C: int) -> np.ndarray:
    """``C - 1 - rank`` for each of the ``C`` CP ranks (read-only)."""
    out = np.arange(C - 1, -1, -1, dtype=np.int32)
    out.flags.writeable = False
    return out


def host_cp_local_seq_lens(seq_lens: np.ndarray, P: int, D: int, interleave: int) -> np.ndarray:
    """``[n] -> [n, P, D]``: KV tokens of each (pcp, dcp) rank, dealt round-robin in ``interleave`` blocks.

    vllm-ascend ``_get_cp_local_seq_lens``, in the input's dtype: :func:`cp_local_seq_lens` on the
    host (numpy), for an engine's host-side metadata.
    """
    C = P * D
    if interleave == 1:  # rank r holds positions r, r + C, ... < s: ceil((s - r) / C) of them
        out = (seq_lens[:, None] + _round_up_offsets(C)) // C
        return out.astype(seq_lens.dtype, copy=False).reshape(-1, P, D)
    s = seq_lens[:, None]
    base = s // interleave // C * interleave
    rest = np.clip(s - base * C - np.arange(C, dtype=seq_lens.dtype) * interleave, 0, interleave)
    return (base + rest).astype(seq_lens.dtype).reshape(-1, P, D)
