"""SQL of the memory write path: events, facts, their lifecycle and conflict sets.

Every function takes an open `AsyncConnection`; the caller owns the transaction (one per
request, so a failed request writes nothing). Statements select only the columns the API
returns: never the 384-dim embeddings.

Time is PostgreSQL's `now()`, the start of the transaction: every row a request writes shares
one instant (`recorded_from`, `recorded_at`, `superseded_at`, `recorded_to`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

T = TypeVar("T")

# --- rows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    """An event as the API returns it."""

    id: uuid.UUID
    project_id: str
    subject_id: str
    kind: str
    payload: dict[str, Any]
    text: str
    occurred_at: datetime
    recorded_at: datetime


@dataclass(frozen=True)
class FactRow:
    """A fact as the API returns it (its current state)."""

    id: uuid.UUID
    project_id: str
    subject_id: str
    predicate: str
    value: Any
    statement: str
    confidence: float
    status: str
    status_reason: str | None
    superseded_by: uuid.UUID | None
    valid_from: datetime | None
    valid_to: datetime | None
    recorded_from: datetime
    recorded_to: datetime | None
    source_event_ids: list[uuid.UUID]
    stale_after: timedelta | None


@dataclass(frozen=True)
class FactState:
    """What reference checks need to know about a fact (scope and lifecycle)."""

    id: uuid.UUID
    project_id: str
    subject_id: str
    status: str


@dataclass(frozen=True)
class ConflictRow:
    """A conflict set with its member facts (sorted by id)."""

    id: uuid.UUID
    project_id: str
    subject_id: str
    status: str
    note: str
    opened_at: datetime
    resolved_at: datetime | None
    winning_fact_id: uuid.UUID | None
    fact_ids: list[uuid.UUID]


@dataclass(frozen=True)
class NewEvent:
    """A validated event to store; `occurred_at` None means the time of the request."""

    project_id: str
    subject_id: str
    kind: str
    payload: dict[str, Any]
    text: str
    occurred_at: datetime | None
    idempotency_key: str | None


@dataclass(frozen=True)
class NewFact:
    """A validated fact to store; `statement` is final (derived when the caller gave none)."""

    project_id: str
    subject_id: str
    predicate: str
    value: Any
    statement: str
    confidence: float
    valid_from: datetime | None
    valid_to: datetime | None
    source_event_ids: tuple[uuid.UUID, ...]
    stale_after: timedelta | None
    idempotency_key: str | None
    supersedes_fact_ids: tuple[uuid.UUID, ...]


# What the API returns (never the embeddings), for tables aliased `e` and `f`.
EVENT_COLUMNS = (
    "e.id, e.project_id, e.subject_id, e.kind, e.payload, e.text, e.occurred_at, e.recorded_at"
)
FACT_COLUMNS = (
    "f.id, f.project_id, f.subject_id, f.predicate, f.value, f.statement, f.confidence,"
    " f.status, f.status_reason, f.superseded_by, f.valid_from, f.valid_to, f.recorded_from,"
    " f.recorded_to, f.source_event_ids, f.stale_after"
)

# --- as-of visibility --------------------------------------------------------------------------

FACT_VISIBLE_AT = """
    f.recorded_from <= %(at)s AND (f.recorded_to IS NULL OR f.recorded_to > %(at)s)
    AND (f.valid_from IS NULL OR f.valid_from <= %(at)s)
    AND coalesce(
        CASE WHEN f.superseded_at > %(at)s THEN f.prior_valid_to ELSE f.valid_to END,
        'infinity'
    ) > %(at)s
"""
"""A fact `f` valid at %(at)s as recorded then (reusable by other read paths).

Transaction time: recorded by then and not retired by then (retiring sets `recorded_to`).
Valid time: `valid_from <= at < valid_to`, where `valid_to` is the one the record held at
`at`: a supersession closes `valid_to` at `superseded_at` and keeps the earlier value in
`prior_valid_to`, so an instant before the supersession sees the validity as first asserted.
"""


async def database_now(conn: AsyncConnection) -> datetime:
    """The database's transaction time (`now()`)."""
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


# --- events ----------------------------------------------------------------------------------

_INSERT_EVENT = f"""
INSERT INTO events AS e (project_id, subject_id, kind, payload, text, occurred_at, idempotency_key,
                    embedding, embedding_model)
VALUES (%s, %s, %s, %s, %s, coalesce(%s, now()), %s, %s, %s)
ON CONFLICT (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {EVENT_COLUMNS}
"""

_EVENTS_BY_KEYS = f"""
SELECT e.idempotency_key AS key, {EVENT_COLUMNS} FROM events e
WHERE e.project_id = %s AND e.idempotency_key = ANY(%s::text[])
"""


async def find_events_by_keys(
    conn: AsyncConnection, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], EventRow]:
    """The stored events of these (project_id, idempotency_key) pairs."""
    return await _find_by_keys(conn, _EVENTS_BY_KEYS, EventRow, keys)


async def insert_events(
    conn: AsyncConnection, events: Sequence[NewEvent], embeddings: np.ndarray, model_id: str
) -> list[EventRow | None]:
    """Insert events in order; None where the idempotency key already has a row."""
    if not events:
        return []
    params = [
        (
            e.project_id,
            e.subject_id,
            e.kind,
            Jsonb(e.payload),
            e.text,
            e.occurred_at,
            e.idempotency_key,
            vector,
            model_id,
        )
        for e, vector in zip(events, embeddings, strict=True)
    ]
    async with conn.cursor(row_factory=class_row(EventRow)) as cur:
        await cur.executemany(_INSERT_EVENT, params, returning=True)
        return await _returned_rows(cur, len(params))


async def event_subjects(
    conn: AsyncConnection, project_id: str, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """The subject of each existing event of the project among `ids`."""
    if not ids:
        return {}
    # FOR KEY SHARE: a concurrent DeleteEvent waits until the fact citing it is committed.
    cur = await conn.execute(
        "SELECT id, subject_id FROM events WHERE project_id = %s AND id = ANY(%s)"
        " ORDER BY id FOR KEY SHARE",
        (project_id, list(ids)),
    )
    return {row[0]: row[1] for row in await cur.fetchall()}


async def list_events(
    conn: AsyncConnection,
    *,
    project_id: str,
    subject_id: str,
    recorded_by: datetime,
    occurred_by: datetime | None,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[EventRow]:
    """Events of a scope recorded by `recorded_by` (and occurred by `occurred_by` when given),
    newest `occurred_at` first, keyset-paged strictly after `before` = (occurred_at, id) of
    the previous page's last row."""
    where = "project_id = %(project_id)s AND subject_id = %(subject_id)s AND recorded_at <= %(at)s"
    if occurred_by is not None:
        where += " AND occurred_at <= %(occurred_by)s"
    if before is not None:
        where += " AND (occurred_at, id) < (%(after_at)s, %(after_id)s)"
    sql = (
        f"SELECT {EVENT_COLUMNS} FROM events e WHERE {where}"
        " ORDER BY occurred_at DESC, id DESC LIMIT %(limit)s"
    )
    params = {
        "project_id": project_id,
        "subject_id": subject_id,
        "at": recorded_by,
        "occurred_by": occurred_by,
        "after_at": before[0] if before else None,
        "after_id": before[1] if before else None,
        "limit": limit,
    }
    cur = conn.cursor(row_factory=class_row(EventRow))
    await cur.execute(sql, params)
    return await cur.fetchall()


# --- facts -----------------------------------------------------------------------------------

_INSERT_FACT = f"""
INSERT INTO facts AS f (project_id, subject_id, predicate, value, statement, confidence, valid_from,
                   valid_to, source_event_ids, stale_after, idempotency_key, embedding,
                   embedding_model)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::uuid[], %s, %s, %s, %s)
ON CONFLICT (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {FACT_COLUMNS}
"""

_FACTS_BY_KEYS = f"""
SELECT f.idempotency_key AS key, {FACT_COLUMNS} FROM facts f
WHERE f.project_id = %s AND f.idempotency_key = ANY(%s::text[])
"""


async def find_facts_by_keys(
    conn: AsyncConnection, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], FactRow]:
    """The stored facts of these (project_id, idempotency_key) pairs."""
    return await _find_by_keys(conn, _FACTS_BY_KEYS, FactRow, keys)


async def insert_facts(
    conn: AsyncConnection, facts: Sequence[NewFact], embeddings: np.ndarray, model_id: str
) -> list[FactRow | None]:
    """Insert active facts in order; None where the idempotency key already has a row."""
    if not facts:
        return []
    params = [
        (
            f.project_id,
            f.subject_id,
            f.predicate,
            Jsonb(f.value),
            f.statement,
            f.confidence,
            f.valid_from,
            f.valid_to,
            list(f.source_event_ids),
            f.stale_after,
            f.idempotency_key,
            vector,
            model_id,
        )
        for f, vector in zip(facts, embeddings, strict=True)
    ]
    async with conn.cursor(row_factory=class_row(FactRow)) as cur:
        await cur.executemany(_INSERT_FACT, params, returning=True)
        return await _returned_rows(cur, len(params))


COUNT_FACT_TERMS_SQL = """
INSERT INTO fact_term_counts AS c (project_id, subject_id, term, facts)
SELECT f.project_id, f.subject_id, t.term, count(*)
FROM facts f CROSS JOIN unnest(tsvector_to_array(f.search_vector)) AS t(term)
WHERE f.project_id = %s AND f.id = ANY(%s::uuid[])
GROUP BY f.project_id, f.subject_id, t.term
ORDER BY f.project_id, f.subject_id, t.term
ON CONFLICT (project_id, subject_id, term) DO UPDATE SET facts = c.facts + excluded.facts
"""


_COUNT_LEXEMES_SQL = """
WITH new AS (
    SELECT d.project_id, d.subject_id, d.lexemes, d.lexeme_tokens FROM {table} d
    WHERE d.project_id = %(project_id)s AND d.id = ANY(%(ids)s::uuid[])
),
lexemes AS (
    INSERT INTO scope_lexemes AS c (project_id, subject_id, lexeme, documents)
    SELECT n.project_id, n.subject_id, t.lexeme, count(*)
    FROM new n CROSS JOIN unnest(tsvector_to_array(n.lexemes)) AS t(lexeme)
    GROUP BY n.project_id, n.subject_id, t.lexeme
    ORDER BY n.project_id, n.subject_id, t.lexeme
    ON CONFLICT (project_id, subject_id, lexeme)
        DO UPDATE SET documents = c.documents + excluded.documents
)
INSERT INTO scope_documents AS s (project_id, subject_id, documents, tokens)
SELECT project_id, subject_id, count(*), sum(lexeme_tokens) FROM new
GROUP BY project_id, subject_id ORDER BY project_id, subject_id
ON CONFLICT (project_id, subject_id) DO UPDATE
    SET documents = s.documents + excluded.documents, tokens = s.tokens + excluded.tokens
"""
COUNT_LEXEMES_SQL = {t: _COUNT_LEXEMES_SQL.format(table=t) for t in ("facts", "events")}


async def count_lexemes(
    conn: AsyncConnection, table: str, project_id: str, ids: Sequence[uuid.UUID]
) -> None:
    """Add a project's new facts' or events' lexemes to their scopes' BM25 statistics
    (migration 0008).

    Run it at the end of the transaction that inserted them, like `count_fact_terms`: writers
    of one scope queue on its shared rows, in key order.
    """
    if ids:
        await conn.execute(COUNT_LEXEMES_SQL[table], {"project_id": project_id, "ids": list(ids)})


async def count_fact_terms(
    conn: AsyncConnection, project_id: str, fact_ids: Sequence[uuid.UUID]
) -> None:
    """Add a project's new facts' words to their scopes' word counts (what the text search
    reads), and their lexemes to the scopes' BM25 statistics.

    Run it at the end of the transaction that inserted them: the count rows of a scope's
    common words are locked until commit, in key order, so writers queue but never deadlock.
    """
    if fact_ids:
        await conn.execute(COUNT_FACT_TERMS_SQL, (project_id, list(fact_ids)))
        await count_lexemes(conn, "facts", project_id, fact_ids)


async def get_fact(conn: AsyncConnection, project_id: str, fact_id: uuid.UUID) -> FactRow | None:
    """One fact of a project (None when unknown there)."""
    cur = conn.cursor(row_factory=class_row(FactRow))
    await cur.execute(
        f"SELECT {FACT_COLUMNS} FROM facts f WHERE f.id = %s AND f.project_id = %s",
        (fact_id, project_id),
    )
    return await cur.fetchone()


async def lock_facts(
    conn: AsyncConnection, project_id: str, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, FactState]:
    """Lock the project's existing facts among `ids` for the transaction (in id order: no
    deadlocks)."""
    if not ids:
        return {}
    cur = conn.cursor(row_factory=class_row(FactState))
    await cur.execute(
        "SELECT id, project_id, subject_id, status FROM facts WHERE project_id = %s"
        " AND id = ANY(%s) ORDER BY id FOR UPDATE",
        (project_id, sorted(set(ids))),
    )
    return {row.id: row for row in await cur.fetchall()}


_SUPERSEDE = f"""
UPDATE facts AS f
SET status = 'superseded',
    superseded_by = n.id,
    superseded_at = now(),
    status_reason = %s,
    prior_valid_to = f.valid_to,
    valid_to = greatest(least(f.valid_to, coalesce(n.valid_from, now())), f.valid_from)
FROM unnest(%s::uuid[], %s::uuid[]) AS s(old_id, new_id)
JOIN facts n ON n.id = s.new_id
WHERE f.project_id = %s AND n.project_id = f.project_id AND f.id = s.old_id
    AND f.status = 'active'
RETURNING {FACT_COLUMNS}
"""


async def supersede_facts(
    conn: AsyncConnection,
    project_id: str,
    pairs: Sequence[tuple[uuid.UUID, uuid.UUID]],
    *,
    reason: str | None = None,
) -> list[FactRow]:
    """Mark each active `old` fact of the project superseded by `new` (pairs of (old, new)
    ids).

    The old fact's validity ends at the successor's `valid_from`, or now when it has none; it
    is never extended (an earlier `valid_to` stays) and never ends before it starts (a successor
    valid from before it leaves it an empty interval: never valid). The record it held until
    now stays readable as of earlier instants (`superseded_at`, `prior_valid_to`).
    """
    if not pairs:
        return []
    cur = conn.cursor(row_factory=class_row(FactRow))
    await cur.execute(
        _SUPERSEDE, (reason, [old for old, _ in pairs], [new for _, new in pairs], project_id)
    )
    return await cur.fetchall()


async def retire_fact(
    conn: AsyncConnection, project_id: str, fact_id: uuid.UUID, reason: str
) -> FactRow | None:
    """Retire an active fact of a project: it leaves the record now (`recorded_to`), kept for
    history. None when no active fact of the project has this id."""
    cur = conn.cursor(row_factory=class_row(FactRow))
    await cur.execute(
        "UPDATE facts AS f SET status = 'retired', recorded_to = now(), status_reason = %s"
        f" WHERE f.id = %s AND f.project_id = %s AND f.status = 'active' RETURNING {FACT_COLUMNS}",
        (reason or None, fact_id, project_id),
    )
    return await cur.fetchone()


async def list_facts(
    conn: AsyncConnection,
    *,
    project_id: str,
    subject_id: str,
    at: datetime,
    include_inactive: bool,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[FactRow]:
    """Facts of a scope by (recorded_from, id), keyset-paged strictly after `after`.

    Without `include_inactive`: the facts valid at `at` as recorded then (FACT_VISIBLE_AT).
    With it: every fact recorded by `at`, whatever its status and validity.
    """
    where = (
        "f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s"
        " AND f.recorded_from <= %(at)s"
    )
    if not include_inactive:
        where += f" AND {FACT_VISIBLE_AT}"
    if after is not None:
        where += " AND (f.recorded_from, f.id) > (%(after_at)s, %(after_id)s)"
    sql = (
        f"SELECT {FACT_COLUMNS} FROM facts f WHERE {where}"
        " ORDER BY f.recorded_from, f.id LIMIT %(limit)s"
    )
    params = {
        "project_id": project_id,
        "subject_id": subject_id,
        "at": at,
        "after_at": after[0] if after else None,
        "after_id": after[1] if after else None,
        "limit": limit,
    }
    cur = conn.cursor(row_factory=class_row(FactRow))
    await cur.execute(sql, params)
    return await cur.fetchall()


# --- conflicts -------------------------------------------------------------------------------

_CONFLICT_COLUMNS = """
    c.id, c.project_id, c.subject_id, c.status, c.note, c.opened_at, c.resolved_at,
    c.winning_fact_id,
    ARRAY(SELECT m.fact_id FROM conflict_members m
        WHERE m.conflict_id = c.id AND m.project_id = c.project_id ORDER BY m.fact_id) AS fact_ids
"""


async def open_conflicts_of(
    conn: AsyncConnection, project_id: str, fact_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, uuid.UUID]:
    """For each of the project's facts among `fact_ids` in an open conflict: its id."""
    if not fact_ids:
        return {}
    cur = await conn.execute(
        "SELECT m.fact_id, m.conflict_id FROM conflict_members m"
        " JOIN conflict_sets c ON c.id = m.conflict_id AND c.project_id = m.project_id"
        " WHERE m.project_id = %s AND m.fact_id = ANY(%s) AND c.status = 'open'",
        (project_id, list(fact_ids)),
    )
    return {row[0]: row[1] for row in await cur.fetchall()}


async def insert_conflict(
    conn: AsyncConnection,
    *,
    project_id: str,
    subject_id: str,
    note: str,
    fact_ids: Sequence[uuid.UUID],
) -> ConflictRow:
    """Open a conflict set over `fact_ids`."""
    cur = await conn.execute(
        "INSERT INTO conflict_sets (project_id, subject_id, note) VALUES (%s, %s, %s) RETURNING id",
        (project_id, subject_id, note),
    )
    row = await cur.fetchone()
    assert row is not None
    conflict_id: uuid.UUID = row[0]
    await conn.execute(
        "INSERT INTO conflict_members (project_id, conflict_id, fact_id)"
        " SELECT %s, %s, unnest(%s::uuid[])",
        (project_id, conflict_id, list(fact_ids)),
    )
    conflict = await get_conflict(conn, project_id, conflict_id)
    assert conflict is not None
    return conflict


async def get_conflict(
    conn: AsyncConnection, project_id: str, conflict_id: uuid.UUID, *, lock: bool = False
) -> ConflictRow | None:
    """One conflict of a project (None when unknown there); `lock` holds it FOR UPDATE."""
    cur = conn.cursor(row_factory=class_row(ConflictRow))
    await cur.execute(
        f"SELECT {_CONFLICT_COLUMNS} FROM conflict_sets c WHERE c.id = %s AND c.project_id = %s"
        + (" FOR UPDATE" if lock else ""),
        (conflict_id, project_id),
    )
    return await cur.fetchone()


async def resolve_conflict(
    conn: AsyncConnection, project_id: str, conflict_id: uuid.UUID, winning_fact_id: uuid.UUID
) -> ConflictRow:
    """Close an open conflict of the project with its winner."""
    cur = conn.cursor(row_factory=class_row(ConflictRow))
    await cur.execute(
        "UPDATE conflict_sets c SET status = 'resolved', resolved_at = now(),"
        " winning_fact_id = %s WHERE c.project_id = %s AND c.id = %s AND c.status = 'open'"
        f" RETURNING {_CONFLICT_COLUMNS}",
        (winning_fact_id, project_id, conflict_id),
    )
    row = await cur.fetchone()
    assert row is not None, "resolve_conflict needs an open conflict locked by the caller"
    return row


async def list_conflicts(
    conn: AsyncConnection,
    *,
    project_id: str,
    subject_id: str,
    include_resolved: bool,
    opened_by: datetime,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[ConflictRow]:
    """Conflicts of a scope opened by `opened_by`, newest first (`opened_at`, then id): open
    ones, or all with `include_resolved`; keyset-paged strictly after `before` = (opened_at, id)
    of the previous page's last row."""
    where = "c.project_id = %(project_id)s AND c.subject_id = %(subject_id)s"
    where += " AND c.opened_at <= %(at)s"
    if not include_resolved:
        where += " AND c.status = 'open'"
    if before is not None:
        where += " AND (c.opened_at, c.id) < (%(after_at)s, %(after_id)s)"
    params = {
        "project_id": project_id,
        "subject_id": subject_id,
        "at": opened_by,
        "after_at": before[0] if before else None,
        "after_id": before[1] if before else None,
        "limit": limit,
    }
    cur = conn.cursor(row_factory=class_row(ConflictRow))
    await cur.execute(
        f"SELECT {_CONFLICT_COLUMNS} FROM conflict_sets c WHERE {where}"
        " ORDER BY c.opened_at DESC, c.id DESC LIMIT %(limit)s",
        params,
    )
    return await cur.fetchall()


# --- deletion --------------------------------------------------------------------------------
#
# Deleting is forgetting, not retiring: rows leave the tables, so no as-of read sees them. The
# scope statistics counted on write (fact_term_counts, scope_lexemes, scope_documents) lose what
# the deleted rows added, in the statement that deletes them and in key order, like the writes
# that add to them. Traces: a decision row's `preview` quotes its candidate's text, so the
# decisions whose candidate is deleted go too (only the scope's calls can hold them). Every
# deletion is announced on ERASURES (delivered at commit, to every server listening): servers
# drop what they hold of the scope in memory at once (server/context/scope_cache.py,
# server/context/watch.py).

ERASURES = "satchel_erasures"


async def _announce_erasure(conn: AsyncConnection, project_id: str, subject_id: str | None) -> None:
    """Tell every server, once this transaction commits, that rows of the scope (every scope of
    the project when `subject_id` is None) were deleted."""
    payload = json.dumps({"project_id": project_id, "subject_id": subject_id})
    await conn.execute("SELECT pg_notify(%s, %s)", (ERASURES, payload))


@dataclass
class Deleted:
    """Rows removed by one delete request (the DeletedCounts message)."""

    events: int = 0
    facts: int = 0
    conflicts: int = 0
    traces: int = 0
    trace_decisions: int = 0
    facts_unlinked: int = 0
    # The scope the rows were deleted from (DeleteEvent's event's subject; None: not known)
    subject_id: str | None = None


def _uncounting_delete(table: str) -> str:
    """DELETE rows of `table` (`facts` or `events`) by id within a project, taking their
    lexemes (and, for facts, their words) out of the scope statistics; returns the ids."""
    terms = ""
    if table == "facts":
        terms = """
terms AS (
    INSERT INTO fact_term_counts AS c (project_id, subject_id, term, facts)
    SELECT g.project_id, g.subject_id, t.term, -count(*)
    FROM gone g CROSS JOIN unnest(tsvector_to_array(g.search_vector)) AS t(term)
    GROUP BY g.project_id, g.subject_id, t.term
    ORDER BY g.project_id, g.subject_id, t.term
    ON CONFLICT (project_id, subject_id, term) DO UPDATE SET facts = c.facts + excluded.facts
),"""
    vector = ", d.search_vector" if table == "facts" else ""
    return f"""
WITH gone AS (
    DELETE FROM {table} d WHERE d.project_id = %(project_id)s AND d.id = ANY(%(ids)s::uuid[])
    RETURNING d.id, d.project_id, d.subject_id, d.lexemes, d.lexeme_tokens{vector}
),{terms}
lexemes AS (
    INSERT INTO scope_lexemes AS c (project_id, subject_id, lexeme, documents)
    SELECT g.project_id, g.subject_id, t.lexeme, -count(*)
    FROM gone g CROSS JOIN unnest(tsvector_to_array(g.lexemes)) AS t(lexeme)
    GROUP BY g.project_id, g.subject_id, t.lexeme
    ORDER BY g.project_id, g.subject_id, t.lexeme
    ON CONFLICT (project_id, subject_id, lexeme)
        DO UPDATE SET documents = c.documents + excluded.documents
),
documents AS (
    INSERT INTO scope_documents AS s (project_id, subject_id, documents, tokens)
    SELECT project_id, subject_id, -count(*), -sum(lexeme_tokens) FROM gone
    GROUP BY project_id, subject_id ORDER BY project_id, subject_id
    ON CONFLICT (project_id, subject_id) DO UPDATE
        SET documents = s.documents + excluded.documents, tokens = s.tokens + excluded.tokens
)
SELECT id FROM gone
"""


_UNCOUNTING_DELETE = {t: _uncounting_delete(t) for t in ("facts", "events")}

_DROP_EMPTY_COUNTS = """
WITH terms AS (
    DELETE FROM fact_term_counts
    WHERE project_id = %(project_id)s AND subject_id = %(subject_id)s AND facts <= 0
),
lexemes AS (
    DELETE FROM scope_lexemes
    WHERE project_id = %(project_id)s AND subject_id = %(subject_id)s AND documents <= 0
)
DELETE FROM scope_documents
WHERE project_id = %(project_id)s AND subject_id = %(subject_id)s AND documents <= 0
"""


async def _delete_counted(
    conn: AsyncConnection, table: str, project_id: str, ids: Sequence[uuid.UUID]
) -> list[uuid.UUID]:
    if not ids:
        return []
    cur = await conn.execute(
        _UNCOUNTING_DELETE[table], {"project_id": project_id, "ids": sorted(set(ids))}
    )
    return [row[0] for row in await cur.fetchall()]


async def _delete_decisions_of(
    conn: AsyncConnection, project_id: str, subject_id: str, candidate_ids: Sequence[uuid.UUID]
) -> int:
    """Delete the decisions of the scope's context calls whose candidate is among `ids`."""
    if not candidate_ids:
        return 0
    cur = await conn.execute(
        "DELETE FROM context_traces t USING context_calls c"
        " WHERE c.project_id = %s AND c.subject_id = %s AND t.project_id = c.project_id"
        " AND t.trace_id = c.trace_id AND t.candidate_id = ANY(%s::uuid[])",
        (project_id, subject_id, list(candidate_ids)),
    )
    return cur.rowcount


async def delete_event(conn: AsyncConnection, project_id: str, event_id: uuid.UUID) -> Deleted:
    """Delete an event of a project, the facts drawn from it alone (see `_delete_facts`), and
    the trace decisions quoting either; facts drawn from other events too lose its id.

    The event row goes first: a concurrent AssertFact citing it holds it (`event_subjects` reads
    it FOR KEY SHARE), so its fact is committed, and seen here, before the facts are read.
    """
    deleted = Deleted()
    cur = await conn.execute(
        "SELECT subject_id FROM events WHERE id = %s AND project_id = %s FOR UPDATE",
        (event_id, project_id),
    )
    row = await cur.fetchone()
    if row is None:
        return deleted
    subject_id: str = row[0]
    deleted.events = len(await _delete_counted(conn, "events", project_id, [event_id]))
    cur = await conn.execute(
        "SELECT id, cardinality(array_remove(source_event_ids, %(event)s)) = 0 FROM facts"
        " WHERE project_id = %(project_id)s AND subject_id = %(subject_id)s"
        " AND source_event_ids @> ARRAY[%(event)s]::uuid[] ORDER BY id FOR UPDATE",
        {"event": event_id, "project_id": project_id, "subject_id": subject_id},
    )
    drawn = await cur.fetchall()
    only = [fid for fid, alone in drawn if alone]
    kept = [fid for fid, alone in drawn if not alone]
    if kept:
        cur = await conn.execute(
            "UPDATE facts SET source_event_ids = array_remove(source_event_ids, %s)"
            " WHERE project_id = %s AND id = ANY(%s::uuid[])",
            (event_id, project_id, kept),
        )
        deleted.facts_unlinked = cur.rowcount
    gone = await _delete_facts(conn, project_id, subject_id, only, deleted)
    deleted.trace_decisions = await _delete_decisions_of(
        conn, project_id, subject_id, [event_id, *gone]
    )
    await conn.execute(_DROP_EMPTY_COUNTS, {"project_id": project_id, "subject_id": subject_id})
    await _announce_erasure(conn, project_id, subject_id)
    deleted.subject_id = subject_id
    return deleted


async def _delete_facts(
    conn: AsyncConnection,
    project_id: str,
    subject_id: str,
    fact_ids: Sequence[uuid.UUID],
    deleted: Deleted,
) -> list[uuid.UUID]:
    """Delete facts of one scope: first every conflict one of them is a member of (the other
    members are unblocked; losers stay superseded), then the `superseded_by` pointing to them
    (the facts they replaced stay superseded, by a successor that no longer exists)."""
    if not fact_ids:
        return []
    ids = sorted(set(fact_ids))
    cur = await conn.execute(
        "DELETE FROM conflict_sets c WHERE c.project_id = %s AND EXISTS ("
        " SELECT 1 FROM conflict_members m WHERE m.conflict_id = c.id"
        " AND m.project_id = c.project_id AND m.fact_id = ANY(%s::uuid[]))",
        (project_id, ids),
    )
    deleted.conflicts += cur.rowcount
    await conn.execute(
        "UPDATE facts SET superseded_by = NULL WHERE project_id = %s AND subject_id = %s"
        " AND superseded_by = ANY(%s::uuid[]) AND NOT id = ANY(%s::uuid[])",
        (project_id, subject_id, ids, ids),
    )
    gone = await _delete_counted(conn, "facts", project_id, ids)
    deleted.facts += len(gone)
    return gone


async def delete_scopes(conn: AsyncConnection, project_id: str, subject_id: str | None) -> Deleted:
    """Delete every event, fact, conflict, context call (with its decisions), scope statistic
    and version of one subject of a project, or of every subject (`subject_id` None)."""
    where = "project_id = %(project_id)s"
    if subject_id is not None:
        where += " AND subject_id = %(subject_id)s"
    params = {"project_id": project_id, "subject_id": subject_id}
    deleted = Deleted()

    async def run(sql: str) -> int:
        cur = await conn.execute(sql, params)
        return cur.rowcount

    deleted.trace_decisions = await run(
        "DELETE FROM context_traces t USING context_calls c"
        " WHERE t.project_id = c.project_id AND t.trace_id = c.trace_id"
        f" AND c.{where.replace(' AND ', ' AND c.')}"
    )
    deleted.traces = await run(f"DELETE FROM context_calls WHERE {where}")
    deleted.conflicts = await run(f"DELETE FROM conflict_sets WHERE {where}")
    deleted.facts = await run(f"DELETE FROM facts WHERE {where}")
    deleted.events = await run(f"DELETE FROM events WHERE {where}")
    for table in ("fact_term_counts", "scope_lexemes", "scope_documents"):
        await run(f"DELETE FROM {table} WHERE {where}")
    # The versions last, once the deletes above have moved them (migration 0018's triggers wait
    # for the commit unless fired now): no row of the scope is left.
    await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    await run(f"DELETE FROM scope_versions WHERE {where}")
    await _announce_erasure(conn, project_id, subject_id)
    deleted.subject_id = subject_id
    return deleted


# --- helpers ---------------------------------------------------------------------------------


async def _find_by_keys(
    conn: AsyncConnection, sql: str, row_type: type[T], keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], T]:
    """The rows `sql` finds for these (project_id, idempotency_key) pairs, one statement per
    project (each reads one project's shard, docs/scale.md "Citus")."""
    found: dict[tuple[str, str], T] = {}
    cur = conn.cursor(row_factory=dict_row)
    for project_id, project_keys in by_project(keys).items():
        await cur.execute(sql, (project_id, project_keys))
        for row in await cur.fetchall():
            key = row.pop("key")
            found[(project_id, key)] = row_type(**row)
    return found


def by_project(pairs: Iterable[tuple[str, T]]) -> dict[str, list[T]]:
    """(project, item) pairs grouped by project, projects in sorted order: one statement per
    project reads or writes one shard (docs/scale.md "Citus"), and a batch spanning projects locks
    them in one order."""
    grouped: dict[str, list[T]] = {}
    for project_id, item in sorted(pairs, key=lambda pair: pair[0]):
        grouped.setdefault(project_id, []).append(item)
    return grouped


async def _returned_rows(cur: Any, count: int) -> list[Any]:
    """The RETURNING row (or None) of each statement of an `executemany(returning=True)`."""
    rows: list[Any] = []
    for _ in range(count):
        rows.append(await cur.fetchone())
        if not cur.nextset():
            break
    if len(rows) != count:
        raise RuntimeError(f"executemany returned {len(rows)} results for {count} rows")
    return rows
