"""The gRPC server's lifecycle: listen early, become SERVING once the database and model are
ready, drain in-flight calls on stop."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection as grpc_reflection
from psycopg_pool import AsyncConnectionPool

from satchel.server.context.api import ContextServicer
from satchel.server.context.retention import TraceRetention
from satchel.server.context.scope_indexes import ScopeIndexes
from satchel.server.context.watch import TraceHub
from satchel.server.embedding import load_embedder
from satchel.server.memory.api import MemoryServicer
from satchel.server.platform import reflection
from satchel.server.platform.admission import FairAdmission
from satchel.server.platform.auth import AccessInterceptor, KeyCache, Principal
from satchel.server.platform.backoff import Backoff
from satchel.server.platform.config import ConfigError, Settings
from satchel.server.platform.interceptors import ServiceInterceptor
from satchel.server.platform.probe import DatabaseProbe
from satchel.server.platform.processes import WorkerProcesses
from satchel.server.platform.reads import ReadTarget
from satchel.server.platform.runtime import Runtime, RuntimeRef
from satchel.server.platform.storage import keys as key_store
from satchel.server.platform.storage.embedded import EmbeddedPostgres
from satchel.server.platform.storage.migrations import (
    apply_migrations,
    check_embedding_schema,
    page_token_secret,
)
from satchel.server.platform.storage.pool import create_pool
from satchel.server.platform.telemetry import Telemetry
from satchel.server.talents.api import TalentServicer
from satchel.v1 import (
    context_pb2,
    context_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    talent_pb2,
    talent_pb2_grpc,
)

RESTART_BACKOFF = (0.5, 30.0)  # seconds: first, longest wait between embedded restarts

log = structlog.get_logger(__name__)

SERVICE_NAMES = (
    context_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name,
    memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name,
    talent_pb2.DESCRIPTOR.services_by_name["TalentService"].full_name,
)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Health service names for orchestrators' probes (docs/deploy.md "Health: readiness and
# liveness"). Readiness follows the database and the model (as do "" and every satchel.v1
# service name): route calls here or not. Liveness follows the process only: SERVING from the
# moment the server listens until it shuts down, so a database outage never makes a liveness
# probe restart every replica.
READINESS_SERVICE = "satchel.readiness"
LIVENESS_SERVICE = "satchel.liveness"


def grpc_options(settings: Settings) -> list[tuple[str, int]]:
    """gRPC core's settings, sized so that a flood meets back-pressure, then admission.

    A connection may open as many streams at once as a client may have calls running or
    waiting: a client flooding on one connection waits in its own gRPC library (HTTP/2's
    MAX_CONCURRENT_STREAMS, counted as HTTP/2 counts them) instead of being refused and
    retrying. gRPC core keeps the calls the server has not taken yet in a queue, and by default
    cancels some past 1,000 and all past 3,000 (CANCELLED, never seen by satchel, never
    logged): that queue's limits are set far past what admission lets run or wait, which
    refuses with RESOURCE_EXHAUSTED. HTTP/2 flow control bounds the bytes a waiting call holds.
    """
    backlog = 8 * settings.max_calls
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # One process: a port in use is an error, not shared. Several: they share it.
        ("grpc.so_reuseport", int(settings.processes > 1)),
        ("grpc.max_concurrent_streams", settings.max_calls_per_client),
        ("grpc.http.overload_protection", 0),
        ("grpc.server.max_pending_requests", backlog),
        ("grpc.server.max_pending_requests_hard_limit", backlog),
    ]
    # Clients keep one HTTP/2 connection for good: without a maximum age, replicas added
    # behind a load balancer never see the existing clients' calls (docs/deploy.md "Load
    # balancing gRPC").
    if settings.max_connection_age_seconds > 0:
        age_ms = max(1, round(settings.max_connection_age_seconds * 1000))
        options.append(("grpc.max_connection_age_ms", age_ms))
        if settings.max_connection_age_grace_seconds > 0:
            grace_ms = max(1, round(settings.max_connection_age_grace_seconds * 1000))
            options.append(("grpc.max_connection_age_grace_ms", grace_ms))
    return options


def freeze_startup_objects() -> int:
    """Leave what startup made (libraries, the model, protobuf descriptors) out of the cyclic
    garbage collector's full passes, after collecting its garbage; return how many objects.

    A full pass visits every tracked object: ~30 ms of held event loop every ~2.5 s at 250
    calls/s, the p99 of a loaded server; ~1 ms once these are frozen (`benchmarks/load.md`).
    Frozen objects are still freed when no longer referenced; only cycles among them stay.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class SatchelServer:
    """One satchel replica: the gRPC server plus the resources its services need.

    A `worker` (server/platform/processes.py) serves calls on an existing database, listening only
    once
    ready, and runs no maintenance; a primary with SATCHEL_PROCESSES above 1 starts its workers.
    """

    def __init__(self, settings: Settings, *, worker: bool = False) -> None:
        self.settings = settings
        self.worker = worker
        self.workers: WorkerProcesses | None = None
        self.runtime = RuntimeRef()
        self.health = health.aio.HealthServicer()
        self.port: int | None = None
        self.telemetry = Telemetry.from_settings(settings, self.runtime)
        self.metrics_port: int | None = None
        self._embedded: EmbeddedPostgres | None = None
        self._preparing: tuple[asyncio.Future[Any], ...] = ()
        self._server: grpc.aio.Server | None = None
        self._dsn = ""
        self.probe: DatabaseProbe | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self.retention: TraceRetention | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self.scope_indexes: ScopeIndexes | None = None
        self._scope_index_task: asyncio.Task[None] | None = None
        self.postgres_restarts = 0
        self.keys = (
            KeyCache(self._lookup_key, settings.auth_cache_seconds)
            if settings.auth_required()
            else None
        )
        self.access = AccessInterceptor(
            keys=self.keys,
            max_streams_per_client=settings.max_streams_per_client,
            max_watches_per_client=settings.max_watches_per_client,
            admission=FairAdmission(
                settings.active_calls(), settings.max_calls_per_client, settings.max_calls
            ),
            write_admission=FairAdmission(
                settings.active_calls(), settings.max_calls_per_client, settings.max_calls
            ),
            database_up=lambda: self.probe is None or self.probe.up,
        )

    async def start(self) -> None:
        """Listen (NOT_SERVING), prepare database and model, then report SERVING; a worker
        prepares first, then listens."""
        self.settings.require_embedded_database()  # before listening: fail fast
        server = self._build_server()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        # Alive as soon as the process runs; only the graceful shutdown turns it NOT_SERVING.
        await self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        if not self.worker:
            await self._listen(server)
        self.metrics_port = await self.telemetry.start(self.settings.metrics_listen)
        if self.metrics_port is not None:
            log.info(
                "metrics_listening", address=self.settings.metrics_listen, port=self.metrics_port
            )
        self.runtime.value = await self._prepare_runtime()
        if self.worker:  # sharing the port: the kernel must not route to an unready process
            await self._listen(server)
        else:
            await self._start_retention()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self._start_probe()
        log.info(
            "server_ready",
            embedding_model=self.runtime.value.embedder.model_id,
            frozen_objects=freeze_startup_objects(),
        )
        if not self.worker and self.settings.processes > 1 and self.port is not None:
            self.workers = WorkerProcesses(self.settings, self._dsn, self.port)
            self.workers.start()

    def _build_server(self) -> grpc.aio.Server:
        # The telemetry interceptor (when enabled) is outermost: it sees every final status.
        telemetry = self.telemetry.interceptor()
        server = grpc.aio.server(
            interceptors=[
                *([telemetry] if telemetry is not None else []),
                ServiceInterceptor(lambda: self.runtime.value is not None),
                self.access,
            ],
            options=grpc_options(self.settings),
        )
        context_pb2_grpc.add_ContextServiceServicer_to_server(ContextServicer(self.runtime), server)
        memory_pb2_grpc.add_MemoryServiceServicer_to_server(MemoryServicer(self.runtime), server)
        talent_pb2_grpc.add_TalentServiceServicer_to_server(TalentServicer(self.runtime), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, grpc_reflection.SERVICE_NAME), server
        )
        return server

    async def _listen(self, server: grpc.aio.Server) -> None:
        self.port = self._add_port(server)
        await server.start()
        self._server = server
        log.info("server_listening", address=self.settings.listen, port=self.port)
        self._log_access()

    async def _prepare_runtime(self) -> Runtime:
        settings = self.settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)

        def prepare_database() -> str:
            dsn = settings.database_url
            if not dsn:
                self._embedded = EmbeddedPostgres(settings.data_dir)
                dsn = self._embedded.start()
            apply_migrations(dsn)
            self._dsn = dsn
            return dsn

        # Threads cannot be cancelled: a stop during startup waits for them (see `stop`).
        self._preparing = (
            asyncio.ensure_future(asyncio.to_thread(prepare_database)),
            asyncio.ensure_future(asyncio.to_thread(load_embedder, settings)),
        )
        dsn, embedder = await asyncio.shield(asyncio.gather(*self._preparing))
        await asyncio.to_thread(check_embedding_schema, dsn, embedder.dimension, embedder.model_id)
        page_secret = await asyncio.to_thread(page_token_secret, dsn)
        pool, planned_pool = (
            create_pool(
                dsn,
                min_size=settings.db_pool_min,
                max_size=settings.db_pool_max,
                ef_search=settings.hnsw_ef_search,
                timeout=settings.db_pool_timeout,
                connect_timeout=settings.db_connect_timeout,
                statement_timeout=settings.db_statement_timeout_seconds,
                planned=planned,
            )
            for planned in (False, True)
        )
        await asyncio.gather(*(p.open(wait=True, timeout=30) for p in (pool, planned_pool)))
        replicas = [
            ReadTarget(f"replica {i}", *self._replica_pools(url))
            for i, url in enumerate(settings.read_urls(), 1)
        ]
        for replica in replicas:  # a replica down at start is skipped until it answers
            await asyncio.gather(replica.pool.open(wait=False), replica.planned.open(wait=False))
        traces = TraceHub(dsn, pool, queue_size=settings.context.watch_queue_traces)
        await traces.start()
        return Runtime(
            settings=settings,
            pool=pool,
            planned_pool=planned_pool,
            embedder=embedder,
            telemetry=self.telemetry,
            traces=traces,
            page_secret=page_secret,
            replicas=replicas,
        )

    def _replica_pools(self, dsn: str) -> tuple[AsyncConnectionPool, AsyncConnectionPool]:
        """A replica's two pools, like the primary's; a call waits at most 1 s for one of
        their connections before the replica is left alone (`ReadRouter`)."""
        settings = self.settings
        main, planned = (
            create_pool(
                dsn,
                min_size=1,
                max_size=settings.db_pool_max,
                ef_search=settings.hnsw_ef_search,
                timeout=min(1.0, settings.db_pool_timeout),
                connect_timeout=settings.db_connect_timeout,
                statement_timeout=settings.db_statement_timeout_seconds,
                planned=planned,
            )
            for planned in (False, True)
        )
        return main, planned

    def _add_port(self, server: grpc.aio.Server) -> int:
        """Listen with TLS when SATCHEL_TLS_CERT/KEY are set (client certificates required
        when SATCHEL_TLS_CLIENT_CA is set), else in plain text."""
        settings = self.settings
        try:
            if settings.tls_cert is None or settings.tls_key is None:
                return server.add_insecure_port(settings.listen)
            client_ca = settings.tls_client_ca.read_bytes() if settings.tls_client_ca else None
            credentials = grpc.ssl_server_credentials(
                [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())],
                root_certificates=client_ca,
                require_client_auth=client_ca is not None,
            )
            return server.add_secure_port(settings.listen, credentials)
        except RuntimeError as exc:  # grpcio: "Failed to bind to address …"
            raise ConfigError(
                f"SATCHEL_LISTEN {settings.listen}: cannot listen there (is the port in use?)"
            ) from exc

    def _log_access(self) -> None:
        settings = self.settings
        if settings.auth_required():
            auth, why = "required", "SATCHEL_AUTH" if settings.auth else "not loopback only"
        else:
            auth, why = "disabled", "SATCHEL_AUTH" if settings.auth else "loopback only"
        tls = "off" if settings.tls_cert is None else "on"
        if settings.tls_client_ca is not None:
            tls = "mutual"
        log.info("server_access", auth=auth, auth_reason=why, tls=tls)
        if auth == "disabled":
            log.warning(
                "auth_disabled",
                detail=f"satchel.v1 calls need no API key ({why}); set SATCHEL_AUTH=required",
            )

    async def _lookup_key(self, key_hash: bytes) -> Principal | None:
        async with self.runtime().pool.connection() as conn:
            found = await key_store.find_active_key(conn, key_hash)
        return Principal(key_id=str(found[0]), project_id=found[1]) if found else None

    def _start_probe(self) -> None:
        runtime = self.runtime.value
        if runtime is None or not self._dsn:
            return

        async def on_change(up: bool) -> None:
            status = health_pb2.HealthCheckResponse
            await self._set_health(status.SERVING if up else status.NOT_SERVING)
            supervising = self._supervisor is not None and not self._supervisor.done()
            if not up and self._embedded is not None and not supervising:
                self._supervisor = asyncio.create_task(
                    self._supervise_postgres(), name="postgres-supervisor"
                )

        self.probe = DatabaseProbe(
            self._dsn,
            list(runtime.pools.values()),
            interval=self.settings.db_probe_seconds,
            timeout=max(1.0, min(3.0, self.settings.db_pool_timeout)),
            on_change=on_change,
        )
        self._probe_task = asyncio.create_task(self.probe.run(), name="database-probe")

    async def _start_retention(self) -> None:
        """The trace maintenance (a first run before serving, then on its schedule) and the scope
        index maintenance."""
        runtime = self.runtime.value
        if runtime is None:
            return
        self.retention = TraceRetention(
            runtime.pool,
            retention_days=self.settings.trace_retention_days,
            interval=self.settings.trace_maintenance_seconds,
        )
        await self.retention.try_once()
        self._retention_task = asyncio.create_task(self.retention.run(), name="trace-retention")
        # In the background: a large scope's first build may take minutes, and until its
        # indexes are ready the scope is served by the global ones. With SCOPE_INDEX_MAX 0 it
        # drops the indexes an earlier configuration built.
        self.scope_indexes = ScopeIndexes.from_settings(self.settings, self._dsn)
        self._scope_index_task = asyncio.create_task(self.scope_indexes.run(), name="scope-indexes")

    async def _supervise_postgres(self) -> None:
        """While the database is down, start the embedded PostgreSQL again whenever its
        postmaster is not running (backoff 0.5 s doubling to 30 s after a failed start); the
        probe then finds it back and health turns SERVING. Each restart is logged and counted
        (`satchel_embedded_postgres_restarts`). Nothing stops it but the database coming back
        or the server stopping: every failure is logged and tried again."""
        backoff = Backoff(*RESTART_BACKOFF)
        while self.probe is not None and not self.probe.up and self._embedded is not None:
            embedded = self._embedded
            try:
                if not await asyncio.to_thread(embedded.is_running):
                    await asyncio.to_thread(embedded.restart)
                    self.postgres_restarts += 1
                    self.telemetry.observe_postgres_restart()
                    log.warning("embedded_postgres_restarted", restarts=self.postgres_restarts)
                backoff.reset()
                delay = backoff.initial  # look again shortly: the probe may not have seen it yet
            except Exception as exc:  # not yet (its old backends may still hold memory)
                delay = backoff.next()
                log.warning(
                    "embedded_postgres_restart_failed",
                    error=f"{type(exc).__name__}: {exc}",
                    retry_s=delay,
                    exc_info=True,
                )
            await asyncio.sleep(delay)

    async def _set_health(self, status: int) -> None:
        """Set readiness (`status`: a HealthCheckResponse.ServingStatus value): the overall
        status, `satchel.readiness` and each satchel.v1 service (never liveness)."""
        for name in ("", READINESS_SERVICE, *SERVICE_NAMES):
            await self.health.set(name, status)

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def stop(self) -> None:
        """Refuse new calls, let in-flight ones finish within the grace period, release all."""
        tasks = (self._probe_task, self._supervisor, self._retention_task, self._scope_index_task)
        for task in tasks:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._probe_task = self._supervisor = self._retention_task = None
        self._scope_index_task = None
        await self.health.enter_graceful_shutdown()
        # The workers drain beside this process; the database stops once they are gone.
        workers = [asyncio.create_task(self.workers.stop())] if self.workers else []
        if self.runtime.value is not None and self.runtime.value.traces is not None:
            # Watch streams never end on their own: end them now (UNAVAILABLE, watch again
            # elsewhere) instead of holding the drain for the whole grace period.
            await self.runtime.value.traces.close()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_seconds)
        runtime, self.runtime.value = self.runtime.value, None
        if runtime is not None:
            await runtime.scope_cache.close()
            for pool in runtime.pools.values():
                await pool.close()
            await runtime.reads.close()
            runtime.executor.shutdown(wait=False, cancel_futures=True)
        # Stopped during startup: let the database finish starting, then stop it below.
        await asyncio.gather(*self._preparing, *workers, return_exceptions=True)
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None
        await self.telemetry.stop()
        log.info("server_stopped")
