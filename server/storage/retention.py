"""Trace retention: the daily partitions of context_calls and context_traces (migration 0012).

`satchel_maintain_traces` (SQL, in the migration) creates the partitions of the coming days
and drops whole days older than the retention, under an advisory lock that one session holds
at a time; everything here calls it or reads what it recorded in `trace_partitions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import AsyncConnection

# Partitions made ahead of today: calls keep finding one while maintenance cannot run.
DAYS_AHEAD = 3


@dataclass(frozen=True)
class Maintenance:
    """What one maintenance run did: days created and days dropped (0 and 0 when another
    session was doing it)."""

    created: int
    dropped: int


async def maintain_traces(
    conn: AsyncConnection, retention_days: int, now: datetime | None = None
) -> Maintenance:
    """Create the coming days' partitions and drop those older than `retention_days` (0: keep
    every day). `now`: the instant to act as of (tests); default the database's clock."""
    cur = await conn.execute(
        "SELECT created, dropped FROM satchel_maintain_traces(%s, %s, coalesce(%s, now()))",
        (retention_days, DAYS_AHEAD, now),
    )
    row = await cur.fetchone()
    assert row is not None
    return Maintenance(created=row[0], dropped=row[1])


async def expired_before(conn: AsyncConnection) -> datetime | None:
    """Calls made before this instant may have been dropped; None when no day was dropped."""
    cur = await conn.execute("SELECT max(ends) FROM trace_partitions WHERE dropped_at IS NOT NULL")
    row = await cur.fetchone()
    return row[0] if row else None
