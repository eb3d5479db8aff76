"""SATCHEL_PROCESSES=2: one port served by two processes on one embedded database.

`satchel serve` runs as a subprocess. Calls on many connections must be served by both processes
(each log line names its pid), a trace written by one must be read through the other, a killed
worker must be started again, and SIGTERM must stop every process and then the database.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.memory import fact_request
from helpers.memory import stub as memory_stub
from helpers.servers import SATCHEL, embedded_serve_env, logged_port, poll
from test_shutdown import _alive, _postmaster, _stop_leftover

from satchel.v1 import context_pb2, context_pb2_grpc

pytestmark = pytest.mark.slow

CONNECTIONS = 16  # the kernel hashes each to a process: all on one would be a 1 in 2^15 chance
PROJECT = "processes"
QUERY = {"project_id": PROJECT, "subject_id": "user-1", "query": "Where does Caroline live?"}


def _events(log_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_path.read_text().splitlines() if line[:1] == "{"]


def _ready_pids(log_path: Path) -> list[int]:
    return [e["pid"] for e in _events(log_path) if e["event"] == "server_ready"]


async def _call_on_fresh_connections(
    target: str, log_path: Path
) -> tuple[list[context_pb2.AssembleContextResponse], set[int]]:
    """One AssembleContext on each of CONNECTIONS new connections; the replies, and the pids
    that logged those calls. Each trace is then read back through another connection, whichever
    process wrote it."""
    # A connection of its own per channel: gRPC would otherwise share one between them.
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CONNECTIONS)
    ]
    try:
        replies = await asyncio.gather(
            *(
                context_pb2_grpc.ContextServiceStub(c).AssembleContext(
                    context_pb2.AssembleContextRequest(**QUERY), timeout=60
                )
                for c in channels
            )
        )
        traces = [
            await context_pb2_grpc.ContextServiceStub(c).GetTrace(
                context_pb2.GetTraceRequest(project_id=PROJECT, trace_id=r.trace_id), timeout=30
            )
            for c, r in zip(reversed(channels), replies, strict=True)
        ]
        assert [t.trace.trace_id for t in traces] == [r.trace_id for r in replies]
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    served_by = {
        e["pid"]
        for e in _events(log_path)
        if e["event"] == "rpc" and e["method"].endswith("AssembleContext")
    }
    return replies, served_by


async def test_two_processes_share_the_port_restart_a_dead_worker_and_stop_together(
    test_root: Path,
) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="processes-", dir=test_root))
    log_path = data_dir / "serve.log"
    env = embedded_serve_env(data_dir, SATCHEL_PROCESSES="2")
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([SATCHEL, "serve"], env=env, stdout=log_file, stderr=log_file)
    try:
        await _run_scenario(proc, log_path, data_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        for pid in {e["pid"] for e in _events(log_path)} - {proc.pid}:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(_stop_leftover, data_dir / "pg")


async def _run_scenario(proc: subprocess.Popen, log_path: Path, data_dir: Path) -> None:
    target = f"127.0.0.1:{await logged_port(proc, log_path)}"

    async def both_ready() -> bool:
        assert proc.poll() is None, log_path.read_text()
        return len(set(_ready_pids(log_path))) == 2

    assert await poll(both_ready, timeout=180, interval=0.2), log_path.read_text()
    primary = proc.pid
    (worker,) = set(_ready_pids(log_path)) - {primary}

    async with grpc.aio.insecure_channel(target) as channel:
        await memory_stub(channel).AssertFact(
            fact_request(PROJECT, predicate="home", statement="Caroline lives in Lisbon")
        )
    replies, served_by = await _call_on_fresh_connections(target, log_path)
    assert served_by == {primary, worker}, "one process served every connection"
    assert all("Lisbon" in r.packet.facts[0].statement for r in replies)

    os.kill(worker, signal.SIGKILL)

    async def worker_replaced() -> bool:
        assert proc.poll() is None, log_path.read_text()
        return len(set(_ready_pids(log_path)) - {primary, worker}) == 1

    assert await poll(worker_replaced, timeout=120, interval=0.2), log_path.read_text()
    (replacement,) = set(_ready_pids(log_path)) - {primary, worker}
    _, served_after = await _call_on_fresh_connections(target, log_path)
    assert replacement in served_after, "the restarted worker serves no connection"
    exited = next(e for e in _events(log_path) if e["event"] == "worker_exited")
    assert (exited["worker_pid"], exited["exit_code"]) == (worker, -signal.SIGKILL)
    found = _postmaster(data_dir / "pg")
    assert found is not None

    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 60) == 0, log_path.read_text()
    assert not _alive(replacement), "the worker outlived its primary"

    async def postgres_gone() -> bool:
        return not _alive(found[0])

    assert await poll(postgres_gone, timeout=10), "the embedded PostgreSQL is still running"
    events = _events(log_path)
    stopped = {e["pid"]: i for i, e in enumerate(events) if e["event"] == "server_stopped"}
    assert set(stopped) == {primary, replacement}
    database_stopped = next(
        i for i, e in enumerate(events) if e["event"] == "embedded_postgres_stopped"
    )
    assert events[database_stopped]["pid"] == primary
    assert stopped[replacement] < database_stopped < stopped[primary], "stopped out of order"
