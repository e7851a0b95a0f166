#!/usr/bin/env bash
# Creates .venv and installs TokenRouter with everything it needs (idempotent, non-interactive).
# Debian packages: libb64-0d (perf_analyzer). Python: the project with its pinned deps.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! dpkg -s libb64-0d >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libb64-0d >/dev/null
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.tokenrouter-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[dev]"
  touch "$stamp"
fi
