"""The simulator's MRV2 side: every call the simulator makes into [`pcp_fn.mrv2`][].

vLLM's model runner V2 (`v1/worker/gpu/pcp_manager.py`, vllm-ascend's
`AscendPCPManager`) lays a step out without DualChunkSwap padding. The
engine's `Runner(layout="mrv2")` goes through [`MRV2Path`][pcp_fn.sim.mrv2_path.MRV2Path] only, so the
MRV2 API is used in this one module:

- [`MRV2Path.partition`][pcp_fn.sim.mrv2_path.MRV2Path.partition]: `mrv2.make_batch` (the host boundary: the
  scheduler's arrays and the global input ids) and `mrv2.partition_batch`;
- [`mrv2_wiring`][pcp_fn.sim.mrv2_path.mrv2_wiring]: `mrv2.gathered_slot_mappings` and
  `mrv2.restore_hidden_states` wired into the tiny model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from .. import mrv2
from ..protocol.config import PCPConfig
from .tiny_model import Wiring


def mrv2_wiring(
    state: mrv2.MRV2State,
    local: mrv2.LocalBatch,
    global_slots: torch.Tensor,
    request_of_token: torch.Tensor,
    last_token: torch.Tensor,
    trash: int,
) -> Wiring:
    """The MRV2 layout: every gathered row with a slot writes the cache (replicated rows only
    from rank 0), sampling reads the restored global order.

    Args:
        state: the state [`pcp_fn.mrv2.partition_batch`][] returned.
        local: the local batch [`pcp_fn.mrv2.partition_batch`][] returned.
        global_slots: `[T]` cache slot of each global token; `request_of_token`: `[T]` its
            batch row; `last_token`: `[S]` the global tokens to sample (each request's last;
            its last `drafts + 1` under spec decode).
    """
    # the host padded the slots to T; the graph reads the bucket's F_b = min(T, P * Lp) rows
    rows = mrv2.token_rows(state.config, state.bucket)
    _, slots = mrv2.gathered_slot_mappings(state, global_slots[:rows].unsqueeze(0))
    slots = slots[0].to(torch.int64)
    return Wiring(
        input_ids=local.input_ids.to(torch.int64),
        positions=local.positions,
        request=request_of_token[local.gather_idx],
        kv_dest=torch.where(slots == state.config.pad_slot_id, trash, slots),
        kv_rows=lambda local_rows, gathered: gathered,
        sample_rows=lambda gathered: mrv2.restore_hidden_states(state, gathered)[1][last_token],
    )


class MRV2Path:
    """One rank's MRV2 layout inside [`pcp_fn.sim.engine.Runner`][].

    `step_fn` replaces [`pcp_fn.mrv2.partition_batch`][] (a compiled one,
    say); it is called with the initial state every step, as
    `partition_batch` reads only the state's config and rank.
    """

    def __init__(
        self,
        config: PCPConfig,
        device: torch.device,
        step_fn: Callable[..., tuple[mrv2.MRV2State, mrv2.LocalBatch]] | None = None,
    ) -> None:
        self.config = mrv2.MRV2Config(
            config.pcp_size, config.pcp_rank, config.max_num_reqs, config.max_num_tokens
        )
        self.state = mrv2.init_state(self.config, device)
        self.step_fn = mrv2.partition_batch if step_fn is None else step_fn
        self.device = device

    def partition(
        self,
        num_scheduled: Sequence[int],
        num_computed: Sequence[int],
        num_prompt: Sequence[int],
        input_ids: Sequence[int],
    ) -> tuple[mrv2.MRV2State, mrv2.LocalBatch]:
        """This step's layout and this rank's [`pcp_fn.mrv2.LocalBatch`][]."""
        batch = mrv2.make_batch(
            self.config, num_scheduled, num_computed, num_prompt, input_ids=input_ids, device=self.device
        )
        return self.step_fn(self.state, batch)

    def wiring(
        self,
        state: mrv2.MRV2State,
        local: mrv2.LocalBatch,
        num_scheduled: Sequence[int],
        num_drafts: Sequence[int],
        slots: Sequence[int],
        trash: int,
    ) -> Wiring:
        """The tiny model's [`Wiring`][pcp_fn.sim.tiny_model.Wiring] for this step: global slots,
        the request of each global token, and the global tokens to sample, padded to `T` on the host
        (one copy)."""
        T, rows = self.config.max_num_tokens, len(num_scheduled)
        total = int(sum(num_scheduled))
        request_of_token = np.zeros(T, dtype=np.int64)
        request_of_token[:total] = np.repeat(np.arange(rows), num_scheduled)
        global_slots = np.zeros(T, dtype=np.int64)
        global_slots[:total] = slots
        # sample each request's last drafts + 1 global tokens (just the last without drafts)
        end = np.cumsum(num_scheduled)
        last = np.concatenate(
            [np.arange(e - d - 1, e) for e, d in zip(end, num_drafts)] or [np.zeros(0, np.int64)]
        ).astype(np.int64)
        host = torch.from_numpy(np.concatenate([request_of_token, global_slots, last])).to(self.device)
        return mrv2_wiring(state, local, host[T : 2 * T], host[:T], host[2 * T :], trash)
