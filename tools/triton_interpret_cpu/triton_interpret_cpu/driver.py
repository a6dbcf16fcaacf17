"""The driver half of the ``cpu`` backend: the CPU as Triton's current target, for the interpreter."""

from __future__ import annotations

from typing import Any

from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase


class CPUInterpretDriver(DriverBase):
    """Active only where no CUDA device is (Triton wants exactly one active driver)."""

    @classmethod
    def is_active(cls) -> bool:
        try:
            import torch
        except ImportError:  # pragma: no cover - vLLM always has torch
            return True
        return not torch.cuda.is_available()

    def map_python_to_cpp_type(self, ty: str) -> str:
        if ty.startswith("*"):
            return "void*"
        return {
            "i1": "bool",
            "i8": "int8_t",
            "i16": "int16_t",
            "i32": "int32_t",
            "i64": "int64_t",
            "u1": "bool",
            "u8": "uint8_t",
            "u16": "uint16_t",
            "u32": "uint32_t",
            "u64": "uint64_t",
            "fp16": "float",
            "bf16": "float",
            "fp32": "float",
            "f32": "float",
            "fp64": "double",
        }.get(ty, "void*")

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cpu", 0, 0)

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        return None

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_device_interface(self) -> Any:
        import torch

        return torch.cpu

    def get_benchmarker(self) -> Any:
        from triton.testing import do_bench

        return do_bench

    def get_empty_cache_for_benchmark(self) -> Any:
        import torch

        return torch.empty(0, dtype=torch.int8)

    def clear_cache(self, cache: Any) -> None:
        return None
