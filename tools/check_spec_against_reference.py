"""Differential check: pcp_fn.spec against the REAL vllm-ascend spec-decode code, on random batches.

Development only (needs the reference files; see reference.py). Run:

    python tools/check_spec_against_reference.py [num_examples]

For every random batch (P in {1, 2, 4}, DCP in {1, 2, 4}, interleave 1 or
128 (vllm-ascend's MTP mask ignores the interleave: compared at 1 only), 1-3
spec tokens, the DualChunkSwap or the hybrid-attention layout
(``hybrid_attn=True`` / a ``qwen3_next`` manager), decodes first, then fresh
prefills; every rank) it runs vllm-ascend's ``PCPManager`` methods
(``pcp_utils.py``) and the runner's ``_calc_spec_decode_metadata``
(``model_runner_v1.py``, extracted from the file and bound to a stand-in
runner, which switches to ``adjust_cu_num_scheduled_tokens_for_pcp`` under
hybrid attention) next to the pcp_fn ops and asserts equality on the real
rows. It prints how many (batch, rank) pairs matched per function and layout.

Stand-ins added here (not in reference_loader): the vLLM runner helper
``_get_cumsum_and_arange`` (returns the cumsum, writes the per-request arange
into its scratch buffer), a block table whose slot of ``(request, position)``
is ``request * 100_000 + 3 * position + 1`` (pcp_fn gets the same rule as
``slot_fn``), ``pin_memory`` as the identity (CPU only), and the two vllm_ascend
classes ``update_spec_decode_drafting_cp_metadata`` imports.
"""

from __future__ import annotations

import ast
import collections
import os
import sys
import types
from types import SimpleNamespace

import numpy as np
import torch
from hypothesis import given, reject, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import reference_loader  # noqa: E402
from reference import reference_source  # noqa: E402

import pcp_fn  # noqa: E402
from pcp_fn import PCPConfig, init_state  # noqa: E402

COUNT: collections.Counter = collections.Counter()  # (check, layout) -> (batch, rank) pairs that matched
LAYOUT = ["dcs"]  # the layout of the batch being checked


def count(name):
    COUNT[(name, LAYOUT[0])] += 1


MAX_MODEL_LEN = 256
H = 3


# ---------------------------------------------------------------- stand-ins
class _MLASpec:
    pass


class _SFABuilder:
    pass


reference_loader._module("vllm_ascend.core")
reference_loader._module("vllm_ascend.core.kv_cache_interface", AscendMLAAttentionSpec=_MLASpec)
reference_loader._module("vllm_ascend.attention")
reference_loader._module("vllm_ascend.attention.context_parallel")
reference_loader._module(
    "vllm_ascend.attention.context_parallel.sfa_cp", AscendSFADCPMetadataBuilder=_SFABuilder
)

torch.Tensor.pin_memory = lambda self, *a, **k: self  # CPU-only machine: pinning is the identity here


class _TorchNoPin(types.ModuleType):
    """``torch`` for the reference module, with ``pin_memory=`` dropped from ``torch.full``."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def full(*args, pin_memory=False, **kwargs):
        return torch.full(*args, **kwargs)


def slot_of(request, position):
    return request * 100_000 + 3 * position + 1


class BlockTable:
    """Stand-in block table: ``compute_slot_mapping_draft`` writes ``slot_of`` into ``slot_mapping``."""

    def __init__(self, size=1 << 14):
        self.slot_mapping = SimpleNamespace(cpu=torch.zeros(size, dtype=torch.int32))
        self.slot_mapping.gpu = self.slot_mapping.cpu
        self.block_tables = [self]
        self.full_calls = []

    def compute_slot_mapping_draft(self, req_indices, positions):
        req = torch.as_tensor(np.asarray(req_indices) if not torch.is_tensor(req_indices) else req_indices)
        pos = torch.as_tensor(np.asarray(positions) if not torch.is_tensor(positions) else positions)
        slots = slot_of(req.to(torch.int64), pos.to(torch.int64)).to(torch.int32)
        self.slot_mapping.cpu[: slots.shape[0]] = slots

    def compute_slot_mapping(self, num_reqs, query_start_loc, positions):
        self.full_calls.append((num_reqs, query_start_loc.clone(), torch.as_tensor(positions).clone()))


def _load_reference_module():
    reference_loader.load_pcp_manager_class()
    mod = sys.modules["reference_pcp_utils"]
    mod.torch = _TorchNoPin("torch")
    return mod


def _load_calc_spec_decode_metadata():
    """The runner's ``_calc_spec_decode_metadata``, compiled from vllm-ascend's ``model_runner_v1.py``."""
    path, text = reference_source("vllm_ascend_model_runner")
    tree = ast.parse(text)
    fn = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "_calc_spec_decode_metadata"
    )
    fn.returns = None
    for arg in fn.args.args + fn.args.kwonlyargs:
        arg.annotation = None
    module = ast.Module(body=[fn], type_ignores=[])
    ns = {"np": np, "torch": _TorchNoPin("torch"), "SpecDecodeMetadata": SimpleNamespace}
    exec(compile(module, path, "exec"), ns)
    return ns["_calc_spec_decode_metadata"]


def _vllm_cumsum_and_arange(arange_np):
    def get(num_tokens, arange_out, cumsum_dtype=None):
        cu = np.cumsum(num_tokens, dtype=cumsum_dtype)
        total = int(cu[-1]) if cu.size else 0
        arange_out[:total] = arange_np[:total] - np.repeat(cu - num_tokens, num_tokens)
        return cu

    return get


REFERENCE_MOD = _load_reference_module()
CALC = _load_calc_spec_decode_metadata()


# ---------------------------------------------------------------- batches
@st.composite
def batches(draw):
    P = draw(st.sampled_from([1, 2, 4]))
    dcp = draw(st.sampled_from([1, 2, 4]))
    hybrid = draw(st.booleans())
    interleave = draw(st.sampled_from([1, 1, 128]))
    spec = draw(st.integers(1, 3))
    decode_only = draw(st.booleans())
    nd = draw(st.integers(1 if decode_only else 0, 6))
    npf = 0 if decode_only else draw(st.integers(1 if nd == 0 else 0, 3))
    sched, comp, prompt, drafts = [], [], [], []
    for _ in range(nd):
        n = draw(st.integers(1, 1 + spec))
        c = draw(st.integers(1, 60))
        sched.append(n)
        comp.append(c)
        prompt.append(draw(st.integers(1, c)))
        drafts.append(n - 1 if draw(st.integers(0, 3)) else draw(st.integers(0, n - 1)))
    for _ in range(npf):
        n = draw(st.integers(1, 30))
        sched.append(n)
        comp.append(0)
        prompt.append(n)
        drafts.append(0)
    R = len(sched) + draw(st.integers(0, 3))
    T = sum(sched) + draw(st.integers(0, 20))
    return P, dcp, interleave, spec, hybrid, R, T, sched, comp, prompt, drafts


def _table(R, sched, comp, rng):
    table = torch.from_numpy(rng.integers(1, 50_000, size=(R, MAX_MODEL_LEN), dtype=np.int32))
    return table


# ---------------------------------------------------------------- checks
def check_spec_decode_indices(cfg, batch, spec, state, m, sched, drafts, local, rng):
    """``local``: this rank's token counts (update_tokens_for_pcp's first output: the linear ones
    under hybrid attention), whose cumsum the runner hands ``_calc_spec_decode_metadata``."""
    n = len(sched)
    P = cfg.pcp_size
    pads = m.num_pcp_pads_cpu[:n] if P > 1 else None
    N = int(local.sum())
    ids = torch.from_numpy(rng.integers(0, 50_000, size=batch.bucket.num_tokens, dtype=np.int32))
    arange_np = np.arange(4096, dtype=np.int64)
    runner = SimpleNamespace(
        pcp_size=P,
        pcp_manager=m,
        _get_cumsum_and_arange=_vllm_cumsum_and_arange(arange_np),
        _arange_scratch=np.zeros(4096, dtype=np.int64),
        arange_np=arange_np,
        input_ids=SimpleNamespace(gpu=ids),
        device="cpu",
    )
    theirs = CALC(runner, np.asarray(drafts, dtype=np.int32), np.cumsum(local), pads)
    _, ours = pcp_fn.spec_decode_indices(state, spec.num_draft_tokens, ids)
    S, D = int(ours.num_sampled), int(ours.num_drafts)
    assert ours.logits_indices[:S].tolist() == theirs.logits_indices.tolist()
    assert ours.local_logits_indices[:S].tolist() == np.maximum(_local_logits(local, drafts), 0).tolist()
    assert ours.target_logits_indices[:D].tolist() == theirs.target_logits_indices.tolist()
    assert ours.bonus_logits_indices[:n].tolist() == theirs.bonus_logits_indices.tolist()
    assert ours.cu_num_draft_tokens[:n].tolist() == theirs.cu_num_draft_tokens.tolist()
    assert ours.cu_num_sampled_tokens[:n].tolist() == theirs.cu_num_sampled_tokens.tolist()
    assert ours.draft_token_ids[:D].tolist() == theirs.draft_token_ids.tolist()
    assert N <= batch.bucket.num_tokens
    count("spec_decode_indices")
    return theirs, ours


def _local_logits(local, drafts):
    """The runner's logits indices before the PCP adjustment: the last ``drafts + 1`` rows of each
    request in this rank's local order (what it reads the draft token ids with)."""
    cu = np.cumsum(local)
    s = np.asarray(drafts) + 1
    return np.concatenate([np.arange(c - k, c) for c, k in zip(cu, s)])


def run_generate(m, cfg, sched, comp, table, *, with_prefill, prev=None, draft=None):
    n = len(sched)
    arange_np = np.arange(8192, dtype=np.int64)
    req_indices = np.repeat(arange_np[:n], sched)
    cu = np.cumsum(sched)
    positions = np.asarray(comp, dtype=np.int64)[req_indices] + (
        arange_np[: cu[-1]] - np.repeat(cu - np.asarray(sched), sched)
    )
    ib = SimpleNamespace(
        req_ids=[str(i) for i in range(n)],
        num_computed_tokens_cpu=np.asarray(comp, dtype=np.int32),
        token_ids_cpu_tensor=table,
        token_ids_cpu=table.numpy(),
        block_table=BlockTable(),
        prev_sampled_token_ids=None if prev is None else prev[0],
        prev_req_id_to_index=None if prev is None else {"p": 0},
    )
    m.use_async_scheduling = prev is not None
    m.generate_pcp_mtp_input(
        int(cu[-1]),
        {str(i): s for i, s in enumerate(sched)},
        with_prefill,
        ib,
        arange_np,
        req_indices,
        positions,
        cu,
        draft,
        SimpleNamespace(scheduled_spec_decode_tokens={}),
        cfg.num_spec_tokens,
        prev_positions=None if prev is None else prev[1],
    )
    return ib, req_indices, positions, cu


def check_full_input_ids(cfg, batch, state, m, sched, comp, table, rng, with_prefill):
    n = len(sched)
    prev_reqs = int(rng.integers(1, 6))
    prev_sampled = torch.from_numpy(rng.integers(60_000, 70_000, size=(prev_reqs, 1), dtype=np.int64))
    draft = torch.from_numpy(
        rng.integers(70_000, 80_000, size=(prev_reqs, cfg.num_spec_tokens), dtype=np.int64)
    )
    prev_positions = torch.from_numpy(rng.integers(-1, prev_reqs, size=n, dtype=np.int64))
    async_mode = bool(rng.integers(0, 2))
    prev = (prev_sampled, prev_positions) if async_mode else None
    ib, req_indices, positions, cu = run_generate(
        m, cfg, sched, comp, table, with_prefill=with_prefill, prev=prev, draft=draft if async_mode else None
    )
    F = int(cu[-1])
    Rb = batch.bucket.num_reqs
    _, full = pcp_fn.full_input_ids(state, table, batch.num_computed, slot_fn=slot_of)
    ids = full.input_ids
    if async_mode:
        padded_prev = torch.full((Rb,), -1, dtype=torch.int64)
        padded_prev[:n] = prev_positions
        _, ids = pcp_fn.repair_full_input_ids(state, ids, prev_sampled, draft, padded_prev)
        count("repair_full_input_ids")
    assert int(full.num_tokens) == F
    assert ids[:F].tolist() == m.input_ids_pcp_full.gpu[:F].tolist()
    assert full.positions[:F].tolist() == m.positions_pcp_full_np[:F].tolist()
    qsl = m.query_start_loc_pcp_full.gpu
    k = min(Rb + 1, qsl.shape[0])
    assert full.query_start_loc[:k].tolist() == qsl[:k].tolist()
    count("full_input_ids")
    builds_mtp = cfg.decode_threshold > 2 and (
        not with_prefill or (cfg.pcp_size == 1 and cfg.dcp_size > 1 and with_prefill)
    )
    if builds_mtp:
        M = int(full.mtp.num_tokens)
        P = cfg.pcp_size
        assert full.mtp.slot_mapping[: M * P].tolist() == m.mtp_slot_pad.tolist()
        assert (full.mtp.slot_mapping[M * P :] == -1).all()
        count("full_input_ids.mtp_slot_pad")
    return full, ids


def _restored(cfg, batch, N, rng):
    P, Lb = cfg.pcp_size, batch.bucket.num_tokens
    ref_h = torch.from_numpy(rng.standard_normal((P * N, H)))
    ours = torch.zeros(P * Lb, H, dtype=torch.float64)
    ours[: P * N] = ref_h
    return ref_h, ours


def check_drafts(cfg, batch, state, m, sched, full_ids, ref_idx, ours_idx, rng):
    n, P = len(sched), cfg.pcp_size
    N = int(m.pcp_tokens[:n].sum()) if P > 1 else sum(sched)
    ref_h, ours_h = _restored(cfg, batch, N, rng)
    D = m.num_decode_reqs
    Dt = m.num_decode_tokens
    # decode_hidden_states
    _, dh = pcp_fn.decode_hidden_states(state, ours_h)
    if Dt:
        ref_dh = m.get_spec_decode_decode_hidden_states(ref_h[: Dt * P], D, Dt)
        assert torch.equal(dh[:Dt], ref_dh)
    count("decode_hidden_states")

    F = sum(sched)
    Fb = full_ids.shape[0]
    ids_full = torch.from_numpy(rng.integers(1, 50_000, size=Fb, dtype=np.int32))
    # split_prefill_for_draft (vllm-ascend dispatches to its _hybrid variant under hybrid attention)
    if P > 1:
        req_p = {str(i): sched[i] for i in range(D, n)}
        ref_split = m._split_spec_decode_pcp_prefill_input(req_p, ids_full[Dt:F], ref_h[Dt * P :])
        _, split = pcp_fn.split_prefill_for_draft(state, ids_full, ours_h)
        num_tokens, s_ids, s_h, s_max, s_lens, s_cu = ref_split
        assert int(split.num_tokens) == num_tokens
        assert split.input_ids[:num_tokens].tolist() == s_ids.tolist()
        assert torch.equal(split.hidden_states[:num_tokens], s_h)
        assert int(split.max_query_len) == s_max
        np_ = n - D
        assert split.seq_lens[:np_].tolist() == s_lens.tolist()
        assert split.cu_num_tokens[: np_ + 1].tolist() == s_cu.tolist()
        count("split_prefill_for_draft")

    # first_pass_inputs
    if P * cfg.dcp_size > 1:
        qsl_full = torch.tensor([0, *np.cumsum(sched)], dtype=torch.int32)
        logits = ref_idx.logits_indices.clone()
        cu_s = ours_idx.cu_num_sampled_tokens[:n].tolist()
        tis = []
        for i in range(n):
            ns = int(ours_idx.num_draft_tokens[i]) + 1
            tis.append(cu_s[i] - ns + int(rng.integers(0, ns)) if i < D else int(rng.integers(0, 100)))
        tis = torch.tensor(tis, dtype=torch.int64)
        seq_lens = torch.from_numpy(rng.integers(1, 500, size=n, dtype=np.int32))
        local_positions = torch.from_numpy(rng.integers(0, 500, size=batch.bucket.num_tokens, dtype=np.int64))
        cam = SimpleNamespace(
            seq_lens=seq_lens.clone(),
            seq_lens_cpu=seq_lens.clone(),
            _seq_lens_cpu=None,
            query_start_loc=qsl_full.clone(),
            query_start_loc_cpu=qsl_full.clone(),
            num_actual_tokens=F,
            max_query_len=-7,
        )
        ref_fp = m.prepare_spec_decode_first_pass_inputs(
            ids_full[:F].clone(),
            local_positions.clone(),
            ref_h.clone(),
            tis.clone(),
            cam,
            object(),
            {str(i): sched[i] for i in range(n)},
            [str(i) for i in range(n)],
            logits,
            F,
            n - D,
            D,
            False,
        )
        Rb = batch.bucket.num_reqs
        tis_b = torch.zeros(Rb, dtype=torch.int64)
        tis_b[:n] = tis
        seq_b = torch.zeros(Rb, dtype=torch.int32)
        seq_b[:n] = seq_lens
        _, fp = pcp_fn.first_pass_inputs(
            state,
            ids_full,
            local_positions,
            ours_h,
            tis_b,
            ours_idx.logits_indices,
            ours_idx.num_sampled,
            seq_lens=seq_b,
        )
        K = ref_fp.num_tokens
        assert int(fp.num_tokens) == K
        assert fp.input_ids[:K].tolist() == ref_fp.input_ids.tolist()
        assert fp.positions[:K].tolist() == ref_fp.target_positions[:K].tolist()
        assert torch.equal(fp.hidden_states[:K], ref_fp.target_hidden_states[:K])
        assert fp.token_indices_to_sample[:n].tolist() == ref_fp.token_indices_to_sample.tolist()
        assert fp.decode_query_lens[:D].tolist() == ref_fp.long_seq_args[0].tolist()
        assert fp.ori_token_indices_to_sample[:n].tolist() == ref_fp.long_seq_args[1].tolist()
        if P > 1 and n > D:
            assert fp.seq_lens[:n].tolist() == cam.seq_lens.tolist()
            assert fp.query_start_loc[: n + 1].tolist() == cam.query_start_loc.tolist()
            assert int(fp.max_query_len) == cam.max_query_len
            count("first_pass_inputs (P > 1, with prefills)")
        else:
            assert fp.seq_lens[:n].tolist() == seq_lens.tolist()
            assert fp.query_start_loc[: n + 1].tolist() == qsl_full.tolist()
        count("first_pass_inputs")


def check_mtp(cfg, batch, state, m, sched, comp, full, rng):
    n, P, k = len(sched), cfg.pcp_size, cfg.num_spec_tokens
    D = m.num_decode_reqs
    starts = np.concatenate([[0], np.cumsum(sched)])
    ori = torch.tensor([int(starts[i]) + int(rng.integers(0, sched[i])) for i in range(n)], dtype=torch.int64)
    Rb = batch.bucket.num_reqs
    ori_b = torch.zeros(Rb, dtype=torch.int64)
    ori_b[:n] = ori
    built = m.mtp_slot_pad is not None  # the reference built the MTP slots (decode-only, or DCP-only prefill)
    if built:
        ref_idx, _ = m._get_spec_decode_mtp_slot_inputs(ori.clone(), n, k)
        _, ours = pcp_fn.mtp_slot_inputs(state, ori_b, full.mtp.slot_mapping)
        assert ours.slot_indices[: n * P].tolist() == ref_idx.tolist()
        assert (ours.slot_indices[n * P :] == 0).all()
        count("mtp_slot_inputs")
    seq = torch.from_numpy(rng.integers(1, 500, size=Rb, dtype=np.int32))
    cam = SimpleNamespace(block_table_tensor=torch.zeros(Rb, 4))
    attn = SimpleNamespace(seq_lens=seq.clone(), seq_lens_cpu=None)
    ref_in = m.prepare_spec_decode_mtp_drafting_inputs(cam, attn, ori.clone(), n, D, D < n, k)
    slots = full.mtp.slot_mapping if full.mtp is not None else torch.zeros(1, dtype=torch.int32)
    _, ours_in = pcp_fn.mtp_drafting_inputs(state, ori_b, seq, slots)
    if ref_in is None:
        assert ours_in is None or not bool(ours_in.active)
        count("mtp_drafting_inputs (vllm-ascend: None)")
    else:
        assert built and bool(ours_in.active)
        r = int(ours_in.num_reqs)
        assert ours_in.slot_indices[: r * P].tolist() == ref_in.slot_indices.tolist()
        assert ours_in.seq_lens[:n].tolist() == ref_in.seq_lens.tolist()
        assert torch.equal(ours_in.slot_mapping, full.mtp.slot_mapping)
        count("mtp_drafting_inputs (active)")
    count("mtp_drafting_inputs")


def check_mask(cfg, batch, state, m, sched, comp):
    C = cfg.pcp_size * cfg.dcp_size
    if C == 1 or cfg.cp_kv_cache_interleave_size != 1:
        return
    D = m.num_decode_reqs
    _, ours = pcp_fn.mtp_attention_mask(state, batch.num_computed, MAX_MODEL_LEN)
    if D:
        ref = m.generate_mtp_attention_mask_for_decode(comp[:D], np.asarray(sched[:D]))
        assert torch.equal(ours.mask[:D], ref)
        if ref.any():
            count("mtp_attention_mask (some entry blocked)")
    assert not ours.mask[D:].any()
    assert int(ours.num_rows) == (D if D else len(sched))
    count("mtp_attention_mask")


def check_restore_mask(cfg, state, m, rng):
    length = cfg.pcp_size * state.bucket.num_tokens  # the state's [P * L_b] restore index
    idx = torch.from_numpy(rng.integers(0, 1000, size=length, dtype=np.int64))
    _, ours = pcp_fn.mask_restore_index_for_graph(state, idx)
    ref = idx.clone()
    m.mask_spec_decode_restore_idx_for_graph(ref)
    assert ours.tolist() == ref.tolist()
    assert m.pcp_allgather_restore_idx.gpu[:length].tolist() == ours.tolist()
    count("mask_restore_index_for_graph")


def check_drafting_seq_lens(cfg, state, m, rng):
    seq = torch.from_numpy(rng.integers(0, 600, size=state.bucket.num_reqs, dtype=np.int64))
    d = int(rng.integers(0, 3))
    _, ours = pcp_fn.drafting_cp_seq_lens(state, seq, d)
    mla = SimpleNamespace(decode=SimpleNamespace())
    m.update_spec_decode_drafting_cp_metadata(mla, _MLASpec(), seq, d)
    assert ours.cp_seq_len.tolist() == mla.decode.cp_seq_len.tolist()
    other = SimpleNamespace(decode_meta=SimpleNamespace())
    m.update_spec_decode_drafting_cp_metadata(other, object(), seq, d, seq_lens_cpu=seq.clone())
    assert (
        ours.num_computed_tokens_of_pcp_dcp.tolist()
        == other.decode_meta.num_computed_tokens_of_pcp_dcp.tolist()
    )
    count("drafting_cp_seq_lens")


def check_rebuild(cfg, batch, state, sched, comp, table, rank, rng):
    """vllm-ascend's device branch (decode-only batches, P * dcp > 1, async)."""
    n, P = len(sched), cfg.pcp_size
    m = reference_loader.make_manager(
        P,
        rank,
        cfg.max_num_reqs,
        cfg.max_num_tokens,
        num_spec_tokens=cfg.num_spec_tokens,
        dcp=cfg.dcp_size,
        dcp_rank=cfg.dcp_rank,
        hybrid=cfg.hybrid_attn,
        max_model_len=MAX_MODEL_LEN,
    )
    sched_np = np.asarray(sched, dtype=np.int32)
    m.init_batch_info(sched_np, n, np.asarray(comp, dtype=np.int32), np.asarray(comp, dtype=np.int32))
    prev = (torch.zeros(2, 1, dtype=torch.int64), torch.full((n,), -1, dtype=torch.int64))
    ib, req_full, pos_full, cu_full = run_generate(m, cfg, sched, comp, table, with_prefill=False, prev=prev)
    arange_np = np.arange(8192, dtype=np.int64)
    if P > 1:
        local, position_pcp = m.update_tokens_for_pcp(sched_np.copy(), arange_np)
        local = np.asarray(local).copy()
        position_pcp = np.asarray(position_pcp).copy()
    else:
        local, position_pcp = sched_np.copy(), None
    N = int(local.sum())
    req_local = np.repeat(arange_np[:n], local)
    query_pos = arange_np[:N] - np.repeat(np.cumsum(local) - local, local)
    corrected = torch.from_numpy(np.asarray(comp, dtype=np.int64) + rng.integers(-1, 3, size=n)).clamp(min=1)
    corrected_b = torch.zeros(batch.bucket.num_reqs, dtype=torch.int64)
    corrected_b[:n] = corrected
    positions = torch.zeros(N + 8, dtype=torch.int64)
    result = m.rebuild_async_spec_decode_inputs(
        use_async_spec_decode=True,
        valid_sampled_token_count_gpu=torch.ones(n),
        prev_req_id_to_index={"p": 0},
        prev_positions_gpu=prev[1],
        with_prefill=False,
        enable_prompt_embeds=False,
        has_req_prompt_embeds=False,
        supports_mm_inputs=False,
        num_reqs=n,
        total_num_scheduled_tokens=N,
        req_indices=req_local,
        req_indices_gpu=torch.from_numpy(req_local),
        position_pcp=position_pcp,
        query_pos_gpu=torch.from_numpy(query_pos),
        query_pos_np=query_pos,
        positions=positions,
        positions_np=np.zeros(N, dtype=np.int64),
        num_computed_tokens=corrected,
        num_computed_tokens_cpu=np.asarray(comp, dtype=np.int32),
        prev_positions_np=None,
        prev_num_draft_tokens_np=None,
        valid_sampled_token_count_event=None,
        valid_sampled_token_count_cpu=None,
        input_batch=ib,
        input_ids=None,
        scheduler_output=None,
        arange_np=arange_np,
        cu_num_tokens=np.cumsum(local),
        draft_token_ids=None,
        num_spec_tokens=cfg.num_spec_tokens,
        prepare_input_ids=None,
    )
    assert result.rebuilt and result.positions_ready_on_device
    _, ours = pcp_fn.rebuild_spec_positions(state, corrected_b, slot_fn=slot_of)
    assert ours.positions[:N].tolist() == positions[:N].tolist()
    assert (ours.positions[N:] == 0).all()
    F = int(cu_full[-1])
    if P > 1:
        num_reqs, qsl, pos_full_ref = ib.block_table.full_calls[-1]
        assert ours.positions_full[:F].tolist() == pos_full_ref.tolist()
        assert ours.query_start_loc_full[: n + 1].tolist() == qsl.tolist()
    if cfg.decode_threshold > 2:
        M = int(ours.mtp.num_tokens)
        assert ours.mtp.slot_mapping[: M * P].tolist() == m.mtp_slot_pad[: M * P].tolist()
    count("rebuild_spec_positions")


@settings(max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 200, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1))
def check(b, seed):
    P, dcp, interleave, spec, hybrid, R, T, sched, comp, prompt, drafts = b
    LAYOUT[0] = "hybrid" if hybrid else "dcs"
    rng = np.random.default_rng(seed)
    n = len(sched)
    table = _table(R, sched, comp, rng)
    for rank in range(P):
        for dcp_rank in range(dcp):
            cfg = PCPConfig(
                P,
                rank,
                R,
                T,
                num_spec_tokens=spec,
                dcp_size=dcp,
                dcp_rank=dcp_rank,
                cp_kv_cache_interleave_size=interleave,
                hybrid_attn=hybrid,
            )
            batch, sp = pcp_fn.make_spec_batch(cfg, sched, comp, prompt, drafts, token_ids=table)
            state, _ = pcp_fn.update_tokens(init_state(cfg), batch)
            m = reference_loader.make_manager(
                P,
                rank,
                R,
                T,
                num_spec_tokens=spec,
                dcp=dcp,
                dcp_rank=dcp_rank,
                interleave=interleave,
                hybrid=hybrid,
                max_model_len=MAX_MODEL_LEN,
            )
            sched_np = np.asarray(sched, dtype=np.int32)
            m.init_batch_info(
                sched_np, n, np.asarray(comp, dtype=np.int32), np.asarray(prompt, dtype=np.int32)
            )
            local = np.asarray(sched, dtype=np.int64)
            if P > 1:
                try:
                    counts, _ = m.update_tokens_for_pcp(sched_np.copy(), np.arange(8192, dtype=np.int64))
                except Exception as e:  # the reference itself fails (seen: hybrid, P=4, one decode)
                    REFERENCE_RAISED.setdefault(f"{type(e).__name__}: {e}", b)
                    reject()  # nothing to compare with; counted and shown below
                local = np.asarray(counts)[:n].astype(np.int64).copy()
            with_prefill = m.num_decode_reqs < n
            ref_idx, ours_idx = check_spec_decode_indices(cfg, batch, sp, state, m, sched, drafts, local, rng)
            check_restore_mask(cfg, state, m, rng)
            check_drafting_seq_lens(cfg, state, m, rng)
            check_mask(cfg, batch, state, m, sched, comp)
            if P * dcp == 1:
                continue  # vllm-ascend has no full-input buffers without context parallelism
            full, ids = check_full_input_ids(cfg, batch, state, m, sched, comp, table, rng, with_prefill)
            check_drafts(cfg, batch, state, m, sched, ids, ref_idx, ours_idx, rng)
            check_mtp(cfg, batch, state, m, sched, comp, full, rng)
            if not with_prefill:
                check_rebuild(cfg, batch, state, sched, comp, table, rank, rng)
    COUNT[("batches", LAYOUT[0])] += 1


REFERENCE_RAISED: dict[str, tuple] = {}  # vllm-ascend's error -> the first batch it raised on


if __name__ == "__main__":
    check()
    for error, batch in REFERENCE_RAISED.items():
        print(f"skipped: vllm-ascend's update_tokens_for_pcp raised {error} on {batch}")
    layouts = ("dcs", "hybrid")
    print(
        f"{sum(COUNT[('batches', k)] for k in layouts)} random batches "
        f"({COUNT[('batches', 'dcs')]} DualChunkSwap, {COUNT[('batches', 'hybrid')]} hybrid attention; "
        "every PCP and DCP rank of each); pcp_fn == vllm-ascend on (batch, rank) pairs:"
    )
    print(f"  {'':44s} {'dcs':>6s} {'hybrid':>7s}")
    for name in sorted({name for name, _ in COUNT if name != "batches"}):
        print(f"  {name:44s} {COUNT[(name, 'dcs')]:6d} {COUNT[(name, 'hybrid')]:7d}")
