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
  (a decode on every rank when ``P > 1``, any other token on exactly one), rows
  grouped by request, ``query_start_loc`` counting them, padding at the tail;
- positions ``num_computed + offset`` on real rows, 0 on padding;
- restore: ``restore_hidden_states`` of the rank-major all-gather puts every token
  once, in request order, at the rows ``restored_spans`` names;
- slots: every scheduled slot exactly once in ``padded_slot_mapping``, the other
  rows ``pad_slot_id``; logits rows land on each request's last token;
- fixed shapes: every output's shapes are those of an empty batch of the same bucket;
- ``all_ranks`` (``vmap`` over the rank) equals each rank's own static-rank step.

Then, for ``graph_pcp_sizes``: ``no_host_syncs``, ``torch.compile(fullgraph=True)``
with one graph per bucket (two batches of a bucket: one graph; a third bucket: one
more), compiled equal to eager, and ``torch.export`` with static shapes.
Needs ``hypothesis`` (the ``test`` extra).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .core.layout_protocol import Layout, register_layout
from .core.rank import all_ranks
from .dcs.batch import classify_decodes, make_batch
from .dcs.config import PCPConfig
from .dcs.state import init_state
from .graph.export import export
from .graph.sync import no_host_syncs
from .logits import get_logits_indices
from .restore import restore_hidden_states
from .slots import padded_slot_mapping
from .step import step

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
    except Exception as e:  # the layout raised: that is a failure of the layout, with the batch named
        _fail("the ops", cfg, b, f"{type(e).__name__}: {e}")


def _check_batch_exact(cfg: PCPConfig, b: Batch) -> None:
    P, R = cfg.pcp_size, len(b.sched)
    total = sum(b.sched)
    batch = make_batch(cfg, b.sched, b.comp, b.prompt, slot_mapping=[SLOT_BASE + t for t in range(total)])
    Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
    G = P * Lb
    bound = cfg.layout_impl.num_local_tokens(cfg, np.asarray(b.sched, np.int64), _num_decodes(cfg, b))
    # vmap over ranks, and each rank's own (static-rank) step
    _, outs = all_ranks(step, init_state(cfg, rank=0), batch)
    statics = []
    for r in range(P):
        cfg_r = dataclasses.replace(cfg, pcp_rank=r)
        st_r, out_r = step(init_state(cfg_r), batch)
        statics.append((st_r, out_r))
        for a, c in zip(_tensors(out_r), _tensors(outs)):
            if not torch.equal(a, c[r]):
                _fail("vmap over ranks", cfg, b, f"all_ranks differs from rank {r}'s own step")
    # fixed shapes: an empty batch forced to the same bucket gives identical shapes
    empty = make_batch(cfg, [], [], [], slot_mapping=[], bucket=batch.bucket)
    if _shapes(step(init_state(cfg), empty)) != _shapes(statics[0]):
        _fail("fixed shapes", cfg, b, f"shapes depend on the batch, not only on the bucket {batch.bucket}")
    is_decode = _np(outs.layout.is_decode[0])[:R].astype(bool)
    starts = np.concatenate([[0], np.cumsum(b.sched)]).astype(np.int64)
    held: dict[tuple[int, int], list[int]] = {}
    codes = np.full((P, Lb), -1, np.int64)
    for r in range(P):
        st_r, out = statics[r]
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
        for l in np.flatnonzero(real):
            held.setdefault((int(req[l]), int(pos[l])), []).append(r)
        codes[r, :n_r] = np.where(real, starts[np.minimum(req[:n_r], max(R - 1, 0))] + pos[:n_r], -1)
    for i, n in enumerate(b.sched):
        owners = list(range(P)) if (P > 1 and is_decode[i]) or P == 1 else None
        for j in range(n):
            ranks = held.pop((i, j), [])
            if (owners is not None and sorted(ranks) != owners) or (owners is None and len(ranks) != 1):
                _fail("ownership", cfg, b, f"token {j} of request {i} is on ranks {ranks}")
    if held:
        _fail("ownership", cfg, b, f"rows of tokens that are not scheduled: {sorted(held)[:5]}")
    # restore: the rank-major all-gather of each rank's token codes
    st0 = statics[0][0]
    _, restored = restore_hidden_states(st0, torch.from_numpy(codes.reshape(G)))
    restored = _np(restored)
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
    if (
        not np.array_equal(np.flatnonzero(taken), np.sort(np.flatnonzero(taken)))
        or (np.diff(start[[i for i, n in enumerate(b.sched) if n]]) < 0).any()
    ):
        _fail("restore", cfg, b, "requests are not restored in request order")
    # logits
    logits = _np(statics[0][1].logits_indices)
    _, via_op = get_logits_indices(st0)
    if not np.array_equal(_np(via_op), logits):
        _fail("logits", cfg, b, "get_logits_indices differs from step's logits_indices")
    for i, n in enumerate(b.sched):
        # the row holds (a copy of) the last token: hybrid samples a decode from rank P-1's copy
        if n and (not 0 <= logits[i] < G or restored[logits[i]] != starts[i] + n - 1):
            _fail("logits", cfg, b, f"request {i}'s logits row {logits[i]} is not its last token's")
    if (logits[R:] != 0).any():
        _fail("logits", cfg, b, "logits rows past num_reqs are not 0")
    # slots: every scheduled slot once, pad_slot_id elsewhere; padded_slot_mapping == step's
    for r in range(P):
        st_r, out = statics[r]
        sm = _np(out.slot_mapping)
        if sm.shape != (G,):
            _fail("slots", cfg, b, f"slot_mapping has shape {sm.shape}, not [P*L_b] = ({G},)")
        real = sm[sm != cfg.pad_slot_id]
        if not np.array_equal(np.sort(real), SLOT_BASE + np.arange(total)):
            _fail("slots", cfg, b, f"rank {r}'s slot mapping does not hold every slot exactly once")
        _, again = padded_slot_mapping(st_r, batch.slot_mapping)
        if not np.array_equal(_np(again), sm):
            _fail("slots", cfg, b, "padded_slot_mapping differs from step's slot_mapping")


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
    try:
        with no_host_syncs():
            eager = [step(state, x) for x in made]
            step(state, small)
    except Exception as e:
        raise LayoutCheckError(f"layout {layout_name!r}: a host sync inside step: {e}") from e
    graphs, backend = _counting_backend()
    torch._dynamo.reset()
    fn = torch.compile(step, fullgraph=True, dynamic=False, backend=backend)
    try:
        compiled = [fn(state, x) for x in made]
        one = len(graphs)
        fn(state, small)
    except Exception as e:
        raise LayoutCheckError(
            f"layout {layout_name!r}: step does not compile with fullgraph=True: {e}"
        ) from e
    finally:
        torch._dynamo.reset()
    if one != 1 or len(graphs) != 2 - (small.bucket == cfg.capacity):
        raise LayoutCheckError(
            f"layout {layout_name!r}: {one} graphs for two batches of one bucket, {len(graphs)} with a "
            "third bucket: a graph must depend on the bucket only"
        )
    for e_out, c_out in zip(eager, compiled):
        if not all(torch.equal(a, c) for a, c in zip(_tensors(e_out), _tensors(c_out))):
            raise LayoutCheckError(f"layout {layout_name!r}: the compiled step differs from the eager one")
    try:
        export(step, state, made[0])
    except Exception as e:
        raise LayoutCheckError(f"layout {layout_name!r}: torch.export of step fails: {e}") from e


def check_layout(
    layout: Layout | str,
    *,
    pcp_sizes: Sequence[int] = tuple(range(1, 9)),
    max_examples: int = 20,
    max_num_reqs: int = 6,
    max_num_tokens: int = 48,
    num_spec_tokens: int = 0,
    graph_pcp_sizes: Sequence[int] = (2,),
    edges: bool = True,
) -> None:
    """Check ``layout`` against the :class:`pcp_fn.Layout` invariants (module docstring).

    Args:
        layout: a :class:`pcp_fn.Layout` (registered by its name if it is not yet) or a name.
        pcp_sizes: the ``P`` values the hypothesis batches use (each example draws one).
        max_examples: hypothesis examples (batches), spread over ``pcp_sizes``.
        max_num_reqs, max_num_tokens: the configs' ``R`` and ``T``.
        num_spec_tokens: decodes of ``1 .. 1 + num_spec_tokens`` tokens.
        graph_pcp_sizes: the ``P`` values of the graph checks (compiles: seconds each).
        edges: also run the capacity-edge batches at every ``P`` of ``pcp_sizes``.

    Raises :class:`LayoutCheckError` naming the rule, the config and the smallest failing batch.
    """
    name = layout if isinstance(layout, str) else register_layout(layout).name
    R, T = max_num_reqs, max_num_tokens

    def config(P: int) -> PCPConfig:
        return PCPConfig(P, 0, R, T, num_spec_tokens=num_spec_tokens, layout=name)

    if edges:
        for P in pcp_sizes:
            for b in edge_batches(R, T):
                check_batch_exact(config(P), b)

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(P=st.sampled_from(list(pcp_sizes)), b=batches(R, T, num_spec_tokens))
    def exact(P: int, b: Batch) -> None:
        check_batch_exact(config(P), b)

    exact()
    for P in graph_pcp_sizes:
        check_graphs(config(P), R, T)


__all__ = ["Batch", "LayoutCheckError", "batches", "check_layout", "edge_batches"]
