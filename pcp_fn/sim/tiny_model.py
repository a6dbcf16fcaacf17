"""A tiny decoder wired the way a PCP model runner wires it: the example of composing pcp_fn.

Two layers, a few heads, float64, random weights from a fixed generator, rotary
positions and a real paged KV cache. One rank's forward (`TinyModel.forward`):

1. embed this rank's local tokens at their absolute positions;
2. per layer: compute q, k, v of the local rows; all-gather k and v and write
   them into the paged cache through the layout's slot mapping; attend the
   local queries causally against the cache;
3. all-gather the final hidden states, restore the request order, take the
   sampling rows and project to the vocabulary.

The layout-specific part is a [`Wiring`][pcp_fn.sim.tiny_model.Wiring]:
[`dcs_wiring`][pcp_fn.sim.tiny_model.dcs_wiring] for the DualChunkSwap step
([`pcp_fn.step`][pcp_fn.step.step]: decode K/V from the local rows, compacted with the slot
mapping's stride `P`, decode token `t`'s slot at row `t * P`; prefill K/V from the restored rows),
[`pcp_fn.sim.mrv2_path.mrv2_wiring`][] for the MRV2 layout ([`pcp_fn.mrv2`][]).

Every rank keeps the whole KV cache (each writes every token's K/V), which
keeps the model small; the attention over the cache is what PCP splits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from .. import StepOutputs
from ..distributed import AllGather

DTYPE = torch.float64


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    vocab: int = 101
    dim: int = 32
    heads: int = 4
    layers: int = 2
    block_size: int = 4
    num_blocks: int = 512
    max_model_len: int = 512
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rotary(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding of `x [L, H, d]` at absolute positions `pos [L]`."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=DTYPE, device=x.device) / half)
    angle = pos.to(DTYPE)[:, None, None] * freq
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class PagedKVCache:
    """`k`, `v`: `[layers, num_slots + 1, heads, head_dim]`; the last slot is the trash
    slot where writes with `pad_slot_id` land."""

    def __init__(self, cfg: TinyConfig, device: torch.device | str = "cpu") -> None:
        shape = (cfg.layers, cfg.num_slots + 1, cfg.heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=DTYPE, device=device)
        self.v = torch.zeros(shape, dtype=DTYPE, device=device)
        self.trash = cfg.num_slots


class Wiring(NamedTuple):
    """How one rank's local rows meet the layout in one step
    ([`dcs_wiring`][pcp_fn.sim.tiny_model.dcs_wiring], [`pcp_fn.sim.mrv2_path.mrv2_wiring`][])."""

    input_ids: torch.Tensor  # [L] token of each local row
    positions: torch.Tensor  # [L] absolute position of each local row
    request: torch.Tensor  # [L] batch row of each local row (block tables, sequence lengths)
    kv_dest: torch.Tensor  # [M] cache slot of each row that kv_rows returns (the trash slot: no write)
    kv_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (local, all-gathered) -> [M, ...]
    sample_rows: Callable[[torch.Tensor], torch.Tensor]  # all-gathered hidden -> [R_b, ...] to sample


def restored_wiring(
    out: StepOutputs,
    input_ids: torch.Tensor,
    trash: int,
    logits_indices: torch.Tensor | None = None,
) -> Wiring:
    """Any layout whose padded slot mapping row `k` is restored row `k`'s slot (every
    [`pcp_fn.PartitionLayout`][]; DualChunkSwap without speculative tokens): K/V of every
    token from the restored rows, sampling rows at `logits_indices` of them.

    Args: as [`dcs_wiring`][pcp_fn.sim.tiny_model.dcs_wiring] (`[L_b]` local rows, `[P * L_b]` slot mapping).
    """
    lay = out.layout
    restore = lay.restore_index
    dest = out.slot_mapping.to(torch.int64)
    rows = out.logits_indices if logits_indices is None else logits_indices
    return Wiring(
        input_ids=input_ids,
        positions=out.positions,
        request=lay.request_index,
        kv_dest=torch.where(dest < 0, trash, dest),
        kv_rows=lambda local, gathered: gathered[restore],
        sample_rows=lambda gathered: gathered[restore][rows],
    )


def dcs_wiring(
    out: StepOutputs,
    input_ids: torch.Tensor,
    trash: int,
    logits_indices: torch.Tensor | None = None,
) -> Wiring:
    """DualChunkSwap ([`pcp_fn.step`][pcp_fn.step.step]): decode K/V from the local rows, compacted
    with the slot mapping's stride `P` (decode token `t`'s slot is padded row `t * P`); prefill K/V
    from the restored rows; sampling rows at `logits_indices` of the restored hidden states (default
    `out.logits_indices`; spec decode passes `spec_decode_indices(...).logits_indices`).

    Args:
        out: [`pcp_fn.step`][pcp_fn.step.step]'s outputs; every size comes from their shapes (`[L_b]`
            local rows, `[P * L_b]` padded slot mapping).
        input_ids: `[L_b]` token of each local row.
        trash: the cache's trash slot (rows that must not write).
    """
    lay = out.layout
    L = input_ids.shape[0]
    if out.positions.shape[0] != L or out.slot_mapping.shape[0] % L:
        raise ValueError(
            f"input_ids must have the step's {out.positions.shape[0]} local rows, got shape "
            f"{tuple(input_ids.shape)}"
        )
    P = out.slot_mapping.shape[0] // L
    rows = torch.arange(L, device=input_ids.device)
    local_dest = torch.where(rows < lay.num_decode_tokens, out.slot_mapping[rows * P], -1)
    padded = torch.arange(P * L, device=input_ids.device)
    gathered_dest = torch.where(padded >= lay.num_decode_tokens * P, out.slot_mapping, -1)
    dest = torch.cat([local_dest, gathered_dest]).to(torch.int64)
    restore = lay.restore_index
    return Wiring(
        input_ids=input_ids,
        positions=out.positions,
        request=lay.request_index,
        kv_dest=torch.where(dest < 0, trash, dest),
        kv_rows=lambda local, gathered: torch.cat([local, gathered[restore]]),
        sample_rows=lambda gathered: gathered[restore][
            out.logits_indices if logits_indices is None else logits_indices
        ],
    )


class TinyModel:
    """The tiny decoder of this module's docstring, its weights drawn from `cfg`'s random seed."""

    def __init__(self, cfg: TinyConfig, device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        D = cfg.dim

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, dtype=DTYPE) / math.sqrt(shape[0])).to(device)

        self.embed = torch.randn(cfg.vocab, D, generator=g, dtype=DTYPE).to(device)
        self.layers = [
            dict(wq=w(D, D), wk=w(D, D), wv=w(D, D), wo=w(D, D), w1=w(D, 2 * D), w2=w(2 * D, D))
            for _ in range(cfg.layers)
        ]
        self.lm_head = w(D, cfg.vocab)

    def forward(
        self,
        cache: PagedKVCache,
        wiring: Wiring,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        all_gather: AllGather,
    ) -> torch.Tensor:
        """One rank's forward; returns logits `[R_b, vocab]` at the wiring's sampling rows.

        Args:
            wiring: this step's [`Wiring`][pcp_fn.sim.tiny_model.Wiring] (the layout's index maps).
            block_tables: `[R_b, max_blocks]` cache blocks of each request (batch order).
            seq_lens: `[R_b]` tokens of each request once this step is in the cache.
            all_gather: this rank's collective (`[L, ...] -> [P * L, ...]`).
        """
        cfg = self.cfg
        L = wiring.input_ids.shape[0]
        B, H, d = cfg.block_size, cfg.heads, cfg.head_dim
        pos, req = wiring.positions, wiring.request

        # the keys a local query may see: its request's cache slots at positions < seq_len and <= its own
        t = torch.arange(cfg.max_model_len, device=pos.device)
        key_slots = block_tables[req][:, t // B] * B + t % B  # [L, T]
        visible = (t <= pos[:, None]) & (t < seq_lens[req][:, None])
        visible = visible | (t == 0)  # padding rows of an empty bucket still see one key: no NaN

        h = self.embed[wiring.input_ids]
        for i, w in enumerate(self.layers):
            x = _rms(h)
            q = _rotary((x @ w["wq"]).view(L, H, d), pos)
            k = _rotary((x @ w["wk"]).view(L, H, d), pos)
            v = (x @ w["wv"]).view(L, H, d)
            cache.k[i].index_copy_(0, wiring.kv_dest, wiring.kv_rows(k, all_gather(k)))
            cache.v[i].index_copy_(0, wiring.kv_dest, wiring.kv_rows(v, all_gather(v)))
            keys, values = cache.k[i][key_slots], cache.v[i][key_slots]  # [L, T, H, d]
            scores = torch.einsum("lhd,lthd->lht", q, keys) / math.sqrt(d)
            scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
            att = torch.softmax(scores, dim=-1)
            h = h + torch.einsum("lht,lthd->lhd", att, values).reshape(L, H * d) @ w["wo"]
            h = h + torch.relu(_rms(h) @ w["w1"]) @ w["w2"]
        return _rms(wiring.sample_rows(all_gather(h))) @ self.lm_head

    def dense_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """`[n] -> [n, vocab]`: the unsplit, unpaged forward of one sequence (causal attention
        over the tokens themselves). The reference the paged PCP forward must reproduce, and the
        drafter's forward."""
        cfg = self.cfg
        n, H, d = tokens.shape[0], cfg.heads, cfg.head_dim
        pos = torch.arange(n, device=tokens.device)
        causal = pos[None, :] <= pos[:, None]  # [query, key]
        h = self.embed[tokens]
        for w in self.layers:
            x = _rms(h)
            q = _rotary((x @ w["wq"]).view(n, H, d), pos)
            k = _rotary((x @ w["wk"]).view(n, H, d), pos)
            v = (x @ w["wv"]).view(n, H, d)
            scores = torch.einsum("qhd,khd->qhk", q, k) / math.sqrt(d)
            att = torch.softmax(scores.masked_fill(~causal[:, None, :], float("-inf")), dim=-1)
            h = h + torch.einsum("qhk,khd->qhd", att, v).reshape(n, H * d) @ w["wo"]
            h = h + torch.relu(_rms(h) @ w["w1"]) @ w["w2"]
        return _rms(h) @ self.lm_head

    def perturbed(self, scale: float, seed: int = 1) -> TinyModel:
        """A copy whose output head is nudged by noise: a drafter that agrees with this model
        often but not always (so speculative decoding both accepts and rejects)."""
        other = TinyModel.__new__(TinyModel)
        other.cfg, other.embed, other.layers = self.cfg, self.embed, self.layers
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(self.lm_head.shape, generator=g, dtype=DTYPE).to(self.lm_head.device)
        other.lm_head = self.lm_head + scale * noise * self.lm_head.std()
        return other
