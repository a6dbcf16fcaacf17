"""`PartitionLayout`: a [`pcp_fn.Layout`][] from a token partition alone.

A researcher's layout says *which local rows of each rank hold which token*;
this base class derives everything else the facade needs, in the scheduler's
token order (no pads between requests):

- `restore_index [P*L_b]`: restored row `t` (scheduler-order token `t`) reads
  the gathered row holding it (rank 0's copy for a replicated request), rows past
  the batch's tokens read row 0;
- `unpad_mask` / `token` `[P*L_b]`: row `t < num_tokens` carries token `t`'s
  KV slot (`padded_slot_mapping`);
- logits: request `i`'s last token, `token_start[i] + n_i - 1`;
- `restored_spans`: `(token_start, n)`; `state_local_start`: this rank's
  rows per request, cumulated; the spec-decode first pass runs on the local rows.

A subclass implements [`PartitionLayout.segments`][pcp_fn.PartitionLayout.segments] (each request's local
runs on a rank, `[R_b, S]` first offset and length: `S` runs per request,
laid out request by request) or, for full control,
[`PartitionLayout.local_rows`][pcp_fn.PartitionLayout.local_rows], from the batch's
[`Requests`][pcp_fn.Requests] (scheduled and computed tokens, which are replicated, where each
starts in scheduler order). Both must be capturable (docs/concepts.md, "Capturability, checked") and
take `rank` as an int or a 0-d tensor. [`pcp_fn.mrv2.MRV2Partition`][pcp_fn.MRV2Partition] (vLLM
model runner V2's unpadded head/tail chunks, the built-in `"mrv2"`) is the example;
the built-in `"round-robin"` and `"cost-balanced"` (its `PrefillSplit`s) others.

`P = 2`, tokens `[1, 5, 8]` (request 0 a decode), `"mrv2"`: chunks of
`c = ceil(n / 4)` cut at the request's end, so rank 0 holds `(0,0) (1,0) (1,1)
(2,0) (2,1) (2,6) (2,7)` and rank 1 `(0,0) (1,2) (1,3) (1,4) (2,2) .. (2,5)`;
the restored rows are the 14 tokens in scheduler order, logits `[0, 5, 13]`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..core.ragged import arange_of, offsets, segment_of, take
from .batch import SchedulerBatch, batch_is_decode
from .config import PCPConfig, two_chunk_bound
from .registry import get_layout
from .rows import GatheredOrder, LayoutUpdate, LocalRows, RequestGeometry, RestoredSpans, TokenLayout
from .state import PCPState, next_state


class Requests(NamedTuple):
    """What a [`PartitionLayout`][pcp_fn.PartitionLayout] splits: the batch's requests, `[R_b]` rows
    (0 past `num_reqs`).

    Attributes:
        num_scheduled: `[R_b]` int64 tokens scheduled this step.
        num_computed: `[R_b]` int64 tokens already in the KV cache (token `j` of
            request `i` is at position `num_computed[i] + j` and attends
            `num_computed[i] + j + 1` keys).
        replicated: `[R_b]` bool, the request is whole on every rank (the decodes
            when `P > 1`; every request when `P == 1`).
        token_start: `[R_b + 1]` int64 first scheduler-order token of each request, then the total.
        request_ids: `[R_b]` int64 `arange(R_b)`.
        num_decode_reqs: 0-d int64, the decodes (a prefix).
        num_decode_tokens: 0-d int64, their tokens.
    """

    num_scheduled: torch.Tensor
    num_computed: torch.Tensor
    replicated: torch.Tensor
    token_start: torch.Tensor
    request_ids: torch.Tensor
    num_decode_reqs: torch.Tensor
    num_decode_tokens: torch.Tensor

    @classmethod
    def of(
        cls,
        config: PCPConfig,
        num_scheduled: torch.Tensor,
        num_computed: torch.Tensor,
        is_decode: torch.Tensor,
    ) -> Requests:
        """The requests of `[R_b]` counts (any int dtype) and decode flags (a prefix)."""
        n = num_scheduled.to(torch.int64)
        # one scan: the token starts, and the decodes' count and tokens at its end
        starts = offsets(torch.stack([n, is_decode.to(torch.int64), n * is_decode]))
        replicated = is_decode if config.pcp_size > 1 else torch.ones_like(is_decode)
        ids = torch.arange(n.shape[0], dtype=torch.int64, device=n.device)
        return cls(n, num_computed.to(torch.int64), replicated, starts[0], ids, starts[1, -1], starts[2, -1])


def rows_from_segments(first: torch.Tensor, length: torch.Tensor, num_rows: int) -> LocalRows:
    """`[num_rows]` [`LocalRows`][pcp_fn.LocalRows] of back-to-back runs.

    `first`, `length`: `[R_b, S]` int64, run `s` of request `i` holds the
    request's tokens `first[i, s] .. first[i, s] + length[i, s] - 1`; the runs are
    laid out request-major (`i` then `s`), empty runs take no row, rows past
    the last run are padding (`valid` False, request and offset 0). One search
    of the run ends paints every row ([`pcp_fn.core.ragged.segment_of`][]).
    """
    S = first.shape[1]
    starts = offsets(length.flatten())  # [R_b * S + 1]
    row = arange_of(num_rows, first.device)
    # runs past num_rows are cut off: a bound short of the rows loses tokens (init_state's canonical
    # batches and check_layout's capacity rule catch it; a served batch cannot read it back)
    run = segment_of(starts[1:].clamp(max=num_rows), row).clamp(max=starts.shape[0] - 2)
    valid = row < starts[-1]
    position = take(first.flatten(), run) + row - take(starts, run)
    return LocalRows(torch.where(valid, run // S, 0), torch.where(valid, position, 0), valid)


class PartitionLayout:
    """Base class of a [`pcp_fn.Layout`][] defined by its token partition (module docstring).

    Subclasses set `name` and implement [`segments`][pcp_fn.PartitionLayout.segments] (or
    [`local_rows`][pcp_fn.PartitionLayout.local_rows]); override
    [`num_local_tokens`][pcp_fn.PartitionLayout.num_local_tokens] when a rank may hold more than the
    DualChunkSwap bound `2 * ceil(n / 2P)` of a prefill's `n` tokens.
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
        """`([R_b, S], [R_b, S])` int64 first offset and length of each request's runs on `rank`.

        A `requests.replicated` request must be whole on every rank; every other
        token on exactly one rank; a run may reach past `n` (pad rows: offsets `>= n`).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement segments() or local_rows()")

    def replicated(self, config: PCPConfig, requests: Requests) -> torch.Tensor:
        """`[R_b]` bool, the requests whole on every rank (default `requests.replicated`: the
        decodes when `P > 1`, every request when `P == 1`). Restore and slots read a
        replicated request's tokens from rank 0; every other token must be on exactly one rank."""
        return requests.replicated

    def check_config(self, config: PCPConfig) -> None:
        """Raise `ValueError` for a config this layout cannot serve (`PCPConfig` calls it)."""

    def local_rows(
        self, config: PCPConfig, requests: Requests, rank: int | torch.Tensor, num_rows: int
    ) -> LocalRows:
        """`[num_rows]` request and offset of each of `rank`'s local rows (default:
        [`segments`][pcp_fn.PartitionLayout.segments])."""
        first, length = self.segments(config, requests, rank)
        return rows_from_segments(first, length, num_rows)

    def num_local_tokens(
        self, config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int, num_computed: np.ndarray
    ) -> int:
        """Host bound on any rank's local rows (bucket choice); by default the two-chunk split's
        ([`pcp_fn.protocol.config.two_chunk_bound`][]: `2 * ceil(n / 2P)` of a prefill)."""
        return two_chunk_bound(config, num_scheduled, num_decodes)

    # -- inherited ---------------------------------------------------------------
    def _of(
        self,
        config: PCPConfig,
        num_scheduled: torch.Tensor,
        num_computed: torch.Tensor,
        is_decode: torch.Tensor,
    ) -> Requests:
        req = Requests.of(config, num_scheduled, num_computed, is_decode)
        return req._replace(replicated=self.replicated(config, req))

    def _rank_geometry(self, req: Requests, rows: LocalRows) -> RequestGeometry:
        """The geometry of `req` with this rank's `rows` counted per request (no pads)."""
        local = torch.zeros_like(req.num_scheduled).index_add(0, rows.request, rows.valid.to(torch.int64))
        return RequestGeometry(
            num_scheduled=req.num_scheduled,
            replicated=req.replicated,
            token_start=req.token_start,
            local=local,
            local_start=offsets(local),
            request_ids=req.request_ids,
            num_decode_reqs=req.num_decode_reqs,
            num_decode_tokens=req.num_decode_tokens,
        )

    def _order(self, config: PCPConfig, req: Requests, Lb: int) -> GatheredOrder:
        """Restore index, unpad mask and token of the `P * L_b` restored rows (scheduler order)."""
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
        req = self._of(cfg, batch.num_scheduled, batch.num_computed, is_decode)
        mine = self.local_rows(cfg, req, state.pcp_rank, Lb)
        geo = self._rank_geometry(req, mine)
        order = self._order(cfg, req, Lb)
        layout = TokenLayout.of(geo, mine, order, is_decode, torch.zeros_like(geo.num_scheduled))
        positions = torch.where(mine.valid, take(req.num_computed, mine.request) + mine.position, 0)
        return LayoutUpdate(
            next_state(state, batch, is_decode), layout, geo, positions, order.token, geo.local_start
        )

    def _requests(self, state: PCPState, geometry: RequestGeometry | None = None) -> Requests:
        """The state's last batch as [`Requests`][pcp_fn.Requests] (`geometry`: its request
        geometry, when known)."""
        Rb = state.bucket.num_reqs
        if geometry is None:
            return self._of(
                state.config, state.num_scheduled[:Rb], state.num_computed[:Rb], state.is_decode[:Rb]
            )
        g = geometry  # already the layout's (replicated included)
        num_computed = state.num_computed[:Rb].to(torch.int64)
        return Requests(
            g.num_scheduled,
            num_computed,
            g.replicated,
            g.token_start,
            g.request_ids,
            g.num_decode_reqs,
            g.num_decode_tokens,
        )

    def state_geometry(self, state: PCPState) -> RequestGeometry:
        req = self._requests(state)
        rows = self.local_rows(state.config, req, state.pcp_rank, state.bucket.num_tokens)
        return self._rank_geometry(req, rows)

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
