"""pcp_fn.testing.check_layout: the three built-in layouts pass it, broken layouts fail it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.utils._pytree as pytree

import pcp_fn
from pcp_fn import testing
from pcp_fn.testing import LayoutCheckError, check_layout


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("dcs", {}),
        ("hybrid", {}),
        ("mrv2", {}),
        ("mrv2", {"dcp_size": 2}),  # short prefills replicated too
        ("mrv2-sharded", {"num_spec_tokens": 0}),  # decodes dealt round-robin
    ],
)
def test_builtin_layouts_conform(name, options):
    # P = 1..8 hypothesis batches (0 or 1 spec token) and the capacity edges; graphs at P = 3
    check_layout(name, max_examples=12, graph_pcp_sizes=(3,), **options)


@pytest.mark.parametrize("name", ["dcs", "hybrid", "mrv2"])
def test_builtin_layouts_conform_with_two_spec_tokens(name):
    check_layout(name, num_spec_tokens=2, max_examples=10, edges=False, graph_pcp_sizes=())


class _Overlapping(pcp_fn.MRV2Partition):
    """Each rank's head chunk runs one chunk too far: the next rank's tokens are held twice."""

    name = "test-broken-overlap"

    def segments(self, config, requests, rank):
        first, length = super().segments(config, requests, rank)
        n = requests.num_scheduled[:, None]
        longer = torch.minimum(length * 2, (n - first).clamp(min=0))
        return first, torch.where(requests.replicated[:, None], length, longer)


class _Dropping(pcp_fn.MRV2Partition):
    """Rank 0 forgets its tail chunk: those tokens are on no rank."""

    name = "test-broken-drop"

    def segments(self, config, requests, rank):
        first, length = super().segments(config, requests, rank)
        dropped = torch.stack([length[:, 0], length[:, 1] * (rank != 0)], 1)  # rank may be a tensor
        return first, torch.where(requests.replicated[:, None], length, dropped)


class _Reversed(pcp_fn.MRV2Partition):
    """A restore index that reads the gathered rows backwards."""

    name = "test-broken-restore"

    def gathered_order(self, state):
        order = super().gathered_order(state)
        return order._replace(restore_index=order.restore_index.flip(0))


class _LastCopy(pcp_fn.MRV2Partition):
    """Exact token for token, but a decode is restored from rank P-1's copy, not rank 0's (the
    one ``restored_spans`` promises): every copy holds the same token, so only a check of the
    rank each restored row is read from catches it."""

    name = "test-broken-copy"

    def gathered_order(self, state):
        order = super().gathered_order(state)
        P, Lb = state.config.pcp_size, state.bucket.num_tokens
        # the decodes come first on every rank: decode token t is local row t of each rank
        decode = torch.arange(order.restore_index.shape[0]) < self.state_geometry(state).num_decode_tokens
        return order._replace(
            restore_index=torch.where(decode, order.restore_index + (P - 1) * Lb, order.restore_index)
        )


class _FirstPassDrops(pcp_fn.MRV2Partition):
    """Exact for the target model, but the drafter's first pass loses each rank's first row."""

    name = "test-broken-first-pass"

    def first_pass_rows(self, state, *, geometry=None):
        rows = super().first_pass_rows(state, geometry=geometry)
        return rows._replace(valid=rows.valid & (torch.arange(rows.valid.shape[0]) > 0))


class _HostSync(pcp_fn.MRV2Partition):
    """Exact, but reads a device value on the host to size a run (uncapturable)."""

    name = "test-broken-sync"

    def segments(self, config, requests, rank):
        first, length = super().segments(config, requests, rank)
        longest = int(requests.num_scheduled.max())  # a host sync
        return first, length.clamp(max=max(longest, 1))


@pytest.mark.parametrize(
    ("layout", "rule"),
    [(_Overlapping(), "(capacity|ownership)"), (_Dropping(), "ownership"), (_Reversed(), "restore")],
)
def test_a_broken_layout_fails_with_the_rule_it_breaks(layout, rule):
    with pytest.raises(LayoutCheckError, match=f"breaks {rule}"):
        check_layout(layout, pcp_sizes=(2, 3), max_examples=30, graph_pcp_sizes=())


def test_a_layout_restoring_a_replicated_token_from_another_rank_fails_the_restore_rule():
    with pytest.raises(LayoutCheckError, match=r"breaks restore.*read from the wrong ranks"):
        check_layout(_LastCopy(), pcp_sizes=(2, 3), max_examples=30, graph_pcp_sizes=())


def test_a_layout_whose_drafter_rows_lose_a_token_fails_the_spec_rule():
    check_layout(_FirstPassDrops(), pcp_sizes=(2, 3), num_spec_tokens=0, max_examples=5, graph_pcp_sizes=())
    with pytest.raises(LayoutCheckError, match="breaks spec-decode"):
        check_layout(_FirstPassDrops(), pcp_sizes=(2, 3), max_examples=30, graph_pcp_sizes=())


def test_a_layout_that_syncs_with_the_host_fails_the_graph_checks():
    check_layout(_HostSync(), pcp_sizes=(2,), max_examples=2, edges=False, graph_pcp_sizes=())  # exact
    with pytest.raises(LayoutCheckError, match="host sync"):
        check_layout(_HostSync(), pcp_sizes=(2,), max_examples=1, edges=False, graph_pcp_sizes=(2,))


class _ShiftedPositions(pcp_fn.MRV2Partition):
    """Exact rows, but every position past a request's first token one too far."""

    name = "test-broken-positions"

    def build(self, state, batch):
        up = super().build(state, batch)
        return up._replace(positions=torch.where(up.positions > 0, up.positions + 1, up.positions))


class _LostSlot(pcp_fn.MRV2Partition):
    """Exact rows, but token 1's KV-slot row carries token 0's slot: one slot twice, one missing."""

    name = "test-broken-slots"

    def build(self, state, batch):
        up = super().build(state, batch)
        return up._replace(slot_token=torch.where(up.slot_token == 1, 0, up.slot_token))


class _ShortBound(pcp_fn.MRV2Partition):
    """A bound one row short when a request has 20 tokens in the KV cache (none of init_state's
    canonical batches has), but never below ceil(tokens / P) (make_batch's own check)."""

    name = "test-broken-bound"

    def num_local_tokens(self, config, num_scheduled, num_decodes, num_computed):
        bound = super().num_local_tokens(config, num_scheduled, num_decodes, num_computed)
        if (num_computed >= 20).any():
            return max(bound - 1, -(-int(num_scheduled.sum()) // config.pcp_size))
        return bound


MUTANTS = [
    (_Overlapping(), "(capacity|ownership)"),
    (_Dropping(), "ownership"),
    (_Reversed(), "restore"),
    (_LastCopy(), "restore"),
    (_FirstPassDrops(), "spec-decode"),
    (_ShiftedPositions(), "positions"),
    (_LostSlot(), "slots"),
    (_ShortBound(), "ownership"),
    (_HostSync(), "host sync"),
]


@pytest.mark.parametrize("seed", [None, 1234], ids=["derandomized", "seed=1234"])
def test_every_mutant_is_caught_on_every_run_without_the_edge_batches(seed):
    # the defaults but edges=False: the hypothesis batches (and the graph checks) alone catch each
    # broken layout, and a second run fails on the same batch with the same message
    for layout, rule in MUTANTS:
        messages = []
        for _ in range(2):
            with pytest.raises(LayoutCheckError, match=rule) as e:
                check_layout(layout, edges=False, seed=seed)
            messages.append(str(e.value))
        assert messages[0] == messages[1], layout.name


def _drawn(monkeypatch, **options):
    """The ``(P, spec tokens, batch)`` of every batch check_layout checks (edges off, no graphs)."""
    seen = []
    real = testing.check_batch_exact

    def record(cfg, b):
        seen.append((cfg.pcp_size, cfg.num_spec_tokens, b))
        real(cfg, b)

    monkeypatch.setattr(testing, "check_batch_exact", record)
    check_layout("mrv2", pcp_sizes=(1, 2, 3), max_examples=8, edges=False, graph_pcp_sizes=(), **options)
    monkeypatch.undo()
    return seen


def test_the_same_batches_are_drawn_on_every_run_and_a_seed_picks_others(monkeypatch):
    default = _drawn(monkeypatch)
    assert len(default) >= 8 and _drawn(monkeypatch) == default
    seeded = _drawn(monkeypatch, seed=7)
    assert _drawn(monkeypatch, seed=7) == seeded
    assert seeded != default and _drawn(monkeypatch, seed=8) != seeded


def test_check_layout_writes_no_file_in_the_current_folder(tmp_path):
    # hypothesis would write .hypothesis/ (its cache of the local modules' constants) into the
    # current folder of a fresh interpreter, even with database=None
    code = (
        "from pcp_fn.testing import check_layout\n"
        "check_layout('mrv2', pcp_sizes=(2,), max_examples=5, edges=False, graph_pcp_sizes=())\n"
        "from hypothesis import configuration\n"
        "assert getattr(configuration, '__hypothesis_home_directory', None) is None  # restored\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (
            _Dropping(),
            r"breaks ownership .*: token \d+ of request 0 is on ranks \[\], expected exactly one rank",
        ),
        (_ShiftedPositions(), r"breaks positions .*: row 1 \(request 0, offset 1\): expected 1, got 2"),
        (
            _LostSlot(),
            r"token 0's slot 1000: expected on one row, got at rows \[\d+, \d+\]; token 1's slot 1001: "
            r"expected on one row, got missing",
        ),
        (_Reversed(), r"breaks restore .*restored row 1 \(token 1 of request 0\): expected 1, got \d+"),
        (_LastCopy(), r"breaks restore .*read from the wrong ranks .*: expected 0, got \d+"),
        (
            _ShortBound(),
            r"breaks ownership .*: token \d+ of request \d+ is on ranks \[\]"
            r".*hold the bucket's L_b=\d+ rows, all of them "
            r".*num_local_tokens\(config, num_scheduled, num_decodes, num_computed\) is the host bound "
            r".*check_config\(config\)",
        ),
    ],
)
def test_a_failure_names_the_rows_with_their_expected_and_actual_values(layout, message):
    with pytest.raises(LayoutCheckError, match=message):
        check_layout(layout, graph_pcp_sizes=())


def test_a_rank_past_its_bound_fails_capacity_with_its_rows_and_the_two_ways_out():
    # in the bucket make_batch picks (L_b = 8 > the bound 6), nothing is cut: rank 0's rows past the
    # bound are named (init_state refuses the layout first, in the bucket of exactly 6 rows)
    cfg = pcp_fn.PCPConfig(2, 0, 6, 48, layout=_Overlapping())
    rows = r"rank 0 holds 8 rows, expected at most 6 .*row 6: \[0, 9\]; row 7: \[0, 10\]\. "
    hint = r"num_local_tokens\(config, num_scheduled, num_decodes, num_computed\) is the host bound"
    with pytest.raises(LayoutCheckError, match=f"breaks capacity .*{rows}{hint}"):
        testing.check_batch_exact(cfg, testing.Batch((11,), (0,), (11,)), fresh=pcp_fn.protocol.fresh_state)


def test_check_layout_runs_its_rules_on_the_batch_init_state_refused():
    # init_state's own check names the rule and the batch; check_layout names the rows
    cfg = pcp_fn.PCPConfig(1, 0, 6, 48, layout=_ShiftedPositions())
    with pytest.raises(pcp_fn.protocol.LayoutError, match="breaks positions") as refused:
        pcp_fn.init_state(cfg)
    assert "expected" not in str(refused.value)
    with pytest.raises(LayoutCheckError, match=r"breaks positions .*expected 1, got 2") as e:
        testing.check_batch_exact(cfg, testing.Batch((3,), (0,), (3,)))
    assert isinstance(e.value.__context__, pcp_fn.protocol.LayoutError)  # shown above it


@pytest.mark.parametrize("name", ["dcs", "hybrid", "mrv2"])
def test_fresh_state_is_init_states(name):
    # check_layout runs its rules on the batches init_state refused with a state init_state would make
    for P, rank in ((1, None), (3, None), (3, 2)):
        cfg = pcp_fn.PCPConfig(P, 0, 6, 48, layout=name)
        ours, want = pcp_fn.protocol.fresh_state(cfg, rank=rank), pcp_fn.init_state(cfg, rank=rank)
        leaves, spec = pytree.tree_flatten(ours)
        assert spec == pytree.tree_flatten(want)[1]
        for a, b in zip(leaves, pytree.tree_leaves(want), strict=True):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a is b is None
