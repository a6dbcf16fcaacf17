"""Load the reference ``PCPManager`` from the reference file, for development checks only.

The reference (vllm-ascend ``worker/pcp_utils.py``) imports vllm and vllm_ascend.
This loader puts small stand-ins for those imports in ``sys.modules`` and
executes the reference text, so benchmarks and ``tools/check_against_reference.py`` can
run the real host path next to pcp_fn. Nothing in ``pcp_fn`` or ``tests``
imports it; it finds the reference through :mod:`reference`.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import numpy as np
import torch
from reference import reference_path, reference_source


class CpuGpuBuffer:
    """Stand-in for vllm.v1.utils.CpuGpuBuffer on a CPU-only machine."""

    def __init__(self, *size, dtype, device, pin_memory=False, with_numpy=True):
        self.cpu = torch.zeros(*size, dtype=dtype, device="cpu")
        self.gpu = torch.zeros(*size, dtype=dtype, device=device)
        self.np = self.cpu.numpy() if dtype != torch.bool or True else None

    def copy_to_gpu(self, n=None):
        if n is None:
            self.gpu.copy_(self.cpu)
            return self.gpu
        self.gpu[:n].copy_(self.cpu[:n])
        return self.gpu[:n]


class _Group:
    gathered = None

    def all_gather(self, t, dim=0):
        assert self.gathered is not None, "set reference_loader.PCP_GROUP.gathered first"
        return self.gathered


PCP_GROUP = _Group()


def _module(name, **attrs):
    mod = sys.modules.get(name) or types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return mod


def _install_stubs():
    import logging

    _module("vllm")
    _module("vllm.config", VllmConfig=object)
    _module("vllm.logger", logger=logging.getLogger("reference"))
    _module("vllm.utils", length_from_prompt_token_ids_or_embeds=lambda ids, emb: len(ids))
    _module("vllm.utils.math_utils", cdiv=lambda a, b: -(-a // b))
    _module("vllm.v1")
    _module("vllm.v1.utils", CpuGpuBuffer=CpuGpuBuffer)
    _module("vllm.distributed")
    _module("vllm.distributed.parallel_state", get_pcp_group=lambda: PCP_GROUP)
    _module("vllm_ascend")
    _module("vllm_ascend.spec_decode")
    _module("vllm_ascend.spec_decode.utils", correct_optimistic_seq_lens_cpu=None)
    _module("vllm_ascend.utils", is_pd_decode_recompute_scheduler_enabled=lambda cfg: cfg._pd_recompute)
    _module("vllm_ascend.worker")
    _module("vllm_ascend.worker.npu_input_batch", NPUInputBatch=object)
    _module("vllm_ascend.worker.utils", copy_snapshot_to_gpu=lambda buf: buf.copy_to_gpu())


def reference_file() -> str | None:
    """The vllm-ascend ``pcp_utils.py`` reference (:mod:`reference`), or ``None``."""
    return reference_path("vllm_ascend_pcp_utils")


_CLASS = None


def load_pcp_manager_class():
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    path, text = reference_source("vllm_ascend_pcp_utils")
    _install_stubs()
    mod = types.ModuleType("reference_pcp_utils")
    sys.modules["reference_pcp_utils"] = mod  # dataclasses look their module up
    exec(compile(text, path, "exec"), mod.__dict__)
    _CLASS = mod.PCPManager
    return _CLASS


def make_manager(
    P,
    rank,
    R,
    T,
    *,
    num_spec_tokens=0,
    dcp=1,
    dcp_rank=0,
    interleave=1,
    hybrid=False,
    pd_recompute=False,
    max_model_len=4096,
):
    cls = load_pcp_manager_class()
    spec = SimpleNamespace(num_speculative_tokens=num_spec_tokens) if num_spec_tokens else None
    vcfg = SimpleNamespace(
        speculative_config=spec,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=T, max_num_seqs=R),
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(model_type="qwen3_next" if hybrid else "llama"),
            max_model_len=max_model_len,
        ),
        parallel_config=SimpleNamespace(cp_kv_cache_interleave_size=interleave),
        _pd_recompute=pd_recompute,
    )
    max_buffer = T * P + 2 * P * R
    m = cls(P, rank, dcp, dcp_rank, max_buffer, R, torch.device("cpu"), vcfg, False)
    m.initialize_slot_mapping()
    return m


def reference_step(m, sched, comp, prompt, slot_mapping=None, num_tokens_padded=None):
    """The runner's host path for one step: returns the reference's outputs as numpy/torch."""
    sched = np.asarray(sched, dtype=np.int32).copy()
    comp = np.asarray(comp, dtype=np.int32)
    prompt = np.asarray(prompt, dtype=np.int32)
    n = sched.size
    arange = np.arange(max(m.pcp_unpad_mask_cpu.shape[0], 16) + 16, dtype=np.int64)
    m.init_batch_info(sched, n, comp, prompt)
    pcp_tokens, positions = m.update_tokens_for_pcp(sched[:n].copy(), arange)
    pcp_tokens = np.asarray(pcp_tokens).copy()
    N = int(pcp_tokens.sum())
    cu = np.cumsum(pcp_tokens)
    out = dict(
        pcp_tokens=pcp_tokens,
        positions=np.asarray(positions)[:N].copy(),
        num_pads=m.num_pcp_pads_cpu[:n].copy(),
        unpad_mask=m.pcp_unpad_mask_cpu[: N * m.pcp_world_size].copy(),
        restore_index=m.pcp_allgather_restore_idx.np[: N * m.pcp_world_size].copy(),
        logits=m.get_logits_indices(cu, n).numpy().copy() if n else np.zeros(0, np.int64),
        num_decode_reqs=m.num_decode_reqs,
        num_decode_tokens=m.num_decode_tokens,
    )
    if slot_mapping is not None:
        padded = num_tokens_padded if num_tokens_padded is not None else N
        m.num_actual_tokens_pcp_padded = N * m.pcp_world_size
        out["slot_mapping"] = m.get_padded_slot_mapping(N, padded, slot_mapping, 0).clone()
    return out
