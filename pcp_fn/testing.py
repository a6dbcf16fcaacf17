"""``check_layout``: the conformance suite a researcher runs on their own :class:`pcp_fn.Layout`.

    from pcp_fn.testing import check_layout
    check_layout(MyLayout())          # raises LayoutCheckError naming the batch and the broken rule

It runs the facade ops (``step``, ``update_tokens``, ``restore_hidden_states``,
``padded_slot_mapping``, ``get_logits_indices``) under the layout on hypothesis
batches at ``P = 1..8`` (decodes first, then fresh, chunked and empty prefills)
plus the capacity edges (``R`` one-token prefills, one ``T``-token prefill, ``R``
decodes, the empty batch), and checks the protocol's invariants
(:class:`pcp_fn.Layout`) against an independent per-token count:

- ownership: every scheduled token is on exactly the ranks the layout says
  (a request the layout's geometry marks ``replicated`` on every rank, typically
  the decodes when ``P > 1``; any other token on exactly one), rows
  grouped by request, ``query_start_loc`` counting them, padding at the tail;
- positions ``num_computed + offset`` on real rows, 0 on padding;
- restore: ``restore_hidden_states`` of the rank-major all-gather puts every token
  once, in request order, at the rows ``restored_spans`` names, each read from the rank
  that holds it (rank 0's copy of a replicated token: all-gathered rows tagged by rank);
- slots: every scheduled slot exactly once in ``padded_slot_mapping``, the other
  rows ``pad_slot_id``; logits rows land on each request's last token;
- attention runs: :func:`pcp_fn.attention_runs` (read from the layout's ``state_local_rows``)
  cuts the rows ``step`` returns into maximal runs of consecutive tokens of one request,
  real or pad, each run attending its last position + 1 keys (a pad run: the request's);
- fixed shapes: every output's shapes are those of an empty batch of the same bucket;
- ``all_ranks`` (``vmap`` over the rank) equals each rank's own static-rank step;
- spec decode (configs with speculative tokens, decodes drafting ``n - 1``): the rows
  ``spec_decode_indices`` samples hold each request's last ``drafts + 1`` tokens and its
  draft ids are the decodes' drafts; ``decode_hidden_states`` gives the decode tokens in
  order; the drafter's first pass (``first_pass_rows``) holds every prefill token on
  exactly one rank and the decodes on every rank, and ``first_pass_inputs`` /
  ``split_prefill_for_draft`` give each of its rows its own token's id and restored
  hidden state (pads 0) and sample each request's last token. The runner then samples
  through ``spec_decode_indices``, so ``get_logits_indices``' rows are checked without
  spec tokens only (the hybrid layout keeps vllm-ascend's token-major decode rows there).

Then, for ``graph_pcp_sizes``: ``no_host_syncs``, ``torch.compile(fullgraph=True)``
with one graph per bucket (two batches of a bucket: one graph; a third bucket: one
more), compiled equal to eager (``attention_runs`` after it too), and ``torch.export``
with static shapes; with spec
tokens, the post-forward spec-decode prep (``spec_decode_indices``,
``decode_hidden_states``, ``split_prefill_for_draft``, ``first_pass_inputs``) under
``no_host_syncs`` and ``fullgraph=True``, compiled equal to eager.
Needs ``hypothesis`` (the ``test`` extra).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .attention_runs import attention_runs
from .core.buckets import Bucket
from .core.rank import all_ranks
from .graph.export import export
from .graph.sync import no_host_syncs
from .logits import get_logits_indices
from .protocol.batch import SchedulerBatch, classify_decodes, make_batch, token_rows
from .protocol.config import PCPConfig
from .protocol.layout import Layout
from .protocol.registry import LayoutError, register_layout
from .protocol.state import PCPState, init_state
from .restore import restore_hidden_states
from .slots import padded_slot_mapping
from .spec import (
    SpecDecodeIndices,
    decode_hidden_states,
    first_pass_inputs,
    spec_decode_indices,
    split_prefill_for_draft,
)
from .step import StepOutputs, step

SLOT_BASE = 1000  # slot of scheduler-order token t: SLOT_BASE + t (distinct, never pad_slot_id)


class LayoutCheckError(AssertionError):
    """A layout broke an invariant: the message names the rule, the config and the batch."""


@dataclasses.dataclass(frozen=True)
class Batch:
    """A scheduler batch in the runner's order (decodes first)."""

    sched: tuple[int, ...]
    comp: tuple[int, ...]
    prompt: tuple[int, ...]


def _fail(rule: str, cfg: PCPConfig, b: Batch, detail: str) -> None:
    raise LayoutCheckError(
        f"layout {cfg.layout_name!r} breaks {rule} at P={cfg.pcp_size} (R={cfg.max_num_reqs}, "
        f"T={cfg.max_num_tokens}), num_scheduled={list(b.sched)} num_computed={list(b.comp)} "
        f"num_prompt={list(b.prompt)}: {detail}"
    )


@st.composite
def batches(draw: Any, max_reqs: int, max_tokens: int, num_spec_tokens: int = 0) -> Batch:
    """Decodes (context, ``1..1 + num_spec_tokens`` tokens), then fresh / chunked / empty prefills;
    sometimes exactly ``max_reqs`` requests or exactly ``max_tokens`` tokens."""
    n_reqs = max_reqs if draw(st.booleans()) else draw(st.integers(0, max_reqs))
    n_dec = draw(st.integers(0, n_reqs))
    budget = max_tokens
    sched, comp, prompt = [], [], []
    for i in range(n_reqs):
        if i < n_dec:
            n = min(draw(st.integers(1, 1 + num_spec_tokens)), budget)
            if n == 0:
                break
            p = draw(st.integers(1, 20))
            sched.append(n)
            comp.append(p + draw(st.integers(0, 10)))
            prompt.append(p)
        else:
            n = draw(st.integers(0, budget))
            k = draw(st.sampled_from([0, 0, draw(st.integers(1, 50))]))  # fresh or a chunk
            sched.append(n)
            comp.append(k)
            prompt.append(k + n + draw(st.integers(0, 5)) if n else k + 1 + num_spec_tokens + 1)
        budget -= sched[-1]
    if sched and sched[-1] < budget and draw(st.booleans()) and len(sched) > n_dec:
        sched[-1] += budget  # exactly max_tokens
        prompt[-1] = max(prompt[-1], comp[-1] + sched[-1])
    return Batch(tuple(sched), tuple(comp), tuple(prompt))


def edge_batches(R: int, T: int) -> list[Batch]:
    """The capacity edges: ``min(R, T)`` one-token prefills (the most local rows), one ``T``-token
    prefill, ``R`` decodes, decodes then a prefill filling ``T``, and the empty batch."""
    k = min(R, T)
    out = [Batch((1,) * k, (0,) * k, (1,) * k), Batch((T,), (0,), (T,)), Batch((), (), ())]
    d = min(R, T)
    out.append(Batch((1,) * d, (9,) * d, (5,) * d))
    if R > 1 and T > R:
        rest = T - (R - 1)
        out.append(Batch((1,) * (R - 1) + (rest,), (9,) * (R - 1) + (3,), (5,) * (R - 1) + (3 + rest,)))
    return out


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _shapes(tree: Any) -> list[Any]:
    leaves, spec = pytree.tree_flatten(tree)
    return [str(spec), *[tuple(x.shape) if isinstance(x, torch.Tensor) else x for x in leaves]]


def check_batch_exact(cfg: PCPConfig, b: Batch) -> None:
    """Every exactness invariant of the layout on one batch (eager); raises :class:`LayoutCheckError`."""
    try:
        _check_batch_exact(cfg, b)
    except LayoutCheckError:
        raise
    except LayoutError as e:  # make_batch's or init_state's own check of the layout found it first
        if str(e).startswith(f"layout {cfg.layout_name!r} breaks "):  # init_state's: says it all
            raise LayoutCheckError(str(e)) from e
        _fail(e.rule or "the ops", cfg, b, str(e))
    except Exception as e:  # the layout raised: that is a failure of the layout, with the batch named
        _fail("the ops", cfg, b, f"{type(e).__name__}: {e}")


def _check_batch_exact(cfg: PCPConfig, b: Batch) -> None:
    """The exactness rules on one batch, in the module docstring's order."""
    total = sum(b.sched)
    batch = make_batch(cfg, b.sched, b.comp, b.prompt, slot_mapping=[SLOT_BASE + t for t in range(total)])
    bound = cfg.layout_impl.num_local_tokens(
        cfg, np.asarray(b.sched, np.int64), _num_decodes(cfg, b), np.asarray(b.comp, np.int64)
    )
    steps = _rank_steps(cfg, b, batch)
    codes, held = _check_rows(cfg, b, steps, bound)
    # the layout says which requests are whole on every rank (the decodes, for most layouts)
    whole = _np(cfg.layout_impl.state_geometry(steps.states[0]).replicated)[: len(b.sched)].astype(bool)
    source = _source_ranks(cfg, b, held, whole)
    restored = _check_restore(cfg, b, steps, codes, source)
    _check_logits(cfg, b, steps, restored)
    for r, (st_r, out) in enumerate(zip(steps.states, steps.outs)):
        _check_slots(cfg, b, steps, r)
        _check_attention_runs(cfg, b, r, st_r, out)
    if cfg.num_spec_tokens > 0:
        # rank 0's own step: all_ranks gives the same (the vmap rule)
        is_decode = _np(steps.outs[0].layout.is_decode)[: len(b.sched)].astype(bool)
        _check_spec(cfg, b, steps.states, codes, is_decode, whole)


class _RankSteps(NamedTuple):
    """A batch under check and every rank's own (static-rank) ``step`` of it."""

    batch: SchedulerBatch
    states: list[PCPState]  # [P] each rank's state after the step
    outs: list[StepOutputs]  # [P] each rank's outputs


def _token_starts(b: Batch) -> np.ndarray:
    """``[R + 1]`` int64: the first scheduler-order token of each request, then the total."""
    return np.concatenate([[0], np.cumsum(b.sched)]).astype(np.int64)


def _rank_steps(cfg: PCPConfig, b: Batch, batch: SchedulerBatch) -> _RankSteps:
    """Each rank's own step of ``batch``, checked equal to ``all_ranks`` (vmap over the rank) and
    of the shapes an empty batch forced to the same bucket gives (fixed shapes)."""
    _, outs = all_ranks(step, init_state(cfg, rank=0), batch)
    states, rank_outs = [], []
    for r in range(cfg.pcp_size):
        cfg_r = dataclasses.replace(cfg, pcp_rank=r)
        st_r, out_r = step(init_state(cfg_r), batch)
        states.append(st_r)
        rank_outs.append(out_r)
        for a, c in zip(_tensors(out_r), _tensors(outs)):
            if not torch.equal(a, c[r]):
                _fail("vmap over ranks", cfg, b, f"all_ranks differs from rank {r}'s own step")
    empty = make_batch(cfg, [], [], [], slot_mapping=[], bucket=batch.bucket)
    if _shapes(step(init_state(cfg), empty)) != _shapes((states[0], rank_outs[0])):
        _fail("fixed shapes", cfg, b, f"shapes depend on the batch, not only on the bucket {batch.bucket}")
    return _RankSteps(batch, states, rank_outs)


def _check_rows(
    cfg: PCPConfig, b: Batch, steps: _RankSteps, bound: int
) -> tuple[np.ndarray, dict[tuple[int, int], list[int]]]:
    """Capacity, ownership and positions of each rank's rows: at most ``bound``
    (``num_local_tokens``) and ``L_b`` rows, grouped by request, counted by ``query_start_loc``
    and ``pcp_tokens``, padding ``(0, 0)`` at the tail, positions ``num_computed + offset``.

    Returns ``codes [P, L_b]`` (each real row's scheduler-order token, -1 elsewhere) and the
    ranks holding each ``(request, offset)``.
    """
    P, R = cfg.pcp_size, len(b.sched)
    Rb, Lb = steps.batch.bucket.num_reqs, steps.batch.bucket.num_tokens
    starts = _token_starts(b)
    held: dict[tuple[int, int], list[int]] = {}
    codes = np.full((P, Lb), -1, np.int64)
    for r, out in enumerate(steps.outs):
        n_r = int(out.layout.num_tokens)
        req, pos = _np(out.layout.request_index), _np(out.layout.positions)
        qsl = _np(out.query_start_loc).astype(np.int64)
        if n_r > bound or n_r > Lb:
            _fail("capacity", cfg, b, f"rank {r} holds {n_r} rows; num_local_tokens said {bound}, L_b={Lb}")
        if (req[n_r:] != 0).any() or (pos[n_r:] != 0).any():
            _fail("ownership", cfg, b, f"rank {r}'s padding rows past {n_r} are not (0, 0)")
        if (np.diff(req[:n_r]) < 0).any():
            _fail("ownership", cfg, b, f"rank {r}'s rows are not grouped by request: {req[:n_r].tolist()}")
        if n_r and req[:n_r].max() >= max(R, 1):
            _fail("ownership", cfg, b, f"rank {r} holds rows of request {req[:n_r].max()} >= num_reqs")
        counts = np.bincount(req[:n_r], minlength=Rb)[:Rb]
        if not np.array_equal(qsl, np.concatenate([[0], np.cumsum(counts)])):
            _fail("ownership", cfg, b, f"rank {r}'s query_start_loc {qsl.tolist()} != its rows per request")
        if not np.array_equal(_np(out.layout.pcp_tokens)[:Rb], counts):
            _fail("ownership", cfg, b, f"rank {r}'s pcp_tokens do not count its rows")
        sched_of = np.asarray(b.sched + (0,), np.int64)[np.minimum(req[:n_r], R)]
        comp_of = np.asarray(b.comp + (0,), np.int64)[np.minimum(req[:n_r], R)]
        real = pos[:n_r] < sched_of
        want = np.where(real, comp_of + pos[:n_r], _np(out.positions)[:n_r])
        if not np.array_equal(_np(out.positions)[:n_r], want) or (_np(out.positions)[n_r:] != 0).any():
            _fail("positions", cfg, b, f"rank {r}'s positions are not num_computed + offset")
        _add_holder(held, r, req[:n_r][real], pos[:n_r][real])
        codes[r, :n_r] = np.where(real, starts[np.minimum(req[:n_r], max(R - 1, 0))] + pos[:n_r], -1)
    return codes, held


def _add_holder(
    held: dict[tuple[int, int], list[int]], r: int, request: np.ndarray, offset: np.ndarray
) -> None:
    """Rank ``r`` holds token ``offset[l]`` of request ``request[l]``, for every ``l``."""
    for i, o in zip(request.tolist(), offset.tolist()):
        held.setdefault((i, o), []).append(r)


def _rightly_held(ranks: list[int], replicated: bool, P: int) -> bool:
    """A token of a replicated request is on every rank, any other token on exactly one."""
    return sorted(ranks) == list(range(P)) if replicated else len(ranks) == 1


def _source_ranks(
    cfg: PCPConfig, b: Batch, held: dict[tuple[int, int], list[int]], whole: np.ndarray
) -> np.ndarray:
    """``[total]`` the rank each token's restored row must be read from: rank 0's copy of a
    replicated (``whole``) request's token, the owner's of any other. Checks every scheduled token
    is on the ranks it should be, and ``held`` (emptied) names no other token."""
    starts = _token_starts(b)
    source = np.zeros(sum(b.sched), np.int64)
    for i, n in enumerate(b.sched):
        for j in range(n):
            ranks = held.pop((i, j), [])
            if not _rightly_held(ranks, whole[i], cfg.pcp_size):
                _fail("ownership", cfg, b, f"token {j} of request {i} is on ranks {ranks}")
            source[starts[i] + j] = 0 if whole[i] else ranks[0]
    if held:
        _fail("ownership", cfg, b, f"rows of tokens that are not scheduled: {sorted(held)[:5]}")
    return source


def _check_restore(
    cfg: PCPConfig, b: Batch, steps: _RankSteps, codes: np.ndarray, source: np.ndarray
) -> np.ndarray:
    """``restore_hidden_states`` of the rank-major all-gather of ``codes`` (each rank's token codes)
    puts every token once, in request order, at the rows ``restored_spans`` names, each read from
    its ``source`` rank (the all-gather of each row's rank says). Returns the restored codes ``[G_b]``."""
    P, R, Lb = cfg.pcp_size, len(b.sched), steps.batch.bucket.num_tokens
    G = P * Lb
    starts = _token_starts(b)
    st0 = steps.states[0]
    _, restored = restore_hidden_states(st0, torch.from_numpy(codes.reshape(G)))
    restored = _np(restored)
    _, read_from = restore_hidden_states(st0, torch.arange(P).repeat_interleave(Lb))
    read_from = _np(read_from)
    spans = cfg.layout_impl.restored_spans(st0)
    start, length = _np(spans.start)[:R].astype(np.int64), _np(spans.length)[:R]
    taken = np.zeros(G, bool)
    for i, n in enumerate(b.sched):
        if n == 0:
            continue
        if length[i] < n or start[i] < 0 or start[i] + n > G:
            _fail("restore", cfg, b, f"request {i}'s restored span ({start[i]}, {length[i]}) cannot hold {n}")
        rows = np.arange(start[i], start[i] + n)
        if taken[rows].any():
            _fail("restore", cfg, b, f"request {i}'s restored rows overlap another request's")
        taken[rows] = True
        if not np.array_equal(restored[rows], starts[i] + np.arange(n)):
            _fail("restore", cfg, b, f"request {i}'s restored rows hold {restored[rows].tolist()}")
        want = source[starts[i] : starts[i] + n]
        if not np.array_equal(read_from[rows], want):
            _fail(
                "restore",
                cfg,
                b,
                f"request {i}'s restored rows are read from ranks {read_from[rows].tolist()}, not "
                f"{want.tolist()} (rank 0's copy of a replicated token, the owner's of any other)",
            )
    if (
        not np.array_equal(np.flatnonzero(taken), np.sort(np.flatnonzero(taken)))
        or (np.diff(start[[i for i, n in enumerate(b.sched) if n]]) < 0).any()
    ):
        _fail("restore", cfg, b, "requests are not restored in request order")
    return restored


def _check_logits(cfg: PCPConfig, b: Batch, steps: _RankSteps, restored: np.ndarray) -> None:
    """``get_logits_indices`` equals step's ``logits_indices``, whose row of each request holds (a
    copy of) its last token in the ``restored`` codes; rows past ``num_reqs`` are 0."""
    R, G = len(b.sched), cfg.pcp_size * steps.batch.bucket.num_tokens
    starts = _token_starts(b)
    logits = _np(steps.outs[0].logits_indices)
    _, via_op = get_logits_indices(steps.states[0])
    if not np.array_equal(_np(via_op), logits):
        _fail("logits", cfg, b, "get_logits_indices differs from step's logits_indices")
    # with spec tokens configured the runner samples through spec_decode_indices (checked by
    # _check_spec); the hybrid layout's get_logits_indices then keeps vllm-ascend's token-major
    # decode rows although its decodes are rank-major (docs/layouts.md)
    for i, n in enumerate(b.sched if cfg.num_spec_tokens == 0 else ()):
        # the row holds (a copy of) the last token: hybrid samples a decode from rank P-1's copy
        if n and (not 0 <= logits[i] < G or restored[logits[i]] != starts[i] + n - 1):
            _fail("logits", cfg, b, f"request {i}'s logits row {logits[i]} is not its last token's")
    if (logits[R:] != 0).any():
        _fail("logits", cfg, b, "logits rows past num_reqs are not 0")


def _check_slots(cfg: PCPConfig, b: Batch, steps: _RankSteps, r: int) -> None:
    """Rank ``r``'s ``[P * L_b]`` slot mapping holds every scheduled slot exactly once,
    ``pad_slot_id`` elsewhere, and ``padded_slot_mapping`` gives the same."""
    G = cfg.pcp_size * steps.batch.bucket.num_tokens
    sm = _np(steps.outs[r].slot_mapping)
    if sm.shape != (G,):
        _fail("slots", cfg, b, f"slot_mapping has shape {sm.shape}, not [P*L_b] = ({G},)")
    real = sm[sm != cfg.pad_slot_id]
    if not np.array_equal(np.sort(real), SLOT_BASE + np.arange(sum(b.sched))):
        _fail("slots", cfg, b, f"rank {r}'s slot mapping does not hold every slot exactly once")
    _, again = padded_slot_mapping(steps.states[r], steps.batch.slot_mapping)
    if not np.array_equal(_np(again), sm):
        _fail("slots", cfg, b, "padded_slot_mapping differs from step's slot_mapping")


def _expected_runs(b: Batch, req: np.ndarray, offset: np.ndarray) -> list[list[int]]:
    """``[first_row, rows, request, is_pad, keys]`` of each run of a rank's real rows, one row at a time
    (the ownership rule has checked every ``req`` is a request of ``b``)."""
    runs: list[list[int]] = []
    for row, (i, o) in enumerate(zip(req.tolist(), offset.tolist())):
        pad = int(o >= b.sched[i])
        last = runs[-1] if runs else None
        if last is not None and last[2] == i and last[3] == pad and o == last[5] + 1:
            last[1], last[5] = last[1] + 1, o
        else:
            runs.append([row, 1, i, pad, 0, o])
    for run in runs:  # a real run sees up to its last token (bottom-right causal); a pad run, the request
        i = run[2]
        run[4] = b.comp[i] + (b.sched[i] if run[3] else run[5] + 1)
    return [run[:5] for run in runs]


def _check_attention_runs(cfg: PCPConfig, b: Batch, r: int, st_r: PCPState, out: Any) -> None:
    _, runs = attention_runs(st_r)
    n_r = int(out.layout.num_tokens)
    want = _expected_runs(b, _np(out.layout.request_index)[:n_r], _np(out.layout.positions)[:n_r])
    m = len(want)  # <= n_r <= L_b
    qsl, keys = _np(runs.query_start_loc).astype(np.int64), _np(runs.seq_lens).astype(np.int64)
    request, pad = _np(runs.request), _np(runs.is_padding)
    got = [
        [int(qsl[j]), int(qsl[j + 1] - qsl[j]), int(request[j]), int(pad[j]), int(keys[j])] for j in range(m)
    ]
    if int(runs.num_runs) != m or got != want:
        _fail(
            "attention runs",
            cfg,
            b,
            f"rank {r}'s runs [first, rows, request, pad, keys] {got} != {want} (from step's rows)",
        )
    if (qsl[m:] != n_r).any() or (keys[m:] != 0).any() or (request[m:] != 0).any():
        _fail("attention runs", cfg, b, f"rank {r}'s runs past num_runs={m} are not empty")


def _check_spec(
    cfg: PCPConfig, b: Batch, states: list, codes: np.ndarray, is_decode: np.ndarray, whole: np.ndarray
) -> None:
    """The spec-decode prep (:mod:`pcp_fn.spec`) under the layout, against per-token codes.

    Token ``t`` (scheduler order) has id and hidden state ``t + 1`` (0: none), so every row
    the ops return says which token it carries. A decode drafts ``n - 1`` tokens.
    """
    case = _spec_case(cfg, b, states[0], codes, is_decode)
    seen: dict[tuple[int, int], list[int]] = {}
    for r, state in enumerate(states):
        idx = _check_spec_indices(case, r, state)
        _check_decode_hidden_states(case, r, state)
        rows = _first_pass_rows(case, state)
        _add_holder(seen, r, rows.request[rows.real], rows.offset[rows.real])
        _check_first_pass(case, r, state, idx, rows)
        _check_split_prefill(case, r, state, rows)
    for i, n in enumerate(b.sched):
        for j in range(n):
            ranks = seen.pop((i, j), [])
            if not _rightly_held(ranks, whole[i], cfg.pcp_size):
                _fail(
                    "spec-decode", cfg, b, f"the first pass holds token {j} of request {i} on ranks {ranks}"
                )


class _SpecCase(NamedTuple):
    """One batch under the spec-decode rules: token ``t`` (scheduler order) has id and hidden
    state ``t + 1`` (0: none)."""

    cfg: PCPConfig
    b: Batch
    bucket: Bucket  # rank 0's state's
    starts: np.ndarray  # [R + 1] int64 first token of each request, then the total
    code: torch.Tensor  # [P, L_b] each rank's local ids (0 on pads)
    hidden: torch.Tensor  # [G_b] the restored hidden states
    restored: np.ndarray  # [G_b] the same, on the host
    full: torch.Tensor  # [F_b] int64 the ids in scheduler order (0 past the tokens)
    sched: np.ndarray  # [R_b] int64 scheduled tokens (0 past num_reqs)
    decode: np.ndarray  # [R_b] bool decode requests
    drafts: torch.Tensor  # [R_b] int32 draft tokens: n - 1 of a decode, else 0


def _spec_case(
    cfg: PCPConfig, b: Batch, st0: PCPState, codes: np.ndarray, is_decode: np.ndarray
) -> _SpecCase:
    """The spec ops' inputs for ``b``: the ids and hidden states of its tokens (``codes``: each
    rank's rows' scheduler-order tokens, -1 elsewhere), its decodes and their draft counts."""
    R, Rb = len(b.sched), st0.bucket.num_reqs
    starts = _token_starts(b)
    code = torch.from_numpy(codes + 1)  # [P, L_b] this rank's local ids (0 on pads)
    _, hidden = restore_hidden_states(st0, code.reshape(-1))  # [G_b] restored hidden states
    full = torch.zeros(token_rows(cfg, st0.bucket), dtype=torch.int64)
    full[: starts[-1]] = torch.arange(1, starts[-1] + 1)
    sched = np.asarray(b.sched + (0,) * (Rb - R), np.int64)
    decode = np.zeros(Rb, bool)
    decode[:R] = is_decode
    drafts = torch.from_numpy(np.where(decode, np.maximum(sched - 1, 0), 0).astype(np.int32))
    return _SpecCase(cfg, b, st0.bucket, starts, code, hidden, _np(hidden), full, sched, decode, drafts)


def _check_spec_indices(case: _SpecCase, r: int, state: PCPState) -> SpecDecodeIndices:
    """What the runner samples (``spec_decode_indices``, drafts read from the rank's rows): each
    request's last ``drafts + 1`` tokens, and the decodes' draft tokens as draft ids."""
    cfg, b, starts, drafts = case.cfg, case.b, case.starts, case.drafts
    _, idx = spec_decode_indices(state, drafts, case.code[r])
    ns, nd = int(idx.num_sampled), int(idx.num_drafts)
    cu, got = _np(idx.cu_num_sampled_tokens), case.restored[_np(idx.logits_indices)]
    for i, n in enumerate(b.sched):  # request i's sampled slots (an empty request's is never read)
        s_i = int(drafts[i]) + 1
        if n and (
            cu[i] > ns
            or not np.array_equal(got[cu[i] - s_i : cu[i]], starts[i] + n - s_i + 1 + np.arange(s_i))
        ):
            _fail(
                "spec-decode",
                cfg,
                b,
                f"rank {r}'s spec_decode_indices logits rows of request {i} are not its sampled tokens",
            )
    dec_drafts = [starts[i] + 2 + np.arange(int(drafts[i])) for i in range(len(b.sched)) if case.decode[i]]
    if not np.array_equal(_np(idx.draft_token_ids)[:nd], np.concatenate(dec_drafts + [[]])):
        _fail("spec-decode", cfg, b, f"rank {r}'s draft_token_ids are not the decodes' draft tokens")
    return idx


def _check_decode_hidden_states(case: _SpecCase, r: int, state: PCPState) -> None:
    """``decode_hidden_states``: the decode tokens' hidden states in order, without the replication."""
    b, starts = case.b, case.starts
    want = np.concatenate(
        [starts[i] + 1 + np.arange(n) for i, n in enumerate(b.sched) if case.decode[i]] + [[]]
    )
    _, dec = decode_hidden_states(state, case.hidden)
    if not np.array_equal(_np(dec)[: want.size], want) or _np(dec)[want.size :].any():
        _fail("spec-decode", case.cfg, b, f"rank {r}'s decode_hidden_states are not the decode tokens")


class _DraftRows(NamedTuple):
    """A rank's rows of the drafter's first pass (the layout's ``first_pass_rows``)."""

    request: np.ndarray  # [L_b] request of each row
    offset: np.ndarray  # [L_b] the row's offset inside its request's padded tokens
    num_rows: int  # valid rows
    counts: np.ndarray  # [R_b] valid rows of each request
    real: np.ndarray  # [L_b] bool the row holds a scheduled token (not a pad)
    token: np.ndarray  # [L_b] int64 the id (and hidden state) the row must carry, 0 on pads


def _first_pass_rows(case: _SpecCase, state: PCPState) -> _DraftRows:
    """The layout's first-pass rows of ``state``'s rank and the token each must carry."""
    R, Rb = len(case.b.sched), case.bucket.num_reqs
    rows = case.cfg.layout_impl.first_pass_rows(state)
    req, off, valid = _np(rows.request), _np(rows.position), _np(rows.valid)
    n_r = int(valid.sum())
    real = valid & (off < case.sched[np.minimum(req, Rb - 1)])
    tok = (
        np.where(real, case.starts[np.minimum(req, max(R - 1, 0))] + off + 1, 0)
        if R
        else np.zeros(case.bucket.num_tokens, np.int64)
    )
    return _DraftRows(req, off, n_r, np.bincount(req[:n_r], minlength=Rb)[:Rb], real, tok)


def _check_first_pass(
    case: _SpecCase, r: int, state: PCPState, idx: SpecDecodeIndices, rows: _DraftRows
) -> None:
    """``first_pass_inputs`` gives the first pass the layout's rows, each with its own token's id and
    restored hidden state (pads 0), and samples each request's last token (``P > 1``; at ``P = 1``
    it passes its inputs through)."""
    cfg, b, P, R = case.cfg, case.b, case.cfg.pcp_size, len(case.b.sched)
    tis = idx.bonus_logits_indices  # a decode samples its bonus token
    positions = torch.zeros(case.bucket.num_tokens, dtype=torch.int64)
    _, fp = first_pass_inputs(
        state, case.full, positions, case.hidden, tis, idx.logits_indices, idx.num_sampled
    )
    qsl = np.concatenate([[0], np.cumsum(rows.counts)])
    ids, hid, tok, real = _np(fp.input_ids), _np(fp.hidden_states), rows.token, rows.real
    if P > 1 and (int(fp.num_tokens) != rows.num_rows or not np.array_equal(_np(fp.query_start_loc), qsl)):
        _fail("spec-decode", cfg, b, f"rank {r}'s first_pass_inputs rows are not first_pass_rows'")
    if P > 1 and (
        not np.array_equal(ids, tok) or not np.array_equal(hid[real], tok[real]) or hid[~real].any()
    ):
        _fail("spec-decode", cfg, b, f"rank {r}'s first-pass rows do not carry their tokens' ids and states")
    sampled = case.restored[_np(fp.token_indices_to_sample)[:R]] if P > 1 else None  # P = 1: passed through
    sched = case.sched[:R]
    if P > 1 and R and not np.array_equal(sampled[sched > 0], case.starts[1:][sched > 0]):
        _fail("spec-decode", cfg, b, f"rank {r}'s first pass does not sample each request's last token")


def _check_split_prefill(case: _SpecCase, r: int, state: PCPState, rows: _DraftRows) -> None:
    """``split_prefill_for_draft``: the first-pass rows after the decodes', with their tokens."""
    cfg, b, decode = case.cfg, case.b, case.decode
    _, sp = split_prefill_for_draft(state, case.full, case.hidden)
    D = int(case.sched[decode].sum())
    k = int(sp.num_tokens)
    lens = rows.counts[~decode][: int((~decode[: len(b.sched)]).sum())]
    if k != rows.num_rows - D or not np.array_equal(_np(sp.seq_lens)[: lens.size], lens):
        _fail("spec-decode", cfg, b, f"rank {r}'s split_prefill_for_draft rows are not its prefill rows")
    tok = rows.token[D : rows.num_rows]
    if not np.array_equal(_np(sp.input_ids)[:k], tok) or not np.array_equal(_np(sp.hidden_states)[:k], tok):
        _fail("spec-decode", cfg, b, f"rank {r}'s split_prefill_for_draft rows do not carry their tokens")


def _num_decodes(cfg: PCPConfig, b: Batch) -> int:
    return int(classify_decodes(cfg, *(np.asarray(x, np.int64) for x in (b.sched, b.comp, b.prompt))).sum())


def _counting_backend() -> tuple[list[int], Any]:
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    return graphs, backend


def check_graphs(cfg: PCPConfig, R: int, T: int) -> None:
    """No host sync, ``fullgraph=True`` compile with one graph per bucket (equal to eager), export."""
    layout_name = cfg.layout_name
    b1 = Batch((1, T - 1), (5, 0), (3, T - 1)) if T > 1 else Batch((1,), (0,), (1,))
    b2 = Batch((T - 1, 1), (0, 0), (T - 1, 1)) if T > 1 else Batch((1,), (3,), (1,))
    made = []
    for b in (b1, b2):
        total = sum(b.sched)
        made.append(
            make_batch(cfg, b.sched, b.comp, b.prompt, slot_mapping=range(total), bucket=cfg.capacity)
        )
    small = make_batch(cfg, [1], [0], [1], slot_mapping=[0])
    state = init_state(cfg)
    eager, counts = _eager_and_compiled(layout_name, "step", step, [(state, x) for x in (*made, small)])
    if counts[1] != 1 or counts[2] != 2 - (small.bucket == cfg.capacity):
        raise LayoutCheckError(
            f"layout {layout_name!r}: {counts[1]} graphs for two batches of one bucket, {counts[2]} with a "
            "third bucket: a graph must depend on the bucket only"
        )
    runs_states = [(st,) for st, _ in eager[:2]]
    if _eager_and_compiled(layout_name, "attention_runs", attention_runs, runs_states)[1][-1] != 1:
        raise LayoutCheckError(f"layout {layout_name!r}: attention_runs makes more than one graph a bucket")
    try:
        export(step, state, made[0])
    except Exception as e:
        raise LayoutCheckError(f"layout {layout_name!r}: torch.export of step fails: {e}") from e


def _eager_and_compiled(
    layout_name: str, what: str, fn: Any, calls: list[tuple[Any, ...]]
) -> tuple[list[Any], list[int]]:
    """``fn(*args)`` for each ``args`` of ``calls`` under ``no_host_syncs``, then compiled with
    ``fullgraph=True`` (equal to eager); returns the eager outputs and the graphs made so far
    after each compiled call."""
    try:
        with no_host_syncs():
            eager = [fn(*args) for args in calls]
    except Exception as e:
        raise LayoutCheckError(f"layout {layout_name!r}: a host sync inside {what}: {e}") from e
    graphs, backend = _counting_backend()
    torch._dynamo.reset()
    compiled_fn = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)
    compiled, counts = [], []
    try:
        for args in calls:
            compiled.append(compiled_fn(*args))
            counts.append(len(graphs))
    except Exception as e:
        raise LayoutCheckError(
            f"layout {layout_name!r}: {what} does not compile with fullgraph=True: {e}"
        ) from e
    finally:
        torch._dynamo.reset()
    for e_out, c_out in zip(eager, compiled):
        if not all(torch.equal(a, c) for a, c in zip(_tensors(e_out), _tensors(c_out))):
            raise LayoutCheckError(f"layout {layout_name!r}: the compiled {what} differs from the eager one")
    return eager, counts


def _draft_prep(
    state: Any, drafts: torch.Tensor, ids: torch.Tensor, full: torch.Tensor, hidden: torch.Tensor
):
    """The post-forward spec-decode prep of one rank, composed (what a captured drafter step runs)."""
    _, idx = spec_decode_indices(state, drafts, ids)
    _, dec = decode_hidden_states(state, hidden)
    _, split = split_prefill_for_draft(state, full, hidden)
    positions = torch.zeros_like(ids)
    _, fp = first_pass_inputs(
        state, full, positions, hidden, idx.bonus_logits_indices, idx.logits_indices, idx.num_sampled
    )
    return idx, dec, split, fp


def check_spec_graphs(cfg: PCPConfig, R: int, T: int) -> None:
    """The spec-decode prep under the layout: no host sync, ``fullgraph=True``, compiled equal to eager."""
    b = Batch((2, T - 2), (7, 0), (6, T - 2)) if T > 2 else Batch((1,), (0,), (1,))
    batch = make_batch(cfg, b.sched, b.comp, b.prompt, slot_mapping=range(sum(b.sched)), bucket=cfg.capacity)
    state, _ = step(init_state(cfg), batch)
    Lb = state.bucket.num_tokens
    drafts = torch.zeros(state.bucket.num_reqs, dtype=torch.int32)
    drafts[0] = 1 if b.sched[0] == 2 else 0
    ids = torch.arange(1, Lb + 1)
    full = torch.arange(1, token_rows(cfg, state.bucket) + 1)
    hidden = torch.arange(cfg.pcp_size * Lb, dtype=torch.float32)[:, None].expand(-1, 4).contiguous()
    args = (state, drafts, ids, full, hidden)
    _eager_and_compiled(cfg.layout_name, "spec-decode prep", _draft_prep, [args])


def check_layout(
    layout: Layout | str,
    *,
    pcp_sizes: Sequence[int] = tuple(range(1, 9)),
    max_examples: int = 20,
    max_num_reqs: int = 6,
    max_num_tokens: int = 48,
    num_spec_tokens: int = 1,
    graph_pcp_sizes: Sequence[int] = (2,),
    edges: bool = True,
    dcp_size: int = 1,
) -> None:
    """Check ``layout`` against the :class:`pcp_fn.Layout` invariants (module docstring).

    Args:
        layout: a :class:`pcp_fn.Layout` (registered by its name if it is not yet) or a name.
        pcp_sizes: the ``P`` values the hypothesis batches use (each example draws one).
        max_examples: hypothesis examples (batches), spread over ``pcp_sizes`` and the spec counts.
        max_num_reqs, max_num_tokens: the configs' ``R`` and ``T``.
        num_spec_tokens: the configs have 0 or this many speculative tokens (each example
            draws one; decodes of ``1 .. 1 + num_spec_tokens`` tokens, drafting ``n - 1``);
            with spec tokens the spec-decode prep is checked too. 0: no speculative decoding.
        graph_pcp_sizes: the ``P`` values of the graph checks (compiles: seconds each).
        edges: also run the capacity-edge batches at every ``P`` of ``pcp_sizes`` (and spec count).
        dcp_size: the configs' decode context parallelism (a layout may split differently under it).

    Raises :class:`LayoutCheckError` naming the rule, the config and the smallest failing batch.
    """
    name = layout if isinstance(layout, str) else register_layout(layout).name
    R, T = max_num_reqs, max_num_tokens
    spec_counts = sorted({0, num_spec_tokens})

    def config(P: int, spec: int = 0) -> PCPConfig:
        return PCPConfig(P, 0, R, T, num_spec_tokens=spec, dcp_size=dcp_size, layout=name)

    if edges:
        for P in pcp_sizes:
            for spec in spec_counts:
                for b in edge_batches(R, T):
                    check_batch_exact(config(P, spec), b)

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(P=st.sampled_from(list(pcp_sizes)), spec=st.sampled_from(spec_counts), data=st.data())
    def exact(P: int, spec: int, data: Any) -> None:
        check_batch_exact(config(P, spec), data.draw(batches(R, T, spec), label="batch"))

    exact()
    for P in graph_pcp_sizes:
        check_graphs(config(P), R, T)
        if num_spec_tokens:
            check_spec_graphs(config(P, num_spec_tokens), R, T)


__all__ = ["Batch", "LayoutCheckError", "batches", "check_layout", "edge_batches"]
