#!/usr/bin/env bash
# Pins the NGC Triton base image by digest (docs/deployment.md, "Pinning the Triton image"):
# asks the registry for the digest of the image the Dockerfile names (its manifest list, the
# reference `docker pull` and FROM resolve) and writes TRITON_IMAGE_DIGEST=sha256:... into the
# compose environment file, which `docker compose build` passes to the Dockerfile. Run it on a
# machine that reaches the registry (docker login nvcr.io where needed), review the change,
# keep the file with the deployment.
# Env: TRITON_IMAGE (default: the Dockerfile's ARG TRITON_IMAGE), ENV_FILE (default: .env beside
# docker-compose.yml), DOCKER (default: docker; needs the buildx plugin).
set -euo pipefail
cd "$(dirname "$0")/.."
image=${TRITON_IMAGE:-$(sed -n 's/^ARG TRITON_IMAGE=//p' Dockerfile)}
env_file=${ENV_FILE:-.env}
[ -n "$image" ] || { echo "pin-triton-image: no ARG TRITON_IMAGE in the Dockerfile" >&2; exit 2; }
digest=$("${DOCKER:-docker}" buildx imagetools inspect "$image" --format '{{.Manifest.Digest}}')
if ! [[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]]; then
  echo "pin-triton-image: the registry's answer for $image is not a sha256 digest: '$digest'" >&2
  exit 1
fi
touch "$env_file"
{ grep -v '^TRITON_IMAGE_DIGEST=' "$env_file" || true; echo "TRITON_IMAGE_DIGEST=$digest"; } > "$env_file.tmp"
mv "$env_file.tmp" "$env_file"
echo "pin-triton-image: $image@$digest -> $env_file"
