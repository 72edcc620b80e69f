#!/usr/bin/env bash
# Everything that needs a GPU, in one command:
#   1. the `gpu` tests (tests/test_gpu.py): bf16 autocast vs fp32, fused vs foreach AdamW, flash / memory-efficient /
#      cuDNN SDPA vs the written-out attention, train.compile vs eager, bit-identical resume, NCCL DDP vs one process;
#   2. bench/gpu.py: tokens/s, MFU (against the measured bf16 peak) and peak memory of model=large (GPT-2 small
#      shape) in bf16, eager and compiled, next to transformers' GPT2LMHeadModel; one markdown table.
# Both always run; the exit status is 1 if either failed, 2 if the check could not start. Extra arguments go to
# bench/gpu.py. Without CUDA it says so and exits 0; LM_ABLATE_TEST_DEVICE=cpu rehearses the whole check on a CPU
# (the tests' CPU variants; give the benchmark a CPU size; 2 min here on 2 cores):
#     LM_ABLATE_TEST_DEVICE=cpu bash scripts/gpu_check.sh --device cpu --model tiny --steps 1 --rounds 1 --warmup 1
#
# On the borrowed GPU machine (python3 3.12 with torch 2.11 + CUDA, transformers, pandas, ...; no network; no
# hydra-core, omegaconf, wandb, datasets, msgspec, submitit, Hydra launchers): first, here, with the registry,
#     . .venv/bin/activate && python scripts/gpu_wheels.py        # -> .gpu_wheels/ (33 wheels, ~26 MiB), seconds
# then ONE device call (one command of at most 10 minutes; the script keeps to LM_ABLATE_GPU_BUDGET_S, 540 s):
#     run(command="LM_ABLATE_GPU_OUT=$OUT bash scripts/gpu_check.sh", carry=[".gpu_wheels"], timeout_s=600)
# There the project is not importable, so the wheels are installed offline (pip --no-index --no-deps --target)
# into a scratch folder put first on PYTHONPATH, with the checkout itself, and that python3 runs everything.
# What comes back, in $LM_ABLATE_GPU_OUT: gpu_check.log (all output), env.txt (versions, GPU), junit.xml (the
# tests) and bench.md (the benchmark's table). Nothing else is written outside the scratch folder and pytest's
# temporary folders.
#
# Environment (all optional):
#   LM_ABLATE_GPU_OUT       the folder for the four files above (default: outputs/gpu_check/<date_time>)
#   LM_ABLATE_GPU_PYTHON    the interpreter (default: .venv/bin/python if there, else python3)
#   LM_ABLATE_GPU_WHEELS    the kit (default: .gpu_wheels, made by scripts/gpu_wheels.py)
#   LM_ABLATE_GPU_SITE      where the kit is installed (default: a new folder under ${TMPDIR:-/tmp}, removed at the end)
#   LM_ABLATE_GPU_PROBE     the modules that must import, else the kit is installed (default: lm_ablate.train pytest)
#   LM_ABLATE_GPU_BUDGET_S  seconds for the whole check (default 540); the tests get at most LM_ABLATE_GPU_TESTS_S
#                           (default 300), the benchmark what is left (at least 60)
set -uo pipefail
HERE=$(pwd)
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
OUT=${LM_ABLATE_GPU_OUT:-$ROOT/outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
case "$OUT" in /*) ;; *) OUT=$HERE/$OUT ;; esac # relative to where it was called from
if ! mkdir -p "$OUT" 2>/dev/null || ! [ -w "$OUT" ]; then
  echo "gpu_check: LM_ABLATE_GPU_OUT=$OUT: cannot create or write that folder" >&2
  exit 2
fi
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check.log

check() {
  local start=$SECONDS budget=${LM_ABLATE_GPU_BUDGET_S:-540} tests_s=${LM_ABLATE_GPU_TESTS_S:-300}
  local py wheels=${LM_ABLATE_GPU_WHEELS:-.gpu_wheels} probe=${LM_ABLATE_GPU_PROBE:-lm_ablate.train pytest}
  case "$budget$tests_s" in
    *[!0-9]*)
      echo "gpu_check: LM_ABLATE_GPU_BUDGET_S=$budget, LM_ABLATE_GPU_TESTS_S=$tests_s: whole seconds expected"
      return 2
      ;;
  esac
  if [ -n "${LM_ABLATE_GPU_PYTHON:-}" ]; then
    py=$LM_ABLATE_GPU_PYTHON
  elif [ -x .venv/bin/python ]; then
    py=$ROOT/.venv/bin/python
  else
    py=python3
  fi
  if ! command -v "$py" >/dev/null; then
    echo "gpu_check: no interpreter $py (LM_ABLATE_GPU_PYTHON)"
    return 2
  fi
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=${WANDB_MODE:-disabled}
  local imports="import ${probe// /, }"
  echo "== gpu_check: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])'); output in $OUT"

  if ! "$py" -c "$imports" 2>/dev/null; then
    # the borrowed machine: no project dependencies, no network -> the kit, offline
    local site=${LM_ABLATE_GPU_SITE:-}
    if ! compgen -G "$wheels/*.whl" >/dev/null; then
      echo "gpu_check: $py cannot $imports, and $wheels/ holds no wheels: run python scripts/gpu_wheels.py here and carry .gpu_wheels"
      return 2
    fi
    if [ -z "$site" ]; then
      site=$(mktemp -d "${TMPDIR:-/tmp}/lm_ablate_gpu_site.XXXXXX") || return 2
      # shellcheck disable=SC2064 # the folder's name now: the variable is gone when the trap runs
      trap "rm -rf '$site'" EXIT
    fi
    echo "== gpu_check: $imports failed: installing $(compgen -G "$wheels/*.whl" | wc -l) wheels from $wheels offline into $site"
    if ! "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$site" "$wheels"/*.whl; then
      echo "gpu_check: pip could not install $wheels/*.whl into $site (see above)"
      return 2
    fi
    export PYTHONPATH="$site:$PYTHONPATH"
    export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 # the kit's pytest, without the machine's own plugins
    "$py" scripts/gpu_wheels.py --verify "$site" ||
      echo "== gpu_check: (requirements above are not met by the machine's own packages; going on)"
    local err
    if ! err=$("$py" -c "$imports" 2>&1); then
      echo "gpu_check: with the kit installed, $imports still fails: $(tail -n 1 <<<"$err")"
      return 2
    fi
    echo "== gpu_check: installed in $((SECONDS - start)) s"
  fi

  if [ "${LM_ABLATE_TEST_DEVICE:-cuda}" = cpu ]; then
    echo "== gpu_check: LM_ABLATE_TEST_DEVICE=cpu: a rehearsal on the CPU (the CPU variants of the gpu tests)"
  elif [ "$("$py" -c 'import torch; print(torch.cuda.is_available())' 2>/dev/null)" != "True" ]; then
    echo "gpu_check: no CUDA device here; nothing to check"
    return 0
  fi
  export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}" # deterministic cuBLAS for the resume test
  {
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    fi
    "$py" - <<'EOF'
import importlib.metadata as md, platform, sys, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print("python", sys.version.split()[0], platform.machine(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| device", gpu, "| cudnn", torch.backends.cudnn.version())
for name in ("transformers", "numpy", "hydra-core", "omegaconf", "pytest", "wandb", "datasets", "msgspec", "triton"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
EOF
  } 2>&1 | tee "$OUT/env.txt"

  echo "== gpu_check: tests (pytest -m gpu tests/test_gpu.py), at most $tests_s s"
  local tests=0 bench=0
  timeout -k 10 "$tests_s" "$py" -m pytest -m gpu -v --durations=10 -p no:xdist -p no:cacheprovider \
    --junitxml="$OUT/junit.xml" tests/test_gpu.py || tests=$?
  [ "$tests" -eq 0 ] || echo # a test cut off by the timeout leaves its line open
  echo "== gpu_check: tests finished with status $tests$([ "$tests" -ne 124 ] || echo ' (timed out)') after $((SECONDS - start)) s"

  local left=$((budget - (SECONDS - start)))
  [ "$left" -ge 60 ] || left=60
  echo "== gpu_check: benchmark (python bench/gpu.py $*), at most $left s"
  timeout -k 10 "$left" "$py" bench/gpu.py --out "$OUT/bench.md" "$@" || bench=$?
  [ "$bench" -eq 0 ] || echo
  echo "== gpu_check: benchmark finished with status $bench$([ "$bench" -ne 124 ] || echo ' (timed out)'); total $((SECONDS - start)) s; files in $OUT"
  if [ "$tests" -ne 0 ] || [ "$bench" -ne 0 ]; then
    return 1
  fi
}

check "$@" 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
