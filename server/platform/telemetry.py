"""Observability of one server: Prometheus metrics and OpenTelemetry spans, both off by default.

`Telemetry()` is a no-op. `Telemetry.from_settings` enables metrics when `SATCHEL_METRICS_LISTEN`
is set (`satchel.server.platform.metrics`, prometheus-client) and spans when `SATCHEL_OTEL` is not
`off`
(`satchel.server.platform.tracing`, the optional `otel` dependencies); neither library is imported
otherwise. Everything here is self-contained: one interceptor of its own (outermost, so it sees
the final status of every call) and a few `observe_*` calls from the code it measures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

# go-grpc-prometheus's grpc_type label, by grpc method handler attribute.
GRPC_TYPES = {
    "unary_unary": "unary",
    "unary_stream": "server_stream",
    "stream_unary": "client_stream",
    "stream_stream": "bidi_stream",
}

if TYPE_CHECKING:
    from satchel.server.context.storage.traces import CallRecord
    from satchel.server.platform.config import Settings
    from satchel.server.platform.metrics import Metrics
    from satchel.server.platform.runtime import RuntimeRef
    from satchel.server.platform.tracing import Tracing


class Telemetry:
    """Metrics and spans of one server; every method is cheap and a no-op when disabled."""

    def __init__(self, metrics: Metrics | None = None, tracing: Tracing | None = None) -> None:
        self.metrics = metrics
        self.tracing = tracing

    @classmethod
    def from_settings(cls, settings: Settings, runtime: RuntimeRef | None = None) -> Telemetry:
        """What the settings enable (nothing is imported for what they do not)."""
        metrics = tracing = None
        if settings.metrics_listen:
            from satchel.server.platform.metrics import Metrics

            metrics = Metrics(runtime)
        if settings.otel != "off":
            from satchel.server.platform.tracing import Tracing

            tracing = Tracing(settings.otel)
        return cls(metrics, tracing)

    @property
    def enabled(self) -> bool:
        """True when metrics or spans are on."""
        return self.metrics is not None or self.tracing is not None

    def interceptor(self) -> grpc.aio.ServerInterceptor | None:
        """The interceptor counting and timing every RPC (None when disabled)."""
        return TelemetryInterceptor(self) if self.enabled else None

    def span(
        self, name: str, attributes: Mapping[str, Any] | None = None
    ) -> AbstractContextManager[Any]:
        """A span around a block (a null context when spans are off)."""
        if self.tracing is None:
            return nullcontext()
        return self.tracing.span(name, attributes)

    def observe_call(self, call: CallRecord) -> None:
        """A persisted context call: its phase durations as metrics and spans."""
        if self.metrics is not None:
            self.metrics.observe_call(call)
        if self.tracing is not None:
            self.tracing.record_call(call)

    def observe_embedding(self, seconds: float, texts: int) -> None:
        """One embedding batch (model time, any thread)."""
        if self.metrics is not None:
            self.metrics.observe_embedding(seconds, texts)

    def observe_postgres_restart(self) -> None:
        """The embedded PostgreSQL was started again after its postmaster died."""
        if self.metrics is not None:
            self.metrics.postgres_restarts.inc()

    async def start(self, listen: str) -> int | None:
        """Serve metrics on `listen` (host:port); the bound port, or None when off."""
        if self.metrics is None or not listen:
            return None
        return await self.metrics.serve(listen)

    async def stop(self) -> None:
        """Stop serving metrics and flush spans."""
        if self.metrics is not None:
            await self.metrics.close()
        if self.tracing is not None:
            self.tracing.shutdown()


def status_name(context: grpc.aio.ServicerContext[Any, Any], interrupted: bool = False) -> str:
    """The final status of a call as a name (OK, NOT_FOUND…; CANCELLED when the peer left)."""
    code: grpc.StatusCode | int | None = context.code()  # grpc-stubs: StatusCode only
    if isinstance(code, int):  # grpc.aio reports the status as a cygrpc integer
        code = next((s for s in grpc.StatusCode if s.value[0] == code), grpc.StatusCode.UNKNOWN)
    if code is not None:
        return code.name
    return "CANCELLED" if interrupted or context.cancelled() else "OK"


class TelemetryInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every RPC by service, method and final code; one span per RPC."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        service, _, method = details.method.lstrip("/").rpartition("/")
        kinds = (
            ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
            ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
            ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
            ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
        )
        for attribute, make, streams in kinds:
            inner = getattr(handler, attribute)
            if inner is not None:
                wrap = self._wrap_stream if streams else self._wrap_unary
                rpc = _Rpc(service, method, GRPC_TYPES[attribute])
                return make(
                    wrap(rpc, inner),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    @contextmanager
    def _measure(self, rpc: _Rpc, context: grpc.aio.ServicerContext[Any, Any]) -> Iterator[None]:
        metrics, tracing = self._telemetry.metrics, self._telemetry.tracing
        service, method = rpc.service, rpc.method
        started = time.perf_counter()
        code = "UNKNOWN"
        if metrics is not None:
            metrics.rpc_started(service, method, rpc.kind)
            if rpc.kind in ("unary", "server_stream"):  # the request is already read
                metrics.rpc_message(service, method, rpc.kind, sent=False)
        span = tracing.rpc_span(service, method, context) if tracing is not None else nullcontext()
        try:
            with span as current:
                interrupted = False
                try:
                    yield
                except (asyncio.CancelledError, GeneratorExit):
                    interrupted = True  # the peer left or its deadline passed
                    raise
                finally:
                    code = status_name(context, interrupted)
                    if tracing is not None:
                        tracing.end_rpc(current, code)
        finally:
            if metrics is not None:
                elapsed = time.perf_counter() - started
                metrics.rpc_finished(service, method, rpc.kind, code, elapsed)

    def _sent(self, rpc: _Rpc) -> None:
        if self._telemetry.metrics is not None:
            self._telemetry.metrics.rpc_message(rpc.service, rpc.method, rpc.kind, sent=True)

    def _wrap_unary(
        self, rpc: _Rpc, inner: Callable[..., Any]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._measure(rpc, context):
                reply = await inner(request, context)
                self._sent(rpc)
                return reply

        return behaviour

    def _wrap_stream(
        self, rpc: _Rpc, inner: Callable[..., Any]
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
        async def behaviour(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            with self._measure(rpc, context):
                async for message in inner(request, context):
                    yield message
                    self._sent(rpc)

        return behaviour


@dataclass(frozen=True, slots=True)
class _Rpc:
    """One method as the metrics label it."""

    service: str
    method: str
    kind: str  # go-grpc-prometheus grpc_type: unary, server_stream, client_stream, bidi_stream
