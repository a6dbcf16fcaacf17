#!/usr/bin/env bash
# The one prepared run for a session lent a GPU: the CUDA graph check (replay us and kernel counts
# of the whole step, R=256, T=8192, P=4), the vLLM drop-in's host and device time per step over the
# vLLM stand-in (benchmarks/bench_adapter_device.py: no vLLM there) and every CUDA test, each log
# under $OUT.
#
#   bash benchmarks/device_check.sh          (from the repository root, on the GPU machine)
#
# Budget: about 6 minutes on one H200 machine (the graph check 1-2, the adapter 1, the tests 2-3),
# at most 560 s (the timeouts: under the device's 600 s a call). It installs nothing: it runs on the
# machine's own python3 and torch, whatever their versions (printed first).
set -uo pipefail
OUT="${OUT:-/tmp/pcp_fn_device}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())" \
    2>&1 | tee "$OUT/env.txt"
timeout 200 python3 benchmarks/cuda_graph_check.py --batches 100 2>&1 | tee "$OUT/cuda_graph_check.txt"
check=${PIPESTATUS[0]}
timeout 120 python3 benchmarks/bench_adapter_device.py --iters 200 2>&1 | tee "$OUT/adapter_device.txt"
adapter=${PIPESTATUS[0]}
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests \
    -k "cuda or device_input_ids" 2>&1 | tee "$OUT/cuda_tests.txt"
tests=${PIPESTATUS[0]}
echo "cuda_graph_check rc=$check; adapter bench rc=$adapter; CUDA tests rc=$tests" | tee "$OUT/summary.txt"
[ "$check" = 0 ] && [ "$adapter" = 0 ] && [ "$tests" = 0 ]
