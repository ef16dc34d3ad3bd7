# syntax=docker/dockerfile:1
# nnserve image: the KServe v2 / Triton server for TNN and PNNX models.
#
#   docker build -t nnserve .                            # CPU image (python:3.11-slim), the default
#   docker build -t nnserve:cuda --build-arg VARIANT=cuda .   # CUDA image with the `cuda` extra
#   docker run -p 8000-8002:8000-8002 nnserve            # serves the baked-in model_repository/ from /models
#   docker run -v $PWD/my_repo:/models:ro nnserve        # a mounted repository replaces the baked-in one
#
# The builder stages turn the checkout into wheels (nnserve plus every dependency); the runtime stages install
# only those wheels, with the same command deploy/README.md documents, and carry no compiler.

ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_VERSION=12.6.3
ARG CUDA_UBUNTU=ubuntu24.04

# ---- builders: one per variant, then the shared wheel build -------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder-cpu
ENV NNSERVE_EXTRAS=server
# A C toolchain only for dependencies that ship no wheel for this platform (e.g. on arm64); never in the runtime.
RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

FROM nvidia/cuda:${CUDA_VERSION}-devel-${CUDA_UBUNTU} AS builder-cuda
ENV NNSERVE_EXTRAS=server,cuda
# pycuda (the `cuda` extra) compiles against the CUDA headers of this devel image.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
    && rm -rf /var/lib/apt/lists/*

FROM builder-${VARIANT} AS builder
ENV PATH=/opt/build/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/build && pip install --upgrade pip wheel "grpcio>=1.85.1" "protobuf>=7.35.1"
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY proto/ proto/
COPY engine/ engine/
COPY server/ server/
# The gRPC stubs and the model-config module are committed (tools/gen_protos.py makes them from proto/): check that
# they import, without protoc, before they go into the wheel.
RUN python3 -c "import server.protocol.grpc"
RUN pip wheel --wheel-dir wheels ".[${NNSERVE_EXTRAS}]"

# ---- runtimes: one per variant, then the shared install -----------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime-cpu
ENV NNSERVE_EXTRAS=server

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${CUDA_UBUNTU} AS runtime-cuda
ENV NNSERVE_EXTRAS=server,cuda NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Ubuntu 24.04 images ship a user `ubuntu` with UID/GID 1000, which the shared runtime stage gives to nnserve.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && (userdel --remove ubuntu 2>/dev/null || true)

FROM runtime-${VARIANT} AS runtime
# NUMBA_CACHE_DIR: compiled kernels go to a writable directory (an emptyDir under readOnlyRootFilesystem).
ENV PATH=/opt/nnserve/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/var/cache/nnserve/numba
RUN python3 -m venv /opt/nnserve
WORKDIR /
RUN --mount=type=bind,from=builder,source=/src/wheels,target=/wheels \
    pip install --no-index --find-links wheels "nnserve[${NNSERVE_EXTRAS}]"
RUN groupadd --system --gid 1000 nnserve \
    && useradd --system --uid 1000 --gid 1000 --home-dir /home/nnserve --create-home nnserve \
    && mkdir -p /var/cache/nnserve/numba && chown -R 1000:1000 /var/cache/nnserve
# The bundled models; mount a volume on /models (or pass --model-repository) to serve your own.
COPY --chown=0:0 model_repository/ /models/
USER 1000:1000
WORKDIR /home/nnserve
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2).status != 200)"]
ENTRYPOINT ["nnserve", "serve"]
CMD ["--model-repository", "/models"]
