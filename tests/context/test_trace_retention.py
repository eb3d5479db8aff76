"""Trace retention against real PostgreSQL: traces partitioned by day (migration 0012), whole
days dropped by the server's maintenance (one replica at a time), GetTrace of a dropped call
NOT_FOUND as expired, stats and watch unaffected, older traces kept by the upgrade.

Each test runs on a database of its own: dropping days would take the session's traces too.
The maintenance is run "as of" a later instant to age the data without waiting for days.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import psycopg
import pytest
from helpers.memory import expect_error
from helpers.paths import ROOT
from test_context import CAROLINE, assemble, assert_facts, context_stub
from test_watch import receive, watch

from satchel.server.context.domain.trace_ids import new_trace_id
from satchel.server.context.storage import traces as retention
from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2 as pb

LOCK_KEY = 0x73617463686C7472  # satchel_maintain_traces' advisory lock


@pytest.fixture
async def served(settings: Settings, fresh_database: str) -> AsyncIterator[tuple]:
    """A server on a database of its own: (channel, server, dsn)."""
    from satchel.server.platform.app import SatchelServer

    srv = SatchelServer(replace(settings, database_url=fresh_database))
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            yield channel, srv, fresh_database
    finally:
        await srv.stop()


async def age(dsn: str, days: int, retention_days: int = 7) -> retention.Maintenance:
    """Run the maintenance as if `days` days had passed."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await retention.maintain_traces(
            conn, retention_days, now=datetime.now(UTC) + timedelta(days=days)
        )


def partitions(dsn: str) -> dict[str, tuple[datetime, bool]]:
    """Each partition's suffix: (end, dropped)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT suffix, ends, dropped_at IS NOT NULL FROM trace_partitions"
        ).fetchall()
    return {suffix: (ends, dropped) for suffix, ends, dropped in rows}


def partition_of_call(dsn: str, trace_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT tableoid::regclass::text FROM context_calls WHERE trace_id = %s", (trace_id,)
        ).fetchone()
    assert row is not None
    return row[0]


async def get_trace(channel: grpc.aio.Channel, project_id: str, trace_id: str):
    return await context_stub(channel).GetTrace(
        pb.GetTraceRequest(project_id=project_id, trace_id=trace_id)
    )


async def test_a_server_makes_the_coming_days_and_each_call_lands_in_its_day(
    served: tuple, project_id: str
) -> None:
    channel, srv, dsn = served
    assert srv.retention is not None and srv.retention.runs >= 1
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    held = partitions(dsn)
    for ahead in range(retention.DAYS_AHEAD + 1):  # each coming day has a partition
        day = today + timedelta(days=ahead)
        assert any(end > day and not dropped for end, dropped in held.values()), day
    reply = await assemble(channel, project_id, "hello")
    assert uuid.UUID(reply.trace_id).version == 7
    with psycopg.connect(dsn) as conn:
        created_at = conn.execute(
            "SELECT created_at FROM context_calls WHERE trace_id = %s", (reply.trace_id,)
        ).fetchone()[0]
        suffix = conn.execute(
            "SELECT suffix FROM trace_partitions WHERE starts <= %s AND ends > %s",
            (created_at, created_at),
        ).fetchone()[0]
    assert partition_of_call(dsn, reply.trace_id) == f"context_calls_{suffix}"
    assert (await get_trace(channel, project_id, reply.trace_id)).trace.trace_id == reply.trace_id


async def test_old_days_are_dropped_whole_and_get_trace_says_they_expired(
    served: tuple, project_id: str
) -> None:
    channel, _, dsn = served
    await assert_facts(channel, project_id, CAROLINE[:1])
    old = await assemble(channel, project_id, "Where does Caroline live?")
    assert len((await get_trace(channel, project_id, old.trace_id)).trace.decisions) == 1

    assert (await age(dsn, days=5)).dropped == 0  # kept 7 days
    assert (await get_trace(channel, project_id, old.trace_id)).trace.trace_id == old.trace_id

    done = await age(dsn, days=9)
    assert done.dropped >= 1
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM context_traces").fetchone()[0] == 0
        kept = conn.execute("SELECT count(*) FROM context_calls").fetchone()[0]
    assert kept == 0, "today's partition was dropped whole"

    code, _, reason = await expect_error(get_trace(channel, project_id, old.trace_id))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "TRACE_EXPIRED")
    in_nine_days = new_trace_id(time.time() + 9 * 86400)  # made after the dropped days
    for never in (in_nine_days, uuid.uuid4()):  # an id made then, an id that says no time
        code, _, reason = await expect_error(get_trace(channel, project_id, str(never)))
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "TRACE_NOT_FOUND")

    # Today has no partition any more: the next call makes it and is traced as usual.
    new = await assemble(channel, project_id, "Where does Caroline live?")
    assert len((await get_trace(channel, project_id, new.trace_id)).trace.decisions) == 1


async def test_one_replica_maintains_at_a_time(served: tuple) -> None:
    _, _, dsn = served
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        before = partitions(dsn)
        assert await age(dsn, days=30) == retention.Maintenance(created=0, dropped=0)
        assert partitions(dsn) == before
        other.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
    done = await age(dsn, days=30)
    assert done.created == retention.DAYS_AHEAD + 1 and done.dropped == len(before)


async def test_retention_zero_keeps_every_day(served: tuple) -> None:
    _, _, dsn = served
    done = await age(dsn, days=400, retention_days=0)
    assert done.created > 0 and done.dropped == 0
    assert not any(dropped for _, dropped in partitions(dsn).values())


async def test_stats_and_watch_keep_working_across_a_drop(served: tuple, project_id: str) -> None:
    channel, _, dsn = served
    await assert_facts(channel, project_id, CAROLINE[:1])
    watcher = watch(channel, project_id)
    first = await assemble(channel, project_id, "Where does Caroline live?")
    assert [seen.trace_id for seen in await receive(watcher, 1)] == [first.trace_id]

    assert (await age(dsn, days=9)).dropped >= 1
    second = await assemble(channel, project_id, "Where does Caroline live?")
    (seen,) = await receive(watcher, 1)
    assert seen.trace_id == second.trace_id and len(seen.decisions) == 1
    watcher.cancel()

    stats = await context_stub(channel).GetStatsOverview(
        pb.GetStatsOverviewRequest(project_id=project_id)
    )
    assert stats.context_calls == 1  # the first call's day is gone


def test_the_upgrade_keeps_the_traces_written_before(
    fresh_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database migrated before 0012, with a trace in it: after 0012 the trace reads the same
    and lives in the legacy partition, which ends where tomorrow starts."""
    from satchel.server.platform.storage import migrations

    before = tmp_path / "migrations"
    shutil.copytree(
        ROOT / "migrations", before, ignore=shutil.ignore_patterns("__*", "0012_*", "001[3-9]_*")
    )
    monkeypatch.setattr(migrations, "migrations_directory", lambda: str(before))
    migrations.apply_migrations(fresh_database)
    trace_id = uuid.uuid4()
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO context_calls (trace_id, project_id, subject_id, query, budget_tokens,"
            " status, created_at) VALUES (%s, 'p', 's', 'q', 10, 'ok', now() - interval '3 days')",
            (trace_id,),
        )
        conn.execute(
            "INSERT INTO context_traces (trace_id, sequence, candidate_id, candidate_kind,"
            " outcome, reason_code, score, similarity, text_rank, recency, tokens, budget_used)"
            " VALUES (%s, 0, %s, 'fact', 'included', 'relevance', 1, 1, 0, 1, 3, 3)",
            (trace_id, uuid.uuid4()),
        )
    monkeypatch.undo()
    assert "0012_trace_retention" in migrations.apply_migrations(fresh_database)

    with psycopg.connect(fresh_database) as conn:
        call = conn.execute(
            "SELECT tableoid::regclass::text, query FROM context_calls WHERE trace_id = %s",
            (trace_id,),
        ).fetchone()
        decisions = conn.execute(
            "SELECT tableoid::regclass::text, sequence FROM context_traces WHERE trace_id = %s",
            (trace_id,),
        ).fetchall()
    assert call == ("context_calls_legacy", "q")
    assert decisions == [("context_traces_legacy", 0)]
    legacy_end, dropped = partitions(fresh_database)["legacy"]
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert legacy_end == today + timedelta(days=1) and not dropped
