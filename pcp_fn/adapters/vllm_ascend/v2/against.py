"""A recorded schedule against vllm-ascend 0.30's own `AscendPCPManager`: where does the drop-in differ?

    pcp-fn replay pcp-4242.jsonl --against vllm-ascend

Every step of an MRV2 engine trace ([`pcp_fn.adapters.recording`][]: the V2 drop-in's under
vllm-ascend's `NPUModelRunner`, or the vLLM drop-in's) becomes the global `AscendInputBatch` that
vllm-ascend 0.30.0rc2's runner hands its manager, on every rank, and goes through two managers built
and configured as that runner builds them (`vllm_config`, `kv_cache_config`, `global_input_buffers`
set after construction): vllm-ascend's `AscendPCPManager` of the installed release and
`FunctionalAscendPCPManager` over it. Compared per step and rank, until the first difference:
`get_num_tokens_for_dispatch`, `get_global_graph_num_reqs`, every field of the local batch
`partition_batch` returns (dtype, shape, values) and the restore indices the attention context and
the restores read (`_hidden_restore_idx`, `_padded_gather_idx`, `_gathered_kv_write_mask`,
`_local_gather_idx`). A step one manager refuses and the other serves is a difference too.

What the trace says, and what is rebuilt from it:

- the decode placement is the trace's layout: `"mrv2-sharded"` is vllm-ascend's sharded decodes
  (PCP > 1, DCP = 1, no speculative decoding), `"mrv2"` the replicated ones (with DCP = 1 that means
  a speculative config: the runner's `vllm_config` gets an MTP one);
- a recorded `FULL` step is a sharded decode graph (`batch_desc` its rank-local graph): the global
  batch is padded to `get_global_graph_num_reqs(batch_desc)` requests of the uniform query length,
  with vllm-ascend's FIA query starts (`_pad_query_start_loc_for_fia`), and `partition_batch` gets the
  graph's tokens and requests; a `PIECEWISE` step is padded to its tokens (a replicated
  FULL_DECODE_ONLY graph is recorded so: its request padding is the runner's, not in the trace);
  `NONE` is not padded (a data-parallel padding of an eager step is not recorded either);
- the runner's `cudagraph_mode` is FULL_DECODE_ONLY when a step was padded to a graph, else NONE;
  `build_attn_state` is vllm-ascend's own, of the global batch and of each local one.

Not replayed: token ids and drafts (a recording holds none: zeros), block tables and slot mappings
(no KV slot is recorded: `prepare_attn` and the attention context's tables are not compared).

vllm-ascend's modules import on a machine without an NPU after its tests' `torch_npu` stand-ins
([`load_reference`][pcp_fn.adapters.vllm_ascend.v2.reference.load_reference]); there vLLM's
host-to-device copies (`async_tensor_h2d`, pinned memory) are plain copies while the comparison runs,
as in vllm-ascend's own tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ....sim.trace import BatchDesc, Trace, TraceStep, read_trace
from ...vllm.against import Comparison, Difference, differences, global_batch, shorten
from .reference import has_torch_npu, load_reference

LAYOUTS = ("mrv2", "mrv2-sharded")
"""The layouts whose traces `--against vllm-ascend` replays (vllm-ascend serves vLLM's chunks only)."""

RESTORE_INDICES = (
    "_hidden_restore_idx",
    "_padded_gather_idx",
    "_gathered_kv_write_mask",
    "_local_gather_idx",
)
"""The per-step restore indices compared after `partition_batch` (vLLM 0.30's names)."""


@dataclasses.dataclass(frozen=True)
class AscendNames:
    """The classes the comparison builds: the installed release's, or a stand-in's in tests.

    Attributes:
        AscendPCPManager: vllm-ascend's manager class (the reference).
        drop_in: `FunctionalAscendPCPManager` over it.
        InputBatch: vLLM's `InputBatch`; `AscendInputBatch`, `AscendInputBuffers`: vllm-ascend's.
        BatchExecutionDescriptor, CUDAGraphMode: vLLM's.
        build_attn_state: vllm-ascend's `build_attn_state`.
        version: vllm-ascend's release, for the report.
        patches: `(module, name, value)` set while the comparison runs (the CPU's copies).
    """

    AscendPCPManager: type
    drop_in: type
    InputBatch: type
    AscendInputBatch: type
    AscendInputBuffers: type
    BatchExecutionDescriptor: type
    CUDAGraphMode: Any
    build_attn_state: Any
    version: str
    patches: tuple[tuple[Any, str, Any], ...] = ()


def installed_vllm_ascend() -> AscendNames:
    """The installed vllm-ascend's names (`ImportError` without it, or with a release the drop-in
    refuses); without `torch_npu`, after its tests' stand-ins."""
    ascend_pcp = load_reference()
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu import pcp_manager as vllm_pcp
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.input_batch import InputBatch

    from .installed import FunctionalAscendPCPManager

    plain = type("FunctionalAscendPCPManager", (FunctionalAscendPCPManager,), {"graph_backend": None})
    patches: tuple[tuple[Any, str, Any], ...] = ()
    if not has_torch_npu():  # vLLM's pinned host-to-device copy needs a device: a plain copy here
        patches = ((ascend_pcp, "async_copy_to_gpu", _copy_h2d), (vllm_pcp, "async_tensor_h2d", _copy_h2d))
    return AscendNames(
        ascend_pcp.AscendPCPManager,
        plain,
        InputBatch,
        ascend_pcp.AscendInputBatch,
        ascend_pcp.AscendInputBuffers,
        BatchExecutionDescriptor,
        CUDAGraphMode,
        ascend_pcp.build_attn_state,
        importlib.metadata.version("vllm_ascend"),
        patches,
    )


def _copy_h2d(value: Any, out: torch.Tensor | None = None, device: Any = None, **_: Any) -> torch.Tensor:
    """`async_tensor_h2d` without pinned memory (what vllm-ascend's CPU tests put in its place)."""
    value = torch.from_numpy(value) if isinstance(value, np.ndarray) else torch.as_tensor(value)
    return out.copy_(value) if out is not None else value.to(device or "cpu")


@contextlib.contextmanager
def _patched(patches: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    saved = [(module, name, getattr(module, name, None)) for module, name, _ in patches]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def compare_with_vllm_ascend(
    trace: Trace | str,
    *,
    ranks: Sequence[int] | None = None,
    names: AscendNames | None = None,
    device: torch.device | str = "cpu",
) -> Comparison:
    """Every step of a recorded MRV2 trace through vllm-ascend's `AscendPCPManager` and the drop-in,
    on each rank of `ranks` (default all), until the first difference (module docstring).

    Args:
        trace: an engine's trace (layout `"mrv2"` or `"mrv2-sharded"`), or its path.
        names: the classes (default [`installed_vllm_ascend`][
            pcp_fn.adapters.vllm_ascend.v2.against.installed_vllm_ascend]).

    Raises:
        ValueError: a trace no MRV2 drop-in recorded, or of another layout.
        ImportError: no vllm-ascend, or one the drop-in refuses.
    """
    if not isinstance(trace, Trace):
        trace = read_trace(trace)
    if trace.engine is None or trace.config.layout not in LAYOUTS:
        raise ValueError(
            "--against vllm-ascend needs a trace a model runner V2 drop-in recorded (its header's engine, "
            f"layout {' or '.join(LAYOUTS)}); this one has engine {trace.engine} and layout "
            f"{trace.config.layout!r}"
        )
    names = installed_vllm_ascend() if names is None else names
    cfg, device = trace.config, torch.device(device)
    ranks = tuple(range(cfg.pcp_size)) if ranks is None else tuple(ranks)
    fields = (
        "get_num_tokens_for_dispatch",
        "get_global_graph_num_reqs",
        *(f.name for f in dataclasses.fields(names.AscendInputBatch)),
        *RESTORE_INDICES,
    )
    config = runner_config(names, trace)
    steps = 0
    with _patched(names.patches):
        for rank in ranks:
            buffers = names.AscendInputBuffers(
                max_num_reqs=cfg.max_num_reqs, max_num_tokens=cfg.max_num_tokens, device=device
            )
            kw = dict(
                pcp_world_size=cfg.pcp_size,
                pcp_rank=rank,
                device=device,
                max_num_reqs=cfg.max_num_reqs,
                max_num_tokens=cfg.max_num_tokens,
                dcp_world_size=cfg.dcp_size,
                dcp_rank=rank % cfg.dcp_size,
                cp_interleave=cfg.cp_kv_cache_interleave_size,
            )
            theirs = names.AscendPCPManager(**kw)
            ours = names.drop_in(**kw, record_schedule="")  # never recorded again
            for m in (theirs, ours):
                m.vllm_config, m.kv_cache_config, m.global_input_buffers = config, None, buffers
            for i, s in enumerate(trace.steps):
                steps = max(steps, i + 1)
                found = _step_difference(names, config, theirs, ours, s, device)
                if found is not None:
                    field, a, b = found
                    return Comparison(names.version, steps, ranks, fields, Difference(i, rank, field, a, b))
    return Comparison(names.version, steps, ranks, fields, None)


def runner_config(names: AscendNames, trace: Trace) -> SimpleNamespace:
    """The `vllm_config` that vllm-ascend's runner gives its manager, as far as the trace tells it."""
    cfg = trace.config
    sharded = cfg.layout == "mrv2-sharded"
    graphs = any(s.batch_desc is not None and s.batch_desc.cg_mode != "NONE" for s in trace.steps)
    # replicated decodes with DCP = 1: vllm-ascend shards unless there is a speculative config
    spec = (
        SimpleNamespace(method="mtp", num_speculative_tokens=1) if not sharded and cfg.dcp_size == 1 else None
    )
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            prefill_context_parallel_size=cfg.pcp_size,
            decode_context_parallel_size=cfg.dcp_size,
            pipeline_parallel_size=1,
            data_parallel_size=1,
        ),
        model_config=SimpleNamespace(
            use_mla=True, is_encoder_decoder=False, hf_text_config=SimpleNamespace(), runner_type="generate"
        ),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=True),
        lora_config=None,
        speculative_config=spec,
        compilation_config=SimpleNamespace(
            cudagraph_mode=names.CUDAGraphMode.FULL_DECODE_ONLY if graphs else names.CUDAGraphMode.NONE
        ),
    )


def runner_descriptor(names: AscendNames, s: TraceStep) -> Any:
    """vLLM's `BatchExecutionDescriptor` of a recorded step, as vllm-ascend's runner held it."""
    desc, Mode = s.batch_desc, names.CUDAGraphMode
    if desc is None or desc.cg_mode == "NONE" or not desc.num_tokens:
        return names.BatchExecutionDescriptor(
            cg_mode=Mode.NONE, num_tokens=sum(s.num_scheduled), num_reqs=None
        )
    if desc.cg_mode == "FULL" and desc.num_reqs:
        return names.BatchExecutionDescriptor(
            cg_mode=Mode.FULL,
            num_tokens=desc.num_tokens,
            num_reqs=desc.num_reqs,
            uniform_token_count=desc.uniform_token_count or desc.num_tokens // desc.num_reqs,
        )
    return names.BatchExecutionDescriptor(cg_mode=Mode.PIECEWISE, num_tokens=desc.num_tokens, num_reqs=None)


def ascend_global_batch(
    names: AscendNames, config: Any, s: TraceStep, desc: Any, graph_reqs: int | None, device: torch.device
) -> Any:
    """The global `AscendInputBatch` of a recorded step as vllm-ascend 0.30's `prepare_inputs`
    makes it for `desc` (`graph_reqs`: a sharded graph's global requests)."""
    n, total = len(s.num_scheduled), sum(s.num_scheduled)
    padded = max(total, desc.num_tokens)
    if graph_reqs is not None:
        padded = graph_reqs * desc.uniform_token_count
    plain = dataclasses.replace(s, batch_desc=BatchDesc("NONE", padded, None))
    g = global_batch(names.InputBatch, plain, device)
    sched = np.asarray(s.num_scheduled, np.int32)
    seq = np.asarray(s.num_computed, np.int32) + sched
    fields = {f.name: getattr(g, f.name) for f in dataclasses.fields(names.InputBatch)}
    if desc.cg_mode == names.CUDAGraphMode.FULL:
        qsl, rows = fia_query_starts(
            g.query_start_loc_np[: n + 1], padded, max(n, graph_reqs or desc.num_reqs)
        )
        seq_lens = np.zeros(rows, np.int32)
        seq_lens[:n] = seq
        fields.update(
            num_reqs_after_padding=rows,
            query_start_loc_np=qsl,
            query_start_loc=torch.from_numpy(qsl).to(device),
            seq_lens=torch.from_numpy(seq_lens).to(device),
        )
        seq = seq_lens
    state = names.build_attn_state(config, seq, n, sched, sched, kv_cache_config=None)
    return names.AscendInputBatch(**fields, seq_lens_np=seq, attn_state=state)


def fia_query_starts(qsl: np.ndarray, num_tokens_padded: int, num_reqs_padded: int) -> tuple[np.ndarray, int]:
    """vllm-ascend's `_pad_query_start_loc_for_fia` for a FULL_DECODE_ONLY graph: `[R' + 1]` query
    starts whose last is `num_tokens_padded`, and `R'`.

        qsl [0, 2, 4], 8 tokens, 4 rows  ->  [0, 2, 4, 6, 8], 4   (uniform: padding rows of 2)
        qsl [0, 3, 4], 8 tokens, 2 rows  ->  [0, 3, 4, 8], 3      (else one dummy request)
    """
    n = qsl.shape[0] - 1
    total = int(qsl[n])
    lens = np.diff(qsl)
    query_len = int(lens[0]) if n else 0
    out = np.full(num_reqs_padded + 2, total, np.int32)
    out[: n + 1] = qsl
    if n and np.all(lens == query_len) and num_tokens_padded == num_reqs_padded * query_len:
        out[n + 1 : num_reqs_padded + 1] = total + query_len * np.arange(1, num_reqs_padded - n + 1)
        return out[: num_reqs_padded + 1].copy(), num_reqs_padded
    out[num_reqs_padded + 1] = num_tokens_padded
    return out[: num_reqs_padded + 2].copy(), num_reqs_padded + 1


def _step_difference(
    names: AscendNames, config: Any, theirs: Any, ours: Any, s: TraceStep, device: torch.device
) -> tuple[str, str, str] | None:
    """`(field, vllm-ascend's, pcp_fn's)` of the first difference of step `s`, else `None`."""
    sched = np.asarray(s.num_scheduled, np.int32)
    prefilling = np.asarray(s.is_prefilling if s.is_prefilling is not None else (), np.bool_)
    results = []
    for manager in (theirs, ours):
        try:
            dispatch = manager.get_num_tokens_for_dispatch(sched, prefilling)
            desc = runner_descriptor(names, s)
            graph_reqs = manager.get_global_graph_num_reqs(desc)
            g = ascend_global_batch(names, config, s, desc, graph_reqs, device)
            full = desc.cg_mode == names.CUDAGraphMode.FULL
            tokens = None if desc.cg_mode == names.CUDAGraphMode.NONE else desc.num_tokens
            local = manager.partition_batch(g, tokens, desc.num_reqs if full else None)
            indices = tuple(getattr(manager, name) for name in RESTORE_INDICES)
            results.append((True, (dispatch, graph_reqs, local, indices)))
        except Exception as e:  # one refusing what the other serves is the finding
            results.append((False, f"raised {type(e).__name__}: {e}"))
    (ok_a, a), (ok_b, b) = results
    if not (ok_a and ok_b):
        return None if not (ok_a or ok_b) else ("partition_batch", shorten(a), shorten(b))
    for name, x, y in (
        ("get_num_tokens_for_dispatch", a[0], b[0]),
        ("get_global_graph_num_reqs", a[1], b[1]),
    ):
        if x != y:
            return name, shorten(x), shorten(y)
    found = next(differences(a[2], b[2]), None)
    if found is not None:
        return found
    for name, x, y in zip(RESTORE_INDICES, a[3], b[3]):
        if not _same_tensor(x, y):
            return name, shorten(x), shorten(y)
    return None


def _same_tensor(x: Any, y: Any) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.cpu(), y.cpu())
