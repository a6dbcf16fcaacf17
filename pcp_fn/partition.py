"""``PartitionLayout``: a :class:`pcp_fn.Layout` from a token partition alone.

A researcher's layout says *which local rows of each rank hold which token*;
this base class derives everything else the facade needs, in the scheduler's
token order (no pads between requests):

- ``restore_index [P*L_b]``: restored row ``t`` (scheduler-order token ``t``) reads
  the gathered row holding it (rank 0's copy for a replicated request), rows past
  the batch's tokens read row 0;
- ``unpad_mask`` / ``token`` ``[P*L_b]``: row ``t < num_tokens`` carries token ``t``'s
  KV slot (``padded_slot_mapping``);
- logits: request ``i``'s last token, ``token_start[i] + n_i - 1``;
- ``restored_spans``: ``(token_start, n)``; ``state_local_start``: this rank's
  rows per request, cumulated; the spec-decode first pass runs on the local rows.

A subclass implements :meth:`PartitionLayout.segments` (each request's local
runs on a rank, ``[R_b, S]`` first offset and length: ``S`` runs per request,
laid out request by request) or, for full control, :meth:`PartitionLayout.local_rows`,
from the batch's :class:`Requests` (scheduled and computed tokens, which are
replicated, where each starts in scheduler order).
Both must be capturable (docs/concepts.md, "Capturability, checked") and take ``rank`` as an int or a 0-d
tensor. :class:`MRV2Partition` (vLLM model runner V2's unpadded head/tail chunks,
registered as ``"mrv2"``) is the example; ``examples/cost_balanced_layout.py``
another.

``P = 2``, tokens ``[1, 5, 8]`` (request 0 a decode), ``"mrv2"``: chunks of
``c = ceil(n / 4)`` cut at the request's end, so rank 0 holds ``(0,0) (1,0) (1,1)
(2,0) (2,1) (2,6) (2,7)`` and rank 1 ``(0,0) (1,2) (1,3) (1,4) (2,2) .. (2,5)``;
the restored rows are the 14 tokens in scheduler order, logits ``[0, 5, 13]``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .core.layout_protocol import get_layout
from .core.ragged import arange_of, offsets, segment_of, take
from .dcs.batch import SchedulerBatch, dcs_num_local_tokens
from .dcs.config import PCPConfig
from .dcs.layout import (
    GatheredOrder,
    LayoutUpdate,
    LocalRows,
    RequestGeometry,
    RestoredSpans,
    TokenLayout,
    batch_is_decode,
    next_state,
    request_geometry,
)
from .dcs.state import PCPState


class Requests(NamedTuple):
    """What a :class:`PartitionLayout` splits: the batch's requests, ``[R_b]`` rows (0 past ``num_reqs``).

    Fields:
        num_scheduled: ``[R_b]`` int64 tokens scheduled this step.
        num_computed: ``[R_b]`` int64 tokens already in the KV cache (token ``j`` of
            request ``i`` is at position ``num_computed[i] + j`` and attends
            ``num_computed[i] + j + 1`` keys).
        replicated: ``[R_b]`` bool, the request is whole on every rank (the decodes
            when ``P > 1``; every request when ``P == 1``).
        token_start: ``[R_b + 1]`` int64 first scheduler-order token of each request, then the total.
        request_ids: ``[R_b]`` int64 ``arange(R_b)``.
        num_decode_reqs, num_decode_tokens: 0-d int64, the decodes (a prefix) and their tokens.
    """

    num_scheduled: torch.Tensor
    num_computed: torch.Tensor
    replicated: torch.Tensor
    token_start: torch.Tensor
    request_ids: torch.Tensor
    num_decode_reqs: torch.Tensor
    num_decode_tokens: torch.Tensor

    @classmethod
    def of(cls, geometry: RequestGeometry, num_computed: torch.Tensor) -> Requests:
        """The request-level fields of ``geometry`` with ``num_computed`` (``[R_b]``, any int dtype)."""
        g = geometry
        return cls(
            g.num_scheduled,
            num_computed.to(torch.int64),
            g.replicated,
            g.token_start,
            g.request_ids,
            g.num_decode_reqs,
            g.num_decode_tokens,
        )


def rows_from_segments(first: torch.Tensor, length: torch.Tensor, num_rows: int) -> LocalRows:
    """``[num_rows]`` :class:`LocalRows` of back-to-back runs.

    ``first``, ``length``: ``[R_b, S]`` int64, run ``s`` of request ``i`` holds the
    request's tokens ``first[i, s] .. first[i, s] + length[i, s] - 1``; the runs are
    laid out request-major (``i`` then ``s``), empty runs take no row, rows past
    the last run are padding (``valid`` False, request and offset 0). One search
    of the run ends paints every row (:func:`pcp_fn.core.ragged.segment_of`).
    """
    S = first.shape[1]
    starts = offsets(length.flatten())  # [R_b * S + 1]
    row = arange_of(num_rows, first.device)
    # runs past num_rows are cut off (a layout over its capacity loses tokens: check_layout says so)
    run = segment_of(starts[1:].clamp(max=num_rows), row).clamp(max=starts.shape[0] - 2)
    valid = row < starts[-1]
    position = take(first.flatten(), run) + row - take(starts, run)
    return LocalRows(torch.where(valid, run // S, 0), torch.where(valid, position, 0), valid)


class PartitionLayout:
    """Base class of a :class:`pcp_fn.Layout` defined by its token partition (module docstring).

    Subclasses set ``name`` and implement :meth:`segments` (or :meth:`local_rows`);
    override :meth:`num_local_tokens` when a rank may hold more than the
    DualChunkSwap bound ``2 * ceil(n / 2P)`` of a prefill's ``n`` tokens.
    """

    name: str = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return get_layout, (self.name,)  # pickled by its registered name, like the built-ins

    # -- what a subclass writes ------------------------------------------------
    def segments(
        self, config: PCPConfig, requests: Requests, rank: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``([R_b, S], [R_b, S])`` int64 first offset and length of each request's runs on ``rank``.

        A ``requests.replicated`` request must be whole on every rank; every other
        token on exactly one rank; a run may reach past ``n`` (pad rows: offsets ``>= n``).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement segments() or local_rows()")

    def replicated(self, config: PCPConfig, requests: Requests) -> torch.Tensor:
        """``[R_b]`` bool, the requests whole on every rank (default ``requests.replicated``: the
        decodes when ``P > 1``, every request when ``P == 1``). Restore and slots read a
        replicated request's tokens from rank 0; every other token must be on exactly one rank."""
        return requests.replicated

    def check_config(self, config: PCPConfig) -> None:
        """Raise ``ValueError`` for a config this layout cannot serve (``PCPConfig`` calls it)."""

    def local_rows(
        self, config: PCPConfig, requests: Requests, rank: int | torch.Tensor, num_rows: int
    ) -> LocalRows:
        """``[num_rows]`` request and offset of each of ``rank``'s local rows (default: :meth:`segments`)."""
        first, length = self.segments(config, requests, rank)
        return rows_from_segments(first, length, num_rows)

    def num_local_tokens(
        self, config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int, num_computed: np.ndarray
    ) -> int:
        """Host bound on any rank's local rows (bucket choice): the DualChunkSwap count by default."""
        return dcs_num_local_tokens(config, num_scheduled, num_decodes)

    # -- inherited ---------------------------------------------------------------
    def _of(self, config: PCPConfig, geo: RequestGeometry, num_computed: torch.Tensor) -> Requests:
        req = Requests.of(geo, num_computed)
        return req._replace(replicated=self.replicated(config, req))

    def _rank_geometry(self, geo: RequestGeometry, req: Requests, rows: LocalRows) -> RequestGeometry:
        """``geo`` with this rank's per-request row counts and no pads (restored = scheduler order)."""
        local = torch.zeros_like(geo.num_scheduled).index_add(0, rows.request, rows.valid.to(torch.int64))
        local_start = offsets(local)
        zeros = torch.zeros_like(geo.num_scheduled)
        return geo._replace(
            replicated=req.replicated,
            local=local,
            local_start=local_start,
            num_padded=geo.num_scheduled,
            padded_start=geo.token_start,
            num_pads=zeros,
            pads_start=torch.zeros_like(geo.token_start),
            local_less_padded_start=local_start - geo.token_start,
        )

    def _order(self, config: PCPConfig, req: Requests, Lb: int) -> GatheredOrder:
        """Restore index, unpad mask and token of the ``P * L_b`` restored rows (scheduler order)."""
        P, G = config.pcp_size, config.pcp_size * Lb
        # every rank's rows: the restore reads them all (P is static: a loop over ranks, not data)
        ranks = [self.local_rows(config, req, q, Lb) for q in range(P)]
        request = torch.stack([r.request for r in ranks])  # [P, L_b]
        offset = torch.stack([r.position for r in ranks])
        valid = torch.stack([r.valid for r in ranks])
        token = take(req.token_start, request.flatten()).view(P, Lb) + offset
        real = valid & (offset < take(req.num_scheduled, request.flatten()).view(P, Lb))
        rank0 = torch.arange(P, device=token.device)[:, None] == 0
        first_copy = real & (rank0 | ~take(req.replicated, request.flatten()).view(P, Lb))
        row = arange_of(G + 1, token.device)
        # inverse permutation by scatter: rows that are not a token's first copy go to a trash slot
        dest = torch.where(first_copy, token, G).flatten()
        restore = torch.zeros(G + 1, dtype=torch.int64, device=token.device).scatter(0, dest, row[:G])[:G]
        mask = row[:G] < req.token_start[-1]
        return GatheredOrder(restore_index=restore * mask, unpad_mask=mask, token=row[:G])

    def build(self, state: PCPState, batch: SchedulerBatch) -> LayoutUpdate:
        cfg, Lb = state.config, batch.bucket.num_tokens
        is_decode = batch_is_decode(cfg, batch)
        geo0 = request_geometry(cfg, batch.num_scheduled, is_decode, state.constants)
        req = self._of(cfg, geo0, batch.num_computed)
        mine = self.local_rows(cfg, req, state.pcp_rank, Lb)
        geo = self._rank_geometry(geo0, req, mine)
        order = self._order(cfg, req, Lb)
        layout = TokenLayout.of(geo, mine, order, is_decode)
        positions = torch.where(mine.valid, take(req.num_computed, mine.request) + mine.position, 0)
        return LayoutUpdate(
            next_state(state, batch, is_decode), layout, geo, positions, order.token, geo.local_start
        )

    def _requests(self, state: PCPState, geometry: RequestGeometry | None = None) -> Requests:
        """The state's last batch as :class:`Requests` (``geometry``: its request geometry, when known)."""
        Rb = state.bucket.num_reqs
        if geometry is None:
            geometry = request_geometry(
                state.config, state.num_scheduled[:Rb], state.is_decode[:Rb], state.constants
            )
        return self._of(state.config, geometry, state.num_computed[:Rb])

    def state_geometry(self, state: PCPState) -> RequestGeometry:
        Rb = state.bucket.num_reqs
        geo = request_geometry(state.config, state.num_scheduled[:Rb], state.is_decode[:Rb], state.constants)
        req = self._requests(state, geo)
        rows = self.local_rows(state.config, req, state.pcp_rank, state.bucket.num_tokens)
        return self._rank_geometry(geo, req, rows)

    def logits_from_geometry(
        self, config: PCPConfig, geometry: RequestGeometry, num_reqs: torch.Tensor
    ) -> torch.Tensor:
        # rows past num_reqs schedule nothing: (n - 1) + start * real is -1 there, clamped to 0
        real = geometry.request_ids < num_reqs
        return torch.addcmul(geometry.num_scheduled - 1, geometry.token_start[:-1], real).clamp(min=0)

    def gathered_order(self, state: PCPState) -> GatheredOrder:
        return self._order(state.config, self._requests(state), state.bucket.num_tokens)

    def restore_index(self, state: PCPState) -> torch.Tensor:
        return self.gathered_order(state).restore_index

    def state_local_rows(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
        req = self._requests(state, geometry)
        return self.local_rows(state.config, req, state.pcp_rank, state.bucket.num_tokens)

    def state_local_start(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> torch.Tensor:
        return (self.state_geometry(state) if geometry is None else geometry).local_start

    def restored_spans(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> RestoredSpans:
        req = self._requests(state, geometry)
        return RestoredSpans(req.token_start[:-1], req.num_scheduled)

    def first_pass_rows(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
        return self.state_local_rows(state, geometry=geometry)


class MRV2Partition(PartitionLayout):
    """vLLM model runner V2's partition (``vllm/v1/worker/gpu/pcp_manager.py``) as a facade layout.

    A prefill of ``n`` tokens is cut into ``2P`` chunks of ``c = ceil(n / 2P)``; rank
    ``q`` holds chunk ``q`` (head) and ``2P-1-q`` (tail), each cut at the request's
    end (no pads). A decode, and with ``dcp_size > 1`` a prefill too short to fill
    all ``2P`` chunks (``(2P-1) * c >= n``, vLLM ``replicated_requests``), is
    replicated on every rank (``"mrv2"``), or with ``shard_decode_requests=True``
    (``"mrv2-sharded"``, vLLM's ``pcp_shard_decode_requests``, its default when
    ``dcp_size == 1``) given whole to rank ``j % P``, ``j`` its ordinal among the
    non-empty replicated requests. Restore, slots and logits are in scheduler order
    (the MRV2 ``hidden_restore_idx`` order). The decode classification is the
    facade's (:func:`pcp_fn.dcs.classify_decodes`); :mod:`pcp_fn.mrv2` keeps its own
    config, state and API, which the vLLM adapters use.

    ``"mrv2-sharded"`` refuses ``dcp_size > 1`` (vLLM never shards decodes under DCP)
    and speculative tokens (:mod:`pcp_fn.spec` reads a decode's draft tokens from
    this rank's rows, where a sharded decode is not; vLLM MRV2 broadcasts rank 0's
    drafts instead).
    """

    name = "mrv2"

    def __init__(self, *, shard_decode_requests: bool = False) -> None:
        self.shard_decode_requests = shard_decode_requests
        if shard_decode_requests:
            self.name = f"{type(self).name}-sharded"

    def check_config(self, config: PCPConfig) -> None:
        if self.shard_decode_requests and config.dcp_size > 1:
            raise ValueError(
                f"the {self.name!r} layout requires dcp_size == 1, got dcp_size={config.dcp_size}: DCP "
                "needs every decode on every rank (vLLM's pcp_shard_decode_requests is False then)"
            )
        if self.shard_decode_requests and config.num_spec_tokens:
            raise ValueError(
                f"the {self.name!r} layout does not serve num_spec_tokens={config.num_spec_tokens}: "
                "pcp_fn.spec reads a decode's draft tokens from this rank's rows, which a sharded "
                "decode is not on; use 'mrv2' (decodes replicated)"
            )

    def _mrv2_replicated(self, config: PCPConfig, requests: Requests) -> torch.Tensor:
        """vLLM ``replicated_requests``: the decodes, and under DCP the short prefills."""
        decode = requests.request_ids < requests.num_decode_reqs
        if config.dcp_size == 1:
            return decode
        C, n = 2 * config.pcp_size, requests.num_scheduled
        return decode | ((C - 1) * ((n + (C - 1)) // C) >= n)

    def replicated(self, config: PCPConfig, requests: Requests) -> torch.Tensor:
        if config.pcp_size == 1:
            return requests.replicated
        rep = self._mrv2_replicated(config, requests)
        return torch.zeros_like(rep) if self.shard_decode_requests else rep  # dealt: one owner each

    def segments(
        self, config: PCPConfig, requests: Requests, rank: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        P, C = config.pcp_size, 2 * config.pcp_size
        n = requests.num_scheduled
        whole = self._mrv2_replicated(config, requests) | (P == 1)
        c = (n + (C - 1)) // C
        head, tail = rank * c, (C - 1 - rank) * c
        first = torch.stack([head, tail], 1) * ~whole[:, None]
        length = torch.minimum((n[:, None] - first).clamp(min=0), c[:, None])
        mine = n
        if self.shard_decode_requests and P > 1:  # dealt round-robin over the non-empty ones
            dealt = whole & (n > 0)
            ordinal = torch.cumsum(dealt.to(torch.int64), 0) - dealt.to(torch.int64)
            mine = n * (ordinal % P == rank)
        length = torch.where(whole[:, None], torch.stack([mine, torch.zeros_like(n)], 1), length)
        return first, length

    def num_local_tokens(
        self, config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int, num_computed: np.ndarray
    ) -> int:
        """Host: the fullest rank's rows, by the same rules (vLLM ``get_num_tokens_for_dispatch``)."""
        P, C, n = config.pcp_size, 2 * config.pcp_size, num_scheduled
        if P == 1:
            return int(n.sum())
        c = (n + (C - 1)) // C
        whole = np.arange(n.size) < num_decodes
        if config.dcp_size > 1:
            whole |= (C - 1) * c >= n
        q = np.arange(P)[:, None]
        split = np.minimum(np.maximum(n - q * c, 0), c) + np.minimum(np.maximum(n - (C - 1 - q) * c, 0), c)
        per_rank = (split * ~whole).sum(axis=1)  # [P]
        if self.shard_decode_requests:
            dealt = np.flatnonzero(whole & (n > 0))
            per_rank += np.bincount(np.arange(dealt.size) % P, weights=n[dealt], minlength=P).astype(np.int64)
        else:
            per_rank += int(n[whole].sum())
        return int(per_rank.max())


MRV2_PARTITION = MRV2Partition()
MRV2_SHARDED = MRV2Partition(shard_decode_requests=True)
