"""A new PCP layout in ~70 lines: cost-balanced contiguous chunks, written only against the protocol.

    python examples/cost_balanced_layout.py

DualChunkSwap pads every prefill to ``2P`` chunks and gives each rank a head and a
tail chunk so that causal attention work evens out; MRV2 cuts the same chunks
without padding. This layout instead gives rank ``q`` ONE contiguous run of each
prefill, ``[b_q, b_{q+1})``, cut where the causal attention work reaches ``q/P`` of
the request's. Token ``j`` of a request with ``k`` tokens in the KV cache attends
``k + j + 1`` keys, so its first ``b`` tokens cost ``W(b) = b*k + b*(b+1)/2``
key-query pairs, and

    b_q = max { b in [0, n] : P * W(b) <= q * W(n) }

(integers: a float square root guesses it, one step either way makes it exact).
A fresh prefill (``k = 0``) gets ``b_q ~ n * sqrt(q / P)``: at ``P = 4`` a 256-token
prompt splits ``[127, 53, 41, 35]`` tokens, the work within 3% (the script prints a
64-token prompt's split); a chunk behind a long context (``k >> n``) tends to equal
token counts. No pad row, one run per request
per rank (half DCS's). Decodes are replicated.

Everything else (restore, slot mapping, logits, spec-decode row maps, capture,
``all_ranks``) is inherited from :class:`pcp_fn.PartitionLayout`. The script
checks the layout with :func:`pcp_fn.testing.check_layout`, captures a step, and
runs the simulator with the tiny model at P = 1 and P = 3: same tokens.
"""

from __future__ import annotations

import numpy as np
import torch

import pcp_fn


def work(b, k):
    """Key-query pairs of a request's first ``b`` tokens behind ``k`` cached ones (torch or numpy ints)."""
    return b * k + b * (b + 1) // 2


def bounds(n, k, q, P, xp):
    """``b_q`` (module docstring) of requests ``n`` with contexts ``k``, int64; ``xp``: torch or numpy.

    Exact while ``P * (n + k)^2`` fits int64 (contexts below ~2^29 tokens at P = 8).
    """
    total = work(n, k)
    target = total * q  # compare P * W(b) with q * W(n): no division, no rounding
    # the root of b^2/2 + (k + 1/2) b = q W(n) / P, rationalised (no cancellation for small q)
    a = k.astype(np.float64) if xp is np else k.to(torch.float64)
    w2 = 2.0 * target / P
    guess = xp.floor(w2 / (a + 0.5 + xp.sqrt((a + 0.5) ** 2 + w2)))
    b = guess.astype(np.int64) if xp is np else guess.to(torch.int64)
    b = xp.minimum(xp.maximum(b, xp.zeros_like(b)), n)
    b = xp.where((work(b + 1, k) * P <= target) & (b < n), b + 1, b)  # the guess is within one of b_q
    return xp.where(work(b, k) * P > target, b - 1, b)


class CostBalancedLayout(pcp_fn.PartitionLayout):
    """Rank ``q`` holds tokens ``[b_q, b_{q+1})`` of every prefill: equal causal attention work."""

    name = "cost-balanced"

    def segments(self, config, requests, rank):
        P, n, k = config.pcp_size, requests.num_scheduled, requests.num_computed
        first, end = bounds(n, k, rank, P, torch), bounds(n, k, rank + 1, P, torch)
        replicated = requests.replicated  # decodes (every request when P == 1): whole on each rank
        first = torch.where(replicated, 0, first)
        length = torch.where(replicated, n, end - first)
        return first[:, None], length[:, None]  # [R_b, 1]: one run per request

    def num_local_tokens(self, config, num_scheduled, num_decodes, num_computed):
        """Host: the fullest rank's rows (decodes, plus its run of every prefill), for the bucket."""
        P = config.pcp_size
        if P == 1:
            return int(num_scheduled.sum())
        n, k = num_scheduled[num_decodes:], num_computed[num_decodes:]
        b = np.stack([bounds(n, k, q, P, np) for q in range(P + 1)])  # [P + 1, prefills]
        runs = np.diff(b, axis=0).sum(axis=1)  # [P] rows of each rank
        return int(num_scheduled[:num_decodes].sum()) + int(runs.max())


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
