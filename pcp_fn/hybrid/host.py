"""The hybrid layout's host twin: the DualChunkSwap twin plus the linear split, from O(R) numpy.

vllm-ascend's 0.23 runner reads, with hybrid attention, the linear-attention layers' split on
the host too: each rank's linear rows and their offsets, the most rows any rank holds
(`max_num_tokens_across_pcp`) and the padding around the all-gather. They extend the
DualChunkSwap twin ([`pcp_fn.dcs.host.HostLayout`][]: the full-attention layers keep its
layout); [`pcp_fn.dcs.host.host_layout`][] builds either, `cls=HybridHostLayout` for this one.

`P = 2`, two fresh prefills `[3, 5]`, rank 1: `linear_counts [[2, 1], [3, 2]]`,
`linear_tokens [1, 2]`, `linear_offset [2, 3]`, rows `[2, 3, 4]`, `M = 5`.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np

from ..dcs.host import HostLayout, runs


class HybridHostLayout(HostLayout):
    """[`pcp_fn.dcs.host.HostLayout`][] with the linear split (made when first read).

    `linear_counts` `[n, P]` int64 linear-split prefill tokens of every rank (0 for
    decodes): rank `q` holds `n // P + (q < n % P)` consecutive tokens of a prefill;
    `linear_tokens` int32 this rank's linear rows (`n` for a decode); `linear_offset`
    int64 first token of each request this rank holds linearly; `max_tokens_across_pcp`
    `M = D + sum(linear_counts[:, 0])` (`D` without prefills).
    """

    @functools.cached_property
    def linear_counts(self) -> np.ndarray:
        P = self.pcp_size
        n64 = self.num_scheduled.astype(np.int64)[:, None]
        counts = n64 // P + (np.arange(P, dtype=np.int64) < n64 % P)
        counts[: self.num_decode_reqs] = 0
        return counts

    @functools.cached_property
    def linear_tokens(self) -> np.ndarray:
        out = self.linear_counts[:, self.pcp_rank].astype(np.int32)
        out[: self.num_decode_reqs] = self.num_scheduled[: self.num_decode_reqs]
        return out

    @functools.cached_property
    def linear_offset(self) -> np.ndarray:
        return self.linear_counts[:, : self.pcp_rank].sum(axis=1)

    @functools.cached_property
    def max_tokens_across_pcp(self) -> int:
        return self.num_decode_tokens + int(self.linear_counts[:, 0].sum())

    @functools.cached_property
    def linear_rows(self) -> np.ndarray:
        """int64 `[num_linear_tokens]`: offsets of this rank's linear rows (shared: never written)."""
        return runs(self.linear_offset, self.linear_tokens)

    @property
    def num_linear_tokens(self) -> int:
        """This rank's linear rows (vllm-ascend `total_num_scheduled_tokens` with hybrid attention)."""
        return int(self.linear_tokens.sum())

    @property
    def padded_tokens_fla(self) -> int:
        """`M - num_linear_tokens`: rows this rank pads its linear buffer with before the all-gather."""
        return self.max_tokens_across_pcp - self.num_linear_tokens

    @property
    def total_padding_tokens_fla(self) -> int:
        """`P * (M - D) - prefill tokens` (0 without prefills)."""
        if self.num_prefill_reqs == 0:
            return 0
        return self.pcp_size * (self.max_tokens_across_pcp - self.num_decode_tokens) - self.prefill_tokens

    @property
    def enter_fa_len(self) -> int:
        """Rows of the compact full-attention input: `P * D + prefill tokens`."""
        return self.pcp_size * self.num_decode_tokens + self.prefill_tokens

    def local_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """`(request, offset)` int64 of each local row: the linear split."""
        return np.repeat(
            np.arange(self.num_reqs, dtype=np.int64), self.linear_tokens
        ), self.linear_rows.copy()

    SHAPE: ClassVar[tuple[str, ...]] = HostLayout.SHAPE + (
        "linear_counts",
        "linear_tokens",
        "linear_offset",
        "max_tokens_across_pcp",
        "linear_rows",
    )
