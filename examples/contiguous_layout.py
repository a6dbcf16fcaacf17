"""A layout written on the raw :class:`pcp_fn.Layout` protocol: no ``PartitionLayout``, no ``PackageLayout``.

    python examples/contiguous_layout.py

Each prefill of ``n`` tokens is split into ``P`` contiguous pieces (the linear split):
rank ``q`` holds ``n // P + (q < n % P)`` consecutive tokens, starting at
``q * (n // P) + min(q, n % P)``. Decodes are replicated on every rank and restored
from rank 0's copy. The restored order is the scheduler's, with no pad row.
``P = 2``, tokens ``[1, 5, 8]`` (request 0 a decode), ``L_b = 8``::

    RequestGeometry  num_scheduled [1, 5, 8]   replicated [T, F, F]   token_start [0, 1, 6, 14]
      rank 0         local [1, 3, 4]           local_start [0, 1, 4, 8]
      rank 1         local [1, 2, 4]           local_start [0, 1, 3, 7]
    LocalRows rank 0 request  [0, 1, 1, 1, 2, 2, 2, 2]
                     position [0, 0, 1, 2, 0, 1, 2, 3]
              rank 1 request  [0, 1, 1, 2, 2, 2, 2, 0]     (the last row: padding, valid False)
                     position [0, 3, 4, 4, 5, 6, 7, 0]
    GatheredOrder    restore_index [0, 1, 2, 3, 9, 10, 4, 5, 6, 7, 11, 12, 13, 14, 0, 0]
                     unpad_mask    14 x True, 2 x False;  token = the row
    RestoredSpans    start [0, 1, 6]   length [1, 5, 8]   logits [0, 5, 13]

Every map is computed from two ``[P, R_b]`` tables (every rank's first offset and
length in each request) with the ragged primitives of ``pcp_fn/core/ragged.py``: no
Python loop over requests or tokens, no host sync, shapes from ``(config, bucket)``
alone, so :func:`pcp_fn.testing.check_layout` compiles and exports it. Neither optional
hook is needed: every config is served (no ``check_config``) and no config-only table is
read (no ``constants``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import pcp_fn
from pcp_fn.core.ragged import offsets, ragged_index, segment_of, take
from pcp_fn.core.rank import select_rank
from pcp_fn.protocol import classify_decodes, next_state


class Runs(NamedTuple):
    """The layout's own record (``RequestGeometry.own``): every rank's run of each request."""

    first: torch.Tensor  # [P, R_b] int64 first offset of rank q's run (0 for a replicated request)
    length: torch.Tensor  # [P, R_b] int64 its tokens (n for a replicated request)


class ContiguousLayout:
    """Rank ``q`` holds one contiguous run of each prefill; decodes on every rank."""

    name = "contiguous"

    def num_local_tokens(self, config, num_scheduled, num_decodes, num_computed):
        """Host (numpy), exact: rank 0 holds the most, every decode and ``ceil(n / P)`` of each prefill."""
        prefills = num_scheduled[num_decodes:]
        return int(num_scheduled[:num_decodes].sum() + (-(-prefills // config.pcp_size)).sum())

    # -- the per-request record, the entry map ------------------------------------------
    def _geometry(self, config, rank, num_scheduled, is_decode):
        P, n = config.pcp_size, num_scheduled.to(torch.int64)
        replicated = is_decode if P > 1 else torch.ones_like(is_decode)
        q = torch.arange(P, device=n.device)[:, None]  # [P, 1]: every rank at once
        first = torch.where(replicated, 0, q * (n // P) + torch.minimum(q, n % P))
        length = torch.where(replicated, n, (n + P - 1 - q) // P)  # n // P + (q < n % P)
        local = select_rank(length, rank)  # this rank's row of the table
        return pcp_fn.RequestGeometry(
            num_scheduled=n,
            replicated=replicated,
            token_start=offsets(n),
            local=local,
            local_start=offsets(local),
            request_ids=torch.arange(n.shape[0], device=n.device),
            num_decode_reqs=is_decode.sum(),
            num_decode_tokens=(n * is_decode).sum(),
            own=Runs(first, length),
        )

    def _local_rows(self, geo, rank, num_rows):
        slot = ragged_index(geo.local, num_rows)  # request and offset among this rank's rows
        first = take(select_rank(geo.own.first, rank), slot.segment)
        return pcp_fn.LocalRows(slot.segment * slot.valid, (first + slot.offset) * slot.valid, slot.valid)

    def _order(self, config, geo, num_rows):
        """Restored row ``t`` is scheduler-order token ``t``: read it from the rank whose run holds it."""
        t = torch.arange(config.pcp_size * num_rows, device=geo.num_scheduled.device)
        i = segment_of(geo.token_start[1:-1], t)  # request of token t (the last one takes the tail)
        j = t - take(geo.token_start, i)  # its offset in the request
        first, length = geo.own
        owner = (first[1:].index_select(1, i) <= j).sum(0)  # the last run starting at or before j
        owner = torch.where(take(geo.replicated, i), 0, owner)  # rank 0's copy of a decode
        row = offsets(length)[owner, i] + j - first[owner, i]  # its local row on the owner
        real = t < geo.token_start[-1]
        return pcp_fn.GatheredOrder(restore_index=(owner * num_rows + row) * real, unpad_mask=real, token=t)

    def build(self, state, batch):
        cfg, Lb = state.config, batch.bucket.num_tokens
        is_decode = classify_decodes(cfg, batch.num_scheduled, batch.num_computed, batch.num_prompt)
        geo = self._geometry(cfg, state.pcp_rank, batch.num_scheduled, is_decode)
        mine = self._local_rows(geo, state.pcp_rank, Lb)
        order = self._order(cfg, geo, Lb)
        layout = pcp_fn.TokenLayout.of(geo, mine, order, is_decode, torch.zeros_like(geo.num_scheduled))
        positions = (take(batch.num_computed.to(torch.int64), mine.request) + mine.position) * mine.valid
        return pcp_fn.LayoutUpdate(
            next_state(state, batch, is_decode), layout, geo, positions, order.token, geo.local_start
        )

    # -- the maps the consumer ops rebuild from the state ---------------------------------
    def state_geometry(self, state):
        Rb = state.bucket.num_reqs
        return self._geometry(state.config, state.pcp_rank, state.num_scheduled[:Rb], state.is_decode[:Rb])

    def logits_from_geometry(self, config, geometry, num_reqs):
        last = geometry.token_start[1:] - 1  # the request's last token: scheduler order, no pads
        return torch.where(geometry.request_ids < num_reqs, last, 0).clamp(min=0)

    def gathered_order(self, state):
        return self._order(state.config, self.state_geometry(state), state.bucket.num_tokens)

    def restore_index(self, state):
        return self.gathered_order(state).restore_index

    def state_local_rows(self, state, *, geometry=None):
        geo = self.state_geometry(state) if geometry is None else geometry
        return self._local_rows(geo, state.pcp_rank, state.bucket.num_tokens)

    def state_local_start(self, state, *, geometry=None):
        return (self.state_geometry(state) if geometry is None else geometry).local_start

    def restored_spans(self, state, *, geometry=None):
        geo = self.state_geometry(state) if geometry is None else geometry
        return pcp_fn.RestoredSpans(geo.token_start[:-1], geo.num_scheduled)

    def first_pass_rows(self, state, *, geometry=None):
        return self.state_local_rows(state, geometry=geometry)  # the drafter runs on the local rows


CONTIGUOUS = pcp_fn.register_layout(ContiguousLayout())


def show(P: int = 2) -> None:
    """One step of the module docstring's batch on every rank, printed."""
    cfg = pcp_fn.PCPConfig(P, 0, 4, 32, layout="contiguous")
    batch = pcp_fn.make_batch(cfg, [1, 5, 8], [7, 0, 0], [3, 5, 8], slot_mapping=range(100, 114))
    total = 14
    _, out = pcp_fn.all_ranks(pcp_fn.step, pcp_fn.init_state(cfg, rank=0), batch)
    for r in range(P):
        n = int(out.layout.num_tokens[r])
        req, pos = out.layout.request_index[r, :n].tolist(), out.layout.positions[r, :n].tolist()
        print(f"rank {r}: request {req} offset {pos} positions {out.positions[r, :n].tolist()}")
    print(f"restore_index {out.layout.restore_index[0, :total].tolist()}")
    print(f"logits {out.logits_indices[0, :3].tolist()}, slots {out.slot_mapping[0, :total].tolist()}")


def main() -> None:
    from pcp_fn.testing import check_layout

    show()
    # hypothesis batches at P = 1..4 (0 and 1 spec tokens) + the capacity edges, graphs at P = 2
    check_layout(CONTIGUOUS, pcp_sizes=(1, 2, 3, 4), max_examples=8, graph_pcp_sizes=(2,))
    print("check_layout: ok")


if __name__ == "__main__":
    main()
