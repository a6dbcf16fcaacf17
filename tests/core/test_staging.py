"""The host boundary's staging: pinned buffers used in turn, never refilled while a copy may read them."""

import itertools
import threading
import typing

import numpy as np
import pytest
import torch
from helpers import to_device, tree_equal

import pcp_fn
from pcp_fn.core import staging as st
from pcp_fn.protocol.config import two_chunk_bound


class _FakeEvent:
    """Stands in for torch.cuda.Event: the copy it follows completes when synchronize() is called."""

    log: typing.ClassVar[list] = []
    made: typing.ClassVar[list] = [0]

    def __init__(self):
        _FakeEvent.made[0] += 1
        self.serial = _FakeEvent.made[0]

    def record(self, stream):
        _FakeEvent.log.append(("record", self.serial))

    def synchronize(self):
        _FakeEvent.log.append(("wait", self.serial))


class _FakeDevice:
    Event = _FakeEvent

    @staticmethod
    def current_stream(device):
        return None


@pytest.fixture
def fake_gpu(monkeypatch):
    # the CPU plays the device: pinned buffers are plain memory, events are the fakes above; the
    # fake stagings the boundaries make go into a table of their own (a later test's "cuda" is real)
    monkeypatch.setattr(st, "_local", threading.local())
    monkeypatch.setattr(st, "_device_module", lambda device: _FakeDevice)
    monkeypatch.setattr(st, "_pinned", lambda nbytes: torch.empty(nbytes, dtype=torch.uint8))
    _FakeEvent.log = []
    staging = st.HostStaging("cuda")  # constructing needs no real CUDA with the fakes
    monkeypatch.setattr(torch.Tensor, "copy_", _cpu_copy(torch.Tensor.copy_))
    monkeypatch.setattr(torch, "empty", _cpu_empty(torch.empty))
    return staging


def _cpu_copy(copy):
    def copy_(dst, src, non_blocking=False):
        return copy(dst, src)

    return copy_


def _cpu_empty(empty):
    def fake(*size, device=None, **kwargs):
        return empty(*size, **kwargs)

    return fake


def test_buffers_alternate_and_each_waits_for_its_last_copy(fake_gpu):
    got = []
    for step in range(5):
        host = fake_gpu.host(4, np.int32)
        host[:] = step
        got.append(fake_gpu.to_device(host))
    assert [t.tolist() for t in got] == [[k] * 4 for k in range(5)]  # device copies: never overwritten
    records = [e for kind, e in _FakeEvent.log if kind == "record"]
    waits = [e for kind, e in _FakeEvent.log if kind == "wait"]
    assert len(set(records)) == 5 and waits == records[:3]  # step k refills the buffer of step k - 2
    assert _FakeEvent.log.index(("wait", records[0])) > _FakeEvent.log.index(("record", records[1]))


def test_a_buffer_grows_only_after_its_copy_is_done(fake_gpu):
    small = fake_gpu.host(4, np.int32)
    fake_gpu.to_device(small)
    fake_gpu.to_device(fake_gpu.host(4, np.int32))
    big = fake_gpu.host(5000, np.int64)  # buffer 0 again, larger: its old copy was waited for
    assert big.shape == (5000,) and _FakeEvent.log[-1][0] == "wait"
    big[:] = 7
    assert fake_gpu.to_device(big).tolist() == [7] * 5000
    with pytest.raises(RuntimeError, match="to_device needs the array"):
        fake_gpu.to_device(big)


def test_staging_refuses_the_cpu_and_a_single_buffer(fake_gpu):
    with pytest.raises(ValueError, match="the CPU needs no staging"):
        st.HostStaging("cpu")
    with pytest.raises(ValueError, match="slots must be >= 2"):
        st.HostStaging("cuda", slots=1)


def test_make_batch_packs_one_buffer_and_counts_local_tokens_like_the_layout():
    cfg = pcp_fn.PCPConfig(4, 0, 16, 256)
    sched, comp, prompt = [1, 2, 30, 7], [9, 40, 0, 0], [9, 30, 30, 7]
    batch = pcp_fn.make_batch(cfg, sched, comp, prompt, slot_mapping=range(40))
    # one host buffer, back to back: [slots int64 | scheduled | computed | prompt | num_reqs]: one copy
    parts = (batch.slot_mapping, batch.num_scheduled, batch.num_computed, batch.num_prompt, batch.num_reqs)
    for a, b in itertools.pairwise(parts):
        assert a.data_ptr() + a.numel() * a.element_size() == b.data_ptr()
    assert two_chunk_bound(cfg, np.array(sched, np.int64), 1) <= batch.bucket.num_tokens  # one decode
    assert batch.slot_mapping.tolist() == [*range(40), *[cfg.pad_slot_id] * (batch.slot_mapping.numel() - 40)]


def test_mrv2_make_batch_is_one_staged_copy_whose_views_equal_the_cpu_batch(fake_gpu):
    cfg = pcp_fn.mrv2.MRV2Config(2, 0, 8, 64)
    arrays = ([1, 2, 13], [9, 40, 0], [9, 30, 13])
    for kwargs in ({}, dict(input_ids=range(16), positions=range(100, 116))):
        staged = pcp_fn.mrv2.make_batch(cfg, *arrays, device="cuda", **kwargs)
        leaves = [x for x in torch.utils._pytree.tree_leaves(staged) if isinstance(x, torch.Tensor)]
        assert len({x.untyped_storage().data_ptr() for x in leaves}) == 1  # views of one copy
        assert tree_equal(staged, pcp_fn.mrv2.make_batch(cfg, *arrays, **kwargs))
    assert [kind for kind, _ in _FakeEvent.log].count("record") == 2


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_mrv2_make_batch_on_cuda_copies_from_pinned_memory_and_survives_a_slow_stream():
    dev = torch.device("cuda")
    cfg = pcp_fn.mrv2.MRV2Config(2, 0, 8, 64)
    steps = [([1 + k % 3, 5 + k], [9, 0], [9, 5 + k]) for k in range(6)]
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # keep the stream busy: the copies below queue behind it
    on_gpu = [pcp_fn.mrv2.make_batch(cfg, *arrays, device=dev) for arrays in steps]
    torch.cuda.synchronize()
    for arrays, batch in zip(steps, on_gpu):
        assert batch.is_prefilling.device.type == "cuda"
        assert tree_equal(to_device(batch, "cpu"), pcp_fn.mrv2.make_batch(cfg, *arrays))


@cuda
def test_make_batch_on_cuda_copies_from_pinned_memory_and_survives_a_slow_stream():
    dev = torch.device("cuda")
    cfg = pcp_fn.PCPConfig(2, 0, 8, 64)
    steps = [([1 + k % 3, 5 + k], [9, 0], [9, 5 + k]) for k in range(6)]
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # keep the stream busy: the copies below queue behind it
    # three turns of the two pinned buffers while the first copies are still pending
    on_gpu = [pcp_fn.make_batch(cfg, *arrays, dev, slot_mapping=range(sum(arrays[0]))) for arrays in steps]
    torch.cuda.synchronize()
    for arrays, batch in zip(steps, on_gpu):
        expected = pcp_fn.make_batch(cfg, *arrays, slot_mapping=range(sum(arrays[0])))
        assert batch.num_scheduled.device.type == "cuda"
        assert tree_equal(to_device(batch, "cpu"), expected)
    assert st.staging_for(dev)._buffers[0].is_pinned()


def test_make_spec_batch_sends_the_draft_counts_in_the_batch_buffer():
    cfg = pcp_fn.PCPConfig(4, 0, 16, 256, num_spec_tokens=2)
    sched, comp, prompt, drafts = [3, 2, 30], [9, 40, 0], [9, 30, 30], [2, 1, 0]
    batch, spec = pcp_fn.make_spec_batch(cfg, sched, comp, prompt, drafts, slot_mapping=range(35))
    # [slots int64 | scheduled | computed | prompt | draft counts | num_reqs]: one buffer, one copy
    parts = (
        batch.slot_mapping,
        batch.num_scheduled,
        batch.num_computed,
        batch.num_prompt,
        spec.num_draft_tokens,
        batch.num_reqs,
    )
    for a, b in itertools.pairwise(parts):
        assert a.data_ptr() + a.numel() * a.element_size() == b.data_ptr()
    Rb = batch.bucket.num_reqs
    assert spec.num_draft_tokens.dtype == torch.int32
    assert spec.num_draft_tokens.tolist() == drafts + [0] * (Rb - 3)
    assert tree_equal(batch, pcp_fn.make_batch(cfg, sched, comp, prompt, slot_mapping=range(35)))


def test_make_spec_batch_on_a_gpu_is_one_staged_copy(fake_gpu, monkeypatch):
    monkeypatch.setattr(st, "staging_for", lambda device: fake_gpu)
    cfg = pcp_fn.PCPConfig(2, 0, 8, 64, num_spec_tokens=1)
    steps = [([2, 1 + k % 2, 5 + k], [9, 9, 0], [9, 9, 5 + k], [1, k % 2, 0]) for k in range(4)]
    table = torch.zeros(8, 32, dtype=torch.int32)
    for arrays in steps:
        slots = range(sum(arrays[0]))
        _FakeEvent.log = []
        got = pcp_fn.make_spec_batch(cfg, *arrays, "cuda", token_ids=table, slot_mapping=slots)
        assert [kind for kind, _ in _FakeEvent.log].count("record") == 1  # one copy for batch and drafts
        assert tree_equal(got, pcp_fn.make_spec_batch(cfg, *arrays, token_ids=table, slot_mapping=slots))


@cuda
def test_make_spec_batch_on_cuda_copies_from_pinned_memory_and_survives_a_slow_stream():
    dev = torch.device("cuda")
    cfg = pcp_fn.PCPConfig(2, 0, 8, 64, num_spec_tokens=1)
    steps = [([2, 1 + k % 2, 5 + k], [9, 9, 0], [9, 9, 5 + k], [1, k % 2, 0]) for k in range(6)]
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # keep the stream busy: the copies below queue behind it
    on_gpu = [
        pcp_fn.make_spec_batch(cfg, *arrays, dev, slot_mapping=range(sum(arrays[0]))) for arrays in steps
    ]
    torch.cuda.synchronize()
    for arrays, got in zip(steps, on_gpu):
        expected = pcp_fn.make_spec_batch(cfg, *arrays, slot_mapping=range(sum(arrays[0])))
        assert got[1].num_draft_tokens.device.type == "cuda"
        assert tree_equal(to_device(got, "cpu"), expected)
