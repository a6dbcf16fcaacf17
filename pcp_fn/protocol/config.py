"""`PCPConfig`: the static configuration every [`pcp_fn.Layout`][] serves, and its capacities.

Everything here is plain Python: hashable, comparable, free to branch on. It is
the *static* half of every pytree of the facade, so `torch.compile`,
`torch.export` and `graph.capture` specialise on it. The fields it shares with
[`pcp_fn.MRV2Config`][] come from [`pcp_fn.core.config.RankConfig`][].

Capacities, the same for every layout (`P = pcp_size`, `R = max_num_reqs`,
`T = max_num_tokens`): a layout must fit its rows in them, as the two-chunk split
does:

    L = T                     if P == 1   (no split, no padding)
    L = T + min(R, T)         if P >  1   (local tokens per rank)
    G = P * L                             (rows of the all-gathered buffer)

Why `L` holds every batch of the two-chunk split (DualChunkSwap,
[`two_chunk_bound`][pcp_fn.protocol.config.two_chunk_bound]): a request with `n >= 1` scheduled
tokens puts `n` tokens on each rank when it is a decode (replicated) and `2 * ceil(n / 2P) <= n + 1`
when it is a prefill (padded to `2P`, two chunks per rank); a request with `n = 0` puts none. Summed
over at most `R` requests that carry at most `T` tokens, and at most `min(R, T)` of them
non-empty, the local count is `<= T + min(R, T)`. The bound is reached
(`R` one-token prefills give `2R` local tokens when `T = R`).

Hybrid layout (`hybrid_attn`): the same `L`. Each rank has two sets of
local rows: the DualChunkSwap rows the full-attention layers use, counted
above (`N_dcs`), and the linear rows of the linear-attention layers, which
every rank pads to `M = D + sum(ceil(n / P))` over prefills (`D` decode
tokens, replicated in both). Since `ceil(n / P) <= 2 * ceil(n / 2P)` (the
right side is an integer `>= n / P`), `M <= N_dcs <= L`: one bucket of
`N_dcs` local rows holds both, and the gathered indices (`P * D` decode
rows plus the prefill tokens for the FA input, `P * N_dcs` DCS rows) fit
`G`.

Buckets: a [`Bucket`][pcp_fn.Bucket] is a pair (requests, local tokens per rank). The
config carries the allowed sizes for each (defaults: powers of two, then the
capacity); `make_batch` picks the smallest pair that holds a batch,
and every output shape derives from `(config, bucket)` only.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ..core.config import RankConfig
from .registry import PROTOCOL_MEMBERS, NamedLayout, get_layout, register_layout


@dataclasses.dataclass(frozen=True)
class PCPConfig(RankConfig):
    """Static configuration of one PCP rank (`pcp_rank` of `pcp_size`).

    Args:
        pcp_size: `P`, prefill context-parallel ranks.
        pcp_rank: this rank, `0 <= pcp_rank < P`. It can also be given as a
            0-d tensor to [`pcp_fn.init_state`][] (rank as data).
        max_num_reqs: `R`, requests per step.
        max_num_tokens: `T`, scheduled tokens per step (all requests).
        dcp_size: decode context-parallel ranks (decode context parallelism splits the KV only).
        dcp_rank: this rank's decode context-parallel rank, `0 <= dcp_rank < dcp_size`.
        num_spec_tokens: speculative tokens per request; a request with context
            and at most `1 + num_spec_tokens` scheduled tokens whose prompt is
            done is a decode.
        cp_kv_cache_interleave_size: tokens per KV interleave block.
        hybrid_attn: hybrid-attention models (linear + full attention, e.g.
            qwen3-next): linear split for the local rows, DualChunkSwap for
            the full-attention layers ([`pcp_fn.hybrid`][]).
        pad_slot_id: slot written for rows that are padding.
        request_buckets: allowed bucket sizes for the requests. Default: powers of two, then
            the capacity; [`pcp_fn.core.buckets.geometric_buckets`][] makes finer ladders.
        token_buckets: allowed bucket sizes for the local tokens per rank. Default: powers of
            two, then the capacity; [`pcp_fn.core.buckets.geometric_buckets`][] makes finer
            ladders.
        pd_decode_recompute: PD-disaggregated decode with the recompute
            scheduler: `num_computed == num_prompt - 1` also counts as done.
        layout: the registered [`pcp_fn.Layout`][] that partitions the tokens
            (`"dcs"`, `"hybrid"`, `"mrv2"`, `"mrv2-sharded"` or a researcher's; a
            Layout object is registered and stored by name). Default `None`: `"hybrid"` when
            `hybrid_attn`, else `"dcs"` (both are stored as `None`; read
            [`layout_name`][pcp_fn.PCPConfig.layout_name]). Capacities (`L`, `G`) are the same
            for every layout: a layout must fit its rows in them.
    """

    num_spec_tokens: int = dataclasses.field(default=0, kw_only=True)
    hybrid_attn: bool = dataclasses.field(default=False, kw_only=True)
    pd_decode_recompute: bool = dataclasses.field(default=False, kw_only=True)
    layout: str | None = dataclasses.field(default=None, kw_only=True)

    OWN_INTS: ClassVar[dict[str, int]] = {"num_spec_tokens": 0}
    OWN_FLAGS: ClassVar[tuple[str, ...]] = ("hybrid_attn", "pd_decode_recompute")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._resolve_layout()
        self._normalise_buckets()
        # A batch serves every rank: it records the config with the ranks zeroed (made once here,
        # so the per-step check is one comparison).
        shared = self
        if self.pcp_rank or self.dcp_rank:
            shared = dataclasses.replace(self, pcp_rank=0, dcp_rank=0)
        object.__setattr__(self, "_shared", shared)

    def _resolve_layout(self) -> None:
        """Bind the [`pcp_fn.Layout`][] that `layout` names (`layout_impl`).

        The two built-in DualChunkSwap-family layouts are told apart by
        `hybrid_attn` alone: `layout="hybrid"` sets it, and `"dcs"` / `"hybrid"`
        are stored as `None`, so `dataclasses.replace(cfg, hybrid_attn=...)`
        keeps working and equal configs compare equal. Any other layout is stored
        by name (a [`pcp_fn.Layout`][] object is registered first), so configs
        stay hashable, comparable and serialisable (a trace records the name).
        """
        layout = self.layout
        if layout is not None and not isinstance(layout, str):
            if not all(hasattr(layout, m) for m in PROTOCOL_MEMBERS):
                raise TypeError(f"layout must be a registered name or a pcp_fn.Layout, got {layout!r}")
            layout = register_layout(layout).name
        if layout == "hybrid":
            object.__setattr__(self, "hybrid_attn", True)
        elif layout == "dcs" and self.hybrid_attn:
            raise ValueError("layout='dcs' contradicts hybrid_attn=True (the 'hybrid' layout)")
        if layout in ("dcs", "hybrid"):
            layout = None
        if layout is None:
            impl = get_layout("hybrid" if self.hybrid_attn else "dcs")
        else:
            impl = get_layout(layout)
            if self.hybrid_attn:
                raise ValueError(f"hybrid_attn=True selects the 'hybrid' layout, not {layout!r}")
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "_layout_impl", impl)
        check = getattr(impl, "check_config", None)  # a layout's own limits (optional hook)
        if check is not None:
            check(self)

    @property
    def layout_impl(self) -> NamedLayout:
        """The [`pcp_fn.Layout`][] serving this config ([`pcp_fn.layout_of`][] types it so)."""
        return self._layout_impl

    @property
    def layout_name(self) -> str:
        """The registry name of [`layout_impl`][pcp_fn.PCPConfig.layout_impl] (`"dcs"`, `"hybrid"`,
        `"mrv2"`...)."""
        return self._layout_impl.name

    # -- derived ------------------------------------------------------------
    @property
    def shared(self) -> PCPConfig:
        """This config with `pcp_rank = dcp_rank = 0`: what every rank of the group shares.

        A [`SchedulerBatch`][pcp_fn.SchedulerBatch] records it, so one batch serves every rank and a
        batch of another group's config is refused.
        """
        return self._shared

    @property
    def decode_threshold(self) -> int:
        """Most scheduled tokens a decode request may have: `1 + num_spec_tokens`."""
        return 1 + self.num_spec_tokens

    @property
    def max_local_reqs(self) -> int:
        """`R`: request rows of the largest bucket (every layout keeps one row per request)."""
        return self.max_num_reqs

    @property
    def max_local_tokens(self) -> int:
        """`L`: local tokens per rank that any valid batch fits in (module docstring)."""
        if self.pcp_size == 1:
            return self.max_num_tokens
        return self.max_num_tokens + min(self.max_num_reqs, self.max_num_tokens)

    @property
    def max_gathered_tokens(self) -> int:
        """`G = P * L`: rows of the all-gathered buffer."""
        return self.pcp_size * self.max_local_tokens

    L = max_local_tokens
    G = max_gathered_tokens


def two_chunk_bound(config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int) -> int:
    """Host: local rows of every rank when each prefill is cut into `2P` chunks of
    `ceil(n / 2P)` and a rank holds two (DualChunkSwap's exact count, and the bound the
    capacity `L` is derived from: module docstring); decodes are whole on every rank.

    `num_scheduled`: `[n]` int64, decodes first (`num_decodes` of them). A decode
    keeps its `n` rows; a prefill's `n` become `2 * ceil(n / 2P)`.
    """
    num_local = int(np.add.reduce(num_scheduled))
    P = config.pcp_size
    if P > 1 and num_decodes < num_scheduled.shape[0]:
        m = 2 * P
        prefills = num_scheduled[num_decodes:]  # int64: n + m - 1 stays exact
        num_local += 2 * int(np.add.reduce((prefills + (m - 1)) // m)) - int(np.add.reduce(prefills))
    return num_local
