"""Per-rank KV lengths under context parallelism, on the device and on the host.

`C = pcp_size * dcp_size` ranks are dealt a sequence's KV round-robin in blocks of
`interleave` tokens (vllm-ascend `_get_cp_local_seq_lens`). Both functions here are exact for
every length their input's dtype holds: no intermediate sum can pass the dtype's range (a length
near `INT32_MAX` in an int32 tensor gives its exact shares), and the result has the input's
dtype (every share is at most the length).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from .checks import INT32_MAX, check_int

# dtypes a length tensor may have: the integer ones whose every value an int64 holds
_LENGTH_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)


def check_cp_sizes(pcp_size: object, dcp_size: object, interleave: object) -> None:
    """The static arguments of [`cp_local_seq_lens`][pcp_fn.cp_local_seq_lens]: ints in
    `[1, INT32_MAX]` (a config's limits), named in the `TypeError` / `ValueError`."""
    check_int("pcp_size", pcp_size, 1, INT32_MAX)
    check_int("dcp_size", dcp_size, 1, INT32_MAX)
    check_int("interleave", interleave, 1, INT32_MAX)


def cp_local_seq_lens(
    seq_lens: torch.Tensor, pcp_size: int, dcp_size: int = 1, interleave: int = 1
) -> torch.Tensor:
    """`[...] -> [..., pcp_size, dcp_size]`: KV tokens of each sequence held by each CP rank.

    KV is dealt round-robin to the `C = pcp_size * dcp_size` ranks in blocks of
    `interleave` tokens (vllm-ascend `_get_cp_local_seq_lens`). `seq_lens = [129]`,
    `pcp_size = 2`, `interleave = 128`: rank 0 holds 128, rank 1 holds 1.

    Exact for every length of the input's dtype (`seq_lens = [2**31 - 1]` int32, `pcp_size =
    2`: `[[2**30], [2**30 - 1]]`), in the input's dtype. Capturable: the checks below read
    only the arguments' types, dtype and the static sizes.

    Args:
        seq_lens: integer tensor (int8, int16, int32, int64 or uint8) of sequence lengths, any
            shape. Its values are device data, never read on the host: a negative length (a
            caller's bug this op cannot see) holds no token, 0 on every rank.
        pcp_size: prefill context-parallel ranks, an int `>= 1`.
        dcp_size: decode context-parallel ranks, an int `>= 1`.
        interleave: tokens per KV interleave block, an int `>= 1`.

    Raises:
        TypeError: `seq_lens` not an integer tensor of those dtypes, or a size not an int.
        ValueError: a size below 1 or past `INT32_MAX` (named).
    """
    check_cp_sizes(pcp_size, dcp_size, interleave)
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"seq_lens must be a tensor, got {type(seq_lens).__name__}")
    if seq_lens.dtype not in _LENGTH_DTYPES:
        raise TypeError(f"seq_lens must be an integer tensor (int8/16/32/64 or uint8), got {seq_lens.dtype}")
    P, D, I = int(pcp_size), int(dcp_size), int(interleave)  # Python ints: their product cannot wrap
    wide = seq_lens.dtype in (torch.int32, torch.int64)  # else: computed in int64, cast back
    s = (seq_lens if wide else seq_lens.to(torch.int64)).clamp(min=0).unsqueeze(-1)
    return _shares(s, P * D, I).to(seq_lens.dtype).reshape(*seq_lens.shape, P, D)


def _shares(s: torch.Tensor, C: int, I: int) -> torch.Tensor:
    """`[..., 1] -> [..., C]` each rank's tokens of lengths `s >= 0` (int32 or int64), in `s`'s
    dtype, with no intermediate value outside it."""
    top = torch.iinfo(s.dtype).max
    span = C * I  # tokens of one round of C blocks
    if span > top:  # no length of this dtype completes a round: rank j holds clamp(s - j*I, 0, I)
        K = min(C, top // I + 1)  # the ranks whose first block starts within the dtype's range
        first = torch.arange(K, dtype=s.dtype, device=s.device) * I  # at most (K - 1) * I <= top
        return F.pad((s - first).clamp(0, I), (0, C - K))
    if I == 1:  # rank j holds the tokens t < s with t % C == j: ceil((s - j) / C) = (s - j - 1) // C + 1
        return (s - torch.arange(1, C + 1, dtype=s.dtype, device=s.device)) // C + 1  # s - C >= -C
    # q full rounds of C blocks, then rank j's share of the partial round: s - first >= -span
    q = s // span
    first = torch.arange(0, span, I, dtype=s.dtype, device=s.device)  # rank j's first token
    return torch.add(torch.add(s - first, q, alpha=-span).clamp(0, I), q, alpha=I)


@functools.cache
def _rank_ends(C: int) -> np.ndarray:
    """`rank + 1` for each of the `C` CP ranks, int32 (read-only)."""
    out = np.arange(1, C + 1, dtype=np.int32)
    out.flags.writeable = False
    return out


def host_cp_local_seq_lens(seq_lens: np.ndarray, P: int, D: int, interleave: int) -> np.ndarray:
    """`[n] -> [n, P, D]`: KV tokens of each (pcp, dcp) rank, dealt round-robin in `interleave` blocks.

    vllm-ascend `_get_cp_local_seq_lens`, in the input's dtype:
    [`cp_local_seq_lens`][pcp_fn.cp_local_seq_lens] on the host (numpy), for an engine's host-side
    metadata. Exact for every non-negative length of an integer dtype (no sum is formed that could
    pass it). The engine's lengths are validated host
    counts: unlike the device op, a negative length is not read as 0.
    """
    C = P * D
    s = seq_lens[:, None]
    if interleave == 1 and seq_lens.dtype in (np.int32, np.int64) and C <= INT32_MAX:
        # ceil((s - r) / C) for rank r, as (s - (r + 1)) // C + 1: s - C >= -C cannot wrap
        out = s - _rank_ends(C)
        out //= C
        out += 1
        return out.reshape(-1, P, D)
    # any other case in int64 (each share <= s, so the cast back is exact)
    s = s.astype(np.int64)
    span = C * interleave
    if span > np.iinfo(np.int64).max:  # no length completes a round (only absurd sizes)
        K = min(C, np.iinfo(np.int64).max // interleave + 1)
        first = np.arange(K, dtype=np.int64) * interleave
        out = np.zeros((s.shape[0], C), np.int64)
        out[:, :K] = np.clip(s - first, 0, interleave)
    else:
        base = s // span * interleave  # full rounds
        first = np.arange(C, dtype=np.int64) * interleave  # rank j's first token of a round
        out = base + np.clip(s - base * C - first, 0, interleave)
    return out.astype(seq_lens.dtype, copy=False).reshape(-1, P, D)
