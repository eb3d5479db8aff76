# syntax=docker/dockerfile:1
# Production image: pass SATCHEL_DATABASE_URL (PostgreSQL >= 15 with pgvector >= 0.8).
# Without it the server starts an embedded PostgreSQL in SATCHEL_DATA_DIR (demo use only).

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY satchel ./satchel
COPY client ./client
COPY server ./server
COPY migrations ./migrations
# Every dependency at the version the tests ran with (constraints.txt, from scripts/lock).
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt .

FROM python:3.11-slim-bookworm
RUN useradd --create-home --uid 10001 satchel \
    && mkdir -p /var/lib/satchel \
    && chown satchel:satchel /var/lib/satchel
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
ENV SATCHEL_LISTEN=0.0.0.0:50051 \
    SATCHEL_DATA_DIR=/var/lib/satchel \
    PYTHONUNBUFFERED=1
# Derive the default model's quantized graph once, here, rather than at a container's first start.
RUN python -c "from pathlib import Path; from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder; FastEmbedEmbedder(cache_dir=Path('/var/lib/satchel/cache'))"
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["satchel", "healthcheck"]
ENTRYPOINT ["satchel"]
CMD ["serve"]
