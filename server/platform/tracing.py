"""OpenTelemetry spans (imported only when SATCHEL_OTEL is not `off`; `pip install satchel[otel]`).

Modes: `otlp` exports to an OTLP/gRPC collector (the standard OTEL_EXPORTER_OTLP_* variables,
default localhost:4317), `console` prints spans on stderr, `global` uses the process's tracer
provider (configured by `opentelemetry-instrument` or the embedding program).

Spans: one per RPC (server kind, parent taken from incoming `traceparent` metadata), one per
embedding batch, and per context call `satchel.context` with children `satchel.context.embed`,
`.retrieve` and `.pack`. The phase spans are recorded from the call's trace timings once it is
persisted: their durations are exact, laid end to end from the call's start (retrieval and
packing interleave when multi-hop runs; their time is summed per phase, as in the trace).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import grpc

from satchel.server.platform.config import ConfigError

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ConfigError(
        "SATCHEL_OTEL needs the optional dependencies: pip install 'satchel[otel]'"
    ) from exc

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.util.types import AttributeValue

    from satchel.server.context.storage.traces import CallRecord

INSTRUMENTATION = "satchel"
# The codes that mark a server span as failed (OpenTelemetry's gRPC conventions).
SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def _sdk_provider(mode: str) -> SdkTracerProvider:
    """The SDK provider satchel creates for `console` and `otlp`."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    provider = TracerProvider(resource=Resource.create({"service.name": "satchel"}))
    if mode == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError(
                "SATCHEL_OTEL=otlp needs opentelemetry-exporter-otlp-proto-grpc"
                " (pip install 'satchel[otel]')"
            ) from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class Tracing:
    """The tracer of one server and the spans satchel records."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        # The provider satchel created, which shutdown() stops (None: the global one).
        self._owned = None if mode == "global" else _sdk_provider(mode)
        self.provider: trace.TracerProvider = (
            trace.get_tracer_provider() if self._owned is None else self._owned
        )
        self.tracer = self.provider.get_tracer(INSTRUMENTATION)

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """A span (child of the current one) around a block."""
        with self.tracer.start_as_current_span(name, attributes=dict(attributes or {})) as span:
            yield span

    @contextmanager
    def rpc_span(
        self, service: str, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Iterator[Any]:
        """The server span of one RPC, continuing the caller's trace when it sent one."""
        carrier = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        parent = propagate.extract(carrier)
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        with self.tracer.start_as_current_span(
            f"{service}/{method}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @staticmethod
    def end_rpc(span: Any, code: str) -> None:
        """Mark the RPC span with its final status code."""
        if span is None:
            return
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode[code].value[0])
        if code in SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, code))

    def record_call(self, call: CallRecord) -> None:
        """The spans of a persisted context call, from its timings (see the module doc)."""
        end = time.time_ns()
        start = end - int(call.total_ms * 1e6)
        attributes: dict[str, AttributeValue] = {
            "satchel.trace_id": str(call.trace_id),
            "satchel.project_id": call.project_id,
            "satchel.subject_id": call.subject_id,
            "satchel.budget_tokens": call.budget_tokens,
            "satchel.tokens_used": call.tokens_used,
            "satchel.facts_served": call.facts_served,
            "satchel.episodes_served": call.episodes_served,
            "satchel.status": call.status,
        }
        parent = self.tracer.start_span("satchel.context", start_time=start, attributes=attributes)
        context = trace.set_span_in_context(parent)
        at = start
        for phase, ms in (
            ("embed", call.embed_ms),
            ("retrieve", call.retrieve_ms),
            ("pack", call.pack_ms),
        ):
            child = self.tracer.start_span(f"satchel.context.{phase}", context, start_time=at)
            at += int(ms * 1e6)
            child.end(end_time=at)
        parent.end(end_time=end)

    def shutdown(self) -> None:
        """Flush and stop the provider satchel created (never the global one)."""
        if self._owned is not None:
            self._owned.shutdown()
