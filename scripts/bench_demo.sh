#!/usr/bin/env bash
# Partial benchmark run on the demo pair (research/notebook/2026-11-30-demo-pair-bench.md): code completion +
# a HumanEval subset, heavy/verify/route arms + the transformers peers, 64 new tokens.
# Usage: scripts/bench_demo.sh [OUT] [PER_WORKLOAD]
# Env: PY (default .venv/bin/python, from `make setup`), DEMO (default $TOKENROUTER_DATA/demo,
# the data dir defaulting to ~/.cache/tokenrouter; `tokenrouter models fetch-demo` fills it)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEMO=${DEMO:-${TOKENROUTER_DATA:-$HOME/.cache/tokenrouter}/demo}
OUT=${1:-bench_results/demo}
PER=${2:-4}
mkdir -p "$OUT"
PYTHONPATH=. "$PY" -m tokenrouter_backend.cli.main bench \
  --repo "$DEMO/repository" \
  --heavy "$DEMO/heavy/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
  --light "$DEMO/light/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
  --modes heavy,verify,route --thresholds 0.7,0.9 \
  --workloads code,humaneval --per-workload "$PER" --max-tokens 64 --out "$OUT"
