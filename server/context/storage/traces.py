"""The traces of context calls, read and written here only: a call and its decisions written
once (`save_trace`), read back for GetTrace (`load_trace`) and for watchers (`load_call`,
`calls_since`; committed calls are announced on `CHANNEL` by a trigger on `context_calls`,
migration 0004_trace_notify, delivered at commit to every listening replica), a project's
overview (`stats_overview`), and retention: the daily partitions of `context_calls` and
`context_traces` (migration 0012), created ahead and dropped past the retention by
`satchel_maintain_traces` under an advisory lock one session holds at a time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row


@dataclass(frozen=True)
class CallRecord:
    """The summary row of one context call."""

    trace_id: uuid.UUID
    project_id: str
    subject_id: str
    query: str
    budget_tokens: int
    as_of: datetime | None
    status: str
    warnings: list[str]
    empty_reason: str
    tokens_used: int
    facts_served: int
    episodes_served: int
    embed_ms: float
    retrieve_ms: float
    pack_ms: float
    total_ms: float


TRACE_COLUMNS = (
    "trace_id",
    "sequence",
    "candidate_id",
    "candidate_kind",
    "outcome",
    "reason_code",
    "score",
    "similarity",
    "text_rank",
    "recency",
    "tokens",
    "budget_used",
    "preview",
)


def _save_trace_sql(durable: bool) -> str:
    """The statement that saves a trace; not `durable`, it commits without waiting for the WAL
    flush: `set_config(..., true)` sets synchronous_commit for the statement's own transaction
    (autocommit: the statement itself)."""
    relax = "" if durable else "relaxed AS (SELECT set_config('synchronous_commit', 'off', true)),"
    return f"""
WITH {relax}
call AS (
    INSERT INTO context_calls (trace_id, project_id, subject_id, query, budget_tokens, as_of,
        status, warnings, empty_reason, tokens_used, facts_served, episodes_served,
        embed_ms, retrieve_ms, pack_ms, total_ms)
    VALUES (%(trace_id)s, %(project_id)s, %(subject_id)s, %(query)s, %(budget_tokens)s,
        %(as_of)s, %(status)s, %(warnings)s, %(empty_reason)s, %(tokens_used)s,
        %(facts_served)s, %(episodes_served)s, %(embed_ms)s, %(retrieve_ms)s, %(pack_ms)s,
        %(total_ms)s)
    -- WatchTraces across replicas: the call is announced on `satchel_traces`, delivered on
    -- commit (a data-modifying CTE runs to completion, even for a call without decisions).
    RETURNING project_id, trace_id, created_at, pg_notify('satchel_traces', json_build_object(
        'project_id', project_id, 'subject_id', subject_id, 'trace_id', trace_id)::text)
)
INSERT INTO context_traces (project_id, created_at, {", ".join(TRACE_COLUMNS)})
SELECT call.project_id, call.created_at, call.trace_id, d.*
FROM call, {"" if durable else "relaxed, "}json_to_recordset(%(decisions)s::json) AS d(
    sequence int, candidate_id uuid, candidate_kind text, outcome text, reason_code text,
    score float8, similarity float8, text_rank float8, recency float8, tokens int,
    budget_used int, preview text
)
"""


_SAVE_TRACE_SQL = {durable: _save_trace_sql(durable) for durable in (True, False)}


# Tries of a trace whose day has no partition (each after making the missing ones).
_PARTITION_ATTEMPTS = 4


async def save_trace(
    conn: AsyncConnection,
    call: CallRecord,
    decision_rows: Sequence[Sequence[Any]],
    *,
    durable: bool = False,
) -> None:
    """Persist a call and all its decisions in one statement (one round trip), committed on
    return; `durable`: once its WAL is on disk too (SATCHEL_TRACE_DURABLE_COMMIT).

    Each decision row holds the values of `TRACE_COLUMNS[1:]`, in order, ids as strings. The
    decisions travel as one JSON array, written by orjson: adapting a dozen typed arrays
    instead took ~1.5 ms of the event loop per call, the standard library's encoder ~0.6 ms.
    """
    params: dict[str, Any] = dict(call.__dict__)
    names = TRACE_COLUMNS[1:]
    rows = [dict(zip(names, row, strict=True)) for row in decision_rows]
    params["decisions"] = orjson.dumps(rows).decode()
    for attempt in range(_PARTITION_ATTEMPTS):
        try:
            await conn.execute(_SAVE_TRACE_SQL[durable], params)
            return
        except psycopg.errors.CheckViolation as exc:
            if not _no_partition(exc) or attempt == _PARTITION_ATTEMPTS - 1:
                raise
        # No partition for today (maintenance could not run for days): make it, then save;
        # another session may be making it (the maintenance lock is taken): wait for it.
        if (await maintain_traces(conn, retention_days=0)).created == 0:
            await asyncio.sleep(0.1 * (attempt + 1))


def _no_partition(exc: psycopg.errors.CheckViolation) -> bool:
    """The error of a row whose partition does not exist."""
    return (exc.diag.message_primary or "").startswith("no partition of relation")


async def load_trace(
    conn: AsyncConnection, project_id: str, trace_id: uuid.UUID
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A call of this project and its decisions in order; None when there is no such call."""
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
    return call, await cur.fetchall()


async def stats_overview(conn: AsyncConnection, project_id: str) -> dict[str, Any]:
    """Call counts, injection rate and latency percentiles of a project's context calls."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        """
        SELECT count(*) AS context_calls,
               count(*) FILTER (WHERE facts_served > 0) AS calls_serving_facts,
               count(*) FILTER (WHERE facts_served = 0 AND episodes_served = 0) AS calls_empty,
               coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY total_ms), 0) AS p50,
               coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY total_ms), 0) AS p95,
               coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY total_ms), 0) AS p99,
               coalesce(avg(tokens_used), 0) AS mean_tokens_used
        FROM context_calls WHERE project_id = %s
        """,
        (project_id,),
    )
    row = await cur.fetchone()
    if row is None:  # an aggregate without GROUP BY returns one row
        raise RuntimeError("the overview statement returned no row")
    return row


# --- watchers ----------------------------------------------------------------------------

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


# --- retention ---------------------------------------------------------------------------

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
