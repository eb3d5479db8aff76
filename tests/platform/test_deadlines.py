"""Deadlines: a call past its deadline stops its database work and gives its connection back.

Each call is held by a table lock taken by the test, so that it is certainly inside PostgreSQL
when its deadline passes; the test then watches `pg_stat_activity` for the waiting statement.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import psycopg
import pytest
from helpers.memory import event_request, fact_request, row_counts
from helpers.memory import stub as memory_stub
from helpers.servers import channel_to, poll, running

from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2

SUBJECT = "user-1"


async def _waiting_on_locks(watcher: psycopg.AsyncConnection, locker_pid: int) -> int:
    cur = await watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> %s",
        (locker_pid,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _waiting_trace_inserts(watcher: psycopg.AsyncConnection) -> int:
    cur = await watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE '%%INSERT INTO context_calls%%'"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _pool_idle(server: Any) -> bool:
    stats = server.runtime.value.pool.get_stats()
    return stats["pool_available"] == stats["pool_size"]


async def _blocked_call_gives_up(
    pg_dsn: str,
    server: Any,
    table: str,
    call: Callable[[], Awaitable[Any]],
    expected: grpc.StatusCode = grpc.StatusCode.DEADLINE_EXCEEDED,
) -> float:
    """Run `call` while `table` is locked: it must fail with `expected`, its statement must
    stop waiting, and the pool must be idle again. Returns how long the call took."""
    async with (
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as watcher,
        await psycopg.AsyncConnection.connect(pg_dsn) as locker,
    ):
        await locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        pending = asyncio.ensure_future(call())

        async def waiting() -> bool:
            return await _waiting_on_locks(watcher, locker.info.backend_pid) > 0

        async def stopped() -> bool:
            return not await waiting()

        assert await poll(waiting), "the call never reached the database"
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await pending
        took = time.monotonic() - started
        assert failed.value.code() == expected, failed.value.details()
        assert await poll(stopped), "the statement kept waiting after the deadline"
        await locker.rollback()
    assert await poll(lambda: _pool_idle(server)), "the call kept its pooled connection"
    return took


async def _context_stub_with_a_fact(
    channel: grpc.aio.Channel, project_id: str
) -> context_pb2_grpc.ContextServiceStub:
    """A context stub, once the scope holds the fact every deadline test asks about."""
    await memory_stub(channel).AssertFact(fact_request(project_id, statement="Caroline sings"))
    return context_pb2_grpc.ContextServiceStub(channel)


async def _context_calls(pg_dsn: str, project_id: str) -> int:
    """How many context calls of the project were persisted."""
    return await _count(
        pg_dsn, "SELECT count(*) FROM context_calls WHERE project_id = %s", project_id
    )


async def test_a_unary_context_call_past_its_deadline_stops_its_statement(
    channel: grpc.aio.Channel, server: Any, pg_dsn: str, project_id: str
) -> None:
    stub = await _context_stub_with_a_fact(channel, project_id)
    request = context_pb2.AssembleContextRequest(
        project_id=project_id, subject_id=SUBJECT, query="Does Caroline sing?"
    )
    took = await _blocked_call_gives_up(
        pg_dsn, server, "context_calls", lambda: stub.AssembleContext(request, timeout=3)
    )
    assert took < 8
    rows = await _context_calls(pg_dsn, project_id)
    assert rows == 0, "a call past its deadline persists nothing"
    reply = await stub.AssembleContext(request, timeout=30)
    assert reply.packet.facts, "the server still serves afterwards"


async def test_a_unary_context_call_cancelled_by_its_client_stops_its_statement(
    channel: grpc.aio.Channel, server: Any, pg_dsn: str, project_id: str
) -> None:
    stub = await _context_stub_with_a_fact(channel, project_id)
    request = context_pb2.AssembleContextRequest(
        project_id=project_id, subject_id=SUBJECT, query="Does Caroline sing?"
    )
    async with (
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as watcher,
        await psycopg.AsyncConnection.connect(pg_dsn) as locker,
    ):
        # Hold the trace table: the call reads its candidates, then waits to persist its trace.
        await locker.execute("LOCK TABLE context_calls IN ACCESS EXCLUSIVE MODE")
        call = stub.AssembleContext(request)  # no deadline: only the cancel can end it

        async def inserting() -> bool:
            return await _waiting_trace_inserts(watcher) > 0

        async def not_inserting() -> bool:
            return await _waiting_trace_inserts(watcher) == 0

        assert await poll(inserting), "the call never reached its trace insert"
        assert call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await call.code() == grpc.StatusCode.CANCELLED
        assert await poll(not_inserting), "the statement kept waiting after the cancel"
        await locker.rollback()
    assert await poll(lambda: _pool_idle(server)), "the cancelled call kept its pooled connection"
    rows = await _context_calls(pg_dsn, project_id)
    assert rows == 0, "a cancelled call persists nothing"
    reply = await stub.AssembleContext(request, timeout=30)
    assert reply.packet.facts, "the server still serves afterwards"


async def test_a_context_stream_past_its_deadline_stops_its_statement(
    channel: grpc.aio.Channel, server: Any, pg_dsn: str, project_id: str
) -> None:
    stub = await _context_stub_with_a_fact(channel, project_id)
    request = context_pb2.StreamContextRequest(
        project_id=project_id, subject_id=SUBJECT, query="Does Caroline sing?"
    )
    received: list[context_pb2.StreamContextResponse] = []

    async def read_stream() -> None:
        async for message in stub.StreamContext(request, timeout=3):
            received.append(message)

    took = await _blocked_call_gives_up(pg_dsn, server, "context_calls", read_stream)
    assert took < 8
    kinds = {m.WhichOneof("event") for m in received}
    assert kinds == {"decision"}, f"the stream was cut while persisting its trace: {kinds}"
    rows = await _context_calls(pg_dsn, project_id)
    assert rows == 0, "a stream past its deadline persists nothing"
    replies = [m async for m in stub.StreamContext(request, timeout=30)]
    assert replies[-1].packet.facts, "the server still serves afterwards"


@pytest.mark.parametrize("rpc", ["AssertFact", "BatchRecordEvents"])
async def test_a_memory_write_past_its_deadline_writes_nothing(
    channel: grpc.aio.Channel, server: Any, pg_dsn: str, project_id: str, rpc: str
) -> None:
    memory = memory_stub(channel)
    if rpc == "AssertFact":
        table = "facts"

        def call() -> Awaitable[Any]:
            return memory.AssertFact(fact_request(project_id), timeout=3)
    else:
        table = "events"
        batch = memory_pb2.BatchRecordEventsRequest(
            requests=[event_request(project_id, idempotency_key=f"k{i}") for i in range(20)]
        )

        def call() -> Awaitable[Any]:
            return memory.BatchRecordEvents(batch, timeout=3)

    await _blocked_call_gives_up(pg_dsn, server, table, call)
    counts = await row_counts(pg_dsn, project_id)
    assert counts["facts"] == 0 and counts["events"] == 0


async def _count(dsn: str, sql: str, *params: object) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_call_without_deadline_is_bounded_by_the_statement_timeout(
    settings: Settings, pg_dsn: str, project_id: str
) -> None:
    """A client that never gives up still cannot hold a pooled connection forever."""
    async with (
        running(settings, db_statement_timeout_seconds=1.0) as server,
        channel_to(server) as chan,
    ):
        memory = memory_stub(chan)
        took = await _blocked_call_gives_up(
            pg_dsn, server, "facts", lambda: memory.AssertFact(fact_request(project_id))
        )
        assert took < 10
        reply = await memory.AssertFact(fact_request(project_id))
        assert reply.created
