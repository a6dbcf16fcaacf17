"""One lockstep driver for PCP managers: the same global ``InputBatch``es through a reference and the adapter.

A backend (:class:`Backend`) says where vLLM's names come from (vLLM 0.32.0
itself, or ``vllm_standin``) and which manager is the reference (vLLM's
``PCPManager``, or ``oracle_vllm.OracleManager``). The workload is the
simulator's chunked-prefill scheduler (``pcp_fn.sim.engine.Scheduler``): mixed
steps, decode-only steps, speculative drafts, arrivals and departures; each
step is run with a CUDA-graph mode (``NONE``, ``PIECEWISE`` padded to a capture
size above the batch, ``FULL`` with the descriptor the runner's dispatcher
picks: vLLM's own ``CudaGraphManager`` when the backend brings it, which checks
the global request count only), sometimes with its rows shuffled, sometimes
with a draft prefill (some left unrestored across the next ``partition_batch``,
as the drafter's FULL prefill-graph path leaves them) or a dummy/capture run.

Per step and rank, :func:`run_lockstep` compares every field of the returned
local batch, the block tables and gathered slot mappings, the restored hidden
(and auxiliary) states, the draft prefill ids and restore, and the dummy-run
buffers; it also checks that the restored rows equal the global batch's
(semantics, not just agreement) and that the adapter's persistent buffers
keep their ``data_ptr()``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from pcp_fn import PCPConfig
from pcp_fn.adapters.vllm.against import global_batch
from pcp_fn.adapters.vllm.contract import VLLM_0_32
from pcp_fn.sim.engine import Scheduler, synthetic_requests
from pcp_fn.sim.trace import BatchDesc, TraceStep

BLOCK_SIZE = 4
MAX_BLOCKS = 64


@dataclasses.dataclass
class Backend:
    """Where the vLLM names come from, and how to build the two managers of one rank.

    ``api`` has ``InputBatch``, ``InputBuffers``, ``CUDAGraphMode``,
    ``BatchExecutionDescriptor``, ``PAD_SLOT_ID``, ``get_pcp_group``;
    ``make_reference`` / ``make_adapter`` / ``make_oracle`` take the manager
    constructor's keyword arguments. ``reference_takes_full_mixed``: the
    reference serves FULL steps with a prefill (vLLM's does not; the oracle is
    then the reference of those steps). ``make_dispatcher(max_num_seqs,
    capture_sizes)`` returns the ``cudagraph_mode=FULL`` dispatch
    ``(num_reqs, num_tokens) -> BatchExecutionDescriptor`` of the runner (vLLM's
    own ``CudaGraphManager`` with vLLM; :func:`full_dispatcher` without).
    """

    name: str
    api: Any
    block_tables_cls: type
    make_reference: Callable[..., Any]
    make_adapter: Callable[..., Any]
    make_oracle: Callable[..., Any]
    reference_takes_full_mixed: bool
    group: Any  # vllm_standin.FakePCPGroup, the PCP group both managers see
    make_dispatcher: Callable[[int, list[int]], Callable[[int, int], Any]] | None = None
    # the separate decode routine's dispatch (Case.decode_graphs): ``make_decode_dispatcher(
    # max_num_seqs, capture_sizes, decode_query_len)`` returns ``(num_reqs, num_tokens,
    # max_query_len) -> BatchExecutionDescriptor`` (vLLM's own CudaGraphManager with vLLM;
    # :func:`decode_dispatcher` without)
    make_decode_dispatcher: Callable[[int, list[int], int], Callable[[int, int, Any], Any]] | None = None
    # the vLLM contract both managers follow (pcp_fn.adapters.vllm.contract): 0.33+ builds them
    # without block tables, then set_block_tables, and may gather the MoE's padding mask
    contract: Any = VLLM_0_32


@dataclasses.dataclass(frozen=True)
class Case:
    P: int
    shard: bool = True
    dcp: int = 1
    interleave: int = 1
    spec: int = 0  # draft tokens per decode
    R: int = 8
    T: int = 48
    requests: int = 10
    seed: int = 0
    max_steps: int = 40
    moe: bool = False  # moe_gathers_tokens (vLLM 0.33+; ignored by a 0.32 contract)
    # cudagraph_mode FULL_AND_PIECEWISE with varlen decode graphs (vLLM's adaptive verification):
    # FULL steps are decode-only batches on decode graphs (their descriptor bounds the queries),
    # mixed steps PIECEWISE; the managers know the mode. False: FULL's mixed graphs.
    decode_graphs: bool = False
    # the drop-in's layout option (pcp_fn.adapters.vllm.served): another prefill split, which only
    # the oracle serves as reference (vLLM's own manager cuts head and tail chunks)
    layout: str = "mrv2"


@dataclasses.dataclass
class Summary:
    steps: int = 0
    rank_steps: int = 0
    mixed: int = 0
    decode_only: int = 0
    modes: dict[str, int] = dataclasses.field(default_factory=dict)
    full_mixed_vs_oracle: int = 0
    drafts: int = 0
    dummies: int = 0
    shuffled: int = 0
    tail: int = 0
    full_split_rows: int = 0  # FULL steps where a rank has more rows than the descriptor's requests
    unrestored_drafts: int = 0  # draft prefills prepared and never restored before the next step
    # FULL decode-graph steps whose graph vLLM caps at max_num_seqs requests below its tokens, its
    # query bound the graph's tokens (3 requests of 1 + 3 speculative tokens in a 4-token graph)
    decode_graphs_at_cap: int = 0
    fields: set[str] = dataclasses.field(default_factory=set)


# --------------------------------------------------------------------------- workload


@dataclasses.dataclass
class GlobalStep:
    req_ids: list[int]
    states: list[int]
    sched: list[int]
    computed: list[int]
    prompt: list[int]
    drafts: list[int]
    tokens: list[list[int]]  # each request's scheduled token ids


def scheduler_steps(case: Case) -> Iterator[GlobalStep]:
    """The simulator's schedule (decodes first, then chunked prompts), with drafts and departures."""
    rng = np.random.default_rng(case.seed)
    cfg = PCPConfig(case.P, 0, case.R, case.T, num_spec_tokens=case.spec)
    requests = synthetic_requests(case.requests, max_prompt=90, max_new_tokens=(2, 16), seed=case.seed)
    sched = Scheduler(cfg, requests, token_budget=case.T)
    free = list(range(case.R))
    state_of: dict[int, int] = {}
    for _ in range(case.max_steps * 3):
        if sched.idle:
            return
        step = sched.schedule()
        if step is None:
            continue
        reqs = {r.req_id: r for r in sched.running}
        for rid in step.req_ids:
            if rid not in state_of:
                state_of[rid] = free.pop(0)
        yield GlobalStep(
            list(step.req_ids),
            [state_of[r] for r in step.req_ids],
            list(step.num_scheduled),
            list(step.num_computed),
            list(step.num_prompt),
            list(step.drafts),
            [
                (reqs[r].tokens + reqs[r].drafts)[c : c + n]
                for r, c, n in zip(step.req_ids, step.num_computed, step.num_scheduled)
            ],
        )
        sampled = []
        for rid, d in zip(step.req_ids, step.drafts):
            accepted = int(rng.integers(0, d + 1))
            sampled.append(reqs[rid].drafts[:accepted] + [int(rng.integers(1, 100))])
        for done in sched.advance(step, sampled):
            free.append(state_of.pop(done.req_id))
        for req in sched.running:
            if case.spec and req.decoding:
                req.drafts = rng.integers(1, 100, case.spec).tolist()


@dataclasses.dataclass
class RunnerStep:
    """One scheduler step as the runner hands it to every rank's manager."""

    index: int
    step: GlobalStep
    order: list[int]  # the rows of ``step`` in the runner's order (every 4th step shuffled)
    sched: np.ndarray  # [n] int32 scheduled tokens, in ``order``
    prefilling: np.ndarray  # [n] bool, in ``order``: the request is still in its prompt


def runner_steps(case: Case, tables: list[Any], rng: Any, summary: Any) -> Iterator[RunnerStep]:
    """:func:`scheduler_steps` (at most ``case.max_steps``) as a runner walks them: a request new to
    its state row gets its blocks in every block table of ``tables``, and every 4th step's rows
    are shuffled (``summary.shuffled`` counts them)."""
    seen_states: dict[int, int] = {}
    for i, step in enumerate(scheduler_steps(case)):
        if i >= case.max_steps:
            return
        for rid, s in zip(step.req_ids, step.states):
            if seen_states.get(s) != rid:  # a new request in this state row: its blocks
                seen_states[s] = rid
                for bt in tables:
                    bt.set_row(s, block_ids(rid))
        order = list(range(len(step.req_ids)))
        if i % 4 == 3:
            rng.shuffle(order)
            summary.shuffled += 1
        sched = np.array([step.sched[k] for k in order], np.int32)
        prefilling = (np.minimum(step.computed, step.prompt) < np.array(step.prompt))[order]
        yield RunnerStep(i, step, order, sched, prefilling)


def block_ids(req_id: int) -> list[list[int]]:
    return [[1 + req_id * MAX_BLOCKS + j for j in range(MAX_BLOCKS)]]


def make_global_batch(api: Any, step: GlobalStep, desc: Any, order: list[int], device: torch.device) -> Any:
    """vLLM's global ``InputBatch`` of ``step`` (rows in ``order``) for ``desc``, as the runner's
    ``prepare_inputs`` makes it (``pcp_fn.adapters.vllm.against.global_batch``, with the step's
    token ids, drafts and request ids)."""
    pick = lambda xs: [xs[i] for i in order]  # noqa: E731
    rows = TraceStep(
        tuple(pick(step.sched)),
        tuple(pick(step.computed)),
        tuple(pick(step.prompt)),
        idx_mapping=tuple(pick(step.states)),
        # the padding is what the batch reads of the descriptor (vllm-ascend's has no mode)
        batch_desc=BatchDesc("NONE", desc.num_tokens, desc.num_reqs),
    )
    return global_batch(
        api.InputBatch,
        rows,
        device,
        req_ids=pick(step.req_ids),
        input_ids=pick(step.tokens),
        num_drafts=pick(step.drafts),
    )


# --------------------------------------------------------------------------- comparison


def assert_same(name: str, a: Any, b: Any) -> None:
    """Equal values and types: tensors (dtype, shape, values), numpy arrays (dtype, values),
    the rest ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), f"{name}: {type(a)} vs {type(b)}"
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
        assert torch.equal(a.cpu(), b.cpu()), f"{name}:\n{a}\nvs\n{b}"
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), f"{name}: {type(a)} vs {type(b)}"
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} vs {b.dtype}"
        assert np.array_equal(a, b), f"{name}:\n{a}\nvs\n{b}"
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):  # vLLM 0.33+'s PCPBatchMetadata
        assert type(a) is type(b), f"{name}: {type(a)} vs {type(b)}"
        for f in dataclasses.fields(a):
            assert_same(f"{name}.{f.name}", getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
        assert len(a) == len(b), f"{name}: {len(a)} vs {len(b)} tensors"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(f"{name}[{i}]", x, y)
    else:
        assert type(a) is type(b) and a == b, f"{name}: {a!r} vs {b!r}"


def assert_same_batch(what: str, a: Any, b: Any, summary: Summary) -> None:
    for f in dataclasses.fields(a):
        assert_same(f"{what}.{f.name}", getattr(a, f.name), getattr(b, f.name))
        summary.fields.add(f.name)


def _encode(batch: Any) -> torch.Tensor:
    """``[L, 2]`` float hidden states that name their token: (input id, position); zeros on padding."""
    return torch.stack([batch.input_ids.to(torch.float64), batch.positions.to(torch.float64)], dim=1)


def assert_views(manager: Any, local: Any, ptrs: dict[str, int]) -> None:
    """The adapter's buffers never move, and the local batch is made of views of them."""
    bufs = manager.persistent_buffers()
    assert {k: v.data_ptr() for k, v in bufs.items()} == ptrs, "a persistent buffer moved"
    for field in ("input_ids", "positions", "is_padding", "query_start_loc", "seq_lens"):
        buffer = "moe_is_padding" if field == "is_padding" and manager.bookkeeper.moe is not None else field
        assert getattr(local, field).data_ptr() == bufs[buffer].data_ptr(), field
    for field in ("idx_mapping", "expanded_local_pos", "logits_indices", "cu_num_logits"):
        assert getattr(local, field).data_ptr() == bufs[field].data_ptr(), field
    assert local.expanded_idx_mapping is local.idx_mapping


# --------------------------------------------------------------------------- the driver


def full_dispatcher(api: Any, max_num_seqs: int, capture_sizes: list[int]) -> Callable[[int, int], Any]:
    """The runner's dispatch under ``cudagraph_mode=FULL`` without vLLM: vLLM's mixed FULL
    descriptors ``(size, min(size, max_num_seqs))`` (``CudaGraphManager._init_candidates``), the
    smallest that holds the *global* request count and the largest rank's tokens
    (``_is_compatible``), else ``NONE``."""
    Mode, Desc = api.CUDAGraphMode, api.BatchExecutionDescriptor

    def dispatch(num_reqs: int, num_tokens: int) -> Any:
        for size in sorted(capture_sizes):
            if size >= num_tokens and min(size, max_num_seqs) >= num_reqs:
                return Desc(cg_mode=Mode.FULL, num_tokens=size, num_reqs=min(size, max_num_seqs))
        return Desc(cg_mode=Mode.NONE, num_tokens=num_tokens, num_reqs=num_reqs)

    return dispatch


def full_graph_rows(desc: Any, max_num_reqs: int, mixed_graphs: bool = True) -> int:
    """The local request rows a FULL graph holds. A mixed graph (no query bound on its descriptor;
    vLLM's capture promises it queries as long as the graph): a rank gets a head and a tail row of
    each split prefill and each row has a token, so ``min(num_tokens, 2 * max_num_reqs)`` when
    vLLM caps the graph at ``max_num_reqs`` requests. A decode graph (its bound below its tokens,
    or any FULL graph when the engine has a separate decode routine: ``mixed_graphs=False``) and
    a graph below the cap: the descriptor's, vLLM's."""
    bound = getattr(desc, "max_query_len", None) or getattr(desc, "uniform_token_count", None)
    mixed = (bound or desc.num_tokens) == desc.num_tokens and mixed_graphs
    if mixed and desc.num_reqs == max_num_reqs < desc.num_tokens:
        return min(desc.num_tokens, 2 * max_num_reqs)
    return desc.num_reqs


def decode_dispatcher(api: Any, max_num_seqs: int, capture_sizes: list[int], decode_query_len: int) -> Any:
    """The runner's dispatch under ``FULL_AND_PIECEWISE`` with varlen decode graphs, without vLLM:
    vLLM's varlen decode descriptors ``(size, min(size, max_num_seqs), max_query_len=decode_query_len)``
    up to ``max_num_seqs * decode_query_len`` tokens (``CudaGraphManager._init_candidates``), the
    smallest holding the global request count, the largest rank's tokens and the batch's longest
    query (``None`` for a batch with a prefill: never a decode graph), else ``PIECEWISE``."""
    Mode, Desc = api.CUDAGraphMode, api.BatchExecutionDescriptor
    sizes = sorted(s for s in capture_sizes if s <= max_num_seqs * decode_query_len)

    def dispatch(num_reqs: int, num_tokens: int, max_query_len: int | None) -> Any:
        fits = max_query_len is not None and max_query_len <= decode_query_len
        for size in sizes:
            if fits and size >= num_tokens and min(size, max_num_seqs) >= num_reqs:
                return Desc(
                    cg_mode=Mode.FULL,
                    num_tokens=size,
                    num_reqs=min(size, max_num_seqs),
                    max_query_len=decode_query_len,
                )
        return Desc(cg_mode=Mode.PIECEWISE, num_tokens=num_tokens, num_reqs=None)

    return dispatch


def _capture_sizes(T: int) -> list[int]:
    sizes, s = [], 1
    while s < T:
        sizes.append(s)
        s *= 2
    return [*sizes, T]


def run_lockstep(backend: Backend, case: Case, device: torch.device | None = None) -> Summary:
    """Run ``case``'s workload through the reference and the adapter on every rank; return what
    was checked."""
    api = backend.api
    Mode, Desc = api.CUDAGraphMode, api.BatchExecutionDescriptor
    device = device or torch.device("cpu")
    rng = np.random.default_rng(case.seed + 1)
    P = case.P
    tables = []
    refs, ads, oracles, ptrs = [], [], [], []
    for q in range(P):
        bt = backend.block_tables_cls(
            [BLOCK_SIZE],
            case.R,
            case.T,
            [MAX_BLOCKS],
            device,
            cp_size=case.dcp,
            cp_rank=q % case.dcp,
            cp_interleave=case.interleave,
        )
        tables.append(bt)
        kw = dict(
            pcp_world_size=P,
            pcp_rank=q,
            device=device,
            shard_decode_requests=case.shard,
            max_num_reqs=case.R,
            max_num_tokens=case.T,
            block_tables=bt,
            dcp_world_size=case.dcp,
            dcp_rank=q % case.dcp,
            cp_interleave=case.interleave,
        )
        if case.layout != "mrv2":
            kw["layout"] = case.layout
        late = backend.contract.moe_mask  # vLLM 0.33+: the runner's order
        if late:
            kw.update(block_tables=None, moe_gathers_tokens=case.moe)
        made = dict(kw)
        if not backend.contract.shards_decodes:  # vLLM 0.30: every decode replicated, no such argument
            assert not case.shard, "vLLM 0.30 replicates every decode"
            del made["shard_decode_requests"]
        refs.append(backend.make_reference(**made))
        ads.append(backend.make_adapter(**made))
        if late:
            refs[-1].set_block_tables(bt)
            ads[-1].set_block_tables(bt)
            kw["block_tables"] = bt
        oracles.append(refs[-1] if backend.reference_takes_full_mixed else backend.make_oracle(**kw))
        # the engine's cudagraph mode (vLLM: its compilation config), which sizes the FULL graphs
        graphs_mode = Mode.FULL_AND_PIECEWISE if case.decode_graphs else Mode.FULL
        ads[-1].bookkeeper.compilation_config = SimpleNamespace(cudagraph_mode=graphs_mode)
        ptrs.append({k: v.data_ptr() for k, v in ads[-1].persistent_buffers().items()})
    caps = _capture_sizes(case.T)
    dispatch_full = _dispatcher(backend, case, caps)
    summary = Summary()
    unrestored: list[Any] = []  # the adapters' local batches of a draft prefill left unrestored
    prev_reference: Any = None
    for rs in runner_steps(case, tables, rng, summary):
        i, step, order, sched, prefilling = rs.index, rs.step, rs.order, rs.sched, rs.prefilling
        widest = refs[0].get_num_tokens_for_dispatch(sched, prefilling)
        for q in range(P):
            assert ads[q].get_num_tokens_for_dispatch(sched, prefilling) == widest
        mode = (Mode.NONE, Mode.PIECEWISE, Mode.FULL)[i % 3]
        low = min(widest + (i % 2), case.T)  # sometimes a graph size above the batch
        if mode == Mode.FULL:
            # what the runner's dispatcher hands partition_batch: it checks the *global* request
            # count only, so a rank's rows (two per split prefill) may exceed desc.num_reqs
            desc = dispatch_full(len(order), widest, None if prefilling.any() else int(sched.max()))
            if desc.cg_mode != Mode.FULL:
                mode = Mode.PIECEWISE
        if mode == Mode.NONE:
            desc = Desc(cg_mode=mode, num_tokens=widest, num_reqs=None)
        elif mode == Mode.PIECEWISE:
            desc = Desc(cg_mode=mode, num_tokens=next(c for c in caps if c >= low), num_reqs=None)
        summary.tail += desc.num_tokens > widest
        # the reference pads FULL steps to the rows the adapter's graph holds (vLLM's own would
        # refuse the split prefills; the oracle serves those)
        ref_desc = desc
        if mode == Mode.FULL:
            ref_desc = dataclasses.replace(
                desc, num_reqs=full_graph_rows(desc, case.R, not case.decode_graphs)
            )
            rows = max(_local_rows(o, sched, prefilling) for o in oracles)
            summary.full_split_rows += rows > desc.num_reqs
            bound = getattr(desc, "max_query_len", None)
            summary.decode_graphs_at_cap += bound == desc.num_tokens and desc.num_reqs == case.R < bound
        global_batch = make_global_batch(api, step, desc, order, device)
        has_prefill = global_batch.has_prefill
        use_oracle = mode == Mode.FULL and has_prefill and not backend.reference_takes_full_mixed
        reference = oracles if use_oracle else refs
        summary.full_mixed_vs_oracle += use_oracle
        summary.modes[mode.name] = summary.modes.get(mode.name, 0) + 1
        summary.steps += 1
        summary.mixed += has_prefill
        summary.decode_only += not has_prefill

        ref_local = [partition(reference[q], global_batch, ref_desc) for q in range(P)]
        ad_local = [partition(ads[q], global_batch, desc) for q in range(P)]
        if unrestored:  # partition_batch leaves an unrestored draft prefill prepared, like vLLM's
            for q in range(P):
                assert ads[q].draft_prefill_batch is unrestored[q], f"step {i} rank {q}: draft prefill reset"
                assert draft_inputs(ads[q], object(), 4) is unrestored[q]
                if reference is prev_reference:
                    assert reference[q].draft_prefill_batch is not None, f"step {i}: reference reset it"
            unrestored = []
        prev_reference = reference
        for q in range(P):
            assert_same_batch(f"step {i} rank {q} local", ref_local[q], ad_local[q], summary)
            assert_views(ads[q], ad_local[q], ptrs[q])
            summary.rank_steps += 1
        for q in range(P):
            ref_attn = reference[q].prepare_attn(ref_local[q])
            ad_attn = ads[q].prepare_attn(ad_local[q])
            assert_same(f"step {i} rank {q} block_tables", ref_attn[0], ad_attn[0])
            assert_same(f"step {i} rank {q} slot_mappings", ref_attn[1], ad_attn[1])
            bufs = ads[q].persistent_buffers()
            assert ad_attn[1].data_ptr() == bufs["gathered_slot_mappings"].data_ptr()
            assert ad_attn[0][0].data_ptr() == bufs["block_table_0"].data_ptr()

        # hidden states: each rank's local rows name their token; the restore must give the global order
        group = backend.group
        group.clear()
        local_hidden = [_encode(b) for b in ad_local]
        aux_hidden = [h * 2 for h in local_hidden]
        group.stage(local_hidden)
        group.stage(aux_hidden)
        expected = _encode(global_batch)[: global_batch.num_tokens]
        for q in range(P):
            r_h, r_aux, r_g = restore_for_sampling(reference[q], local_hidden[q], [aux_hidden[q]])
            a_h, a_aux, a_g = restore_for_sampling(ads[q], local_hidden[q], [aux_hidden[q]])
            assert_same(f"step {i} rank {q} restored", r_h, a_h)
            assert_same(f"step {i} rank {q} restored aux", r_aux, a_aux)
            assert r_g is global_batch and a_g is global_batch
            assert torch.equal(a_h, expected), f"step {i} rank {q}: restored rows are not the global batch"
            assert torch.equal(a_aux[0], expected * 2)
            assert_same(
                f"step {i} rank {q} restore_hidden_states",
                reference[q].restore_hidden_states(local_hidden[q]),
                ads[q].restore_hidden_states(local_hidden[q]),
            )

        if i % 2 == 1:  # a draft prefill on the drafter's ids
            summary.drafts += 1
            draft_ids = global_batch.input_ids + 1000
            sentinel = object()
            for q in range(P):
                reference[q].prepare_draft_prefill(global_batch, draft_ids)
                ads[q].prepare_draft_prefill(global_batch, draft_ids)
                got = draft_inputs(ads[q], sentinel, 4, reference[q])
                assert got is ads[q].draft_prefill_batch is ad_local[q]
                assert_same_batch(
                    f"step {i} rank {q} draft", reference[q].draft_prefill_batch, ad_local[q], summary
                )
            total = global_batch.num_tokens
            expected_draft = torch.stack(
                [draft_ids[:total].to(torch.float64), global_batch.positions[:total].to(torch.float64)], dim=1
            )
            draft_last = [_encode(b) for b in ad_local]
            draft_hidden = [h * 3 for h in draft_last]
            group.stage(draft_last)
            group.stage(draft_hidden)
            for q in range(P):
                h = draft_last[q]
                ref_same = reference[q].restore_draft_prefill(h, h)
                got = ads[q].restore_draft_prefill(h, h)
                assert got[0] is got[1] and ref_same[0] is ref_same[1]
                assert_same(f"step {i} rank {q} draft restore", ref_same, got)
                assert draft_inputs(ads[q], ads[q].input_buffers, 4, reference[q]) is ads[q].input_buffers
                untouched = ads[q].restore_draft_prefill(h, draft_hidden[q])  # nothing prepared
                assert untouched[0] is h and untouched[1] is draft_hidden[q]
                reference[q].prepare_draft_prefill(global_batch, draft_ids)
                ads[q].prepare_draft_prefill(global_batch, draft_ids)
                ref_two = reference[q].restore_draft_prefill(h, draft_hidden[q])
                got = ads[q].restore_draft_prefill(h, draft_hidden[q])
                assert_same(f"step {i} rank {q} draft restore (two)", ref_two, got)
                assert torch.equal(got[1], expected_draft * 3)
                # a batch that is not the partitioned one prepares nothing
                ads[q].prepare_draft_prefill(dataclasses.replace(global_batch), draft_ids)
                assert ads[q].draft_prefill_batch is None
            if i % 4 == 1:  # the drafter's FULL prefill-graph path: prepared, never restored
                summary.unrestored_drafts += 1
                for q in range(P):
                    reference[q].prepare_draft_prefill(global_batch, draft_ids)
                    ads[q].prepare_draft_prefill(global_batch, draft_ids)
                    assert_same_batch(
                        f"step {i} rank {q} unrestored draft",
                        reference[q].draft_prefill_batch,
                        ads[q].draft_prefill_batch,
                        summary,
                    )
                unrestored = [ads[q].draft_prefill_batch for q in range(P)]

        if i % 5 == 4:  # a dummy / capture run between real steps
            summary.dummies += 1
            num_tokens = caps[i % len(caps)]
            num_reqs = max(1, min(num_tokens, case.R, 1 + i % 5))
            bound = None  # a piecewise capture, or a dummy run
            if case.decode_graphs and num_tokens <= case.R * (case.spec + 1):  # a decode graph's capture
                num_reqs, bound = min(num_tokens, case.R), case.spec + 1
            # vLLM 0.30 stages a FULL graph's capture (and its dummy runs) without a query bound: a
            # mixed graph's (cudagraph_mode=FULL), which the adapter stages at the rows its steps
            # pad to, where vLLM's stays at the descriptor's requests (FULL mixed steps: the oracle's)
            ref_reqs = num_reqs
            if bound is None and not backend.contract.capture_bounds_queries and not case.decode_graphs:
                ref_reqs = full_graph_rows(
                    Desc(cg_mode=Mode.FULL, num_tokens=num_tokens, num_reqs=num_reqs), case.R
                )
            for q in range(P):
                outs = []
                for m, reqs in ((reference[q], ref_reqs), (ads[q], num_reqs)):
                    buffers = ads[q].input_buffers
                    dummy = api.InputBatch.make_dummy(reqs, num_tokens, buffers, max_query_len=bound)
                    staged = stage_capture(m, dummy)
                    outs.append(
                        (staged, m.get_dummy_block_tables(reqs), m.get_dummy_slot_mappings(num_tokens))
                    )
                (rs, rb, rsl), (ds, db, dsl) = outs
                for f in ("input_ids", "positions", "is_padding", "query_start_loc", "seq_lens"):
                    assert_same(f"step {i} dummy {f}", getattr(rs, f), getattr(ds, f))
                assert_same(f"step {i} dummy block tables", rb, db)
                assert_same(f"step {i} dummy slot mappings", rsl, dsl)
                bufs = ads[q].persistent_buffers()
                assert ds.input_ids.data_ptr() == bufs["input_ids"].data_ptr()
                assert dsl.data_ptr() == bufs["gathered_slot_mappings"].data_ptr()
                assert db[0].data_ptr() == bufs["block_table_0"].data_ptr()
    return summary


def _dispatcher(backend: Backend, case: Case, caps: list[int]) -> Callable[[int, int, Any], Any]:
    """The runner's FULL dispatch of ``case``: ``(num_reqs, num_tokens, max_query_len) -> desc``."""
    api = backend.api
    if case.decode_graphs:
        make = backend.make_decode_dispatcher or (lambda R, sizes, q: decode_dispatcher(api, R, sizes, q))
        return make(case.R, caps, case.spec + 1)
    make_full = backend.make_dispatcher or (lambda R, sizes: full_dispatcher(api, R, sizes))
    full = make_full(case.R, caps)
    return lambda num_reqs, num_tokens, max_query_len: full(num_reqs, num_tokens)


def partition(manager: Any, batch: Any, desc: Any) -> Any:
    """``manager.partition_batch`` of ``batch`` for the runner's descriptor ``desc``, in the
    manager's form: vLLM 0.32+ take the descriptor, vLLM 0.30 the padded sizes its
    ``maybe_partition_pcp_batch`` makes of it (tokens unless ``NONE``, requests for ``FULL``)."""
    if "padded_num_tokens" not in inspect.signature(manager.partition_batch).parameters:
        return manager.partition_batch(batch, desc)
    mode = desc.cg_mode.name
    tokens = None if mode == "NONE" else desc.num_tokens
    reqs = desc.num_reqs if mode == "FULL" else None
    return manager.partition_batch(batch, padded_num_tokens=tokens, padded_num_reqs=reqs)


def restore_for_sampling(manager: Any, hidden: Any, aux: list[Any] | None) -> tuple[Any, Any, Any]:
    """``manager.restore_for_sampling`` in the 0.32+ form ``(hidden, aux, batch)``: vLLM 0.30's
    takes no auxiliary states (its runner restores them one by one, with ``restore_hidden_states``)."""
    if len(inspect.signature(manager.restore_for_sampling).parameters) == 2:
        return manager.restore_for_sampling(hidden, aux)
    restored, batch = manager.restore_for_sampling(hidden)
    return restored, None if aux is None else [manager.restore_hidden_states(a) for a in aux], batch


def draft_inputs(manager: Any, buffers: Any, num_tokens: int, reference: Any = None) -> Any:
    """``manager.get_draft_input_buffers`` in its contract's form: the draft inputs (vLLM 0.33+
    also return their MoE mask: checked equal to ``reference``'s when given)."""
    params = inspect.signature(manager.get_draft_input_buffers).parameters
    if "num_tokens" not in params:
        return manager.get_draft_input_buffers(buffers)
    inputs, mask = manager.get_draft_input_buffers(buffers, num_tokens)
    if reference is not None:
        _, want = reference.get_draft_input_buffers(buffers, num_tokens)
        assert_same("draft input mask", want, mask)
    return inputs


def stage_capture(manager: Any, batch: Any) -> Any:
    """A capture / dummy batch staged by ``manager`` (its contract's method name)."""
    method = getattr(manager, "prepare_inputs_for_capture_or_profile", None)  # vLLM 0.33+
    return (method or manager.prepare_inputs_to_capture)(batch)


def _local_rows(manager: Any, sched: np.ndarray, prefilling: np.ndarray) -> int:
    """Local request rows of ``manager``'s rank (from the oracle's pieces; at least 1)."""
    from oracle_mrv2 import rank_pieces

    split = getattr(manager, "split", "head-tail")  # (the oracle's; the contexts are not read: a count)
    pieces = rank_pieces(manager.P, sched.tolist(), prefilling.tolist(), manager.shard, manager.dcp, split)
    return max(1, len(pieces[manager.rank]))
