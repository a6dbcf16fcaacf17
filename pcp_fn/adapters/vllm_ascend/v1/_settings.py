"""What the manager reads from vllm-ascend's constructor arguments and `VllmConfig`.

The 0.23 `PCPManager` takes a `VllmConfig`; the adapter accepts any object
with the same attributes (duck typing), reads them once here and never keeps
the config's mutable parts. Attributes read:

- `speculative_config`: `None` or an object with `num_speculative_tokens`;
- `scheduler_config.max_num_batched_tokens` (`T`) and `.max_num_seqs` (`R`);
- `model_config.hf_config.model_type` (hybrid attention for `qwen3_next`,
  `qwen3_5`, `qwen3_5_moe`) and `model_config.max_model_len` (the width of
  the MTP attention mask; the runner has already widened it by `2 * P * R`);
- `parallel_config.cp_kv_cache_interleave_size`;
- vllm-ascend's `is_pd_decode_recompute_scheduler_enabled(vllm_config)`, when
  `vllm_ascend` is importable (otherwise `False`).

A placeholder (a `unittest.mock` object: vllm-ascend's own unit tests build their configs
from `MagicMock()` and set only the fields a test needs) is not a value, and is read the way
vllm-ascend's class reads it, field by field:

- `max_num_seqs`: the constructor's `max_num_reqs` (the runner passes the config's value; vllm-ascend
  sizes its buffers with both);
- `max_num_batched_tokens`: at most the constructor's `max_buffer_num_tokens` (the runner's buffer,
  `T + 2 * P * R` with CP, never less than `T`): the step's token bound;
- `max_model_len`: what vllm-ascend sizes its MTP mask with, `operator.index` of it (a `MagicMock`'s
  is 1); keys past the width are dropped;
- `model_type`: matches none of the hybrid models' names (not hybrid), as vllm-ascend's `in` test;
- `speculative_config`: present (vllm-ascend tests its truth); its `num_speculative_tokens` must be a
  real count;
- `cp_kv_cache_interleave_size`: vllm-ascend reads it only in the calls that split context lengths
  across CP ranks (`generate_pcp_metadata`, the drafter's CP metadata); those calls refuse it
  (`ValueError` naming it), the rest run.

A real value is checked: an `int` (not a `bool`) in range, else a `ValueError` naming the field.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the vLLM objects' protocols, for annotations only (no other adapter imported)
    from ...vllm.engine_types import VllmConfig

HYBRID_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@dataclasses.dataclass(frozen=True)
class ManagerSettings:
    """Static settings of one rank's manager (plain values; hashable)."""

    pcp_size: int
    pcp_rank: int
    dcp_size: int
    dcp_rank: int
    max_num_reqs: int  # R
    max_num_tokens: int  # T
    max_buffer_num_tokens: int  # the runner's buffer size (T + 2 * P * R)
    num_spec_tokens: int  # k (0 without a speculative config)
    has_spec_config: bool
    interleave: int
    hybrid_attn: bool
    pd_decode_recompute: bool
    max_model_len: int
    device: torch.device
    use_async_scheduling: bool
    pin_memory: bool
    use_sparse: bool
    # False: the config's interleave was a placeholder (`interleave` then holds 1, used by no call)
    interleave_set: bool = True

    @property
    def decode_threshold(self) -> int:
        """`1 + k`: the most tokens a decode request schedules."""
        return 1 + self.num_spec_tokens

    @property
    def cp_size(self) -> int:
        return self.pcp_size * self.dcp_size

    def require_interleave(self, call: str) -> int:
        """The KV interleave size, for `call` (which splits context lengths across CP ranks)."""
        if not self.interleave_set:
            raise ValueError(
                f"{call} needs parallel_config.cp_kv_cache_interleave_size, which the vllm_config "
                "given to the manager does not hold (a placeholder, not an int)"
            )
        return self.interleave

    @property
    def graph_device(self) -> bool:
        """A device with graph capture (CUDA graphs, Ascend ACL graphs through torch_npu)."""
        return self.device.type in ("cuda", "npu")


def _pd_recompute(vllm_config: VllmConfig) -> bool:
    try:  # the real helper when vllm-ascend is installed
        from vllm_ascend.utils import is_pd_decode_recompute_scheduler_enabled
    except ImportError:
        return bool(getattr(vllm_config, "pd_decode_recompute", False))
    return bool(is_pd_decode_recompute_scheduler_enabled(vllm_config))


def is_placeholder(value: object) -> bool:
    """A `unittest.mock` object (only when `unittest.mock` is loaded: a real config never holds one)."""
    mock = sys.modules.get("unittest.mock")
    return mock is not None and isinstance(value, mock.NonCallableMock)


def _positive(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _placeholder_size(name: str, value: object) -> int:
    """vllm-ascend's buffer size for a placeholder: `operator.index` of it, as torch / numpy take it."""
    try:
        return _positive(name, operator.index(value))  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}") from None


def read_settings(
    vllm_config: VllmConfig,
    device: torch.device | str,
    pcp: tuple[int, int],
    dcp: tuple[int, int],
    *,
    max_buffer_num_tokens: int,
    max_num_reqs: int,
    use_async_scheduling: bool,
    pin_memory: bool,
    use_sparse: bool,
) -> ManagerSettings:
    """Read the `PCPManager` constructor arguments (`pcp`, `dcp`: world size and rank);
    `ValueError` names a bad field. Placeholders: the module's docstring."""
    (pcp_world_size, pcp_rank), (dcp_world_size, dcp_rank) = pcp, dcp
    max_num_reqs = _positive("max_num_reqs", max_num_reqs)
    max_buffer_num_tokens = _positive("max_buffer_num_tokens", max_buffer_num_tokens)
    spec = vllm_config.speculative_config
    sched = vllm_config.scheduler_config
    model = vllm_config.model_config
    if is_placeholder(sched.max_num_seqs):
        R = max_num_reqs
    else:
        R = _positive("scheduler_config.max_num_seqs", sched.max_num_seqs)
        if max_num_reqs != R:
            # the reference sizes some buffers by one and some by the other; they are one number
            raise ValueError(f"max_num_reqs={max_num_reqs} differs from scheduler_config.max_num_seqs={R}")
    T = sched.max_num_batched_tokens
    if is_placeholder(T):
        T = max_buffer_num_tokens
    k = spec.num_speculative_tokens if spec else 0
    max_model_len = model.max_model_len
    if is_placeholder(max_model_len):
        max_model_len = _placeholder_size("model_config.max_model_len", max_model_len)
    interleave = vllm_config.parallel_config.cp_kv_cache_interleave_size
    interleave_set = not is_placeholder(interleave)
    return ManagerSettings(
        pcp_size=_positive("pcp_world_size", pcp_world_size),
        pcp_rank=_positive("pcp_rank", pcp_rank, 0),
        dcp_size=_positive("dcp_world_size", dcp_world_size),
        dcp_rank=_positive("dcp_rank", dcp_rank, 0),
        max_num_reqs=R,
        max_num_tokens=_positive("scheduler_config.max_num_batched_tokens", T),
        max_buffer_num_tokens=max_buffer_num_tokens,
        num_spec_tokens=_positive("speculative_config.num_speculative_tokens", k, 0),
        has_spec_config=bool(spec),
        interleave=(
            _positive("parallel_config.cp_kv_cache_interleave_size", interleave) if interleave_set else 1
        ),
        hybrid_attn=model.hf_config.model_type in HYBRID_MODEL_TYPES,
        pd_decode_recompute=_pd_recompute(vllm_config),
        max_model_len=_positive("model_config.max_model_len", max_model_len),
        device=torch.device(device),
        use_async_scheduling=bool(use_async_scheduling),
        pin_memory=bool(pin_memory),
        use_sparse=bool(use_sparse),
        interleave_set=interleave_set,
    )
