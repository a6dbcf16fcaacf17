"""Differential check: pcp_fn.mrv2 (and the test oracle) against vLLM's REAL MRV2 ``PCPManager``.

Development only: needs vLLM's ``pcp_manager.py`` reference (found by ``reference.py``). Run:

    python tools/check_mrv2_against_reference.py [num_examples]

The reference imports vllm; small stand-ins for those imports go into ``sys.modules``
(through ``reference_loader._module``), then the reference text minus its first line (a
path header) is executed. For each random global batch, configuration (P, replicated /
sharded decodes, DCP 1 or 2, interleave, MoE gather) and graph mode (NONE,
PIECEWISE, FULL), every rank's ``partition_batch`` and the consumers of its
layout are compared with pcp_fn.mrv2 on the reference's rows, and pcp_fn's padding
rows with their documented values. Each rank builds its batch with its own config
(even ranks keep the rank static, odd ones give it as data); the global inputs
are handed over at the bucket's ``F_b = min(T, P * Lp)`` rows and the restored
hidden states come back at ``F_b`` rows (the reference's ``num_tokens`` rows first).
It prints how many batches matched.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import sys
import types

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import reference_loader  # noqa: E402
from oracle_mrv2 import oracle_layout, oracle_local  # noqa: E402
from reference import reference_source  # noqa: E402

from pcp_fn import Bucket, mrv2  # noqa: E402

# --------------------------------------------------------------------------- stand-ins for vllm


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


class InputBuffers:
    """vLLM ``InputBuffers``: the persistent per-step buffers, same dtypes."""

    def __init__(self, max_num_reqs, max_num_tokens, device):
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.device = device
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.is_padding = torch.zeros(max_num_tokens, dtype=torch.bool, device=device)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)


_BATCH_FIELDS = (
    "req_ids num_reqs num_reqs_after_padding idx_mapping idx_mapping_np expanded_idx_mapping "
    "expanded_local_pos num_scheduled_tokens num_tokens num_tokens_after_padding num_draft_tokens "
    "num_draft_tokens_per_req query_start_loc query_start_loc_np seq_lens seq_lens_cpu_upper_bound "
    "dcp_local_seq_lens dcp_local_seq_lens_cpu_upper_bound num_computed_tokens_np prefill_len_np "
    "num_computed_prefill_tokens_np is_prefilling_np max_seq_len_np has_prefill decode_graph_eligible "
    "prefill_runs_as_decode_np input_ids positions is_padding logits_indices cu_num_logits "
    "cu_num_logits_np prompt_lens"
).split()
InputBatch = dataclasses.make_dataclass("InputBatch", [(f, object, None) for f in _BATCH_FIELDS])


def async_tensor_h2d(data, device=None, out=None, **_):
    tensor = torch.from_numpy(np.ascontiguousarray(data))
    return out.copy_(tensor) if out is not None else tensor.to(device)


def get_dcp_local_seq_lens(seq_lens, dcp_size=1, dcp_rank=None, cp_kv_cache_interleave_size=1):
    """vLLM's formula: blocks of ``I`` tokens dealt round-robin to the DCP ranks."""
    I = cp_kv_cache_interleave_size
    ranks = torch.arange(dcp_size) if dcp_rank is None else torch.tensor([dcp_rank])
    s = seq_lens.to(torch.int32).unsqueeze(-1)
    base = s // I // dcp_size * I
    rest = torch.clip(s - base * dcp_size - ranks.to(torch.int32) * I, 0, I)
    return (base + rest).squeeze(1)


class _Group:
    """``all_gather`` returns the gathered tensor registered for the local one."""

    def __init__(self):
        self.table = {}

    def all_gather(self, tensor, dim=0):
        assert dim == 0
        return self.table[id(tensor)]


GROUP = _Group()


def load_reference_manager():
    path, text = reference_source("vllm_pcp_manager")
    m = reference_loader._module
    m("vllm")
    m("vllm.config", CUDAGraphMode=CUDAGraphMode, VllmConfig=object)
    m("vllm.distributed")
    m("vllm.distributed.parallel_state", get_pcp_group=lambda: GROUP, get_dcp_group=lambda: GROUP)
    m("vllm.logger", init_logger=logging.getLogger)
    m("vllm.utils")
    m("vllm.utils.torch_utils", async_tensor_h2d=async_tensor_h2d)
    for name in ("vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends", "vllm.v1.worker"):
        m(name)
    m("vllm.v1.attention.backends.utils", PAD_SLOT_ID=-1, get_dcp_local_seq_lens=get_dcp_local_seq_lens)
    m("vllm.v1.worker.gpu")
    m("vllm.v1.worker.gpu.block_table", BlockTables=object)
    m("vllm.v1.worker.gpu.input_batch", InputBatch=InputBatch, InputBuffers=InputBuffers)
    mod = types.ModuleType("reference_mrv2_pcp_manager")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(text, path, "exec"), mod.__dict__)
    return mod.PCPManager


PCPManager = load_reference_manager()

# --------------------------------------------------------------------------- random cases


@st.composite
def cases(draw):
    P = draw(st.sampled_from([1, 2, 3, 4, 8]))
    mode = draw(st.sampled_from(["replicated", "sharded", "dcp"]))
    R = draw(st.integers(1, 10))
    T = draw(st.integers(4, 160))
    n = draw(st.integers(1, R))
    sched, computed, plen = [], [], []
    budget = T
    for _ in range(n):
        kind = draw(st.sampled_from(["decode", "decode", "fresh", "chunked", "short", "zero"]))
        if kind == "decode":
            k, c = draw(st.integers(1, 3)), draw(st.integers(1, 400))
            p = draw(st.integers(0, c))
        elif kind == "zero":
            k, c, p = 0, draw(st.integers(0, 40)), draw(st.integers(0, 50))
        else:
            k = draw(st.integers(1, 2 * P if kind == "short" else 70))
            c = 0 if kind in ("fresh", "short") else draw(st.integers(1, 200))
            p = c + k + draw(st.integers(0, 3))
        k = min(k, budget)
        budget -= k
        sched.append(k)
        computed.append(c)
        plen.append(p)
    total = sum(sched)
    first = np.cumsum([0, *sched])
    positions = [computed[i] + t for i in range(n) for t in range(sched[i])]
    if draw(st.booleans()):
        positions = [draw(st.integers(0, 900)) for _ in range(total)]
    return dict(
        P=P,
        R=R,
        T=T,
        shard=mode == "sharded",
        dcp=2 if mode == "dcp" else 1,
        interleave=draw(st.sampled_from([1, 2, 4])),
        moe=draw(st.booleans()),
        sched=sched,
        computed=computed,
        prefill_len=plen,
        prefilling=[c < p for c, p in zip(computed, plen)],
        idx_mapping=draw(st.permutations(list(range(R))))[:n],
        input_ids=[draw(st.integers(0, 30_000)) for _ in range(total)],
        positions=positions,
        # the global batch's own padding; at least one row, which the padding rows gather
        extra_tokens=draw(st.integers(0 if total else 1, T - total)),
        graph=draw(st.sampled_from(["NONE", "PIECEWISE", "FULL"])),
        slack_tokens=draw(st.integers(0, 8)),
        slack_reqs=draw(st.integers(0, 4)),
        first=first.tolist(),
    )


STATS = {"batches": 0, "rank_checks": 0, "full_mixed_refused_by_reference": 0, "too_small_both_raise": 0}


def _eq(name, got, want):
    got = got.tolist() if isinstance(got, (torch.Tensor, np.ndarray)) else got
    want = want.tolist() if isinstance(want, (torch.Tensor, np.ndarray)) else want
    assert got == want, f"{name}: pcp_fn {got} != reference {want}"


def reference_global_batch(c, Tg):
    n, total = len(c["sched"]), sum(c["sched"])
    qsl = np.asarray(c["first"], dtype=np.int32)
    pad = Tg - total
    idx = np.asarray(c["idx_mapping"], dtype=np.int32)
    comp = np.asarray(c["computed"], dtype=np.int32)
    plen = np.asarray(c["prefill_len"], dtype=np.int32)
    return InputBatch(
        req_ids=[f"r{i}" for i in range(n)],
        num_reqs=n,
        num_reqs_after_padding=n,
        idx_mapping=torch.from_numpy(idx),
        idx_mapping_np=idx,
        expanded_idx_mapping=torch.from_numpy(idx),
        expanded_local_pos=torch.zeros(n, dtype=torch.int32),
        num_scheduled_tokens=np.asarray(c["sched"], dtype=np.int32),
        num_tokens=total,
        num_tokens_after_padding=Tg,
        num_draft_tokens=0,
        query_start_loc=torch.from_numpy(qsl),
        query_start_loc_np=qsl,
        num_computed_tokens_np=comp,
        prefill_len_np=plen,
        num_computed_prefill_tokens_np=np.minimum(comp, plen),
        is_prefilling_np=np.asarray(c["prefilling"], dtype=np.bool_),
        has_prefill=any(c["prefilling"]),
        input_ids=torch.tensor(c["input_ids"] + [0] * pad, dtype=torch.int32),
        positions=torch.tensor(c["positions"] + [0] * pad, dtype=torch.int64),
        is_padding=torch.zeros(Tg, dtype=torch.bool),
    )


def _rows(t, rows):
    """``t`` cut or zero-padded to ``rows`` along its last dim (only entries past the tokens change)."""
    n = t.shape[-1]
    return t[..., :rows] if n >= rows else torch.nn.functional.pad(t, (0, rows - n))


def check_rank(c, cfg, rank, mode, Lp, Rl):
    P, N = c["P"], sum(c["sched"])
    Tg = N + c["extra_tokens"]
    # every rank builds its own batch with its own config (a batch of another config is refused)
    rank_cfg = dataclasses.replace(cfg, pcp_rank=rank)
    batch = mrv2.make_batch(
        rank_cfg,
        c["sched"],
        c["computed"],
        c["prefill_len"],
        is_prefilling=c["prefilling"],
        idx_mapping=c["idx_mapping"],
        input_ids=c["input_ids"],
        positions=c["positions"],
        bucket=Bucket(Rl, Lp),
    )
    F = mrv2.token_rows(rank_cfg, batch.bucket)
    mgr = PCPManager(
        P,
        rank,
        torch.device("cpu"),
        c["shard"],
        max_num_reqs=c["R"],
        max_num_tokens=c["T"],
        dcp_world_size=c["dcp"],
        cp_interleave=c["interleave"],
        moe_gathers_tokens=c["moe"],
    )
    gb = reference_global_batch(c, Tg)
    desc = types.SimpleNamespace(cg_mode=CUDAGraphMode[mode], num_tokens=Lp, num_reqs=Rl)
    # alternate a static rank and rank as data
    state = mrv2.init_state(rank_cfg) if rank % 2 == 0 else mrv2.init_state(rank_cfg, rank=rank)
    state, ours = mrv2.partition_batch(state, batch)
    lay = state.layout
    assert state.bucket == batch.bucket and lay.hidden_restore_idx.shape == (F,)
    if mode == "FULL" and gb.has_prefill:
        try:
            mgr.partition_batch(gb, desc)
        except RuntimeError as e:  # the reference's FULL graphs are decode-only; pcp_fn serves mixed batches
            assert "decode-only" in str(e)
            STATS["full_mixed_refused_by_reference"] += 1
            return
        raise AssertionError("the reference accepted a mixed batch in a FULL graph")
    loc = mgr.partition_batch(gb, desc)
    theirs = {f: getattr(loc, f) for f in _BATCH_FIELDS}
    theirs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in theirs.items()}

    # the layout
    _eq("padded_gather_idx", lay.padded_gather_idx, mgr._padded_gather_idx)
    _eq("gathered_kv_write_mask", lay.gathered_kv_write_mask, mgr._gathered_kv_write_mask)
    _eq("hidden_restore_idx", lay.hidden_restore_idx[:N], mgr._hidden_restore_idx)
    _eq("hidden_restore_idx padding", lay.hidden_restore_idx[N:], [0] * (F - N))
    _eq("local gather idx", ours.gather_idx, mgr._local_gather_idx)
    _eq(
        "num_tokens_for_dispatch",
        int(lay.per_rank_num_tokens.max()),
        mgr.get_num_tokens_for_dispatch(gb.num_scheduled_tokens, gb.is_prefilling_np),
    )

    # the local batch on the reference's rows; pcp_fn's extra rows hold the documented padding
    nl, nrp = theirs["num_reqs"], theirs["num_reqs_after_padding"]
    n_tok = theirs["num_tokens"]
    assert int(ours.num_reqs) == nl and int(ours.num_tokens) == n_tok
    assert theirs["num_tokens_after_padding"] == Lp and nrp == (Rl if mode == "FULL" else nl)
    for name, s_name, rows in (
        ("idx_mapping", "idx_mapping", nl),
        ("idx_mapping", "idx_mapping_np", nl),
        ("num_scheduled_tokens", "num_scheduled_tokens", nl),
        ("num_computed_tokens", "num_computed_tokens_np", nl),
        ("prefill_len", "prefill_len_np", nl),
        ("num_computed_prefill_tokens", "num_computed_prefill_tokens_np", nl),
        ("query_start_loc", "query_start_loc", nrp + 1),
        ("query_start_loc", "query_start_loc_np", nrp + 1),
        ("seq_lens", "seq_lens", nrp),
        ("seq_lens_cpu_upper_bound", "seq_lens_cpu_upper_bound", nrp),
        ("is_prefilling", "is_prefilling_np", nrp),
        ("logits_indices", "logits_indices", nrp),
        ("cu_num_logits", "cu_num_logits", nl + 1),
        ("cu_num_logits", "cu_num_logits_np", nl + 1),
    ):
        _eq(name, getattr(ours, name)[:rows], theirs[s_name])
    for name in ("idx_mapping", "num_scheduled_tokens", "num_computed_tokens", "prefill_len", "seq_lens"):
        _eq(f"{name} padding", getattr(ours, name)[nl:], [0] * (Rl - nl))
    _eq("query_start_loc padding", ours.query_start_loc[nl + 1 :], [n_tok] * (Rl - nl))
    _eq("req_ids", [f"r{g}" for g in ours.global_batch_req_idx[:nl].tolist()], loc.req_ids)
    if c["dcp"] > 1:
        _eq(
            "dcp bound",
            ours.dcp_local_seq_lens_cpu_upper_bound[:nrp],
            theirs["dcp_local_seq_lens_cpu_upper_bound"],
        )
    else:
        assert (
            theirs["dcp_local_seq_lens_cpu_upper_bound"] is None
            and ours.dcp_local_seq_lens_cpu_upper_bound is None
        )
    assert bool(ours.has_prefill) == theirs["has_prefill"] and theirs["decode_graph_eligible"] == (
        not theirs["has_prefill"]
    )
    _eq("input_ids", ours.input_ids, theirs["input_ids"])
    _eq("positions", ours.positions, theirs["positions"])
    _eq("is_padding", ours.moe_is_padding if c["moe"] else ours.is_padding, theirs["is_padding"])

    # the oracle agrees with the reference too
    orc = oracle_local(
        P, rank, c, Lp, Rl, shard=c["shard"], dcp=c["dcp"], interleave=c["interleave"], moe=c["moe"]
    )
    assert orc.query_start_loc[: nrp + 1] == theirs["query_start_loc"].tolist()
    assert orc.seq_lens[:nrp] == theirs["seq_lens"].tolist() and orc.input_ids == theirs["input_ids"].tolist()
    orc_lay = oracle_layout(P, c["sched"], c["prefilling"], Lp, c["shard"], c["dcp"])
    assert orc_lay.hidden_restore_idx == mgr._hidden_restore_idx.tolist()
    assert orc_lay.padded_gather_idx == mgr._padded_gather_idx.tolist()

    # slot mappings
    slots = torch.randint(0, 1 << 30, (2, Tg), dtype=torch.int64)
    _, got = mrv2.gathered_slot_mappings(state, _rows(slots, F))
    _eq("gathered slot mappings", got, mgr._convert_to_gathered_slot_mappings(slots))

    # hidden-state restores (the reference all-gathers; we hand both the same gathered rows)
    H = 3
    local_h, local_a = torch.randn(Lp, H, dtype=torch.float64), torch.randn(Lp, H, dtype=torch.float64)
    gathered_h = torch.randn(P * Lp, H, dtype=torch.float64)
    gathered_a = torch.randn(P * Lp, H, dtype=torch.float64)
    GROUP.table = {id(local_h): gathered_h, id(local_a): gathered_a}
    _, got = mrv2.restore_hidden_states(state, gathered_h)
    assert got.shape == (F, H) and torch.equal(got[:N], mgr.restore_hidden_states(local_h))
    assert all(torch.equal(row, gathered_h[0]) for row in got[N:])  # the documented padding rows
    ref_h, ref_aux, _ = mgr.restore_for_sampling(local_h, [local_a])
    _, got = mrv2.restore_for_sampling(state, gathered_h, [gathered_a])
    assert torch.equal(got.hidden_states[:N], ref_h)
    assert torch.equal(got.aux_hidden_states[0][:N], ref_aux[0])

    # draft prefill: gather the drafter's ids, then restore its outputs
    draft_ids = torch.randint(0, 30_000, (Tg,), dtype=torch.int32)
    mgr.prepare_draft_prefill(gb, draft_ids)
    _, draft = mrv2.prepare_draft_prefill(state, ours, _rows(draft_ids, F))
    _eq("draft input_ids", draft.input_ids, mgr.draft_prefill_batch.input_ids)
    s_last, s_hidden = mgr.restore_draft_prefill(local_h, local_a)
    _, got = mrv2.restore_draft_prefill(state, gathered_h, gathered_a)
    assert torch.equal(got.last_hidden_states[:N], s_last) and torch.equal(got.hidden_states[:N], s_hidden)
    STATS["rank_checks"] += 1


def check_too_small(c, cfg, need):
    if need < 2:  # a bucket has at least one row
        return
    mgr = PCPManager(
        c["P"],
        0,
        torch.device("cpu"),
        c["shard"],
        max_num_reqs=c["R"],
        max_num_tokens=c["T"],
        dcp_world_size=c["dcp"],
        cp_interleave=c["interleave"],
    )
    gb = reference_global_batch(c, sum(c["sched"]))
    desc = types.SimpleNamespace(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=need - 1, num_reqs=None)
    messages = []
    for call in (
        lambda: mgr.partition_batch(gb, desc),
        lambda: mrv2.make_batch(
            cfg,
            c["sched"],
            c["computed"],
            c["prefill_len"],
            is_prefilling=c["prefilling"],
            bucket=Bucket(cfg.max_local_reqs, need - 1),
        ),
    ):
        try:
            call()
        except ValueError as e:
            messages.append(str(e))
    assert len(messages) == 2 and all("smaller than the largest rank-local batch" in m for m in messages), (
        messages
    )
    STATS["too_small_both_raise"] += 1


@settings(
    max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases())
def check(c):
    cfg = mrv2.MRV2Config(
        c["P"],
        0,
        c["R"],
        c["T"],
        shard_decode_requests=c["shard"],
        dcp_size=c["dcp"],
        cp_kv_cache_interleave_size=c["interleave"],
        moe_gathers_tokens=c["moe"],
    )
    tokens, segs = mrv2.rank_counts(cfg, np.asarray(c["sched"]), np.asarray(c["prefilling"]))
    need_tokens, need_reqs = int(tokens.max()), max(int(segs.max()), 1)
    mode = c["graph"]
    if mode == "NONE" and need_tokens == 0:
        mode = "PIECEWISE"  # the reference would size its buffers 0; a bucket has at least one row
    Lp = need_tokens if mode == "NONE" else min(max(need_tokens, 1) + c["slack_tokens"], c["T"])
    Rl = min(need_reqs + c["slack_reqs"], cfg.max_local_reqs)
    for rank in range(c["P"]):
        check_rank(c, cfg, rank, mode, Lp, Rl)
    check_too_small(c, cfg, need_tokens)
    STATS["batches"] += 1


if __name__ == "__main__":
    check()
    print(f"pcp_fn.mrv2 == oracle == vLLM's pcp_manager.py on {STATS['batches']} random batches")
    print(f"  {STATS['rank_checks']} rank checks equal on every compared output")
    print(
        f"  {STATS['full_mixed_refused_by_reference']} rank checks where the reference refused a mixed batch "
        "in a FULL graph (pcp_fn serves it)"
    )
    print(f"  {STATS['too_small_both_raise']} too-small buckets rejected by both")
