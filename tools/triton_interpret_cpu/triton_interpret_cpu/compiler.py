"""The compiler half of the ``cpu`` backend: accepts the ``cpu`` target, compiles nothing."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from triton.backends.compiler import BaseBackend, GPUTarget


@dataclasses.dataclass(frozen=True)
class InterpretOptions:
    """The few option fields Triton's front end reads from every backend's options."""

    num_warps: int = 1
    num_ctas: int = 1
    num_stages: int = 1
    debug: bool = False
    sanitize_overflow: bool = False
    backend_name: str = "cpu"
    allowed_dot_input_precisions: tuple[str, ...] = ("ieee",)
    default_dot_input_precision: str = "ieee"
    max_num_imprecise_acc_default: int = 0
    extern_libs: tuple[Any, ...] | None = None
    arch: str = "cpu"
    instrumentation_mode: str = ""

    def hash(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()


class CPUInterpretBackend(BaseBackend):
    """Target ``GPUTarget("cpu", 0, 0)``; any compile request is an error (use ``TRITON_INTERPRET=1``)."""

    @staticmethod
    def supports_target(target: GPUTarget) -> bool:
        return target.backend == "cpu"

    def __init__(self, target: GPUTarget) -> None:
        super().__init__(target)
        self.binary_ext = "so"

    def hash(self) -> str:
        return "triton-interpret-cpu-0.1.0"

    def parse_options(self, options: dict) -> InterpretOptions:
        known = {f.name for f in dataclasses.fields(InterpretOptions)}
        return InterpretOptions(**{k: v for k, v in options.items() if k in known and v is not None})

    def pack_metadata(self, metadata: Any) -> tuple[Any, ...]:
        return ()

    def get_codegen_implementation(self, options: Any) -> dict[str, Any]:
        return {}

    def add_stages(self, stages: dict, options: object, language: Any) -> None:
        raise RuntimeError(
            "triton-interpret-cpu compiles nothing: set TRITON_INTERPRET=1 so Triton runs kernels "
            "in its interpreter on CPU tensors"
        )

    def load_dialects(self, context: Any) -> None:
        return None

    def get_module_map(self) -> dict[str, Any]:
        return {}
