"""A small serving loop around pcp_fn: requests, a chunked-prefill scheduler, paged blocks,
and one rank's runner. Used by the end-to-end tests, `pcp-fn simulate` and the examples.

The scheduler follows vLLM v1's shape: running decodes first (`1 + d` tokens
with `d <= num_spec_tokens` draft tokens), then prompts in arrival order,
chunked to fit the token budget; new requests join while there is room. A
request samples once all its known tokens are in the cache, and leaves after
`max_new_tokens`. With speculative decoding a drafter proposes the next
tokens of every decoding request; the target verifies them greedily (accepted
drafts, then one corrected or bonus token) and the KV of rejected drafts is
dropped by rolling `num_computed` back. Everything here is host code (it is
the engine, not an op).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .. import (
    PCPConfig,
    PCPState,
    SchedulerBatch,
    StepOutputs,
    init_state,
    make_batch,
    spec_decode_indices,
    step,
)
from ..distributed import AllGather, CollectiveError, batch_digest, check_same_batch
from ..protocol.batch import classify_decodes
from .mrv2_path import MRV2Path
from .tiny_model import PagedKVCache, TinyModel, Wiring, dcs_wiring


@dataclasses.dataclass
class Request:
    req_id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0
    output: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0
    drafts: list[int] = dataclasses.field(default_factory=list)  # proposed, not yet verified

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def decoding(self) -> bool:
        """Every known token but the last is in the cache (the next step is a decode)."""
        return self.num_computed >= len(self.prompt) and self.num_computed == len(self.tokens) - 1

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens


@dataclasses.dataclass(frozen=True)
class ScheduledStep:
    """One step's schedule, in batch order (decodes first)."""

    index: int
    req_ids: tuple[int, ...]
    num_scheduled: tuple[int, ...]
    num_computed: tuple[int, ...]
    num_prompt: tuple[int, ...]
    num_drafts: tuple[int, ...] = ()  # draft tokens at the end of each request's scheduled tokens

    @property
    def num_tokens(self) -> int:
        return sum(self.num_scheduled)

    @property
    def drafts(self) -> tuple[int, ...]:
        return self.num_drafts or (0,) * len(self.req_ids)


class Scheduler:
    """Chunked-prefill scheduler over a fixed list of requests (arrivals by step index)."""

    def __init__(
        self, config: PCPConfig, requests: Sequence[Request], token_budget: int | None = None
    ) -> None:
        self.config = config
        self.pending = sorted(requests, key=lambda r: (r.arrival, r.req_id))
        self.running: list[Request] = []
        self.done: list[Request] = []
        self.budget = min(token_budget or config.max_num_tokens, config.max_num_tokens)
        self.index = 0

    @property
    def idle(self) -> bool:
        return not self.pending and not self.running

    def schedule(self) -> ScheduledStep | None:
        while (
            self.pending
            and self.pending[0].arrival <= self.index
            and len(self.running) < self.config.max_num_reqs
        ):
            self.running.append(self.pending.pop(0))
        budget, picked = self.budget, []
        for req in self.running:  # decodes first: their prompt is in the cache
            if req.num_computed >= len(req.prompt) and budget > 0:
                n = min(len(req.tokens) - req.num_computed + len(req.drafts), budget)
                picked.append((req, n))
                budget -= n
        for req in self.running:
            if req.num_computed < len(req.prompt) and budget > 0:
                n = min(len(req.prompt) - req.num_computed, budget)
                picked.append((req, n))
                budget -= n
        index = self.index
        self.index += 1
        if not picked:
            return None
        sched = np.array([n for _, n in picked])
        comp = np.array([r.num_computed for r, _ in picked])
        prompt = np.array([len(r.prompt) for r, _ in picked])
        # the runner's order: requests pcp_fn classifies as decodes first (stable otherwise)
        order = np.argsort(~classify_decodes(self.config, sched, comp, prompt), kind="stable")
        picked = [picked[i] for i in order]
        return ScheduledStep(
            index,
            tuple(r.req_id for r, _ in picked),
            tuple(n for _, n in picked),
            tuple(r.num_computed for r, _ in picked),
            tuple(len(r.prompt) for r, _ in picked),
            # the budget may cut a decode's drafts short
            tuple(max(0, min(len(r.drafts), n - (len(r.tokens) - r.num_computed))) for r, n in picked),
        )

    def advance(self, sched: ScheduledStep, sampled: Sequence[Sequence[int]]) -> list[Request]:
        """Apply a step's results: `sampled[i]` is request `i`'s accepted drafts plus its new
        token (or anything, for a prompt chunk that does not finish the prompt). Returns the
        requests that finished."""
        by_id = {r.req_id: r for r in self.running}
        for req_id, n, d, tokens in zip(sched.req_ids, sched.num_scheduled, sched.drafts, sampled):
            req = by_id[req_id]
            req.num_computed += n - d
            if req.num_computed >= len(req.tokens):  # every known token is cached: the sample counts
                accepted = len(tokens) - 1  # drafts whose KV stays; the rest is rolled back
                req.num_computed += accepted
                req.output += [int(t) for t in tokens][: req.max_new_tokens - len(req.output)]
            req.drafts = []
        finished = [r for r in self.running if r.finished]
        self.running = [r for r in self.running if not r.finished]
        self.done += finished
        return finished


class BlockManager:
    """Paged KV blocks: a free list and each request's block table."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.free = collections.deque(range(num_blocks))  # popped from the left: O(1), not O(blocks)
        self.tables: dict[int, list[int]] = {}

    def ensure(self, req_id: int, num_tokens: int) -> list[int]:
        table = self.tables.setdefault(req_id, [])
        need = -(-num_tokens // self.block_size)
        if need > self.max_blocks:
            raise ValueError(f"request {req_id} needs {num_tokens} tokens; max_model_len allows fewer")
        while len(table) < need:
            if not self.free:
                raise RuntimeError("out of KV cache blocks")
            table.append(self.free.popleft())
        return table

    def release(self, req_id: int) -> None:
        self.free.extend(self.tables.pop(req_id, []))

    def slot(self, req_id: int, position: int) -> int:
        table = self.tables[req_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size


@dataclasses.dataclass
class StepRecord:
    """What one rank saw in one step (logits and samples in batch order, real rows only)."""

    sched: ScheduledStep
    out: object  # StepOutputs (dcs) or mrv2.LocalBatch
    logits: torch.Tensor | None
    sampled: list[list[int]]  # per request: accepted drafts, then the new token
    slot_mapping: list[int]  # KV slot of every scheduled token, scheduler order


def _identity(local: torch.Tensor) -> torch.Tensor:
    return local


StepFn = Callable[[PCPState, SchedulerBatch], tuple[PCPState, StepOutputs]]


class Runner:
    """One rank of a PCP engine: scheduler, blocks, and (optionally) the tiny model.

    `layout="dcs"` runs [`pcp_fn.step`][pcp_fn.step.step] (DualChunkSwap) on a batch that
    carries the step's slot mapping (`make_batch(..., slot_mapping=...)`
    pads it to the bucket, so a compiled `step_fn` meets one shape per
    bucket); `layout="mrv2"` runs [`pcp_fn.mrv2.partition_batch`][]
    ([`pcp_fn.sim.mrv2_path.MRV2Path`][]). `step_fn` replaces either: a
    compiled one ([`pcp_fn.graph.compile_per_bucket`][]) or a captured one
    ([`pcp_fn.graph.capture`][pcp_fn.graph.capture.capture]). `wiring` maps the step's outputs to the tiny
    model's K/V writes and samples (default [`pcp_fn.sim.tiny_model.dcs_wiring`][];
    [`pcp_fn.sim.tiny_model.restored_wiring`][] for a layout restoring to scheduler
    order, e.g. any [`pcp_fn.PartitionLayout`][] chosen by `config.layout`).

    With `model=None` it runs the bookkeeping only and samples tokens (and
    drafts) from a numpy generator. With `config.num_spec_tokens > 0` the
    `drafter` (a [`pcp_fn.sim.tiny_model.TinyModel`][], unsplit and
    unpaged) proposes drafts, verified through
    [`pcp_fn.spec.spec_decode_indices`][pcp_fn.spec_decode_indices]. Every rank of a group runs its
    own `Runner` on the same requests; they make the same decisions because everything is
    deterministic.

    `verify_batches` (default on, when there is an `all_gather`): once per
    step, before any other collective, every rank all-gathers a digest of its
    batch (schedule, KV slots, token ids) and
    [`pcp_fn.distributed.check_same_batch`][] raises on every rank, naming
    the step and the ranks that differ, when they disagree. Any
    [`pcp_fn.distributed.CollectiveError`][] of a step (a mismatch, a peer
    that stalled past the timeout or died) is raised with this rank and the
    step in its message.
    """

    def __init__(
        self,
        config: PCPConfig,
        requests: Sequence[Request],
        *,
        token_budget: int | None = None,
        model: TinyModel | None = None,
        drafter: TinyModel | None = None,
        all_gather: AllGather | None = None,
        layout: str = "dcs",
        step_fn: Callable[..., object] | None = None,
        device: torch.device | str = "cpu",
        block_size: int = 4,
        num_blocks: int = 1024,
        max_model_len: int = 512,
        seed: int = 0,
        verify_batches: bool = True,
        wiring: Callable[..., Wiring] = dcs_wiring,
    ) -> None:
        self.config = config
        self.wiring = wiring
        self.device = torch.device(device)
        self.scheduler = Scheduler(
            config, [dataclasses.replace(r, output=list(r.output)) for r in requests], token_budget
        )
        self.model = model
        self.drafter = drafter
        if model is not None:
            block_size, num_blocks, max_model_len = (
                model.cfg.block_size,
                model.cfg.num_blocks,
                model.cfg.max_model_len,
            )
            self.cache = PagedKVCache(model.cfg, self.device)
        self.blocks = BlockManager(num_blocks, block_size, max_model_len)
        self.max_model_len = max_model_len
        if model is not None and all_gather is None:
            if config.pcp_size > 1:
                raise ValueError(f"a model at pcp_size={config.pcp_size} needs all_gather (one per rank)")
            all_gather = _identity  # P = 1: the rank's buffer is the whole gather
        self.all_gather = all_gather
        self.verify_batches = verify_batches
        if layout not in ("dcs", "mrv2"):
            raise ValueError(f"layout must be 'dcs' or 'mrv2', got {layout!r}")
        self.layout = layout
        self.mrv2: MRV2Path | None = None
        if layout == "dcs":
            self.step_fn = step if step_fn is None else step_fn  # a Captured with no graph yet is falsy
            self.state = init_state(config, self.device)
        else:
            self.mrv2 = MRV2Path(config, self.device, step_fn)
        self.rng = np.random.default_rng(seed)

    def _model_inputs(
        self, sched: ScheduledStep, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token table `[rows, max_model_len]`, block tables and sequence lengths, in one copy."""
        reqs = {r.req_id: r for r in self.scheduler.running}
        T = self.max_model_len
        tokens = np.zeros((rows, T), dtype=np.int64)
        tables = np.zeros((rows, self.blocks.max_blocks), dtype=np.int64)
        for i, req_id in enumerate(sched.req_ids):
            toks = (reqs[req_id].tokens + reqs[req_id].drafts)[:T]
            tokens[i, : len(toks)] = toks
            table = self.blocks.tables[req_id]
            tables[i, : len(table)] = table
        seq_lens = np.zeros(rows, dtype=np.int64)
        seq_lens[: len(sched.req_ids)] = np.add(sched.num_computed, sched.num_scheduled)
        host = torch.from_numpy(np.concatenate([tokens.ravel(), tables.ravel(), seq_lens])).to(self.device)
        return (
            host[: rows * T].view(rows, T),
            host[rows * T : rows * T + tables.size].view(tables.shape),
            host[rows * T + tables.size :],
        )

    def _input_ids(self, sched: ScheduledStep) -> list[int]:
        """The scheduled tokens' ids in scheduler order (known tokens, then drafts)."""
        reqs = {r.req_id: r for r in self.scheduler.running}
        return [
            t
            for rid, n, c in zip(sched.req_ids, sched.num_scheduled, sched.num_computed)
            for t in (reqs[rid].tokens + reqs[rid].drafts)[c : c + n]
        ]

    def _dcs(self, sched: ScheduledStep, slots: list[int]):
        batch = make_batch(
            self.config,
            sched.num_scheduled,
            sched.num_computed,
            sched.num_prompt,
            self.device,
            slot_mapping=slots,
        )
        self.state, out = self.step_fn(self.state, batch)
        if self.model is None:
            return out, None
        tokens, tables, seq_lens = self._model_inputs(sched, batch.bucket.num_reqs)
        input_ids = tokens[out.layout.request_index, out.positions.clamp(max=self.max_model_len - 1)]
        rows = self._spec_rows(sched, batch, input_ids) if self.config.num_spec_tokens else None
        wiring = self.wiring(out, input_ids, self.cache.trash, rows)
        return out, (wiring, tables, seq_lens)

    def _spec_rows(self, sched: ScheduledStep, batch: SchedulerBatch, input_ids: torch.Tensor):
        """The rows to verify drafts on:
        [`pcp_fn.spec.spec_decode_indices`][pcp_fn.spec_decode_indices] (the runner's
        `_calc_spec_decode_metadata`), from the state `step` just returned."""
        drafts = np.zeros(batch.bucket.num_reqs, dtype=np.int32)
        drafts[: len(sched.req_ids)] = sched.drafts
        num_drafts = torch.from_numpy(drafts).to(self.device)
        _, idx = spec_decode_indices(self.state, num_drafts, input_ids)
        return idx.logits_indices

    def _mrv2(self, sched: ScheduledStep, slots: list[int]):
        assert self.mrv2 is not None
        state, local = self.mrv2.partition(
            sched.num_scheduled, sched.num_computed, sched.num_prompt, self._input_ids(sched)
        )
        if self.model is None:
            return local, None
        _, tables, seq_lens = self._model_inputs(sched, len(sched.req_ids))
        wiring = self.mrv2.wiring(state, local, sched.num_scheduled, sched.drafts, slots, self.cache.trash)
        return local, (wiring, tables, seq_lens)

    def _verify(self, sched: ScheduledStep, slots: list[int]) -> None:
        digest = batch_digest(
            [sched.index],
            sched.req_ids,
            sched.num_scheduled,
            sched.num_computed,
            sched.num_prompt,
            sched.drafts,
            slots,
            self._input_ids(sched),
        )
        check_same_batch(self.all_gather, digest.to(self.device))

    def step(self) -> StepRecord | None:
        sched = self.scheduler.schedule()
        if sched is None:
            return None
        slots = []
        for req_id, n, c in zip(sched.req_ids, sched.num_scheduled, sched.num_computed):
            self.blocks.ensure(req_id, c + n)
            slots += [self.blocks.slot(req_id, p) for p in range(c, c + n)]
        num_sampled = sum(d + 1 for d in sched.drafts)
        logits = None
        try:
            if self.verify_batches and self.all_gather is not None:
                self._verify(sched, slots)
            out, model_inputs = (self._dcs if self.layout == "dcs" else self._mrv2)(sched, slots)
            if model_inputs is not None:
                wiring, tables, seq_lens = model_inputs
                logits = self.model.forward(self.cache, wiring, tables, seq_lens, self.all_gather)
                logits = logits[:num_sampled]
        except CollectiveError as e:
            raise type(e)(f"rank {self.config.pcp_rank}, step {sched.index}: {e}") from e
        reqs = {r.req_id: r for r in self.scheduler.running}
        if logits is not None:
            target = logits.argmax(-1).tolist()
        else:
            target = self.rng.integers(0, 1000, num_sampled).tolist()
        sampled, start = [], 0
        for req_id, d in zip(sched.req_ids, sched.drafts):
            drafts = reqs[req_id].drafts[:d]
            accepted = 0  # greedy verification: keep drafts while the target agrees
            while accepted < d and target[start + accepted] == drafts[accepted]:
                accepted += 1
            sampled.append(drafts[:accepted] + [target[start + accepted]])
            start += d + 1
        for req in self.scheduler.advance(sched, sampled):
            self.blocks.release(req.req_id)
        self._propose_drafts()
        return StepRecord(sched, out, logits, sampled, slots)

    def _propose_drafts(self) -> None:
        """The drafter's greedy continuation (`num_spec_tokens` tokens) of every decoding request."""
        k = self.config.num_spec_tokens
        if not k:
            return
        for req in self.scheduler.running:
            if not req.decoding:
                continue
            room = self.max_model_len - len(req.tokens)
            tokens = list(req.tokens)
            for _ in range(max(0, min(k, room))):
                if self.drafter is None:
                    tokens.append(int(self.rng.integers(0, 1000)))
                else:
                    seq = torch.tensor(tokens, dtype=torch.int64, device=self.device)
                    tokens.append(int(self.drafter.dense_logits(seq)[-1].argmax()))
            req.drafts = tokens[len(req.tokens) :]

    def run(self, max_steps: int = 10_000) -> list[StepRecord]:
        records = []
        for _ in range(max_steps):
            if self.scheduler.idle:
                break
            rec = self.step()
            if rec is not None:
                records.append(rec)
        return records


def synthetic_requests(
    num_requests: int,
    *,
    min_prompt: int = 1,
    max_prompt: int = 300,
    max_new_tokens: tuple[int, int] = (1, 12),
    arrival_every: int = 2,
    vocab: int = 101,
    seed: int = 0,
) -> list[Request]:
    """Requests with random prompts (token ids in `[1, vocab)`), output lengths and staggered arrivals."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num_requests):
        n = int(rng.integers(min_prompt, max_prompt + 1))
        out.append(
            Request(
                req_id=i,
                prompt=rng.integers(1, vocab, n).tolist(),
                max_new_tokens=int(rng.integers(max_new_tokens[0], max_new_tokens[1] + 1)),
                arrival=i * arrival_every // 2 + int(rng.integers(0, arrival_every + 1)),
            )
        )
    return out
