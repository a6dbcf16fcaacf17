"""vllm-ascend 0.30's `AscendPCPManager` (0.30.0rc2, over vLLM 0.30.0) on pcp_fn's bookkeeping.

`FunctionalAscendPCPManager` over vllm-ascend 0.30 *is* vllm-ascend's `AscendPCPManager` (a subclass):
what is PCP bookkeeping (the partition, the slot mappings, the restores, the capture staging) runs
on the [`MRV2Bookkeeper`][pcp_fn.adapters.vllm.MRV2Bookkeeper]'s graphs and persistent buffers; what is
vllm-ascend's policy or plumbing is vllm-ascend's own code, inherited as it is
([`ASCEND_0_30.inherited`][pcp_fn.adapters.vllm_ascend.v2.contract.ASCEND_0_30]): the decode placement
rule `is_decode_sharded`, `validate_config`, the draft broadcast, the graph request counts, the
attention context (built from the manager's vLLM-named views, which here are views of the
bookkeeper's buffers), `restore_for_sampling` (its `_sampling_hidden_restored` skip) and
`restore_hidden_state_buffer`.

vllm-ascend 0.30 over vLLM 0.30's base, per step (`partition_batch(input_batch, padded_num_tokens,
padded_num_reqs)`):

- decodes are sharded round-robin (one rank each) when `is_decode_sharded` (PCP > 1, DCP = 1, no
  speculative decoding: the runner's `vllm_config` decides, set after construction), else replicated;
  the bookkeeper follows the rule as it stands at each step;
- `padded_num_reqs` pads the local request rows only when decodes are sharded (a rank-local FULL
  graph); a sharded uniform FULL graph's local query starts are the graph's (`q * query_len`);
- a replicated decode-only batch is padded to its global graph: tokens to `num_tokens_after_padding`,
  request rows to it too for a FULL_DECODE_ONLY graph without drafts (else to
  `num_reqs_after_padding`), the global query starts as the local ones;
- the restore index covers the global `num_tokens_after_padding` rows (rows past the scheduled
  tokens read gathered row 0 and are zeroed in the restored states);
- `seq_lens_np` at the padded rows, zero on an empty rank (with its upper bounds); a decode-only
  batch keeps the global attention state, any other gets `build_attn_state(..., kv_cache_config=)`;
- drafts stay on the global batch (`prepare_draft_prefill` does nothing: inherited).

`prepare_slot_mappings` lays a replicated decode graph wider than the batch rank by rank
(`[rank 0 rows | rank 0 padding | rank 1 rows | ...]`); `get_dummy_block_tables` zeroes views of the
persistent local tables. Bad sizes are `ValueError` naming the field (vllm-ascend: `RuntimeError`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ....core.checks import check_int
from ...vllm.bookkeeper import MRV2Bookkeeper
from ...vllm.contract import padded_sizes
from ...vllm.engine_types import BlockTables, VllmConfig
from ...vllm.manager import BookkeeperAttribute, FunctionalPCPManagerMixin
from ...vllm.replace import replace_fields
from .engine_types import AscendInputBatch
from .graph_padding import decode_graph_fields, rank_by_rank_slots, zero_padding_rows


class AscendBookkeeper030(MRV2Bookkeeper):
    """The MRV2 bookkeeper of vllm-ascend 0.30: vllm-ascend's graph rows as its runner gives them, and
    the per-step views vLLM 0.30's manager keeps under its private names (the attention context and
    vllm-ascend's runner read them)."""

    serves_other_splits = False  # vllm-ascend's NPU attention is not checked against another split
    step_restore_idx: torch.Tensor | None = None  # [num_tokens_after_padding] of the global batch
    step_padded_gather_idx: torch.Tensor | None = None  # [P * Lp]
    step_kv_write_mask: torch.Tensor | None = None  # [P * Lp]
    step_local_gather_idx: torch.Tensor | None = None  # [Lp]: this rank's gathered rows' tokens

    def full_rows(self, num_reqs: int, num_tokens: int, max_query_len: int | None) -> int:
        return num_reqs  # vllm-ascend sizes its own graphs' rows


class AscendMethods030:
    """The body of `FunctionalAscendPCPManager` over vllm-ascend 0.30's `AscendPCPManager` (see the
    module); placed before vLLM 0.30's drop-in methods, `FunctionalPCPManagerMixin` and vllm-ascend's
    class.

    Args:
        pcp_world_size: `P`, the PCP group's size.
        pcp_rank: this rank of the PCP group.
        device: where the persistent buffers and the graphs live.
        req_states: vLLM's request states (accepted, not kept: like vllm-ascend's).
        max_num_reqs: `R`, global requests per step.
        max_num_tokens: `T`, global scheduled tokens per step.
        block_tables: vLLM's `BlockTables` (their slot dtype is the slot mappings').
        dcp_world_size: decode context-parallel ranks.
        dcp_rank: this rank's decode context-parallel rank.
        cp_interleave: the KV interleave size.
        record_schedule: record every step's schedule to this trace file (default
            `$PCP_FN_RECORD_SCHEDULE`; [`pcp_fn.adapters.recording`][]).

    Attributes:
        vllm_config: set by the runner (after its KV-cache init, with `kv_cache_config` and
            `global_input_buffers`); its parallel and speculative configs place the decodes.
    """

    bookkeeper: AscendBookkeeper030
    bookkeeper_cls = AscendBookkeeper030

    # vLLM 0.30's per-step names, as views of the bookkeeper's persistent buffers
    _hidden_restore_idx = BookkeeperAttribute("step_restore_idx")
    _padded_gather_idx = BookkeeperAttribute("step_padded_gather_idx")
    _gathered_kv_write_mask = BookkeeperAttribute("step_kv_write_mask")
    _local_gather_idx = BookkeeperAttribute("step_local_gather_idx")
    _global_batch_slot_mappings = BookkeeperAttribute("global_slot_mappings")
    _gathered_kv_slot_mappings = BookkeeperAttribute("gathered_slot_mappings")
    _hidden_restore_idx_buffer = BookkeeperAttribute("hidden_restore_idx")

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: torch.device,
        req_states: Any = None,  # vLLM's RequestState: vllm-ascend's accepts it and keeps nothing
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: BlockTables | None = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
        *,
        record_schedule: str | os.PathLike[str] | None = None,
    ) -> None:
        # the runner's config decides the decode placement once it sets vllm_config; the current
        # one (the runner builds its manager under it) is the best first guess for the graphs
        config = self.ascend_api.current_vllm_config()  # type: ignore[attr-defined]
        shard = config is not None and bool(self.ascend_api.decode_sharding(config))  # type: ignore[attr-defined]
        FunctionalPCPManagerMixin.__init__(
            self, pcp_world_size, pcp_rank, device, shard, max_num_reqs, max_num_tokens, block_tables,  # type: ignore[arg-type]
            dcp_world_size, dcp_rank, cp_interleave, record_schedule=record_schedule,
        )  # fmt: skip
        for name in _VIEW_NAMES:  # vLLM's constructor's values: the bookkeeper's views from now on
            self.__dict__.pop(name, None)
        if block_tables is not None:  # PAD_SLOT_ID in the cache-write kernels' slot dtype
            self._pad_slot_id = self._pad_slot_id.to(block_tables.slot_mappings.dtype)

    # ------------------------------------------------------------ the runner's config

    @property
    def vllm_config(self) -> VllmConfig:
        """The runner's config (an `AttributeError` until the runner sets it, as vllm-ascend's)."""
        try:
            return self.__dict__["_vllm_config"]
        except KeyError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute 'vllm_config'") from None

    @vllm_config.setter
    def vllm_config(self, config: VllmConfig) -> None:
        self.__dict__["_vllm_config"] = config
        if "bookkeeper" in self.__dict__:  # (the graphs of its decode placement: start-up work)
            self._sync_decode_placement()

    def _sync_decode_placement(self) -> bool:
        """vllm-ascend's rule (`is_decode_sharded`, inherited) as it stands now; the bookkeeper
        follows a change (rebuilding its graphs: the runner decides before the first step)."""
        shard = bool(self.is_decode_sharded)  # type: ignore[attr-defined]
        if shard != self.bookkeeper.shard_decode_requests:
            self.bookkeeper.set_shard_decode_requests(shard)
        return shard

    # ------------------------------------------------------------ partition

    def get_num_tokens_for_dispatch(self, num_scheduled_tokens: np.ndarray, is_prefilling: np.ndarray) -> int:
        """The largest real rank-local batch before graph padding (host twin), decodes placed by
        vllm-ascend's rule."""
        self._sync_decode_placement()
        return self.bookkeeper.get_num_tokens_for_dispatch(num_scheduled_tokens, is_prefilling)

    def partition_batch(
        self,
        input_batch: AscendInputBatch,
        padded_num_tokens: int | None = None,
        padded_num_reqs: int | None = None,
    ) -> AscendInputBatch:
        """This rank's local `AscendInputBatch` (vllm-ascend 0.30's `partition_batch`; see the module).

        Raises:
            ValueError: a padded size that is not an int of its range, a graph larger than the local
                buffers, and as [`MRV2Bookkeeper.partition_batch`][pcp_fn.adapters.vllm.MRV2Bookkeeper].
        """
        bookkeeper = self.bookkeeper
        shard = self._sync_decode_placement()
        if padded_num_reqs is not None and not shard:  # vllm-ascend does not pass it on: checked alone
            check_int("padded_num_reqs", padded_num_reqs, 1)
        cache = bookkeeper.__dict__.setdefault("padded_sizes", {})
        sizes = padded_sizes(
            self.vllm_api.CUDAGraphMode,
            cache,
            padded_num_tokens,
            padded_num_reqs if shard else None,  # type: ignore[attr-defined]
        )
        global_batch = input_batch
        local = bookkeeper.partition_batch(global_batch, sizes)
        self._step_views(global_batch, local)
        if not shard:
            local = self._pad_replicated_decode_graph(global_batch, local)
        elif padded_num_reqs is not None:
            self._pad_uniform_query_start_loc(global_batch, local)
        self._attention_fields(global_batch, local)
        return local

    def _step_views(self, global_batch: AscendInputBatch, local: AscendInputBatch) -> None:
        """The step's vLLM-named views: the gathered rows' tokens and write mask `[P * Lp]`, this
        rank's `[Lp]`, and the restore index over the global `num_tokens_after_padding` rows (rows
        past the scheduled tokens read gathered row 0)."""
        bookkeeper = self.bookkeeper
        P, q, Lp = bookkeeper.pcp_world_size, bookkeeper.pcp_rank, local.num_tokens_after_padding
        n, rows = global_batch.num_tokens, global_batch.num_tokens_after_padding
        if rows.__class__ is not int or not n <= rows <= bookkeeper.max_num_tokens:
            check_int("input_batch.num_tokens_after_padding", rows, n, bookkeeper.max_num_tokens)
        views = bookkeeper.schedule_cache.table("ascend views")
        key = (Lp, rows)
        found = views.get(key)
        if found is None:
            gather = bookkeeper.padded_gather_idx
            found = bookkeeper.schedule_cache.put(
                "ascend views",
                key,
                (
                    gather[: P * Lp],
                    bookkeeper.kv_write_mask[: P * Lp],
                    gather[q * Lp : q * Lp + Lp],
                    bookkeeper.hidden_restore_idx[:rows],
                ),
            )
        (
            bookkeeper.step_padded_gather_idx,
            bookkeeper.step_kv_write_mask,
            bookkeeper.step_local_gather_idx,
            bookkeeper.step_restore_idx,
        ) = found
        if rows > n:  # the global graph's padding rows restore gathered row 0 (then zeroed)
            with bookkeeper.guard():
                found[3][n:].zero_()

    def _pad_replicated_decode_graph(self, global_batch: AscendInputBatch, local: AscendInputBatch) -> Any:
        """A replicated decode-only batch at its global graph's sizes (the same batch when it fits)."""
        if not self.bookkeeper.decode_only:  # of the batch just partitioned
            return local
        tokens = global_batch.num_tokens_after_padding
        token_sized = self._full_decode_requests_are_token_sized(global_batch)  # type: ignore[attr-defined]
        reqs = tokens if token_sized else global_batch.num_reqs_after_padding
        if tokens <= local.num_tokens_after_padding and reqs <= local.num_reqs_after_padding:
            return local
        return replace_fields(local, decode_graph_fields(self.bookkeeper, global_batch, local, tokens, reqs))

    def _pad_uniform_query_start_loc(self, global_batch: AscendInputBatch, local: AscendInputBatch) -> None:
        """A sharded uniform FULL graph: every local row (padding and an empty rank's placeholder
        too) gets the graph's query width, as the captured FIA graph reads them."""
        rows = local.num_reqs_after_padding
        width = local.num_tokens_after_padding // rows
        if np.any(global_batch.num_scheduled_tokens != width):
            return
        qsl_np = local.query_start_loc_np
        qsl_np[:] = np.arange(rows + 1, dtype=np.int32) * width
        with self.bookkeeper.guard():
            local.query_start_loc.copy_(torch.from_numpy(qsl_np), non_blocking=True)

    def _attention_fields(self, global_batch: AscendInputBatch, local: AscendInputBatch) -> None:
        """The local batch's `seq_lens_np` (at its padded rows; zero on an empty rank, its upper
        bounds too) and, with a prefill in the global batch, its own attention state."""
        n, padded = local.num_reqs, local.num_reqs_after_padding
        seq_lens = local.num_computed_tokens_np + local.num_scheduled_tokens
        if local.num_tokens == 0:  # an empty rank's placeholder row
            seq_lens[:] = 0
            local.seq_lens_cpu_upper_bound.zero_()
        if padded > n:
            buf = self.bookkeeper.input_buffers.seq_lens_np
            buf[:n] = seq_lens
            buf[n:padded] = 0
            local.seq_lens_np = buf[:padded]
        else:
            local.seq_lens_np = seq_lens
        if not np.count_nonzero(global_batch.is_prefilling_np):
            return  # a decode-only batch keeps the global attention state (replace copied it)
        local.attn_state = self.ascend_api.build_attn_state(  # type: ignore[attr-defined]
            self.vllm_config,
            seq_lens,
            n,
            local.num_scheduled_tokens,
            local.num_scheduled_tokens,
            kv_cache_config=self.kv_cache_config,  # type: ignore[attr-defined]
        )

    # ------------------------------------------------------------ attention

    def prepare_slot_mappings(self) -> torch.Tensor:
        """The gathered slot mappings `[K, P * Lp]`; a replicated decode-only batch whose graph is
        wider than the batch gets them in the graph's rank-major layout `[K, P * graph tokens]`."""
        bookkeeper = self.bookkeeper
        slots = bookkeeper.prepare_slot_mappings()
        global_batch = bookkeeper.last_global_batch
        graph = global_batch.num_tokens_after_padding
        if bookkeeper.shard_decode_requests or not bookkeeper.decode_only or graph <= global_batch.num_tokens:
            return slots
        return rank_by_rank_slots(bookkeeper, slots, graph, self.vllm_api.PAD_SLOT_ID)  # type: ignore[attr-defined]

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        """Zeroed views of the persistent local block tables (capture and dummy runs: a FULL graph
        keeps the tables `prepare_attn` writes)."""
        tables = self._local_block_tables  # type: ignore[attr-defined]
        if tables is None:
            raise RuntimeError("PCP-local block tables are not initialized.")
        check_int("get_dummy_block_tables: num_reqs", num_reqs, 0, min(t.shape[0] for t in tables))
        return tuple(t[:num_reqs].zero_() for t in tables)

    # ------------------------------------------------------------ hidden states

    def restore_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """All-gather the ranks' local rows and put them in global order, `[num_tokens_after_padding,
        ...]` with the rows past the scheduled tokens zero; unchanged off the last pipeline stage and
        before the first `partition_batch`."""
        if not self.is_last_pp_rank:  # type: ignore[attr-defined]
            return hidden_states
        bookkeeper = self.bookkeeper
        if not bookkeeper.has_layout:
            return hidden_states
        gathered = self.vllm_api.get_pcp_group().all_gather(hidden_states, dim=0)  # type: ignore[attr-defined]
        global_batch = bookkeeper.last_global_batch
        n, rows = global_batch.num_tokens, bookkeeper.step_restore_idx.shape[0]
        restored = bookkeeper.graphs.restore(layout_rows(bookkeeper, gathered), rows)
        if rows > n:
            with bookkeeper.guard():
                return zero_padding_rows(restored, n, rows)
        return restored


def layout_rows(bookkeeper: MRV2Bookkeeper, gathered: torch.Tensor) -> torch.Tensor:
    """`gathered` at the layout's `P * Lp` rows: a replicated decode graph padded past the layout
    gathers `P * graph` rows, whose restored rows are all rank 0's (the first `Lp`)."""
    P, Lp, global_batch = bookkeeper.pcp_world_size, bookkeeper.layout_tokens, bookkeeper.last_global_batch
    rows = gathered.shape[0]
    if rows == P * Lp or global_batch is None or not bookkeeper.decode_only:
        return gathered
    graph = global_batch.num_tokens_after_padding
    return gathered[: P * Lp] if graph > Lp and rows == P * graph else gathered


_VIEW_NAMES = tuple(
    name for name, value in vars(AscendMethods030).items() if isinstance(value, BookkeeperAttribute)
)
