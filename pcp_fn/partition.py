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
laid out request by request) or, for full control, :meth:`PartitionLayout.local_rows`.
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
        self, config: PCPConfig, geometry: RequestGeometry, rank: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``([R_b, S], [R_b, S])`` int64 first offset and length of each request's runs on ``rank``.

        ``geometry``'s request-level fields are valid (``num_scheduled``, ``replicated``,
        ``token_start``, ``request_ids``, ``num_decode_reqs``, ``num_decode_tokens``).
        A ``replicated`` request must be whole on every rank; every other token on
        exactly one rank; a run may reach past ``n`` (pad rows: offsets ``>= n``).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement segments() or local_rows()")

    def local_rows(
        self, config: PCPConfig, geometry: RequestGeometry, rank: int | torch.Tensor, num_rows: int
    ) -> LocalRows:
        """``[num_rows]`` request and offset of each of ``rank``'s local rows (default: :meth:`segments`)."""
        first, length = self.segments(config, geometry, rank)
        return rows_from_segments(first, length, num_rows)

    def num_local_tokens(self, config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int) -> int:
        """Host bound on any rank's local rows (bucket choice): the DualChunkSwap count by default."""
        return dcs_num_local_tokens(config, num_scheduled, num_decodes)

    # -- inherited ---------------------------------------------------------------
    def _rank_geometry(self, geo: RequestGeometry, rows: LocalRows) -> RequestGeometry:
        """``geo`` with this rank's per-request row counts and no pads (restored = scheduler order)."""
        local = torch.zeros_like(geo.num_scheduled).index_add(0, rows.request, rows.valid.to(torch.int64))
        local_start = offsets(local)
        zeros = torch.zeros_like(geo.num_scheduled)
        return geo._replace(
            local=local,
            local_start=local_start,
            num_padded=geo.num_scheduled,
            padded_start=geo.token_start,
            num_pads=zeros,
            pads_start=torch.zeros_like(geo.token_start),
            local_less_padded_start=local_start - geo.token_start,
        )

    def _order(self, config: PCPConfig, geo: RequestGeometry, Lb: int) -> GatheredOrder:
        """Restore index, unpad mask and token of the ``P * L_b`` restored rows (scheduler order)."""
        P, G = config.pcp_size, config.pcp_size * Lb
        # every rank's rows: the restore reads them all (P is static: a loop over ranks, not data)
        ranks = [self.local_rows(config, geo, q, Lb) for q in range(P)]
        request = torch.stack([r.request for r in ranks])  # [P, L_b]
        offset = torch.stack([r.position for r in ranks])
        valid = torch.stack([r.valid for r in ranks])
        token = take(geo.token_start, request.flatten()).view(P, Lb) + offset
        real = valid & (offset < take(geo.num_scheduled, request.flatten()).view(P, Lb))
        rank0 = torch.arange(P, device=token.device)[:, None] == 0
        first_copy = real & (rank0 | ~take(geo.replicated, request.flatten()).view(P, Lb))
        row = arange_of(G + 1, token.device)
        # inverse permutation by scatter: rows that are not a token's first copy go to a trash slot
        dest = torch.where(first_copy, token, G).flatten()
        restore = torch.zeros(G + 1, dtype=torch.int64, device=token.device).scatter(0, dest, row[:G])[:G]
        mask = row[:G] < geo.token_start[-1]
        return GatheredOrder(restore_index=restore * mask, unpad_mask=mask, token=row[:G])

    def build(self, state: PCPState, batch: SchedulerBatch) -> LayoutUpdate:
        cfg, Lb = state.config, batch.bucket.num_tokens
        is_decode = batch_is_decode(cfg, batch)
        geo0 = request_geometry(cfg, batch.num_scheduled, is_decode, state.constants)
        mine = self.local_rows(cfg, geo0, state.pcp_rank, Lb)
        geo = self._rank_geometry(geo0, mine)
        order = self._order(cfg, geo0, Lb)
        computed = take(batch.num_computed.to(torch.int64), mine.request)
        layout = TokenLayout.of(geo, mine, order, is_decode)
        positions = torch.where(mine.valid, computed + mine.position, 0)
        return LayoutUpdate(
            next_state(state, batch, is_decode), layout, geo, positions, order.token, geo.local_start
        )

    def _state_request_geometry(self, state: PCPState) -> RequestGeometry:
        Rb = state.bucket.num_reqs
        return request_geometry(state.config, state.num_scheduled[:Rb], state.is_decode[:Rb], state.constants)

    def state_geometry(self, state: PCPState) -> RequestGeometry:
        geo = self._state_request_geometry(state)
        rows = self.local_rows(state.config, geo, state.pcp_rank, state.bucket.num_tokens)
        return self._rank_geometry(geo, rows)

    def logits_from_geometry(
        self, config: PCPConfig, geometry: RequestGeometry, num_reqs: torch.Tensor
    ) -> torch.Tensor:
        # rows past num_reqs schedule nothing: (n - 1) + start * real is -1 there, clamped to 0
        real = geometry.request_ids < num_reqs
        return torch.addcmul(geometry.num_scheduled - 1, geometry.token_start[:-1], real).clamp(min=0)

    def gathered_order(self, state: PCPState) -> GatheredOrder:
        return self._order(state.config, self._state_request_geometry(state), state.bucket.num_tokens)

    def restore_index(self, state: PCPState) -> torch.Tensor:
        return self.gathered_order(state).restore_index

    def state_local_rows(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
        geo = self._state_request_geometry(state) if geometry is None else geometry
        return self.local_rows(state.config, geo, state.pcp_rank, state.bucket.num_tokens)

    def state_local_start(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> torch.Tensor:
        return (self.state_geometry(state) if geometry is None else geometry).local_start

    def restored_spans(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> RestoredSpans:
        geo = self._state_request_geometry(state) if geometry is None else geometry
        return RestoredSpans(geo.token_start[:-1], geo.num_scheduled)

    def first_pass_rows(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows:
        return self.state_local_rows(state, geometry=geometry)


class MRV2Partition(PartitionLayout):
    """vLLM model runner V2's partition (:mod:`pcp_fn.mrv2`) as a facade layout, ``"mrv2"``.

    A prefill of ``n`` tokens is cut into ``2P`` chunks of ``c = ceil(n / 2P)``; rank
    ``q`` holds chunk ``q`` (head) and ``2P-1-q`` (tail), each cut at the request's
    end (no pads); a decode is whole on every rank. Restore, slots and logits are in
    scheduler order (the MRV2 ``hidden_restore_idx`` order). Differences from
    :mod:`pcp_fn.mrv2` (whose own config, state and API are unchanged): the decode
    classification is the facade's (:func:`pcp_fn.dcs.classify_decodes`), decodes
    are replicated (no ``shard_decode_requests``), and ``dcp_size > 1``'s
    replication of short prefills is not applied.
    """

    name = "mrv2"

    def segments(
        self, config: PCPConfig, geometry: RequestGeometry, rank: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        C = 2 * config.pcp_size
        n, replicated = geometry.num_scheduled, geometry.replicated
        c = (n + (C - 1)) // C
        head, tail = rank * c, (C - 1 - rank) * c
        first = torch.stack([head, tail], 1) * ~replicated[:, None]
        length = torch.minimum((n[:, None] - first).clamp(min=0), c[:, None])
        length = torch.where(replicated[:, None], torch.stack([n, torch.zeros_like(n)], 1), length)
        return first, length


MRV2_PARTITION = MRV2Partition()
