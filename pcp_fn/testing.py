"""`check_layout`: the conformance suite a researcher runs on their own [`pcp_fn.Layout`][].

    from pcp_fn.testing import check_layout
    check_layout(MyLayout())          # raises LayoutCheckError: the rule, the batch, the rows that break it

It runs the facade ops (`step`, `update_tokens`, `restore_hidden_states`,
`padded_slot_mapping`, `get_logits_indices`) under the layout on hypothesis
batches at `P = 1..8` (decodes first, then fresh, chunked and empty prefills)
plus the capacity edges (`R` one-token prefills, one `T`-token prefill, `R`
decodes, the empty batch), and checks the protocol's invariants
([`pcp_fn.Layout`][]) against an independent per-token count:

- ownership: every scheduled token is on exactly the ranks the layout says
  (a request the layout's geometry marks `replicated` on every rank, typically
  the decodes when `P > 1`; any other token on exactly one), rows
  grouped by request, `query_start_loc` counting them, padding at the tail;
- positions `num_computed + offset` on real rows, 0 on padding;
- restore: `restore_hidden_states` of the rank-major all-gather puts every token
  once, in request order, at the rows `restored_spans` names, each read from the rank
  that holds it (rank 0's copy of a replicated token: all-gathered rows tagged by rank);
- slots: every scheduled slot exactly once in `padded_slot_mapping`, the other
  rows `pad_slot_id`; logits rows land on each request's last token;
- attention runs: [`pcp_fn.attention_runs`][pcp_fn.attention_runs.attention_runs] (read from the
  layout's `state_local_rows`) cuts the rows `step` returns into maximal runs of consecutive tokens
  of one request, real or pad, each run attending its last position + 1 keys (a pad run: the
  request's);
- fixed shapes: every output's shapes are those of an empty batch of the same bucket;
- `all_ranks` (`vmap` over the rank) equals each rank's own static-rank step;
- spec decode (configs with speculative tokens, decodes drafting `n - 1`): the rows
  `spec_decode_indices` samples hold each request's last `drafts + 1` tokens and its
  draft ids are the decodes' drafts; `decode_hidden_states` gives the decode tokens in
  order; the drafter's first pass (`first_pass_rows`) holds every prefill token on
  exactly one rank and the decodes on every rank, and `first_pass_inputs` /
  `split_prefill_for_draft` give each of its rows its own token's id and restored
  hidden state (pads 0) and sample each request's last token. The runner then samples
  through `spec_decode_indices`, so `get_logits_indices`' rows are checked without
  spec tokens only (the hybrid layout keeps vllm-ascend's token-major decode rows there).

Then, for `graph_pcp_sizes`: `no_host_syncs`, `torch.compile(fullgraph=True)`
with one graph per bucket (two batches of a bucket: one graph; a third bucket: one
more), compiled equal to eager (`attention_runs` after it too), and `torch.export`
with static shapes; with spec
tokens, the post-forward spec-decode prep (`spec_decode_indices`,
`decode_hidden_states`, `split_prefill_for_draft`, `first_pass_inputs`) under
`no_host_syncs` and `fullgraph=True`, compiled equal to eager.
A failure names the rule, the config, the batch, the rank and the first differing rows with
their expected and actual values. The hypothesis batches are the same on every run (derandomized,
or a `seed=` given) and no file is written. Needs `hypothesis` (the `test` extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, NoReturn

import hypothesis
import numpy as np
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import configuration as hypothesis_configuration
from hypothesis import strategies as st

from .attention_runs import attention_runs
from .core.buckets import Bucket
from .core.rank import all_ranks
from .graph.export import export
from .graph.sync import no_host_syncs
from .logits import get_logits_indices
from .protocol.batch import SchedulerBatch, check_local_bound, classify_decodes, make_batch, token_rows
from .protocol.canonical import canonical_batches
from .protocol.config import PCPConfig
from .protocol.layout import Layout
from .protocol.registry import LayoutError, get_layout, register_layout
from .protocol.state import PCPState, fresh_state, init_state
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


# what a capacity failure adds: the two ways out (the host bound, or refusing the config)
CAPACITY_HINT = (
    "num_local_tokens(config, num_scheduled, num_decodes, num_computed) is the host bound make_batch "
    "picks the bucket from: make it cover the fullest rank's rows of such a batch, or refuse a config "
    "the layout cannot serve in check_config(config)"
)
EXCERPT_ROWS = 4  # a failure message shows the first few differing rows, then how many more


def _config_text(cfg: PCPConfig) -> str:
    """`P=2 (R=6, T=48, num_spec_tokens=1)`: the config a failure was found at."""
    extra = f", num_spec_tokens={cfg.num_spec_tokens}" if cfg.num_spec_tokens else ""
    extra += f", dcp_size={cfg.dcp_size}" if cfg.dcp_size > 1 else ""
    return f"P={cfg.pcp_size} (R={cfg.max_num_reqs}, T={cfg.max_num_tokens}{extra})"


def _fail(rule: str, cfg: PCPConfig, b: Batch, detail: str, cause: BaseException | None = None) -> None:
    error = LayoutCheckError(
        f"layout {cfg.layout_name!r} breaks {rule} at {_config_text(cfg)}, num_scheduled={list(b.sched)} "
        f"num_computed={list(b.comp)} num_prompt={list(b.prompt)}: {detail}"
    )
    if cause is None:
        raise error
    raise error from cause


def _excerpt(items: Sequence[str]) -> str:
    """The first `EXCERPT_ROWS` of `items`, then how many more."""
    more = f"; and {len(items) - EXCERPT_ROWS} more" if len(items) > EXCERPT_ROWS else ""
    return "; ".join(items[:EXCERPT_ROWS]) + more


def _differing(want: Any, got: Any, label: Any = "row {}".format, first: int = 0) -> str:
    """`row 3: expected 5, got 7; ...`: the rows where `got` differs from `want` (arrays or lists
    of rows; a row one of them lacks reads `nothing`). `label(l)` names row `first + l`."""
    want, got = np.atleast_1d(np.asarray(want)), np.atleast_1d(np.asarray(got))
    n = max(len(want), len(got))
    if want.shape[1:] == got.shape[1:]:
        m = min(len(want), len(got))
        same = (want[:m] == got[:m]).reshape(m, -1).all(1) if m else np.zeros(0, bool)
        bad = [*np.flatnonzero(~same).tolist(), *range(m, n)]
    else:
        bad = list(range(n))

    def value(a: np.ndarray, k: int) -> Any:
        return a[k].tolist() if k < len(a) else "nothing"

    return _excerpt([f"{label(first + k)}: expected {value(want, k)}, got {value(got, k)}" for k in bad])


@st.composite
def batches(draw: Any, max_reqs: int, max_tokens: int, num_spec_tokens: int = 0) -> Batch:
    """Decodes (context, `1..1 + num_spec_tokens` tokens), then fresh / chunked / empty prefills;
    sometimes exactly `max_reqs` requests or exactly `max_tokens` tokens."""
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
    """The capacity edges: `min(R, T)` one-token prefills (the most local rows), one `T`-token
    prefill, `R` decodes, decodes then a prefill filling `T`, and the empty batch."""
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


def _shapes(tree: Any) -> list[Any]:
    leaves, spec = pytree.tree_flatten(tree)
    return [str(spec), *[tuple(x.shape) if isinstance(x, torch.Tensor) else x for x in leaves]]


def _tensor_leaves(tree: Any) -> list[tuple[str, torch.Tensor]]:
    """`(path, tensor)` of each tensor leaf: `(".layout.positions", ...)`."""
    leaves, _ = pytree.tree_flatten_with_path(tree)
    return [(pytree.keystr(k), x) for k, x in leaves if isinstance(x, torch.Tensor)]


def _shape_diff(want: Any, got: Any) -> str:
    """The leaves of `got` whose shape (or value, for a non-tensor leaf) differs from `want`'s."""
    w_leaves, w_spec = pytree.tree_flatten_with_path(want)
    g_leaves, g_spec = pytree.tree_flatten_with_path(got)
    if w_spec != g_spec:
        return f"the outputs' structure: expected {w_spec}, got {g_spec}"

    def shape(x: Any) -> Any:
        return list(x.shape) if isinstance(x, torch.Tensor) else x

    return _excerpt(
        [
            f"(state, outputs){pytree.keystr(k)}: expected {shape(w)}, got {shape(g)}"
            for (k, w), (_, g) in zip(w_leaves, g_leaves)
            if shape(w) != shape(g)
        ]
    )


def check_batch_exact(cfg: PCPConfig, b: Batch, *, fresh: Callable[..., PCPState] = init_state) -> None:
    """Every exactness invariant of the layout on one batch (eager); raises
    [`LayoutCheckError`][pcp_fn.testing.LayoutCheckError].

    `fresh(config, rank=...)` makes each rank's state: [`pcp_fn.init_state`][] (which first runs
    a new layout on its canonical batches), or
    [`pcp_fn.protocol.state.fresh_state`][pcp_fn.protocol.fresh_state] (which does
    not: the rules then name the rows of this batch).
    """
    try:
        _exact_or_fail(cfg, b, fresh)
    except LayoutError as e:  # init_state's first run of the layout refused it (pcp_fn.protocol.canonical)
        _refused(cfg, e)


def _refused(cfg: PCPConfig, error: LayoutError) -> NoReturn:
    """`init_state` refused the layout on one of its canonical batches, naming the rule and the
    batch: the same rules, here, on those batches name the rows too (`error`'s message if not)."""
    for counts in canonical_batches(cfg):
        b = Batch(*counts)
        bucket = _exact_bucket(cfg, b)  # init_state runs each in the bucket the layout's bound asks for
        try:
            _exact_or_fail(cfg, b, fresh_state, bucket)
        except LayoutCheckError as found:
            if bucket is not None:  # the bucket the batch ran in: not the one make_batch picks
                head = f"num_prompt={list(b.prompt)}: "
                where = f"num_prompt={list(b.prompt)} in {bucket} (the rows its num_local_tokens asks for): "
                found.args = (str(found).replace(head, where, 1),)
            raise
    hint = f" ({CAPACITY_HINT})" if error.rule == "capacity" else ""
    raise LayoutCheckError(f"{error}{hint}") from error


def _exact_bucket(cfg: PCPConfig, b: Batch) -> Bucket | None:
    """The bucket of exactly the rows the layout's `num_local_tokens` asks for (`None`: a bound
    `make_batch` refuses, which it then names)."""
    sched, comp = np.asarray(b.sched, np.int64), np.asarray(b.comp, np.int64)
    try:
        bound = cfg.layout_impl.num_local_tokens(cfg, sched, _num_decodes(cfg, b), comp)
        bound = check_local_bound(cfg, bound, int(sched.sum()))
    except (TypeError, ValueError):
        return None
    return Bucket(max(len(b.sched), 1), max(bound, 1))


def _exact_or_fail(
    cfg: PCPConfig, b: Batch, fresh: Callable[..., PCPState], bucket: Bucket | None = None
) -> None:
    """The exactness rules on `b` (in `bucket`) with the fresh states `fresh(config, rank=...)`
    makes; any error but a [`LayoutError`][pcp_fn.protocol.LayoutError] of `init_state` (re-raised) is a
    [`LayoutCheckError`][pcp_fn.testing.LayoutCheckError]."""
    try:
        _check_batch_exact(cfg, b, fresh, bucket)
    except LayoutCheckError:
        raise
    except LayoutError as e:  # make_batch's or init_state's own check of the layout found it first
        if str(e).startswith(f"layout {cfg.layout_name!r} breaks "):  # init_state's
            raise
        hint = f" ({CAPACITY_HINT})" if e.rule == "capacity" else ""
        _fail(e.rule or "the ops", cfg, b, f"{e}{hint}", e)
    except Exception as e:  # the layout raised: that is a failure of the layout, with the batch named
        _fail("the ops", cfg, b, f"the layout raised {type(e).__name__}: {e} (its traceback above)", e)


def _check_batch_exact(
    cfg: PCPConfig, b: Batch, fresh: Callable[..., PCPState] = init_state, bucket: Bucket | None = None
) -> None:
    """The exactness rules on one batch, in the module docstring's order (in `bucket`, or the one
    `make_batch` picks)."""
    total = sum(b.sched)
    slots = [SLOT_BASE + t for t in range(total)]
    batch = make_batch(cfg, b.sched, b.comp, b.prompt, slot_mapping=slots, bucket=bucket)
    bound = cfg.layout_impl.num_local_tokens(
        cfg, np.asarray(b.sched, np.int64), _num_decodes(cfg, b), np.asarray(b.comp, np.int64)
    )
    steps = _rank_steps(cfg, b, batch, fresh)
    codes, held = _check_rows(cfg, b, steps, bound)
    # the layout says which requests are whole on every rank (the decodes, for most layouts)
    whole = _np(cfg.layout_impl.state_geometry(steps.states[0]).replicated)[: len(b.sched)].astype(bool)
    source = _source_ranks(cfg, b, held, whole, _cut_note(steps, bound))
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
    """A batch under check and every rank's own (static-rank) `step` of it."""

    batch: SchedulerBatch
    states: list[PCPState]  # [P] each rank's state after the step
    outs: list[StepOutputs]  # [P] each rank's outputs


def _token_starts(b: Batch) -> np.ndarray:
    """`[R + 1]` int64: the first scheduler-order token of each request, then the total."""
    return np.concatenate([[0], np.cumsum(b.sched)]).astype(np.int64)


def _rank_steps(
    cfg: PCPConfig, b: Batch, batch: SchedulerBatch, fresh: Callable[..., PCPState]
) -> _RankSteps:
    """Each rank's own step of `batch`, checked equal to `all_ranks` (vmap over the rank) and
    of the shapes an empty batch forced to the same bucket gives (fixed shapes)."""
    _, outs = all_ranks(step, fresh(cfg, rank=0), batch)
    states, rank_outs = [], []
    for r in range(cfg.pcp_size):
        cfg_r = dataclasses.replace(cfg, pcp_rank=r)
        st_r, out_r = step(fresh(cfg_r), batch)
        states.append(st_r)
        rank_outs.append(out_r)
        for (path, a), (_, c) in zip(_tensor_leaves(out_r), _tensor_leaves(outs)):
            if not torch.equal(a, c[r]):
                _fail(
                    "vmap over ranks",
                    cfg,
                    b,
                    f"all_ranks' output{path}[{r}] differs from rank {r}'s own step (expected: the "
                    f"rank's own, got: all_ranks'): {_differing(_np(a).reshape(-1), _np(c[r]).reshape(-1))}",
                )
    empty = make_batch(cfg, [], [], [], slot_mapping=[], bucket=batch.bucket)
    want = step(fresh(cfg), empty)
    if _shapes(want) != _shapes((states[0], rank_outs[0])):
        _fail(
            "fixed shapes",
            cfg,
            b,
            f"shapes depend on the batch, not only on the bucket {batch.bucket} (expected: an empty "
            f"batch's of the bucket): {_shape_diff(want, (states[0], rank_outs[0]))}",
        )
    return _RankSteps(batch, states, rank_outs)


def _check_rows(
    cfg: PCPConfig, b: Batch, steps: _RankSteps, bound: int
) -> tuple[np.ndarray, dict[tuple[int, int], list[int]]]:
    """Capacity, ownership and positions of each rank's rows: at most `bound`
    (`num_local_tokens`) and `L_b` rows, grouped by request, counted by `query_start_loc`
    and `pcp_tokens`, padding `(0, 0)` at the tail, positions `num_computed + offset`.

    Returns `codes [P, L_b]` (each real row's scheduler-order token, -1 elsewhere) and the
    ranks holding each `(request, offset)`.
    """
    P, R = cfg.pcp_size, len(b.sched)
    starts = _token_starts(b)
    held: dict[tuple[int, int], list[int]] = {}
    codes = np.full((P, steps.batch.bucket.num_tokens), -1, np.int64)
    for r, out in enumerate(steps.outs):
        n_r = int(out.layout.num_tokens)
        req, pos = _np(out.layout.request_index), _np(out.layout.positions)
        _check_rank_rows(cfg, b, steps.batch.bucket, r, out, bound)
        sched_of = np.asarray(b.sched + (0,), np.int64)[np.minimum(req[:n_r], R)]
        comp_of = np.asarray(b.comp + (0,), np.int64)[np.minimum(req[:n_r], R)]
        real = pos[:n_r] < sched_of
        got = _np(out.positions)
        want = np.zeros_like(got)
        want[:n_r] = np.where(real, comp_of + pos[:n_r], got[:n_r])  # a pad row's position: the layout's
        if not np.array_equal(got, want):
            detail = f"rank {r}'s positions are not num_computed + offset (0 on padding): "
            _fail("positions", cfg, b, detail + _differing(want, got, _local_rows(req, pos, n_r)))
        _add_holder(held, r, req[:n_r][real], pos[:n_r][real])
        codes[r, :n_r] = np.where(real, starts[np.minimum(req[:n_r], max(R - 1, 0))] + pos[:n_r], -1)
    return codes, held


def _local_rows(request: np.ndarray, offset: np.ndarray, num_rows: int) -> Callable[[int], str]:
    """The label of each local row: `row 3 (request 1, offset 2)`, `padding row 9`."""
    return lambda l: (
        f"row {l} (request {request[l]}, offset {offset[l]})" if l < num_rows else f"padding row {l}"
    )


def _check_rank_rows(cfg: PCPConfig, b: Batch, bucket: Bucket, r: int, out: StepOutputs, bound: int) -> None:
    """Rank `r`'s rows: at most `bound` and `L_b`, grouped by request (requests of `b`),
    counted by `query_start_loc` and `pcp_tokens`, padding `(0, 0)` at the tail."""
    R, Rb, Lb = len(b.sched), bucket.num_reqs, bucket.num_tokens
    n_r = int(out.layout.num_tokens)
    req, pos = _np(out.layout.request_index), _np(out.layout.positions)
    pairs = np.stack([req, pos], 1)  # [L_b, 2] each row's (request, offset)
    if n_r > bound or n_r > Lb:
        past = min(bound, Lb)
        rows = _excerpt([f"row {l}: {pairs[l].tolist()}" for l in range(past, min(n_r, Lb))])
        _fail(
            "capacity",
            cfg,
            b,
            f"rank {r} holds {n_r} rows, expected at most {past} (num_local_tokens said {bound}, "
            f"L_b={Lb}); its rows past {past} (request, offset): {rows or 'past L_b'}. {CAPACITY_HINT}",
        )
    if (pairs[n_r:] != 0).any():
        detail = f"rank {r}'s padding rows past num_tokens={n_r} are not (request, offset) = (0, 0): "
        _fail("ownership", cfg, b, detail + _differing(np.zeros_like(pairs[n_r:]), pairs[n_r:], first=n_r))
    down = np.flatnonzero(np.diff(req[:n_r]) < 0) + 1
    if down.size:
        rows = [f"row {l} holds request {req[l]} after row {l - 1}'s request {req[l - 1]}" for l in down]
        _fail("ownership", cfg, b, f"rank {r}'s rows are not grouped by request, in order: {_excerpt(rows)}")
    beyond = np.flatnonzero(req[:n_r] >= max(R, 1))
    if beyond.size:
        rows = [f"row {l}: request {req[l]}, expected a request < num_reqs={R}" for l in beyond]
        _fail("ownership", cfg, b, f"rank {r} holds rows of no scheduled request: {_excerpt(rows)}")
    counts = np.bincount(req[:n_r], minlength=Rb)[:Rb]
    qsl = _np(out.query_start_loc).astype(np.int64)
    want = np.concatenate([[0], np.cumsum(counts)])
    if not np.array_equal(qsl, want):
        detail = f"rank {r}'s query_start_loc does not count its rows per request: "
        _fail("ownership", cfg, b, detail + _differing(want, qsl, "query_start_loc[{}]".format))
    tokens = _np(out.layout.pcp_tokens)[:Rb]
    if not np.array_equal(tokens, counts):
        detail = f"rank {r}'s pcp_tokens do not count its rows per request: "
        _fail("ownership", cfg, b, detail + _differing(counts, tokens, "request {}".format))


def _add_holder(
    held: dict[tuple[int, int], list[int]], r: int, request: np.ndarray, offset: np.ndarray
) -> None:
    """Rank `r` holds token `offset[l]` of request `request[l]`, for every `l`."""
    for i, o in zip(request.tolist(), offset.tolist()):
        held.setdefault((i, o), []).append(r)


def _rightly_held(ranks: list[int], replicated: bool, P: int) -> bool:
    """A token of a replicated request is on every rank, any other token on exactly one."""
    return sorted(ranks) == list(range(P)) if replicated else len(ranks) == 1


def _source_ranks(
    cfg: PCPConfig, b: Batch, held: dict[tuple[int, int], list[int]], whole: np.ndarray, cut_note: str = ""
) -> np.ndarray:
    """`[total]` the rank each token's restored row must be read from: rank 0's copy of a
    replicated (`whole`) request's token, the owner's of any other. Checks every scheduled token
    is on the ranks it should be, and `held` (emptied) names no other token. `cut_note`: what a
    token on no rank may mean (`_cut_note`)."""
    starts = _token_starts(b)
    source = np.zeros(sum(b.sched), np.int64)
    wrong = _wrongly_held(cfg, b, held, whole)
    if wrong:
        lost = any(not held.get((i, j)) for i, n in enumerate(b.sched) for j in range(n))
        _fail("ownership", cfg, b, _excerpt(wrong) + (cut_note if lost else ""))
    for i, n in enumerate(b.sched):
        for j in range(n):
            ranks = held.pop((i, j))
            source[starts[i] + j] = 0 if whole[i] else ranks[0]
    if held:
        rows = [f"(request {i}, offset {o}) on ranks {ranks}" for (i, o), ranks in sorted(held.items())]
        _fail("ownership", cfg, b, f"rows of tokens that are not scheduled: {_excerpt(rows)}")
    return source


def _cut_note(steps: _RankSteps, bound: int) -> str:
    """For a token on no rank: the ranks whose rows fill the bucket, where a layout's rows past
    `L_b` are cut (a [`pcp_fn.PartitionLayout`][]'s), with the capacity hint; `""` if none."""
    Lb = steps.batch.bucket.num_tokens
    full = [r for r, out in enumerate(steps.outs) if int(out.layout.num_tokens) >= Lb]
    if not full:
        return ""
    return (
        f". Ranks {full} hold the bucket's L_b={Lb} rows, all of them (num_local_tokens said {bound}): "
        f"if one should hold more, its rows past L_b were cut and the bound is short. {CAPACITY_HINT}"
    )


def _wrongly_held(
    cfg: PCPConfig, b: Batch, held: dict[tuple[int, int], list[int]], whole: np.ndarray, where: str = ""
) -> list[str]:
    """`token j of request i is on ranks [...], expected ...` for each scheduled token `held` has
    on the wrong ranks (every rank for a `whole` request's token, exactly one for any other)."""
    P, every = cfg.pcp_size, list(range(cfg.pcp_size))
    wrong = []
    for i, n in enumerate(b.sched):
        want = f"every rank {every} (request {i} is replicated)" if whole[i] else "exactly one rank"
        for j in range(n):
            ranks = held.get((i, j), [])
            if not _rightly_held(ranks, whole[i], P):
                wrong.append(f"{where}token {j} of request {i} is on ranks {sorted(ranks)}, expected {want}")
    return wrong


def _span_rows(i: int, first: int) -> Callable[[int], str]:
    """The label of each restored row of request `i`, whose first is `first`."""
    return lambda l: f"restored row {l} (token {l - first} of request {i})"


def _check_restore(
    cfg: PCPConfig, b: Batch, steps: _RankSteps, codes: np.ndarray, source: np.ndarray
) -> np.ndarray:
    """`restore_hidden_states` of the rank-major all-gather of `codes` (each rank's token codes)
    puts every token once, in request order, at the rows `restored_spans` names, each read from
    its `source` rank (the all-gather of each row's rank says). Returns the restored codes `[G_b]`."""
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
    owner = np.full(G, -1, np.int64)  # the request whose span holds each restored row
    for i, n in enumerate(b.sched):
        if n == 0:
            continue
        if length[i] < n or start[i] < 0 or start[i] + n > G:
            _fail(
                "restore",
                cfg,
                b,
                f"request {i}'s restored span (restored_spans' start, length): expected length >= {n} (its "
                f"tokens), 0 <= start and start + {n} <= G_b={G}; got start={start[i]}, length={length[i]}",
            )
        rows = np.arange(start[i], start[i] + n)
        if (owner[rows] >= 0).any():
            other = int(owner[rows][owner[rows] >= 0][0])
            _fail(
                "restore",
                cfg,
                b,
                f"request {i}'s restored rows {start[i]}..{start[i] + n - 1} overlap request {other}'s "
                f"{start[other]}..{start[other] + b.sched[other] - 1} (restored_spans)",
            )
        owner[rows] = i
        row = _span_rows(i, int(start[i]))
        if not np.array_equal(restored[rows], starts[i] + np.arange(n)):
            detail = (
                f"request {i}'s restored rows do not hold its tokens (values: scheduler-order token "
                "numbers, -1 a row that holds none): "
            )
            _fail(
                "restore",
                cfg,
                b,
                detail + _differing(starts[i] + np.arange(n), restored[rows], row, start[i]),
            )
        want = source[starts[i] : starts[i] + n]
        if not np.array_equal(read_from[rows], want):
            detail = (
                f"request {i}'s restored rows are read from the wrong ranks (values: the rank each row "
                "is read from; expected rank 0's copy of a replicated token, the owner's of any other): "
            )
            _fail("restore", cfg, b, detail + _differing(want, read_from[rows], row, start[i]))
    order = [i for i, n in enumerate(b.sched) if n]
    if (np.diff(start[order]) < 0).any():
        _fail(
            "restore",
            cfg,
            b,
            f"requests are not restored in request order: restored_spans' start of requests {order}: "
            f"expected ascending, got {start[order].tolist()}",
        )
    return restored


def _check_logits(cfg: PCPConfig, b: Batch, steps: _RankSteps, restored: np.ndarray) -> None:
    """`get_logits_indices` equals step's `logits_indices`, whose row of each request holds (a
    copy of) its last token in the `restored` codes; rows past `num_reqs` are 0."""
    R, G = len(b.sched), cfg.pcp_size * steps.batch.bucket.num_tokens
    starts = _token_starts(b)
    logits = _np(steps.outs[0].logits_indices)
    _, via_op = get_logits_indices(steps.states[0])
    if not np.array_equal(_np(via_op), logits):
        detail = "get_logits_indices differs from step's logits_indices (expected: step's): "
        _fail("logits", cfg, b, detail + _differing(logits, _np(via_op), "request {}".format))
    # with spec tokens configured the runner samples through spec_decode_indices (checked by
    # _check_spec); the hybrid layout's get_logits_indices then keeps vllm-ascend's token-major
    # decode rows although its decodes are rank-major (docs/layouts.md)
    wrong = []
    for i, n in enumerate(b.sched if cfg.num_spec_tokens == 0 else ()):
        # the row holds (a copy of) the last token: hybrid samples a decode from rank P-1's copy
        last = starts[i] + n - 1
        if n and (not 0 <= logits[i] < G or restored[logits[i]] != last):
            held = f"token {restored[logits[i]]}" if 0 <= logits[i] < G else f"no row (G_b={G})"
            rows = np.flatnonzero(restored == last).tolist()
            wrong.append(
                f"request {i}: expected a restored row holding its last token {last} ({rows}), got row "
                f"{logits[i]}, which holds {held}"
            )
    if wrong:
        detail = "logits_indices are not each request's last token's restored row (scheduler-order tokens): "
        _fail("logits", cfg, b, detail + _excerpt(wrong))
    if (logits[R:] != 0).any():
        detail = "logits rows past num_reqs are not 0: "
        _fail(
            "logits",
            cfg,
            b,
            detail + _differing(np.zeros_like(logits[R:]), logits[R:], "request row {}".format, R),
        )


def _check_slots(cfg: PCPConfig, b: Batch, steps: _RankSteps, r: int) -> None:
    """Rank `r`'s `[P * L_b]` slot mapping holds every scheduled slot exactly once,
    `pad_slot_id` elsewhere, and `padded_slot_mapping` gives the same."""
    G = cfg.pcp_size * steps.batch.bucket.num_tokens
    sm = _np(steps.outs[r].slot_mapping)
    if sm.shape != (G,):
        _fail("slots", cfg, b, f"rank {r}'s slot_mapping: expected shape [P*L_b] = ({G},), got {sm.shape}")
    want = SLOT_BASE + np.arange(sum(b.sched))
    if not np.array_equal(np.sort(sm[sm != cfg.pad_slot_id]), want):
        detail = (
            f"rank {r}'s slot mapping does not hold every scheduled slot exactly once (token t's slot is "
            f"{SLOT_BASE} + t, pad_slot_id={cfg.pad_slot_id} elsewhere): "
        )
        _fail("slots", cfg, b, detail + _slot_errors(sm, want, cfg.pad_slot_id))
    _, again = padded_slot_mapping(steps.states[r], steps.batch.slot_mapping)
    if not np.array_equal(_np(again), sm):
        detail = f"rank {r}'s padded_slot_mapping differs from step's slot_mapping (expected: step's): "
        _fail("slots", cfg, b, detail + _differing(sm, _np(again)))


def _slot_errors(sm: np.ndarray, want: np.ndarray, pad: int) -> str:
    """The slots `sm` lacks, holds twice, or holds that are no scheduled token's, with their rows."""
    errors = []
    for slot in want:
        rows = np.flatnonzero(sm == slot).tolist()
        if len(rows) != 1:
            where = f"at rows {rows}" if rows else "missing"
            errors.append(f"token {slot - SLOT_BASE}'s slot {slot}: expected on one row, got {where}")
    foreign = np.flatnonzero((sm != pad) & ~np.isin(sm, want))
    errors += [f"row {l}: expected a scheduled slot or pad_slot_id, got {sm[l]}" for l in foreign]
    return _excerpt(errors)


def _expected_runs(b: Batch, req: np.ndarray, offset: np.ndarray) -> list[list[int]]:
    """`[first_row, rows, request, is_pad, keys]` of each run of a rank's real rows, one row at a time
    (the ownership rule has checked every `req` is a request of `b`)."""
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
            f"rank {r}'s attention_runs (num_runs: expected {m}, got {int(runs.num_runs)}) are not the "
            f"maximal runs of step's rows, [first row, rows, request, is_padding, keys] each: "
            + _differing(want, got, "run {}".format),
        )
    tail = [
        _differing(np.full(len(qsl) - m, n_r), qsl[m:], "query_start_loc[{}]".format, m),
        _differing(np.zeros_like(keys[m:]), keys[m:], "seq_lens[{}]".format, m),
        _differing(np.zeros_like(request[m:]), request[m:], "request[{}]".format, m),
    ]
    if any(tail):
        detail = f"rank {r}'s runs past num_runs={m} are not empty: "
        _fail("attention runs", cfg, b, detail + "; ".join(t for t in tail if t))


def _check_spec(
    cfg: PCPConfig, b: Batch, states: list, codes: np.ndarray, is_decode: np.ndarray, whole: np.ndarray
) -> None:
    """The spec-decode prep ([`pcp_fn.spec`][]) under the layout, against per-token codes.

    Token `t` (scheduler order) has id and hidden state `t + 1` (0: none), so every row
    the ops return says which token it carries. A decode drafts `n - 1` tokens.
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
    wrong = _wrongly_held(cfg, b, seen, whole, where="in the drafter's first pass (first_pass_rows), ")
    if wrong:
        _fail("spec-decode", cfg, b, _excerpt(wrong))


class _SpecCase(NamedTuple):
    """One batch under the spec-decode rules: token `t` (scheduler order) has id and hidden
    state `t + 1` (0: none)."""

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
    """The spec ops' inputs for `b`: the ids and hidden states of its tokens (`codes`: each
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
    """What the runner samples (`spec_decode_indices`, drafts read from the rank's rows): each
    request's last `drafts + 1` tokens, and the decodes' draft tokens as draft ids."""
    cfg, b, starts, drafts = case.cfg, case.b, case.starts, case.drafts
    _, idx = spec_decode_indices(state, drafts, case.code[r])
    ns, nd = int(idx.num_sampled), int(idx.num_drafts)
    cu, got = _np(idx.cu_num_sampled_tokens), case.restored[_np(idx.logits_indices)]
    for i, n in enumerate(b.sched):  # request i's sampled slots (an empty request's is never read)
        s_i = int(drafts[i]) + 1
        want = starts[i] + n - s_i + 1 + np.arange(s_i)
        if n and (cu[i] > ns or not np.array_equal(got[cu[i] - s_i : cu[i]], want)):
            rows = f"{cu[i] - s_i}..{cu[i] - 1}" + (f", past num_sampled={ns}" if cu[i] > ns else "")
            _fail(
                "spec-decode",
                cfg,
                b,
                f"rank {r}'s spec_decode_indices logits rows {rows} of request {i} do not hold its last "
                f"{s_i} tokens (values: the ids of the restored rows, t + 1 for token t): "
                + _differing(want, got[max(cu[i] - s_i, 0) : cu[i]], "logits row {}".format, cu[i] - s_i),
            )
    dec_drafts = [starts[i] + 2 + np.arange(int(drafts[i])) for i in range(len(b.sched)) if case.decode[i]]
    want = np.concatenate(dec_drafts + [[]]).astype(np.int64)
    if not np.array_equal(_np(idx.draft_token_ids)[:nd], want):
        detail = f"rank {r}'s draft_token_ids are not the decodes' draft tokens (token t's id is t + 1): "
        _fail(
            "spec-decode", cfg, b, detail + _differing(want, _np(idx.draft_token_ids)[:nd], "draft {}".format)
        )
    return idx


def _check_decode_hidden_states(case: _SpecCase, r: int, state: PCPState) -> None:
    """`decode_hidden_states`: the decode tokens' hidden states in order, without the replication."""
    b, starts = case.b, case.starts
    want = np.concatenate(
        [starts[i] + 1 + np.arange(n) for i, n in enumerate(b.sched) if case.decode[i]] + [[]]
    )
    _, dec = decode_hidden_states(state, case.hidden)
    if not np.array_equal(_np(dec)[: want.size], want) or _np(dec)[want.size :].any():
        full = np.zeros_like(_np(dec))
        full[: want.size] = want
        detail = (
            f"rank {r}'s decode_hidden_states are not the decode tokens' states in order, 0 after (token "
            "t's hidden state is t + 1): "
        )
        _fail("spec-decode", case.cfg, b, detail + _differing(full, _np(dec)))


class _DraftRows(NamedTuple):
    """A rank's rows of the drafter's first pass (the layout's `first_pass_rows`)."""

    request: np.ndarray  # [L_b] request of each row
    offset: np.ndarray  # [L_b] the row's offset inside its request's padded tokens
    num_rows: int  # valid rows
    counts: np.ndarray  # [R_b] valid rows of each request
    real: np.ndarray  # [L_b] bool the row holds a scheduled token (not a pad)
    token: np.ndarray  # [L_b] int64 the id (and hidden state) the row must carry, 0 on pads


def _first_pass_rows(case: _SpecCase, state: PCPState) -> _DraftRows:
    """The layout's first-pass rows of `state`'s rank and the token each must carry."""
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
    """`first_pass_inputs` gives the first pass the layout's rows, each with its own token's id and
    restored hidden state (pads 0), and samples each request's last token (`P > 1`; at `P = 1`
    it passes its inputs through)."""
    cfg, b, P, R = case.cfg, case.b, case.cfg.pcp_size, len(case.b.sched)
    tis = idx.bonus_logits_indices  # a decode samples its bonus token
    positions = torch.zeros(case.bucket.num_tokens, dtype=torch.int64)
    _, fp = first_pass_inputs(
        state, case.full, positions, case.hidden, tis, idx.logits_indices, idx.num_sampled
    )
    if P == 1:
        return  # passed through
    qsl = np.concatenate([[0], np.cumsum(rows.counts)])
    ids, hid, tok, real = _np(fp.input_ids), _np(fp.hidden_states), rows.token, rows.real
    if int(fp.num_tokens) != rows.num_rows or not np.array_equal(_np(fp.query_start_loc), qsl):
        _fail(
            "spec-decode",
            cfg,
            b,
            f"rank {r}'s first_pass_inputs rows are not first_pass_rows' (num_tokens: expected "
            f"{rows.num_rows}, got {int(fp.num_tokens)}): "
            + (
                _differing(qsl, _np(fp.query_start_loc), "query_start_loc[{}]".format)
                or "the same query_start_loc"
            ),
        )
    want_hid = np.where(real, tok, 0)
    if not np.array_equal(ids, tok) or not np.array_equal(hid, want_hid):
        detail = (
            f"rank {r}'s first-pass rows do not carry their tokens' ids and hidden states (token t's: "
            "t + 1; 0 on a pad row), [id, hidden state] each: "
        )
        _fail(
            "spec-decode", cfg, b, detail + _differing(np.stack([tok, want_hid], 1), np.stack([ids, hid], 1))
        )
    sampled = case.restored[_np(fp.token_indices_to_sample)[:R]]
    sched = case.sched[:R]
    if R and not np.array_equal(sampled[sched > 0], case.starts[1:][sched > 0]):
        want = np.where(sched > 0, case.starts[1:], sampled)  # the last token's id (an empty request: any)
        detail = (
            f"rank {r}'s first pass does not sample each request's last token (values: the id of the "
            "restored row it samples, t + 1 for token t): "
        )
        _fail("spec-decode", cfg, b, detail + _differing(want, sampled, "request {}".format))


def _check_split_prefill(case: _SpecCase, r: int, state: PCPState, rows: _DraftRows) -> None:
    """`split_prefill_for_draft`: the first-pass rows after the decodes', with their tokens."""
    cfg, b, decode = case.cfg, case.b, case.decode
    _, sp = split_prefill_for_draft(state, case.full, case.hidden)
    D = int(case.sched[decode].sum())
    k = int(sp.num_tokens)
    prefills = np.flatnonzero(~decode[: len(b.sched)])  # the prefill requests, in order
    lens = rows.counts[~decode][: prefills.size]
    if k != rows.num_rows - D or not np.array_equal(_np(sp.seq_lens)[: lens.size], lens):
        _fail(
            "spec-decode",
            cfg,
            b,
            f"rank {r}'s split_prefill_for_draft rows are not its first-pass rows after the decodes' "
            f"(num_tokens: expected {rows.num_rows - D}, got {k}): "
            + (
                _differing(
                    lens, _np(sp.seq_lens)[: lens.size], lambda k: f"seq_lens[{k}] (request {prefills[k]})"
                )
                or "the same seq_lens"
            ),
        )
    tok = rows.token[D : rows.num_rows]
    got = np.stack([_np(sp.input_ids)[:k], _np(sp.hidden_states)[:k]], 1)
    if not np.array_equal(got, np.stack([tok, tok], 1)):
        detail = (
            f"rank {r}'s split_prefill_for_draft rows do not carry their tokens (token t's id and hidden "
            "state: t + 1), [id, hidden state] each: "
        )
        _fail("spec-decode", cfg, b, detail + _differing(np.stack([tok, tok], 1), got))


def _num_decodes(cfg: PCPConfig, b: Batch) -> int:
    return int(classify_decodes(cfg, *(np.asarray(x, np.int64) for x in (b.sched, b.comp, b.prompt))).sum())


def _counting_backend() -> tuple[list[int], Any]:
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    return graphs, backend


def check_graphs(cfg: PCPConfig, R: int, T: int) -> None:
    """No host sync, `fullgraph=True` compile with one graph per bucket (equal to eager), export."""
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
    eager, counts = _eager_and_compiled(cfg, "step", step, [(state, x) for x in (*made, small)])
    want = 2 - (small.bucket == cfg.capacity)
    if counts[1] != 1 or counts[2] != want:
        raise LayoutCheckError(
            f"{_graph_failure(cfg)}: step made {counts[1]} graphs for two batches of one bucket "
            f"({b1.sched} and {b2.sched} tokens in {cfg.capacity}), expected 1, and {counts[2]} with a "
            f"third bucket ({small.bucket}), expected {want}: a graph must depend on the bucket only "
            "(a Python branch or a shape read from a batch's values recompiles)"
        )
    runs_states = [(st,) for st, _ in eager[:2]]
    runs_counts = _eager_and_compiled(cfg, "attention_runs", attention_runs, runs_states)[1]
    if runs_counts[-1] != 1:
        raise LayoutCheckError(
            f"{_graph_failure(cfg)}: attention_runs made {runs_counts[-1]} graphs for two states of one "
            "bucket, expected 1 (the layout's state_local_rows depends on more than the bucket)"
        )
    try:
        export(step, state, made[0])
    except Exception as e:
        raise LayoutCheckError(
            f"{_graph_failure(cfg)}: torch.export of step fails: {e}{_module_hint(e)}"
        ) from e


def _graph_failure(cfg: PCPConfig) -> str:
    """`layout 'x' fails the graph checks at P=2 (R=6, T=48)`: how a graph failure starts."""
    return f"layout {cfg.layout_name!r} fails the graph checks at {_config_text(cfg)}"


def _module_hint(error: BaseException) -> str:
    """What to do when Dynamo could not import a traced function's module (`""` for any other
    error): it imports each module by the name its globals hold (`__name__`)."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, ModuleNotFoundError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return ""
    return (
        f". torch.compile (Dynamo) imports the module of every function it traces by its __name__, "
        f"and no module {seen.name!r} is importable: the layout's code (or code it calls) was run from a "
        "file by path or exec'd. Import that file as a module, or register it before running it: "
        "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module; "
        "spec.loader.exec_module(module)"
    )


def _eager_and_compiled(
    cfg: PCPConfig, what: str, fn: Any, calls: list[tuple[Any, ...]]
) -> tuple[list[Any], list[int]]:
    """`fn(*args)` for each `args` of `calls` under `no_host_syncs`, then compiled with
    `fullgraph=True` (equal to eager); returns the eager outputs and the graphs made so far
    after each compiled call."""
    try:
        with no_host_syncs():
            eager = [fn(*args) for args in calls]
    except Exception as e:
        raise LayoutCheckError(
            f"{_graph_failure(cfg)}: a host sync inside {what} (a device value read on the host: "
            f".item(), int(tensor), a Python branch on a tensor, a shape from a tensor's values): {e}"
        ) from e
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
            f"{_graph_failure(cfg)}: {what} does not compile with fullgraph=True: {e}{_module_hint(e)}"
        ) from e
    finally:
        torch._dynamo.reset()
    for k, (e_out, c_out) in enumerate(zip(eager, compiled)):
        for (path, a), (_, c) in zip(_tensor_leaves(e_out), _tensor_leaves(c_out)):
            if not torch.equal(a, c):
                raise LayoutCheckError(
                    f"{_graph_failure(cfg)}: the compiled {what} differs from the eager one on call {k}, "
                    f"output{path} (expected: eager): {_differing(_np(a).reshape(-1), _np(c).reshape(-1))}"
                )
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
    """The spec-decode prep under the layout: no host sync, `fullgraph=True`, compiled equal to eager."""
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
    _eager_and_compiled(cfg, "spec-decode prep", _draft_prep, [args])


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
    seed: int | None = None,
) -> None:
    """Check `layout` against the [`pcp_fn.Layout`][] invariants (module docstring).

    With the defaults it runs 80 capacity-edge batches (5 at each `P` and spec count), 20
    hypothesis batches and the graph checks at `P = 2`: a few seconds on a CPU. Every run draws
    the same batches (hypothesis' `derandomize`); it writes no file (no `.hypothesis/` folder).

    Args:
        layout: a [`pcp_fn.Layout`][] object, registered under its `name` if it is not yet
            ([`pcp_fn.register_layout`][]: another instance of the same class, a re-run notebook
            cell, replaces the one registered), or the name of a registered or built-in layout.
        pcp_sizes: the `P` values of the exactness checks: each hypothesis batch draws one, the
            capacity edges run at each. Empty: no exactness check (the graph checks alone).
        max_examples: how many hypothesis batches (drawn over `pcp_sizes` and the spec counts).
            0: none (the capacity edges and graph checks alone). More examples, more batch shapes.
        max_num_reqs: every config's `R` (request rows); the batches fill it, the capacity
            edges reach it exactly.
        max_num_tokens: every config's `T` (tokens of a step); the batches fill it, the
            capacity edges reach it exactly.
        num_spec_tokens: the configs have 0 or this many speculative tokens (each batch draws one;
            decodes of `1 .. 1 + num_spec_tokens` tokens, drafting `n - 1`); with spec tokens the
            spec-decode prep is checked too. 0: no speculative decoding (a layout that refuses spec
            tokens in its `check_config`, like `"mrv2-sharded"`, needs it).
        graph_pcp_sizes: the `P` values of the graph checks (no host sync, one
            `torch.compile(fullgraph=True)` graph per bucket, `torch.export`; about a second each).
            Empty: no graph check. A layout from a file run by path (`runpy.run_path`) has its
            module put in `sys.modules` for them, where Dynamo imports it.
        edges: also run the capacity-edge batches at every `P` of `pcp_sizes` and spec count.
        dcp_size: every config's decode context parallelism (a layout may split differently under it).
        seed: a random seed for the hypothesis batches: the same `seed=` draws the same batches
            on every run, another value others. `None` (default): derandomized, the same batches
            on every run (hypothesis' `derandomize=True`).

    Raises:
        LayoutCheckError: the layout breaks a rule. The message names the rule, the config and
            the batch (hypothesis shrinks it to the smallest failing one it finds), then the rank
            and the first differing rows, each with its expected and its actual value.
        ValueError / TypeError: an argument out of its range, a name that is neither registered
            nor built in, a layout object whose name another layout holds (the message says how to
            free it), or a config the layout refuses (its `check_config`: pass the `pcp_sizes`,
            `num_spec_tokens` and `dcp_size` it serves).
    """
    _check_arguments(pcp_sizes, graph_pcp_sizes, max_examples, num_spec_tokens, edges, random_seed=seed)
    name = _registered_name(layout)
    R, T = max_num_reqs, max_num_tokens
    spec_counts = sorted({0, num_spec_tokens})
    configs = _configs(name, sorted({*pcp_sizes, *graph_pcp_sizes}), spec_counts, R, T, dcp_size)
    if edges:
        for P in pcp_sizes:
            for spec in spec_counts:
                for b in edge_batches(R, T):
                    check_batch_exact(configs[P, spec], b)
    if max_examples and pcp_sizes:
        _check_examples(configs, list(pcp_sizes), spec_counts, R, T, max_examples, random_seed=seed)
    for P in graph_pcp_sizes:
        for spec in spec_counts:
            try:  # a config none of the batches above ran: init_state's first run of the layout
                init_state(configs[P, spec])
            except LayoutError as e:
                _refused(configs[P, spec], e)
    with _importable_modules(get_layout(name)):
        for P in graph_pcp_sizes:
            check_graphs(configs[P, 0], R, T)
            if num_spec_tokens:
                check_spec_graphs(configs[P, num_spec_tokens], R, T)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _check_arguments(
    pcp_sizes: Any,
    graph_pcp_sizes: Any,
    max_examples: Any,
    num_spec_tokens: Any,
    edges: Any,
    random_seed: Any,
) -> None:
    """`TypeError` / `ValueError` naming the [`check_layout`][pcp_fn.testing.check_layout] argument
    out of its range (the configs' own fields are [`pcp_fn.PCPConfig`][]'s to check)."""
    for key, sizes in (("pcp_sizes", pcp_sizes), ("graph_pcp_sizes", graph_pcp_sizes)):
        if isinstance(sizes, str | bytes) or not isinstance(sizes, Sequence):
            raise TypeError(f"check_layout: {key} must be a sequence of ints, got {sizes!r}")
        if not all(_is_int(p) and p >= 1 for p in sizes):
            raise ValueError(f"check_layout: {key} must hold ints >= 1 (pcp_size values), got {sizes!r}")
    for key, value in (("max_examples", max_examples), ("num_spec_tokens", num_spec_tokens)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"check_layout: {key} must be an int >= 0, got {value!r}")
    if not isinstance(edges, bool):
        raise TypeError(f"check_layout: edges must be a bool, got {edges!r}")
    if random_seed is not None and not _is_int(random_seed):
        raise TypeError(f"check_layout: seed= takes an int (a random seed) or None, got {random_seed!r}")


def _registered_name(layout: Layout | str) -> str:
    """The registry name of `layout`, registering a layout object under it."""
    if isinstance(layout, str):
        return get_layout(layout).name  # ValueError naming the registered layouts
    try:
        return register_layout(layout).name
    except ValueError as e:
        raise ValueError(
            f"check_layout registers the layout it checks: {e} (pcp_fn.register_layout(layout, "
            f"replace=True), or pcp_fn.unregister_layout({layout.name!r}), then check_layout again)"
        ) from e


def _configs(
    name: str, sizes: Sequence[int], spec_counts: Sequence[int], R: int, T: int, dcp_size: int
) -> dict[tuple[int, int], PCPConfig]:
    """`(P, spec tokens) -> PCPConfig` of every config the checks run, made before any runs: a
    config the layout refuses (its `check_config`) is an argument error, named at once."""
    configs = {}
    for P in sizes:
        for spec in spec_counts:
            try:
                configs[P, spec] = PCPConfig(P, 0, R, T, num_spec_tokens=spec, dcp_size=dcp_size, layout=name)
            except ValueError as e:
                raise ValueError(
                    f"check_layout: no config of layout {name!r} at P={P} (R={R}, T={T}, num_spec_tokens="
                    f"{spec}, dcp_size={dcp_size}): {e}. Pass the pcp_sizes, graph_pcp_sizes, "
                    "num_spec_tokens and dcp_size the layout serves (num_spec_tokens=0: no spec tokens)"
                ) from e
    return configs


def _check_examples(
    configs: dict[tuple[int, int], PCPConfig],
    pcp_sizes: list[int],
    spec_counts: list[int],
    R: int,
    T: int,
    max_examples: int,
    random_seed: int | None,
) -> None:
    """`check_batch_exact` on `max_examples` hypothesis batches: the same batches every run (the
    `seed=` given, or derandomized), no file written, one
    [`LayoutCheckError`][pcp_fn.testing.LayoutCheckError] raised (the smallest failing batch's), not
    an exception group of every distinct failure."""

    @settings(
        parent=settings.get_profile("default"),  # whatever profile the caller's tests load
        max_examples=max_examples,
        derandomize=random_seed is None,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        print_blob=False,  # a reproduce_failure blob names this function, not the user's code
        verbosity=Verbosity.quiet,  # no "Failing test case: exact(...)" note: the message names the batch
        phases=(Phase.explicit, Phase.generate, Phase.shrink),  # no explain phase: it names our lines
        suppress_health_check=list(HealthCheck),
    )
    @given(P=st.sampled_from(pcp_sizes), spec=st.sampled_from(spec_counts), data=st.data())
    def exact(P: int, spec: int, data: Any) -> None:
        check_batch_exact(configs[P, spec], data.draw(batches(R, T, spec), label="batch"))

    if random_seed is not None:
        exact = hypothesis.seed(random_seed)(exact)
    with _hypothesis_scratch_home():
        exact()


@contextlib.contextmanager
def _hypothesis_scratch_home() -> Iterator[None]:
    """Hypothesis keeps a cache of the local modules' constants under `.hypothesis/` in the current
    folder, even with `database=None`: it goes to a temporary folder, removed after the run."""
    previous = getattr(hypothesis_configuration, "__hypothesis_home_directory", None)
    with tempfile.TemporaryDirectory(prefix="pcp_fn_check_layout_") as scratch:
        hypothesis_configuration.set_hypothesis_home_dir(scratch)
        try:
            yield
        finally:
            hypothesis_configuration.set_hypothesis_home_dir(previous)


@contextlib.contextmanager
def _importable_modules(layout: object) -> Iterator[None]:
    """Dynamo reads a traced function's globals through its module, imported by the name the globals
    hold (`__name__`): a layout run from a file by path (`runpy.run_path`; importlib without
    `sys.modules[name] = module`) has a module no import finds, and every graph check would fail
    with `ModuleNotFoundError`. For the graph checks, such a module is put in `sys.modules` (the
    layout's package module itself, or a module holding the same globals) and taken out after."""
    package = getattr(layout, "package", None)
    added: dict[str, types.ModuleType] = {}
    for scope in _code_scopes(layout):
        name = scope.get("__name__")
        if isinstance(name, str) and name not in sys.modules:
            if isinstance(package, types.ModuleType) and vars(package) is scope:
                module = package
            else:
                module = types.ModuleType(name)
                vars(module).update(scope)
            sys.modules[name] = added[name] = module
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)
        if added:
            _forget_dynamo_imports(list(added.values()))


def _code_scopes(layout: object) -> list[dict[str, Any]]:
    """The globals of the layout's own functions: its class's and bases' methods, the functions it
    holds (a [`pcp_fn.PackageLayout`][]'s), its package module's."""
    found = [*getattr(layout, "__dict__", {}).values()]
    for cls in type(layout).__mro__:
        found += vars(cls).values()
    package = getattr(layout, "package", None)
    if isinstance(package, types.ModuleType):
        found += vars(package).values()
    scopes: dict[int, dict[str, Any]] = {}
    for obj in found:
        fn = getattr(obj, "__func__", obj)  # a bound method, staticmethod or classmethod
        fn = getattr(fn, "fget", fn)  # a property
        scope = getattr(fn, "__globals__", None)
        if isinstance(scope, dict):
            scopes[id(scope)] = scope
    return list(scopes.values())


def _forget_dynamo_imports(modules: list[types.ModuleType]) -> None:
    """Dynamo keeps each module it imported by name, in a cache (`_import_module`) and as an
    `__import_<name>` global of the module it traced: drop `modules` from both (private, where
    this torch has them), so that a later check of a module of the same name (every file
    `runpy.run_path` runs is `<run_path>`) imports its own."""
    cached = getattr(getattr(torch._dynamo, "symbolic_convert", None), "_import_module", None)
    if callable(getattr(cached, "cache_clear", None)):
        cached.cache_clear()
    ours = {id(m) for m in modules}
    for module in list(sys.modules.values()):
        scope = getattr(module, "__dict__", None)
        if isinstance(scope, dict):
            for key in [k for k in scope if k.startswith("__import_") and id(scope[k]) in ours]:
                del scope[key]


__all__ = ["Batch", "LayoutCheckError", "batches", "check_layout", "edge_batches"]
