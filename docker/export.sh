#!/usr/bin/env bash
# One-shot export into the model-repository volume (compose service `export`).
# Skips when $OUT_DIR/export.json exists, unless FORCE_EXPORT=1 (see docs/deployment.md).
# Environment: HEAVY_SRC, LIGHT_SRC (folders under the read-only /sources bind mount),
# OUT_DIR (default /models), DEVICE (cuda | cpu), EXPORT_ARGS (extra exporter flags).
set -euo pipefail
: "${HEAVY_SRC:?set HEAVY_SRC to the heavy model folder under /sources}"
: "${LIGHT_SRC:?set LIGHT_SRC to the light model folder under /sources}"
OUT_DIR=${OUT_DIR:-/models}
DEVICE=${DEVICE:-cuda}
for src in "$HEAVY_SRC" "$LIGHT_SRC"; do
  [ -e "$src" ] || { echo "export: source model '$src' not found (bind-mount it under /sources)" >&2; exit 2; }
done
if [ -f "$OUT_DIR/export.json" ] && [ "${FORCE_EXPORT:-0}" != "1" ]; then
  echo "export: $OUT_DIR/export.json exists; keeping the repository (FORCE_EXPORT=1 rebuilds)"
  exit 0
fi
# Build into a sibling folder and swap at the end: a failed export never leaves a
# half-written repository where Triton would load it.
tmp="$OUT_DIR/.export-tmp"
rm -rf "$tmp"
tokenrouter export --heavy "$HEAVY_SRC" --light "$LIGHT_SRC" --out "$tmp" --device "$DEVICE" ${EXPORT_ARGS:-}
find "$OUT_DIR" -mindepth 1 -maxdepth 1 ! -name .export-tmp -exec rm -rf {} +
mv "$tmp"/* "$OUT_DIR"/
rmdir "$tmp"
echo "export: repository ready in $OUT_DIR ($DEVICE)"
