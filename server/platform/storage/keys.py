"""SQL of API keys: create, revoke and list them (CLI, synchronous) and look one up (server).

Only a key's SHA-256 (`key_hash`) is stored, with its first characters (`prefix`) so that a
listing can be matched with a key someone holds. `project_id` NULL is an admin key.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import class_row

_COLUMNS = "id, project_id, prefix, name, created_at, revoked_at, last_used_at"


@dataclass(frozen=True)
class ApiKeyRow:
    """A stored key (never the key itself)."""

    id: uuid.UUID
    project_id: str | None
    prefix: str
    name: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


def create_key(
    conn: psycopg.Connection, *, project_id: str | None, key_hash: bytes, prefix: str, name: str
) -> ApiKeyRow:
    """Store a new key's hash for a project (None: an admin key)."""
    cur = conn.cursor(row_factory=class_row(ApiKeyRow))
    cur.execute(
        "INSERT INTO api_keys (project_id, key_hash, prefix, name) VALUES (%s, %s, %s, %s)"
        f" RETURNING {_COLUMNS}",
        (project_id, key_hash, prefix, name),
    )
    row = cur.fetchone()
    assert row is not None
    return row


def revoke_key(
    conn: psycopg.Connection, *, key_id: uuid.UUID | None = None, key_hash: bytes | None = None
) -> ApiKeyRow | None:
    """Revoke a key by id or by hash (idempotent: a revoked key keeps its first revoked_at)."""
    cur = conn.cursor(row_factory=class_row(ApiKeyRow))
    cur.execute(
        "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())"
        " WHERE id = %s OR key_hash = %s"
        f" RETURNING {_COLUMNS}",
        (key_id, key_hash),
    )
    return cur.fetchone()


def list_keys(conn: psycopg.Connection, project_id: str | None) -> list[ApiKeyRow]:
    """The keys of a project (None: every key), oldest first."""
    cur = conn.cursor(row_factory=class_row(ApiKeyRow))
    if project_id is None:
        cur.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, id")
    else:
        cur.execute(
            f"SELECT {_COLUMNS} FROM api_keys WHERE project_id = %s ORDER BY created_at, id",
            (project_id,),
        )
    return cur.fetchall()


# How stale `last_used_at` may get: a key in use is noted at most once a minute per lookup.
LAST_USED_RESOLUTION = "1 minute"


async def find_active_key(
    conn: AsyncConnection, key_hash: bytes
) -> tuple[uuid.UUID, str | None] | None:
    """(id, project_id) of the unrevoked key with this hash, noting its use; None if unknown.

    An unknown key costs one read and no write (a flood of random keys is no write load); a
    known key's `last_used_at` is written when it is older than `LAST_USED_RESOLUTION`.
    """
    cur = await conn.execute(
        "SELECT id, project_id, last_used_at IS NULL"
        f" OR last_used_at < now() - interval '{LAST_USED_RESOLUTION}'"
        " FROM api_keys WHERE key_hash = %s AND revoked_at IS NULL",
        (key_hash,),
    )
    row = await cur.fetchone()
    if row is not None and row[2]:
        await conn.execute("UPDATE api_keys SET last_used_at = now() WHERE id = %s", (row[0],))
    await conn.commit()
    return (row[0], row[1]) if row else None
