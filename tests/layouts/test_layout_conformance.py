"""pcp_fn.testing.check_layout: the three built-in layouts pass it, broken layouts fail it."""

from __future__ import annotations

import pytest
import torch

import pcp_fn
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
    with pytest.raises(LayoutCheckError, match=r"breaks restore.*read from ranks"):
        check_layout(_LastCopy(), pcp_sizes=(2, 3), max_examples=30, graph_pcp_sizes=())


def test_a_layout_whose_drafter_rows_lose_a_token_fails_the_spec_rule():
    check_layout(_FirstPassDrops(), pcp_sizes=(2, 3), num_spec_tokens=0, max_examples=5, graph_pcp_sizes=())
    with pytest.raises(LayoutCheckError, match="breaks spec-decode"):
        check_layout(_FirstPassDrops(), pcp_sizes=(2, 3), max_examples=30, graph_pcp_sizes=())


def test_a_layout_that_syncs_with_the_host_fails_the_graph_checks():
    check_layout(_HostSync(), pcp_sizes=(2,), max_examples=2, edges=False, graph_pcp_sizes=())  # exact
    with pytest.raises(LayoutCheckError, match="host sync"):
        check_layout(_HostSync(), pcp_sizes=(2,), max_examples=1, edges=False, graph_pcp_sizes=(2,))
