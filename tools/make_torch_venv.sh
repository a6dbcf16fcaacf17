#!/usr/bin/env bash
# Make a virtual environment with one torch release and this checkout of pcp_fn[test] (editable), for
# the suites that CI runs on more than one torch / Python (tests/core, tests/layouts).
#
#   tools/make_torch_venv.sh VENV PYTHON TORCH_VERSION   e.g. .py310-venv python3.10 2.10.0
#   VENV/bin/python -m pytest -q tests/core tests/layouts
#
# PYTHON: a command or a path; a pyenv shim whose version is not active (python3.10 -> "command not
# found") falls back to pyenv's newest installed 3.10.x. The torch wheel is the index's own (on PyPI
# the CUDA build, with its nvidia wheels, ~3 GB; it runs on the CPU).
#
# A machine may cap torch with a global pip constraint file (pip.conf's `constraint =`): these commands
# lift it (PIP_CONSTRAINT points at an empty file, which replaces the configured one), and only them.
# After the install, torch must still be the requested release (pip did not replace it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -ne 3 ]; then
  echo "usage: $0 VENV PYTHON TORCH_VERSION" >&2
  exit 2
fi
VENV="$1"
PYTHON="$2"
TORCH="$3"
if ! "$PYTHON" -c "" 2>/dev/null && command -v pyenv >/dev/null; then
  # python3.10 -> the newest installed 3.10.x
  WANT="${PYTHON##*/}"
  WANT="${WANT#python}"
  FOUND="$(pyenv versions --bare | grep -E "^${WANT//./\\.}(\.|$)" | sort -V | tail -n 1 || true)"
  [ -n "$FOUND" ] && PYTHON="$(pyenv root)/versions/$FOUND/bin/python$WANT"
fi
"$PYTHON" -c "import sys; print('python', sys.version.split()[0])"
NOCAP="$(mktemp)"
trap 'rm -f "$NOCAP"' EXIT
"$PYTHON" -m venv "$VENV"
# torch first and pinned again beside pcp_fn: the resolver may not pick another release
PIP_CONSTRAINT="$NOCAP" "$VENV/bin/pip" install -q "torch==$TORCH"
PIP_CONSTRAINT="$NOCAP" "$VENV/bin/pip" install -q "torch==$TORCH" -e "$ROOT[test]"
"$VENV/bin/python" - "$TORCH" <<'EOF'
import re
import sys

import torch

import pcp_fn

want = sys.argv[1]
# 2.10.0 matches 2.10.0 and 2.10.0+cu128, never 2.10.01 or (for a want of 2.1) 2.15.0
assert re.fullmatch(re.escape(want) + r"([.+].*)?", torch.__version__), (torch.__version__, want)
print("torch", torch.__version__, "pcp_fn", pcp_fn.__file__)
EOF
