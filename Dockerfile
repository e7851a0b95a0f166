# TokenRouter on the NGC Triton image (Triton 2.51, Python 3.10, CUDA 12.6).
#   target `serve`  : tritonserver + the tokenrouter package + onnxruntime-gpu (no torch)
#   target `export` : serve + torch (CUDA 12 build) + transformers: runs `tokenrouter export`
# Requirements live in docker/requirements-*.txt (why each pin: see those files and
# docs/deployment.md). The project is installed with --no-deps so its CPU-venv pins
# (torch==2.13.0, nvidia-pytriton, onnxruntime) never enter the image.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3

FROM ${TRITON_IMAGE} AS serve
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/tokenrouter
COPY docker/requirements-serve.txt docker/
RUN python3 -m pip install -r docker/requirements-serve.txt
COPY . ./
RUN python3 -m pip install --no-deps . \
 && python3 -c "import tokenrouter_backend, onnxruntime; print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
# 8000 HTTP (/v2, /generate), 8001 gRPC, 8002 Prometheus metrics
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
  CMD python3 /opt/tokenrouter/docker/healthcheck.py
CMD ["tritonserver", "--model-repository=/models"]

FROM serve AS export
COPY docker/requirements-export.txt docker/
RUN python3 -m pip install -r docker/requirements-export.txt
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/tokenrouter/docker/export.sh"]
