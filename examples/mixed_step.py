"""One mixed decode + prefill step at P = 2, run for every rank, then restored.

    python examples/mixed_step.py

Each rank runs ``pcp_fn.step`` on the same scheduler batch and gets its own
local tokens. We fake a model forward whose hidden state for a token is
``(request, absolute position)``, all-gather the ranks' fixed-size local
buffers (a ``torch.stack`` here, ``all_gather`` in a real engine), restore the
request order and check that every scheduled token came back exactly once.
"""

import torch

import pcp_fn

P = 2
# request 0, 1: decodes (context, 1 token, prompt done); 2: a fresh prefill of 5;
# 3: a chunked prefill of 8 tokens continuing from 16 computed ones.
num_scheduled = [1, 1, 5, 8]
num_computed = [7, 12, 0, 16]
num_prompt = [3, 12, 5, 40]

cfg0 = pcp_fn.PCPConfig(pcp_size=P, pcp_rank=0, max_num_reqs=8, max_num_tokens=64)
# KV slots of the scheduled tokens in scheduler order (from the block table); make_batch pads
# them to the bucket on the host, so the step sees one shape per bucket
slot_mapping = list(range(100, 100 + sum(num_scheduled)))
batch = pcp_fn.make_batch(cfg0, num_scheduled, num_computed, num_prompt, slot_mapping=slot_mapping)
Lb = batch.bucket.num_tokens
print(f"bucket: {batch.bucket} -> {Lb} local rows per rank, {P * Lb} gathered rows\n")

local_buffers = []
for rank in range(P):
    state = pcp_fn.init_state(cfg0, rank=rank)  # the rank as data: one batch serves every rank
    state, out = pcp_fn.step(state, batch)
    n = int(out.layout.num_tokens)
    print(f"rank {rank}: pcp_tokens {out.layout.pcp_tokens[: len(num_scheduled)].tolist()}")
    print(f"  request  {out.layout.request_index[:n].tolist()}")
    print(f"  offset   {out.layout.positions[:n].tolist()}")
    print(f"  position {out.positions[:n].tolist()}")
    # the "model": hidden state of a token = (request, absolute position); padding rows stay -1
    hidden = torch.full((Lb, 2), -1)
    hidden[:n, 0] = out.layout.request_index[:n]
    hidden[:n, 1] = out.positions[:n]
    local_buffers.append(hidden)

gathered = torch.cat(local_buffers)  # what all_gather of the [Lb, 2] buffers yields
state, restored = pcp_fn.restore_hidden_states(state, gathered)
layout = out.layout
rows = P * int(layout.num_tokens)
print(f"\nnum_pads      {layout.num_pads[: len(num_scheduled)].tolist()}")
print(f"unpad_mask    {layout.unpad_mask[:rows].int().tolist()}")
print(f"restore_index {layout.restore_index[:rows].tolist()}")
print(f"slot_mapping  {out.slot_mapping[:rows].tolist()}")
print(f"logits rows   {out.logits_indices[: len(num_scheduled)].tolist()}")

# every real row, in order, is the next scheduled token of the batch (the mask's decode
# region is token-strided; with one token per decode that is each decode's rank-0 copy)
real = restored[:rows][layout.unpad_mask[:rows]]
expected = [(i, c + j) for i, (n, c) in enumerate(zip(num_scheduled, num_computed)) for j in range(n)]
assert [tuple(r) for r in real.tolist()] == expected, "restore lost or reordered a token"
for i, row in enumerate(out.logits_indices[: len(num_scheduled)].tolist()):
    req, pos = restored[row].tolist()
    assert (req, pos) == (i, num_computed[i] + num_scheduled[i] - 1), "logits row is not the last token"
print(f"\nrestored {len(expected)} tokens in scheduler order; logits rows hit each request's last token: OK")
