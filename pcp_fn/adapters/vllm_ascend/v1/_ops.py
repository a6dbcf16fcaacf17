"""Every call the vllm-ascend adapter makes into pcp_fn, in one place.

The manager's modules never touch pcp_fn's ops themselves: they call the
functions here (so a change of pcp_fn's signatures is one edit in this file).
Two kinds:

- the device functions (`device_step`, `device_padded_slots`,
  `mtp_mask_into`): fixed shapes per bucket, no host sync, each run
  by `DeviceGraphs` as one graph per rung of the manager's ladder of
  buckets (made at construction), bound to persistent staging buffers and
  writing its results into the persistent buffers inside the graph;
- thin wrappers of the spec-decode and multimodal ops the manager's helpers
  use, run eagerly (inside the proposer's own graph when it captures one).

pcp_fn's size convention holds throughout: an op takes no size argument (it
reads the bucket of the state's last update, `state.bucket`), and every
per-request input has exactly `R_b` rows, every scheduler-order per-token
input exactly `F_b = token_rows(config, bucket)`. The runner hands the
manager tensors of its own lengths, so the wrappers here pad them to those
rows (or, for inputs tied to no step, to the capacity state's) and slice the
results back.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

import pcp_fn
from pcp_fn import multimodal as pcp_mm
from pcp_fn import spec as pcp_spec
from pcp_fn.core.entry import entry_op
from pcp_fn.dcs.packing import REQUESTS
from pcp_fn.protocol.batch import token_rows

from ....dcs.host import HostLayout
from ...backend import GraphStats, graph_ladder
from ...runtime import GraphCall, GraphRuntime, Staging
from ._settings import ManagerSettings

# The index tensors of the attention metadata, by their pcp_fn names; vllm-ascend's
# AscendPrefillContextParallelMetadata field is the value.
ATTENTION_INDEX_FIELDS = pcp_fn.dcs.attention.VLLM_ASCEND_INDEX_FIELDS

Bucket = pcp_fn.Bucket
PCPConfig = pcp_fn.PCPConfig
PCPState = pcp_fn.PCPState
SchedulerBatch = pcp_fn.SchedulerBatch
FullInputs = pcp_spec.FullInputs
LocalScheduleLayout = pcp_mm.LocalScheduleLayout


# ------------------------------------------------------------------ config, state, batch
def make_config(
    s: ManagerSettings, request_buckets: Sequence[int] | None, token_buckets: Sequence[int] | None
) -> PCPConfig:
    """The rank's [`pcp_fn.PCPConfig`][] (it validates ranks, sizes and buckets), its buckets those
    of the graph ladder (`graph_buckets`): `token_buckets` (default powers of two from 16)
    up to the local capacity `L`, each with `min(L_b, R)` request rows, rounded up to
    `request_buckets` when given."""
    cfg = pcp_fn.PCPConfig(
        s.pcp_size,
        s.pcp_rank,
        s.max_num_reqs,
        s.max_num_tokens,
        dcp_size=s.dcp_size,
        dcp_rank=s.dcp_rank,
        num_spec_tokens=s.num_spec_tokens,
        cp_kv_cache_interleave_size=s.interleave,
        hybrid_attn=s.hybrid_attn,
        pd_decode_recompute=s.pd_decode_recompute,
        request_buckets=request_buckets,
        token_buckets=token_buckets,
    )
    # every local row holds a token, but for requests with none: a rung of L_b tokens needs
    # min(L_b, R) rows (the vLLM adapter's ladder)
    ladder = graph_ladder(cfg.max_num_reqs, cfg.max_local_tokens, token_buckets)
    rows = cfg.request_buckets if request_buckets is not None else sorted({b.num_reqs for b in ladder})
    return dataclasses.replace(
        cfg, request_buckets=tuple(rows), token_buckets=tuple(b.num_tokens for b in ladder)
    )


def graph_buckets(cfg: PCPConfig) -> tuple[Bucket, ...]:
    """The ladder of a `make_config` config: one bucket per token bucket `L_b`, with the
    smallest request bucket holding `min(L_b, R)` rows. A step of `n` requests and `N`
    local tokens fits the first rung of `L_b >= max(n, N)` (`DeviceGraphs.bucket_for`)."""
    R = cfg.max_num_reqs
    return tuple(cfg.bucket_for(min(t, R), t) for t in cfg.token_buckets)


def init_state(cfg: PCPConfig, device: torch.device | str) -> PCPState:
    return pcp_fn.init_state(cfg, device)


def make_batch(cfg: PCPConfig, h: HostLayout, device: torch.device) -> SchedulerBatch:
    """The host boundary: validates (`ValueError` naming field and limit), picks the bucket, one copy."""
    return pcp_fn.make_batch(cfg, h.num_scheduled, h.num_computed, h.device_prompt, device)


def full_rows(cfg: PCPConfig, bucket: Bucket) -> int:
    """`F_b = min(T, P * L_b)`: scheduler-order (pre-split) token rows of a bucket."""
    return token_rows(cfg, bucket)


def host_state(base: PCPState, h: HostLayout, bucket: Bucket) -> PCPState:
    """A CPU state holding the step's per-request record at `bucket` (the batch's), for the ops
    that read the CPU token table; what `update_tokens` records, without building the layout."""
    R = base.config.max_num_reqs
    sched = np.zeros(R, dtype=np.int32)
    sched[: h.num_reqs] = h.num_scheduled
    decode = np.zeros(R, dtype=bool)
    decode[: h.num_reqs] = h.is_decode
    return dataclasses.replace(
        base,
        bucket=bucket,
        num_reqs=torch.full((), h.num_reqs, dtype=torch.int64),
        num_scheduled=torch.from_numpy(sched),
        is_decode=torch.from_numpy(decode),
    )


def _pad_rows(x: torch.Tensor, rows: int, name: str, value: int = 0) -> torch.Tensor:
    """`x` padded with `value` to `rows` rows (dim 0); more than `rows` is a `ValueError`."""
    n = x.shape[0]
    if n > rows:
        raise ValueError(f"{name} has {n} rows; the step's bucket holds {rows}")
    if n == rows:
        return x
    return torch.cat([x, x.new_full((rows - n, *x.shape[1:]), value)])


# ------------------------------------------------------------------ the device step (captured)
def _restride(index: torch.Tensor, old: int, new: torch.Tensor) -> torch.Tensor:
    """`rank * old + row -> rank * new + row`: pcp_fn addresses fixed `[L_b]` rank buffers,
    vllm-ascend compact ones (`new` rows per rank, a 0-d tensor)."""
    return index // old * new + index % old


@entry_op
def device_step(state: PCPState, batch: SchedulerBatch) -> tuple[PCPState, dict[str, torch.Tensor]]:
    """One step's device results for this rank, every shape from `(config, bucket)`.

    An entry op ([`pcp_fn.core.entry`][]): of `state` it reads only the
    config and rank (`update_tokens` starts the step), so a captured graph
    is keyed by the batch's bucket alone, whatever bucket the last step had.

    Keys (`G_b = P * L_b`): `restore` `[G_b]` int64 (vllm-ascend
    `pcp_allgather_restore_idx`: compact `rank * N + row` addressing),
    `unpad_mask` `[G_b]`, `logits` `[R_b]`; with hybrid attention
    `enter` `[G_b]` int32 (`rank * M + row`), `fa_padding` `[G_b]`,
    `fa_query` `[L_b]` int32, `exit` `[L_b]` int64
    (`rank * (N_dcs - D) + query`); with `P > 1` the ten attention index
    tensors (int32, padded); with spec tokens (not hybrid) `decode_rows`
    `[L_b]`, the restored rows of the decode tokens.
    """
    cfg = state.config
    P, Lb = cfg.pcp_size, batch.bucket.num_tokens
    state, layout = pcp_fn.update_tokens(state, batch)
    state, logits = pcp_fn.get_logits_indices(state)
    N = layout.num_tokens_padded if cfg.hybrid_attn else layout.num_tokens
    out = {
        "restore": _restride(layout.restore_index, Lb, N),
        "unpad_mask": layout.unpad_mask,
        "logits": logits,
    }
    if cfg.hybrid_attn:
        out["enter"] = _restride(layout.enter_fa_restore_idx, Lb, layout.max_num_tokens_across_pcp).to(
            torch.int32
        )
        out["fa_padding"] = layout.fa_padding_restore_idx.to(torch.int32)
        out["fa_query"] = layout.fa_query_idx.to(torch.int32)
        out["exit"] = _restride(layout.exit_fa_scatter_idx, Lb, layout.fa_query_len)
    if P > 1:
        state, meta = pcp_fn.attention_metadata(state, batch)
        out.update({name: getattr(meta, name).index for name in ATTENTION_INDEX_FIELDS})
        if cfg.num_spec_tokens > 0 and not cfg.hybrid_attn:
            # the decode rows are decode_hidden_states applied to the row numbers themselves
            rows = torch.arange(P * Lb, dtype=torch.int64, device=logits.device)[:, None]
            _, picked = pcp_fn.decode_hidden_states(state, rows)
            out["decode_rows"] = picked[:, 0]
    return state, out


def device_padded_slots(state: PCPState, slots: torch.Tensor) -> torch.Tensor:
    """`[P * L_b]` int32 padded slot mapping (vllm-ascend `get_padded_slot_mapping`) of the
    `[F_b]` scheduler-order slots (padded with `pad_slot_id` past the step's tokens)."""
    _, padded = pcp_fn.padded_slot_mapping(state, slots)
    return padded.to(torch.int32)


def gathered_capacity(cfg: PCPConfig) -> int:
    """`G = P * L`: rows of the padded gathered order any batch fits in."""
    return cfg.max_gathered_tokens


def output_capacities(cfg: PCPConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every `device_step` output at the capacity bucket.

    Run on the `meta` device: the persistent buffers are sized by the ops themselves.
    """
    state = pcp_fn.init_state(cfg, "meta")
    batch = pcp_fn.make_batch(cfg, [], [], [], "meta", bucket=cfg.capacity)
    _, out = device_step(state, batch)
    return {k: (tuple(v.shape), v.dtype) for k, v in out.items()}


def unpack_batch(cfg: PCPConfig, bucket: Bucket, packed: torch.Tensor) -> SchedulerBatch:
    """The [`pcp_fn.SchedulerBatch`][] of `bucket` over the staging buffer (views, no copy).

    `packed` holds [`pcp_fn.dcs.packing.REQUESTS`][] (`[num_scheduled | num_computed |
    num_prompt]`, `R` rows each, zero past the requests, then `num_reqs`): what
    `make_batch` copies to the device in one go, staged by `DeviceGraphs.stage` instead.
    """
    views, Rb = REQUESTS.unpack(packed, cfg.max_num_reqs), bucket.num_reqs
    return SchedulerBatch(
        config=cfg.shared,
        bucket=bucket,
        num_reqs=views["num_reqs"],
        num_scheduled=views["num_scheduled"][:Rb],
        num_computed=views["num_computed"][:Rb],
        num_prompt=views["num_prompt"][:Rb],
    )


class Record(NamedTuple):
    """The per-request record of the last step, persistent (what a [`pcp_fn.PCPState`][]
    holds besides its constants): `num_reqs` 0-d int64, `num_scheduled` `[R]` int32,
    `is_decode` `[R]` bool."""

    num_reqs: torch.Tensor
    num_scheduled: torch.Tensor
    is_decode: torch.Tensor


def step_into(
    bucket: Bucket,
    state: PCPState,
    out: dict[str, torch.Tensor],
    record: Record,
    query_lens: torch.Tensor,
    packed: torch.Tensor,
) -> None:
    """`device_step` of the staged batch (`packed`, see `unpack_batch`), its results
    written into the persistent buffers: `out` (each result in the first rows of its buffer),
    `record` (the state's per-request record) and `query_lens` `[R]` (the scheduled
    tokens, zero past the requests: vllm-ascend `query_lens_pcp_full.gpu`). Inside the
    graph, so a replay leaves them there and the host copies nothing back."""
    R = state.config.max_num_reqs
    new, results = device_step(state, unpack_batch(state.config, bucket, packed))
    # (a persistent buffer's first rows, the result written there): each result by its key
    copies = [(out[name][: value.shape[0]], value) for name, value in results.items()]
    copies += [
        (record.num_reqs, new.num_reqs),
        (record.num_scheduled, new.num_scheduled),
        (record.is_decode, new.is_decode),
        (query_lens, REQUESTS.unpack(packed, R)["num_scheduled"]),
    ]
    torch._foreach_copy_(*zip(*copies))  # (destinations, sources): no comprehension frames per call


def padded_slots_into(state: PCPState, out: torch.Tensor, slots: torch.Tensor) -> None:
    """`device_padded_slots` of the `[F_b]` staged slots, written into `out[:P * L_b]`."""
    padded = device_padded_slots(state, slots)
    out[: padded.shape[0]].copy_(padded)


def mtp_mask_into(
    state: PCPState, out: torch.Tensor, cells: torch.Tensor, num_computed: torch.Tensor
) -> None:
    """The decodes' MTP attention masks (`num_computed` `[R_b]`) written into `out`
    `[R, 1 + k, cols]`; the other rows keep what they hold (vllm-ascend's buffer).

    Only blocked keys are touched ([`pcp_fn.spec.mtp_blocked_keys`][]: `R_b * (1 + k) * k`
    entries, not `R_b * (1 + k) * cols` bools): `cells` `[R, 1 + k, k]` records where each
    row's True entries may be (every write goes through here), so the decodes' rows are cleared
    there, then their new blocked keys set and recorded. A key that is not blocked is written
    as False into column 0 of its row, False in every mask.
    """
    _, keys = pcp_spec.mtp_blocked_keys(state, num_computed, out.shape[2])
    Rb = keys.cell.shape[0]
    decode = (torch.arange(Rb, device=out.device) < state.is_decode[:Rb].sum())[:, None, None]  # a prefix
    last = cells[:Rb]
    # the entries to clear (a decode's last ones; column 0 elsewhere), each True again iff it is
    # one of the new blocked keys: ONE write, whose repeated positions get one value (two writes
    # into the mask would make AOTInductor copy it whole, twice)
    old = torch.where(decode, last, keys.cell - keys.cell % out.shape[2])
    still = (old[..., :, None] == torch.where(keys.blocked, keys.cell, -1)[..., None, :]).any(-1)
    out.view(-1).index_put_(
        (torch.cat([old.view(-1), keys.cell.view(-1)]),), torch.cat([still.view(-1), keys.blocked.view(-1)])
    )
    last.copy_(torch.where(decode, keys.cell, last))


IN_PLACE = frozenset({"step", "slots"})
"""The graphs whose staging inputs are always the same persistent tensors (the packed batch, the
slot staging at the rung's rows): a CUDA/NPU graph reads them in place, so a replay copies nothing
(`capture(persistent_inputs=True)`). The MTP mask's graph is not one: its two variants pass different
tensors (the batch's `num_computed` or `computed_in`) to one graph, each copied into its static input."""


class Rung:
    """One bucket of the ladder: the state and batch of a step at it (views of the persistent record
    and staging buffers, whose contents are the last step's) and its calls by `(kind, variant)`
    ([`GraphCall`][pcp_fn.adapters.runtime.GraphCall]: function, buffers, staging inputs, replay).
    Made once; a step finds its rung by position, so no bucket is hashed per call."""

    __slots__ = ("batch", "bucket", "calls", "state")

    def __init__(self, bucket: Bucket, state: PCPState, batch: SchedulerBatch) -> None:
        self.bucket, self.state, self.batch = bucket, state, batch
        self.calls: dict[tuple[str, int], GraphCall] = {}


class DeviceGraphs:
    """The manager's device functions, one graph per bucket of its ladder, bound to fixed buffers.

    Per bucket `b` of `graph_buckets`: `step_into` (`init_batch_info`),
    `padded_slots_into` per KV cache group (`get_padded_slot_mapping`) and, with spec
    decode and `P * D > 1`, `mtp_mask_into` (`generate_pcp_metadata`), each a
    [`GraphCall`][pcp_fn.adapters.runtime.GraphCall] of one
    [`GraphRuntime`][pcp_fn.adapters.runtime.GraphRuntime] (`runtime`): made at construction,
    bound to its persistent staging inputs (a call replays with no signature lookup) and
    writing its results into the persistent buffers inside the graph. The step's staging
    input is `packed` ([`pcp_fn.dcs.packing.REQUESTS`][], written by `stage`).

    Args:
        config: a `make_config` config.
        device: where the graphs run.
        step_out: the persistent buffer of each `device_step` result (by its key).
        query_lens: `[R]` int32, vllm-ascend's `query_lens_pcp_full.gpu`.
        slot_group: group 0's padded slot mapping (`add_slot_group` adds the others).
        slots_in: `[>= F]` int32, the staging of the runner's slot mapping.
        computed_in: `[R]` int32, the staging of corrected `num_computed_tokens`.
        mtp_mask: `[R, 1 + k, cols]` bool, vllm-ascend's `dcp_mtp_attn_mask.gpu` (`None`
            without spec decode or with `P * D = 1`), and `mtp_cells` (`mtp_mask_into`).
        backend: `None` (plain calls), `"aoti"` (AOTInductor packages, cached in
            `package_dir` when given, `package_path`), or a `torch.compile` backend
            (device graphs on CUDA / NPU): every graph is made here, for every bucket
            (`stats`); a call without one runs eagerly, counted in `stats.fallbacks`.
        check_syncs: run every plain call (and `guard`'s blocks) under
            [`pcp_fn.no_host_syncs`][].
    """

    def __init__(
        self,
        config: PCPConfig,
        device: torch.device,
        *,
        step_out: dict[str, torch.Tensor],
        query_lens: torch.Tensor,
        slot_group: torch.Tensor,
        slots_in: torch.Tensor,
        computed_in: torch.Tensor,
        mtp_mask: torch.Tensor | None,
        mtp_cells: torch.Tensor | None,
        backend: str | None,
        check_syncs: bool = False,
        package_dir: str | None = None,
    ) -> None:
        self.config, self.device, self.backend = config, device, backend
        self.ladder = graph_buckets(config)
        self._rungs = tuple(b.num_tokens for b in self.ladder)
        self.runtime = GraphRuntime(
            backend,
            device,
            check_host_syncs=check_syncs,
            package_dir=package_dir,
            package_prefix="dcs",
            package_key=(config,),
        )
        R = config.max_num_reqs
        self._state0 = pcp_fn.init_state(config, device)
        # the CPU stages into the buffer itself; a device through a pinned buffer and one copy
        self._staging = Staging(REQUESTS.size(R), device)
        self.packed = self._staging.device_buffer
        # the CPU's host buffer is the device buffer, the same every step: one packer for it
        self._packer = REQUESTS.packer(self._staging.host(), R) if self._staging.persistent else None
        self._staged_reqs = 0  # requests staged last (the CPU's buffer is zero past them)
        self.record = Record(
            num_reqs=torch.zeros((), dtype=torch.int64, device=device),
            num_scheduled=torch.zeros(R, dtype=torch.int32, device=device),
            is_decode=torch.zeros(R, dtype=torch.bool, device=device),
        )
        self._step_out, self._query_lens = step_out, query_lens
        self._slot_groups = [slot_group]
        self._slots_in, self._computed_in = slots_in, computed_in
        self._mtp_mask, self._mtp_cells = mtp_mask, mtp_cells
        self.rungs = tuple(Rung(b, *self._views(b)) for b in self.ladder)
        self._rung_of = {r.bucket: r for r in self.rungs}
        self.current = self.rungs[-1]  # the rung of the last step
        self.prepare()

    # ---------------------------------------------------------------- buckets and views
    def bucket_for(self, num_reqs: int, num_tokens: int) -> Bucket:
        """The first rung holding `num_reqs` requests and `num_tokens` local tokens (within
        the capacities: checked by the caller)."""
        return self.rung_for(num_reqs, num_tokens).bucket

    def rung_for(self, num_reqs: int, num_tokens: int) -> Rung:
        """`bucket_for`'s `Rung`."""
        return self.rungs[bisect.bisect_left(self._rungs, max(num_reqs, num_tokens, 1))]

    def view(self, bucket: Bucket) -> tuple[PCPState, SchedulerBatch]:
        """The state and batch of the last step at `bucket` (a rung's)."""
        rung = self._rung_of[bucket]
        return rung.state, rung.batch

    def _views(self, bucket: Bucket) -> tuple[PCPState, SchedulerBatch]:
        rec = self.record
        state = dataclasses.replace(
            self._state0,
            bucket=bucket,
            num_reqs=rec.num_reqs,
            num_scheduled=rec.num_scheduled,
            is_decode=rec.is_decode,
        )
        return state, unpack_batch(self.config, bucket, self.packed)

    # ---------------------------------------------------------------- the runtime's
    @property
    def stats(self) -> GraphStats:
        """The graphs' [`GraphStats`][pcp_fn.adapters.backend.GraphStats] (the runtime's, one object)."""
        return self.runtime.stats

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        """[`pcp_fn.no_host_syncs`][] with `check_syncs`, else nothing (the runtime's)."""
        return self.runtime.guard()

    @property
    def num_graphs(self) -> int:
        """Graphs made so far (`0` with plain calls)."""
        return self.runtime.num_graphs

    def package_path(self, kind: str, bucket: Bucket) -> str:
        """The AOTInductor package of a graph in the package directory, named by all it depends
        on (the config, the graph, the device type, torch and pcp_fn's sources)."""
        return self.runtime.package_path(self._graph_key(kind, bucket, 0))

    # ---------------------------------------------------------------- the graphs
    def _graph_key(self, kind: str, bucket: Bucket, variant: int) -> tuple[Any, ...]:
        # a device graph closes over a slot group's buffer: one graph per group; AOTInductor
        # takes it as an argument: one package for every group. The mask's variants differ
        # in their staged input only: one graph.
        if kind == "slots" and self.backend != "aoti":
            return (kind, bucket, variant)
        return (kind, bucket)

    def _add(self, rung: Rung, kind: str, variant: int) -> GraphCall:
        """The call of `(kind, variant)` at `rung`, declared to the runtime on first use."""
        call = rung.calls.get((kind, variant))
        if call is not None:
            return call
        bucket, state, batch = rung.bucket, rung.state, rung.batch
        if kind == "step":
            fn: Callable[..., None] = functools.partial(step_into, bucket)
            fixed: tuple[Any, ...] = (self._state0, self._step_out, self.record, self._query_lens)
            staged: tuple[torch.Tensor, ...] = (self.packed,)
        elif kind == "slots":
            fn, fixed = padded_slots_into, (state, self._slot_groups[variant])
            staged = (self._slots_in[: full_rows(self.config, bucket)],)
        else:
            fn, fixed = mtp_mask_into, (state, self._mtp_mask, self._mtp_cells)
            staged = (batch.num_computed if variant == 0 else self._computed_in[: bucket.num_reqs],)
        call = rung.calls[kind, variant] = self.runtime.add(
            (kind, bucket, variant),
            fn,
            fixed=fixed,
            staged=staged,
            graph_key=self._graph_key(kind, bucket, variant),
            in_place=kind in IN_PLACE,
            step=kind == "step",
        )
        return call

    def prepare(self, groups: Sequence[int] = (0,)) -> GraphStats:
        """Declare the calls of every bucket (the step's, slot groups `groups`', the MTP mask's)
        and make their graphs now (start-up), so that no step makes one; making is a no-op with
        plain calls. Each graph is made and run once on what is staged (at construction, an
        empty batch), writing its results into the persistent buffers: call it before serving,
        not inside a step."""
        calls = []
        for rung in self.rungs:
            calls.append(self._add(rung, "step", 0))
            calls += [self._add(rung, "slots", g) for g in groups]
            if self._mtp_mask is not None:
                calls += [self._add(rung, "mask", 0), self._add(rung, "mask", 1)]
        return self.runtime.prepare(calls)

    def add_slot_group(self, buffer: torch.Tensor) -> None:
        """One more KV cache group's padded slot mapping buffer, its graphs bound now."""
        self._slot_groups.append(buffer)
        self.prepare(groups=(len(self._slot_groups) - 1,))

    # ---------------------------------------------------------------- a step
    def stage(self, h: HostLayout) -> np.ndarray:
        """Write the step's per-request arrays into the staging buffer (one copy off the CPU);
        returns its `[R]` scheduled tokens (zero past the requests), on the host."""
        R, n, staging = self.config.max_num_reqs, h.num_reqs, self._staging
        rows: Sequence[np.ndarray] = h.counts
        if h.device_prompt is not h.num_prompt:  # a late decode made a prefill (dummy runs)
            rows = (rows[0], rows[1], h.device_prompt)
        packer = self._packer
        if packer is None:  # off the CPU: pinned, rotated (pcp_fn.core.staging), every word ours
            packer = REQUESTS.packer(staging.host(), R)
            packer.pack(n, rows, (n,))
            with self.runtime.guard():
                staging.commit(packer.buffer)
        else:  # the CPU's buffer persists: its rows are zero past the last step's requests
            packer.pack(n, rows, (n,), self._staged_reqs)
        self._staged_reqs = n
        return packer.table[0]

    def step(self, rung: Rung) -> None:
        """`step_into` of the staged batch at `rung` (the current one from now on)."""
        self.current = rung
        self.runtime.run(rung.calls["step", 0])

    def padded_slots(self, group: int) -> None:
        """`padded_slots_into` of the staged slots into group `group`'s buffer, at the last
        step's rung."""
        self.runtime.run(self.current.calls["slots", group])

    def mtp_mask(self, corrected: bool) -> None:
        """`mtp_mask_into` at the last step's rung from the batch's `num_computed` or
        (`corrected`) the `computed_in` staging buffer."""
        self.runtime.run(self.current.calls["mask", int(corrected)])


# ------------------------------------------------------------------ spec decode (eager)
SlotFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def full_inputs(state: PCPState, token_ids: torch.Tensor, num_computed: torch.Tensor, slot_fn: SlotFn | None):
    """Scheduler-order ids, positions and query starts (and the MTP slots) of the step;
    `num_computed` is `[R_b]`, the outputs `[F_b]` / `[R_b + 1]` / `[M_b * P]`."""
    _, full = pcp_spec.full_input_ids(state, token_ids, num_computed, slot_fn=slot_fn)
    return full


def repair_full_ids(
    state: PCPState,
    ids: torch.Tensor,
    prev_sampled: torch.Tensor,
    draft: torch.Tensor | None,
    prev_positions: torch.Tensor,
) -> torch.Tensor:
    """`[F_b]` ids with the previous step's sampled and draft tokens (`prev_positions` `[R_b]`)."""
    _, out = pcp_spec.repair_full_input_ids(state, ids, prev_sampled, draft, prev_positions)
    return out


def rebuild_positions(state: PCPState, num_computed: torch.Tensor, slot_fn: SlotFn | None):
    """Local, scheduler-order and MTP positions from the corrected `[R_b]` counts."""
    _, out = pcp_spec.rebuild_spec_positions(state, num_computed, slot_fn=slot_fn)
    return out


def first_pass_selection(
    state: PCPState, ids_full: torch.Tensor, tis: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(input_ids [L_b], restored rows [L_b], token_indices_to_sample [R_b])` of the first draft pass.

    `ids_full` is `[F_b]`, `tis` `[R_b]`; `logits` are the runner's
    logits indices, all real (at most `S_b = R_b * (1 + k)`: padded here).
    The rows are [`pcp_fn.first_pass_inputs`][] applied to the row numbers
    of the restored buffer, so the caller gathers its own hidden states once.
    """
    cfg, bucket = state.config, state.bucket
    P, Lb = cfg.pcp_size, bucket.num_tokens
    device = tis.device
    rows = torch.arange(P * Lb, dtype=torch.int64, device=device)[:, None]
    positions = torch.zeros(Lb, dtype=torch.int64, device=device)
    num_logits = int(logits.shape[0])
    logits = _pad_rows(logits, pcp_spec.sampled_rows(cfg, bucket), "logits_indices")
    _, out = pcp_spec.first_pass_inputs(state, ids_full, positions, rows, tis, logits, num_logits)
    return out.input_ids, out.hidden_states[:, 0], out.token_indices_to_sample


def split_prefill(state: PCPState, ids_full: torch.Tensor, restored: torch.Tensor):
    """This rank's share of the prefills for the drafter
    ([`pcp_fn.spec.split_prefill_for_draft`][pcp_fn.split_prefill_for_draft]).

    `ids_full`: `[F_b]` the batch's ids in scheduler order; `restored`: the
    restored hidden states, any number of rows up to the real ones (the rows past
    `P * L_b` are never read; fewer are padded with zeros).
    """
    rows = state.config.pcp_size * state.bucket.num_tokens
    _, out = pcp_spec.split_prefill_for_draft(
        state, ids_full, _pad_rows(restored[:rows], rows, "hidden_states")
    )
    return out


def mtp_rows(cfg: PCPConfig, bucket: Bucket) -> int:
    """`M_b`: rows of the MTP slot layout of a bucket (the slot mapping has `M_b * P`)."""
    return pcp_spec.mtp_rows(cfg, bucket)


def mtp_slot_indices(
    state: PCPState, tis: torch.Tensor, slot_mapping: torch.Tensor, num_reqs: int, k: int
) -> torch.Tensor:
    """`[R_b * P]` slot indices; `tis` `[R_b]`, `slot_mapping` `[M_b * P]`."""
    _, out = pcp_spec.mtp_slot_inputs(state, tis, slot_mapping, num_reqs=num_reqs, num_speculative_tokens=k)
    return out.slot_indices


def mask_restore(capacity_state: PCPState, index: torch.Tensor) -> torch.Tensor:
    """`index` with the rows a graph-padded draft batch never reads zeroed (any length up to `G`).

    The mask depends on the row number only, so it runs at the capacity state's
    `[P * L]` rows and the result is cut back to `index`'s length.
    """
    rows = capacity_state.config.pcp_size * capacity_state.bucket.num_tokens
    _, out = pcp_spec.mask_restore_index_for_graph(capacity_state, _pad_rows(index, rows, "restore index"))
    return out[: index.shape[0]]


def drafting_lens(capacity_state: PCPState, seq_lens: torch.Tensor, draft_index: int):
    """Per-rank KV lengths at a draft step, for `seq_lens` of any length up to `R`.

    Elementwise per request, so it runs at the capacity state's `[R]` rows
    (on `seq_lens`' device) and the results are cut back to its length.
    """
    n = seq_lens.shape[0]
    padded = _pad_rows(seq_lens, capacity_state.bucket.num_reqs, "seq_lens")
    _, out = pcp_spec.drafting_cp_seq_lens(capacity_state, padded, draft_index)
    return dataclasses.replace(
        out,
        cp_seq_len=out.cp_seq_len[:n],
        num_computed_tokens_of_pcp_dcp=out.num_computed_tokens_of_pcp_dcp[:n],
    )


# ------------------------------------------------------------------ multimodal
def remap_mrope(
    tables: list[torch.Tensor | None],
    deltas: list[int | None],
    num_prompt: np.ndarray,
    positions: np.ndarray,
    counts: np.ndarray,
) -> torch.Tensor:
    """`[3, len(positions)]` M-RoPE positions of the rank's tokens, on the CPU (the runner's buffer)."""
    n = len(tables)
    width = max([t.shape[1] for t in tables if t is not None] + [1])
    packed = pcp_mm.pack_mrope_tables(tables, deltas, num_rows=max(n, 1), max_len=width)
    prompt = np.zeros(max(n, 1), dtype=np.int64)
    prompt[:n] = num_prompt
    x = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
    owner = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), counts))
    return pcp_mm.remap_mrope_positions(
        packed, torch.from_numpy(prompt), x, owner, torch.full((), x.shape[0], dtype=torch.int64)
    )


def gather_prompt_embeds(req_embeds: torch.Tensor, positions: np.ndarray, out: torch.Tensor) -> torch.Tensor:
    """One request's prompt embeds at its local positions; rows past the embeds keep `out`."""
    zero = torch.zeros(1, dtype=torch.int64)
    embeds = pcp_mm.PromptEmbeds(
        values=req_embeds, start=zero, length=torch.full((1,), req_embeds.shape[0], dtype=torch.int64)
    )
    x = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
    owner = torch.zeros_like(x)
    return pcp_mm.gather_prompt_embeds(embeds, x, owner, torch.full((), x.shape[0], dtype=torch.int64), out)


local_schedule_layout = pcp_mm.local_schedule_layout
build_local_mm_schedule = pcp_mm.build_local_mm_schedule
gather_mm_embeddings = pcp_mm.gather_mm_embeddings
localize_scheduler_output = pcp_mm.localize_scheduler_output
