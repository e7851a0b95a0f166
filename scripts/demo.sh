#!/usr/bin/env bash
# `make demo`: set up, fetch and export the demo pair, serve it through Triton, send the
# code-completion requests in heavy/verify/route modes, print answers and routing stats, ask one
# chat question through the OpenAI-compatible front, stop. Idempotent: cached
# downloads and an up-to-date export are reused.
# Env: TOKENROUTER_DATA (data dir, default ~/.cache/tokenrouter), DEMO_READY_TIMEOUT (s).
set -euo pipefail
cd "$(dirname "$0")/.."
READY_TIMEOUT=${DEMO_READY_TIMEOUT:-600}   # seconds for tritonserver to load both branches

scripts/setup.sh
PY=.venv/bin/python
TR=.venv/bin/tokenrouter
path_of() { "$PY" -c "from tokenrouter_backend.server import paths; print(paths.$1())"; }
HEAVY=$(path_of demo_heavy_gguf)
LIGHT=$(path_of demo_light_gguf)
REPO=$(path_of demo_repository)
LOGS=$(path_of log_dir)
mkdir -p "$LOGS"

echo "== fetch the demo pair"
"$TR" models fetch-demo

echo "== export it to a Triton model repository: $REPO"
read -r ROUTER ROUTER_THRESHOLD < <("$PY" -c \
  "from tokenrouter_backend.export.demo_pair import DEMO_ROUTER as r, DEMO_ROUTER_THRESHOLD as t; print(r, t)")
"$TR" export --heavy "$HEAVY" --light "$LIGHT" --out "$REPO" --router "$ROUTER" --router-threshold "$ROUTER_THRESHOLD"

echo "== serve it"
read -r HTTP_PORT GRPC_PORT METRICS_PORT OPENAI_PORT < <("$PY" -c \
  "from tokenrouter_backend.server.ports import free_ports; print(*free_ports(4))")
SERVE_OUT="$LOGS/demo-serve.out"
"$TR" serve --repository "$REPO" --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" \
  --metrics-port "$METRICS_PORT" --openai-port "$OPENAI_PORT" --ready-timeout "$READY_TIMEOUT" >"$SERVE_OUT" 2>&1 &
SERVE_PID=$!
stop_server() {
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -TERM "$SERVE_PID"
    wait "$SERVE_PID" || true
  fi
}
trap stop_server EXIT

until grep -q '^ready' "$SERVE_OUT"; do
  if ! kill -0 "$SERVE_PID" 2>/dev/null; then
    echo "demo: tokenrouter serve failed:" >&2
    cat "$SERVE_OUT" >&2
    exit 1
  fi
  sleep 1
done
cat "$SERVE_OUT"
export TOKENROUTER_HTTP_URL="http://127.0.0.1:$HTTP_PORT" TOKENROUTER_GRPC_URL="127.0.0.1:$GRPC_PORT"

echo "== generate: code completion in heavy, verify and route modes; one chat answer (OpenAI endpoint)"
"$PY" -m tokenrouter_backend.client.demo --url "127.0.0.1:$HTTP_PORT" \
  --openai-url "http://127.0.0.1:$OPENAI_PORT/v1"

echo "== stop (logs of the export and the server: $LOGS)"
