# TokenRouter on the NGC Triton image 26.09 (Triton 2.73.0, Ubuntu 24.04, Python 3.12, CUDA 13):
# the newest release found whose release carries the fixes of every Triton security bulletin
# since 25.07 (the last one needs 26.07; docs/security.md, "Triton versions and the bulletins").
#   target `serve`  : tritonserver + the tokenrouter package + onnxruntime-gpu (no torch)
#   target `export` : serve + torch (CUDA 12 build) + transformers: runs `tokenrouter export`
# Python packages come from hash-pinned lock files (docker/requirements-*.lock, made from
# docker/requirements-*.txt by scripts/lock.sh; docs/deployment.md, "Lock files"), installed
# with --require-hashes. The project is installed with --no-deps so its CPU-venv pins
# (torch==2.13.0, nvidia-pytriton, onnxruntime) never enter the image.
#
# The base image is pinned by digest: TRITON_IMAGE_DIGEST (sha256:...) has no default on
# purpose; a build without it stops at this FROM line ("invalid reference format"). Read the
# digest from the registry you trust and pass it (compose: the TRITON_IMAGE_DIGEST variable;
# docker: --build-arg TRITON_IMAGE_DIGEST=sha256:...); scripts/pin-triton-image.sh reads it
# and writes it to .env. docs/deployment.md, "Pinning the Triton image".
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.09-py3
ARG TRITON_IMAGE_DIGEST

FROM ${TRITON_IMAGE}@${TRITON_IMAGE_DIGEST} AS serve
# PIP_BREAK_SYSTEM_PACKAGES: Ubuntu 24.04's system Python is marked externally managed
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/tokenrouter
COPY docker/requirements-serve.lock docker/
RUN python3 -m pip install --require-hashes --no-deps -r docker/requirements-serve.lock
COPY . ./
RUN python3 -m pip install --no-deps --no-build-isolation . \
 && python3 -c "import tokenrouter_backend, onnxruntime; print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
# The serving user is unprivileged and owns nothing of the model repository: /models stays
# root's (0755), so the models are read-only for it even where a mount is writable. Only the
# export stage's own user writes the repository.
RUN useradd --create-home --uid 10001 --user-group tokenrouter \
 && mkdir -p /models
USER tokenrouter
# 8000 HTTP (/v2, /generate), 8001 gRPC, 8002 Prometheus metrics
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
  CMD python3 /opt/tokenrouter/docker/healthcheck.py
CMD ["/opt/tokenrouter/docker/tritonserver.sh", "--model-repository=/models"]

FROM serve AS export
USER root
COPY docker/requirements-export.lock docker/
RUN python3 -m pip install --require-hashes --no-deps -r docker/requirements-export.lock
# The one-shot export writes the repository as its own user (a fresh named volume takes the
# ownership of /models from the first container that mounts it: this one)
RUN useradd --create-home --uid 10002 --user-group tokenrouter-export \
 && chown tokenrouter-export:tokenrouter-export /models
USER tokenrouter-export
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/tokenrouter/docker/export.sh"]
