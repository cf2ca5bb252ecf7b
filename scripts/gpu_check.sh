#!/usr/bin/env bash
# The hardware check on one NVIDIA GPU (docs/hardware.md, "Measured on"): run from the working tree,
# installs nothing, writes everything under $OUT (default ./gpu-check-out) as gpu-check.tar.gz
# (re-packed after every step, so a run stopped at its time limit still returns what it did)
# plus log.txt. Needs JAX with its CUDA plugin, numpy, scipy, rich, hypothesis, ml_dtypes, pytest.
#
#   bash scripts/gpu_check.sh                 # at most BUDGET=520 s; one H100/H200 with 16 cores
#   EXAMPLES=100 PROCESSES=12 RUN_LIMIT=300 SKIP="accuracy_cpu" bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
PY=${PYTHON:-python3}
EXAMPLES=${EXAMPLES:-15}
PROCESSES=${PROCESSES:-8}
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CONFORMANCE_COMPILE_CACHE=off
LOG="$OUT/log.txt"
pack() { tar czf "$OUT/gpu-check.tar.gz" -C "$WORK" . 2>/dev/null; }
BUDGET=${BUDGET:-520}  # seconds for the whole check (one 10-minute device call, start-up excluded)
SKIP=" ${SKIP:-} "  # step names to leave out, e.g. SKIP="accuracy_cpu oracle_cpu"
step() {  # step NAME LIMIT CMD...: run CMD for at most LIMIT s (less if the budget is running out)
  local name=$1 limit=$2; shift 2
  if [[ "$SKIP" == *" $name "* ]]; then echo "=== $name: skipped (SKIP)" | tee -a "$LOG"; return 0; fi
  local left=$((BUDGET - SECONDS - 15))
  (( limit > left )) && limit=$left
  if (( limit < 10 )); then echo "=== $name: skipped, budget spent" | tee -a "$LOG"; return 0; fi
  local t0=$SECONDS
  echo "=== $name (limit ${limit} s): $*" | tee -a "$LOG"
  timeout --kill-after=5 "$limit" "$@" > "$WORK/$name.txt" 2>&1
  local rc=$?
  tail -n 40 "$WORK/$name.txt" >> "$LOG"
  echo "=== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$LOG"
  pack
  return 0
}

step env 40 bash -c "nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  $PY -c 'import sys, jax, jaxlib, numpy; print(sys.version); print(jax.__version__, jaxlib.__version__, numpy.__version__); print(jax.devices()); print(jax.devices()[0].client.platform_version)'; \
  $PY -m pip list 2>/dev/null | grep -i -E '^(jax|jaxlib|numpy|scipy|hypothesis|rich|ml.dtypes|pytest|nvidia-(cublas|cuda-runtime|cudnn|nccl))'; nproc; lscpu | grep -i 'model name'"
step hardware 60 $PY -m xla_backend info --platform cuda --hardware
# Plain-JAX probes of the numerics where XLA:GPU may differ (scripts/gpu_confirm.py), then oracle
# mode on single-device realistic programs (scripts/gpu_oracle.py).
step confirm 60 env JAX_PLATFORMS=cuda $PY scripts/gpu_confirm.py
step oracle_cuda 90 env JAX_PLATFORMS=cuda XLA_BACKEND_PLATFORM=cuda $PY scripts/gpu_oracle.py --json "$WORK/oracle_cuda.jsonl"
# XLA:GPU's distance from correctly rounded for every op of refsim's accuracy contract.
step accuracy_cuda 70 env JAX_PLATFORMS=cuda $PY -m bench.accuracy --samples 200000 --json "$WORK/accuracy_cuda.jsonl"
# The suite on the GPU: every suite, the largest mesh the machine has (every GPU).
step run "${RUN_LIMIT:-240}" $PY -m conformance run --platform cuda --examples "$EXAMPLES" --processes "$PROCESSES" \
  --shrink-seconds 5 --case-timeout 90 --no-progress --report "$WORK/report"
# Baselines on this machine's XLA:CPU, and the project's GPU preflight test.
step accuracy_cpu 40 env JAX_PLATFORMS=cpu $PY -m bench.accuracy --samples 200000 --json "$WORK/accuracy_cpu.jsonl"
step oracle_cpu 60 env JAX_PLATFORMS=cpu XLA_BACKEND_DEVICES=1 $PY scripts/gpu_oracle.py --json "$WORK/oracle_cpu.jsonl"
step confirm_cpu 30 env JAX_PLATFORMS=cpu $PY scripts/gpu_confirm.py
step pytest_gpu 120 $PY -m pytest -q -p no:cacheprovider -m gpu tests/conformance/engine/test_hardware_gpu.py
rm -rf "$WORK/report/repros/__pycache__"
pack
echo "packed: $OUT/gpu-check.tar.gz ($(du -h "$OUT/gpu-check.tar.gz" | cut -f1))" | tee -a "$LOG"
