"""A new PCP layout in ~60 lines: cost-balanced contiguous chunks, written only against the protocol.

    python examples/cost_balanced_layout.py

DualChunkSwap pads every prefill to ``2P`` chunks and gives each rank a head and a
tail chunk so that causal attention work evens out; MRV2 cuts the same chunks
without padding. This layout instead gives rank ``q`` ONE contiguous run of each
prefill, ``[b_q, b_{q+1})`` with ``b_q = floor(n * sqrt(q / P))``: token ``j``
attends ``j + 1`` keys, so the first ``b`` tokens cost ``~ b^2 / 2`` key-query
pairs and every run costs ``~ n^2 / 2P``: the work, not the token count, is
equalised, with no pad row and one run per request per rank (half DCS's).
(It balances a fresh prefill; a chunk with context is balanced on its own
tokens only, since the state keeps no ``num_computed``.) Decodes are replicated.

Everything else (restore, slot mapping, logits, spec-decode row maps, capture,
``all_ranks``) is inherited from :class:`pcp_fn.PartitionLayout`. The script
checks the layout with :func:`pcp_fn.testing.check_layout`, captures a step, and
runs the simulator with the tiny model at P = 1 and P = 3: same tokens.
"""

from __future__ import annotations

import numpy as np
import torch

import pcp_fn


class CostBalancedLayout(pcp_fn.PartitionLayout):
    """Rank ``q`` holds tokens ``[floor(n*sqrt(q/P)), floor(n*sqrt((q+1)/P)))`` of every prefill."""

    name = "cost-balanced"

    @staticmethod
    def bounds(n: torch.Tensor, q: int | torch.Tensor, P: int) -> torch.Tensor:
        """``[R_b]`` int64 ``floor(n * sqrt(q / P))`` in float64 (numpy's twin below agrees bit for bit:
        IEEE division, square root and product are correctly rounded)."""
        frac = torch.ones((), dtype=torch.float64, device=n.device) * q / P  # q may be a 0-d tensor
        return torch.floor(n.to(torch.float64) * frac.sqrt()).to(torch.int64)

    def segments(self, config, geometry, rank):
        P, n = config.pcp_size, geometry.num_scheduled
        first, end = self.bounds(n, rank, P), self.bounds(n, rank + 1, P)
        replicated = geometry.replicated  # decodes (every request when P == 1): whole on each rank
        first = torch.where(replicated, 0, first)
        length = torch.where(replicated, n, end - first)
        return first[:, None], length[:, None]  # [R_b, 1]: one run per request

    def num_local_tokens(self, config, num_scheduled, num_decodes):
        """Host: the fullest rank's rows (decodes, plus its run of every prefill), for the bucket."""
        P = config.pcp_size
        n = num_scheduled[num_decodes:].astype(np.float64)
        b = np.floor(n[None, :] * np.sqrt(np.arange(P + 1)[:, None] / P)).astype(np.int64)
        per_rank = np.diff(b, axis=0).sum(axis=1) if n.size else np.zeros(P, np.int64)
        decodes = int(num_scheduled[:num_decodes].sum()) if P > 1 else 0
        if P == 1:
            return int(num_scheduled.sum())
        return decodes + int(per_rank.max())


COST_BALANCED = pcp_fn.register_layout(CostBalancedLayout())


def simulate(P: int, requests, *, max_num_reqs=8, budget=96):
    """Run every rank of the tiny engine in threads; rank 0's sampled tokens per step."""
    from pcp_fn.distributed import ThreadedAllGather
    from pcp_fn.sim.engine import Runner
    from pcp_fn.sim.tiny_model import TinyConfig, TinyModel, restored_wiring

    model = TinyModel(TinyConfig())

    def rank(r, all_gather):
        cfg = pcp_fn.PCPConfig(P, r, max_num_reqs, budget, layout="cost-balanced")
        runner = Runner(cfg, requests, model=model, all_gather=all_gather, wiring=restored_wiring)
        return [rec.sampled for rec in runner.run()]

    results = ThreadedAllGather(P).run(rank)
    assert all(res == results[0] for res in results), "ranks disagree"
    return results[0]


def main() -> None:
    from pcp_fn.sim.engine import synthetic_requests
    from pcp_fn.testing import check_layout

    # 1. conformance: P = 1..8 hypothesis batches + capacity edges, then graph checks at P = 3
    check_layout(COST_BALANCED, max_examples=6, graph_pcp_sizes=(3,))
    print("check_layout: ok")

    # 2. the layout at P = 4, one fresh 64-token prefill: equal work, no padding
    cfg = pcp_fn.PCPConfig(4, 0, 4, 64, layout="cost-balanced")
    batch = pcp_fn.make_batch(cfg, [64], [0], [64], slot_mapping=range(64))
    _, out = pcp_fn.all_ranks(pcp_fn.step, pcp_fn.init_state(cfg, rank=0), batch)
    counts = out.layout.num_tokens.tolist()
    work = [int((out.positions[r, :n] + 1).sum()) for r, n in enumerate(counts)]
    print(f"P=4, one 64-token prefill: tokens per rank {counts}, key-query pairs {work}")

    # 3. captured: one graph per bucket, replayed for another batch of that bucket
    full = pcp_fn.make_batch(cfg, [64], [0], [64], slot_mapping=range(64), bucket=cfg.capacity)
    captured = pcp_fn.graph.capture(pcp_fn.step, pcp_fn.init_state(cfg), full, backend="eager")
    # same bucket, another composition: the graph replays
    other = pcp_fn.make_batch(
        cfg, [1, 20, 30], [9, 0, 3], [5, 20, 60], slot_mapping=range(51), bucket=cfg.capacity
    )
    _, replayed = captured(pcp_fn.init_state(cfg), other)
    _, eager = pcp_fn.step(pcp_fn.init_state(cfg), other)
    assert torch.equal(replayed.layout.restore_index, eager.layout.restore_index)
    print(f"captured: {len(captured)} graph(s), replay equals eager")

    # 4. the simulator end to end: the tiny model at P = 3 samples what it samples at P = 1
    requests = synthetic_requests(6, max_prompt=80, max_new_tokens=(2, 5), seed=3)
    assert simulate(3, requests) == simulate(1, requests)
    print("simulator: P = 3 samples the same tokens as P = 1")


if __name__ == "__main__":
    main()
