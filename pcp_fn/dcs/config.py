"""Static PCP configuration, the capacities it derives, and graph buckets.

Everything here is plain Python: hashable, comparable, free to branch on. It is
the *static* half of every pytree in the package, so ``torch.compile``,
``torch.export`` and ``graph.capture`` specialise on it.

Capacities (DualChunkSwap layout, ``P = pcp_size``, ``R = max_num_reqs``,
``T = max_num_tokens``)::

    L = T                     if P == 1   (no split, no padding)
    L = T + min(R, T)         if P >  1   (local tokens per rank)
    G = P * L                             (rows of the all-gathered buffer)

Why ``L`` holds every batch: a request with ``n >= 1`` scheduled tokens puts
``n`` tokens on each rank when it is a decode (replicated) and
``2 * ceil(n / 2P) <= n + 1`` when it is a prefill (padded to ``2P``, two chunks
per rank); a request with ``n = 0`` puts none. Summed over at most ``R``
requests that carry at most ``T`` tokens, and at most ``min(R, T)`` of them
non-empty, the local count is ``<= T + min(R, T)``. The bound is reached
(``R`` one-token prefills give ``2R`` local tokens when ``T = R``).

Hybrid layout (``hybrid_attn``): the same ``L``. Each rank has two sets of
local rows: the DualChunkSwap rows the full-attention layers use, counted
above (``N_dcs``), and the linear rows of the linear-attention layers, which
every rank pads to ``M = D + sum(ceil(n / P))`` over prefills (``D`` decode
tokens, replicated in both). Since ``ceil(n / P) <= 2 * ceil(n / 2P)`` (the
right side is an integer ``>= n / P``), ``M <= N_dcs <= L``: one bucket of
``N_dcs`` local rows holds both, and the gathered indices (``P * D`` decode
rows plus the prefill tokens for the FA input, ``P * N_dcs`` DCS rows) fit
``G``.

Buckets: a :class:`Bucket` is a pair (requests, local tokens per rank). The
config carries the allowed sizes for each (defaults: powers of two, then the
capacity); ``make_batch`` picks the smallest pair that holds a batch,
and every output shape derives from ``(config, bucket)`` only.
"""

from __future__ import annotations

import dataclasses

from ..core.buckets import Bucket, normalise_buckets, smallest_bucket
from ..core.checks import SHARED_INTS, check_config_fields
from ..core.layout_protocol import Layout, get_layout, register_layout


@dataclasses.dataclass(frozen=True)
class PCPConfig:
    """Static configuration of one PCP rank (``pcp_rank`` of ``pcp_size``).

    Args:
        pcp_size: ``P``, prefill context-parallel ranks.
        pcp_rank: this rank, ``0 <= pcp_rank < P``. It can also be given as a
            0-d tensor to :func:`pcp_fn.init_state` (rank as data).
        max_num_reqs: ``R``, requests per step.
        max_num_tokens: ``T``, scheduled tokens per step (all requests).
        dcp_size, dcp_rank: decode context parallelism (KV split only).
        num_spec_tokens: speculative tokens per request; a request with context
            and at most ``1 + num_spec_tokens`` scheduled tokens whose prompt is
            done is a decode.
        cp_kv_cache_interleave_size: tokens per KV interleave block.
        hybrid_attn: hybrid-attention models (linear + full attention, e.g.
            qwen3-next): linear split for the local rows, DualChunkSwap for
            the full-attention layers (:mod:`pcp_fn.hybrid`).
        pad_slot_id: slot written for rows that are padding.
        request_buckets, token_buckets: allowed bucket sizes (requests; local
            tokens per rank). Default: powers of two, then the capacity;
            :func:`pcp_fn.core.buckets.geometric_buckets` makes finer ladders.
        pd_decode_recompute: PD-disaggregated decode with the recompute
            scheduler: ``num_computed == num_prompt - 1`` also counts as done.
        layout: the registered :class:`pcp_fn.Layout` that partitions the tokens
            (``"dcs"``, ``"hybrid"``, ``"mrv2"`` or a researcher's; a Layout object is
            registered and stored by name). Default ``None``: ``"hybrid"`` when
            ``hybrid_attn``, else ``"dcs"`` (both are stored as ``None``; read
            :attr:`layout_name`). Capacities (``L``, ``G``) are the same
            for every layout: a layout must fit its rows in them.
    """

    pcp_size: int
    pcp_rank: int
    max_num_reqs: int
    max_num_tokens: int
    dcp_size: int = dataclasses.field(default=1, kw_only=True)
    dcp_rank: int = dataclasses.field(default=0, kw_only=True)
    num_spec_tokens: int = dataclasses.field(default=0, kw_only=True)
    cp_kv_cache_interleave_size: int = dataclasses.field(default=1, kw_only=True)
    hybrid_attn: bool = dataclasses.field(default=False, kw_only=True)
    pad_slot_id: int = dataclasses.field(default=-1, kw_only=True)
    request_buckets: tuple[int, ...] | None = dataclasses.field(default=None, kw_only=True)
    token_buckets: tuple[int, ...] | None = dataclasses.field(default=None, kw_only=True)
    pd_decode_recompute: bool = dataclasses.field(default=False, kw_only=True)
    layout: str | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        check_config_fields(
            self,
            dict(SHARED_INTS, num_spec_tokens=0, cp_kv_cache_interleave_size=1),
            ("hybrid_attn", "pd_decode_recompute"),
        )
        self._resolve_layout()
        # Frozen: normalise the bucket lists in place once, so equal configs hash equal.
        object.__setattr__(
            self,
            "request_buckets",
            normalise_buckets("request_buckets", self.request_buckets, self.max_num_reqs),
        )
        object.__setattr__(
            self,
            "token_buckets",
            normalise_buckets("token_buckets", self.token_buckets, self.max_local_tokens),
        )
        # A batch serves every rank: it records the config with the ranks zeroed (made once here,
        # so the per-step check is one comparison).
        shared = self
        if self.pcp_rank or self.dcp_rank:
            shared = dataclasses.replace(self, pcp_rank=0, dcp_rank=0)
        object.__setattr__(self, "_shared", shared)

    def _resolve_layout(self) -> None:
        """Bind the :class:`pcp_fn.Layout` that ``layout`` names (``layout_impl``).

        The two built-in DualChunkSwap-family layouts are told apart by
        ``hybrid_attn`` alone: ``layout="hybrid"`` sets it, and ``"dcs"`` / ``"hybrid"``
        are stored as ``None``, so ``dataclasses.replace(cfg, hybrid_attn=...)``
        keeps working and equal configs compare equal. Any other layout is stored
        by name (a :class:`pcp_fn.Layout` object is registered first), so configs
        stay hashable, comparable and serialisable (a trace records the name).
        """
        layout = self.layout
        if isinstance(layout, Layout) and not isinstance(layout, str):
            layout = register_layout(layout).name
        elif layout is not None and not isinstance(layout, str):
            raise TypeError(f"layout must be a registered name or a pcp_fn.Layout, got {layout!r}")
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
    def layout_impl(self) -> Layout:
        """The :class:`pcp_fn.Layout` serving this config."""
        return self._layout_impl

    @property
    def layout_name(self) -> str:
        """The registry name of :attr:`layout_impl` (``"dcs"``, ``"hybrid"``, ``"mrv2"``...)."""
        return self._layout_impl.name

    # -- derived ------------------------------------------------------------
    @property
    def shared(self) -> PCPConfig:
        """This config with ``pcp_rank = dcp_rank = 0``: what every rank of the group shares.

        A :class:`SchedulerBatch` records it, so one batch serves every rank and a
        batch of another group's config is refused.
        """
        return self._shared

    @property
    def decode_threshold(self) -> int:
        """Most scheduled tokens a decode request may have: ``1 + num_spec_tokens``."""
        return 1 + self.num_spec_tokens

    @property
    def pad_multiple(self) -> int:
        """Prefills are padded to a multiple of this: ``2P`` (``1`` when ``P == 1``)."""
        return 2 * self.pcp_size if self.pcp_size > 1 else 1

    @property
    def max_local_tokens(self) -> int:
        """``L``: local tokens per rank that any valid batch fits in (module docstring)."""
        if self.pcp_size == 1:
            return self.max_num_tokens
        return self.max_num_tokens + min(self.max_num_reqs, self.max_num_tokens)

    @property
    def max_gathered_tokens(self) -> int:
        """``G = P * L``: rows of the all-gathered buffer."""
        return self.pcp_size * self.max_local_tokens

    L = max_local_tokens
    G = max_gathered_tokens

    @property
    def capacity(self) -> Bucket:
        """The largest bucket ``(R, L)``."""
        return Bucket(self.max_num_reqs, self.max_local_tokens)

    def bucket_for(self, num_reqs: int, num_local_tokens: int) -> Bucket:
        """Smallest configured bucket holding ``num_reqs`` requests and ``num_local_tokens``."""
        if num_reqs > self.max_num_reqs:
            raise ValueError(f"{num_reqs} requests exceed max_num_reqs={self.max_num_reqs}")
        if num_local_tokens > self.max_local_tokens:
            raise ValueError(
                f"{num_local_tokens} local tokens exceed the local capacity L={self.max_local_tokens}"
            )
        return smallest_bucket(self.request_buckets, self.token_buckets, num_reqs, num_local_tokens)

    def buckets(self) -> list[Bucket]:
        """Every configured bucket (for capturing up front)."""
        return [Bucket(r, t) for r in self.request_buckets for t in self.token_buckets]
