#!/usr/bin/env bash
# Make a virtual environment with a vllm-ascend release on its own stack (without an NPU), and this
# checkout of pcp_fn[test] (editable), for vllm-ascend's own unit tests of its PCP manager
# (tests/adapters/test_vllm_ascend_upstream.py) and the lockstep tests against the real package.
#
#   tools/make_vllm_ascend_venv.sh VENV VERSION [PYTHON]   e.g. .va023-venv 0.23.0.post1
#   VENV/bin/python -m pytest -q tests/adapters/test_vllm_ascend_upstream.py
#
# VERSION: a vllm-ascend release (0.23.0.post1, 0.30.0rc2, ...); it runs on the vLLM release of the
# same number without its suffix (0.23.0, 0.30.0; $VLLM_VERSION overrides). PYTHON (default
# python3.10): a command or a path; a pyenv shim whose version is not active falls back to pyenv's
# newest installed 3.10.x (as tools/make_torch_venv.sh).
#
# The recipe, everything from the package index pip is configured with:
#   1. torch==2.10.0 and torchvision==0.25.0 (vllm-ascend's pins; PyPI's torch wheel is the CUDA
#      build, which runs on the CPU), held there by every later install;
#   2. vLLM's requirements/common.txt from its sdist (tools/vllm_sdist.py: sha256 checked, cached in
#      ~/.cache/pcp_fn) without its torch / torchvision / torchaudio lines, then vLLM's wheel with
#      --no-deps (its compiled kernels are never loaded);
#   3. vllm-ascend from its sdist, extracted into VENV/src and installed editable with no custom
#      kernels (COMPILE_CUSTOM_KERNELS=0; SOC_VERSION only names a chip for setup.py), --no-deps and
#      --no-build-isolation, after its requirements.txt (its own pins: transformers, fastapi, ...)
#      without torch's lines and the NPU-only packages (torch-npu, triton-ascend, memfabric /
#      memcache): VA_SKIP;
#   4. pcp_fn[test] from this checkout (editable); torch must still be 2.10.0.
# vllm-ascend's tests/ut/conftest.py puts torch_npu / torch.npu stand-ins in place when there is no NPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 VENV VERSION [PYTHON]" >&2
  exit 2
fi
VENV="$1"
VERSION="$2"
PYTHON="${3:-python3.10}"
# 0.23.0.post1 -> 0.23.0, 0.30.0rc2 -> 0.30.0
VLLM_VERSION="${VLLM_VERSION:-$(echo "$VERSION" | sed -E 's/(\.post[0-9]+|\.?(rc|a|b)[0-9]+|\.dev[0-9]+)+$//')}"
TORCH=2.10.0
TORCHVISION=0.25.0
# vllm-ascend's requirements.txt lines left out: torch's (held above), and the NPU-only packages
# (torch-npu, triton-ascend, memfabric / memcache), which install on no CPU machine
VA_SKIP='^[[:space:]]*(torch|torch-npu|torch_npu|torchvision|torchaudio|triton-ascend|triton_ascend|memfabric_hybrid|memcache_hybrid)([[:space:]<>=!~;\[]|$)'

if ! "$PYTHON" -c "" 2>/dev/null && command -v pyenv >/dev/null; then
  WANT="${PYTHON##*/}"
  WANT="${WANT#python}"
  FOUND="$(pyenv versions --bare | grep -E "^${WANT//./\\.}(\.|$)" | sort -V | tail -n 1 || true)"
  [ -n "$FOUND" ] && PYTHON="$(pyenv root)/versions/$FOUND/bin/python$WANT"
fi
"$PYTHON" -c "import sys; print('python', sys.version.split()[0])"
echo "vllm-ascend $VERSION on vLLM $VLLM_VERSION, torch $TORCH"

VLLM_SDIST="$(python3 "$ROOT/tools/vllm_sdist.py" "$VLLM_VERSION")"
VA_SDIST="$(python3 "$ROOT/tools/vllm_sdist.py" --project vllm-ascend "$VERSION")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m venv "$VENV"
VENV="$(cd "$VENV" && pwd)"
PIP=("$VENV/bin/pip" install -q)
HOLD=("torch==$TORCH" "torchvision==$TORCHVISION")  # in every install: the resolver may not move them
"${PIP[@]}" "${HOLD[@]}"

# vLLM: its common requirements without torch's lines, then its wheel alone
tar -xzf "$VLLM_SDIST" -C "$WORK" "vllm-$VLLM_VERSION/requirements/common.txt"
grep -v -E '^[[:space:]]*(torch|torchvision|torchaudio)([[:space:]<>=!~;\[]|$)' \
  "$WORK/vllm-$VLLM_VERSION/requirements/common.txt" >"$WORK/common.txt"
"${PIP[@]}" "${HOLD[@]}" -r "$WORK/common.txt"
"${PIP[@]}" "${HOLD[@]}" --no-deps "vllm==$VLLM_VERSION"

# vllm-ascend: editable from its extracted sdist (kept in VENV/src: the editable install points there)
SRC="$VENV/src"
mkdir -p "$SRC"
rm -rf "$SRC/vllm_ascend-$VERSION"
tar -xzf "$VA_SDIST" -C "$SRC"
VA_DIR="$SRC/vllm_ascend-$VERSION"
[ -d "$VA_DIR/vllm_ascend" ] || { echo "no vllm_ascend package in $VA_SDIST" >&2; exit 1; }
grep -v -E "$VA_SKIP" "$VA_DIR/requirements.txt" >"$WORK/va-requirements.txt"
"${PIP[@]}" "${HOLD[@]}" -r "$WORK/va-requirements.txt"
COMPILE_CUSTOM_KERNELS=0 SOC_VERSION=ascend910b1 \
  "${PIP[@]}" --no-deps --no-build-isolation -e "$VA_DIR"

# pcp_fn
"${PIP[@]}" "${HOLD[@]}" -e "$ROOT[test]"

"$VENV/bin/python" - "$TORCH" "$VERSION" "$VLLM_VERSION" <<'EOF'
import importlib.metadata as md
import re
import sys

import torch

import pcp_fn

want, ascend, vllm = sys.argv[1:]
# 2.10.0 matches 2.10.0 and 2.10.0+cu128, never 2.10.01
assert re.fullmatch(re.escape(want) + r"([.+].*)?", torch.__version__), (torch.__version__, want)
assert md.version("vllm") == vllm, (md.version("vllm"), vllm)
assert md.version("vllm_ascend") == ascend, (md.version("vllm_ascend"), ascend)
print("torch", torch.__version__, "vllm", vllm, "vllm_ascend", ascend, "pcp_fn", pcp_fn.__file__)
EOF
