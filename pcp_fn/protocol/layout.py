"""The public layout protocol: [`Layout`][pcp_fn.Layout], what a PCP layout computes for one rank.

A *layout* decides which rank holds which scheduled token, and everything that follows
from it: positions, the restore of the all-gathered hidden states, the padded KV slot
mapping, the logits rows, the spec-decode prep's row maps. The facade ops
([`pcp_fn.update_tokens`][pcp_fn.update_tokens.update_tokens], [`pcp_fn.step`][pcp_fn.step.step],
[`pcp_fn.get_logits_indices`][], [`pcp_fn.padded_slot_mapping`][],
[`pcp_fn.restore_hidden_states`][],
[`pcp_fn.attention_runs`][pcp_fn.attention_runs.attention_runs]), the spec-decode prep
([`pcp_fn.spec`][]), [`pcp_fn.graph.capture`][pcp_fn.graph.capture.capture] and
[`pcp_fn.all_ranks`][] talk to a layout only through this protocol; which one serves a config is
`PCPConfig(..., layout=name)` ([`pcp_fn.protocol.registry`][]).

Its methods take and return the types of [`pcp_fn.protocol.rows`][]. The built-ins:
`"dcs"` (DualChunkSwap, [`pcp_fn.dcs`][]), `"hybrid"` ([`pcp_fn.hybrid`][]),
`"mrv2"` and `"mrv2-sharded"` (vLLM model runner V2's partition,
[`pcp_fn.mrv2.MRV2Partition`][pcp_fn.MRV2Partition]). A new partitioning either implements the protocol
(`examples/contiguous_layout.py` does, in full), subclasses
[`pcp_fn.PartitionLayout`][], which derives everything but the partition, or binds a
module of functions with [`pcp_fn.PackageLayout`][]; either way
[`pcp_fn.testing.check_layout`][] checks it.
"""

from __future__ import annotations

from typing import Protocol, cast, runtime_checkable

import numpy as np
import torch

from .batch import SchedulerBatch
from .config import PCPConfig
from .registry import NamedLayout
from .rows import GatheredOrder, LayoutUpdate, LocalRows, RequestGeometry, RestoredSpans
from .state import PCPState


@runtime_checkable
class Layout(NamedLayout, Protocol):
    """What a PCP layout computes, for one rank, from `(config, bucket)`-shaped buffers.

    Sizes: `P = config.pcp_size`; a batch's bucket gives `R_b` request rows and
    `L_b` local rows per rank; `G_b = P * L_b` gathered rows (the ranks' local
    `[L_b, ...]` buffers stacked rank-major, what `all_gather` returns). Every
    method is a pure, capturable function (docs/concepts.md, "Capturability, checked"): no host sync, no
    data-dependent shape, no Python branch on a tensor value; `state.pcp_rank`
    may be an int or a 0-d tensor (rank as data, [`pcp_fn.all_ranks`][] vmaps
    over it). The state is [`pcp_fn.PCPState`][] (the per-request record of the
    last update: `num_reqs`, `num_scheduled`, `num_computed`, `is_decode`, at the bucket
    `state.bucket`); every layout shares it.

    Its members:

    - `name`: the registry key (`PCPConfig(layout=name)`).
    - `num_local_tokens(config, num_scheduled, num_decodes, num_computed) -> int`: host
      (numpy) only, called by [`pcp_fn.make_batch`][] to pick the bucket: an
      upper bound on the local rows any rank holds (`num_scheduled`,
      `num_computed`: `[n]` int64, decodes first, `num_decodes` of them).
      Must not exceed `config.max_local_tokens` for any valid batch. `make_batch`
      refuses a result that is not an int in `[ceil(tokens / P), L]`; one below a
      rank's rows has a [`pcp_fn.PartitionLayout`][] cut the runs past `L_b`.
    - `build(state, batch) -> LayoutUpdate`: the entry map; reads only the state's
      rank and constants. `LayoutUpdate`: next state (recording the batch,
      [`pcp_fn.protocol.state.next_state`][pcp_fn.protocol.next_state]), the public `TokenLayout`
      (`pcp_tokens [R_b]`, `positions [L_b]`, `request_index [L_b]`,
      `num_tokens` 0-d, `unpad_mask [G_b]`, `restore_index [G_b]`...),
      the request geometry `[R_b]`, absolute positions `[L_b]`, the
      scheduler-order token of each slot row `[G_b]` (read under
      `unpad_mask`) and the local starts `[R_b + 1]`.
    - `state_geometry(state) -> RequestGeometry`: the per-request sizes at `R_b`
      rows (`token_start`, `num_scheduled`, `replicated`, `local`,
      `local_start`: this rank's rows per request; `own`: the layout's private
      record, which only its own methods read). The state records the last batch's
      `num_scheduled`, `num_computed` and `is_decode`.
    - `logits_from_geometry(config, geometry, num_reqs) -> [R_b] int64`: the row of
      the restored hidden states holding each request's last token; 0 past
      `num_reqs`.
    - `restore_index(state) -> [G_b] int64`: the gathered row of each restored row
      (`restore_hidden_states = gathered[restore_index]`).
    - `gathered_order(state) -> GatheredOrder`: `restore_index`, `unpad_mask [G_b]`
      (the rows written to the KV cache) and `token [G_b]` (the
      scheduler-order token of each such row): `padded_slot_mapping`.
    - `state_local_rows(state, *, geometry=None) -> LocalRows`: request, offset
      (inside the request's scheduled tokens; `>= n` for a pad row) and
      `valid` of each of this rank's `[L_b]` local rows.
    - `state_local_start(state, *, geometry=None) -> [R_b + 1] int64`: first local
      row of each request on this rank, then the total (`query_start_loc`).
    - `restored_spans(state, *, geometry=None) -> RestoredSpans`: `start`,
      `length` `[R_b]`: request `i`'s tokens are restored rows
      `start[i] .. start[i] + n_i - 1`, in order.
    - `first_pass_rows(state, *, geometry=None) -> LocalRows`: this rank's rows of the
      MTP drafter's first pass (usually `state_local_rows`).

    The `geometry=` keyword of the last four takes `state_geometry`'s result when the
    caller has it (the spec-decode prep reads several maps of one state). Two optional hooks,
    looked up with `getattr`:

    - `check_config(config) -> None`: raise `ValueError` for a config the layout cannot
      serve (`PCPConfig` calls it).
    - `constants(config) -> dict[str, list]`: config-only integer tables that
      [`pcp_fn.init_state`][] puts on the device once (`state.constants`), so that
      no method copies host data to the device.

    Invariants (what [`pcp_fn.testing.check_layout`][] verifies):

    1. every output's shape depends on `(config, bucket)` only;
    2. ownership: a request the geometry marks `replicated` (for most layouts the decodes when
       `P > 1`) is on every rank; every other scheduled token is on exactly one
       rank; each rank lists its rows request by request (`state_local_start`),
       real rows first, padding (`valid` False) at the tail;
    3. restore: `gathered[restore_index]` puts every token once, in request
       order, at the rows `restored_spans` names, each read from the rank that holds
       it (rank 0's copy of a replicated token);
    4. slots: the rows `unpad_mask` marks carry every scheduled token's slot
       exactly once; the others get `pad_slot_id`;
    5. logits: `logits[i]` is the restored row of request `i`'s last token;
    6. positions: `positions = num_computed[request] + offset` on real rows.

    What the serving path checks, without a host sync (docs/layouts.md, "What is checked
    where"): [`pcp_fn.register_layout`][] the members and the name; [`pcp_fn.make_batch`][]
    that `num_local_tokens` is an int in `[ceil(tokens / P), L]`; the first
    [`pcp_fn.init_state`][] of a config whose layout is not a built-in runs it once, on the
    CPU, on a few canonical batches, in the exact bucket its bound asks for, and checks rules
    2 to 6 and the capacity ([`pcp_fn.protocol.canonical`][]: a layout that is not a
    partition, or whose bound is short there, raises `LayoutError`). On the batches it
    serves, every rule (and rank 0's copy in rule 3, and capturability) is
    [`pcp_fn.testing.check_layout`][]'s alone: checking it there would read every rank's
    rows back on the host each step.

    Worked example, `P = 2`, `L_b = 9`, tokens `[1, 5, 8]` (request 0 a decode),
    the `"dcs"` layout: rank 0's local rows are `(request, offset)`
    `(0,0) (1,0) (1,1) (1,6) (1,7) (2,0) (2,1) (2,6) (2,7)`, rank 1's
    `(0,0) (1,2) (1,3) (1,4) (1,5) (2,2) ..`; `state_local_start [0, 1, 5, 9]`;
    the restored (padded) order is `restore_index [0, 9, 1, 2, 10, 11, 12, 13, 3, 4, 5,
    6, 14, 15, 16, 17, 7, 8]` with `restored_spans.start [0, 2, 10]`, logits
    `[0, 6, 17]`. The `"mrv2"` layout cuts the same chunks at the request's end
    (no pads) and restores to scheduler order: logits `[0, 5, 13]`.
    """

    name: str

    def num_local_tokens(
        self, config: PCPConfig, num_scheduled: np.ndarray, num_decodes: int, num_computed: np.ndarray
    ) -> int: ...

    def build(self, state: PCPState, batch: SchedulerBatch) -> LayoutUpdate: ...

    def state_geometry(self, state: PCPState) -> RequestGeometry: ...

    def logits_from_geometry(
        self, config: PCPConfig, geometry: RequestGeometry, num_reqs: torch.Tensor
    ) -> torch.Tensor: ...

    def restore_index(self, state: PCPState) -> torch.Tensor: ...

    def gathered_order(self, state: PCPState) -> GatheredOrder: ...

    def state_local_rows(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows: ...

    def state_local_start(
        self, state: PCPState, *, geometry: RequestGeometry | None = None
    ) -> torch.Tensor: ...

    def restored_spans(
        self, state: PCPState, *, geometry: RequestGeometry | None = None
    ) -> RestoredSpans: ...

    def first_pass_rows(self, state: PCPState, *, geometry: RequestGeometry | None = None) -> LocalRows: ...


def layout_of(config: PCPConfig) -> Layout:
    """The [`Layout`][pcp_fn.Layout] serving `config` (`config.layout`, from the registry)."""
    return cast(Layout, config.layout_impl)
