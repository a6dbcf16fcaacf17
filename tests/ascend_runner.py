"""A stand-in for vllm-ascend 0.23's ``model_runner_v1.py`` around a PCP manager: the lockstep driver.

It drives any object with the 0.23 ``PCPManager`` interface in the runner's own
call order, one scheduled step at a time, and records every value the runner
and the MTP proposer get back (return values, the attributes they read, the
objects the manager writes into) as an observation ``{name: value}``:

    _prepare_inputs   (P > 1: block_table.compute_slot_mapping) -> init_batch_info
                      -> generate_pcp_mtp_input -> update_tokens_for_pcp
                      -> (multimodal: remap_mrope_positions_for_pcp, fill_prompt_embeds_for_pcp,
                      cache_local_schedule_layout) -> rebuild_async_spec_decode_inputs
                      -> get_logits_indices | spec-decode logits from num_pcp_pads_cpu
                      (and adjust_cu_num_scheduled_tokens_for_pcp)
    _build_attention_metadata   get_padded_slot_mapping per KV cache group (of the block
                      table's ``slot_mapping.gpu``) -> generate_pcp_metadata
    _preprocess       maybe_localize_scheduler_output_for_mm_preprocess -> gather_mm_embeddings_for_pcp
                      -> restore_scheduler_output_after_mm_preprocess
    execute_model     get_restore_hidden_states
    _dummy_run        init_batch_info (the input batch's arrays as they are) -> get_padded_slot_mapping
                      -> generate_pcp_metadata, no update_tokens_for_pcp (SimRunner.dummy_run)
    proposer          prepare_spec_decode_first_pass_inputs (get_spec_decode_decode_hidden_states)
                      -> prepare_spec_decode_mtp_drafting_inputs -> update_spec_decode_drafting_cp_metadata
                      -> mask_spec_decode_restore_idx_for_graph

Each simulated runner feeds its manager its own earlier outputs, as a real
runner does. Schedules come from pcp_fn's engine scheduler (chunked prefills,
decodes with draft tokens, accepted and rejected drafts). Plain host code: the
stand-ins (block table, input batch, the all-gather of the other ranks' hidden
states) are deterministic functions of the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from pcp_fn import PCPConfig
from pcp_fn.sim.engine import Scheduler, synthetic_requests

H = 3  # hidden size of the simulated model


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulated deployment (every rank runs it)."""

    name: str
    pcp: int
    dcp: int = 1
    spec: int = 0  # num_speculative_tokens (0: no speculative config)
    interleave: int = 1
    hybrid: bool = False
    async_sched: bool = False
    multimodal: bool = False
    R: int = 8
    T: int = 96
    max_model_len: int = 256
    kv_groups: int = 1
    # workload
    num_requests: int = 8
    max_prompt: int = 40
    max_new: tuple[int, int] = (2, 10)
    token_budget: int | None = None

    def vllm_config(self) -> SimpleNamespace:
        """The attributes of a ``VllmConfig`` the 0.23 manager reads."""
        spec = SimpleNamespace(num_speculative_tokens=self.spec) if self.spec else None
        return SimpleNamespace(
            speculative_config=spec,
            scheduler_config=SimpleNamespace(max_num_batched_tokens=self.T, max_num_seqs=self.R),
            model_config=SimpleNamespace(
                hf_config=SimpleNamespace(model_type="qwen3_next" if self.hybrid else "llama"),
                max_model_len=self.max_model_len,
            ),
            parallel_config=SimpleNamespace(cp_kv_cache_interleave_size=self.interleave),
            _pd_recompute=False,
        )

    def manager_args(self, rank: int, dcp_rank: int) -> tuple:
        """``PCPManager(...)``'s positional arguments as the runner passes them (CPU device)."""
        max_buffer = self.T + self.R * 2 * self.pcp
        return (
            self.pcp,
            rank,
            self.dcp,
            dcp_rank,
            max_buffer,
            self.R,
            torch.device("cpu"),
            self.vllm_config(),
            self.async_sched,
        )


def slot_of(request: Any, position: Any) -> Any:
    """The stand-in block table's KV slot of ``(batch row, position)``."""
    return request * 100_000 + 3 * position + 1


class BlockTable:
    """vllm-ascend 0.23's ``BlockTable`` (``worker/block_table.py``) as the runner and the manager use it.

    With ``pcp * dcp > 1`` both ``compute_slot_mapping`` and
    ``compute_slot_mapping_draft`` go through ``_compute_pcp_dcp_slot_mapping``,
    which writes ``slot_mapping.gpu[:n]`` when its indices are device tensors and
    ``slot_mapping.cpu[:n]`` when they are host ones (``compute_slot_mapping_draft``
    turns numpy arrays into CPU tensors first). The two are separate buffers;
    the runner reads ``slot_mapping.gpu`` for the main model's slots. Here a
    torch tensor stands for a device tensor and a numpy array for a host one,
    as the runner's and the manager's call sites pass them. The block lookup is
    :func:`slot_of` (the rank's ``-1`` for keys stored on other CP ranks is not modelled).
    """

    def __init__(self, size: int = 1 << 13) -> None:
        self.slot_mapping = SimpleNamespace(
            cpu=torch.full((size,), -1, dtype=torch.int32), gpu=torch.full((size,), -1, dtype=torch.int32)
        )
        self.block_tables = [self]
        self.calls: list[tuple[int, list[int], list[int]]] = []

    def _write(self, req: torch.Tensor, pos: torch.Tensor, on_device: bool) -> None:
        slots = slot_of(req.to(torch.int64), pos.to(torch.int64)).to(torch.int32)
        (self.slot_mapping.gpu if on_device else self.slot_mapping.cpu)[: slots.shape[0]] = slots

    def compute_slot_mapping_draft(self, req_indices: Any, positions: Any) -> None:
        on_device = torch.is_tensor(req_indices)
        req = req_indices if on_device else torch.from_numpy(np.asarray(req_indices))
        pos = positions if torch.is_tensor(positions) else torch.from_numpy(np.asarray(positions))
        self._write(req, pos, on_device)

    def compute_slot_mapping(self, num_reqs: int, query_start_loc: torch.Tensor, positions: Any) -> None:
        self.calls.append((num_reqs, query_start_loc.tolist(), torch.as_tensor(positions).tolist()))
        pos = torch.as_tensor(positions)
        counts = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
        req = torch.repeat_interleave(torch.arange(num_reqs), counts, output_size=pos.shape[0])
        self._write(req, pos, on_device=True)


@dataclasses.dataclass(frozen=True)
class StepInput:
    """One scheduled step, the same on every rank."""

    index: int
    req_ids: tuple[str, ...]
    sched: tuple[int, ...]
    comp: tuple[int, ...]  # num_computed_tokens as the runner's host arrays hold them
    true_comp: tuple[int, ...]  # after async correction (== comp without async scheduling)
    prompt: tuple[int, ...]
    drafts: tuple[int, ...]  # draft tokens among each request's scheduled tokens
    rejected: tuple[int, ...]  # drafts the verification rejects
    tokens: tuple[tuple[int, ...], ...]  # each request's known tokens (and drafts)
    is_decode: tuple[bool, ...]
    prev: dict | None  # the previous step's device outputs (async scheduling)


def schedule(cfg: SimConfig, num_steps: int, seed: int) -> list[StepInput]:
    """Steps of pcp_fn's engine scheduler: chunked prefills, then decodes with 0..k drafts each."""
    rng = np.random.default_rng(seed)
    pcfg = PCPConfig(1, 0, cfg.R, cfg.T, num_spec_tokens=cfg.spec)
    requests = synthetic_requests(
        cfg.num_requests, max_prompt=cfg.max_prompt, max_new_tokens=cfg.max_new, arrival_every=2, seed=seed
    )
    sch = Scheduler(pcfg, requests, cfg.token_budget)
    out: list[StepInput] = []
    prev_rows: dict[str, int] = {}
    while len(out) < num_steps and not sch.idle:
        for r in sch.running:
            r.drafts = (
                rng.integers(1, 100, size=int(rng.integers(0, cfg.spec + 1))).tolist() if r.decoding else []
            )
        step = sch.schedule()
        if step is None:
            continue
        by_id = {r.req_id: r for r in sch.running}
        reqs = [by_id[i] for i in step.req_ids]
        thr = 1 + cfg.spec
        decode = [
            c > 0 and n <= thr and c >= p
            for n, c, p in zip(step.num_scheduled, step.num_computed, step.num_prompt)
        ]
        rejected = [int(rng.integers(0, d + 1)) for d in step.drafts]
        ids = tuple(f"r{i}" for i in step.req_ids)
        # async scheduling: the host counts assume every draft of the previous step was accepted
        over = [
            int(rng.integers(0, cfg.spec + 1)) if cfg.async_sched and d and rid in prev_rows else 0
            for rid, d in zip(ids, decode)
        ]
        prev = None
        if cfg.async_sched and prev_rows:
            prev_n = max(prev_rows.values()) + 1
            prev = dict(
                req_id_to_index=dict(prev_rows),
                sampled=torch.from_numpy(rng.integers(60_000, 70_000, size=(prev_n, 1), dtype=np.int32)),
                drafts=torch.from_numpy(rng.integers(70_000, 80_000, size=(prev_n, max(cfg.spec, 1)))),
                over=tuple(over),
            )
        out.append(
            StepInput(
                index=len(out),
                req_ids=ids,
                sched=step.num_scheduled,
                comp=tuple(c + o for c, o in zip(step.num_computed, over)),
                true_comp=step.num_computed,
                prompt=step.num_prompt,
                drafts=step.drafts,
                rejected=tuple(rejected),
                tokens=tuple(tuple(r.tokens) + tuple(r.drafts) for r in reqs),
                is_decode=tuple(decode),
                prev=prev,
            )
        )
        prev_rows = {rid: i for i, rid in enumerate(ids)}
        sampled = []
        for r, d, rej in zip(reqs, step.drafts, rejected):
            accepted = d - rej
            sampled.append(list(r.drafts[:accepted]) + [int(rng.integers(1, 100))])
        sch.advance(step, sampled)
    return out


def hidden_rows(rank: int, step: int, rows: int) -> torch.Tensor:
    """Rank ``rank``'s model output: ``[rows, H]``, row ``l`` unique to (rank, step, l)."""
    base = torch.arange(rows * H, dtype=torch.float64).reshape(rows, H)
    return base + rank * 1e6 + step * 1e8


def pcp_logits(manager: Any, num_draft: np.ndarray, cu: np.ndarray, P: int) -> np.ndarray:
    """The runner's PCP logits indices of a spec-decode step: each request's last ``d + 1`` restored rows.

    Request ``i`` ends at ``cu[i] * P - num_pcp_pads[i]`` in the restored order
    (hybrid attention: ``adjust_cu_num_scheduled_tokens_for_pcp`` with prefills,
    ``cu`` itself without).
    """
    sampled = num_draft.astype(np.int64) + 1
    if P > 1 and manager.pcp_use_hybrid_attn:
        ends = manager.adjust_cu_num_scheduled_tokens_for_pcp(cu, manager.num_pcp_pads_cpu[: cu.size])
    elif P > 1:
        ends = cu * P - manager.num_pcp_pads_cpu[: cu.size]
    else:
        ends = cu
    starts = np.repeat(ends - sampled, sampled)
    first = np.repeat(np.cumsum(sampled) - sampled, sampled)
    return starts + np.arange(int(sampled.sum())) - first


def _snap(x: Any) -> Any:
    """A copy of ``x`` that later writes into the manager's buffers cannot change."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, (list, tuple)):
        return type(x)(_snap(v) for v in x)
    if isinstance(x, dict):
        return {k: _snap(v) for k, v in x.items()}
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    return x


def mm_requests(st: StepInput) -> dict[str, SimpleNamespace]:
    """Request states with M-RoPE tables and multimodal features, a function of the request."""
    reqs = {}
    for rid, p, c in zip(st.req_ids, st.prompt, st.comp):
        rng = np.random.default_rng(int(rid[1:]) * 7919 + 17)
        kind = rng.integers(0, 3)
        cols = p if kind == 0 else (int(rng.integers(1, p + 1)) if kind == 1 else 0)
        table = torch.from_numpy(rng.integers(0, 1000, size=(3, cols))) if kind != 2 else None
        features = []
        pos = 0
        while pos < p and len(features) < 3:
            off = pos + int(rng.integers(0, 6))
            length = int(rng.integers(1, 8))
            mask = torch.from_numpy(rng.random(length) < 0.6) if rng.random() < 0.5 else None
            features.append(
                SimpleNamespace(
                    identifier=f"{rid}_{len(features)}",
                    mm_position=SimpleNamespace(offset=off, length=length, is_embed=mask),
                )
            )
            pos = off + int(rng.integers(0, length + 2))
        reqs[rid] = SimpleNamespace(
            prompt_token_ids=list(range(p)),
            prompt_embeds=None,
            mrope_positions=table,
            mrope_position_delta=int(rng.integers(-20, 20)) if rng.random() < 0.7 else None,
            mm_features=features,
            num_computed_tokens=c,
        )
    return reqs


def mm_cache(requests: dict[str, SimpleNamespace]) -> dict[str, torch.Tensor]:
    """Encoder outputs of every feature (64 rows each), a function of the feature's identifier."""
    out = {}
    for r in requests.values():
        for f in r.mm_features:
            out[f.identifier] = torch.randn(64, H, generator=torch.Generator().manual_seed(len(f.identifier)))
    return out


def prompt_embeds_for(req_id: str, prompt_len: int) -> torch.Tensor:
    """A request's prompt embeds (``[0, prompt + 2]`` rows), a function of the request."""
    rng = np.random.default_rng(int(req_id[1:]))
    return torch.from_numpy(rng.standard_normal((int(rng.integers(0, prompt_len + 3)), H))).float()


@dataclasses.dataclass
class Kinds:
    """The drafter's attention kinds (vllm-ascend classes, or stand-ins) for the CP seq-len update."""

    mla_spec: Any = None  # an AscendMLAAttentionSpec instance, if available
    sfa_builder: Any = None  # an AscendSFADCPMetadataBuilder instance, if available


class SimRunner:
    """One rank's runner around ``manager`` (see the module docstring).

    Args:
        calc_spec_decode_metadata: optional ``f(runner, num_draft_tokens, cu, num_pcp_pads)``
            (the real runner method); default :func:`pcp_logits` for the logits only.
        all_gather_hook: called with this runner's gather function, so a caller can route
            the manager's PCP all-gather to it.
    """

    def __init__(
        self,
        manager: Any,
        cfg: SimConfig,
        rank: int,
        dcp_rank: int,
        calc_spec_decode_metadata: Callable[..., Any] | None = None,
        kinds: Kinds | None = None,
        correct_optimistic: Callable[..., None] | None = None,
    ) -> None:
        self.m, self.cfg, self.rank, self.dcp_rank = manager, cfg, rank, dcp_rank
        self.calc = calc_spec_decode_metadata
        self.kinds = kinds or Kinds()
        self.P = cfg.pcp
        self.arange_np = np.arange(1 << 14, dtype=np.int64)
        self.block_table = BlockTable()
        self.step_index = 0
        # the runner's input batch arrays as the last step left them (what a _dummy_run reads)
        self.num_computed = np.zeros(cfg.R, dtype=np.int32)
        self.num_prompt = np.zeros(cfg.R, dtype=np.int32)
        for _ in range(cfg.kv_groups):
            manager.initialize_slot_mapping()

    # ---------------------------------------------------------------- the all-gather
    def gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """The PCP group's all-gather: this rank's rows, the other ranks' from :func:`hidden_rows`."""
        parts = [x if r == self.rank else hidden_rows(r, self.step_index, x.shape[0]) for r in range(self.P)]
        return torch.cat(parts, dim=0)

    # ---------------------------------------------------------------- one step
    def step(self, st: StepInput) -> dict[str, Any]:
        m, cfg, P = self.m, self.cfg, self.P
        self.step_index = st.index
        obs: dict[str, Any] = {}
        n, R = len(st.req_ids), cfg.R
        thr = 1 + cfg.spec
        nst = np.array(st.sched, dtype=np.int32)
        comp = np.zeros(R, dtype=np.int32)
        comp[:n] = st.comp
        prompt = np.zeros(R, dtype=np.int32)
        prompt[:n] = st.prompt
        self.num_computed, self.num_prompt = comp, prompt
        table = torch.zeros(R, cfg.max_model_len, dtype=torch.int32)
        for i, toks in enumerate(st.tokens):
            table[i, : len(toks)] = torch.tensor(toks, dtype=torch.int32)
        prev = st.prev
        input_batch = SimpleNamespace(
            req_ids=list(st.req_ids),
            req_id_to_index={rid: i for i, rid in enumerate(st.req_ids)},
            num_computed_tokens_cpu=comp,
            num_prompt_tokens=prompt,
            token_ids_cpu_tensor=table,
            token_ids_cpu=table.numpy(),
            block_table=self.block_table,
            prev_sampled_token_ids=None if prev is None else prev["sampled"],
            prev_req_id_to_index=None if prev is None else prev["req_id_to_index"],
        )
        scheduler_output = SimpleNamespace(
            num_scheduled_tokens={rid: int(k) for rid, k in zip(st.req_ids, st.sched)},
            total_num_scheduled_tokens=int(sum(st.sched)),
            scheduled_spec_decode_tokens={rid: [0] * d for rid, d in zip(st.req_ids, st.drafts) if d},
            scheduled_encoder_inputs={},
            free_encoder_mm_hashes=[],
        )
        with_prefill = not all(st.is_decode)
        # ------------------------------------------------------------ _prepare_inputs
        req_indices = np.repeat(self.arange_np[:n], nst)
        cu = np.cumsum(nst)
        total = int(cu[-1])
        positions_np = comp[req_indices] + (self.arange_np[:total] - np.repeat(cu - nst, nst))
        if P > 1:  # the runner's slot mapping, from the host positions, before the split (on the device)
            qsl = torch.zeros(n + 1, dtype=torch.int32)
            qsl[1:] = torch.from_numpy(cu.astype(np.int32))
            self.block_table.compute_slot_mapping(n, qsl, torch.from_numpy(positions_np.astype(np.int64)))
            self.block_table.calls.clear()
        m.init_batch_info(nst, n, input_batch.num_computed_tokens_cpu, input_batch.num_prompt_tokens)
        for name in ("num_reqs", "num_decode_reqs", "num_prefill_reqs", "num_decode_tokens"):
            obs[name] = int(getattr(m, name))
        obs["decode_req_mask"] = np.asarray(m.decode_req_mask).copy()
        obs["query_lens_pcp_full"] = (_snap(m.query_lens_pcp_full.cpu), _snap(m.query_lens_pcp_full.gpu))
        prev_positions_gpu = None
        if prev is not None and st.index % 2 == 0:  # alternate the device and host-list repairs
            rows = [prev["req_id_to_index"].get(rid, -1) for rid in st.req_ids]
            prev_positions_gpu = torch.tensor(rows, dtype=torch.int64)
        draft_ids = None if prev is None else prev["drafts"][:, : cfg.spec]
        if cfg.spec:
            m.generate_pcp_mtp_input(
                total,
                scheduler_output.num_scheduled_tokens,
                with_prefill,
                input_batch,
                self.arange_np,
                req_indices,
                positions_np,
                cu,
                draft_ids,
                scheduler_output,
                cfg.spec,
                prev_positions=prev_positions_gpu,
            )
            self._observe_full(obs, total)
        if P > 1:
            nst[:n], position_pcp = m.update_tokens_for_pcp(nst[:n], self.arange_np)
            obs["update.tokens"] = nst[:n].copy()
            total = int(nst[:n].sum())
            obs["update.positions"] = np.asarray(position_pcp)[:total].copy()
            req_indices = np.repeat(self.arange_np[:n], nst)
            cu = np.cumsum(nst)
            positions_np = comp[req_indices] + np.asarray(position_pcp)[:total]
        else:
            position_pcp = None
        if P > 1 and m.pcp_use_hybrid_attn:
            query_lens = torch.from_numpy(np.array(m.num_scheduled_tokens_padded))
        else:
            query_lens = torch.from_numpy(nst)
        obs["num_pcp_pads_cpu"] = np.asarray(m.num_pcp_pads_cpu[:n]).copy()
        obs["num_scheduled_tokens_padded"] = np.asarray(m.num_scheduled_tokens_padded).copy()
        for name in ("total_num_sampled_tokens_pcp", "max_num_tokens_across_pcp"):
            obs[name] = int(getattr(m, name))
        if m.pcp_use_hybrid_attn:
            for name in (
                "pcp_padded_tokens_fla",
                "total_pcp_padding_tokens_fla",
                "total_num_scheduled_tokens",
            ):
                obs[name] = int(getattr(m, name))
        positions = torch.from_numpy(positions_np.astype(np.int64)).clone()
        if cfg.multimodal and P > 1:
            self._multimodal_prepare(obs, st, input_batch, nst, positions_np, total)
        if cfg.async_sched and cfg.spec:
            positions = self._rebuild(
                obs,
                st,
                input_batch,
                scheduler_output,
                nst,
                req_indices,
                cu,
                positions_np,
                position_pcp,
                total,
                with_prefill,
                prev_positions_gpu,
                draft_ids,
            )
        # logits
        num_draft = np.array(st.drafts, dtype=np.int32)
        tokens_original = list(st.sched) if P > 1 else None
        if not num_draft.any():
            logits = m.get_logits_indices(cu, n, tokens_original)
            obs["logits"] = _snap(logits)
            spec_meta = None
        else:
            pads = m.num_pcp_pads_cpu[:n] if P > 1 else None
            if self.calc is not None:
                spec_meta = self.calc(self, num_draft, cu, pads)
                logits = spec_meta.logits_indices
                obs["spec_metadata"] = {k: _snap(v) for k, v in vars(spec_meta).items()}
            else:
                logits = torch.from_numpy(pcp_logits(m, num_draft, cu, P))
                spec_meta = SimpleNamespace(logits_indices=logits)
            obs["logits"] = _snap(logits)
        # ------------------------------------------------------------ _build_attention_metadata
        num_tokens_unpadded = m.total_num_sampled_tokens_pcp if P > 1 else total
        num_tokens_padded = -(-num_tokens_unpadded // 8) * 8  # the graph runtime's padding
        num_tokens = total if P > 1 and m.pcp_use_hybrid_attn else num_tokens_unpadded
        if P > 1:
            pads_total = int(np.sum(m.num_pcp_pads_cpu[:n]))
            if m.pcp_use_hybrid_attn:
                full = int(np.sum(m.num_scheduled_tokens_padded)) * P - pads_total
            else:
                full = num_tokens * P - pads_total
            slots = self.block_table.slot_mapping.gpu  # what the block table holds now
            for gid in range(cfg.kv_groups):
                padded = m.get_padded_slot_mapping(num_tokens, num_tokens_padded, slots[:full], gid)
                obs[f"padded_slot_mapping.{gid}"] = _snap(padded)
        fixed = None
        if cfg.async_sched and cfg.spec:
            # the optimistic seq lens (host counts plus scheduled tokens), corrected on odd steps
            base = np.array(st.true_comp if st.index % 2 else st.comp, dtype=np.int32)
            fixed = base + nst[:n]
        meta, _ = m.generate_pcp_metadata(
            num_tokens, query_lens, input_batch, nst, torch.zeros(n, 4), n, n, fixed
        )
        obs["metadata"] = None if meta is None else {k: _snap(v) for k, v in vars(meta).items()}
        obs["num_actual_tokens_pcp_padded"] = int(m.num_actual_tokens_pcp_padded)
        if cfg.multimodal and P > 1:
            self._multimodal_preprocess(obs, st, nst, positions_np, total)
        # ------------------------------------------------------------ forward and restore
        hidden = hidden_rows(self.rank, st.index, num_tokens_padded)
        restored = hidden
        if P > 1:
            restored = m.get_restore_hidden_states(hidden)
            obs["restored"] = _snap(restored)
        # ------------------------------------------------------------ the MTP proposer
        if cfg.spec and P * cfg.dcp > 1:
            self._proposer(obs, st, m, spec_meta, logits, restored, positions, thr, nst[:n])
        return obs

    # ---------------------------------------------------------------- _dummy_run
    @staticmethod
    def dummy_counts(cfg: SimConfig, num_tokens: int, uniform_decode: bool) -> np.ndarray:
        """``_dummy_run``'s ``num_scheduled_tokens``: ``1 + k`` per request (uniform decode), else
        ``num_tokens`` spread over ``min(num_tokens, max_num_seqs)`` requests."""
        if uniform_decode:
            q = 1 + cfg.spec
            n = min(cfg.R, -(-num_tokens // q))
            counts = [q] * n
            if num_tokens % q:
                counts[-1] = num_tokens % q
        else:
            n = min(num_tokens, cfg.R)
            counts = [num_tokens // n] * n
            counts[-1] += num_tokens % n
        return np.array(counts, dtype=np.int32)

    def dummy_run(
        self,
        num_tokens: int,
        uniform_decode: bool = False,
        capturing: bool = False,
        slot_mappings: bool = True,
    ) -> dict:
        """vllm-ascend 0.23.0's ``_dummy_run`` with its attention metadata built (graph capture, or the
        runs between steps): ``init_batch_info`` on the input batch's arrays as they are (no
        ``update_tokens_for_pcp``), ``query_lens_pcp_full`` with spec decode, then
        ``_build_attention_metadata``'s slot mappings and ``generate_pcp_metadata`` with the dummy
        batch's own counts; outside capture the block table's slots are reset to -1 afterwards.
        ``slot_mappings=False`` leaves out the padded slot mappings (the check against vllm-ascend's
        manager, whose ``get_padded_slot_mapping`` can raise there, runs the rest alone)."""
        m, cfg, P = self.m, self.cfg, self.P
        nst = self.dummy_counts(cfg, num_tokens, uniform_decode)
        n = nst.shape[0]
        max_query_len = 1 + cfg.spec if uniform_decode else num_tokens
        m.init_batch_info(nst, n, self.num_computed, self.num_prompt)
        if cfg.spec:
            m.query_lens_pcp_full.cpu[:n] = torch.from_numpy(nst)
            m.query_lens_pcp_full.copy_to_gpu()
        obs: dict[str, Any] = {"num_decode_reqs": int(m.num_decode_reqs), "counts": nst.copy()}
        num_tokens_padded = -(-num_tokens // 8) * 8
        slots = self.block_table.slot_mapping.gpu

        def padded(gid: int) -> None:
            if P == 1 or not slot_mappings:
                return
            pads = int(np.sum(m.num_pcp_pads_cpu[:n]))  # the last update's, as the runner reads it
            if m.pcp_use_hybrid_attn:
                full = int(np.sum(m.num_scheduled_tokens_padded)) * P - pads
            else:
                full = num_tokens * P - pads
            got = m.get_padded_slot_mapping(num_tokens, num_tokens_padded, slots[:full], gid)
            obs[f"padded_slot_mapping.{gid}"] = _snap(got)

        padded(0)
        # async spec decode: the optimistic seq lens the dummy run set (max_query_len each)
        fixed = np.full(n, max_query_len, dtype=np.int32) if cfg.async_sched and cfg.spec else None
        obs["fixed"] = fixed
        meta, _ = m.generate_pcp_metadata(
            num_tokens,
            torch.from_numpy(nst),
            SimpleNamespace(num_computed_tokens_cpu=self.num_computed),
            nst,
            torch.zeros(n, 4),
            n,
            n,
            fixed,
        )
        obs["metadata"] = None if meta is None else {k: _snap(v) for k, v in vars(meta).items()}
        for gid in range(1, cfg.kv_groups):
            padded(gid)
        if not capturing:
            slots.fill_(-1)
        return obs

    @staticmethod
    def dummy_plan(cfg: SimConfig, index: int) -> list[tuple[int, bool, bool]]:
        """The ``_dummy_run``s before step ``index`` (``(num_tokens, uniform_decode, capturing)``):
        graph capture at start-up (uniform decode and mixed sizes), then runs between steps (the
        input batch's stale counts classify some rows as decodes; ``R * (q + 1)`` tokens: none)."""
        q = 1 + cfg.spec
        if index == 0:
            return [(2 * q, True, True), (3 * q - 1, True, True), (5, False, True), (1, False, True)]
        if index % 2:
            return [(cfg.R * (q + 1), False, False), (3 * q, True, False)]
        return [(q, True, False), (7, False, False)]

    # ---------------------------------------------------------------- pieces
    def _observe_full(self, obs: dict[str, Any], total: int) -> None:
        m = self.m
        obs["input_ids_pcp_full"] = (
            _snap(m.input_ids_pcp_full.cpu[:total]),
            _snap(m.input_ids_pcp_full.gpu[:total]),
        )
        obs["query_start_loc_pcp_full"] = (
            _snap(m.query_start_loc_pcp_full.cpu),
            _snap(m.query_start_loc_pcp_full.gpu),
        )
        obs["positions_pcp_full"] = _snap(m.positions_pcp_full[:total])
        obs["cu_num_tokens_pcp_full"] = _snap(m.cu_num_tokens_pcp_full)
        obs["mtp_slot_pad"] = _snap(m.mtp_slot_pad)
        obs["async_rebuild"] = (
            _snap(m.async_rebuild_req_indices_full),
            _snap(m.async_rebuild_cu_num_tokens_full),
            int(m.async_rebuild_num_tokens_full),
        )

    def _rebuild(
        self,
        obs,
        st,
        input_batch,
        scheduler_output,
        nst,
        req_indices,
        cu,
        positions_np,
        position_pcp,
        total,
        with_prefill,
        prev_positions_gpu,
        draft_ids,
    ):
        m, n, k = self.m, len(st.req_ids), self.cfg.spec
        prev = st.prev
        device_positions = torch.zeros(total + 8, dtype=torch.int64)
        host_positions = np.zeros(total, dtype=np.int64)
        calls: list[tuple] = []
        input_ids = SimpleNamespace(cpu=torch.zeros(total + 8, dtype=torch.int32))
        input_ids.gpu = torch.zeros_like(input_ids.cpu)
        input_ids.copy_to_gpu = lambda k_: input_ids.gpu[:k_].copy_(input_ids.cpu[:k_])
        prev_rows = np.array([-1 if prev is None else prev["req_id_to_index"].get(r, -1) for r in st.req_ids])
        over = (0,) * n if prev is None else prev["over"]
        prev_n = 1 if prev is None else int(prev["sampled"].shape[0])
        num_draft_prev = np.full(prev_n, k, dtype=np.int64)
        valid = np.full(prev_n, k + 1, dtype=np.int64)
        for i, p in enumerate(prev_rows):
            if p >= 0:
                valid[p] = k + 1 - over[i]
        result = m.rebuild_async_spec_decode_inputs(
            use_async_spec_decode=True,
            valid_sampled_token_count_gpu=None if prev is None else torch.from_numpy(valid),
            prev_req_id_to_index=None if prev is None else prev["req_id_to_index"],
            prev_positions_gpu=prev_positions_gpu,
            with_prefill=with_prefill,
            enable_prompt_embeds=False,
            has_req_prompt_embeds=False,
            supports_mm_inputs=False,
            num_reqs=n,
            total_num_scheduled_tokens=total,
            req_indices=req_indices,
            req_indices_gpu=torch.from_numpy(req_indices),
            position_pcp=position_pcp,
            query_pos_gpu=torch.from_numpy(self.arange_np[:total] - np.repeat(cu - nst[:n], nst[:n])),
            query_pos_np=self.arange_np[:total] - np.repeat(cu - nst[:n], nst[:n]),
            positions=device_positions,
            positions_np=host_positions,
            num_computed_tokens=torch.tensor(st.true_comp + (0,) * 2, dtype=torch.int32),
            num_computed_tokens_cpu=input_batch.num_computed_tokens_cpu,
            prev_positions_np=prev_rows,
            prev_num_draft_tokens_np=num_draft_prev,
            valid_sampled_token_count_event=SimpleNamespace(synchronize=lambda: None),
            valid_sampled_token_count_cpu=torch.from_numpy(valid),
            input_batch=input_batch,
            input_ids=input_ids,
            scheduler_output=scheduler_output,
            arange_np=self.arange_np,
            cu_num_tokens=cu,
            draft_token_ids=draft_ids,
            num_spec_tokens=k,
            prepare_input_ids=lambda *a: calls.append(
                tuple(np.asarray(x).tolist() if isinstance(x, np.ndarray) else x for x in a[1:])
            ),
        )
        obs["rebuild.result"] = (bool(result.rebuilt), bool(result.positions_ready_on_device))
        if result.rebuilt and result.positions_ready_on_device:
            obs["rebuild.positions"] = _snap(device_positions[:total])
            positions = device_positions[:total].clone()
        elif result.rebuilt:
            obs["rebuild.positions_np"] = host_positions.copy()
            obs["rebuild.input_ids"] = _snap(input_ids.gpu[:total])
            obs["rebuild.prepare_input_ids"] = calls
            self._observe_full(obs, int(sum(st.sched)))
            positions = torch.from_numpy(host_positions)
        else:
            positions = torch.from_numpy(positions_np.astype(np.int64))
        obs["rebuild.block_table_calls"] = list(self.block_table.calls)
        self.block_table.calls.clear()
        obs["rebuild.mtp_slot_pad"] = _snap(m.mtp_slot_pad)
        return positions

    def _proposer(self, obs, st, m, spec_meta, logits, restored, positions, thr, local_counts) -> None:
        cfg, P, n = self.cfg, self.P, len(st.req_ids)
        F = int(sum(st.sched))
        ids_full = m.input_ids_pcp_full.gpu
        qsl_full = m.query_start_loc_pcp_full.gpu[: n + 1].clone()
        rejected = torch.tensor(st.rejected, dtype=torch.int64)
        local_qsl = torch.zeros(n + 1, dtype=torch.int32)
        local_qsl[1:] = torch.from_numpy(np.cumsum(local_counts))
        if spec_meta is None:
            tis = qsl_full[1:].to(torch.int64) - 1
            qsl = local_qsl
        else:
            tis = qsl_full[1:].to(torch.int64) - 1 - rejected
            qsl = qsl_full
        seq = torch.tensor([c + k for c, k in zip(st.comp, st.sched)], dtype=torch.int32)
        cam = SimpleNamespace(
            seq_lens=seq.clone(),
            seq_lens_cpu=seq.clone(),
            _seq_lens_cpu=None,
            query_start_loc=qsl.clone(),
            query_start_loc_cpu=qsl.clone(),
            num_actual_tokens=F,
            max_query_len=max(st.sched),
            block_table_tensor=torch.zeros(n, 4),
            prefill_context_parallel_metadata=None,
        )
        tis_in = tis.clone()
        target = restored if P > 1 else hidden_rows(self.rank, st.index, F)
        fp = m.prepare_spec_decode_first_pass_inputs(
            ids_full[:F].clone(),
            positions,
            target,
            tis_in,
            cam,
            m.long_seq_metadata,
            dict(zip(st.req_ids, st.sched)),
            list(st.req_ids),
            logits,
            F,
            m.num_prefill_reqs,
            m.num_decode_reqs,
            False,
        )
        obs["first_pass"] = {k: _snap(v) for k, v in dataclasses.asdict(fp).items()}
        obs["first_pass.tis_in_place"] = _snap(tis_in)
        obs["first_pass.cam"] = {
            k: _snap(v) for k, v in vars(cam).items() if k != "prefill_context_parallel_metadata"
        }
        if P > 1 and m.num_decode_tokens:
            D = m.num_decode_tokens
            obs["decode_hidden_states"] = _snap(
                m.get_spec_decode_decode_hidden_states(restored[: D * P], m.num_decode_reqs, D)
            )
        if cfg.spec >= 2:
            cam2 = SimpleNamespace(block_table_tensor=torch.zeros(n, 4))
            attn = SimpleNamespace(seq_lens=seq.clone(), seq_lens_cpu=None)
            ori = fp.long_seq_args[1] if fp.long_seq_args is not None else tis
            mtp = m.prepare_spec_decode_mtp_drafting_inputs(
                cam2, attn, ori, n, m.num_decode_reqs, m.num_prefill_reqs > 0, cfg.spec
            )
            obs["mtp_drafting"] = (
                None if mtp is None else {k: _snap(v) for k, v in dataclasses.asdict(mtp).items()}
            )
            obs["mtp_drafting.cam_rows"] = int(cam2.block_table_tensor.shape[0])
        for d in range(max(cfg.spec - 1, 1)):
            other = SimpleNamespace(decode_meta=SimpleNamespace())
            m.update_spec_decode_drafting_cp_metadata(other, object(), seq, d, seq_lens_cpu=seq.clone())
            obs[f"drafting_cp.{d}.other"] = other.decode_meta.num_computed_tokens_of_pcp_dcp.copy()
            if self.kinds.mla_spec is not None:
                mla = SimpleNamespace(decode=SimpleNamespace())
                m.update_spec_decode_drafting_cp_metadata(mla, self.kinds.mla_spec, seq, d)
                obs[f"drafting_cp.{d}.mla"] = _snap(mla.decode.cp_seq_len)
            if self.kinds.sfa_builder is not None:
                sfa = SimpleNamespace(
                    dcp_context=SimpleNamespace(seq_lens=torch.full((n + 3,), 9, dtype=torch.int32))
                )
                m.update_spec_decode_drafting_cp_metadata(
                    sfa,
                    object(),
                    seq,
                    d,
                    seq_lens_cpu=seq.clone(),
                    attn_metadata_builder=self.kinds.sfa_builder,
                )
                obs[f"drafting_cp.{d}.sfa"] = _snap(sfa.dcp_context.seq_lens)
        # a graph-padded draft batch: every request thr tokens on every rank
        length = n * thr * P
        idx = torch.arange(length, dtype=torch.int64) * 7 % max(length, 1)
        m.mask_spec_decode_restore_idx_for_graph(idx)
        obs["mask_restore.index"] = _snap(idx)
        obs["mask_restore.buffer"] = _snap(m.pcp_allgather_restore_idx.gpu[: length + 4])

    # ---------------------------------------------------------------- multimodal
    def _multimodal_prepare(self, obs, st, input_batch, nst, positions_np, total) -> None:
        m, n = self.m, len(st.req_ids)
        reqs = mm_requests(st)
        buf = SimpleNamespace(cpu=torch.full((3, total + 4), -7, dtype=torch.int64))
        m.remap_mrope_positions_for_pcp(positions_np, nst, n, input_batch, reqs, buf)
        obs["mm.mrope"] = _snap(buf.cpu)
        embeds = torch.full((total, H), -1.0)
        start = 0
        for i, rid in enumerate(st.req_ids):
            k = int(nst[i])
            if k > 0 and i % 2 == 0:
                req_embeds = prompt_embeds_for(rid, st.prompt[i])
                m.fill_prompt_embeds_for_pcp(
                    req_embeds, positions_np[start : start + k], embeds[start : start + k]
                )
            start += k
        obs["mm.prompt_embeds"] = _snap(embeds)
        m.cache_local_schedule_layout(nst, n, total)
        counts, got_total = m.get_local_schedule_layout()
        obs["mm.local_schedule"] = (np.asarray(counts).copy(), got_total)

    def _multimodal_preprocess(self, obs, st, nst, positions_np, total) -> None:
        m = self.m
        reqs = mm_requests(st)
        ids = list(st.req_ids)
        cache = mm_cache(reqs)
        partial = {k: v for j, (k, v) in enumerate(sorted(cache.items())) if j % 2}
        so = SimpleNamespace(
            total_num_scheduled_tokens=int(sum(st.sched)),
            num_scheduled_tokens={rid: int(k) for rid, k in zip(ids, st.sched)},
            scheduled_encoder_inputs={ids[0]: [0]},
            free_encoder_mm_hashes=["gone", *sorted(cache)[:2]],
        )
        before = dict(vars(so))
        counts, got_total = m.get_local_schedule_layout()
        restore = m.maybe_localize_scheduler_output_for_mm_preprocess(
            so, ids, reqs, positions_np, counts, got_total, partial
        )
        obs["mm.localized"] = {k: _snap(v) for k, v in vars(so).items()}
        obs["mm.restore_state"] = _snap(restore)
        is_mm = torch.zeros(total, dtype=torch.bool)
        embeds, sync_m, sync_x = m.gather_mm_embeddings_for_pcp(
            ids, reqs, positions_np, counts, 0, cache, is_mm, None, False, False
        )
        obs["mm.embeddings"] = (_snap(embeds), _snap(is_mm), sync_m, sync_x)
        sched_enc = m.build_local_mm_schedule(ids, reqs, positions_np, counts, partial)
        obs["mm.local_mm_schedule"] = _snap(sched_enc)
        m.restore_scheduler_output_after_mm_preprocess(so, restore)
        obs["mm.restored"] = vars(so) == before


def correct_optimistic_seq_lens_cpu(base, prev_positions, prev_num_draft, valid_count, num_reqs) -> None:
    """Stand-in for vllm-ascend's ``correct_optimistic_seq_lens_cpu``: drop the rejected drafts' counts."""
    for i in range(num_reqs):
        p = int(prev_positions[i])
        if p >= 0:
            base[i] -= int(prev_num_draft[p]) + 1 - int(valid_count[p])
