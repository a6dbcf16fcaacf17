"""Differential check: pcp_fn and the test oracle against the real reference host path.

Development only (needs the reference file; see reference_loader.py). Run:

    python tools/check_against_reference.py [num_examples]

Prints how many random batches were compared. P = 1 is left out: the runner
never calls the reference's PCP path at P = 1 (it pads to 2 there).
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

import reference_loader  # noqa: E402
from oracle import oracle_step  # noqa: E402
from reference_batches import reference_batches  # noqa: E402

import pcp_fn  # noqa: E402

COUNT = {"n": 0}


def batches():
    return reference_batches(max_reqs=12, max_context=50)


@settings(max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 300, deadline=None)
@given(batches(), st.data())
def check(b, data):
    P, spec, R, T, sched, comp, prompt = b
    slots = torch.randint(0, 10_000, (sum(sched),), dtype=torch.int32)
    orc = oracle_step(P, sched, comp, prompt, spec)
    for rank in range(P):
        m = reference_loader.make_manager(P, rank, R, T, num_spec_tokens=spec)
        theirs = reference_loader.reference_step(m, sched, comp, prompt, slots)
        cfg = pcp_fn.PCPConfig(P, rank, R, T, num_spec_tokens=spec)
        batch = pcp_fn.make_batch(cfg, sched, comp, prompt, slot_mapping=slots)
        st_, lay = pcp_fn.update_tokens(pcp_fn.init_state(cfg), batch)
        N = int(lay.num_tokens)
        Lb = batch.bucket.num_tokens
        n = len(sched)
        assert N == theirs["pcp_tokens"].sum()
        np.testing.assert_array_equal(lay.pcp_tokens[:n].numpy(), theirs["pcp_tokens"])
        np.testing.assert_array_equal(lay.positions[:N].numpy(), theirs["positions"])
        np.testing.assert_array_equal(lay.num_pads[:n].numpy(), theirs["num_pads"])
        np.testing.assert_array_equal(lay.unpad_mask[: N * P].numpy(), theirs["unpad_mask"])
        assert int(lay.num_decode_reqs) == theirs["num_decode_reqs"]
        assert int(lay.num_decode_tokens) == theirs["num_decode_tokens"]
        # our index addresses fixed [Lb] rank buffers, the reference's compact [N] ones
        ours = lay.restore_index[: N * P].numpy()
        np.testing.assert_array_equal(ours - (ours // Lb) * (Lb - N), theirs["restore_index"])
        _, logits = pcp_fn.get_logits_indices(st_)
        np.testing.assert_array_equal(logits[:n].numpy(), theirs["logits"])
        _, sm = pcp_fn.padded_slot_mapping(st_, batch.slot_mapping)
        np.testing.assert_array_equal(sm[: N * P].numpy(), theirs["slot_mapping"][: N * P].numpy())
        assert (sm[N * P :] == -1).all() and sm.shape == (P * Lb,)
        # the oracle agrees with the reference too
        assert orc.positions[rank] == theirs["positions"].tolist()
        assert orc.pcp_tokens == theirs["pcp_tokens"].tolist()
        assert orc.unpad_mask == theirs["unpad_mask"].tolist()
        assert orc.restore_index(N) == theirs["restore_index"].tolist()
        assert orc.logits == theirs["logits"].tolist()
        # and the restored hidden states equal the reference's row for row
        H = 3
        local = [torch.randn(N, H, dtype=torch.float64) for _ in range(P)]
        reference_loader.PCP_GROUP.gathered = torch.cat(local)
        m.num_actual_tokens_pcp_padded = N * P
        ref_restored = m.get_restore_hidden_states(local[rank])
        fixed = torch.zeros(P * Lb, H, dtype=torch.float64)
        for r in range(P):
            fixed[r * Lb : r * Lb + N] = local[r]
        _, restored = pcp_fn.restore_hidden_states(st_, fixed)
        assert torch.equal(restored[: N * P], ref_restored)
    COUNT["n"] += 1


if __name__ == "__main__":
    check()
    print(f"pcp_fn == oracle == reference on {COUNT['n']} random batches (all ranks each)")
