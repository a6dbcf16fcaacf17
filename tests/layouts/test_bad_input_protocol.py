"""Nothing silent on the protocol's surfaces: int32 arithmetic at the documented limit, a layout the
serving path refuses without a host sync, the registry, and the ops' inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import snapshot, tree_equal
from hypothesis import given, settings
from hypothesis import strategies as st

import pcp_fn
from pcp_fn import PCPConfig, init_state, make_batch
from pcp_fn.attention_runs import _starts_run
from pcp_fn.protocol.canonical import canonical_batches
from pcp_fn.protocol.registry import LayoutError
from pcp_fn.testing import Batch, LayoutCheckError, check_batch_exact, check_layout

INT32_MAX = 2**31 - 1


# -- 1. int32 at the limit: every sequence make_batch admits (computed + scheduled <= INT32_MAX) ---


@st.composite
def batches_at_the_limit(draw, R: int = 4, T: int = 24) -> Batch:
    """Decodes then prefills whose sequences end at or just below ``INT32_MAX``."""
    n_reqs = draw(st.integers(1, R))
    n_dec = draw(st.integers(0, n_reqs))
    sched, comp, prompt, budget = [], [], [], T
    for i in range(n_reqs):
        n = min(draw(st.integers(1, 2)) if i < n_dec else draw(st.integers(0, 9)), budget)
        if i < n_dec and n == 0:
            break
        end = INT32_MAX - draw(st.integers(0, 3))  # the sequence's last position + 1
        k = end - max(n, 1)  # an empty prefill: behind its prompt's last token (not a decode)
        sched.append(n)
        comp.append(k)
        prompt.append(max(k - 5, 1) if i < n_dec else end)  # a decode's prompt is done
        budget -= n
    return Batch(tuple(sched), tuple(comp), tuple(prompt))


@settings(max_examples=25, deadline=None)
@given(b=batches_at_the_limit(), P=st.integers(1, 4), layout=st.sampled_from(["dcs", "hybrid", "mrv2"]))
def test_every_op_is_exact_for_sequences_ending_at_the_int32_limit(b, P, layout):
    # positions (num_computed + offset), restore, slots, logits and the attention runs' key counts
    cfg = PCPConfig(P, 0, 4, 24, num_spec_tokens=1, layout=layout)
    check_batch_exact(cfg, b)
    if layout == "mrv2":
        return
    batch = make_batch(cfg, b.sched, b.comp, b.prompt)
    _, meta = pcp_fn.attention_metadata(init_state(cfg), batch)
    lens = meta.num_computed_tokens_of_pcp_dcp[: len(b.sched)].reshape(len(b.sched), P).tolist()
    for i, (n, k, p) in enumerate(zip(b.sched, b.comp, b.prompt)):
        decode = k >= max(p, 1) and n <= cfg.decode_threshold
        context = k + n if decode else k
        assert lens[i] == [(context - j + P - 1) // P for j in range(P)]  # Python ints: exact


@given(seq=st.lists(st.integers(INT32_MAX - 40, INT32_MAX), min_size=4, max_size=4), d=st.integers(0, 3))
def test_drafting_lengths_past_the_int32_limit_are_split_before_any_cast(seq, d):
    cfg = PCPConfig(2, 1, 4, 32, num_spec_tokens=3)
    state, _ = pcp_fn.update_tokens(init_state(cfg), make_batch(cfg, [1] * 4, [5] * 4, [5] * 4))
    lens = torch.tensor(seq, dtype=torch.int32)
    before = lens.clone()
    _, out = pcp_fn.drafting_cp_seq_lens(state, lens, d)
    assert out.cp_seq_len.dtype == torch.int32 and torch.equal(lens, before)
    # rank 1 of 2 holds floor((s + d + 1) / 2) of the s + d + 1 tokens (which pass INT32_MAX)
    assert out.cp_seq_len.tolist() == [(s + d + 1) // 2 for s in seq]


@pytest.mark.parametrize(
    ("seq_lens", "draft_index", "error", "match"),
    [
        (torch.zeros(4), 0, TypeError, "seq_lens must hold integers"),
        (torch.zeros(4, dtype=torch.int32), 1.0, TypeError, "draft_index must be an int"),
        (torch.zeros(4, dtype=torch.int32), torch.tensor(1.0), TypeError, "draft_index must hold integers"),
        (torch.zeros(4, dtype=torch.int32), torch.tensor([1]), ValueError, "draft_index must be"),
    ],
)
def test_drafting_lengths_refuse_inputs_of_the_wrong_type(seq_lens, draft_index, error, match):
    cfg = PCPConfig(2, 1, 4, 32, num_spec_tokens=3)
    state, _ = pcp_fn.update_tokens(init_state(cfg), make_batch(cfg, [1] * 4, [5] * 4, [5] * 4))
    with pytest.raises(error, match=match):
        pcp_fn.drafting_cp_seq_lens(state, seq_lens, draft_index)


@settings(max_examples=50, deadline=None)
@given(
    req=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    real=st.lists(st.booleans(), min_size=12, max_size=12),
    shift=st.lists(st.integers(1, 2**33 - 1), min_size=12, max_size=12),
)
def test_attention_runs_cut_the_same_runs_above_2_to_the_29_requests(req, real, shift):
    # the packed int64 code and the comparison one by one (request rows past 2**29) agree
    n = len(req)
    r, m, s = torch.tensor(sorted(req)), torch.tensor(real[:n]), torch.tensor(shift[:n])
    assert torch.equal(_starts_run(r, m, s, 4), _starts_run(r, m, s, 2**30))
    assert torch.equal(_starts_run(r + 2**30 - 4, m, s, 2**30), _starts_run(r, m, s, 4))


def test_attention_metadata_refuses_a_bucket_its_int32_indices_cannot_address():
    cfg = PCPConfig(2, 0, 4, INT32_MAX)
    batch = make_batch(cfg, [INT32_MAX], [0], [INT32_MAX])  # 2**30 local rows: 2**31 gathered
    with pytest.raises(ValueError, match=r"P \* L_b = 2 \* 1073741824 .* past the int32 limit"):
        pcp_fn.attention_metadata(init_state(cfg), batch)


def test_attention_metadata_refuses_a_batch_of_another_config():
    cfg, other = PCPConfig(2, 0, 4, 32), PCPConfig(2, 0, 8, 32)
    with pytest.raises(ValueError, match="the batch was built for"):
        pcp_fn.attention_metadata(init_state(cfg), make_batch(other, [4], [0], [4]))


# -- 3. the serving path and a layout that is not a partition ------------------------------------


class _OneShort(pcp_fn.MRV2Partition):
    """Exact rows, but a bucket bound one short: a run is cut at the bucket's end."""

    name = "test-protocol-one-short"

    def num_local_tokens(self, config, num_scheduled, num_decodes, num_computed):
        return super().num_local_tokens(config, num_scheduled, num_decodes, num_computed) - 1


class _Everywhere(pcp_fn.PartitionLayout):
    """Every token on every rank, but the prefills are not said to be replicated."""

    name = "test-protocol-everywhere"

    def segments(self, config, requests, rank):
        n = requests.num_scheduled
        return torch.zeros_like(n)[:, None], n[:, None]


class _Nowhere(pcp_fn.PartitionLayout):
    """No token on any rank."""

    name = "test-protocol-nowhere"

    def segments(self, config, requests, rank):
        zero = torch.zeros_like(requests.num_scheduled)[:, None]
        return zero, zero


class _AllReplicated(pcp_fn.MRV2Partition):
    """Says every request is whole on every rank, but splits the prefills."""

    name = "test-protocol-all-replicated"

    def replicated(self, config, requests):
        return torch.ones_like(requests.replicated)


@pytest.mark.parametrize(
    ("layout", "rule", "pcp_sizes"),
    [
        (_OneShort(), "(capacity|ownership)", (1, 2, 3, 4, 8)),
        (_Everywhere(), "ownership", (2, 3, 4)),
        (_Nowhere(), "ownership", (1, 2, 4)),
        (_AllReplicated(), "ownership", (2, 3, 4)),
    ],
)
def test_init_state_refuses_a_layout_that_is_not_a_partition(layout, rule, pcp_sizes):
    for P in pcp_sizes:
        cfg = PCPConfig(P, P - 1, 8, 64, layout=layout)
        with pytest.raises(LayoutError, match=rf"layout {layout.name!r} breaks {rule} at P={P}") as e:
            init_state(cfg)
        assert isinstance(e.value, ValueError) and "check_layout" in str(e.value)
        with pytest.raises(LayoutError):  # a refused config is refused every time, whatever the device
            init_state(cfg, "meta", rank=0)
    # check_layout names the same rule (on its capacity edges, before any hypothesis batch)
    with pytest.raises(LayoutCheckError, match=f"breaks {rule}"):
        check_layout(layout, pcp_sizes=pcp_sizes[-1:], max_examples=1, graph_pcp_sizes=())


def test_the_one_short_bound_is_what_cuts_a_token_in_a_bucket_that_fits_it():
    # what init_state catches: served in the exact bucket its bound asks for, a PartitionLayout
    # cuts the run that does not fit, and a token is on no rank
    cfg = PCPConfig(4, 0, 8, 64, layout=_OneShort())
    b = Batch((19,), (0,), (19,))
    bound = cfg.layout_impl.num_local_tokens(cfg, np.array([19]), 0, np.array([0]))
    batch = make_batch(cfg, b.sched, b.comp, b.prompt, bucket=pcp_fn.Bucket(1, bound))
    counts = []
    for r in range(4):
        st_r = pcp_fn.protocol.fresh_state(dataclasses.replace(cfg, pcp_rank=r))
        counts.append(int(cfg.layout_impl.build(st_r, batch).layout.num_tokens))
    assert sum(counts) < 19  # a run cut: tokens on no rank


def test_a_valid_layout_passes_once_and_then_costs_a_lookup():
    calls = []

    class Counted(pcp_fn.MRV2Partition):
        name = "test-protocol-counted"

        def build(self, state, batch):
            calls.append(state.config.pcp_rank)
            return super().build(state, batch)

    cfg = PCPConfig(3, 1, 8, 64, layout=Counted())
    init_state(cfg)
    n = len(calls)
    assert n == 3 * len(canonical_batches(cfg))  # every rank, every canonical batch
    init_state(cfg)
    init_state(dataclasses.replace(cfg, pcp_rank=2))  # the same group: checked already
    assert len(calls) == n
    for name in ("dcs", "hybrid", "mrv2", "mrv2-sharded"):  # the built-ins are not re-run
        init_state(PCPConfig(2, 0, 4, 32, layout=name))


def test_canonical_batches_fit_every_config():
    for R, T, P, k in [(1, 1, 1, 0), (1, 3, 8, 2), (2, 2, 2, 0), (4, 32, 3, 1), (256, 8192, 8, 3)]:
        cfg = PCPConfig(P, 0, R, T, num_spec_tokens=k)
        out = canonical_batches(cfg)
        assert out and all(len(s) <= R and sum(s) <= T for s, _, _ in out)
        for s, c, p in out:
            make_batch(cfg, s, c, p)  # valid: decodes first, counts in range


class _BadBound(pcp_fn.MRV2Partition):
    name = "test-protocol-bad-bound"
    value: object = None

    def num_local_tokens(self, config, num_scheduled, num_decodes, num_computed):
        return self.value


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (None, TypeError, r"must return an int, got NoneType"),
        (9.5, TypeError, r"must return an int, got float"),
        (True, TypeError, r"must return an int, got bool"),
        (-1, ValueError, r"says -1 local rows for a batch of 14 tokens.*ceil\(14 / 2\) = 7"),
        (6, ValueError, r"says 6 local rows for a batch of 14 tokens.*at least"),
        (10**6, ValueError, r"says 1000000 local rows .* past the local capacity L=36"),
    ],
)
def test_make_batch_refuses_a_layout_bound_the_host_can_see_is_wrong(value, error, match):
    layout = _BadBound()
    layout.value = value
    cfg = PCPConfig(2, 0, 4, 32, layout=layout)
    sched = np.array([1, 5, 8])
    with pytest.raises(error, match=rf"layout 'test-protocol-bad-bound': num_local_tokens {match}"):
        make_batch(cfg, sched, [7, 0, 0], [3, 5, 8])
    assert sched.tolist() == [1, 5, 8]


def test_make_batch_takes_a_numpy_integer_bound():
    layout = _BadBound()
    layout.value = np.int64(9)
    cfg = PCPConfig(2, 0, 4, 32, layout=layout)
    assert make_batch(cfg, [1, 5, 8], [7, 0, 0], [3, 5, 8]).bucket.num_tokens == 16


# -- 4. the registry ------------------------------------------------------------------------------


def test_a_builtin_is_replaced_only_with_replace_true():
    for name in ("dcs", "hybrid", "mrv2", "mrv2-sharded"):
        builtin = pcp_fn.get_layout(name)
        assert pcp_fn.register_layout(builtin) is builtin  # the very same object: a no-op
        # an object of the built-in's own class (PackageLayout, MRV2Partition) is no exception
        same_class = (
            pcp_fn.PackageLayout(name, builtin.package)
            if isinstance(builtin, pcp_fn.PackageLayout)
            else pcp_fn.MRV2Partition()
        )
        same_class.name = name
        for newcomer in (same_class, pcp_fn.PackageLayout(name, pcp_fn.dcs.layout)):
            with pytest.raises(ValueError, match=rf"{name!r} is already registered.*replace=True"):
                pcp_fn.register_layout(newcomer)
            with pytest.raises(ValueError, match="replace=True"):
                PCPConfig(2, 0, 4, 32, layout=newcomer)
            assert pcp_fn.get_layout(name) is builtin
    original = pcp_fn.get_layout("mrv2")
    try:
        replacement = pcp_fn.register_layout(pcp_fn.PackageLayout("mrv2", pcp_fn.dcs.layout), replace=True)
        assert pcp_fn.get_layout("mrv2") is replacement
    finally:
        pcp_fn.register_layout(original, replace=True)
    assert pcp_fn.get_layout("mrv2") is original


def _user_class():
    """A user's layout class, made anew on every call (a notebook cell re-run)."""

    class Notebook(pcp_fn.MRV2Partition):
        name = "test-protocol-notebook"

    return Notebook


def test_a_user_layout_re_registered_by_its_cell_replaces_itself():
    first = pcp_fn.register_layout(_user_class()())
    again = _user_class()()  # another class object, the same module and qualified name
    assert type(again) is not type(first)
    assert pcp_fn.register_layout(again) is again and pcp_fn.get_layout(again.name) is again
    assert pcp_fn.register_layout(type(again)()) is not again  # another instance of the same class

    class Other(pcp_fn.MRV2Partition):
        name = "test-protocol-notebook"

    refused = r"already registered .*an instance of .*Notebook\); pass replace=True .* with Other"
    with pytest.raises(ValueError, match=refused):
        pcp_fn.register_layout(Other())
    assert pcp_fn.register_layout(Other(), replace=True).name == "test-protocol-notebook"


def test_a_package_layout_of_the_same_module_replaces_itself_and_of_another_does_not():
    one = pcp_fn.register_layout(pcp_fn.PackageLayout("test-protocol-package", pcp_fn.dcs.layout))
    two = pcp_fn.register_layout(pcp_fn.PackageLayout("test-protocol-package", pcp_fn.dcs.layout))
    assert two is not one and pcp_fn.get_layout("test-protocol-package") is two
    with pytest.raises(ValueError, match="replace=True"):
        pcp_fn.register_layout(pcp_fn.PackageLayout("test-protocol-package", pcp_fn.hybrid.ops))
    with pytest.raises(ValueError, match="replace=True"):  # a library class's instances differ by argument
        sharded = pcp_fn.MRV2Partition(shard_decode_requests=True)
        sharded.name = "test-protocol-library"
        pcp_fn.register_layout(sharded)
        plain = pcp_fn.MRV2Partition()
        plain.name = "test-protocol-library"
        pcp_fn.register_layout(plain)


class _NotCallable(pcp_fn.MRV2Partition):
    name = "test-protocol-not-callable"
    build = 3


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: pcp_fn.register_layout(_NotCallable()), TypeError, r"\['build'\] are not callable"),
        (lambda: pcp_fn.register_layout(pcp_fn.get_layout("dcs"), replace="yes"), TypeError, "replace must"),
        (lambda: pcp_fn.register_layout(object()), TypeError, r"not a pcp_fn\.Layout"),
        (lambda: pcp_fn.get_layout(["dcs"]), TypeError, "a layout name must be a str, got list"),
        (lambda: pcp_fn.get_layout(None), TypeError, "a layout name must be a str, got NoneType"),
        (lambda: PCPConfig(2, 0, 4, 32, layout=_NotCallable()), TypeError, "not callable"),
    ],
)
def test_the_registry_refuses_what_is_not_a_layout(call, error, match):
    with pytest.raises(error, match=match):
        call()


# -- the ops' inputs ------------------------------------------------------------------------------

CFG = PCPConfig(2, 0, 4, 32)


def _stepped():
    batch = make_batch(CFG, [1, 5, 8], [7, 0, 0], [3, 5, 8], slot_mapping=range(14))
    state, _ = pcp_fn.step(init_state(CFG), batch)
    return state, batch


@pytest.mark.parametrize(
    "op",
    [
        lambda s: pcp_fn.restore_hidden_states(s, torch.zeros(32, 2)),
        lambda s: pcp_fn.get_logits_indices(s),
        lambda s: pcp_fn.padded_slot_mapping(s, torch.zeros(32, dtype=torch.int64)),
        lambda s: pcp_fn.attention_runs(s),
    ],
)
@pytest.mark.parametrize("bad", [None, "state", 3])
def test_the_consumer_ops_name_a_state_that_is_not_one(op, bad):
    with pytest.raises(TypeError, match="takes a PCPState"):
        op(bad)
    state, batch = _stepped()
    with pytest.raises(TypeError, match=r"takes a PCPState .*got SchedulerBatch"):
        op(batch)


@pytest.mark.parametrize(
    ("slots", "error", "match"),
    [
        (torch.zeros(32), TypeError, r"int64 or int32 tensor of KV slots, got torch\.float32"),
        (torch.zeros(32, dtype=torch.bool), TypeError, r"got torch\.bool"),
        (torch.zeros(32, dtype=torch.int8), TypeError, r"got torch\.int8"),  # cannot hold pad_slot_id
        (torch.zeros(32, 2, dtype=torch.int64), ValueError, r"1-D \(\[F_b\]"),
        (torch.zeros(32, dtype=torch.int64, device="meta"), ValueError, r"slot_mapping is on meta"),
    ],
)
def test_a_slot_mapping_of_the_wrong_kind_is_refused(slots, error, match):
    state, batch = _stepped()
    before = snapshot((state, batch))
    with pytest.raises(error, match=match):
        pcp_fn.padded_slot_mapping(state, slots)
    with pytest.raises(error, match=match):
        pcp_fn.step(init_state(CFG), batch, slots)
    assert tree_equal((state, batch), before)
    for dtype in (torch.int32, torch.int64):  # the two a KV slot mapping comes in
        _, out = pcp_fn.padded_slot_mapping(state, torch.arange(32, dtype=dtype))
        assert out.dtype == dtype


@pytest.mark.parametrize(
    ("gathered", "error", "match"),
    [
        (torch.zeros(32, 4, device="meta"), ValueError, r"gathered is on meta, the state on cpu"),
        (torch.zeros(32, 4).to_sparse(), TypeError, r"dense \(strided\)"),
        (torch.zeros(31, 4), ValueError, r"\(32 rows\), got shape \(31, 4\)"),
        (torch.zeros(()), ValueError, r"got shape \(\)"),
    ],
)
def test_restore_refuses_a_gathered_buffer_it_cannot_index(gathered, error, match):
    state, _ = _stepped()
    with pytest.raises(error, match=match):
        pcp_fn.restore_hidden_states(state, gathered)
    # any dense dtype is only moved: a row of int codes comes back as it was gathered
    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        _, out = pcp_fn.restore_hidden_states(state, torch.ones(32, 3, dtype=dtype))
        assert out.dtype == dtype and out.shape == (32, 3)


@pytest.mark.parametrize(
    ("slot_fn", "match"),
    [
        (lambda request, position: position.float(), r"integer slots, got torch\.float32"),
        (lambda request, position: position > 3, r"slot_fn must return integer slots, got torch\.bool"),
        (lambda request, position: [1], r"slot_fn must return a tensor of \[18\] slots, got list"),
    ],
)
def test_full_input_ids_refuses_slots_it_would_truncate(slot_fn, match):
    # the MTP slot mapping is int32 (vllm-ascend's): a float slot would be truncated silently
    cfg = PCPConfig(2, 0, 4, 32, num_spec_tokens=2)
    batch = make_batch(cfg, [3, 5], [9, 0], [5, 5], slot_mapping=range(8))
    state, _ = pcp_fn.step(init_state(cfg), batch)
    table = torch.zeros(4, 64, dtype=torch.int64)
    with pytest.raises(TypeError, match=match):
        pcp_fn.full_input_ids(state, table, batch.num_computed, slot_fn=slot_fn)
    _, out = pcp_fn.full_input_ids(state, table, batch.num_computed, slot_fn=lambda r, p: p)
    assert out.mtp.slot_mapping.dtype == torch.int32


@pytest.mark.parametrize("P", [2, 3, 8])
def test_the_host_twins_are_exact_for_a_prefill_at_the_int32_limit(P):
    # the numpy twins an adapter reads every step: n + 2P - 1 and the padded count pass int32
    from pcp_fn.dcs.host import host_layout
    from pcp_fn.mrv2.chunks import chunk_size

    n = INT32_MAX - 9
    cfg = PCPConfig(P, 0, 4, INT32_MAX)
    h = host_layout(cfg, *(np.array(a, np.int32) for a in ([1, n], [8, 0], [5, n])))
    c = -(-n // (2 * P))  # ceil(n / 2P), in Python integers
    assert h.pcp_tokens.tolist() == [1, 2 * c]
    assert h.num_padded.tolist() == [P, 2 * P * c]  # 2**31 and more at P = 2: int64
    assert h.num_pads.dtype == np.int32 and h.num_pads.tolist() == [P - 1, 2 * P * c - n]
    assert h.logits.tolist() == [0, P + n - 1]
    counts = [0, 1, n, INT32_MAX]
    for x in (torch.tensor(counts, dtype=torch.int32), np.array(counts, np.int32)):
        assert chunk_size(x, 2 * P).tolist() == [0, 1, c, -(-INT32_MAX // (2 * P))]
