#!/usr/bin/env bash
# Creates .venv and installs TokenRouter with everything it needs (idempotent, non-interactive).
# Debian packages: libb64-0d (perf_analyzer), docker-compose (the tests validate the
# compose file with its CLI; no Docker engine is needed) and chromium (the replay page is
# checked in headless Chromium); a warning if they cannot be installed.
# Python: the project with its pinned deps and the dev extra (pytest), editable.
# Env: PYTHON (interpreter for the venv, default python3; 3.10-3.13: the Triton wheel ships
# Python-backend stubs for those versions); TOKENROUTER_DATA (pip's log goes to its logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.tokenrouter-installed   # what was installed: pyproject.toml + top-level packages

DEBIAN_PACKAGES="libb64-0d docker-compose chromium"

install_debian_packages() {
  local missing=""
  for pkg in $DEBIAN_PACKAGES; do dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"; done
  [ -z "$missing" ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
  if ! { $sudo apt-get update -qq >/dev/null &&
         DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null; }; then
    echo "setup: warning: could not install$missing (perf_analyzer, compose validation and the replay-page test need them)" >&2
  fi
}

install_debian_packages
"$PY" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))' || {
  echo "setup: $PY is $("$PY" --version 2>&1); TokenRouter needs Python 3.10-3.13" >&2; exit 1; }
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
# The editable install maps the top-level packages that exist when it runs: reinstall when
# pyproject.toml changes or a top-level package appears.
wanted=$(cat pyproject.toml; ls -d ./*/__init__.py 2>/dev/null)
wanted=$(printf '%s' "$wanted" | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$wanted" ]; then
  # pip's output (its own warnings included) goes to a log; on failure its tail is shown
  PIP_LOG="${TOKENROUTER_DATA:-$HOME/.cache/tokenrouter}/logs/setup-pip.log"
  mkdir -p "$(dirname "$PIP_LOG")"
  echo "setup: installing TokenRouter into $VENV (first run takes a few minutes; log: $PIP_LOG)"
  if ! $VENV/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]" >"$PIP_LOG" 2>&1; then
    echo "setup: pip install failed; the end of $PIP_LOG:" >&2
    tail -n 40 "$PIP_LOG" >&2
    exit 1
  fi
  echo "$wanted" > "$STAMP"
fi
