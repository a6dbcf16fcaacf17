"""Differential check: pcp_fn and the test oracle against the real seed host path.

Development only (needs the seed file; see seed_loader.py). Run:

    python tools/check_against_seed.py [num_examples]

Prints how many random batches were compared. P = 1 is left out: the runner
never calls the seed's PCP path at P = 1 (it pads to 2 there).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import seed_loader  # noqa: E402
from oracle import oracle_step  # noqa: E402
from seed_batches import seed_batches  # noqa: E402

import pcp_fn  # noqa: E402

COUNT = {"n": 0}


def batches():
    return seed_batches(max_reqs=12, max_context=50)


@settings(max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 300, deadline=None)
@given(batches(), st.data())
def check(b, data):
    P, spec, R, T, sched, comp, prompt = b
    slots = torch.randint(0, 10_000, (sum(sched),), dtype=torch.int32)
    orc = oracle_step(P, sched, comp, prompt, spec)
    for rank in range(P):
        m = seed_loader.make_manager(P, rank, R, T, num_spec_tokens=spec)
        seed = seed_loader.seed_step(m, sched, comp, prompt, slots)
        cfg = pcp_fn.PCPConfig(P, rank, R, T, num_spec_tokens=spec)
        batch = pcp_fn.make_batch(cfg, sched, comp, prompt, slot_mapping=slots)
        st_, lay = pcp_fn.update_tokens(pcp_fn.init_state(cfg), batch)
        N = int(lay.num_tokens)
        Lb = batch.bucket.num_tokens
        n = len(sched)
        assert N == seed["pcp_tokens"].sum()
        np.testing.assert_array_equal(lay.pcp_tokens[:n].numpy(), seed["pcp_tokens"])
        np.testing.assert_array_equal(lay.positions[:N].numpy(), seed["positions"])
        np.testing.assert_array_equal(lay.num_pads[:n].numpy(), seed["num_pads"])
        np.testing.assert_array_equal(lay.unpad_mask[: N * P].numpy(), seed["unpad_mask"])
        assert int(lay.num_decode_reqs) == seed["num_decode_reqs"]
        assert int(lay.num_decode_tokens) == seed["num_decode_tokens"]
        # our index addresses fixed [Lb] rank buffers, the seed's compact [N] ones
        ours = lay.restore_index[: N * P].numpy()
        np.testing.assert_array_equal(ours - (ours // Lb) * (Lb - N), seed["restore_index"])
        _, logits = pcp_fn.get_logits_indices(st_)
        np.testing.assert_array_equal(logits[:n].numpy(), seed["logits"])
        _, sm = pcp_fn.padded_slot_mapping(st_, batch.slot_mapping)
        np.testing.assert_array_equal(sm[: N * P].numpy(), seed["slot_mapping"][: N * P].numpy())
        assert (sm[N * P :] == -1).all() and sm.shape == (P * Lb,)
        # the oracle agrees with the seed too
        assert orc.positions[rank] == seed["positions"].tolist()
        assert orc.pcp_tokens == seed["pcp_tokens"].tolist()
        assert orc.unpad_mask == seed["unpad_mask"].tolist()
        assert orc.restore_index(N) == seed["restore_index"].tolist()
        assert orc.logits == seed["logits"].tolist()
        # and the restored hidden states equal the seed's row for row
        H = 3
        local = [torch.randn(N, H, dtype=torch.float64) for _ in range(P)]
        seed_loader.PCP_GROUP.gathered = torch.cat(local)
        m.num_actual_tokens_pcp_padded = N * P
        seed_restored = m.get_restore_hidden_states(local[rank])
        fixed = torch.zeros(P * Lb, H, dtype=torch.float64)
        for r in range(P):
            fixed[r * Lb : r * Lb + N] = local[r]
        _, restored = pcp_fn.restore_hidden_states(st_, fixed)
        assert torch.equal(restored[: N * P], seed_restored)
    COUNT["n"] += 1


if __name__ == "__main__":
    check()
    print(f"pcp_fn == oracle == seed on {COUNT['n']} random batches (all ranks each)")
