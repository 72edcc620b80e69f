#!/usr/bin/env bash
# Everything that needs a GPU, in one command (< 8 minutes on one H100/H200-class GPU):
#   1. the `gpu` tests (tests/test_gpu.py): bf16 autocast vs fp32, fused vs foreach AdamW, flash / memory-efficient /
#      cuDNN SDPA vs the written-out attention, train.compile vs eager, bit-identical resume, NCCL DDP vs one process;
#   2. bench/gpu.py: tokens/s, MFU (against the measured bf16 peak) and peak memory of model=large (GPT-2 small
#      shape) in bf16, eager and compiled, next to transformers' GPT2LMHeadModel; one markdown table.
# Both always run; the exit status is non-zero if either failed. Extra arguments go to bench/gpu.py.
# Without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .venv/bin/activate ]; then
  . .venv/bin/activate
fi
if [ "$(python -c 'import torch; print(torch.cuda.is_available())')" != "True" ]; then
  echo "gpu_check: no CUDA device here; nothing to check"
  exit 0
fi
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # deterministic cuBLAS for the resume test
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== gpu_check: tests (pytest -m gpu tests/test_gpu.py)"
tests=0
timeout 360 python -m pytest -m gpu -q -p no:xdist -p no:cacheprovider tests/test_gpu.py || tests=$?
echo "== gpu_check: tests finished with status $tests after $((SECONDS - start)) s"

echo "== gpu_check: benchmark (python bench/gpu.py $*)"
bench=0
timeout 300 python bench/gpu.py "$@" || bench=$?
echo "== gpu_check: benchmark finished with status $bench; total $((SECONDS - start)) s"
if [ "$tests" -ne 0 ] || [ "$bench" -ne 0 ]; then
  exit 1
fi
