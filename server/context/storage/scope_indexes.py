"""SQL of scope indexes (migration 0013): the sizes of the scopes that may need them, the
registry, and the concurrent builds and drops.

Every statement here runs on a connection in autocommit: CREATE and DROP INDEX CONCURRENTLY
cannot run in a transaction. A session advisory lock lets one server at a time maintain them.
"""

from __future__ import annotations

import time

from psycopg import AsyncConnection, sql

from satchel.server.context.domain.scope_indexes import ScopeIndexNames, ScopeKey

# pg_try_advisory_lock key: "satchlsi".
LOCK_KEY = int.from_bytes(b"satchlsi", "big")

# Scopes that may qualify (counted on write: at least `keep_from` documents, facts and events
# alike, a bound above the active facts) and the indexed ones, with their active facts (each an
# index-only count on facts_scope_active).
_SIZES_SQL = """
WITH scopes AS (
    SELECT project_id, subject_id FROM scope_documents WHERE documents >= %(keep_from)s
    UNION
    SELECT project_id, subject_id FROM scope_indexes
)
SELECT s.project_id, s.subject_id, (
    SELECT count(*) FROM facts f
    WHERE f.project_id = s.project_id AND f.subject_id = s.subject_id AND f.status = 'active'
) AS facts
FROM scopes s
"""

# The registry's scopes, with whether all their indexes are ready and valid (a concurrent build
# that failed leaves an INVALID index, which the planner ignores).
_REGISTRY_SQL = """
SELECT r.project_id, r.subject_id, r.state = 'ready' AND (
    SELECT count(*) FILTER (WHERE i.indisvalid) = 3
    FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
    WHERE c.relname IN (r.index_prefix || '_hnsw', r.index_prefix || '_lexemes',
                        r.index_prefix || '_words')
      AND c.relnamespace = current_schema()::regnamespace
) AS usable
FROM scope_indexes r
"""

# Partial indexes of the scope's active facts, with the global indexes' parameters (migrations
# 0001, 0006 and 0008).
_SCOPE_PREDICATE = "project_id = {project} AND subject_id = {subject} AND status = 'active'"
_CREATE_SQL = sql.SQL(
    "CREATE INDEX CONCURRENTLY {name} ON facts {method} WHERE " + _SCOPE_PREDICATE
)
_METHODS = (
    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128)",
    "USING gin (lexemes) WITH (fastupdate = off)",
    "USING gin (search_vector)",
)
_DROP_SQL = sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {name}")


async def try_lock(conn: AsyncConnection) -> bool:
    """Take the maintenance lock for this session, if no other session holds it."""
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def unlock(conn: AsyncConnection) -> None:
    """Release the maintenance lock this session holds."""
    await conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))


async def scope_sizes(conn: AsyncConnection, keep_from: int) -> dict[ScopeKey, int]:
    """Active facts of every scope that may hold `keep_from` of them, and of every indexed one."""
    cur = await conn.execute(_SIZES_SQL, {"keep_from": keep_from})
    return {(p, s): int(n) for p, s, n in await cur.fetchall()}


async def registry(conn: AsyncConnection) -> dict[ScopeKey, bool]:
    """The indexed scopes, each with whether its indexes serve (ready and valid)."""
    cur = await conn.execute(_REGISTRY_SQL)
    return {(p, s): bool(usable) for p, s, usable in await cur.fetchall()}


async def build(conn: AsyncConnection, scope: ScopeKey, facts: int) -> float:
    """Build the scope's indexes without blocking writes (recorded `building`, then `ready`);
    seconds taken. Leftovers of a failed build are dropped first."""
    names = ScopeIndexNames.of(scope)
    await conn.execute(
        "INSERT INTO scope_indexes (project_id, subject_id, index_prefix, state, facts)"
        " VALUES (%s, %s, %s, 'building', %s)"
        " ON CONFLICT (project_id, subject_id) DO UPDATE"
        " SET state = 'building', facts = EXCLUDED.facts, updated_at = now()",
        (*scope, names.prefix, facts),
    )
    keys = {"project": sql.Literal(scope[0]), "subject": sql.Literal(scope[1])}
    started = time.perf_counter()
    for name, method in zip(names.all, _METHODS, strict=True):
        await conn.execute(_DROP_SQL.format(name=sql.Identifier(name)))
        await conn.execute(
            _CREATE_SQL.format(name=sql.Identifier(name), method=sql.SQL(method), **keys)
        )
    seconds = time.perf_counter() - started
    await conn.execute(
        "UPDATE scope_indexes SET state = 'ready', build_seconds = %s, updated_at = now()"
        " WHERE project_id = %s AND subject_id = %s",
        (seconds, *scope),
    )
    return seconds


async def drop(conn: AsyncConnection, scope: ScopeKey) -> None:
    """Drop the scope's indexes, then its registry row: a drop cut short leaves the row, and the
    next run drops again. (Meanwhile a call may plan for indexes gone: it uses the global ones.)"""
    for name in ScopeIndexNames.of(scope).all:
        await conn.execute(_DROP_SQL.format(name=sql.Identifier(name)))
    await conn.execute("DELETE FROM scope_indexes WHERE project_id = %s AND subject_id = %s", scope)
