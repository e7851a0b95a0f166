#!/usr/bin/env bash
# GPU check on the torch runtime: build the tiny pair, export it with --runtime torch, then
# (no Triton) check verify == heavy greedy token for token on the GPU through the real block
# loop, time heavy FP16 vs light FP16 steps (batch 1 and 8; tiny pair and a randomly
# initialised Qwen2 1.5B/0.5B-shaped pair) and bench heavy/verify/route tokens/s.
# Sized for < 5 minutes on an H200. No network, no venv: the machine's python3 with this
# checkout on PYTHONPATH (see docs/deployment.md "The GPU check machine").
#
#   bash scripts/gpu_check.sh          # GPU (fails when torch sees no CUDA device)
#   bash scripts/gpu_check.sh --cpu    # the same steps on the CPU (small random shapes)
#
# Results in $OUT when set, else ./results/gpu_check: gpu_check_summary.txt,
# gpu_check.log, gpu_engine.json. Exit status 0 only when every step passed.
#
# Environment (defaults):
#   PYTHON=python3                  interpreter with torch (+ CUDA for the GPU run)
#   SHAPES=1.5b,0.5b (cpu: mini,mini)  random heavy,light shapes for step times; "" = none
#   T_TINY=240 T_ENGINE=300         per-step time limits in seconds
#   GPU_CHECK_WORK=$TOKENROUTER_DATA/gpu_check (data dir default ~/.cache/tokenrouter)
#                                   scratch: the tiny pair and its exported repository
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
[ "${1:-}" = "--cpu" ] && DEVICE=cpu
PYTHON=${PYTHON:-python3}
if [ "$DEVICE" = cuda ]; then SHAPES=${SHAPES-1.5b,0.5b}; else SHAPES=${SHAPES-mini,mini}; fi
RESULTS=${OUT:-results/gpu_check}
WORK=${GPU_CHECK_WORK:-${TOKENROUTER_DATA:-$HOME/.cache/tokenrouter}/gpu_check}
mkdir -p "$RESULTS" "$WORK"
LOG="$RESULTS/gpu_check.log"
SUMMARY="$RESULTS/gpu_check_summary.txt"
: >"$LOG"; : >"$SUMMARY"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
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

say "== machine (device $DEVICE)"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
  "$PYTHON" - <<'PY'
import sys
print("python", sys.version.split()[0], "(venv)" if sys.prefix != sys.base_prefix else "(system)")
try:
    import torch, transformers, numpy
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          "transformers", transformers.__version__, "numpy", numpy.__version__)
except Exception as exc:
    print("torch/transformers: missing", exc)
try:
    import onnxruntime as ort
    print("onnxruntime", ort.__version__, ort.get_available_providers())
except Exception as exc:
    print("onnxruntime: missing", exc)
PY
} 2>&1 | tee -a "$SUMMARY"
if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  say "FAIL  torch sees no CUDA device (use --cpu for the CPU run)"; say "== result: FAIL"; exit 1
fi
say "NOTE  GPU path checked here: the torch runtime. ONNX Runtime's CUDA provider is not (onnxruntime-gpu"
say "      is not installed here); in the docker image its KV round-trips through host memory (docs/deployment.md)."

say "== tiny pair, torch runtime"
TINY="$WORK/tiny"
if step "tiny pair build" "${T_TINY:-240}" "$PYTHON" -c "
import sys; from tokenrouter_backend.export.tiny_pair import build_tiny_pair
print(*build_tiny_pair(sys.argv[1]))" "$TINY/src"; then
  step "tiny export (--runtime torch --device $DEVICE)" "${T_TINY:-240}" "$PYTHON" -m tokenrouter_backend export \
    --heavy "$TINY/src/heavy" --light "$TINY/src/light" --out "$TINY/repo" --device "$DEVICE" --runtime torch
fi

say "== engine check on $DEVICE (block loop + BranchEngine(TorchCausalLM), no Triton)"
if [ -f "$TINY/repo/heavy/1/hf/config.json" ]; then
  step "lossless + step times + bench" "${T_ENGINE:-300}" "$PYTHON" scripts/gpu_engine_check.py \
    --repo "$TINY/repo" --device "$DEVICE" --shapes "$SHAPES" --json "$RESULTS/gpu_engine.json"
  grep -E "^(lossless|  prompt|step |bench )" "$LOG" | sed 's/^/      /' | tee -a "$SUMMARY"
  [ -n "$SHAPES" ] && say "NOTE  random $SHAPES models: random weights, so their acceptance/agreement and" \
    "route numbers mean nothing; their step times and tokens/s are real"
else
  say "FAIL  engine check: no exported tiny repository"; FAILED=1
fi

say "== result: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL) (total ${SECONDS}s)"
exit $FAILED
