"""Multimodal PCP helpers: M-RoPE remap and prompt embeds (device), local encoder schedule (host)."""

import copy
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import batch_for, config_for, no_slots, to_device, tree_equal, tree_meta
from hypothesis import given
from hypothesis import strategies as st
from oracle_attention import (
    oracle_local_mm_schedule,
    oracle_mm_embeddings,
    oracle_mrope,
    oracle_prompt_embeds,
)
from strategies import cases

import pcp_fn
from pcp_fn import multimodal as mm

# ---- golden ------------------------------------------------------------------------------------


def test_golden_mrope_remap_from_vllm_ascend():
    # req0: 5-column table, prompt 5, delta 100; req1: no table. Local positions [1, 3, 5 | 2, 4].
    table = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14], [20, 21, 22, 23, 24]])
    packed = mm.pack_mrope_tables([table, None], [100, None], num_rows=2, max_len=8)
    out = mm.remap_mrope_positions(
        packed,
        num_prompt=torch.tensor([5, 2]),
        positions=torch.tensor([1, 3, 5, 2, 4, 0]),
        request_index=torch.tensor([0, 0, 0, 1, 1, 0]),
        num_tokens=torch.tensor(5),
    )
    assert out.tolist() == [
        [1, 3, 105, 2, 4, 0],
        [11, 13, 105, 2, 4, 0],
        [21, 23, 105, 2, 4, 0],
    ]


def test_golden_mrope_table_shorter_than_the_prompt_takes_its_last_column():
    table = torch.tensor([[7, 8], [17, 18], [27, 28]])
    packed = mm.pack_mrope_tables([table], [3], num_rows=1, max_len=4)
    out = mm.remap_mrope_positions(
        packed,
        torch.tensor([4]),
        torch.tensor([0, 1, 2, 3, 4, 5]),
        torch.zeros(6, dtype=torch.int64),
        torch.tensor(6),
    )
    assert out[0].tolist() == [7, 8, 8, 8, 7, 8]  # 2 and 3: last column; 4, 5: completion + delta 3


def _step(P, rank, sched, comp, prompt, R=None):
    cfg = pcp_fn.PCPConfig(P, rank, R or max(len(sched), 1), 256)
    batch = pcp_fn.make_batch(cfg, sched, comp, prompt)
    _, out = pcp_fn.step(pcp_fn.init_state(cfg), batch, no_slots(batch))
    return batch, out


def test_golden_prompt_embeds_p2_rank0():
    # one fresh prefill of 5 tokens (padded to 8): rank 0 holds positions [0, 1, 6, 7]
    batch, out = _step(2, 0, [5], [0], [5])
    assert out.positions[:4].tolist() == [0, 1, 6, 7]
    e = torch.arange(12.0).reshape(6, 2)
    packed = mm.pack_prompt_embeds({0: e}, batch.bucket.num_reqs, 2, capacity=8)
    base = torch.full((out.positions.shape[0], 2), -1.0)
    got = mm.gather_prompt_embeds(
        packed, out.positions, out.layout.request_index, out.layout.num_tokens, base
    )
    assert got[:4].tolist() == [[0.0, 1.0], [2.0, 3.0], [-1.0, -1.0], [-1.0, -1.0]]


# ---- device ops against the oracle -------------------------------------------------------------


@given(case=cases(pcp_sizes=(1, 2, 3, 4, 8)), data=st.data())
def test_remap_mrope_and_prompt_embeds_match_the_oracle(case, data):
    rank = data.draw(st.integers(0, case.P - 1), label="rank")
    cfg = config_for(case, rank)
    batch = batch_for(case, cfg)
    _, out = pcp_fn.step(pcp_fn.init_state(cfg), batch, no_slots(batch))
    N, L, Rb = int(out.layout.num_tokens), out.positions.shape[0], batch.bucket.num_reqs
    positions = out.positions[:N].tolist()
    owners = out.layout.request_index[:N].tolist()
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))

    tables, deltas = [], []
    for p in case.prompt:
        kind = rng.choice(["full", "short", "none", "empty"])
        cols = {"full": p, "short": rng.randint(1, max(p, 1)), "none": 0, "empty": 0}[kind]
        tables.append(
            None if kind == "none" else [[rng.randint(0, 99) for _ in range(cols)] for _ in range(3)]
        )
        deltas.append(rng.choice([None, rng.randint(-9, 9)]))
    max_len = max([len(t[0]) for t in tables if t is not None] + [1]) + rng.randint(0, 3)
    packed = mm.pack_mrope_tables(
        [None if t is None else torch.tensor(t, dtype=torch.int64).reshape(3, -1) for t in tables],
        deltas,
        Rb,
        max_len,
    )
    got = mm.remap_mrope_positions(
        packed, batch.num_prompt, out.positions, out.layout.request_index, out.layout.num_tokens
    )
    expected = oracle_mrope(tables, deltas, case.prompt, positions, owners)
    assert got.shape == (3, L) and got.dtype == torch.int64
    assert got.tolist() == [row + [0] * (L - N) for row in expected]

    H = 3
    embeds = {
        i: torch.randn(rng.randint(0, c + n + 2), H)
        for i, (c, n) in enumerate(zip(case.comp, case.sched))
        if rng.random() < 0.6
    }
    capacity = sum(e.shape[0] for e in embeds.values()) + rng.randint(1, 4)
    packed_e = mm.pack_prompt_embeds(embeds, Rb, H, capacity)
    base = torch.randn(L, H)
    got_e = mm.gather_prompt_embeds(
        packed_e, out.positions, out.layout.request_index, out.layout.num_tokens, base
    )
    expected_e = oracle_prompt_embeds(
        {i: e.tolist() for i, e in embeds.items()}, positions, owners, base[:N].tolist()
    )
    assert got_e[:N].tolist() == expected_e
    assert torch.equal(got_e[N:], base[N:])


# ---- host helpers against the oracle -----------------------------------------------------------


def _mm_requests(rng, sched, comp, prompt):
    reqs = {}
    for i, (n, c) in enumerate(zip(sched, comp)):
        total = c + n
        features, pos = [], 0
        while pos < total + 2 and len(features) < 3:
            off = pos + rng.randint(0, 5)
            length = rng.randint(1, 7)
            mask = None if rng.random() < 0.5 else torch.tensor([rng.random() < 0.6 for _ in range(length)])
            ident = "shared" if rng.random() < 0.2 else f"h{i}_{len(features)}"
            features.append(
                SimpleNamespace(
                    identifier=ident, mm_position=SimpleNamespace(offset=off, length=length, is_embed=mask)
                )
            )
            pos = off + rng.randint(0, length + 1)  # features may overlap
        reqs[f"r{i}"] = SimpleNamespace(
            mm_features=features,
            mrope_positions=None,
            prompt_token_ids=list(range(prompt[i])),
            num_computed_tokens=c,
        )
    return reqs


@given(case=cases(pcp_sizes=(2, 3, 4, 8), allow_empty=False), data=st.data())
def test_host_schedule_helpers_match_the_oracle_and_mutate_nothing(case, data):
    rank = data.draw(st.integers(0, case.P - 1), label="rank")
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    cfg = config_for(case, rank)
    _, out = pcp_fn.step(pcp_fn.init_state(cfg), batch_for(case, cfg), no_slots(batch_for(case, cfg)))
    n, N = case.num_reqs, int(out.layout.num_tokens)
    local = out.layout.pcp_tokens[:n].numpy()
    positions = out.positions[:N].numpy()
    req_ids = [f"r{i}" for i in range(n)]
    reqs = _mm_requests(rng, case.sched, case.comp, case.prompt)
    idents = sorted({f.identifier for r in reqs.values() for f in r.mm_features})
    full = {h: torch.randn(40, 2) for h in idents}
    partial = {h: v for h, v in full.items() if rng.random() < 0.5}
    frozen = copy.deepcopy((reqs, partial))

    sched_enc, needed = mm.build_local_mm_schedule(req_ids, reqs, positions, local, partial)
    assert (sched_enc, needed) == oracle_local_mm_schedule(
        req_ids, reqs, positions.tolist(), local.tolist(), partial
    )

    shift = rng.choice([0, 1, 2])
    got = mm.gather_mm_embeddings(req_ids, reqs, positions, local, shift, full)
    rows, is_mm = oracle_mm_embeddings(req_ids, reqs, positions.tolist(), local.tolist(), shift, full)
    assert got.is_mm_embed.tolist() == is_mm
    flat = torch.cat(got.embeds) if got.embeds else torch.zeros(0, 2)
    assert flat.shape[0] == len(rows)
    assert all(torch.equal(a, b) for a, b in zip(flat, rows))
    assert not got.should_sync_mrope_positions and got.mrope_updates == {}

    so = SimpleNamespace(
        total_num_scheduled_tokens=sum(case.sched),
        num_scheduled_tokens={r: s for r, s in zip(req_ids, case.sched)},
        scheduled_encoder_inputs={"r0": [0]},
        free_encoder_mm_hashes=["gone", *idents[:2]],
    )
    before = copy.deepcopy(vars(so))
    layout = mm.local_schedule_layout(out.layout.pcp_tokens.numpy(), n, N)
    local_so = mm.localize_scheduler_output(
        so, req_ids, reqs, positions, layout.num_scheduled_tokens, layout.total_num_scheduled_tokens, partial
    )
    assert vars(so) == before  # the caller's object is untouched
    if N == sum(case.sched) and local.tolist() == list(case.sched):
        assert local_so is so  # nothing to localize
    else:
        assert local_so is not so
        assert local_so.total_num_scheduled_tokens == N
        assert local_so.num_scheduled_tokens == dict(zip(req_ids, local.tolist()))
        assert local_so.scheduled_encoder_inputs == sched_enc
        assert local_so.free_encoder_mm_hashes == ["gone"]  # every other hash is still referenced
    # nothing the helpers were given changed
    assert repr(frozen[0]) == repr(reqs) and frozen[1].keys() == partial.keys()


def test_gather_mm_embeddings_reorders_pieces_into_local_token_order():
    # P=2, rank 0 of a fresh 8-token prompt holds positions [0, 1, 6, 7]: two images, the later
    # one (positions 6..7) listed first; rows come out in local token order.
    f = lambda h, off, n: SimpleNamespace(  # noqa: E731
        identifier=h, mm_position=SimpleNamespace(offset=off, length=n, is_embed=None)
    )
    reqs = {"r": SimpleNamespace(mm_features=[f("b", 6, 2), f("a", 0, 2)])}
    cache = {"a": torch.tensor([[1.0], [2.0]]), "b": torch.tensor([[7.0], [8.0]])}
    got = mm.gather_mm_embeddings(["r"], reqs, np.array([0, 1, 6, 7]), np.array([4]), 0, cache)
    assert [e.tolist() for e in got.embeds] == [[[1.0], [2.0], [7.0], [8.0]]]
    assert got.is_mm_embed.tolist() == [True, True, True, True]


def test_gather_mm_embeddings_returns_mrope_updates_instead_of_writing_them():
    old = torch.zeros(3, 4, dtype=torch.int64)
    req = SimpleNamespace(
        mm_features=[], mrope_positions=old, prompt_token_ids=[1, 2, 3, 4], num_computed_tokens=0
    )
    model = SimpleNamespace(
        recompute_mrope_positions=lambda **kw: ([], torch.ones(3, 4, dtype=torch.int64), 5)
    )
    got = mm.gather_mm_embeddings(
        ["r"], {"r": req}, np.array([0, 1]), np.array([2]), 0, {}, model, True, True
    )
    assert got.should_sync_mrope_positions
    assert torch.equal(got.mrope_updates["r"][0], torch.ones(3, 4, dtype=torch.int64))
    assert got.mrope_updates["r"][1] == 5
    assert req.mrope_positions is old and not old.any()


def test_local_schedule_layout_is_a_read_only_snapshot():
    counts = np.array([1, 4, 4, 7], dtype=np.int32)
    layout = mm.local_schedule_layout(counts, 3, 9)
    counts[0] = 99
    assert layout.num_scheduled_tokens.tolist() == [1, 4, 4] and layout.total_num_scheduled_tokens == 9
    with pytest.raises(ValueError):
        layout.num_scheduled_tokens[0] = 5


# ---- capturability -----------------------------------------------------------------------------

CFG = pcp_fn.PCPConfig(4, 1, 8, 96, num_spec_tokens=1)
BUCKET = pcp_fn.Bucket(8, 32)
COMPOSITIONS = {
    "decode-only": ([1, 2, 1, 1], [9, 40, 7, 3], [9, 30, 7, 3]),
    "mixed": ([2, 1, 33, 5, 17], [50, 8, 0, 12, 0], [40, 8, 33, 30, 17]),
    "prefill-only": ([21, 7, 40], [0, 16, 0], [21, 30, 40]),
}
H = 4


def _device_args(name):
    batch = pcp_fn.make_batch(CFG, *COMPOSITIONS[name], bucket=BUCKET)
    _, out = pcp_fn.step(pcp_fn.init_state(CFG), batch, no_slots(batch))
    gen = torch.Generator().manual_seed(0)
    tables = [
        torch.randint(0, 50, (3, p), generator=gen) if i % 2 == 0 else None
        for i, p in enumerate(COMPOSITIONS[name][2])
    ]
    packed = mm.pack_mrope_tables(tables, [3] * len(tables), BUCKET.num_reqs, 64)
    embeds = mm.pack_prompt_embeds({0: torch.randn(30, H, generator=gen)}, BUCKET.num_reqs, H, 64)
    base = torch.zeros(BUCKET.num_tokens, H)
    lay = out.layout
    return [
        (
            mm.remap_mrope_positions,
            (packed, batch.num_prompt, out.positions, lay.request_index, lay.num_tokens),
        ),
        (mm.gather_prompt_embeds, (embeds, out.positions, lay.request_index, lay.num_tokens, base)),
    ]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_device_ops_compile_fullgraph_run_on_meta_and_pass_the_sync_detector():
    for name in COMPOSITIONS:
        for fn, args in _device_args(name):
            compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend="eager")
            assert tree_equal(compiled(*args), fn(*args)), (fn.__name__, name)
            pcp_fn.assert_no_host_syncs(fn, *args)
            meta = fn(*to_device(args, "meta"))
            assert meta.device.type == "meta" and tree_meta(meta) == tree_meta(fn(*args))


def test_device_ops_shapes_and_op_counts_do_not_depend_on_the_composition():
    for i, fn in enumerate((mm.remap_mrope_positions, mm.gather_prompt_embeds)):
        metas = {name: tree_meta(fn(*_device_args(name)[i][1])) for name in COMPOSITIONS}
        assert len({repr(m) for m in metas.values()}) == 1, fn.__name__
        counts = {name: pcp_fn.count_aten_ops(fn, *_device_args(name)[i][1]) for name in COMPOSITIONS}
        assert len(set(counts.values())) == 1, (fn.__name__, counts)


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tables", "deltas", "rows", "max_len", "match"),
    [
        ([torch.zeros(3, 9, dtype=torch.int64)], [0], 2, 8, r"request 0 has 9 columns .* max_len=8.*shorter"),
        ([torch.zeros(2, 4, dtype=torch.int64)], [0], 2, 8, r"request 0 must be \[3, n\]"),
        ([torch.zeros(3, 4)], [0], 2, 8, r"must hold integers"),
        ([None, None, None], [0, 0, 0], 2, 8, r"3 M-RoPE tables do not fit in num_rows=2"),
        ([None], [0, 1], 2, 8, r"tables has 1 entries but deltas has 2"),
        ([None], [0], 2, 0, r"max_len must be >= 1"),
    ],
)
def test_pack_mrope_tables_rejects(tables, deltas, rows, max_len, match):
    with pytest.raises(ValueError, match=match):
        mm.pack_mrope_tables(tables, deltas, rows, max_len)


@pytest.mark.parametrize(
    ("embeds", "match"),
    [
        ({0: torch.zeros(3, 5)}, r"request 0 have width 5; the hidden size is 4"),
        ({0: torch.zeros(3)}, r"must be a 2-D tensor"),
        ({2: torch.zeros(3, 4)}, r"request 2, outside num_rows=2"),
        ({0: torch.zeros(9, 4)}, r"hold 9 rows; capacity is 8"),
        ({0: torch.zeros(1, 4), 1: torch.zeros(1, 4, dtype=torch.float64)}, r"mix dtypes"),
    ],
)
def test_pack_prompt_embeds_rejects(embeds, match):
    with pytest.raises(ValueError, match=match):
        mm.pack_prompt_embeds(embeds, 2, 4, 8)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: mm.pack_mrope_tables([None], [1.5], 2, 8),
            TypeError,
            r"deltas\[0\] must be an int, got float",
        ),
        (lambda: mm.pack_mrope_tables([None], [0], -2, 8), ValueError, r"num_rows must be >= 1, got -2"),
        (lambda: mm.pack_mrope_tables([None], [0], 2, 2.0), TypeError, r"max_len must be an int"),
        (lambda: mm.pack_prompt_embeds({}, -1, 4, 8), ValueError, r"num_rows must be >= 1, got -1"),
        (lambda: mm.pack_prompt_embeds({}, 2, 4, -8), ValueError, r"capacity must be >= 1, got -8"),
        (lambda: mm.pack_prompt_embeds({}, 2, 0, 8), ValueError, r"hidden_size must be >= 1, got 0"),
        (lambda: mm.pack_prompt_embeds({-1: torch.zeros(1, 4)}, 2, 4, 8), ValueError, r"index must be >= 0"),
    ],
)
def test_packers_reject_bad_sizes_and_fractional_deltas_before_allocating(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_gather_prompt_embeds_rejects_an_output_of_the_wrong_width_or_dtype():
    packed = mm.pack_prompt_embeds({0: torch.zeros(3, 4)}, 2, 4, 8)
    pos, req, n = torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64), torch.tensor(5)
    with pytest.raises(ValueError, match=r"width 4 but out has width 6"):
        mm.gather_prompt_embeds(packed, pos, req, n, torch.zeros(5, 6))
    with pytest.raises(ValueError, match=r"out must be \[L=5, H\]"):
        mm.gather_prompt_embeds(packed, pos, req, n, torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"are torch.float32 but out is torch.float16"):
        mm.gather_prompt_embeds(packed, pos, req, n, torch.zeros(5, 4, dtype=torch.float16))


def test_remap_mrope_positions_rejects_tables_packed_for_another_bucket():
    packed = mm.pack_mrope_tables([None], [None], 2, 4)
    x = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"tables hold 2 request rows but num_prompt has \(4,\)"):
        mm.remap_mrope_positions(packed, torch.zeros(4, dtype=torch.int32), x, x, torch.tensor(3))


def test_gather_mm_embeddings_rejects_an_encoder_cache_miss():
    feature = SimpleNamespace(identifier="x", mm_position=SimpleNamespace(offset=0, length=2, is_embed=None))
    reqs = {"r": SimpleNamespace(mm_features=[feature])}
    with pytest.raises(ValueError, match=r"encoder cache miss for x"):
        mm.gather_mm_embeddings(["r"], reqs, np.array([0, 1]), np.array([2]), 0, {})
    with pytest.raises(ValueError, match=r"1 entries for 2 requests"):
        mm.gather_mm_embeddings(["r", "s"], reqs, np.array([0, 1]), np.array([2]), 0, {})


def test_pack_mrope_tables_refuses_uint64_values_past_int64_and_meta_tables():
    # issue 20: a uint64 value >= 2**63 used to wrap to a negative position in the int64 cast
    table = np.arange(12, dtype=np.uint64).reshape(3, 4)
    ok = mm.pack_mrope_tables([table], [0], 2, 8)
    assert tree_equal(ok, mm.pack_mrope_tables([table.astype(np.int64)], [0], 2, 8))
    big = table.copy()
    big[1, 2] = 2**63
    for bad in (big, torch.from_numpy(big)):
        with pytest.raises(ValueError, match=r"tables\[1\]\[1, 2\] = 9223372036854775808 exceeds the limit"):
            mm.pack_mrope_tables([None, bad], [0, 0], 2, 8)
    assert int(big[1, 2]) == 2**63  # the caller's table is untouched
    with pytest.raises(ValueError, match=r"tables\[0\] is a meta tensor"):
        mm.pack_mrope_tables([torch.zeros(3, 4, dtype=torch.int64, device="meta")], [0], 2, 8)


def test_packers_refuse_meta_embeds_and_buffers_past_the_machine_before_allocating(monkeypatch):
    with pytest.raises(ValueError, match=r"embeds\[1\] is a meta tensor"):
        mm.pack_prompt_embeds({0: torch.zeros(2, 4), 1: torch.zeros(2, 4, device="meta")}, 2, 4, 8)

    def zeros(*args, **kwargs):
        raise AssertionError("allocated")

    monkeypatch.setattr(torch, "zeros", zeros)  # the checks come before any allocation
    with pytest.raises(ValueError, match=r"capacity asks for a \[capacity=1000000000000, hidden_size=4\] "):
        mm.pack_prompt_embeds({0: torch.ones(2, 4)}, 2, 4, 10**12)
    with pytest.raises(ValueError, match=r"max_len asks for a \[num_rows=2, 3, max_len=1000000000000\]"):
        mm.pack_mrope_tables([None], [0], 2, 10**12)
    dev = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ValueError, match=rf"device='{dev}' is not available"):
        mm.pack_prompt_embeds({0: torch.ones(2, 4)}, 2, 4, 8, device=dev)
    with pytest.raises(ValueError, match=rf"device='{dev}' is not available"):
        mm.pack_mrope_tables([None], [0], 2, 8, device=dev)


def test_device_ops_refuse_a_request_index_of_another_length_or_dtype():
    # static checks only: request_index values in [0, R_b) are the caller's contract (device data)
    packed = mm.pack_prompt_embeds({0: torch.zeros(3, 4)}, 2, 4, 8)
    tables = mm.pack_mrope_tables([None, None], [0, 0], 2, 4)
    pos, n, out = torch.zeros(5, dtype=torch.int64), torch.tensor(5), torch.zeros(5, 4)
    prompt = torch.zeros(2, dtype=torch.int32)
    for req in (torch.zeros(4, dtype=torch.int64), torch.zeros(6, dtype=torch.int64), torch.zeros(5, 1)):
        before = (req.clone(), out.clone())
        with pytest.raises((ValueError, TypeError), match=r"request_index must"):
            mm.gather_prompt_embeds(packed, pos, req, n, out)
        with pytest.raises((ValueError, TypeError), match=r"request_index must"):
            mm.remap_mrope_positions(tables, prompt, pos, req, n)
        assert torch.equal(req, before[0]) and torch.equal(out, before[1])
    with pytest.raises(
        ValueError, match=r"request_index must be \[5\] \(\[L\], like positions\), got shape \(4,\)"
    ):
        mm.gather_prompt_embeds(packed, pos, torch.zeros(4, dtype=torch.int64), n, out)
    with pytest.raises(TypeError, match=r"request_index must hold integers, got torch.float32"):
        mm.gather_prompt_embeds(packed, pos, torch.zeros(5), n, out)
    with pytest.raises(ValueError, match=r"positions must be 1-D \[L\]"):
        mm.gather_prompt_embeds(packed, pos[None], pos[None], n, out)


def test_host_schedule_helpers_refuse_negative_local_counts():
    feature = SimpleNamespace(identifier="x", mm_position=SimpleNamespace(offset=0, length=2, is_embed=None))
    reqs = {"r": SimpleNamespace(mm_features=[feature]), "s": SimpleNamespace(mm_features=[])}
    cache = {"x": torch.zeros(2, 3)}
    counts = np.array([2, -1])
    for call in (
        lambda c: mm.gather_mm_embeddings(["r", "s"], reqs, np.array([0, 1, 2]), c, 0, cache),
        lambda c: mm.build_local_mm_schedule(["r", "s"], reqs, np.array([0, 1, 2]), c, {}),
    ):
        with pytest.raises(ValueError, match=r"local_num_scheduled_tokens\[1\] = -1 is negative"):
            call(counts)
        with pytest.raises(TypeError, match=r"local_num_scheduled_tokens must hold integers"):
            call(np.array([2.0, 1.0]))
        with pytest.raises(
            ValueError, match=r"positions has 3 entries; local_num_scheduled_tokens gives the requests 5"
        ):
            call(np.array([2, 3]))
        assert counts.tolist() == [2, -1]
    got = mm.gather_mm_embeddings(["r", "s"], reqs, np.array([0, 1, 2]), np.array([2, 1]), 0, cache)
    assert got.is_mm_embed.tolist() == [True, True, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_ops_on_cuda_equal_cpu_without_syncs():
    for name in COMPOSITIONS:
        for fn, args in _device_args(name):
            expected = fn(*args)
            cuda_args = to_device(args, "cuda")
            torch.cuda.set_sync_debug_mode("error")
            try:
                got = fn(*cuda_args)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            assert torch.equal(got.cpu(), expected), (fn.__name__, name)
