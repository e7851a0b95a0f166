# TokenRouter on the NGC Triton image (25.07: Triton 2.59.1, Python 3.12, CUDA 12.9 — the
# first release with the fixes of NVIDIA's August 2025 bulletin, see docs/security.md).
#   target `serve`  : tritonserver + the tokenrouter package + onnxruntime-gpu (no torch)
#   target `export` : serve + torch (CUDA 12 build) + transformers: runs `tokenrouter export`
# Requirements live in docker/requirements-*.txt (why each pin: see those files and
# docs/deployment.md). The project is installed with --no-deps so its CPU-venv pins
# (torch==2.13.0, nvidia-pytriton, onnxruntime) never enter the image.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.07-py3

FROM ${TRITON_IMAGE} AS serve
# PIP_BREAK_SYSTEM_PACKAGES: Ubuntu 24.04's system Python is marked externally managed
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/tokenrouter
COPY docker/requirements-serve.txt docker/
RUN python3 -m pip install -r docker/requirements-serve.txt
COPY . ./
RUN python3 -m pip install --no-deps . \
 && python3 -c "import tokenrouter_backend, onnxruntime; print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
# An unprivileged user owns /models (a fresh named volume takes this ownership).
RUN useradd --create-home --uid 10001 --user-group tokenrouter \
 && mkdir -p /models && chown tokenrouter:tokenrouter /models
USER tokenrouter
# 8000 HTTP (/v2, /generate), 8001 gRPC, 8002 Prometheus metrics
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
  CMD python3 /opt/tokenrouter/docker/healthcheck.py
CMD ["/opt/tokenrouter/docker/tritonserver.sh", "--model-repository=/models"]

FROM serve AS export
USER root
COPY docker/requirements-export.txt docker/
RUN python3 -m pip install -r docker/requirements-export.txt
USER tokenrouter
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/tokenrouter/docker/export.sh"]
