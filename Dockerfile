# The RollMux image for the coordinator, the node sidecar and the scheduler (charts/rollmux): no torch, non-root.
#   docker build -t rollmux:0.1.0 .
#   docker run --rm rollmux:0.1.0 coordinator --help
# Jobs do not use this image: they add rollmux[verl] (or rollmux) to their own training image.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rollmux/ rollmux/
COPY coordinator/ coordinator/
COPY sidecar/ sidecar/
COPY shim/ shim/
COPY sync_plugin/ sync_plugin/
COPY adapters/ adapters/
COPY k8s/ k8s/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="rollmux" \
      org.opencontainers.image.description="RollMux coordinator, node sidecar and Kubernetes scheduler" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/rollmux/rollmux"
# nvml: the sidecar reads GPU facts and per-process GPU memory through NVML (the driver library comes
# from the NVIDIA container toolkit at run time). torch is an extra and is not installed.
COPY --from=build /wheels/ /wheels/
RUN groupadd --system --gid 10001 rollmux \
    && useradd --system --uid 10001 --gid rollmux --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin rollmux \
    && pip install --no-cache-dir --no-compile /wheels/rollmux-*.whl "nvidia-ml-py>=12,<14" \
    && rm -rf /wheels \
    && python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 50051 8080
ENTRYPOINT ["rollmux"]
CMD ["--help"]
