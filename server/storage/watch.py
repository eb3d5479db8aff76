"""SQL of WatchTraces: the channel committed context calls are announced on, and the reads that
rebuild a watched call (its decisions in order and the rows of the facts and episodes it served).

The announcement itself is a trigger on `context_calls` (migration 0004_trace_notify): PostgreSQL
delivers it at commit, to every listening replica.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from satchel.server.storage.context import TRACE_COLUMNS

CHANNEL = "satchel_traces"


@dataclass(frozen=True)
class StoredCall:
    """A committed context call read back for watchers: summary, decisions, served rows."""

    call: dict[str, Any]
    decisions: list[dict[str, Any]]
    facts: dict[str, dict[str, Any]]
    events: dict[str, dict[str, Any]]


async def load_call(
    conn: AsyncConnection, project_id: str, trace_id: uuid.UUID
) -> StoredCall | None:
    """A committed call of the project with its decisions in order and the facts and events
    it included (None when the project has no such call)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "SELECT * FROM context_calls WHERE trace_id = %s AND project_id = %s",
        (trace_id, project_id),
    )
    call = await cur.fetchone()
    if call is None:
        return None
    await cur.execute(
        f"SELECT {', '.join(TRACE_COLUMNS[1:])} FROM context_traces"
        " WHERE trace_id = %s AND project_id = %s ORDER BY sequence",
        (trace_id, project_id),
    )
    decisions = await cur.fetchall()
    included = [d for d in decisions if d["outcome"] == "included"]
    fact_ids = [d["candidate_id"] for d in included if d["candidate_kind"] == "fact"]
    event_ids = [d["candidate_id"] for d in included if d["candidate_kind"] == "episode"]
    facts: dict[str, dict[str, Any]] = {}
    events: dict[str, dict[str, Any]] = {}
    if fact_ids:
        await cur.execute(
            "SELECT id, predicate, value, statement, confidence, valid_from, source_event_ids"
            " FROM facts WHERE project_id = %s AND id = ANY(%s)",
            (project_id, fact_ids),
        )
        facts = {str(r["id"]): r for r in await cur.fetchall()}
    if event_ids:
        await cur.execute(
            "SELECT id, kind, occurred_at, text FROM events WHERE project_id = %s AND id = ANY(%s)",
            (project_id, event_ids),
        )
        events = {str(r["id"]): r for r in await cur.fetchall()}
    return StoredCall(call=call, decisions=decisions, facts=facts, events=events)


async def calls_since(
    conn: AsyncConnection, project_ids: Sequence[str], since: datetime, limit: int
) -> list[tuple[str, str, str]]:
    """(project, subject, trace id) of the calls of these projects created since `since`."""
    cur = await conn.execute(
        "SELECT project_id, subject_id, trace_id::text FROM context_calls"
        " WHERE project_id = ANY(%s) AND created_at >= %s ORDER BY created_at LIMIT %s",
        (list(project_ids), since, limit),
    )
    return [(p, s, t) for p, s, t in await cur.fetchall()]
