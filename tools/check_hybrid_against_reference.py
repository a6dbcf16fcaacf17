"""Differential check of the hybrid-attention layout: pcp_fn and the hybrid oracle against the real reference.

Development only (needs the reference file; see reference_loader.py). Run:

    python tools/check_hybrid_against_reference.py [num_examples]

For random batches (P in {2, 3, 4, 8}, spec tokens 0-2, decodes, fresh and
chunked prefills, every rank) it runs the reference's hybrid path
(``make_manager(..., hybrid=True)``: ``init_batch_info``,
``update_tokens_for_pcp``, ``get_logits_indices(..., tokens_original)``,
``get_padded_slot_mapping``, ``get_restore_hidden_states``,
``adjust_cu_num_scheduled_tokens_for_pcp``, ``generate_pcp_metadata``'s hybrid
fields, ``_split_spec_decode_pcp_prefill_input_hybrid``) and compares every
output with pcp_fn and with tests/oracle_hybrid.py. Prints how many batches
matched. P = 1 is left out (the runner never calls the reference's PCP path there);
every request has at least one token (the reference's DCS code and its token-major
decode order assume it).
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import reference_loader  # noqa: E402
from oracle_hybrid import oracle_draft_split, oracle_hybrid  # noqa: E402
from reference_batches import reference_batches  # noqa: E402


class _Metadata(SimpleNamespace):
    """Stand-in for vllm_ascend.attention.utils.AscendPrefillContextParallelMetadata."""


reference_loader._module("vllm_ascend.attention")
reference_loader._module("vllm_ascend.attention.utils", AscendPrefillContextParallelMetadata=_Metadata)

import pcp_fn  # noqa: E402

COUNT = {"batches": 0, "ranks": 0, "fa_padding_none": 0}


def reference_hybrid_step(m, sched, comp, prompt, slots):
    """The runner's hybrid host path for one step on one rank; the reference's outputs as numpy."""
    sched = np.asarray(sched, dtype=np.int32).copy()
    comp = np.asarray(comp, dtype=np.int32)
    prompt = np.asarray(prompt, dtype=np.int32)
    n = sched.size
    P = m.pcp_world_size
    arange = np.arange(m.pcp_unpad_mask_cpu.shape[0] + 16, dtype=np.int64)
    m.init_batch_info(sched, n, comp, prompt)
    lin, positions = m.update_tokens_for_pcp(sched[:n].copy(), arange)
    lin = np.asarray(lin).copy()
    N = int(lin.sum())
    D = m.num_decode_tokens
    N_dcs = int(np.asarray(m.num_scheduled_tokens_padded).sum())
    unpad = m.pcp_unpad_mask_cpu[: m.pcp_padded_tokens_length].copy()
    fa_len = int(unpad.sum()) + D * (P - 1)
    out = dict(
        pcp_tokens=lin,
        positions=np.asarray(positions)[:N].copy(),
        num_tokens=N,
        num_pads=m.num_pcp_pads_cpu[:n].copy(),
        unpad_mask=unpad,
        restore_index=m.pcp_allgather_restore_idx.np[: N_dcs * P].copy(),
        pcp_tokens_padded=np.asarray(m.num_scheduled_tokens_padded).copy(),
        num_tokens_padded=N_dcs,
        max_num_tokens_across_pcp=int(m.max_num_tokens_across_pcp),
        pcp_padded_tokens_fla=int(m.pcp_padded_tokens_fla),
        total_pcp_padding_tokens_fla=int(m.total_pcp_padding_tokens_fla),
        total_num_scheduled_tokens=int(m.total_num_scheduled_tokens),
        total_num_sampled_tokens_pcp=int(m.total_num_sampled_tokens_pcp),
        num_decode_reqs=m.num_decode_reqs,
        num_decode_tokens=D,
        enter=m.pcp_enter_fa_restore_idx[:fa_len].clone().numpy(),
        fa_padding=m._build_fa_padding_restore_idx(unpad, D * P, fa_len),
        fa_query=m.pcp_fa_query_idx[: N_dcs - D].clone().numpy(),
        exit=m.pcp_exit_fa_scatter_idx.gpu[: N - D].clone().numpy(),
    )
    cu = np.cumsum(lin)
    out["logits"] = m.get_logits_indices(cu, n, sched.tolist()).numpy().copy()
    out["adjusted_cu"] = np.asarray(
        m.adjust_cu_num_scheduled_tokens_for_pcp(cu.copy(), m.num_pcp_pads_cpu[:n])
    )
    out["slot_mapping"] = m.get_padded_slot_mapping(N, N_dcs, slots, 0)[: N_dcs * P].clone().numpy()
    # generate_pcp_metadata's hybrid fields, as the runner calls it (num_scheduled_tokens: the split counts)
    meta, _ = m.generate_pcp_metadata(
        N,
        torch.from_numpy(out["pcp_tokens_padded"]),
        SimpleNamespace(num_computed_tokens_cpu=comp),
        lin.copy(),
        torch.zeros((n, 1), dtype=torch.int32),
        n,
        n,
    )
    out["meta"] = meta
    return out


def _to_reference_rows(ours: np.ndarray, Lb: int, stride: int) -> np.ndarray:
    """Our ``rank * Lb + row`` indices as the reference's ``rank * stride + row``."""
    return (ours // Lb) * stride + ours % Lb


def batches():
    return reference_batches(max_reqs=12, max_context=40)


def check_draft_split(m, cfg, state, rng):
    """``_split_spec_decode_pcp_prefill_input_hybrid`` on random prefill lengths."""
    # prefills that one step of this config can hold (at most R requests and T tokens)
    K = int(rng.integers(1, min(5, cfg.max_num_reqs + 1)))
    lens, budget = [], cfg.max_num_tokens
    for _ in range(K):
        if budget == 0:
            break
        lens.append(int(rng.integers(1, min(30, budget + 1))))
        budget -= lens[-1]
    K = len(lens)
    S, H = sum(lens), 3
    ids = torch.randint(1, 50_000, (S,), dtype=torch.int32)
    hid = torch.randn(S, H, dtype=torch.float64)
    num, s_ids, s_hid, s_max, s_lens, s_cu = m._split_spec_decode_pcp_prefill_input_hybrid(
        {f"r{i}": x for i, x in enumerate(lens)}, ids, hid
    )
    # the draft pass of a step whose prefills are these: its bucket holds this rank's slices
    batch = pcp_fn.make_batch(cfg, lens, [0] * K, lens)
    state, _ = pcp_fn.update_tokens(state, batch)
    Fb, Lb = pcp_fn.protocol.batch.token_rows(cfg, batch.bucket), batch.bucket.num_tokens
    full = torch.zeros(Fb, dtype=ids.dtype)
    full[:S] = ids
    restored = torch.zeros(cfg.pcp_size * Lb, H, dtype=hid.dtype)  # no decodes: FA rows = prefill tokens
    restored[:S] = hid
    _, ours = pcp_fn.split_prefill_for_draft(state, full, restored)
    assert int(ours.num_tokens) == num
    assert torch.equal(ours.input_ids[:num], s_ids) and (ours.input_ids[num:] == 0).all()
    assert torch.equal(ours.hidden_states[:num], s_hid) and (ours.hidden_states[num:] == 0).all()
    assert int(ours.max_query_len) == s_max
    assert ours.seq_lens[:K].tolist() == s_lens.tolist()
    assert ours.cu_num_tokens[: K + 1].tolist() == s_cu.tolist()
    orc = oracle_draft_split(cfg.pcp_size, cfg.pcp_rank, lens, ids.tolist(), hid.tolist())
    assert (
        orc.input_ids == s_ids.tolist() and orc.hidden == s_hid.tolist() and orc.seq_lens == s_lens.tolist()
    )


@settings(max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 300, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1))
def check(b, seed):
    P, spec, R, T, sched, comp, prompt = b
    rng = np.random.default_rng(seed)
    n = len(sched)
    slots = torch.randint(0, 10_000, (sum(sched),), dtype=torch.int32)
    H = 3
    refs = [
        reference_hybrid_step(
            reference_loader.make_manager(P, r, R, T, num_spec_tokens=spec, hybrid=True),
            sched,
            comp,
            prompt,
            slots,
        )
        for r in range(P)
    ]
    M = refs[0]["max_num_tokens_across_pcp"]
    local = [torch.randn(s["num_tokens"], H, dtype=torch.float64) for s in refs]
    for rank in range(P):
        theirs = refs[rank]
        m = reference_loader.make_manager(P, rank, R, T, num_spec_tokens=spec, hybrid=True)
        reference_hybrid_step(m, sched, comp, prompt, slots)  # leave this manager in the step's state
        cfg = pcp_fn.PCPConfig(P, rank, R, T, num_spec_tokens=spec, hybrid_attn=True)
        batch = pcp_fn.make_batch(cfg, sched, comp, prompt, slot_mapping=slots)
        state, lay = pcp_fn.update_tokens(pcp_fn.init_state(cfg), batch)
        Lb = batch.bucket.num_tokens
        N, D, N_dcs = theirs["num_tokens"], theirs["num_decode_tokens"], theirs["num_tokens_padded"]
        assert isinstance(lay, pcp_fn.HybridLayout)
        assert lay.pcp_tokens[:n].tolist() == theirs["pcp_tokens"].tolist()
        assert int(lay.num_tokens) == N == theirs["total_num_scheduled_tokens"]
        assert lay.positions[:N].tolist() == theirs["positions"].tolist()
        assert lay.num_pads[:n].tolist() == theirs["num_pads"].tolist()
        assert lay.unpad_mask[: P * N_dcs].tolist() == theirs["unpad_mask"].tolist()
        assert (
            _to_reference_rows(lay.restore_index[: P * N_dcs].numpy(), Lb, N_dcs).tolist()
            == theirs["restore_index"].tolist()
        )
        assert lay.pcp_tokens_padded[:n].tolist() == theirs["pcp_tokens_padded"].tolist()
        assert int(lay.num_tokens_padded) == N_dcs
        assert int(lay.max_num_tokens_across_pcp) == M
        assert int(lay.pcp_padded_tokens_fla) == theirs["pcp_padded_tokens_fla"]
        assert int(lay.total_pcp_padding_tokens_fla) == theirs["total_pcp_padding_tokens_fla"]
        assert int(lay.num_decode_reqs) == theirs["num_decode_reqs"] and int(lay.num_decode_tokens) == D
        fa_len = int(lay.enter_fa_len)
        assert fa_len == len(theirs["enter"]) == sum(sched) + D * (P - 1)
        enter = _to_reference_rows(lay.enter_fa_restore_idx[:fa_len].numpy(), Lb, M)
        assert enter.tolist() == theirs["enter"].tolist()
        fa_pad = lay.fa_padding_restore_idx[: P * N_dcs].numpy()
        if theirs["fa_padding"] is None:
            COUNT["fa_padding_none"] += 1
            assert fa_pad.tolist() == list(range(P * N_dcs))
        else:
            assert fa_pad.tolist() == theirs["fa_padding"].tolist()
        assert int(lay.fa_query_len) == N_dcs - D
        assert lay.fa_query_idx[: N_dcs - D].tolist() == theirs["fa_query"].tolist()
        assert int(lay.exit_fa_len) == N - D
        if N > D:  # the reference writes the exit index only when there are prefills
            exit_ = _to_reference_rows(lay.exit_fa_scatter_idx[: N - D].numpy(), Lb, N_dcs - D)
            assert exit_.tolist() == theirs["exit"].tolist()
        # generate_pcp_metadata hands the same slices to the attention backend
        meta = theirs["meta"]
        assert meta.num_actual_tokens_pcp_padded == P * N_dcs
        assert meta.pcp_enter_fa_restore_idx.tolist() == theirs["enter"].tolist()
        assert meta.pcp_fa_query_idx.tolist() == theirs["fa_query"].tolist()
        assert meta.pcp_exit_fa_scatter_idx.tolist() == theirs["exit"].tolist()
        assert meta.max_num_tokens_across_pcp == M and meta.total_num_scheduled_tokens == N
        if meta.pcp_fa_padding_restore_idx is None:
            assert theirs["fa_padding"] is None
        else:
            assert meta.pcp_fa_padding_restore_idx.tolist() == fa_pad.tolist()

        _, logits = pcp_fn.get_logits_indices(state)
        assert logits[:n].tolist() == theirs["logits"].tolist()
        cu = np.zeros(batch.bucket.num_reqs, dtype=np.int64)
        cu[:n] = np.cumsum(theirs["pcp_tokens"])
        _, adjusted = pcp_fn.adjust_cu_num_scheduled_tokens(state, torch.from_numpy(cu))
        assert adjusted[:n].tolist() == theirs["adjusted_cu"].tolist()
        _, sm = pcp_fn.padded_slot_mapping(state, batch.slot_mapping)
        assert sm[: P * N_dcs].tolist() == theirs["slot_mapping"].tolist() and (sm[P * N_dcs :] == -1).all()

        # restore: the reference pads each rank to M and all-gathers; ours reads fixed [Lb] buffers
        reference_loader.PCP_GROUP.gathered = torch.cat([F.pad(x, (0, 0, 0, M - x.shape[0])) for x in local])
        ref_restored = m.get_restore_hidden_states(local[rank].clone())
        fixed = torch.zeros(P * Lb, H, dtype=torch.float64)
        for r in range(P):
            fixed[r * Lb : r * Lb + local[r].shape[0]] = local[r]
        _, restored = pcp_fn.restore_hidden_states(state, fixed)
        assert torch.equal(restored[:fa_len], ref_restored)

        _, out = pcp_fn.step(pcp_fn.init_state(cfg), batch)
        req = np.repeat(np.arange(n), theirs["pcp_tokens"])
        assert out.positions[:N].tolist() == (np.asarray(comp)[req] + theirs["positions"]).tolist()
        assert out.logits_indices[:n].tolist() == theirs["logits"].tolist()

        # the oracle agrees with the reference too
        orc = oracle_hybrid(P, sched, comp, prompt, spec)
        assert orc.linear_tokens[rank] == theirs["pcp_tokens"].tolist()
        assert orc.linear_positions[rank] == theirs["positions"].tolist()
        assert orc.max_tokens == M
        assert orc.enter_fa(M) == theirs["enter"].tolist()
        assert orc.fa_query[rank] == theirs["fa_query"].tolist()
        if N > D:
            assert orc.exit_fa(rank, N_dcs - D) == theirs["exit"].tolist()
        if theirs["fa_padding"] is not None:
            assert orc.fa_padding == theirs["fa_padding"].tolist()
        assert orc.logits == theirs["logits"].tolist()
        assert orc.adjust_cu(np.cumsum(theirs["pcp_tokens"]).tolist()) == theirs["adjusted_cu"].tolist()

        if rank == 0 or rng.integers(0, 2):
            check_draft_split(m, cfg, state, rng)
        COUNT["ranks"] += 1
    COUNT["batches"] += 1


if __name__ == "__main__":
    check()
    print(
        f"pcp_fn == oracle_hybrid == reference (hybrid) on {COUNT['batches']} random batches, "
        f"{COUNT['ranks']} rank views "
        f"({COUNT['fa_padding_none']} where the reference's fa_padding_restore_idx is None)"
    )
