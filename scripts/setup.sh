#!/usr/bin/env bash
# Create .venv and install lm-ablate into it. torch goes first, pinned, and on a machine without an NVIDIA
# driver from PyTorch's CPU index: PyPI's default Linux torch wheel is the CUDA build (several GB of CUDA
# libraries). Where the CPU index cannot be reached, a plain `pip install torch==2.13.0` (pip's own sources,
# e.g. a local wheel). TORCH_SPEC (pip arguments, e.g. "torch==2.13.0 --index-url URL") overrides the choice.
# Prints one line saying which torch build it chose and why. Idempotent: a second run installs nothing new.
# Sourcing this file (tests do) defines the functions without running anything.
set -euo pipefail

TORCH_PIN=torch==2.13.0
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
NVIDIA_PROC=${LM_ABLATE_NVIDIA_PROC:-/proc/driver/nvidia} # where the kernel driver shows itself (tests move it)

# The reason there is no usable NVIDIA driver, or nothing (exit 1) when there is one.
no_nvidia_driver() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "nvidia-smi not found"
  elif [ ! -e "$NVIDIA_PROC" ]; then
    echo "$NVIDIA_PROC missing"
  else
    return 1
  fi
}

# Exit 0 when URL answers within 5 s (one try, no retries), so an unreachable index costs seconds, not minutes.
reachable() {
  python - "$1" <<'EOF'
import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception:
    sys.exit(1)
EOF
}

install_torch() {
  if python -c "import torch" 2>/dev/null; then
    echo "torch: $(python -c 'import torch; print(torch.__version__)') is already installed in .venv: kept"
    return
  fi
  local why args
  if [ -n "${TORCH_SPEC:-}" ]; then
    read -r -a args <<<"$TORCH_SPEC"
    echo "torch: pip install $TORCH_SPEC (TORCH_SPEC is set)"
  elif ! why=$(no_nvidia_driver); then
    args=("$TORCH_PIN")
    echo "torch: $TORCH_PIN from the default index (NVIDIA driver found: the CUDA build)"
  elif reachable "$TORCH_CPU_INDEX"; then
    args=("$TORCH_PIN" --index-url "$TORCH_CPU_INDEX")
    echo "torch: $TORCH_PIN, CPU build from $TORCH_CPU_INDEX (no NVIDIA driver: $why)"
  else
    args=("$TORCH_PIN")
    echo "torch: $TORCH_PIN from pip's own sources (no NVIDIA driver: $why; $TORCH_CPU_INDEX unreachable;" \
      "a local wheel if pip has one, else PyPI's default build, the CUDA one on Linux: set TORCH_SPEC to choose)"
  fi
  python -m pip install -q "${args[@]}"
}

main() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  local py=${PYTHON:-python3}
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  . .venv/bin/activate
  python -m pip install -q --upgrade pip
  install_torch
  python -m pip install -q -e ".[test,eval]"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
