"""SQL of read replicas: where the primary's WAL is (a write's consistency token) and whether a
streaming replica has replayed up to a position."""

from __future__ import annotations

import re

from psycopg import AsyncConnection

# A PostgreSQL LSN as text (pg_lsn's output): two hexadecimal halves.
TOKEN = re.compile(r"[0-9A-F]{1,8}/[0-9A-F]{1,8}")


async def write_position(conn: AsyncConnection) -> str:
    """The primary's WAL insert position: past the commit of every write that returned."""
    cur = await conn.execute("SELECT pg_current_wal_insert_lsn()::text")
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def has_replayed(conn: AsyncConnection, token: str) -> bool:
    """Whether this replica has replayed the primary's WAL up to `token`."""
    cur = await conn.execute(
        "SELECT coalesce(pg_last_wal_replay_lsn() >= %s::pg_lsn, false)", (token,)
    )
    row = await cur.fetchone()
    return bool(row and row[0])
