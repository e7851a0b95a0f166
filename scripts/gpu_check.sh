#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, export the tiny (and, when present, demo) pair
# for CUDA, run the lossless tests on the GPU and a short step bench; print a summary.
# Sized for < 8 minutes. Needs no network and no venv: it runs the machine's python3 with
# this checkout on PYTHONPATH (the lent GPU machine has torch/CUDA, transformers, onnx,
# onnxruntime, pytest preinstalled; see docs/deployment.md "The lent GPU machine").
#
#   bash scripts/gpu_check.sh            # results in $OUT (device tool) or ./results/gpu_check
#
# Environment (defaults):
#   PYTHON=python3        interpreter that has torch with CUDA
#   DEVICE=cuda           export/bench device (cuda | tensorrt)
#   DEMO_HEAVY, DEMO_LIGHT  demo pair source folders; the demo step is skipped when unset/missing
#   GPU_TEST_ARGS="-m gpu -k lossless"   pytest selection (shell-quoted) for the lossless check
#   T_TINY=180 T_DEMO=200 T_TESTS=120 T_BENCH=60   per-step time limits in seconds
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
RESULTS=${OUT:-results/gpu_check}
WORK=${GPU_CHECK_WORK:-/tmp/tokenrouter-gpu-check}
GPU_TEST_ARGS=${GPU_TEST_ARGS:-"-m gpu -k lossless"}
mkdir -p "$RESULTS" "$WORK"
LOG="$RESULTS/gpu_check.log"
SUMMARY="$RESULTS/gpu_check_summary.txt"
: >"$LOG"; : >"$SUMMARY"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENROUTER_DEVICE="$DEVICE"
FAILED=0

say() { echo "$*" | tee -a "$SUMMARY"; }
# step NAME LIMIT_S CMD...: run with a time limit, log everything, record PASS/FAIL + seconds
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  echo "===== $name: $*" >>"$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1; rc=$?
  local took=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then say "PASS  $name (${took}s)";
  elif [ $rc -eq 124 ]; then say "FAIL  $name: over its ${limit}s limit"; FAILED=1;
  else say "FAIL  $name: exit $rc after ${took}s (see gpu_check.log)"; FAILED=1; fi
  return $rc
}
skip() { say "SKIP  $1: $2"; }

say "== machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
  "$PYTHON" - <<'PY'
import sys
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
except Exception as exc:
    print("torch: missing", exc)
try:
    import onnxruntime as ort, numpy
    print("onnxruntime", ort.__version__, ort.get_available_providers(), "numpy", numpy.__version__)
except Exception as exc:
    print("onnxruntime: missing", exc)
PY
} 2>&1 | tee -a "$SUMMARY"
ORT_DEVICE=$("$PYTHON" -c "import onnxruntime as o; p=o.get_available_providers(); print('$DEVICE' if ('CUDAExecutionProvider' in p) else 'cpu')" 2>/dev/null || echo none)
[ "$ORT_DEVICE" = "$DEVICE" ] || say "NOTE  onnxruntime here has no CUDA execution provider: models run on '$ORT_DEVICE'; the ORT GPU path is NOT checked (carry onnxruntime-gpu to check it)"

say "== tiny pair"
TINY="$WORK/tiny"
if step "tiny pair build" "${T_TINY:-180}" "$PYTHON" -c "
import sys; from export.tiny_pair import build_tiny_pair
h, l = build_tiny_pair(sys.argv[1]); print(h, l)" "$TINY/src"; then
  step "tiny export ($DEVICE)" "${T_TINY:-180}" "$PYTHON" -m tokenrouter_backend export \
    --heavy "$TINY/src/heavy" --light "$TINY/src/light" --out "$TINY/repo" --device "$DEVICE"
fi

say "== demo pair"
if [ -n "${DEMO_HEAVY:-}" ] && [ -e "${DEMO_HEAVY}" ] && [ -n "${DEMO_LIGHT:-}" ] && [ -e "${DEMO_LIGHT}" ]; then
  step "demo export ($DEVICE)" "${T_DEMO:-200}" "$PYTHON" -m tokenrouter_backend export \
    --heavy "$DEMO_HEAVY" --light "$DEMO_LIGHT" --out "$WORK/demo/repo" --device "$DEVICE"
else
  skip "demo export" "DEMO_HEAVY/DEMO_LIGHT not present on this machine"
fi

say "== lossless tests"
# Modules that need packages this machine lacks (tritonclient, the embedded tritonserver)
# fail to collect; they are reported, not fatal. Verdict: >= 1 selected test passed and
# none failed; errors (collection or setup) are listed as WARN lines.
if "$PYTHON" -c "import pytest" 2>/dev/null; then
  echo "===== pytest $GPU_TEST_ARGS" >>"$LOG"
  t0=$SECONDS
  eval "test_args=($GPU_TEST_ARGS)"  # shell-quoted pytest arguments
  timeout "${T_TESTS:-120}" "$PYTHON" -m pytest -q -p no:cacheprovider -rfE \
    --continue-on-collection-errors "${test_args[@]}" tests >"$WORK/pytest.out" 2>&1; rc=$?
  cat "$WORK/pytest.out" >>"$LOG"
  last=$(grep -E "(passed|failed|error|no tests ran)" "$WORK/pytest.out" | tail -1)
  if [ $rc -eq 0 ] || { [ $rc -eq 1 ] && [[ "$last" == *passed* ]] && [[ "$last" != *failed* ]]; }; then
    say "PASS  pytest $GPU_TEST_ARGS ($((SECONDS - t0))s): $last"
  else
    say "FAIL  pytest $GPU_TEST_ARGS (exit $rc): ${last:-no summary}"; FAILED=1
  fi
  grep -E "^ERROR " "$WORK/pytest.out" | sed 's/^/WARN  /' | tee -a "$SUMMARY"
else
  say "FAIL  pytest missing for $PYTHON"; FAILED=1
fi

say "== step bench (median ms, past 128)"
dirs=()
for repo in "$TINY/repo" "$WORK/demo/repo"; do
  for m in heavy light; do [ -f "$repo/$m/1/model.onnx" ] && dirs+=("$repo/$m/1"); done
done
if [ ${#dirs[@]} -gt 0 ] && [ "$ORT_DEVICE" != none ]; then
  step "bench ($ORT_DEVICE)" "${T_BENCH:-60}" "$PYTHON" scripts/gpu_step_bench.py \
    --device "$ORT_DEVICE" --json "$RESULTS/gpu_bench.json" "${dirs[@]}"
  grep -E " ms$" "$LOG" | sed 's/^/      /' | tee -a "$SUMMARY"
else
  skip "bench" "no exported model or no onnxruntime"
fi

say "== result: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL) (total ${SECONDS}s)"
exit $FAILED
