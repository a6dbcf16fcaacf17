"""Lockstep check: ``FunctionalAscendPCPManager`` against vllm-ascend main's OWN V2 ``AscendPCPManager``.

Development only. Needs vLLM (0.32.0: run it with the vLLM venv) and the
reference ``vllm_ascend/worker/v2/pcp_manager.py``, which is not in
``shared/seeds``: point ``PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER`` at it (see
``tools/reference.py``)::

    PCP_FN_REF_VLLM_ASCEND_V2_PCP_MANAGER=/path/vllm_ascend_v2_pcp_manager.txt \\
        .vllm-venv/bin/python tools/check_ascend_v2_manager_against_reference.py [--quick]

The reference text is executed as the module ``vllm_ascend.worker.v2.pcp_manager``
over vLLM 0.32.0's REAL ``PCPManager``. Stand-ins replace only framework plumbing:

- ``vllm_ascend.utils.vllm_version_is`` (False: the reference's newest-vLLM paths);
- ``vllm_ascend.worker.v2.input_batch``: ``AscendInputBatch`` (vLLM's ``InputBatch``
  plus ``seq_lens_np``, ``attn_state``, ``is_dummy``) and ``AscendInputBuffers``
  (vLLM's ``InputBuffers`` plus the FIA ``query_start_loc`` slot and host
  ``seq_lens_cpu`` / ``seq_lens_np``), after vllm-ascend's interface;
- ``vllm_ascend.worker.v2.attn_utils.build_attn_state``: a record of its arguments
  (both managers get the same one, so every argument is compared);
- the release shim between the reference and vLLM 0.32.0's ``PCPManager``: the
  reference is written against vLLM main (constructor without
  ``shard_decode_requests``; ``partition_batch(batch, padded_num_tokens=None)``).
  The shim passes ``shard_decode_requests=False`` (vllm-ascend's base replicates
  decodes) and turns ``padded_num_tokens`` into a PIECEWISE descriptor (``None``:
  NONE). vLLM 0.32.0 sizes ``hidden_restore_idx`` by the global
  ``query_start_loc_np[-1]`` and leaves the rows of a FIA dummy request
  uninitialised (``np.empty``); the shim zeroes them (the reference zeroes the
  same rows itself for a decode-only batch, and zeroes the restored rows they
  produce) so the gather stays in range and ``build_attention_context`` is
  deterministic;
- vLLM's Triton block-table kernels cannot run on the CPU: both managers get the
  torch ``BlockTables`` of ``tests/vllm_standin.py``; the PCP and PP groups are
  one process playing every rank (``tests/ascend_v2_lockstep.py``).

The driver (``tests/ascend_v2_lockstep.py``) compares every return value and every
attribute the runner reads; ``DEVIATIONS`` there lists what may differ and how
it is mapped. This lockstep is a tool, not a test: the default suite reads
nothing outside the repository and imports nothing from tools/ (the reference
lives outside it); ``tests/adapters/test_vllm_ascend_v2_adapter.py`` runs the same driver
against the plain-Python oracle.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import types
from contextlib import contextmanager

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from reference import reference_source  # noqa: E402

try:
    import vllm.v1.worker.gpu.pcp_manager as vllm_pcp
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
except ImportError as e:  # pragma: no cover - the tool needs vLLM
    sys.exit(f"vLLM is not importable ({e}): run with the vLLM venv (tools/make_vllm_venv.sh)")

import ascend_v2_lockstep as lockstep  # noqa: E402
import vllm_standin as standin  # noqa: E402
from vllm_lockstep import Case  # noqa: E402

from pcp_fn.adapters.vllm import VllmApi  # noqa: E402
from pcp_fn.adapters.vllm_ascend import AscendApi, make_functional_ascend_manager  # noqa: E402

GROUP = lockstep.PrefixGroup()
PP = lockstep.PPGroup()

# --------------------------------------------------------------------------- vllm-ascend stand-ins


class AscendInputBuffers(InputBuffers):
    """vllm-ascend's ``AscendInputBuffers`` interface: one more ``query_start_loc`` entry (the FIA
    padding slot), host ``seq_lens_cpu`` and its numpy view ``seq_lens_np``."""

    def __init__(self, max_num_reqs: int, max_num_tokens: int, device: torch.device) -> None:
        super().__init__(max_num_reqs, max_num_tokens, device)
        self.query_start_loc = torch.zeros(max_num_reqs + 2, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(max_num_reqs, dtype=torch.int32)
        self.seq_lens_np = self.seq_lens_cpu.numpy()
        self.dummy_num_tokens = None


@dataclasses.dataclass
class AscendInputBatch(InputBatch):
    """vllm-ascend's ``AscendInputBatch`` interface: vLLM's ``InputBatch`` and three fields."""

    seq_lens_np: np.ndarray = None  # type: ignore[assignment]
    attn_state: object = None
    is_dummy: bool = False


class ReleaseBase(vllm_pcp.PCPManager):
    """vLLM 0.32.0's ``PCPManager`` behind the vLLM-main signatures the reference calls."""

    def __init__(
        self,
        pcp_world_size,
        pcp_rank,
        device,
        max_num_reqs=None,
        max_num_tokens=None,
        block_tables=None,
        dcp_world_size=1,
        dcp_rank=0,
        cp_interleave=1,
    ):
        super().__init__(
            pcp_world_size,
            pcp_rank,
            device,
            False,  # vllm-ascend's base replicates decodes
            max_num_reqs,
            max_num_tokens,
            block_tables,
            dcp_world_size,
            dcp_rank,
            cp_interleave,
        )

    def partition_batch(self, input_batch, padded_num_tokens=None):
        mode = CUDAGraphMode.NONE if padded_num_tokens is None else CUDAGraphMode.PIECEWISE
        desc = BatchExecutionDescriptor(cg_mode=mode, num_tokens=padded_num_tokens or 0, num_reqs=None)
        local = super().partition_batch(input_batch, desc)
        self._hidden_restore_idx[input_batch.num_tokens :].zero_()  # np.empty rows of a FIA dummy request
        return local


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@contextmanager
def _swapped_modules(mods: dict[str, types.ModuleType]):
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def load_reference() -> tuple[types.ModuleType, str]:
    """vllm-ascend's ``pcp_manager.py`` executed over vLLM 0.32.0 (with the stand-ins above)."""
    path, text = reference_source("vllm_ascend_v2_pcp_manager")
    name = "vllm_ascend.worker.v2.pcp_manager"
    mod = types.ModuleType(name)
    mod.__file__ = path
    stand_ins = {
        "vllm_ascend": _module("vllm_ascend"),
        "vllm_ascend.utils": _module("vllm_ascend.utils", vllm_version_is=lambda version: False),
        "vllm_ascend.worker": _module("vllm_ascend.worker"),
        "vllm_ascend.worker.v2": _module("vllm_ascend.worker.v2"),
        "vllm_ascend.worker.v2.attn_utils": _module(
            "vllm_ascend.worker.v2.attn_utils", build_attn_state=lockstep.build_attn_state
        ),
        "vllm_ascend.worker.v2.input_batch": _module(
            "vllm_ascend.worker.v2.input_batch",
            AscendInputBatch=AscendInputBatch,
            AscendInputBuffers=AscendInputBuffers,
        ),
        "vllm.v1.worker.gpu.pcp_manager": _module("vllm.v1.worker.gpu.pcp_manager", PCPManager=ReleaseBase),
        name: mod,
    }
    with _swapped_modules(stand_ins):
        exec(compile(text, path, "exec"), mod.__dict__)
    # the collectives: one process plays every rank (vLLM's base looks its group up at call time)
    mod.get_pcp_group = lambda: GROUP
    mod.get_pp_group = lambda: PP
    vllm_pcp.get_pcp_group = lambda: GROUP
    return mod, path


def backend(mod: types.ModuleType, graph_backend: str | None) -> tuple[lockstep.AscendBackend, type]:
    adapter = make_functional_ascend_manager(
        VllmApi(
            PCPManager=vllm_pcp.PCPManager,
            InputBuffers=InputBuffers,
            CUDAGraphMode=CUDAGraphMode,
            PAD_SLOT_ID=PAD_SLOT_ID,
            get_pcp_group=lambda: GROUP,
        ),
        AscendApi(
            AscendInputBuffers=AscendInputBuffers,
            build_attn_state=lockstep.build_attn_state,
            get_pp_group=lambda: PP,
            AttentionContext=mod.AscendPCPAttentionContext,
        ),
    )
    # the host-sync detector is a dispatch mode, which torch.compile refuses: eager only
    settings = {"graph_backend": graph_backend, "check_host_syncs": graph_backend is None}
    adapter = type(adapter.__name__, (adapter,), settings)
    api = types.SimpleNamespace(
        InputBatch=AscendInputBatch, CUDAGraphMode=CUDAGraphMode, PAD_SLOT_ID=PAD_SLOT_ID
    )
    return lockstep.AscendBackend(
        name="vllm-ascend",
        api=api,
        block_tables_cls=standin.AscendBlockTables,
        make_reference=lambda **kw: mod.AscendPCPManager(**kw),
        make_adapter=lambda **kw: adapter(**kw),
        group=GROUP,
        pp=PP,
    ), adapter


CASES = [
    (Case(P=2, shard=False, seed=1), "FULL_DECODE_ONLY"),
    (Case(P=2, shard=False, spec=1, seed=2), "FULL_DECODE_ONLY"),
    (Case(P=3, shard=False, seed=3), "PIECEWISE"),
    (Case(P=3, shard=False, spec=2, seed=4), "NONE"),
    (Case(P=4, shard=False, seed=5), "NONE"),
    (Case(P=4, shard=False, dcp=2, interleave=2, seed=6), "FULL_DECODE_ONLY"),
    (Case(P=4, shard=False, spec=1, seed=7), "PIECEWISE"),
    (Case(P=8, shard=False, seed=8, T=64), "FULL_DECODE_ONLY"),
    (Case(P=8, shard=False, dcp=4, seed=9, T=64), "NONE"),
    (Case(P=8, shard=False, spec=1, seed=10, T=64), "PIECEWISE"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first three cases, 12 steps each")
    parser.add_argument(
        "--backend", default="none", help="the adapter's graph backend on the CPU (none, eager, inductor)"
    )
    args = parser.parse_args()
    mod, path = load_reference()
    graph_backend = None if args.backend == "none" else args.backend
    be, adapter = backend(mod, graph_backend)
    print(f"reference: {path} (executed over vLLM 0.32.0's PCPManager, {vllm_pcp.__file__})")
    total = lockstep.Summary()
    cases = CASES[:3] if args.quick else CASES
    t0 = time.perf_counter()
    for case, graphs in cases:
        if args.quick:
            case = dataclasses.replace(case, max_steps=12)
        s = lockstep.run_ascend_lockstep(be, case, graphs)
        print(
            f"  {s.configs[0]:<50} steps={s.steps:3d} mixed={s.mixed:3d} decode={s.decode_only:3d} "
            f"graph-padded={s.graph_padded:3d} rank-by-rank-slots={s.rank_by_rank_slots:2d} "
            f"fia-dummy={s.fia_dummy:3d} spec={s.spec:3d} dummies={s.dummies:2d} "
            f"off-last-stage={s.off_last_stage:2d}"
        )
        total.merge(s)
    n_cfg, n_dev = lockstep.compare_validate_config(mod.AscendPCPManager, adapter, CUDAGraphMode)
    print(
        f"{len(total.configs)} configs, {total.steps} steps, {total.rank_steps} rank-steps, "
        f"{total.comparisons} comparisons, {len(total.fields)} fields compared: all equal "
        f"({time.perf_counter() - t0:.0f}s)"
    )
    print(f"fields: {', '.join(sorted(total.fields))}")
    print(f"validate_config: {n_cfg} configs, the same outcome but {n_dev} (FULL, documented)")
    print("documented deviations:")
    for k, v in lockstep.DEVIATIONS.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
