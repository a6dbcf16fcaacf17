"""The vllm-ascend main (model runner V2) objects the V2 drop-in reads, as typing protocols.

vllm-ascend's V2 classes extend vLLM's ([`pcp_fn.adapters.vllm.engine_types`][]); each
protocol here names what the V2 manager reads beyond its vLLM base. Annotations only: nothing
checks an object against them. This module imports neither vLLM nor vllm-ascend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from ...vllm.engine_types import InputBatch, InputBuffers


class AscendInputBuffers(InputBuffers, Protocol):
    """vllm-ascend's `AscendInputBuffers` (`vllm_ascend/worker/v2/input_batch.py`)."""

    seq_lens_cpu: torch.Tensor  # [R] int32, host
    seq_lens_np: np.ndarray  # its numpy view


AscendInputBuffersFactory = Callable[..., AscendInputBuffers]
"""vllm-ascend's `AscendInputBuffers` class: a keyword constructor `(max_num_reqs=, max_num_tokens=,
device=)`."""


class AscendInputBatch(InputBatch, Protocol):
    """vllm-ascend's `AscendInputBatch` dataclass (`vllm_ascend/worker/v2/input_batch.py`)."""

    num_reqs: int
    query_start_loc_np: np.ndarray
    num_draft_tokens: int
    num_draft_tokens_per_req: np.ndarray | None
    seq_lens_np: np.ndarray | None  # (a dummy batch's; the local batch's is written)
    is_dummy: bool
