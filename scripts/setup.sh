#!/usr/bin/env bash
# Creates .venv and installs TokenRouter with everything it needs (idempotent, non-interactive).
# Debian packages: libb64-0d (perf_analyzer), docker-compose (the tests validate the
# compose file with its CLI; no Docker engine is needed) and chromium (the replay page is
# checked in headless Chromium); a warning if they cannot be installed.
# Python: the dependencies and the dev extra (pytest) from requirements.lock (exact versions,
# every file's sha256 checked: pip --require-hashes; made by scripts/lock.sh, docs/deployment.md
# "Lock files"), then the project itself, editable. The lock is for CPython 3.11 on Linux x86_64;
# another Python or machine installs pyproject's version ranges instead, with a warning.
# Env: PYTHON (interpreter for the venv, default python3; 3.10-3.13: the Triton wheel ships
# Python-backend stubs for those versions); TOKENROUTER_DATA (pip's log goes to its logs/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.tokenrouter-installed   # what was installed: pyproject.toml + lock + top-level packages
LOCK=requirements.lock
LOCK_PYTHON=3.11                     # the Python and machine requirements.lock was made for
LOCK_MACHINE=x86_64

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
wanted=$(cat pyproject.toml "$LOCK"; ls -d ./*/__init__.py 2>/dev/null)
wanted=$(printf '%s' "$wanted" | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$wanted" ]; then
  # pip's output (its own warnings included) goes to a log; on failure its tail is shown
  PIP_LOG="${TOKENROUTER_DATA:-$HOME/.cache/tokenrouter}/logs/setup-pip.log"
  mkdir -p "$(dirname "$PIP_LOG")"
  echo "setup: installing TokenRouter into $VENV (first run takes a few minutes; log: $PIP_LOG)"
  pip=($VENV/bin/python -m pip install -q --disable-pip-version-check)
  venv_python=$($VENV/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$venv_python" = "$LOCK_PYTHON" ] && [ "$(uname -m)" = "$LOCK_MACHINE" ]; then
    install() {
      "${pip[@]}" --require-hashes --no-deps -r "$LOCK" &&
        "${pip[@]}" --no-deps --no-build-isolation -e . &&
        $VENV/bin/python -m pip check
    }
  else
    echo "setup: warning: $LOCK is for Python $LOCK_PYTHON on $LOCK_MACHINE, this is Python $venv_python on" \
         "$(uname -m): installing pyproject.toml's version ranges, without the lock's hashes" >&2
    install() { "${pip[@]}" -e ".[dev]"; }
  fi
  if ! install >"$PIP_LOG" 2>&1; then
    echo "setup: pip install failed; the end of $PIP_LOG:" >&2
    tail -n 40 "$PIP_LOG" >&2
    exit 1
  fi
  echo "$wanted" > "$STAMP"
fi
