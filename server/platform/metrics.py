"""Prometheus metrics of one server (imported only when SATCHEL_METRICS_LISTEN is set).

Each server has its own registry (several servers may share a process, as in the tests) served
over HTTP by prometheus-client on its own thread. Pool and WatchTraces figures are read from the
runtime at scrape time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from satchel.server.platform.config import ConfigError

if TYPE_CHECKING:
    from satchel.server.context.storage.traces import CallRecord
    from satchel.server.platform.runtime import Runtime, RuntimeRef

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# RPC latency (grpc_server_handling_seconds): fine between 5 and 250 ms, where satchel's
# context calls and writes fall, so that p50/p90/p99 read from the histogram are close.
RPC_BUCKETS = (
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
RPC_LABELS = ["grpc_type", "grpc_service", "grpc_method"]


class Metrics:
    """The metrics of one server and the HTTP endpoint that serves them."""

    def __init__(self, runtime: RuntimeRef | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The names and labels of go-grpc-prometheus (what Grafana's gRPC dashboards query).
        self.rpc_started_total = Counter(
            "grpc_server_started",
            "RPCs started on the server.",
            RPC_LABELS,
            registry=r,
        )
        self.rpc_handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, regardless of success or failure, by final code.",
            [*RPC_LABELS, "grpc_code"],
            registry=r,
        )
        self.rpc_duration = Histogram(
            "grpc_server_handling_seconds",
            "Time from an RPC's start to its final status (whole stream for streaming RPCs).",
            RPC_LABELS,
            buckets=RPC_BUCKETS,
            registry=r,
        )
        self.msg_received = Counter(
            "grpc_server_msg_received",
            "Request messages received on the server.",
            RPC_LABELS,
            registry=r,
        )
        self.msg_sent = Counter(
            "grpc_server_msg_sent",
            "Response messages sent by the server.",
            RPC_LABELS,
            registry=r,
        )
        self.rpc_in_flight = Gauge(
            "satchel_rpc_in_flight", "RPCs being served.", ["service", "method"], registry=r
        )
        self.context_phase = Histogram(
            "satchel_context_phase_seconds",
            "Time of each phase of a context call (embed, retrieve, pack, total), from its trace.",
            ["phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.context_calls = Counter(
            "satchel_context_calls",
            "Persisted context calls, by packet status and whether facts were served.",
            ["status", "served_facts"],
            registry=r,
        )
        self.context_tokens = Histogram(
            "satchel_context_tokens_used",
            "Tokens of each served packet.",
            buckets=(0, 50, 100, 200, 400, 800, 1600, 3200, 6400),
            registry=r,
        )
        self.embedding = Histogram(
            "satchel_embedding_seconds",
            "Model time of one embedding batch (queries and ingested texts).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.embedded_texts = Counter(
            "satchel_embedded_texts", "Texts embedded by the model.", registry=r
        )
        self.postgres_restarts = Counter(
            "satchel_embedded_postgres_restarts",
            "Restarts of the embedded PostgreSQL after its postmaster died.",
            registry=r,
        )
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        if runtime is not None:
            r.register(RuntimeCollector(runtime))
        self._http: Any = None
        self._thread: Any = None

    def rpc_started(self, service: str, method: str, kind: str) -> None:
        """An RPC began (`kind`: unary, server_stream, client_stream or bidi_stream)."""
        self.rpc_in_flight.labels(service, method).inc()
        self.rpc_started_total.labels(kind, service, method).inc()

    def rpc_message(self, service: str, method: str, kind: str, *, sent: bool) -> None:
        """One request message received (`sent=False`) or one response message sent."""
        (self.msg_sent if sent else self.msg_received).labels(kind, service, method).inc()

    def rpc_finished(self, service: str, method: str, kind: str, code: str, seconds: float) -> None:
        """An RPC ended with `code` after `seconds`."""
        self.rpc_in_flight.labels(service, method).dec()
        self.rpc_handled.labels(kind, service, method, code).inc()
        self.rpc_duration.labels(kind, service, method).observe(seconds)

    def observe_call(self, call: CallRecord) -> None:
        """The phases of a persisted context call."""
        for phase, ms in (
            ("embed", call.embed_ms),
            ("retrieve", call.retrieve_ms),
            ("pack", call.pack_ms),
            ("total", call.total_ms),
        ):
            self.context_phase.labels(phase).observe(ms / 1000)
        served = "true" if call.facts_served > 0 else "false"
        self.context_calls.labels(call.status, served).inc()
        self.context_tokens.observe(call.tokens_used)

    def observe_embedding(self, seconds: float, texts: int) -> None:
        """One embedding batch."""
        self.embedding.observe(seconds)
        self.embedded_texts.inc(texts)

    async def serve(self, listen: str) -> int:
        """Serve /metrics on `listen` (host:port, port 0 picks one); the bound port."""
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            self._http, self._thread = await asyncio.to_thread(
                start_http_server, int(port), host, self.registry
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(f"SATCHEL_METRICS_LISTEN={listen!r}: {exc}") from exc
        return int(self._http.server_port)

    async def close(self) -> None:
        """Stop the HTTP endpoint."""
        if self._http is not None:
            http, self._http = self._http, None
            await asyncio.to_thread(http.shutdown)
            http.server_close()


class RuntimeCollector(Collector):
    """Connection pool (psycopg_pool get_stats) and WatchTraces figures, read at scrape time."""

    # get_stats() keys exported as counters (cumulative) and their metric names.
    POOL_COUNTERS = (
        ("requests_num", "satchel_db_pool_requests", "Connections requested from the pool."),
        ("requests_queued", "satchel_db_pool_requests_queued", "Requests that had to wait."),
        ("requests_errors", "satchel_db_pool_requests_errors", "Requests that failed (timeout)."),
        ("connections_num", "satchel_db_pool_connections_opened", "Connections opened."),
        ("connections_errors", "satchel_db_pool_connections_errors", "Failed connection attempts."),
        ("connections_lost", "satchel_db_pool_connections_lost", "Connections found broken."),
        ("returns_bad", "satchel_db_pool_returns_bad", "Connections returned in a bad state."),
    )
    POOL_MS_COUNTERS = (
        (
            "requests_wait_ms",
            "satchel_db_pool_wait_seconds",
            "Time spent waiting for a connection.",
        ),
        ("usage_ms", "satchel_db_pool_usage_seconds", "Time connections were checked out."),
    )

    def __init__(self, runtime: RuntimeRef) -> None:
        self._runtime = runtime

    def describe(self) -> list[Metric]:
        # Dynamic: described at collection time, never at registration (runtime not ready).
        return []

    def collect(self) -> Iterator[Metric]:
        runtime = self._runtime.value
        if runtime is None:
            return
        all_stats = {name: pool.get_stats() for name, pool in runtime.pools.items()}
        connections = GaugeMetricFamily(
            "satchel_db_pool_connections",
            "Pool connections by pool (main, planned: the context statements' generic plans)"
            " and state (size: open, available: idle, min/max: bounds).",
            labels=["pool", "state"],
        )
        waiting = GaugeMetricFamily(
            "satchel_db_pool_requests_waiting",
            "Requests waiting for a connection now.",
            labels=["pool"],
        )
        counters = [
            (key, CounterMetricFamily(name, doc, labels=["pool"]), scale)
            for keys, scale in ((self.POOL_COUNTERS, 1), (self.POOL_MS_COUNTERS, 1000))
            for key, name, doc in keys
        ]
        for pool, stats in all_stats.items():
            for state, key in (
                ("size", "pool_size"),
                ("available", "pool_available"),
                ("min", "pool_min"),
                ("max", "pool_max"),
            ):
                connections.add_metric([pool, state], stats.get(key, 0))
            waiting.add_metric([pool], stats.get("requests_waiting", 0))
            for key, family, scale in counters:
                family.add_metric([pool], stats.get(key, 0) / scale)
        yield connections
        yield waiting
        for _, family, _ in counters:
            yield family
        yield from self._scope_cache(runtime)
        hub = runtime.traces
        if hub is not None:
            yield GaugeMetricFamily(
                "satchel_watch_streams", "WatchTraces streams served.", value=hub.watchers
            )
            yield GaugeMetricFamily(
                "satchel_watch_listener_connected",
                "1 when the LISTEN connection is up.",
                value=1 if hub.stats.connected else 0,
            )
            for name, doc, value in (
                ("satchel_watch_notifications", "Calls announced.", hub.stats.notifications),
                (
                    "satchel_watch_dropped_traces",
                    "Calls skipped for watchers that fell behind.",
                    hub.stats.dropped,
                ),
                (
                    "satchel_watch_caught_up",
                    "Calls recovered after a reconnection.",
                    hub.stats.caught_up,
                ),
                ("satchel_watch_reconnects", "Listener reconnections.", hub.stats.reconnects),
            ):
                yield CounterMetricFamily(name, doc, value=value)

    @staticmethod
    def _scope_cache(runtime: Runtime) -> Iterator[Metric]:
        cache = runtime.scope_cache
        yield GaugeMetricFamily(
            "satchel_scope_cache_scopes", "Scopes' events and facts held in memory.", len(cache)
        )
        yield GaugeMetricFamily("satchel_scope_cache_bytes", "Memory they take.", cache.bytes)
        for name, doc in (
            ("hits", "Hybrid calls now that ranked this kind in memory."),
            ("misses", "Hybrid calls now that found this kind not held at their version."),
            ("loads", "Scopes' events or facts read into memory."),
            ("too_large", "Loads beyond the row limit (or with infinite instants)."),
            ("evictions", "Copies dropped for the memory budget."),
            (
                "rejected",
                "Copies not loaded or kept: those they would push out are read about as often.",
            ),
        ):
            family = CounterMetricFamily(f"satchel_scope_cache_{name}", doc, labels=["kind"])
            for kind, stats in cache.stats.items():
                family.add_metric([kind], getattr(stats, name))
            yield family
