"""A scope's events and active facts read whole, for the scope cache (`context/scope_cache.py`)
to rank them in memory while they do not change."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from satchel.server.context.domain.episode_ranking import ScopeEvents
from satchel.server.context.domain.fact_ranking import NEVER, ScopeFacts
from satchel.server.context.domain.score import (
    postings_of,
)
from satchel.server.context.storage.sql import VERSION

FLOAT32 = np.dtype(np.float32)  # vectors as stored

# Microseconds since the epoch of a finite instant (NULL for NULL).
_MICROS = "(extract(epoch FROM {0}) * 1000000)::int8"


# A stemmed document's lexemes and their frequencies (BM25).
_LEXEMES = """tsvector_to_array({d}.lexemes) AS lexemes,
       ARRAY(SELECT greatest(cardinality(l.positions), 1) FROM unnest({d}.lexemes) AS l)
           AS frequencies"""


# A scope's events in conversation order with what hybrid ranking reads, and the version they
# are (one statement: one snapshot). A scope without events still returns its version (one row
# of NULL events); one beyond the limit is counted first (an index-only scan), and then none is
# read.
_SCOPE_EVENTS_SQL = f"""
WITH version AS (
    SELECT ({VERSION.format(kind="events")}) AS version,
           (SELECT count(*) FROM (
               SELECT 1 FROM events e
               WHERE e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s
               LIMIT %(max_rows)s + 1
           ) n) > %(max_rows)s AS too_large
)
SELECT version.version, version.too_large, e.id::text AS id, e.kind, e.text, e.occurred_at,
       isfinite(e.occurred_at) AS finite,
       CASE WHEN isfinite(e.occurred_at) THEN {_MICROS.format("e.occurred_at")} END
           AS occurred_us,
       e.embedding, e.lexeme_tokens, {_LEXEMES.format(d="e")}
FROM version LEFT JOIN events e
    ON e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s AND NOT version.too_large
ORDER BY e.occurred_at, e.id
LIMIT %(max_rows)s + 1
"""


# A scope's active facts in id order, likewise, with their conflicts' instants, and the events
# its other facts were drawn from.
_SCOPE_FACTS_SQL = f"""
WITH version AS (
    SELECT ({VERSION.format(kind="facts")}) AS version,
           ARRAY(
               SELECT DISTINCT s.event_id::text
               FROM facts h CROSS JOIN LATERAL unnest(h.source_event_ids) AS s(event_id)
               WHERE h.project_id = %(project_id)s AND h.subject_id = %(subject_id)s
                 AND h.status <> 'active'
           ) AS inactive_sources
)
SELECT version.version, version.inactive_sources, f.id::text AS id, f.predicate,
       f.value::text AS value,
       f.statement, f.confidence, f.valid_from, f.source_event_ids::text[] AS source_event_ids,
       f.since_epoch,
       coalesce(isfinite(f.valid_from), true) AND isfinite(f.recorded_from)
           AND coalesce(isfinite(f.valid_to), true) AS finite,
       {_MICROS.format("coalesce(f.valid_from, f.recorded_from)")} AS anchor_us,
       {_MICROS.format("f.valid_to")} AS valid_to_us,
       {_MICROS.format("f.stale_after")} AS stale_after_us,
       ARRAY(
           SELECT ARRAY[{_MICROS.format("c.opened_at")},
                        CASE WHEN c.status = 'resolved' THEN {_MICROS.format("c.resolved_at")} END]
           FROM conflict_members m
           JOIN conflict_sets c ON c.id = m.conflict_id AND c.project_id = m.project_id
           WHERE m.fact_id = f.id AND m.project_id = f.project_id
       ) AS conflicts,
       f.embedding, f.lexeme_tokens, {_LEXEMES.format(d="f")},
       tsvector_to_array(f.search_vector) AS words
FROM version LEFT JOIN facts f
    ON f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s AND f.status = 'active'
ORDER BY f.id
LIMIT %(max_rows)s + 1
"""


async def _scope_rows(
    conn: AsyncConnection, sql: str, project_id: str, subject_id: str, max_rows: int
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The first row (the version) and the rows of a scope statement; None above `max_rows`
    rows or when an instant is infinite (the statements serve such scopes)."""
    params = {"project_id": project_id, "subject_id": subject_id, "max_rows": max_rows}
    cur = conn.cursor(row_factory=dict_row, binary=True)
    await cur.execute(sql, params)
    rows = await cur.fetchall()
    first = rows[0]
    rows = [r for r in rows if r["id"] is not None]
    if first.get("too_large") or len(rows) > max_rows or not all(r["finite"] for r in rows):
        return None
    return first, rows


def _vectors(rows: list[dict[str, Any]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The rows' embeddings as one matrix of `dtype` (as stored where a component does not fit
    it), and the norms of the stored vectors."""
    if not rows:
        return np.zeros((0, 0), dtype=dtype), np.zeros(0)
    vectors = np.stack([r["embedding"].to_numpy() for r in rows]).astype(np.float32, copy=False)
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    with np.errstate(over="ignore"):
        narrowed = vectors.astype(dtype, copy=False)
    return (narrowed if np.isfinite(narrowed).all() else vectors), norms


async def load_scope_events(
    conn: AsyncConnection,
    project_id: str,
    subject_id: str,
    max_rows: int,
    vector_type: np.dtype = FLOAT32,
) -> ScopeEvents | None:
    """A scope's events as hybrid ranking reads them in memory, their vectors as `vector_type`;
    None above `max_rows`."""
    loaded = await _scope_rows(conn, _SCOPE_EVENTS_SQL, project_id, subject_id, max_rows)
    if loaded is None:
        return None
    # off the event loop: ~20 µs a row
    return await asyncio.to_thread(_scope_events, *loaded, vector_type)


def _scope_events(
    first: dict[str, Any], rows: list[dict[str, Any]], vector_type: np.dtype
) -> ScopeEvents:
    vectors, norms = _vectors(rows, vector_type)
    events = ScopeEvents(
        version=int(first["version"]),
        ids=tuple(r["id"] for r in rows),
        kinds=tuple(r["kind"] for r in rows),
        texts=tuple(r["text"] for r in rows),
        occurred_at=tuple(r["occurred_at"] for r in rows),
        occurred_us=np.array([r["occurred_us"] for r in rows], dtype=np.int64),
        vectors=vectors,
        norms=norms,
        lexeme_tokens=np.array([r["lexeme_tokens"] for r in rows], dtype=np.float64),
        postings=postings_of([(r["lexemes"], r["frequencies"]) for r in rows]),
    )
    events.prepare()
    return events


async def load_scope_facts(
    conn: AsyncConnection,
    project_id: str,
    subject_id: str,
    max_rows: int,
    vector_type: np.dtype = FLOAT32,
) -> ScopeFacts | None:
    """A scope's active facts as hybrid ranking reads them in memory, their vectors as
    `vector_type`; None above `max_rows`."""
    loaded = await _scope_rows(conn, _SCOPE_FACTS_SQL, project_id, subject_id, max_rows)
    if loaded is None:
        return None
    return await asyncio.to_thread(_scope_facts, *loaded, vector_type)


def _lowered(words: list[str]) -> tuple[list[str], list[int]]:
    """A fact's words lower-cased as entities are (a database whose LC_CTYPE is C lowers ASCII
    only), each once."""
    lowered = sorted({word.lower() for word in words})
    return lowered, [1] * len(lowered)


def _scope_facts(
    first: dict[str, Any], rows: list[dict[str, Any]], vector_type: np.dtype
) -> ScopeFacts:
    vectors, norms = _vectors(rows, vector_type)

    def instants(column: str, missing: int) -> np.ndarray:
        return np.array([missing if r[column] is None else r[column] for r in rows], dtype=np.int64)

    facts = ScopeFacts(
        version=int(first["version"]),
        ids=tuple(r["id"] for r in rows),
        predicates=tuple(r["predicate"] for r in rows),
        values=tuple(r["value"] for r in rows),
        statements=tuple(r["statement"] for r in rows),
        confidences=tuple(float(r["confidence"]) for r in rows),
        valid_from=tuple(r["valid_from"] for r in rows),
        source_event_ids=tuple(tuple(r["source_event_ids"]) for r in rows),
        since_epoch=np.array([r["since_epoch"] for r in rows], dtype=np.float64),
        anchor_us=instants("anchor_us", 0),
        valid_to_us=instants("valid_to_us", NEVER),
        stale_after_us=instants("stale_after_us", -1),
        vectors=vectors,
        norms=norms,
        lexeme_tokens=np.array([r["lexeme_tokens"] for r in rows], dtype=np.float64),
        postings=postings_of([(r["lexemes"], r["frequencies"]) for r in rows]),
        words=postings_of([_lowered(r["words"]) for r in rows]),
        conflicts={
            i: tuple(
                (opened, NEVER if resolved is None else resolved) for opened, resolved in found
            )
            for i, r in enumerate(rows)
            if (found := r["conflicts"])
        },
        inactive_sources=frozenset(first["inactive_sources"]),
    )
    facts.prepare()
    return facts
