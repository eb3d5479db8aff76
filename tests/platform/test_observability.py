"""Prometheus metrics and OpenTelemetry spans of a real server; nothing loaded when off."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import replace

import grpc
import pytest
from helpers.memory import expect_error
from prometheus_client.parser import text_string_to_metric_families
from test_context import CAROLINE, assert_facts, context_stub

from satchel.server.platform.config import ConfigError, Settings
from satchel.v1 import context_pb2 as pb

CONTEXT = "satchel.v1.ContextService"
HANDLED = "grpc_server_handled_total"
_ONE_CALL_LOGGED = """
import asyncio, json, sys

import grpc

from satchel.server.platform.app import SatchelServer
from satchel.server.platform.config import Settings
from satchel.server.platform.logs import configure_logging
from satchel.v1 import context_pb2, context_pb2_grpc

project_id = sys.argv[1]
if Settings.from_env().otel == "global":  # spans recorded in memory, as a collector would get them
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
else:
    exporter = None
configure_logging("info", "json")  # as `satchel serve` does


async def main():
    server = SatchelServer(Settings.from_env())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            request = context_pb2.AssembleContextRequest(
                project_id=project_id, subject_id="user-1", query="Where does Caroline live?"
            )
            reply = await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(request)
    finally:
        await server.stop()
    spans = [
        {
            "name": span.name,
            "trace_id": format(span.context.trace_id, "032x"),
            "span_id": format(span.context.span_id, "016x"),
            "attributes": dict(span.attributes or {}),
        }
        for span in (exporter.get_finished_spans() if exporter else ())
    ]
    facts = len(reply.packet.facts)
    print(json.dumps({"trace_id": reply.trace_id, "facts": facts, "spans": spans}))


asyncio.run(main())
"""


def _rpc(method: str, kind: str, **more: str) -> dict[str, str]:
    """go-grpc-prometheus labels of a ContextService method."""
    return {"grpc_type": kind, "grpc_service": CONTEXT, "grpc_method": method, **more}


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def span_exporter():
    """The process-wide tracer provider (SATCHEL_OTEL=global), recording spans in memory."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


async def test_metrics_and_spans_after_some_calls(
    settings: Settings, project_id: str, span_exporter
) -> None:
    from satchel.server.platform.app import SatchelServer

    observed = SatchelServer(replace(settings, metrics_listen="127.0.0.1:0", otel="global"))
    await observed.start()
    try:
        assert observed.metrics_port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{observed.port}") as chan:
            await assert_facts(chan, project_id, CAROLINE)
            span_exporter.clear()
            stub = context_stub(chan)
            request = {"project_id": project_id, "subject_id": "user-1", "query": "Caroline?"}
            reply = await stub.AssembleContext(pb.AssembleContextRequest(**request))
            await stub.AssembleContext(pb.AssembleContextRequest(**request))
            streamed = [m async for m in stub.StreamContext(pb.StreamContextRequest(**request))]
            code, _, _ = await expect_error(
                stub.AssembleContext(pb.AssembleContextRequest(project_id=project_id))
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert reply.packet.facts and streamed[-1].HasField("packet")
            watching = stub.WatchTraces(pb.WatchTracesRequest(project_id=project_id))
            await watching.initial_metadata()
            samples = await asyncio.to_thread(_scrape, observed.metrics_port)
            assert _value(samples, "satchel_watch_streams") == 1
            watching.cancel()
            cancelled = _rpc("WatchTraces", "server_stream", grpc_code="CANCELLED")
            for _ in range(100):  # the server learns of the cancellation asynchronously
                samples = await asyncio.to_thread(_scrape, observed.metrics_port)
                if _value(samples, HANDLED, **cancelled) == 1:
                    break
                await asyncio.sleep(0.05)

        samples = await asyncio.to_thread(_scrape, observed.metrics_port)
        assemble, stream = _rpc("AssembleContext", "unary"), _rpc("StreamContext", "server_stream")
        # go-grpc-prometheus's names and labels, which dashboards query.
        assert _value(samples, "grpc_server_started_total", **assemble) == 3
        assert _value(samples, HANDLED, **assemble, grpc_code="OK") == 2
        assert _value(samples, HANDLED, **assemble, grpc_code="INVALID_ARGUMENT") == 1
        assert _value(samples, HANDLED, **stream, grpc_code="OK") == 1
        assert _value(samples, "grpc_server_handling_seconds_count", **assemble) == 3
        assert _value(samples, "grpc_server_handling_seconds_sum", **assemble) > 0
        buckets = sorted(
            float(dict(labels)["le"])
            for name, labels in samples
            if name == "grpc_server_handling_seconds_bucket"
            and dict(labels)["grpc_method"] == "AssembleContext"
        )
        fine = [b for b in buckets if 0.005 <= b <= 0.25]
        assert len(fine) >= 12 and max(b / a for a, b in itertools.pairwise(fine)) <= 2.0
        assert _value(samples, "grpc_server_handling_seconds_bucket", **assemble, le="+Inf") == 3
        assert _value(samples, "grpc_server_msg_received_total", **assemble) == 3
        assert _value(samples, "grpc_server_msg_sent_total", **assemble) == 2  # OK replies
        assert _value(samples, "grpc_server_msg_sent_total", **stream) == len(streamed)
        assert _value(
            samples,
            HANDLED,
            grpc_type="unary",
            grpc_service="satchel.v1.MemoryService",
            grpc_method="AssertFact",
            grpc_code="OK",
        ) == len(CAROLINE)
        assert not any(name.startswith("satchel_rpc_handled") for name, _ in samples)
        assert _value(samples, HANDLED, **cancelled) == 1
        assert _value(samples, "satchel_watch_streams") == 0
        for phase in ("embed", "retrieve", "pack", "total"):
            assert _value(samples, "satchel_context_phase_seconds_count", phase=phase) == 3
        assert _value(samples, "satchel_context_phase_seconds_sum", phase="total") > 0
        assert _value(samples, "satchel_context_calls_total", status="ok", served_facts="true") == 3
        # Each hybrid call found the scope's facts in memory or not (no event was ever written:
        # version 0, never held nor counted).
        cache = observed.runtime.value.scope_cache.stats
        for kind, stats in cache.items():
            assert _value(samples, "satchel_scope_cache_hits_total", kind=kind) == stats.hits
            assert _value(samples, "satchel_scope_cache_misses_total", kind=kind) == stats.misses
        assert cache["facts"].hits + cache["facts"].misses == 3
        assert cache["events"].hits + cache["events"].misses == 0
        # The facts' statements and the three queries were embedded.
        assert _value(samples, "satchel_embedding_seconds_count") >= 3
        assert _value(samples, "satchel_embedded_texts_total") >= len(CAROLINE) + 3
        for pool in ("main", "planned"):  # the context calls above used both
            assert _value(samples, "satchel_db_pool_connections", pool=pool, state="size") >= 1
            maximum = _value(samples, "satchel_db_pool_connections", pool=pool, state="max")
            assert maximum == settings.db_pool_max
            assert _value(samples, "satchel_db_pool_requests_total", pool=pool) > 0
        assert ("satchel_watch_listener_connected", ()) in samples
        assert _value(samples, "satchel_watch_listener_connected") == 1
        assert _value(samples, "process_resident_memory_bytes") > 0

        spans = span_exporter.get_finished_spans()
        by_name: dict[str, list] = {}
        for span in spans:
            by_name.setdefault(span.name, []).append(span)
        rpcs = by_name[f"{CONTEXT}/AssembleContext"]
        assert len(rpcs) == 3  # two OK, one INVALID_ARGUMENT
        assert len(by_name[f"{CONTEXT}/StreamContext"]) == 1
        calls = by_name["satchel.context"]
        assert len(calls) == 3
        rpc_ids = {s.context.span_id for s in rpcs + by_name[f"{CONTEXT}/StreamContext"]}
        for call in calls:
            assert call.parent is not None and call.parent.span_id in rpc_ids
            assert call.attributes["satchel.project_id"] == project_id
        call_ids = {s.context.span_id for s in calls}
        for phase in ("embed", "retrieve", "pack"):
            phase_spans = by_name[f"satchel.context.{phase}"]
            assert len(phase_spans) == 3
            assert all(s.parent.span_id in call_ids for s in phase_spans)
        embeds = by_name["satchel.embed"]
        assert all(s.parent is not None and s.parent.span_id in rpc_ids for s in embeds)
        assert {s.attributes["rpc.grpc.status_code"] for s in rpcs} == {0, 3}
    finally:
        await observed.stop()


async def test_nothing_is_imported_when_telemetry_is_off() -> None:
    code = (
        "import sys; from satchel.server.platform.app import SatchelServer;"
        "from satchel.server.platform.config import Settings;"
        "server = SatchelServer(Settings.from_env({}));"
        "assert server.telemetry.interceptor() is None;"
        "print(sorted(m for m in ('prometheus_client', 'opentelemetry') if m in sys.modules))"
    )
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_telemetry_settings_are_validated() -> None:
    assert Settings.from_env({"SATCHEL_OTEL": "otlp"}).otel == "otlp"
    assert Settings.from_env({"SATCHEL_METRICS_LISTEN": "0.0.0.0:9464"}).metrics_listen
    for env in (
        {"SATCHEL_OTEL": "yes"},
        {"SATCHEL_METRICS_LISTEN": "9464"},
        {"SATCHEL_WATCH_QUEUE_TRACES": "0"},
    ):
        with pytest.raises(ConfigError):
            Settings.from_env(env)


async def _one_call_logged(settings: Settings, project_id: str, otel: str) -> tuple[dict, list]:
    """A `satchel serve`-like process (JSON logs on stderr) on the test database, SATCHEL_OTEL
    `otel`, answering one AssembleContext: (the reply's trace id and the exported spans, the log
    lines). A process of its own: structlog caches each logger's configuration at its first use,
    so this process's loggers may already render another way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    env.update(
        SATCHEL_DATABASE_URL=settings.database_url,
        SATCHEL_DATA_DIR=str(settings.data_dir),  # the model cache the session server filled
        SATCHEL_LISTEN="127.0.0.1:0",
        SATCHEL_SCOPE_INDEX_MAX="0",
        SATCHEL_OTEL=otel,
        GRPC_VERBOSITY="NONE",
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _ONE_CALL_LOGGED, project_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    return json.loads(result.stdout.splitlines()[-1]), lines


async def test_log_lines_of_a_call_join_its_spans(
    settings: Settings, channel: grpc.aio.Channel, project_id: str
) -> None:
    """With spans on, a call's log lines carry its OpenTelemetry ids under `trace_id` and
    `span_id` (W3C hex), and satchel's own call id under `satchel_trace_id`."""
    await assert_facts(channel, project_id, CAROLINE[:2])
    called, lines = await _one_call_logged(settings, project_id, "global")
    assert called["facts"] and called["trace_id"]
    rpc_span = next(s for s in called["spans"] if s["name"] == f"{CONTEXT}/AssembleContext")
    (call_span,) = (s for s in called["spans"] if s["name"] == "satchel.context")
    assert call_span["attributes"]["satchel.trace_id"] == called["trace_id"]
    assert call_span["trace_id"] == rpc_span["trace_id"]
    exported = {s["span_id"] for s in called["spans"] if s["trace_id"] == rpc_span["trace_id"]}

    of_call = [line for line in lines if line.get("satchel_trace_id") == called["trace_id"]]
    assert any(line["event"] == "rpc" for line in of_call), lines
    for line in of_call:
        assert line["trace_id"] == rpc_span["trace_id"], line
        assert line["span_id"] in exported, line
    (rpc_line,) = (line for line in of_call if line["event"] == "rpc")
    assert rpc_line["method"] == f"/{CONTEXT}/AssembleContext"
    assert rpc_line["span_id"] == rpc_span["span_id"]
    # `trace_id` is OpenTelemetry's alone, on every line that has one.
    for line in lines:
        if "trace_id" in line:
            assert len(line["trace_id"]) == 32 and int(line["trace_id"], 16), line
            assert len(line["span_id"]) == 16 and int(line["span_id"], 16), line


async def test_log_lines_carry_satchels_trace_id_with_spans_off(
    settings: Settings, channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE[:1])
    called, lines = await _one_call_logged(settings, project_id, "off")
    assert called["trace_id"] and called["spans"] == []
    of_call = [line for line in lines if line.get("satchel_trace_id") == called["trace_id"]]
    assert [line["event"] for line in of_call if line["event"] == "rpc"] == ["rpc"], lines
    assert not [line for line in lines if "trace_id" in line or "span_id" in line]
