"""The types a [`pcp_fn.Layout`][] takes and returns: rows, orders and per-request records.

Every layout describes one step on one rank with these, whatever its partition. Sizes:
`R_b` request rows and `L_b` local rows per rank from the batch's bucket, `G_b = P * L_b`
rows of the all-gathered buffer (the ranks' local `[L_b, ...]` buffers stacked rank-major).
`P = 2`, tokens `[1, 5, 8]` (request 0 a decode), DualChunkSwap, rank 0:

    RequestGeometry  num_scheduled [1, 5, 8]   replicated [T, F, F]   token_start [0, 1, 6, 14]
                     local [1, 4, 4]           local_start [0, 1, 5, 9]
    LocalRows        request  [0, 1, 1, 1, 1, 2, 2, 2, 2]     (L_b = 9, no padding row here)
                     position [0, 0, 1, 6, 7, 0, 1, 6, 7]     (offset inside the request)
    GatheredOrder    restore_index [0, 9, 1, 2, 10, 11, 12, 13, 3, ...]   (G_b = 18)
    RestoredSpans    start [0, 2, 10]   length [1, 8, 8]      (the restored, padded order)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..core.pytree import pytree_dataclass
from .state import PCPState


class RequestGeometry(NamedTuple):
    """What every layout knows of each request on one rank: `[R_b]` int64 (`*_start`:
    `[R_b + 1]`), `replicated` bool, counts 0-d; 0 past the batch's requests.

    `own` is the layout's private per-request record, opaque to everything else
    (DualChunkSwap's [`pcp_fn.dcs.ChunkGeometry`][]: padded sizes and chunks; `None`
    for a [`pcp_fn.PartitionLayout`][]): what its own `logits_from_geometry`,
    `restored_spans` and index maps read.
    """

    num_scheduled: torch.Tensor  # tokens scheduled this step, before the split
    replicated: torch.Tensor  # every rank holds the whole request (decodes; every request when P == 1)
    token_start: torch.Tensor  # first scheduler-order token of each request, then the total
    local: torch.Tensor  # this rank's local rows of each request
    local_start: torch.Tensor  # first local row of each request on this rank, then the total
    request_ids: torch.Tensor  # arange(R_b): the request of each row
    num_decode_reqs: torch.Tensor  # 0-d decode requests (a prefix)
    num_decode_tokens: torch.Tensor  # 0-d their scheduled tokens
    own: Any = None  # the layout's private record


class LocalRows(NamedTuple):
    """This rank's `[L_b]` local rows, request by request, real rows first."""

    request: torch.Tensor  # int64 request of the row (0 on padding rows)
    position: (
        torch.Tensor
    )  # int64 offset inside the request's scheduled tokens (>= n: a pad row; 0 on padding)
    valid: torch.Tensor  # bool, False on the padding tail
    absolute: torch.Tensor | None = None  # int64 num_computed[request] + position (when asked)


class GatheredOrder(NamedTuple):
    """Maps over the `[G_b]` rows of the restored order (`restore_hidden_states`' rows)."""

    restore_index: torch.Tensor  # int64 gathered row of each restored row (0 past the end)
    unpad_mask: torch.Tensor  # bool: the row carries a token's KV slot (DualChunkSwap: token-strided decodes)
    token: torch.Tensor  # int64 scheduler-order token of a masked row (unspecified elsewhere: mask it)


class RestoredSpans(NamedTuple):
    """Where each request's rows sit in what `restore_hidden_states` returns; `[R_b]` int64 each.

    A replicated request's rows are rank 0's copies of its tokens ([`pcp_fn.testing.check_layout`][]
    checks which rank each restored row is read from)."""

    start: torch.Tensor  # row of the request's first token
    length: torch.Tensor  # rows from `start` that are the request's: its tokens, then any pads


@pytree_dataclass
class TokenLayout:
    """What `update_tokens` returns for one rank (`R_b`, `L_b` from the batch's bucket).

    Attributes:
        pcp_tokens: `[R_b]` int32 tokens of each request on this rank
            (vllm-ascend `update_tokens_for_pcp(...)[0]`); 0 past `num_reqs`.
        positions: `[L_b]` int64 offset of each local token inside its
            request's scheduled tokens (vllm-ascend `[1]`); 0 on padding rows.
        request_index: `[L_b]` int64 request of each local token (the
            runner's `req_indices`); 0 on padding rows.
        num_tokens: 0-d int64 local tokens on this rank (`sum(pcp_tokens)`).
        num_pads: `[R_b]` int64 pads per request (vllm-ascend `num_pcp_pads`; 0 for a
            layout that does not pad).
        is_decode: `[R_b]` bool decode requests (a prefix).
        num_decode_reqs: 0-d int64, the decode requests (a prefix).
        num_decode_tokens: 0-d int64, their tokens.
        unpad_mask: `[P*L_b]` bool real rows of the restored order
            (vllm-ascend `pcp_unpad_mask`). In DualChunkSwap its decode region is
            token-strided, vllm-ascend's convention for the KV slot mapping: decode token
            `t` is row `t*P`. That row is the restored copy of the same token only
            when decodes have one token each; with speculative tokens, read
            decode hidden states through `restore_index`/logits indices.
        restore_index: `[P*L_b]` int64 gathered row of each restored row
            (vllm-ascend `pcp_allgather_restore_idx`); 0 past the restored rows.
    """

    pcp_tokens: torch.Tensor
    positions: torch.Tensor
    request_index: torch.Tensor
    num_tokens: torch.Tensor
    num_pads: torch.Tensor
    is_decode: torch.Tensor
    num_decode_reqs: torch.Tensor
    num_decode_tokens: torch.Tensor
    unpad_mask: torch.Tensor
    restore_index: torch.Tensor

    @classmethod
    def of(
        cls,
        geo: RequestGeometry,
        mine: LocalRows,
        order: GatheredOrder,
        is_decode: torch.Tensor,
        num_pads: torch.Tensor,
    ) -> TokenLayout:
        """The public layout of a rank's request geometry, local rows, restored order and pads."""
        return cls(
            pcp_tokens=geo.local.to(torch.int32),
            positions=mine.position,
            request_index=mine.request,
            num_tokens=geo.local_start[-1],
            num_pads=num_pads,
            is_decode=is_decode,
            num_decode_reqs=geo.num_decode_reqs,
            num_decode_tokens=geo.num_decode_tokens,
            unpad_mask=order.unpad_mask,
            restore_index=order.restore_index,
        )


class LayoutUpdate(NamedTuple):
    """What a layout's `build` returns: the next state, the public layout, and the
    intermediate maps `step` reuses instead of rebuilding them."""

    state: PCPState  # the state recording the batch (pcp_fn.protocol.state.next_state)
    layout: TokenLayout
    geometry: RequestGeometry  # [R_b] rows (hybrid: the full-attention layers' geometry)
    positions: torch.Tensor  # [L_b] absolute positions of the local rows, 0 on padding rows
    slot_token: torch.Tensor  # [P*L_b] scheduler-order token of each unpad_mask row (mask it)
    local_start: torch.Tensor  # [R_b + 1] first local row of each request, then the total
