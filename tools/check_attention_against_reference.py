"""Differential check: attention metadata and the multimodal helpers against the real reference code.

Development only (needs the reference file; see reference_loader.py). Run:

    python tools/check_attention_against_reference.py [num_examples]

Part 1 runs the reference's ``generate_pcp_metadata`` the way the runner calls it
(after ``init_batch_info`` and ``update_tokens_for_pcp``, with the post-split
local query lengths) on random mixed batches, every rank, P in {1, 2, 3, 4, 8},
DCP in {1, 2}, interleave 1 or 64, and compares every field with
``pcp_fn.attention_metadata``. Part 2 runs the reference's multimodal helpers
(``remap_mrope_positions_for_pcp``, ``fill_prompt_embeds_for_pcp``,
``build_local_mm_schedule``, ``gather_mm_embeddings_for_pcp``,
``maybe_localize_scheduler_output_for_mm_preprocess`` +
``restore_scheduler_output_after_mm_preprocess``) on random requests and
compares them with ``pcp_fn.multimodal``. Prints how many random cases matched.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import reference_loader  # noqa: E402
from reference_batches import reference_batches  # noqa: E402

import pcp_fn  # noqa: E402
from pcp_fn import multimodal as mm  # noqa: E402

COUNT = {"attention": 0, "ranks": 0, "mrope": 0, "embeds": 0, "schedule": 0, "mm_rows": 0, "needed": 0}
NUM = int(sys.argv[1]) if len(sys.argv) > 1 else 300


class _Metadata:
    """Stand-in for vllm_ascend.attention.utils.AscendPrefillContextParallelMetadata."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


reference_loader._module("vllm_ascend.attention")
reference_loader._module("vllm_ascend.attention.utils", AscendPrefillContextParallelMetadata=_Metadata)

HEAD_TAIL = pcp_fn.dcs.attention.VLLM_ASCEND_INDEX_FIELDS
PER_REQUEST = [
    "attn_chunk_seqlens",
    "attn_mask_seqlens",
    "head_attn_nomask_seqlens",
    "tail_attn_nomask_seqlens",
    "head_actual_seq_lengths_kv",
    "tail_actual_seq_lengths_kv",
]


@st.composite
def batches(draw):
    P, spec, R, T, sched, comp, prompt = draw(
        reference_batches(pcp_sizes=(1, 2, 3, 4, 8), max_reqs=10, max_context=300)
    )
    D = draw(st.sampled_from([1, 2]))
    if P * D == 1:
        D = 2  # the reference builds no metadata without context parallelism
    interleave = draw(st.sampled_from([1, 64]))
    return P, D, interleave, spec, R, T, sched, comp, prompt


def reference_metadata(m, sched, comp, prompt, num_reqs_padded):
    """The runner's calls: init_batch_info, update_tokens_for_pcp (P > 1), generate_pcp_metadata."""
    sched = np.asarray(sched, dtype=np.int32).copy()
    comp = np.asarray(comp, dtype=np.int32)
    prompt = np.asarray(prompt, dtype=np.int32)
    n = sched.size
    m.init_batch_info(sched, n, comp, prompt)
    if m.pcp_world_size > 1:
        arange = np.arange(m.pcp_unpad_mask_cpu.shape[0] + 16, dtype=np.int64)
        local, _ = m.update_tokens_for_pcp(sched.copy(), arange)
        sched[:n] = local  # the runner overwrites its num_scheduled_tokens in place
    query_lens = torch.from_numpy(sched)
    meta, _ = m.generate_pcp_metadata(
        int(sched.sum()),
        query_lens,
        SimpleNamespace(num_computed_tokens_cpu=comp),
        sched,
        torch.zeros((n, 1), dtype=torch.int32),
        num_reqs_padded,
        n,
    )
    return meta, int(sched.sum())


@settings(max_examples=NUM, deadline=None)
@given(batches())
def check_attention(b):
    P, D, interleave, spec, R, T, sched, comp, prompt = b
    n = len(sched)
    for dcp_rank in range(D):
        for rank in range(P):
            cfg = pcp_fn.PCPConfig(
                P, rank, R, T, dcp_size=D, dcp_rank=dcp_rank, num_spec_tokens=spec,
                cp_kv_cache_interleave_size=interleave,
            )  # fmt: skip
            batch = pcp_fn.make_batch(cfg, sched, comp, prompt)
            Rb, Lb = batch.bucket.num_reqs, batch.bucket.num_tokens
            _, ours = pcp_fn.attention_metadata(pcp_fn.init_state(cfg), batch)
            m = reference_loader.make_manager(
                P, rank, R, T, num_spec_tokens=spec, dcp=D, dcp_rank=dcp_rank, interleave=interleave
            )
            theirs, N = reference_metadata(m, sched, comp, prompt, Rb)
            np.testing.assert_array_equal(
                ours.num_computed_tokens_of_pcp_dcp[:n].numpy(), theirs.num_computed_tokens_of_pcp_dcp
            )
            assert ours.num_computed_tokens_of_pcp_dcp.dtype == torch.int32
            assert not ours.num_computed_tokens_of_pcp_dcp[n:].any()
            assert int(ours.num_actual_tokens_pcp_padded) == theirs.num_actual_tokens_pcp_padded
            assert torch.equal(ours.query_lens_pcp_full, theirs.query_lens_pcp_full_cpu)
            assert int(ours.max_query_len_pcp_full) == theirs.max_query_len_pcp_full
            if P == 1:
                # the reference leaves its unpad mask empty at P = 1 (the runner never splits there)
                assert theirs.pcp_unpad_mask.numel() == 0 and ours.q_head_idx is None
                COUNT["ranks"] += 1
                continue
            assert torch.equal(ours.pcp_unpad_mask[: P * N], theirs.pcp_unpad_mask)
            restore = ours.pcp_allgather_restore_idx[: P * N]
            # ours addresses fixed [Lb] rank buffers, the reference's compact [N] ones
            assert torch.equal(restore - (restore // Lb) * (Lb - N), theirs.pcp_allgather_restore_idx)
            for name, ref_name in HEAD_TAIL.items():
                padded = getattr(ours, name)
                ref = getattr(theirs, ref_name)
                k = int(padded.length)
                assert k == ref.numel(), name
                assert padded.index.dtype == ref.dtype == torch.int32, name
                assert torch.equal(padded.index[:k], ref), name
                assert not padded.index[k:].any(), name
            npf = int(ours.num_prefill_reqs)
            assert npf == n - m.num_decode_reqs
            for name in PER_REQUEST:
                ref = getattr(theirs, name)
                ref = ref.tolist() if isinstance(ref, torch.Tensor) else list(ref)
                assert getattr(ours, name)[:npf].tolist() == ref, name
            COUNT["ranks"] += 1
    COUNT["attention"] += 1


# ---- part 2: the multimodal helpers ------------------------------------------------------


@st.composite
def mm_steps(draw):
    """A PCP step (P > 1) whose requests carry M-RoPE tables, prompt embeds and mm features."""
    P = draw(st.sampled_from([2, 3, 4, 8]))
    rank = draw(st.integers(0, P - 1))
    n = draw(st.integers(1, 6))
    nd = draw(st.integers(0, n))
    sched, comp, prompt = [], [], []
    for i in range(n):
        if i < nd:
            c = draw(st.integers(1, 40))
            sched.append(1)
            comp.append(c)
            prompt.append(draw(st.integers(1, c)))
        else:
            s = draw(st.integers(1, 30))
            c = draw(st.sampled_from([0, draw(st.integers(1, 20))]))
            sched.append(s)
            comp.append(c)
            p = max(1, c + s + draw(st.integers(-3, 3)))
            if c > 0 and s <= 1 and p <= c:
                p = c + 1  # prompt not done: a prefill, not a decode
            prompt.append(p)
    return P, rank, sched, comp, prompt, draw(st.randoms(use_true_random=False))


def _requests(rng, comp, prompt, sched, H):
    reqs, embeds, tables, deltas = {}, {}, [], []
    for i, (c, p, s) in enumerate(zip(comp, prompt, sched)):
        total = c + s
        kind = rng.choice(["table", "short", "none", "empty"])
        if kind == "table":
            cols = p
        elif kind == "short":
            cols = rng.randint(1, max(1, p))
        else:
            cols = 0
        table = torch.randint(0, 1000, (3, cols), dtype=torch.int64) if kind != "none" else None
        delta = rng.choice([None, rng.randint(-50, 50)])
        features = []
        pos = 0
        while pos < total and len(features) < 3:
            off = pos + rng.randint(0, 6)
            length = rng.randint(1, 8)
            is_embed = None
            if rng.random() < 0.5:
                is_embed = torch.tensor([rng.random() < 0.6 for _ in range(length)])
            features.append(
                SimpleNamespace(
                    identifier=f"h{i}_{len(features)}" if rng.random() < 0.8 else "shared",
                    mm_position=SimpleNamespace(offset=off, length=length, is_embed=is_embed),
                )
            )
            pos = off + rng.randint(0, length + 2)  # features may overlap
        reqs[f"r{i}"] = SimpleNamespace(
            prompt_token_ids=list(range(p)),
            prompt_embeds=None,
            mrope_positions=table,
            mrope_position_delta=delta,
            mm_features=features,
            num_computed_tokens=c,
        )
        tables.append(table)
        deltas.append(delta)
        if rng.random() < 0.6:
            embeds[i] = torch.randn(rng.randint(0, total + 3), H)
    return reqs, embeds, tables, deltas


@settings(max_examples=NUM, deadline=None)
@given(mm_steps())
def check_multimodal(step):
    P, rank, sched, comp, prompt, rng = step
    H = 4
    n = len(sched)
    req_ids = [f"r{i}" for i in range(n)]
    reqs, embeds, tables, deltas = _requests(rng, comp, prompt, sched, H)
    cfg = pcp_fn.PCPConfig(P, rank, max(n, 1), 256)
    batch = pcp_fn.make_batch(cfg, sched, comp, prompt)
    Rb = batch.bucket.num_reqs
    _, out = pcp_fn.step(
        pcp_fn.init_state(cfg), batch, torch.full((pcp_fn.protocol.batch.token_rows(cfg, batch.bucket),), -1)
    )
    N = int(out.layout.num_tokens)
    local = out.layout.pcp_tokens[:n].numpy().astype(np.int32)
    positions_np = out.positions[:N].numpy().astype(np.int64)
    m = reference_loader.make_manager(P, rank, max(n, 1), 256)

    # M-RoPE remap
    buf = SimpleNamespace(cpu=torch.full((3, N), -7, dtype=torch.int64))
    m.remap_mrope_positions_for_pcp(positions_np, local, n, SimpleNamespace(req_ids=req_ids), reqs, buf)
    max_len = max([t.shape[1] for t in tables if t is not None] + [1])
    packed = mm.pack_mrope_tables(tables, deltas, Rb, max_len)
    ours = mm.remap_mrope_positions(
        packed, batch.num_prompt, out.positions, out.layout.request_index, out.layout.num_tokens
    )
    assert torch.equal(ours[:, :N], buf.cpu)
    COUNT["mrope"] += 1

    # prompt embeds: the runner's loop over requests with embeds
    base = torch.randn(out.positions.shape[0], H)
    ref_out = base.clone()
    start = 0
    for i in range(n):
        k = int(local[i])
        if i in embeds and k > 0:
            m.fill_prompt_embeds_for_pcp(
                embeds[i], positions_np[start : start + k], ref_out[start : start + k]
            )
        start += k
    cap = max(sum(e.shape[0] for e in embeds.values()), 1)
    packed_embeds = mm.pack_prompt_embeds(embeds, Rb, H, cap)
    got = mm.gather_prompt_embeds(
        packed_embeds, out.positions, out.layout.request_index, out.layout.num_tokens, base
    )
    assert torch.equal(got, ref_out)
    COUNT["embeds"] += 1

    # the host-side schedule helpers
    cache = {
        f.identifier: torch.randn(64, H) for r in reqs.values() for f in r.mm_features if rng.random() < 0.5
    }
    sched_enc, needed = m.build_local_mm_schedule(req_ids, reqs, positions_np, local, cache)
    ours_enc, ours_needed = mm.build_local_mm_schedule(req_ids, reqs, positions_np, local, cache)
    assert ours_enc == sched_enc and ours_needed == needed

    full_cache = {f.identifier: torch.randn(64, H) for r in reqs.values() for f in r.mm_features}
    shift = rng.choice([0, 0, 1])
    is_mm = torch.zeros(N, dtype=torch.bool)
    ref_embeds, sync_m, sync_x = m.gather_mm_embeddings_for_pcp(
        req_ids, reqs, positions_np, local, shift, full_cache, is_mm, None, False, False
    )
    got_mm = mm.gather_mm_embeddings(req_ids, reqs, positions_np, local, shift, full_cache)
    assert len(got_mm.embeds) == len(ref_embeds)
    assert all(torch.equal(a, b) for a, b in zip(got_mm.embeds, ref_embeds))
    assert torch.equal(got_mm.is_mm_embed, is_mm)
    assert (got_mm.should_sync_mrope_positions, got_mm.should_sync_xdrope_positions) == (sync_m, sync_x)
    COUNT["mm_rows"] += sum(e.shape[0] for e in ref_embeds) > 0
    COUNT["needed"] += bool(needed)

    global_sched = {rid: int(s) for rid, s in zip(req_ids, sched)}
    so = SimpleNamespace(
        total_num_scheduled_tokens=int(sum(sched)),
        num_scheduled_tokens=dict(global_sched),
        scheduled_encoder_inputs={rid: [0] for rid in req_ids[:1]},
        free_encoder_mm_hashes=["shared", "gone", *list(full_cache)[:2]],
    )
    before = SimpleNamespace(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(so).items()})
    layout = mm.local_schedule_layout(local, n, N)
    got_so = mm.localize_scheduler_output(so, req_ids, reqs, positions_np, layout.num_scheduled_tokens,
                                          layout.total_num_scheduled_tokens, cache)  # fmt: skip
    assert vars(so) == vars(before)  # ours left the caller's object alone
    restore = m.maybe_localize_scheduler_output_for_mm_preprocess(
        so, req_ids, reqs, positions_np, local, N, cache
    )
    ref_view = {k: getattr(so, k) for k in vars(before)}
    assert {k: getattr(got_so, k) for k in vars(before)} == ref_view
    m.restore_scheduler_output_after_mm_preprocess(so, restore)
    assert vars(so) == vars(before)
    COUNT["schedule"] += 1


if __name__ == "__main__":
    check_attention()
    print(
        f"attention_metadata == reference generate_pcp_metadata on {COUNT['attention']} random batches "
        f"({COUNT['ranks']} (pcp rank, dcp rank) views)"
    )
    check_multimodal()
    print(
        f"multimodal == reference on {COUNT['mrope']} random steps (M-RoPE remap), {COUNT['embeds']} "
        f"(prompt embeds), {COUNT['schedule']} (local mm schedule, mm embeddings, localized "
        f"scheduler output; "
        f"{COUNT['needed']} with encoder inputs needed, {COUNT['mm_rows']} with mm embedding rows)"
    )
