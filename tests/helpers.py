"""Small shared test helpers (no pcp_fn internals)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

import torch
import torch.utils._pytree as pytree
from strategies import Case

import pcp_fn


def config_for(case: Case, rank: int, **kw) -> pcp_fn.PCPConfig:
    return pcp_fn.PCPConfig(case.P, rank, case.R, case.T, num_spec_tokens=case.spec, **kw)


def batch_for(case: Case, cfg: pcp_fn.PCPConfig, **kw) -> pcp_fn.SchedulerBatch:
    return pcp_fn.make_batch(cfg, case.sched, case.comp, case.prompt, **kw)


def tree_equal(a, b) -> bool:
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb:
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape):
                return False
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def tree_meta(tree):
    """Shapes and dtypes of every tensor leaf, plus the tree structure."""
    leaves, spec = pytree.tree_flatten(tree)
    return spec, [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves]


def to_device(tree, device):
    return pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, tree)


def snapshot(tree):
    return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree)


def no_slots(batch) -> torch.Tensor:
    """A bucket-shaped slot mapping of padding only, for tests that do not look at KV slots."""
    rows = pcp_fn.protocol.batch.token_rows(batch.config, batch.bucket)
    return torch.full((rows,), batch.config.pad_slot_id, dtype=torch.int32)


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> types.ModuleType:
    """``examples/<name>.py`` as the module ``<name>``, loaded once: importable by name, since
    Dynamo reads a layout's source through its module."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module
