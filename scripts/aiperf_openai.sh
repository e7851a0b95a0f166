#!/usr/bin/env bash
# AIPerf against a running OpenAI front (`tokenrouter serve --openai-port PORT`): chat,
# streaming, every mode x concurrency, then one table (TTFT, ITL, output tokens/s, requests/s).
# AIPerf lives in its own venv (`python3.11 -m venv .venv-aiperf && .venv-aiperf/bin/pip install aiperf`).
# Usage: scripts/aiperf_openai.sh URL TOKENIZER_DIR OUT_DIR
#   URL            the front, e.g. http://127.0.0.1:9000
#   TOKENIZER_DIR  the exported tokenizer (REPOSITORY/preprocessing/1/tokenizer)
# Env: AIPERF (default .venv-aiperf/bin/aiperf), PYTHON (.venv/bin/python), MODES ("heavy verify route"),
#      CONCURRENCIES ("1 4 8"), REQUESTS_PER_STREAM (6), ISL (64), OSL (48).
# Request rate 20 with max concurrency C, not concurrency alone: AIPerf 0.13's concurrency-only mode
# polls for a free slot without sleeping and holds a core (see bench/aiperf_sweep.py, PACING_RATE).
set -euo pipefail
cd "$(dirname "$0")/.."
URL=$1 TOKENIZER=$2 OUT=$3
mkdir -p "$OUT"
AIPERF=${AIPERF:-.venv-aiperf/bin/aiperf}
# concurrency outer, modes inner (their order rotated per concurrency): the arms compared at one
# concurrency run back to back, so a machine getting busier or quieter hits every mode alike
MODE_LIST=(${MODES:-heavy verify route})
i=0
for c in ${CONCURRENCIES:-1 4 8}; do
  for j in "${!MODE_LIST[@]}"; do
    mode=${MODE_LIST[$(( (i + j) % ${#MODE_LIST[@]} ))]}
    echo "== aiperf: mode $mode, concurrency $c"
    # server token counts: re-tokenizing the answer text can count fewer tokens than were generated;
    # answer_cache false: every mode gets the same synthetic prompts (--random-seed), and a later mode
    # must not draft an earlier one's answers; a cache salt per point keeps the prefix cache from
    # handing one mode another's prompt KV
    "$AIPERF" profile --model tokenrouter --url "$URL" --endpoint-type chat --streaming \
      --concurrency "$c" --request-rate 20 --arrival-pattern constant --request-count $((c * ${REQUESTS_PER_STREAM:-6})) --warmup-request-count 2 \
      --isl "${ISL:-64}" --osl "${OSL:-48}" --random-seed 1 --tokenizer "$TOKENIZER" \
      --use-server-token-count --extra-inputs "router_mode:$mode" --extra-inputs "answer_cache:false" \
      --extra-inputs "cache_salt:aiperf-$mode-c$c" --ui none \
      --artifact-dir "$OUT/$mode-c$c" >"$OUT/$mode-c$c.log" 2>&1 || { tail -20 "$OUT/$mode-c$c.log"; exit 1; }
  done
  i=$((i + 1))
done
"${PYTHON:-.venv/bin/python}" -m tokenrouter_backend.bench.aiperf_table "$OUT"
