"""A replicated decode batch padded to vllm-ascend's graph, the same in both model-runner-V2 lines.

vllm-ascend captures a decode-only graph for the *global* batch's sizes. Decodes replicated on every
rank make the global query layout the local one, so a rank's local batch is padded to the graph:

    P = 2, three decodes of one token, a FULL_DECODE_ONLY graph of 4 tokens (one per request row):
    local (the layout)   input_ids [a b c]     query_start_loc [0 1 2 3]     seq_lens [s0 s1 s2]
    padded to the graph  input_ids [a b c 0]   query_start_loc [0 1 2 3 4]   seq_lens [s0 s1 s2 0]
    gathered slots       [r0: a b c | r1: a b c]  ->  [r0: a b c - | r1: a b c -]   (- = PAD_SLOT_ID)

Everything here writes fixed-size slices of the persistent buffers (never a new device tensor).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...vllm.bookkeeper import MRV2Bookkeeper
from .engine_types import AscendInputBatch


def graph_query_starts(
    bookkeeper: MRV2Bookkeeper, global_batch: AscendInputBatch, tokens: int, reqs: int
) -> np.ndarray:
    """A decode graph's sizes checked against the buffers (`ValueError` naming the field); its
    global `query_start_loc_np[: reqs + 1]`."""
    if tokens > bookkeeper.max_num_tokens:
        raise ValueError(
            f"input_batch.num_tokens_after_padding={tokens} (the decode graph's tokens) exceeds "
            f"max_num_tokens={bookkeeper.max_num_tokens}"
        )
    if reqs > 2 * bookkeeper.max_num_reqs:
        raise ValueError(
            f"the decode graph's {reqs} request rows exceed the local request capacity "
            f"2 * max_num_reqs = {2 * bookkeeper.max_num_reqs}"
        )
    qsl_np = global_batch.query_start_loc_np[: reqs + 1]
    if qsl_np.shape[0] != reqs + 1:
        raise ValueError(
            f"input_batch.query_start_loc_np has {global_batch.query_start_loc_np.shape[0]} entries; the "
            f"decode graph's {reqs} request rows need {reqs + 1}"
        )
    return qsl_np


def decode_graph_fields(
    bookkeeper: MRV2Bookkeeper,
    global_batch: AscendInputBatch,
    local: AscendInputBatch,
    tokens: int,
    reqs: int,
) -> dict[str, Any]:
    """The local batch's fields padded to a decode-only graph of `tokens` tokens and `reqs` request
    rows: padding tokens zero and marked padding, padding rows' sequence lengths zero, the global
    query starts (its FIA dummy request included) as the local ones."""
    qsl_np = graph_query_starts(bookkeeper, global_batch, tokens, reqs)
    ib = bookkeeper.input_buffers
    num_local, n = local.num_tokens, local.num_reqs
    qsl = ib.query_start_loc[: reqs + 1]
    with bookkeeper.guard():  # fixed-shape device writes only
        ib.input_ids[num_local:tokens].zero_()
        ib.positions[num_local:tokens].zero_()
        ib.is_padding[num_local:tokens].fill_(True)
        ib.seq_lens[n:reqs].zero_()
        if global_batch.query_start_loc.shape[0] > reqs:  # the device twin of query_start_loc_np
            qsl.copy_(global_batch.query_start_loc[: reqs + 1])
    if global_batch.query_start_loc.shape[0] <= reqs:
        qsl.copy_(torch.from_numpy(qsl_np), non_blocking=True)
    upper = torch.zeros(reqs, dtype=local.seq_lens_cpu_upper_bound.dtype)
    upper[:n] = local.seq_lens_cpu_upper_bound[:n]
    return dict(
        num_reqs_after_padding=reqs,
        num_tokens_after_padding=tokens,
        query_start_loc=qsl,
        query_start_loc_np=qsl_np,
        seq_lens=ib.seq_lens[:reqs],
        seq_lens_cpu_upper_bound=upper,
        dcp_local_seq_lens=None,
        input_ids=ib.input_ids[:tokens],
        positions=ib.positions[:tokens],
        is_padding=ib.is_padding[:tokens],
    )


def rank_by_rank_slots(bookkeeper: MRV2Bookkeeper, slots: torch.Tensor, graph: int, pad: int) -> torch.Tensor:
    """The gathered slot mappings `slots` `[K, P * Lp]` in a decode graph's rank-major layout
    `[K, P * graph]`: each rank's `Lp` rows, then `pad` up to the graph's tokens (in the persistent
    gathered buffer, of which `slots` is the head)."""
    P, K = bookkeeper.pcp_world_size, slots.shape[0]
    width = slots.shape[1] // P  # the layout's local tokens
    out = bookkeeper.gathered_slot_mappings[:, : P * graph]
    if width == graph:
        return out
    if width > graph:
        raise ValueError(
            f"the layout's {width} local tokens exceed the decode graph's "
            f"input_batch.num_tokens_after_padding={graph}"
        )
    with bookkeeper.guard():
        compact = slots.view(K, P, width).clone()  # the source overlaps the destination
        grid = out.view(K, P, graph)
        grid[:, :, width:].fill_(pad)
        grid[:, :, :width].copy_(compact)
    return out


def zero_padding_rows(restored: torch.Tensor, num_tokens: int, rows: int) -> torch.Tensor:
    """`[rows, ...]`: the first `num_tokens < rows` rows of `restored`, zeros after (in place when
    `restored` already has `rows` rows)."""
    if restored.shape[0] == rows:
        restored[num_tokens:rows].zero_()
        return restored
    out = restored.new_zeros((rows, *restored.shape[1:]))
    out[:num_tokens].copy_(restored[:num_tokens])
    return out
