"""Capturability: fullgraph tracing, meta tensors, the sync detector, fixed shapes, op counts,
export, vmap over ranks, and graph.capture (CPU compile path here, CUDA when present)."""

import dataclasses
import random

import pytest
import torch
import torch.utils._pytree as pytree
from helpers import snapshot, to_device, tree_equal, tree_meta

import pcp_fn
from pcp_fn import Bucket, PCPConfig, graph, init_state, make_batch

CFG = PCPConfig(4, 1, 8, 96, num_spec_tokens=1)


def _slots(sched):
    """KV slots of the scheduled tokens in scheduler order (the host pads them to the bucket)."""
    return range(1000, 1000 + sum(int(n) for n in sched))


# four compositions: decode-only, mixed, prefill-only, empty-but-one
COMPOSITIONS = {
    "decode-only": ([1, 2, 1, 1], [9, 40, 7, 3], [9, 30, 7, 3]),
    "mixed": ([2, 1, 33, 5, 17], [50, 8, 0, 12, 0], [40, 8, 33, 30, 17]),
    "prefill-only": ([21, 7, 40], [0, 16, 0], [21, 30, 40]),
    "empty-but-one": ([0, 0, 0, 9, 0], [0, 0, 0, 0, 0], [0, 0, 0, 9, 0]),
}


def _batch(name, bucket=None):
    sched = COMPOSITIONS[name][0]
    return make_batch(CFG, *COMPOSITIONS[name], bucket=bucket, slot_mapping=_slots(sched))


def _ops(state, batch):
    """Every op with example arguments for this batch's bucket."""
    updated, _ = pcp_fn.update_tokens(state, batch)
    Lb = batch.bucket.num_tokens
    gathered = torch.randn(CFG.pcp_size * Lb, 8)
    return [
        (pcp_fn.update_tokens, (state, batch)),
        (pcp_fn.get_logits_indices, (updated,)),
        (pcp_fn.padded_slot_mapping, (updated, batch.slot_mapping)),
        (pcp_fn.restore_hidden_states, (updated, gathered)),
        (pcp_fn.attention_runs, (updated,)),
        (pcp_fn.step, (state, batch)),
    ]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Dynamo caches per code object; each test starts from a clean cache
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_every_op_traces_fullgraph_and_matches_eager(name):
    batch = _batch(name)
    for fn, args in _ops(init_state(CFG), batch):
        compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend="eager")
        assert tree_equal(compiled(*args), fn(*args)), fn.__name__


def test_every_op_runs_on_meta_tensors():
    batch = _batch("mixed")
    for fn, args in _ops(init_state(CFG), batch):
        meta_args = to_device(args, "meta")
        out = fn(*meta_args)
        ref = fn(*args)
        assert tree_meta(out) == tree_meta(ref), fn.__name__
        for leaf in torch.utils._pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                assert leaf.device.type == "meta"


def test_every_op_passes_the_sync_detector():
    for name in COMPOSITIONS:
        for fn, args in _ops(init_state(CFG), _batch(name)):
            pcp_fn.assert_no_host_syncs(fn, *args)


def test_shapes_depend_only_on_config_and_bucket():
    bucket = Bucket(8, 32)
    metas = {}
    for name in COMPOSITIONS:
        batch = _batch(name, bucket=bucket)
        metas[name] = [tree_meta(fn(*args)) for fn, args in _ops(init_state(CFG), batch)]
    first = next(iter(metas.values()))
    assert all(m == first for m in metas.values())
    # and the state's leaf shapes never change, whatever the bucket (the bucket is static structure)
    s0 = init_state(CFG)
    for name in COMPOSITIONS:
        s1, _ = pcp_fn.update_tokens(s0, _batch(name))
        assert tree_meta(s1)[1] == tree_meta(s0)[1] and s1.bucket == _batch(name).bucket


def test_op_count_is_the_same_for_every_composition():
    counts = {
        name: pcp_fn.count_aten_ops(pcp_fn.step, init_state(CFG), _batch(name)) for name in COMPOSITIONS
    }
    assert len(set(counts.values())) == 1, counts


def test_inductor_compiled_step_equals_eager_bit_for_bit():
    compiled = torch.compile(pcp_fn.step, fullgraph=True, dynamic=False)
    bucket = Bucket(8, 32)
    for name in COMPOSITIONS:
        batch = _batch(name, bucket=bucket)
        assert tree_equal(compiled(init_state(CFG), batch), pcp_fn.step(init_state(CFG), batch))


def test_export_has_no_symbolic_shapes_and_equals_eager():
    bucket = Bucket(8, 32)
    state = init_state(CFG)
    ep = graph.export(pcp_fn.step, state, _batch("mixed", bucket))
    module = ep.module()
    for name in COMPOSITIONS:
        batch = _batch(name, bucket)
        assert tree_equal(module(state, batch), pcp_fn.step(state, batch))


def test_vmap_over_ranks_equals_the_loop_over_ranks():
    batch = _batch("mixed")
    state = init_state(CFG, rank=0)

    def per_rank(rank):
        return pcp_fn.step(dataclasses.replace(state, rank=rank), batch)[1]

    mapped = torch.func.vmap(per_rank)(torch.arange(CFG.pcp_size))
    for r in range(CFG.pcp_size):
        static = pcp_fn.step(init_state(dataclasses.replace(CFG, pcp_rank=r)), batch)[1]
        one = torch.utils._pytree.tree_map(lambda x, r=r: x[r], mapped)
        assert tree_equal(one, static)
    assert torch.equal(pcp_fn.all_ranks(pcp_fn.step, state, batch)[1].positions, mapped.positions)


def test_rank_as_data_traces_one_graph_for_every_rank():
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm

    compiled = torch.compile(pcp_fn.step, fullgraph=True, dynamic=False, backend=backend)
    batch = _batch("mixed")
    for r in range(CFG.pcp_size):
        out = compiled(init_state(CFG, rank=r), batch)
        ref = pcp_fn.step(init_state(dataclasses.replace(CFG, pcp_rank=r)), batch)
        assert tree_equal(out[1], ref[1])
    assert len(frames) == 1


def _random_batch(rng, name=None):
    kind = name or rng.choice(["decode-only", "mixed", "prefill-only", "empty-but-one"])
    n_dec = rng.randint(1, 8) if kind == "decode-only" else rng.randint(1, 4) if kind == "mixed" else 0
    n_pre = rng.randint(1, 8 - n_dec) if kind in ("mixed", "prefill-only") else 0
    sched, comp, prompt = [], [], []
    for _ in range(n_dec):
        sched.append(rng.randint(1, 2))
        comp.append(rng.randint(1, 300))
        prompt.append(rng.randint(0, comp[-1]))
    budget = CFG.max_num_tokens - sum(sched)
    for _ in range(n_pre):
        n = rng.randint(1, max(1, budget // max(1, n_pre)))
        budget -= n
        sched.append(n)
        comp.append(0)
        prompt.append(n)
    if kind == "empty-but-one":
        k = rng.randint(1, 8)
        sched, comp, prompt = [0] * k, [0] * k, [0] * k
        sched[rng.randrange(k)] = rng.randint(1, CFG.max_num_tokens)
        prompt = list(sched)
    return make_batch(CFG, sched, comp, prompt, slot_mapping=_slots(sched))


def test_capture_replays_50_random_batches_bit_for_bit():
    rng = random.Random(7)
    state = init_state(CFG)
    batches = [_random_batch(rng) for _ in range(50)]
    captured = graph.capture(pcp_fn.step, state, batches[0], backend="eager")
    for batch in batches:
        assert tree_equal(captured(state, batch), pcp_fn.step(state, batch))
    assert len(captured) == len({b.bucket for b in batches})  # one graph per bucket


def test_bind_replays_the_current_contents_of_the_bound_arguments():
    rng = random.Random(5)
    state = init_state(CFG)
    bucket = CFG.capacity
    staged = snapshot(make_batch(CFG, [], [], [], bucket=bucket, slot_mapping=[]))  # persistent inputs
    captured = graph.capture(pcp_fn.step, state, staged, backend="eager")
    replay = captured.bind(state, staged)
    for _ in range(10):
        b = _random_batch(rng)
        n = int(b.num_reqs)
        b = make_batch(
            CFG,
            b.num_scheduled[:n],
            b.num_computed[:n],
            b.num_prompt[:n],
            bucket=bucket,
            slot_mapping=_slots(b.num_scheduled),
        )
        for dst, src in zip(pytree.tree_leaves(staged), pytree.tree_leaves(b)):
            dst.copy_(src)  # stage in place, then replay without the lookup
        assert tree_equal(replay(), pcp_fn.step(state, b))
    assert len(captured) == 1
    fixed = graph.capture(pcp_fn.step, state, staged, grow=False, backend="eager")
    with pytest.raises(graph.CaptureError, match="no graph was captured"):
        fixed.bind(state, _batch("mixed", Bucket(8, 64)))


def test_capture_with_inductor_in_one_bucket():
    rng = random.Random(11)
    bucket = CFG.capacity
    state = init_state(CFG)
    example = make_batch(CFG, [], [], [], bucket=bucket, slot_mapping=[])
    captured = graph.capture(pcp_fn.step, state, example)
    assert captured.kind == "compile"
    for _ in range(20):
        b = _same_bucket(_random_batch(rng), bucket)
        assert tree_equal(captured(state, b), pcp_fn.step(state, b))
    assert len(captured) == 1


def _same_bucket(b, bucket):
    n = int(b.num_reqs)
    sched, comp, prompt = (x[:n] for x in (b.num_scheduled, b.num_computed, b.num_prompt))
    return make_batch(CFG, sched, comp, prompt, bucket=bucket, slot_mapping=_slots(sched))


def test_capture_with_aoti_replays_every_composition_and_grows(tmp_path):
    # AOTInductor: one package per bucket in package_dir, loaded and called with the flat leaves
    rng = random.Random(5)
    bucket = Bucket(8, 64)
    state = init_state(CFG)
    captured = graph.capture(
        pcp_fn.step, state, _batch("mixed", bucket), backend="aoti", package_dir=tmp_path
    )
    assert captured.kind == "aoti" and len(list(tmp_path.glob("*.pt2"))) == 1
    for _ in range(20):
        b = _same_bucket(_random_batch(rng), bucket)
        got = captured(state, b)
        assert tree_equal(got, pcp_fn.step(state, b))
        state = got[0]  # a state from the graph feeds the next call (entry op: config and rank only)
    # a state of the same config whose entry fields are other tensors (equal values): served
    fresh = init_state(CFG)
    assert tree_equal(captured(fresh, b), pcp_fn.step(fresh, b))
    assert len(captured) == 1
    other = _batch("decode-only")  # another bucket: a second package
    assert tree_equal(captured(state, other), pcp_fn.step(state, other))
    assert len(captured) == 2 and len(list(tmp_path.glob("*.pt2"))) == 2


def test_capture_errors_leave_the_callable_usable():
    state = init_state(CFG)
    small = Bucket(8, 32)
    captured = graph.capture(pcp_fn.step, state, _batch("mixed", small), grow=False, backend="eager")
    # a bucket that was not captured up front
    with pytest.raises(graph.CaptureError, match="no graph was captured"):
        captured(state, _batch("mixed", Bucket(8, 64)))
    # a batch made for a larger config exceeds the captured capacity
    big = dataclasses.replace(CFG, max_num_reqs=64, max_num_tokens=4096)
    big_batch = make_batch(big, [3000], [0], [3000], slot_mapping=range(3000))
    with pytest.raises(graph.CaptureError, match="exceeds the captured capacity"):
        captured(state, big_batch)
    # a state of another config
    with pytest.raises(graph.CaptureError, match="differ from the captured"):
        captured(init_state(big), _batch("mixed", small))
    # a batch of another config whose bucket fits
    other = dataclasses.replace(CFG, pad_slot_id=-2)
    sched = COMPOSITIONS["mixed"][0]
    other_batch = make_batch(other, *COMPOSITIONS["mixed"], bucket=small, slot_mapping=_slots(sched))
    with pytest.raises(graph.CaptureError, match="the batch was built for"):
        captured(state, other_batch)
    batch = _batch("decode-only", small)
    assert tree_equal(captured(state, batch), pcp_fn.step(state, batch))
    captured.capture(state, _batch("mixed", Bucket(8, 64)))  # up front, explicitly
    batch = _batch("prefill-only", Bucket(8, 64))
    assert tree_equal(captured(state, batch), pcp_fn.step(state, batch))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_graph_replay_equals_eager_without_syncs():
    dev = torch.device("cuda")
    rng = random.Random(3)
    state = init_state(CFG, dev)
    batches = [to_device(_random_batch(rng), dev) for _ in range(50)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        captured = graph.capture(pcp_fn.step, state, batches[0])
        assert captured.kind == "cuda-graph"
        for b in batches:
            got = captured(state, b)
            torch.cuda.set_sync_debug_mode(0)
            assert tree_equal(got, pcp_fn.step(state, b))
            torch.cuda.set_sync_debug_mode("error")
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_capture_checks_mrv2_batches_too():
    from pcp_fn import mrv2

    cfg = mrv2.MRV2Config(2, 0, 4, 64)
    state = mrv2.init_state(cfg)
    example = mrv2.make_batch(cfg, [1, 20], [9, 0], [9, 20])

    def local_batch(s, b):
        return mrv2.partition_batch(s, b)[1]

    captured = graph.capture(local_batch, state, example, backend="eager")
    big = mrv2.MRV2Config(2, 0, 64, 4096)
    with pytest.raises(graph.CaptureError, match="exceeds the captured capacity"):
        captured(state, mrv2.make_batch(big, [3000], [0], [3000]))
    later = mrv2.make_batch(cfg, [2, 19], [11, 0], [11, 19], bucket=example.bucket)
    assert tree_equal(captured(state, later), local_batch(state, later))
    assert len(captured) == 1


def _every_bucket_in_random_order(rng):
    """One batch per configured bucket (each the smallest that holds it), shuffled, twice over."""
    batches = []
    for bucket in CFG.buckets():
        reqs = min(bucket.num_reqs, 3)
        # fill the bucket's token rows with prefills so the bucket is the smallest one that fits
        for _ in range(200):
            sched = [rng.randint(1, CFG.max_num_tokens) for _ in range(reqs)]
            if sum(sched) > CFG.max_num_tokens:
                continue
            try:
                b = make_batch(CFG, sched, [0] * reqs, sched, slot_mapping=_slots(sched), bucket=bucket)
            except ValueError:
                continue
            batches.append(b)
            break
    batches = batches * 2
    rng.shuffle(batches)
    return batches


@pytest.mark.parametrize("how", ["capture", "compile"])
def test_a_trace_visiting_every_bucket_compiles_one_graph_per_bucket(how):
    # the state fed to each step is the previous step's (built for another bucket): entry ops read
    # only its config and rank, so neither graph.capture nor torch.compile keys on it
    from torch._dynamo.utils import counters

    batches = _every_bucket_in_random_order(random.Random(5))
    buckets = {b.bucket for b in batches}
    assert len(buckets) >= 10
    counters.clear()
    state = init_state(CFG)
    if how == "capture":  # one code object per bucket: Dynamo's recompile limit never applies
        fn, limit = graph.Captured(pcp_fn.step, backend="eager"), torch._dynamo.config.recompile_limit
    else:  # one code object for every bucket: each bucket is one recompile of it
        fn = torch.compile(pcp_fn.step, fullgraph=True, dynamic=False, backend="eager")
        limit = len(buckets)
    with torch._dynamo.config.patch(recompile_limit=limit):
        for batch in batches:
            expected = pcp_fn.step(state, batch)
            state, out = fn(state, batch)
            assert state.bucket == batch.bucket
            assert tree_equal((state, out), expected)
    assert counters["stats"]["unique_graphs"] == len(buckets)
    if how == "capture":
        assert len(fn) == len(buckets)


def test_fast_flatten_and_rebuild_agree_with_torch_pytree():
    import torch.utils._pytree as pytree

    from pcp_fn.graph.flat import Rebuild, flatten

    for cfg in (CFG, dataclasses.replace(CFG, hybrid_attn=True)):
        state = init_state(cfg, rank=1)
        batch = make_batch(cfg, *COMPOSITIONS["mixed"], slot_mapping=_slots(COMPOSITIONS["mixed"][0]))
        for tree in ((state, batch), pcp_fn.step(state, batch), pcp_fn.attention_metadata(state, batch)):
            leaves, key = flatten(tree)
            expected = pytree.tree_leaves(tree)
            assert len(leaves) == len(expected) and all(a is b for a, b in zip(leaves, expected))
            assert tree_equal(Rebuild(tree)(leaves), tree)
            memo = {}
            assert flatten(tree, memo) == (leaves, key) and flatten(tree, memo)[1] == key
        # what a graph specialises on changes the key: the bucket, a dtype
        other = make_batch(cfg, [3], [0], [3], slot_mapping=[1, 2, 3])
        assert flatten((state, other))[1] != flatten((state, batch))[1]
        recast = dataclasses.replace(batch, slot_mapping=batch.slot_mapping.to(torch.int32))
        assert flatten((state, recast))[1] != flatten((state, batch))[1]
        again = make_batch(cfg, *COMPOSITIONS["mixed"], slot_mapping=_slots(COMPOSITIONS["mixed"][0]))
        assert flatten((state, again))[1] == flatten((state, batch))[1]


def test_device_graph_inputs_copy_only_what_changed():
    import torch.utils._pytree as pytree

    from pcp_fn.graph.capture import StaticInputs

    def leaves(*tree):
        return pytree.tree_leaves(tree)

    def packed(batch):  # its leaves as views of one buffer, as make_batch lays them out on a GPU/NPU
        parts = [batch.slot_mapping.view(torch.int32), batch.num_scheduled, batch.num_computed]
        parts += [batch.num_prompt, batch.num_reqs.reshape(1)]
        slots, sched, comp, prompt, reqs = torch.cat(parts).split_with_sizes([p.numel() for p in parts])
        return dataclasses.replace(
            batch,
            slot_mapping=slots.view(torch.int64),
            num_scheduled=sched,
            num_computed=comp,
            num_prompt=prompt,
            num_reqs=reqs.view(()),
        )

    state = init_state(CFG)
    first, second = packed(_batch("mixed")), packed(_batch("mixed"))
    inputs = StaticInputs(leaves(state, first))
    n_state = sum(isinstance(x, torch.Tensor) for x in leaves(state))
    assert inputs.update(leaves(state, first)) == n_state + 1  # the first replay: the state, one batch copy
    assert inputs.update(leaves(state, first)) == 0  # the same tensors, untouched: nothing
    assert inputs.update(leaves(state, second)) == 1  # a new batch: its packed buffer, one copy
    first.num_computed.add_(1)  # modified in place: copied again
    assert inputs.update(leaves(state, first)) == 1
    assert inputs.update(leaves(state, first)) == 0
    same = [torch.equal(a, b) for a, b in zip(inputs.buffers, leaves(state, first)) if a is not None]
    assert all(same)
    # a batch whose leaves are separate tensors: leaf by leaf
    loose = pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, second)
    assert inputs.update(leaves(state, loose)) == 5
    assert all(torch.equal(a, b) for a, b in zip(inputs.buffers, leaves(state, loose)) if a is not None)
    # the static batch views share one buffer, laid out like make_batch's
    views = [b for b, x in zip(inputs.buffers, leaves(state, first)) if x is not None][-5:]
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1


def test_persistent_inputs_are_their_own_static_buffers():
    """capture(persistent_inputs=True): a device graph reads the caller's staging tensors in
    place: staging new contents and replaying copies nothing; other tensors are copied in."""
    from pcp_fn.graph.capture import StaticInputs

    staging = [torch.zeros(8, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)]
    inputs = StaticInputs(list(staging), in_place=True)
    assert all(b is s for b, s in zip(inputs.buffers, staging))
    staging[0][:3] = 7  # the next step, staged in place
    assert inputs.update(staging) == 0
    other = [torch.arange(8, dtype=torch.int32), staging[1]]
    assert inputs.update(other) == 1 and torch.equal(staging[0], other[0])  # copied into the staging


def test_entry_states_with_the_same_constant_tensors_replay_as_the_template():
    state = init_state(CFG)
    captured = graph.Captured(pcp_fn.step, backend="eager")
    batch = _batch("mixed")
    (template, same_batch) = captured.entry_args(state, batch)
    assert template is state and same_batch is batch
    rebuilt = dataclasses.replace(state, constants=dict(state.constants))  # a new dict, same tensors
    assert captured.entry_args(rebuilt, None)[0] is state
    other = init_state(CFG)  # equal values, other tensors: this call's entry fields are used
    swapped = captured.entry_args(other, None)[0]
    assert swapped is not state and swapped.constants is other.constants


def test_inductor_options_scalar_code_for_index_maps_vectorised_for_hidden_rows():
    state, batch = init_state(CFG), _batch("mixed")
    cpu = torch.device("cpu")
    assert graph.inductor_options((state, batch), cpu) == {"cpp.simdlen": 1}
    updated, _ = pcp_fn.update_tokens(state, batch)
    gathered = torch.randn(CFG.pcp_size * batch.bucket.num_tokens, 8)
    assert graph.inductor_options((updated, gathered), cpu) == {}  # rows of floats: vectorised
    assert graph.inductor_options((state, batch), torch.device("meta")) == {}  # not the C++ backend
    # both kinds of code equal eager, and an explicit choice is the caller's
    for options in (None, {}):
        captured = graph.capture(pcp_fn.step, state, batch, inductor_options=options)
        assert tree_equal(captured(state, batch), pcp_fn.step(state, batch))
    restore = graph.capture(pcp_fn.restore_hidden_states, updated, gathered)
    assert tree_equal(restore(updated, gathered), pcp_fn.restore_hidden_states(updated, gathered))


def test_capture_with_backend_none_compiles_with_torch_compile_s_default():
    # backend=None is torch.compile's default backend (inductor); torch 2.10's torch.compile took the
    # None for a compiler function and failed at the first compile ('NoneType' object is not callable)
    state, batch = init_state(CFG), _batch("mixed")
    updated, _ = pcp_fn.update_tokens(state, batch)
    gathered = torch.randn(CFG.pcp_size * batch.bucket.num_tokens, 8)
    restore = graph.capture(pcp_fn.restore_hidden_states, updated, gathered, backend=None)
    assert restore.kind == "compile" and len(restore) == 1
    assert tree_equal(restore(updated, gathered), pcp_fn.restore_hidden_states(updated, gathered))


def test_aoti_packages_are_scalar_for_index_maps_and_vectorised_for_hidden_rows(tmp_path):
    # the package records the vector ISA it was built for: none for the scalar bookkeeping graph
    from torch._C._aoti import AOTIModelPackageLoader

    def isa(captured):
        (path,) = tmp_path.glob(f"{captured.fn.__name__}_*.pt2")
        return AOTIModelPackageLoader.load_metadata_from_package(str(path), "model")["AOTI_CPU_ISA"]

    state, batch = init_state(CFG), _batch("mixed")
    updated, _ = pcp_fn.update_tokens(state, batch)
    gathered = torch.randn(CFG.pcp_size * batch.bucket.num_tokens, 8)
    step = graph.capture(pcp_fn.step, state, batch, backend="aoti", package_dir=tmp_path)
    restore = graph.capture(
        pcp_fn.restore_hidden_states, updated, gathered, backend="aoti", package_dir=tmp_path
    )
    assert isa(step) == "INVALID_VEC_ISA" and isa(restore) != "INVALID_VEC_ISA"
    assert tree_equal(step(state, batch), pcp_fn.step(state, batch))
    assert tree_equal(restore(updated, gathered), pcp_fn.restore_hidden_states(updated, gathered))
