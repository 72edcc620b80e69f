#!/usr/bin/env bash
# Create .venv and install lm-ablate into it. torch goes first, pinned: the CPU wheel where there is no GPU
# (an unpinned torch would pull a multi-GB CUDA build). Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
TORCH=${TORCH_SPEC:-torch==2.13.0}
python -c "import torch" 2>/dev/null || python -m pip install -q "$TORCH"
python -m pip install -q -e ".[test]"
