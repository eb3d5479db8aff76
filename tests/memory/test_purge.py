"""`satchel purge` (server/commands/purge.py): after DeleteProject, the deleted text is in no
file of PostgreSQL's data directory (tables, indexes, statistics, WAL), on a PostgreSQL of its
own configured as docs/memory.md "Forgetting on disk" says (wal_recycle = off)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import psycopg
import pytest
from helpers.memory import event_request, fact_request
from helpers.memory import stub as memory_stub
from helpers.servers import channel_to, running, satchel_cli
from test_context import assemble

from satchel.server.memory.storage.erasure import WalReport
from satchel.server.platform.config import Settings
from satchel.server.platform.storage.embedded import start_pgserver
from satchel.server.platform.storage.migrations import apply_migrations
from satchel.v1 import memory_pb2

pytestmark = pytest.mark.slow

SECRET = "Maya's locker code is zebra-orchid-7731"


def files_holding(root: Path, needle: bytes) -> list[str]:
    """The files under `root` whose bytes contain `needle`."""
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    )


async def test_purge_leaves_the_deleted_text_in_no_database_file(
    settings: Settings, test_root: Path
) -> None:
    pgdata = Path(tempfile.mkdtemp(prefix="purge-", dir=test_root)) / "pg"
    pg = await asyncio.to_thread(start_pgserver, pgdata, cleanup_mode="delete")
    try:
        dsn = pg.get_uri()
        await asyncio.to_thread(apply_migrations, dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_recycle = off")
            conn.execute("SELECT pg_reload_conf()")
        project = "purge"
        async with running(settings, database_url=dsn) as server, channel_to(server) as channel:
            memory = memory_stub(channel)
            told = await memory.RecordEvent(
                event_request(project, payload={"speaker": "Maya", "text": SECRET})
            )
            await memory.AssertFact(
                fact_request(
                    project,
                    predicate="locker_code",
                    value="zebra-orchid-7731",
                    statement=SECRET,
                    source_event_ids=[told.event.id],
                )
            )
            served = await assemble(channel, project, "What is Maya's locker code?")
            assert "zebra-orchid-7731" in str(served.packet)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("ANALYZE")  # its samples hold the text too
                conn.execute("CHECKPOINT")
            needle = b"zebra-orchid-7731"
            assert files_holding(pgdata / "base", needle), "the check can see the text"
            deleted = await memory.DeleteProject(
                memory_pb2.DeleteProjectRequest(project_id=project)
            )
        env = {"SATCHEL_DATABASE_URL": dsn}
        code, output = await satchel_cli(
            "purge", "--full", "--wait", "30", "--token", deleted.consistency_token, env=env
        )
        assert code == 0, output
        assert "no WAL segment in pg_wal may hold what was deleted" in output
        assert files_holding(pgdata / "base", needle) == []
        assert files_holding(pgdata / "global", needle) == []
        assert files_holding(pgdata / "pg_wal", needle) == []
        code, output = await satchel_cli("purge", "--token", "not-a-token", env=env)
        assert code == 2 and "is not a consistency token" in output
    finally:
        await asyncio.to_thread(pg.cleanup)


def test_the_report_says_what_may_still_hold_the_text() -> None:
    base = WalReport(
        deletion_segment="000000010000000000000003",
        current_segment="000000010000000000000005",
        segments_at_or_before=0,
        segments_ahead=0,
        wal_recycle=False,
        archive_mode="off",
        slots_behind=[],
    )
    assert base.clear and base.held_by == []
    kept = WalReport(**{**base.__dict__, "segments_at_or_before": 2, "slots_behind": ["r1"]})
    assert not kept.clear and "replication slot(s) r1" in kept.held_by[0]
    recycled = WalReport(**{**base.__dict__, "wal_recycle": True, "segments_ahead": 4})
    assert "wal_recycle = off" in recycled.held_by[0]
    assert WalReport(**{**base.__dict__, "wal_recycle": True}).clear
    archived = WalReport(**{**base.__dict__, "archive_mode": "on"})
    assert "archived WAL" in archived.held_by[0]
