#!/usr/bin/env bash
# tritonserver with TokenRouter's secure defaults (compose services triton, triton-cpu,
# heavy, router; docs/security.md). Arguments are passed on to tritonserver.
#   TOKENROUTER_RESTRICTED_APIS  Triton APIs that need the admin header (comma list;
#                                default model-repository,model-config,logging,shared-memory,trace;
#                                "none" opens all, refused with explicit/poll model control)
#   TOKENROUTER_ADMIN_KEY        the header's value; unset: a random key per start, written
#                                (mode 0600) to TOKENROUTER_ADMIN_KEY_FILE
#   TOKENROUTER_ADMIN_KEY_FILE   default ~/tokenrouter-admin.key (the image user's home)
#   TOKENROUTER_STUB_WATCH       1 (default): run tritonserver under the stub watchdog
#                                (python3 -m tokenrouter_backend.server.stub_watch), which
#                                exits 3 when a model's Python stub dies so the container
#                                restarts; 0: exec tritonserver directly
#   TOKENROUTER_STUB_WATCH_POLL_S seconds between the watchdog's checks (default 2)
#   TOKENROUTER_MAX_REQUEST_BYTES --http-max-input-size when the tritonserver knows it (Triton
#                                >= 2.59, image 25.07 on): the largest HTTP input / JSON body,
#                                bytes (default 8388608 = 8 MiB, as `tokenrouter serve
#                                --max-request-bytes`); Triton has no gRPC size option (its
#                                gRPC limit is fixed at 2 GiB)
#   PYTHON                       the Python with tokenrouter_backend (default python3)
# HTTP header: tokenrouter-admin-key; gRPC metadata: triton-grpc-protocol-tokenrouter-admin-key.
set -euo pipefail
apis=${TOKENROUTER_RESTRICTED_APIS:-model-repository,model-config,logging,shared-memory,trace}
watch=${TOKENROUTER_STUB_WATCH:-1}
python=${PYTHON:-python3}
case "$watch" in
  0|1) ;;
  *) echo "tritonserver.sh: TOKENROUTER_STUB_WATCH must be 0 or 1, got '$watch'" >&2; exit 2 ;;
esac
key_file=${TOKENROUTER_ADMIN_KEY_FILE:-${HOME:-.}/tokenrouter-admin.key}
max_bytes=${TOKENROUTER_MAX_REQUEST_BYTES:-8388608}
case "$max_bytes" in
  ''|*[!0-9]*|0) echo "tritonserver.sh: TOKENROUTER_MAX_REQUEST_BYTES must be a positive number of bytes," \
                      "got '$max_bytes'" >&2; exit 2 ;;
esac
flags=(--exit-on-error=true --strict-readiness=true)
# Triton 2.59 (25.07) and later know --http-max-input-size; an older one (the wheel's 2.51) would
# refuse to start on it, so ask its --help first
help=$("${TRITONSERVER:-tritonserver}" --help 2>&1 || true)
case "$help" in
  *--http-max-input-size*) flags+=("--http-max-input-size=$max_bytes") ;;
  *) echo "tritonserver.sh: this tritonserver has no --http-max-input-size (Triton < 2.59):" \
          "HTTP request bodies are not size-limited" >&2 ;;
esac
# The model control mode as tritonserver reads it (getopt_long): --model-control-mode=MODE or
# --model-control-mode MODE, any unambiguous prefix of the name (--model-cont...), the value in
# any case; the last one wins.
flag=--model-control-mode
mode=none
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  name=${args[i]%%=*}
  # a prefix of the flag's name at least as long as --model-cont (shorter ones name no option
  # or another one: --model-config-name)
  if [ "${#name}" -lt 12 ] || [ "${flag#"$name"}" = "$flag" ]; then continue; fi
  if [ "$name" != "${args[i]}" ]; then
    mode=${args[i]#*=}
  elif ((i + 1 < ${#args[@]})); then
    i=$((i + 1))
    mode=${args[i]}
  fi
done
case "${mode,,}" in
  explicit|poll)
    case ",$apis," in
      *,model-repository,*) ;;
      *) echo "tritonserver.sh: --model-control-mode ${mode,,} lets clients load models; it needs" \
              "model-repository in TOKENROUTER_RESTRICTED_APIS (now '$apis')" >&2; exit 2 ;;
    esac ;;
esac
if [ "$apis" != "none" ]; then
  key=${TOKENROUTER_ADMIN_KEY:-}
  if [ -z "$key" ]; then
    key=$("$python" -c 'import secrets; print(secrets.token_urlsafe(32))')
    (umask 077 && rm -f "$key_file" && printf '%s\n' "$key" > "$key_file")
    echo "tritonserver.sh: admin APIs ($apis) need the header tokenrouter-admin-key: <the key in $key_file>"
  fi
  case "$key" in
    *[\ ,:=]*) echo "tritonserver.sh: TOKENROUTER_ADMIN_KEY must not contain ' ,:='" >&2; exit 2 ;;
  esac
  [ "${#key}" -ge 16 ] || { echo "tritonserver.sh: TOKENROUTER_ADMIN_KEY needs >= 16 characters" >&2; exit 2; }
  flags+=("--http-restricted-api=$apis:tokenrouter-admin-key=$key"
          "--grpc-restricted-protocol=$apis:tokenrouter-admin-key=$key")
fi
server=("${TRITONSERVER:-tritonserver}" "${flags[@]}" "$@")
if [ "$watch" = 1 ]; then
  exec "$python" -m tokenrouter_backend.server.stub_watch \
    --poll-s "${TOKENROUTER_STUB_WATCH_POLL_S:-2}" -- "${server[@]}"
fi
exec "${server[@]}"
