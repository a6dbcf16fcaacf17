"""A new layout's first run: [`pcp_fn.init_state`][] checks it on a few canonical batches.

The serving path reads no device value on the host, so it cannot check a layout on the batches
it serves: a layout whose `num_local_tokens` is one short would have a
[`pcp_fn.PartitionLayout`][] cut a run at the bucket's end and drop its token, one that puts a
token on no rank (or on two) would restore a wrong row, and a step would still run. What the
serving path can do without a sync, it does here: the first `init_state` of a config whose layout
is not a built-in runs the layout once, eagerly, on the CPU, for every rank, on a handful of small
batches made on the host (a fresh and a chunked prefill, decodes, one-token prefills, an empty
request), each in the exact bucket the layout's own `num_local_tokens` asks for, and checks
[`pcp_fn.testing.check_layout`][]'s capacity, ownership, positions, restore, slots and logits
rules on them (the built-ins are checked by the test suite). A failure raises
[`LayoutError`][pcp_fn.protocol.LayoutError] (a `ValueError`) naming the rule and the batch; a
config passes once per process (cached).

It is a smoke test, not a proof: a layout wrong only on other batches passes it.
[`pcp_fn.testing.check_layout`][] is the full check (hypothesis batches, the capacity edges,
spec decode, capturability).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..core.buckets import Bucket
from .batch import check_local_bound, classify_decodes, make_batch
from .config import PCPConfig
from .registry import LayoutError, is_builtin

Counts = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # scheduled, computed, prompt

# (layout object id, config.shared) -> the layout object: configs whose layout passed (the object
# kept alive so that its id is not reused)
_PASSED: dict[tuple[int, PCPConfig], object] = {}


def check_new_layout(config: PCPConfig, rank_state: Callable[[PCPConfig], Any]) -> None:
    """Check `config`'s layout on the canonical batches (module docstring), unless it is a built-in
    or passed for this config already. `rank_state(config_r)`: a fresh CPU state of `config_r`
    (`config` at rank `r`)."""
    impl = config.layout_impl
    key = (id(impl), config.shared)
    if key in _PASSED or is_builtin(impl):
        return
    shared = config.shared
    ranks = [dataclasses.replace(shared, pcp_rank=r) if r else shared for r in range(shared.pcp_size)]
    states = [rank_state(c) for c in ranks]
    for counts in canonical_batches(config):
        try:
            _check_batch(config, impl, states, counts)
        except LayoutError:
            raise
        except Exception as e:  # the layout raised: name it and the batch
            _fail(config, counts, "the ops", f"{type(e).__name__}: {e}")
    _PASSED[key] = impl


def canonical_batches(config: PCPConfig) -> list[Counts]:
    """The small batches a new layout is first run on, within the config's `R` and `T`: a fresh
    and a chunked prefill of `4P + 3` tokens (uneven chunks), a `decode_threshold`-token decode
    then a prefill, one-token prefills (the most rows per token), decodes alone, and a decode, an
    empty request and a prefill."""
    R, T, P = config.max_num_reqs, config.max_num_tokens, config.pcp_size
    m, d = min(4 * P + 3, T), min(config.decode_threshold, T)
    k = min(R, T, 2 * P + 1)
    candidates: list[Counts] = [
        ((m,), (0,), (m,)),
        ((m,), (7,), (8 + m,)),
        ((d, min(m, T - d)), (9, 0), (9, min(m, T - d))),
        ((1,) * k, (0,) * k, (1,) * k),
        ((1,) * min(k, P + 1), (9,) * min(k, P + 1), (9,) * min(k, P + 1)),
        ((1, 0, min(m, T - 1)), (9, 0, 0), (9, 5, min(m, T - 1))),
    ]
    out: list[Counts] = []
    for c in candidates:
        if len(c[0]) <= R and sum(c[0]) <= T and c not in out:
            out.append(c)
    return out


def _fail(config: PCPConfig, counts: Counts, rule: str, detail: str) -> None:
    sched, comp, prompt = counts
    raise LayoutError(
        f"layout {config.layout_name!r} breaks {rule} at P={config.pcp_size} (R={config.max_num_reqs}, "
        f"T={config.max_num_tokens}), num_scheduled={list(sched)} num_computed={list(comp)} "
        f"num_prompt={list(prompt)}: {detail} (init_state runs a layout that is not a built-in on a "
        f"few canonical batches; pcp_fn.testing.check_layout({config.layout_name!r}) checks it in full)",
        rule,
    )


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _check_batch(config: PCPConfig, impl: Any, states: list[Any], counts: Counts) -> None:
    """Every rank's `build` of one canonical batch, in the bucket the layout's bound asks for."""
    sched, comp, prompt = (np.asarray(c, np.int64) for c in counts)
    total = int(sched.sum())
    num_decodes = int(classify_decodes(config, sched, comp, prompt).sum())
    try:
        bound = check_local_bound(config, impl.num_local_tokens(config, sched, num_decodes, comp), total)
    except (TypeError, ValueError) as e:  # make_batch would refuse it too: a LayoutError or a TypeError
        _fail(config, counts, "capacity", str(e))
    bucket = Bucket(max(len(sched), 1), max(bound, 1))  # exact: a bound one short cuts a token
    batch = make_batch(config, sched, comp, prompt, slot_mapping=range(total), bucket=bucket)
    ups = [impl.build(state, batch) for state in states]
    starts = np.concatenate([[0], np.cumsum(sched)])
    codes, replicated = _check_rows(config, counts, ups, bound, starts)
    restored = _np(codes.reshape(-1)[impl.restore_index(ups[0].state)])
    _check_restore(config, counts, impl.restored_spans(ups[0].state), restored, starts)
    logits = _np(impl.logits_from_geometry(config, ups[0].geometry, batch.num_reqs))[: len(sched)]
    for i, n in enumerate(counts[0]):
        if n and not (0 <= logits[i] < restored.shape[0] and restored[logits[i]] == starts[i + 1] - 1):
            _fail(config, counts, "logits", f"request {i}'s logits row {logits[i]} is not its last token")
    up = ups[0]
    slots = _np(up.slot_token)[_np(up.layout.unpad_mask)]
    if not np.array_equal(np.sort(slots), np.arange(total)):
        _fail(config, counts, "slots", "the KV-slot rows (unpad_mask) do not carry every token exactly once")


def _check_rows(
    config: PCPConfig, counts: Counts, ups: list[Any], bound: int, starts: np.ndarray
) -> tuple[torch.Tensor, np.ndarray]:
    """Capacity, ownership and positions of every rank's rows. Returns the rank-major all-gather of
    each row's token (`[P, L_b]`, -1 on no token) and the requests the layout replicates."""
    sched, comp = (np.asarray(c + (0,), np.int64) for c in counts[:2])
    R = len(counts[0])
    replicated = _np(ups[0].geometry.replicated)[:R].astype(bool)
    held = np.zeros((config.pcp_size, int(starts[-1])), np.int64)  # copies of each token per rank
    codes = []
    for r, up in enumerate(ups):
        lay = up.layout
        n_r = int(lay.num_tokens)
        req, pos = _np(lay.request_index)[:n_r], _np(lay.positions)[:n_r]
        if n_r > bound:
            _fail(config, counts, "capacity", f"rank {r} holds {n_r} rows; num_local_tokens said {bound}")
        if n_r and (req.min() < 0 or req.max() >= R or pos.min() < 0 or (np.diff(req) < 0).any()):
            _fail(config, counts, "ownership", f"rank {r}'s rows are not requests of the batch, in order")
        real = pos < sched[req]
        if not np.array_equal(_np(up.positions)[:n_r][real], (comp[req] + pos)[real]):
            _fail(config, counts, "positions", f"rank {r}'s positions are not num_computed + offset")
        token = starts[req] + pos
        np.add.at(held[r], token[real], 1)
        code = torch.full(lay.positions.shape, -1, dtype=torch.int64)
        code[:n_r] = torch.from_numpy(np.where(real, token, -1))
        codes.append(code)
    request = np.repeat(np.arange(R), sched[:R])
    want = np.where(replicated[request], config.pcp_size, 1)
    copies, ranks = held.sum(0), held.max(0)
    wrong = np.flatnonzero((copies != want) | (ranks > 1))
    if wrong.size:
        t = int(wrong[0])
        i = int(request[t])
        on = np.flatnonzero(held[:, t]).tolist()
        _fail(config, counts, "ownership", f"token {t - starts[i]} of request {i} is on ranks {on}")
    return torch.stack(codes), replicated


def _check_restore(
    config: PCPConfig, counts: Counts, spans: Any, restored: np.ndarray, starts: np.ndarray
) -> None:
    """`gathered[restore_index]` holds request `i`'s tokens in order at the rows its span names."""
    start, length = _np(spans.start), _np(spans.length)
    for i, n in enumerate(counts[0]):
        if n == 0:
            continue
        s = int(start[i])
        if length[i] < n or s < 0 or s + n > restored.shape[0]:
            _fail(config, counts, "restore", f"request {i}'s restored span ({s}, {length[i]}) can't hold {n}")
        if not np.array_equal(restored[s : s + n], np.arange(starts[i], starts[i] + n)):
            got = restored[s : s + n].tolist()
            _fail(config, counts, "restore", f"request {i}'s restored rows hold {got}")
