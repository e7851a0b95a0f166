#!/usr/bin/env bash
# Regenerates the hash-pinned lock files with uv (docs/deployment.md, "Lock files"):
#   requirements.lock               `make setup`'s venv: pyproject.toml's dependencies + the dev
#                                   extra, for CPython 3.11 on Linux x86_64 (manylinux_2_35:
#                                   the nvidia-pytriton wheel's platform), torch's CPU build
#   docker/requirements-serve.lock  the serve image (docker/requirements-serve.txt, Python 3.12)
#   docker/requirements-export.lock the export image (docker/requirements-export.txt)
# Every version exact, every file's sha256 listed; pip installs them with --require-hashes.
# Env: UV (the uv binary; default: .venv/bin/uv, else uv on PATH), TORCH_FIND_LINKS (where
# torch's CPU wheels lie, a folder or an index page; default $PIP_FIND_LINKS): pyproject's
# torch==2.13.0 must resolve to the CPU build (2.13.0+cpu), which the package index does not
# carry. Arguments are passed on to every `uv pip compile` (e.g. --upgrade-package NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-}
if [ -z "$UV" ]; then
  if [ -x .venv/bin/uv ]; then UV=.venv/bin/uv; else UV=$(command -v uv || true); fi
fi
[ -n "$UV" ] || { echo "lock: uv not found (pip install uv, or set UV)" >&2; exit 2; }
torch_links=${TORCH_FIND_LINKS:-${PIP_FIND_LINKS:-}}
[ -n "$torch_links" ] || {
  echo "lock: set TORCH_FIND_LINKS to where torch's CPU wheels (torch-2.13.0+cpu) lie" >&2; exit 2; }

header() {  # $1: what the lock is for
  printf '# %s\n# Made by scripts/lock.sh (uv pip compile --generate-hashes); do not edit: edit the\n# sources and rerun it. Installed with pip install --require-hashes --no-deps.\n' "$1"
}

compile() {  # $1: output, $2: header text, then uv arguments
  local out=$1 what=$2
  shift 2
  local tmp
  tmp=$(mktemp)
  "$UV" pip compile --quiet --generate-hashes --no-header --no-annotate -o "$tmp" "$@"
  { header "$what"; cat "$tmp"; } > "$out"
  rm -f "$tmp"
}

compile requirements.lock \
  "make setup's venv (pyproject.toml + the dev extra): CPython 3.11, Linux x86_64, CPU torch" \
  pyproject.toml --extra dev --python-version 3.11 --python-platform x86_64-manylinux_2_35 \
  --find-links "$torch_links" "$@"
grep -q '^torch==2\.13\.0+cpu ' requirements.lock || {
  echo "lock: torch did not resolve to its CPU build 2.13.0+cpu (TORCH_FIND_LINKS=$torch_links)" >&2
  exit 1; }
for image in serve export; do
  compile "docker/requirements-$image.lock" \
    "the $image image (docker/requirements-$image.txt): CPython 3.12 of the NGC Triton image, Linux x86_64" \
    "docker/requirements-$image.txt" --python-version 3.12 --python-platform x86_64-manylinux_2_28 "$@"
done
echo "lock: requirements.lock docker/requirements-serve.lock docker/requirements-export.lock"
