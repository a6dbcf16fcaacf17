"""A tiny decoder wired the way a PCP model runner wires it: the example of composing pcp_fn.

Two layers, a few heads, float64, random weights from a fixed seed, rotary
positions and a real paged KV cache. One rank's forward (``TinyModel.forward``):

1. embed this rank's local tokens (``StepOutputs.positions`` are absolute);
2. per layer: compute q, k, v of the local rows; all-gather k and v, restore
   the padded request order; write K/V into the paged cache through the padded
   slot mapping (decode rows come from the *local* buffer, compacted with the
   slot mapping's stride ``P``: decode token ``t``'s slot is row ``t * P``;
   prefill rows come from the restored buffer); attend the local queries
   causally against the cache;
3. all-gather the final hidden states, restore, take the rows at
   ``logits_indices`` and project to the vocabulary.

Every rank keeps the whole KV cache (each writes every token's K/V), which
keeps the model small; the attention over the cache is what PCP splits.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .distributed import AllGather
from .step import StepOutputs

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
    """Rotate-half rotary embedding of ``x [L, H, d]`` at absolute positions ``pos [L]``."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=DTYPE, device=x.device) / half)
    angle = pos.to(DTYPE)[:, None, None] * freq
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class PagedKVCache:
    """``k``, ``v``: ``[layers, num_slots + 1, heads, head_dim]``; the last slot is the trash
    slot where writes with ``pad_slot_id`` land."""

    def __init__(self, cfg: TinyConfig, device: torch.device | str = "cpu") -> None:
        shape = (cfg.layers, cfg.num_slots + 1, cfg.heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=DTYPE, device=device)
        self.v = torch.zeros(shape, dtype=DTYPE, device=device)
        self.trash = cfg.num_slots


class TinyModel:
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
        out: StepOutputs,
        input_ids: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        pcp_size: int,
        all_gather: AllGather,
    ) -> torch.Tensor:
        """One rank's forward; returns logits ``[R_b, vocab]`` at ``out.logits_indices``.

        Args:
            out: this rank's :func:`pcp_fn.step` outputs.
            input_ids: ``[L_b]`` token of each local row (any value on padding rows).
            block_tables: ``[R_b, max_blocks]`` cache blocks of each request (batch order).
            seq_lens: ``[R_b]`` tokens of each request once this step is in the cache.
            all_gather: this rank's collective (``[L_b, ...] -> [P * L_b, ...]``).
        """
        cfg, P = self.cfg, pcp_size
        lay = out.layout
        L = input_ids.shape[0]
        B, H, d = cfg.block_size, cfg.heads, cfg.head_dim
        pos, req = out.positions, lay.request_index
        restore = lay.restore_index

        # cache destinations: decode K/V from the local rows (slot of decode token t at padded row t*P),
        # prefill K/V from the restored rows; anything else goes to the trash slot
        rows = torch.arange(L, device=pos.device)
        decode_slot = out.slot_mapping[rows * P]
        local_dest = torch.where(rows < lay.num_decode_tokens, decode_slot, -1)
        padded = torch.arange(P * L, device=pos.device)
        gathered_dest = torch.where(padded >= lay.num_decode_tokens * P, out.slot_mapping, -1)
        dest = torch.cat([local_dest, gathered_dest]).to(torch.int64)
        dest = torch.where(dest < 0, cache.trash, dest)

        # the keys a local query may see: its request's cache slots at positions < seq_len and <= its own
        t = torch.arange(cfg.max_model_len, device=pos.device)
        key_slots = block_tables[req][:, t // B] * B + t % B  # [L, T]
        visible = (t <= pos[:, None]) & (t < seq_lens[req][:, None])
        visible = visible | (t == 0)  # padding rows of an empty bucket still see one key: no NaN

        h = self.embed[input_ids]
        for i, w in enumerate(self.layers):
            x = _rms(h)
            q = _rotary((x @ w["wq"]).view(L, H, d), pos)
            k = _rotary((x @ w["wk"]).view(L, H, d), pos)
            v = (x @ w["wv"]).view(L, H, d)
            k_all = torch.cat([k, all_gather(k)[restore]])
            v_all = torch.cat([v, all_gather(v)[restore]])
            cache.k[i].index_copy_(0, dest, k_all)
            cache.v[i].index_copy_(0, dest, v_all)
            keys, values = cache.k[i][key_slots], cache.v[i][key_slots]  # [L, T, H, d]
            scores = torch.einsum("lhd,lthd->lht", q, keys) / math.sqrt(d)
            scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
            att = torch.softmax(scores, dim=-1)
            h = h + torch.einsum("lht,lthd->lhd", att, values).reshape(L, H * d) @ w["wo"]
            h = h + torch.relu(_rms(h) @ w["w1"]) @ w["w2"]
        restored = all_gather(h)[restore]
        return _rms(restored[out.logits_indices]) @ self.lm_head
