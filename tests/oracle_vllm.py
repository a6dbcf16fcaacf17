"""The expected results of vLLM's MRV2 ``PCPManager`` methods, from the slow oracle (``oracle_mrv2``).

Shares no code with ``pcp_fn``: every answer is read off ``oracle_mrv2``'s
per-request pieces, in plain Python, and packed into the backend's
``InputBatch`` with the dtypes vLLM 0.32.0 uses. It is the reference of the
default-suite lockstep (no vllm installed) and, in the real-vLLM lockstep, of
the FULL mixed steps vLLM itself refuses. No persistent buffers, no capture:
just values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from oracle_mrv2 import balanced_cuts, oracle_dispatch, oracle_layout, oracle_local, rank_pieces


class OracleManager:
    def __init__(
        self,
        api: Any,
        pcp_world_size: int,
        pcp_rank: int,
        device: torch.device,
        shard_decode_requests: bool,
        max_num_reqs: int,
        max_num_tokens: int,
        block_tables: Any,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
        moe_gathers_tokens: bool = False,
        layout: str = "mrv2",
    ) -> None:
        self.api = api
        # the drop-in's layout option: its prefill split (decodes follow shard_decode_requests)
        base = layout.removesuffix("-sharded")
        self.split = "head-tail" if base == "mrv2" else base
        self.moe = moe_gathers_tokens  # vLLM 0.33+: the local is_padding is the gathered [P * Lp] mask
        # vLLM 0.33+'s per-step metadata class (the local batch's ``pcp`` field), if the api has it
        self.metadata = getattr(api, "PCPBatchMetadata", None)
        # one mask buffer, like vLLM's: a draft or capture mask overwrites the last step's
        self._moe_buf = torch.ones(pcp_world_size * max_num_tokens, dtype=torch.bool, device=device)
        self.P, self.rank, self.device = pcp_world_size, pcp_rank, device
        self.shard, self.dcp, self.interleave = shard_decode_requests, dcp_world_size, cp_interleave
        self.R, self.T = max_num_reqs, max_num_tokens
        self.global_batch: Any = None
        self.local: Any = None
        self.layout: Any = None
        self.gather_rows: list[int] = []
        self.draft_prefill_batch: Any = None
        self.set_block_tables(block_tables)

    def set_block_tables(self, block_tables: Any) -> None:
        self.block_tables = block_tables
        if block_tables is None:
            return
        self.interleave = block_tables.cp_interleave
        max_num_reqs = self.R
        self._tables = [t.new_zeros((2 * max_num_reqs, t.shape[1])) for t in block_tables.input_block_tables]
        self._slots = torch.full(
            (block_tables.num_kv_cache_groups, self.P * self.T), self.api.PAD_SLOT_ID, dtype=torch.int64
        )

    def get_num_tokens_for_dispatch(self, num_scheduled_tokens, is_prefilling) -> int:
        sched = [int(x) for x in num_scheduled_tokens]
        pf = [bool(x) for x in is_prefilling]
        if self.split != "cost-balanced":
            return oracle_dispatch(self.P, sched, pf, self.shard, self.dcp, self.split)[0]
        # no contexts given: the bound on every context, rank 0's cut at context 0 plus one
        bound = [min(n, balanced_cuts(n, 0, self.P)[1] + 1) if p else 0 for n, p in zip(sched, pf)]
        rest = [0 if p else n for n, p in zip(sched, pf)]
        return sum(bound) + oracle_dispatch(self.P, rest, [False] * len(rest), self.shard, self.dcp)[0]

    def partition_batch(self, g: Any, desc: Any) -> Any:
        Mode = self.api.CUDAGraphMode
        sched = [int(x) for x in g.num_scheduled_tokens]
        pf = [bool(x) for x in g.is_prefilling_np]
        computed = [int(x) for x in g.num_computed_tokens_np]
        split = (self.shard, self.dcp, self.split, computed)
        widest, _ = oracle_dispatch(self.P, sched, pf, *split)
        Lp = widest if desc.cg_mode == Mode.NONE else desc.num_tokens
        n = max(1, len(rank_pieces(self.P, sched, pf, *split)[self.rank]))
        Rpad = desc.num_reqs if desc.cg_mode == Mode.FULL and desc.num_reqs is not None else n
        total = sum(sched)
        batch = dict(
            sched=sched,
            computed=computed,
            prefill_len=[int(x) for x in g.prefill_len_np],
            prefilling=pf,
            idx_mapping=[int(x) for x in g.idx_mapping_np],
            input_ids=g.input_ids[:total].tolist(),
            positions=g.positions[:total].tolist(),
        )
        o = oracle_local(
            self.P,
            self.rank,
            batch,
            Lp,
            Rpad,
            shard=self.shard,
            dcp=self.dcp,
            interleave=self.interleave,
            split=self.split,
        )
        self.layout = oracle_layout(self.P, sched, pf, Lp, *split[:2], split=self.split, computed=computed)
        self.gather_rows = o.gather_idx
        dev, i32, i64 = self.device, torch.int32, torch.int64
        prefilling = np.array(o.is_prefilling, dtype=np.bool_)
        real_tokens = o.num_tokens > 0
        idx = torch.tensor(o.idx_mapping[:n], dtype=i64, device=dev)
        dcp_upper = None if o.dcp_bound is None else torch.tensor(o.dcp_bound, dtype=i32)
        if self.metadata is None:
            metadata: dict[str, Any] = {"dcp_local_seq_lens_cpu_upper_bound": dcp_upper}
        else:
            rows = list(o.global_batch_req_idx[:n])
            upper = g.seq_lens_cpu_upper_bound.numpy()
            metadata = {
                "pcp": self.metadata(
                    global_num_tokens=g.num_tokens,
                    global_query_lens_np=np.asarray(g.num_scheduled_tokens)[rows],
                    global_seq_lens_cpu_upper_bound_np=upper[rows],
                    dcp_local_seq_lens_cpu_upper_bound=dcp_upper,
                )
            }
        is_padding = o.is_padding
        if self.moe:  # gathered row q * Lp + l is padding past rank q's tokens
            ranks = rank_pieces(self.P, sched, pf, *split)
            counts = [sum(len(p.tokens) for p in ps) for ps in ranks]
            is_padding = [l >= counts[q] for q in range(self.P) for l in range(Lp)]
        graph_fields = {}  # vLLM 0.32+'s batch (0.30's has none of these)
        if any(f.name == "decode_graph_eligible" for f in dataclasses.fields(g)):
            graph_fields = dict(
                max_seq_len_np=None,
                decode_graph_eligible=not bool(prefilling.any()),
                prefill_runs_as_decode_np=None,
            )
        self.local = dataclasses.replace(
            g,
            req_ids=[g.req_ids[r] for r in o.global_batch_req_idx[:n]],
            num_reqs=n,
            num_reqs_after_padding=Rpad,
            idx_mapping=idx,
            idx_mapping_np=np.array(o.idx_mapping[:n], dtype=g.idx_mapping_np.dtype),
            expanded_idx_mapping=idx,
            expanded_local_pos=torch.zeros(n, dtype=g.expanded_local_pos.dtype, device=dev),
            num_scheduled_tokens=np.array(o.num_scheduled_tokens[:n], dtype=np.int32),
            num_tokens=o.num_tokens,
            num_tokens_after_padding=Lp,
            num_draft_tokens=0,
            num_draft_tokens_per_req=None,
            query_start_loc=torch.tensor(o.query_start_loc, dtype=i32, device=dev),
            query_start_loc_np=np.array(o.query_start_loc, dtype=np.int32),
            seq_lens=torch.tensor(o.seq_lens, dtype=i32, device=dev),
            seq_lens_cpu_upper_bound=torch.tensor(o.seq_lens_cpu_upper_bound, dtype=i32),
            dcp_local_seq_lens=None,
            **metadata,
            num_computed_tokens_np=np.array(o.num_computed_tokens[:n], dtype=np.int32),
            prefill_len_np=np.array(o.prefill_len[:n], dtype=g.prefill_len_np.dtype),
            num_computed_prefill_tokens_np=np.array(o.num_computed_prefill_tokens[:n], dtype=np.int32),
            is_prefilling_np=prefilling,
            has_prefill=bool(prefilling.any()),
            **graph_fields,
            input_ids=torch.tensor(o.input_ids, dtype=i32, device=dev),
            positions=torch.tensor(o.positions, dtype=i64, device=dev),
            is_padding=self._masked(torch.tensor(is_padding, dtype=torch.bool, device=dev)),
            logits_indices=torch.tensor(o.logits_indices, dtype=i32, device=dev),
            cu_num_logits=torch.tensor(o.cu_num_logits[: n + 1], dtype=i32, device=dev),
            cu_num_logits_np=np.arange(n + 1, dtype=np.int32) if real_tokens else np.zeros(n + 1, np.int32),
            prompt_lens=None,
        )
        self.global_batch = g  # draft_prefill_batch is left as it is, like vLLM's
        return self.local

    def prepare_attn(self, local: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        tables = self.block_tables.gather_block_tables(
            local.idx_mapping, local.num_reqs_after_padding, out=tuple(self._tables), out_ptrs=None
        )
        g = self.global_batch
        global_slots = self.block_tables.compute_slot_mappings(
            g.idx_mapping, g.query_start_loc, g.positions, g.num_tokens
        ).clone()
        gather = torch.tensor(self.layout.padded_gather_idx, dtype=torch.int64)
        write = torch.tensor(self.layout.write_mask, dtype=torch.bool)
        slots = torch.where(write, global_slots[:, gather], self.api.PAD_SLOT_ID)
        view = self._slots[:, : slots.shape[1]]
        view.copy_(slots)
        return tables, view

    def _restore(self, gathered: torch.Tensor) -> torch.Tensor:
        return gathered[torch.tensor(self.layout.hidden_restore_idx, dtype=torch.int64)]

    def restore_hidden_states(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._restore(self.api.get_pcp_group().all_gather(hidden, dim=0))

    def restore_for_sampling(self, hidden, aux):
        hidden = self.restore_hidden_states(hidden)
        aux = None if aux is None else [self.restore_hidden_states(a) for a in aux]
        return hidden, aux, self.global_batch

    def prepare_draft_prefill(self, g: Any, input_ids: torch.Tensor) -> None:
        self.draft_prefill_batch = None
        if g is not self.global_batch:
            return
        ids = input_ids.tolist()
        self.local.input_ids.copy_(torch.tensor([ids[t] for t in self.gather_rows], dtype=torch.int32))
        self.draft_prefill_batch = self.local

    def get_draft_input_buffers(self, input_buffers: Any, num_tokens: int | None = None) -> Any:
        """vLLM 0.32's form without ``num_tokens``; 0.33+'s ``(inputs, MoE mask)`` with it."""
        if num_tokens is None:
            return self.draft_prefill_batch if self.draft_prefill_batch is not None else input_buffers
        if self.draft_prefill_batch is not None:
            return self.draft_prefill_batch, self.draft_prefill_batch.is_padding
        return input_buffers, self._moe_mask(input_buffers.is_padding[:num_tokens])

    def _moe_mask(self, is_padding: torch.Tensor) -> torch.Tensor:
        return self._masked(is_padding.repeat(self.P)) if self.moe else is_padding

    def _masked(self, mask: torch.Tensor) -> torch.Tensor:
        """``mask`` in the MoE mask buffer (with moe_gathers_tokens), else itself."""
        if not self.moe:
            return mask
        return self._moe_buf[: mask.shape[0]].copy_(mask)

    def restore_draft_prefill(self, last, hidden):
        if self.draft_prefill_batch is None:
            return last, hidden
        restored = self.restore_hidden_states(last)
        other = restored if hidden is last else self.restore_hidden_states(hidden)
        self.draft_prefill_batch = None
        return restored, other

    # dummy and capture runs: values only
    def prepare_inputs_to_capture(self, dummy: Any) -> Any:
        return dataclasses.replace(
            dummy,
            input_ids=dummy.input_ids.clone(),
            positions=dummy.positions.clone(),
            is_padding=dummy.is_padding.clone(),
            query_start_loc=dummy.query_start_loc.clone(),
            seq_lens=dummy.seq_lens.clone(),
        )

    def prepare_inputs_for_capture_or_profile(self, dummy: Any) -> Any:
        staged = self.prepare_inputs_to_capture(dummy)
        return dataclasses.replace(staged, is_padding=self._moe_mask(staged.is_padding))

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[:num_reqs].zero_() for t in self._tables)

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        self._slots.fill_(self.api.PAD_SLOT_ID)
        return self._slots[:, : num_tokens * self.P]
