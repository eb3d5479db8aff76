"""Ready for a distributed PostgreSQL (Citus) sharded by project (migrations 0014-0017,
docs/scale.md "Citus"), checked on real PostgreSQL since no Citus runs here:

- the catalog: every table is either distributable by `project_id` (the column NOT NULL, in
  every unique key, and in every foreign key between two such tables) or one of the listed
  reference tables (replicated to every node);
- the statements: every SQL statement the server runs, recorded while each RPC and the
  maintenance run, filters each distributed table it reads or writes by `project_id` (Citus
  routes such a statement to the one shard holding the project), except the listed
  maintenance reads that span projects by design;
- the upgrade: a database of the previous version keeps its conflicts and traces, and a
  server of the previous version still writing during a rolling upgrade stays correct.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from google.protobuf import timestamp_pb2
from helpers.memory import event_request, fact_request
from helpers.memory import stub as memory_stub
from helpers.paths import ROOT
from helpers.talents import activate, resolve, upsert
from helpers.talents import stub as talent_stub
from test_scope_indexes import PROJECT as INDEXED
from test_scope_indexes import grow, maintenance, small_cut

from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, talent_pb2

# Each project's rows live on the shard of its project: `create_distributed_table(t, 'project_id')`.
DISTRIBUTED = frozenset(
    {
        "events",
        "facts",
        "conflict_sets",
        "conflict_members",
        "context_calls",
        "context_traces",
        "fact_term_counts",
        "scope_lexemes",
        "scope_documents",
        "scope_versions",
        "talent_activations",
        "talent_project_roles",
        "talent_project_versions",
    }
)
# Small tables every node holds whole: `create_reference_table(t)`.
REFERENCE = {
    "satchel_meta": "the embedding model the database was built with",
    "api_keys": "looked up by key hash before the project is known",
    "talents": "one catalogue shared by every project",
    "talent_edges": "the catalogue's requires/includes/recommends",
    "talent_embeddings": "a cache keyed by text hash, shared by every project",
    "talent_catalogue_version": "one row: the catalogue's version, moved by every upsert",
    "trace_partitions": "the days the trace tables are partitioned into",
    "scope_indexes": "which scopes have indexes of their own (a few dozen rows)",
}
# yoyo's bookkeeping: local to the coordinator, where migrations run.
LOCAL = frozenset({"_yoyo_log", "_yoyo_migration", "_yoyo_version", "yoyo_lock"})

# Statements that span projects by design, with why (each is a maintenance read or a poll
# shared by every watcher of a server; Citus runs them on every shard in parallel).
CROSS_PROJECT = {
    r"FROM scope_documents WHERE documents >=": "the scope-index maintenance finds large scopes",
    r"FROM context_calls WHERE project_id = ANY\(": "one WatchTraces poll serves every watcher",
}

_KEYWORDS = frozenset(
    {"where", "set", "on", "join", "left", "right", "inner", "cross", "full", "using", "order"}
    | {"group", "limit", "with", "values", "select", "returning", "for", "as", "lateral", "union"}
)
_REFERENCE_RE = re.compile(
    r"(?:\b(FROM|JOIN|INTO|UPDATE|USING)\s+|,\s*)(?:ONLY\s+)?(\w+)(?:\s+AS)?(?:\s+(\w+))?",
    re.I,
)


def _without_literals(sql: str) -> str:
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"'(?:[^']|'')*'", "''", sql)
    return " ".join(sql.split())


# A parameter, or a literal (after `_without_literals`: a scope's statements written for it,
# context/storage/sql.py `for_scope`): either routes a comparison to one shard.
_PARAMETER = r"(?:%s|%\(\w+\)s|\$\d+|'')"


def unrouted_tables(sql: str) -> list[str]:
    """The distributed tables `sql` reads or writes without pinning them to one project, once
    per unpinned use: an INSERT must write `project_id`; each other use of a table (or of its
    alias) needs its own comparison of that `project_id` to a parameter or a literal, or to the
    `project_id` of another use that is pinned."""
    text = _without_literals(sql)
    if any(re.search(pattern, text) for pattern in CROSS_PROJECT):
        return []
    missing, uses = [], []
    for match in _REFERENCE_RE.finditer(text):
        verb, table, alias = (match.group(1) or "FROM").upper(), match.group(2), match.group(3)
        if table.lower() not in DISTRIBUTED:
            continue
        if match.group(1) is None and re.match(r"\s*[=),.:]", text[match.end(2) :]):
            continue  # after a comma, a column of that name (a list, an assignment)
        if verb == "INTO":
            columns = re.match(r"(?:\s+AS\s+\w+)?\s*\(([^)]*)\)", text[match.end(2) :], re.I)
            if columns is None or "project_id" not in columns.group(1):
                missing.append(table)
            continue
        uses.append((table, table if alias is None or alias.lower() in _KEYWORDS else alias))
    count = Counter(name for _, name in uses)
    pins = Counter(
        {
            name: len(
                re.findall(
                    rf"\b{name}\.project_id\s*=\s*{_PARAMETER}|{_PARAMETER}\s*=\s*{name}\.project_id\b",
                    text,
                )
            )
            for name in count
        }
    )
    # Unqualified filters: one per unaliased use (WITH a AS (DELETE FROM x WHERE project_id =
    # ...) DELETE FROM y WHERE project_id = ...), or as many as there are for a lone name.
    bare = len(re.findall(rf"(?<![.\w])project_id\s*=\s*{_PARAMETER}", text))
    unaliased = [name for name in count if name.lower() in DISTRIBUTED]
    if len(count) == 1:
        pins[next(iter(count))] += bare
    elif bare >= sum(count[name] for name in unaliased):
        pins.update({name: count[name] for name in unaliased})
    # A join on project_id pins one use of a side when the other side is pinned.
    joins = re.findall(r"\b(\w+)\.project_id\s*=\s*(\w+)\.project_id\b", text)
    applied: set[tuple[int, str]] = set()
    while True:
        new = {
            (i, side)
            for i, (a, b) in enumerate(joins)
            for side, other in ((b, a), (a, b))
            if pins[other] and (i, side) not in applied
        }
        if not new:
            break
        applied |= new
        pins.update(side for _, side in new)
    for name, used in count.items():
        table = next(t for t, n in uses if n == name)
        missing += [table] * max(0, used - pins[name])
    return missing


@pytest.mark.parametrize(
    ("sql", "missing"),
    [
        ("SELECT * FROM facts WHERE id = ANY(%s)", ["facts"]),
        ("SELECT 1 FROM facts f WHERE f.id = %s AND f.project_id = %s", []),
        (
            "SELECT 1 FROM conflict_members m JOIN conflict_sets c ON c.id = m.conflict_id"
            " WHERE c.project_id = %s",
            ["conflict_members"],
        ),
        (
            "SELECT 1 FROM conflict_members m JOIN conflict_sets c ON c.id = m.conflict_id"
            " AND c.project_id = m.project_id WHERE c.project_id = %s",
            [],
        ),
        (
            "INSERT INTO conflict_members (conflict_id, fact_id) VALUES (%s, %s)",
            ["conflict_members"],
        ),
        ("UPDATE events SET text = 'project_id = %s' WHERE id = %s", ["events"]),
        ("SELECT * FROM talents WHERE id = %s", []),  # a reference table
        (  # pinned to a list of projects, not one
            "SELECT 1 FROM unnest(%s::text[]) AS k(project_id)"
            " JOIN events e ON e.project_id = k.project_id",
            ["events"],
        ),
        ("UPDATE facts AS f SET status = 'retired' WHERE f.id = $1 AND f.project_id = $2", []),
        ("SELECT 1 FROM facts f WHERE f.project_id = 'p' AND f.subject_id = 's'", []),
        ("SELECT 1 FROM facts f WHERE f.subject_id = 'p' AND f.id = $1", ["facts"]),
        ("INSERT INTO facts AS f (id, statement) VALUES (%s, %s)", ["facts"]),
        (  # one of two uses of `f` pinned
            "WITH a AS (SELECT f.id FROM facts f WHERE f.project_id = %s)"
            " SELECT f.statement FROM facts f JOIN a USING (id)",
            ["facts"],
        ),
        (
            "SELECT 1 FROM context_calls c, context_traces t WHERE c.project_id = %s",
            ["context_traces"],
        ),
        (
            "SELECT 1 FROM context_calls c, context_traces t WHERE c.project_id = %s"
            " AND t.project_id = c.project_id",
            [],
        ),
        (  # a comment ends at its line's end
            "SELECT 1 FROM facts f -- nearest first\nJOIN events e USING (id)"
            " WHERE f.project_id = %s",
            ["events"],
        ),
    ],
)
def test_the_statement_check_finds_an_unrouted_table(sql: str, missing: list[str]) -> None:
    assert unrouted_tables(sql) == missing


def test_every_table_is_distributable_by_project_or_a_reference_table(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        tables = {
            name
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            )
        }
        project_column = dict(
            conn.execute(
                "SELECT c.relname, NOT a.attnotnull FROM pg_attribute a"
                " JOIN pg_class c ON c.oid = a.attrelid WHERE a.attname = 'project_id'"
                " AND c.relname = ANY(%s)",
                (sorted(tables),),
            ).fetchall()
        )
        unique_keys = conn.execute(
            "SELECT c.relname, i.indexrelid::regclass::text,"
            " ARRAY(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = i.indrelid"
            "  AND a.attnum = ANY(i.indkey))::text[]"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " WHERE i.indisunique AND c.relname = ANY(%s)",
            (sorted(DISTRIBUTED),),
        ).fetchall()
        foreign_keys = conn.execute(
            "SELECT k.conname, k.conrelid::regclass::text, k.confrelid::regclass::text,"
            " ARRAY(SELECT a.attname FROM unnest(k.conkey) WITH ORDINALITY u(n, o)"
            "  JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n"
            "  ORDER BY u.o)::text[],"
            " ARRAY(SELECT a.attname FROM unnest(k.confkey) WITH ORDINALITY u(n, o)"
            "  JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.n"
            "  ORDER BY u.o)::text[]"
            " FROM pg_constraint k WHERE k.contype = 'f' AND k.conparentid = 0"
        ).fetchall()

    assert tables == DISTRIBUTED | set(REFERENCE) | LOCAL, "classify each new table here"
    assert {
        t: nullable for t, nullable in project_column.items() if t in DISTRIBUTED
    } == dict.fromkeys(DISTRIBUTED, False)
    assert unique_keys and [k for k in unique_keys if "project_id" not in k[2]] == []
    for name, table, referenced, columns, referenced_columns in foreign_keys:
        assert table not in REFERENCE or referenced in REFERENCE, name
        if table in DISTRIBUTED and referenced in DISTRIBUTED:
            # the two project columns face each other: a row points into its own project
            assert "project_id" in columns, name
            assert referenced_columns[columns.index("project_id")] == "project_id", name


@contextmanager
def recorded_statements() -> Iterator[list[str]]:
    """Every statement run through psycopg's async cursors meanwhile (the server's queries)."""
    seen: list[str] = []
    execute, executemany = psycopg.AsyncCursor.execute, psycopg.AsyncCursor.executemany

    def text(cursor: Any, query: Any) -> str:
        return query if isinstance(query, str) else query.as_string(cursor.connection)

    async def recorded_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(text(self, query))
        return await execute(self, query, *args, **kwargs)

    async def recorded_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(text(self, query))
        return await executemany(self, query, *args, **kwargs)

    psycopg.AsyncCursor.execute = recorded_execute  # type: ignore[method-assign]
    psycopg.AsyncCursor.executemany = recorded_executemany  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
        psycopg.AsyncCursor.executemany = executemany  # type: ignore[method-assign]


async def every_rpc(channel: Any, dsn: str) -> None:
    """Each RPC of the three services once (and the paths that differ by argument), then the
    scope-index maintenance and a call on an indexed scope."""
    memory, context, talents = (
        memory_stub(channel),
        context_pb2_grpc.ContextServiceStub(channel),
        talent_stub(channel),
    )
    project, other = "routed", "routed-too"
    event = await memory.RecordEvent(
        event_request(
            project, payload={"speaker": "user", "text": "My cat Miso knocked my coffee over"}
        )
    )
    await memory.BatchRecordEvents(
        memory_pb2.BatchRecordEventsRequest(
            requests=[
                event_request(
                    project,
                    payload={"speaker": "user", "text": "I live in Lyon"},
                    idempotency_key="lyon",
                )
            ]
        )
    )
    await memory.ListEvents(memory_pb2.ListEventsRequest(project_id=project, subject_id="user-1"))
    cat = await memory.AssertFact(
        fact_request(
            project,
            predicate="pet",
            value="Miso",
            statement="Ana has a grey cat called Miso",
            source_event_ids=[event.event.id],
        )
    )
    batch = await memory.BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(
            requests=[
                fact_request(
                    project, predicate="budget", value=2000, statement="Budget is 2000 euros"
                ),
                fact_request(
                    project, predicate="city", value="Lyon", statement="Ana lives in Lyon"
                ),
                fact_request(
                    project, predicate="city", value="Paris", statement="Ana lives in Paris"
                ),
                fact_request(project, predicate="drink", value="tea", statement="Ana drinks tea"),
            ]
        )
    )
    budget, lyon, paris, tea = (f.id for f in batch.facts)
    await memory.AssertFact(
        fact_request(
            project,
            predicate="budget",
            value=3000,
            statement="Budget is 3000 euros",
            supersedes_fact_ids=[budget],
        )
    )
    coffee = await memory.AssertFact(
        fact_request(
            project,
            predicate="drink",
            value="coffee",
            statement="Ana drinks coffee",
            idempotency_key="coffee",
        )
    )
    await memory.SupersedeFact(
        memory_pb2.SupersedeFactRequest(
            project_id=project, fact_id=tea, superseded_by_fact_id=coffee.fact.id
        )
    )
    await memory.RetireFact(
        memory_pb2.RetireFactRequest(project_id=project, fact_id=coffee.fact.id, reason="wrong")
    )
    conflict = await memory.OpenConflict(
        memory_pb2.OpenConflictRequest(
            project_id=project, subject_id="user-1", fact_ids=[lyon, paris]
        )
    )
    await memory.ListConflicts(
        memory_pb2.ListConflictsRequest(project_id=project, subject_id="user-1")
    )
    for as_of in (None, timestamp_pb2.Timestamp(seconds=2_000_000_000)):
        await memory.ListFacts(
            memory_pb2.ListFactsRequest(
                project_id=project, subject_id="user-1", include_inactive=True, as_of=as_of
            )
        )
        assembled = await context.AssembleContext(
            context_pb2.AssembleContextRequest(
                project_id=project,
                subject_id="user-1",
                query="what did Ana's cat do?",
                budget_tokens=200,
                as_of=as_of,
            )
        )
    watch = context.WatchTraces(context_pb2.WatchTracesRequest(project_id=project))
    await asyncio.sleep(0.3)  # subscribed
    async for _ in context.StreamContext(
        context_pb2.StreamContextRequest(
            project_id=project, subject_id="user-1", query="Where does Ana live?", budget_tokens=200
        )
    ):
        pass
    await asyncio.wait_for(watch.read(), timeout=10)
    watch.cancel()
    await context.GetTrace(
        context_pb2.GetTraceRequest(project_id=project, trace_id=assembled.trace_id)
    )
    await context.GetStatsOverview(context_pb2.GetStatsOverviewRequest(project_id=project))
    await memory.ResolveConflict(
        memory_pb2.ResolveConflictRequest(
            project_id=project, conflict_id=conflict.conflict.id, winning_fact_id=lyon
        )
    )
    await memory.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project, event_id=event.event.id)
    )
    await memory.AssertFact(
        fact_request(project, subject_id="user-2", statement="Invoices in French")
    )
    await memory.DeleteSubject(
        memory_pb2.DeleteSubjectRequest(project_id=project, subject_id="user-2")
    )
    assert cat.fact.id

    await upsert(
        talents, "routed-python", summary="Python style", roles=["dev"], requires=["routed-tests"]
    )
    await upsert(talents, "routed-tests", summary="Write tests first")
    await activate(talents, other, ["routed-python", "routed-tests"])
    await talents.ListTalents(talent_pb2.ListTalentsRequest(project_id=other, active_only=True))
    await resolve(talents, other, "refactor a Python module", role="dev")
    await talents.DiagnoseProject(
        talent_pb2.DiagnoseProjectRequest(project_id=other, roles=["dev"])
    )

    # A scope above the (lowered) exact cut: the maintenance indexes it, its calls use them.
    await memory.BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(
            requests=[
                fact_request(
                    INDEXED,
                    subject_id="large",
                    predicate="hobby",
                    statement=f"Ana plays chess, game {i}",
                )
                for i in range(30)
            ]
        )
    )
    await asyncio.to_thread(grow, dsn, "large", 3)
    assert (await maintenance(dsn).run_once()).built
    await context.AssembleContext(
        context_pb2.AssembleContextRequest(
            project_id=INDEXED, subject_id="large", query="chess", budget_tokens=200
        )
    )
    await memory.DeleteProject(memory_pb2.DeleteProjectRequest(project_id=project))


async def test_every_statement_of_an_rpc_is_routed_to_one_project(
    settings: Settings, fresh_database: str
) -> None:
    from satchel.server.platform.app import SatchelServer

    srv = SatchelServer(small_cut(settings, fresh_database))
    await srv.start()
    try:
        import grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            with recorded_statements() as seen:
                await every_rpc(channel, fresh_database)
    finally:
        await srv.stop()

    statements = sorted(set(seen))  # as sent: a comment ends at its line's end
    read = {
        t
        for s in statements
        for m in _REFERENCE_RE.finditer(s)
        if (t := m.group(2).lower()) in DISTRIBUTED
    }
    assert read == DISTRIBUTED  # each distributed table was read or written by some RPC
    unrouted = [
        f"{unrouted_tables(s)} in {' '.join(s.split())}" for s in statements if unrouted_tables(s)
    ]
    assert not unrouted, "\n".join(unrouted)


def migrate_up_to(dsn: str, last: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Apply the migrations up to `last` (a file name prefix, "0013") and no further."""
    from satchel.server.platform.storage import migrations

    before = tmp_path / "migrations"
    before.mkdir()
    for path in (ROOT / "migrations").glob("*.sql"):
        if path.name[:4] <= last:
            shutil.copy(path, before)
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "migrations_directory", lambda: str(before))
        migrations.apply_migrations(dsn)


# What a server of the previous version runs (server/storage of 0013): members and decisions
# written without their project.
PREVIOUS_MEMBERS = (
    "INSERT INTO conflict_members (conflict_id, fact_id) SELECT %s, unnest(%s::uuid[])"
)
PREVIOUS_SAVE_TRACE = """
WITH call AS (
    INSERT INTO context_calls (trace_id, project_id, subject_id, query, budget_tokens, status)
    VALUES (%s, %s, 's', 'q', 10, 'ok')
    RETURNING trace_id, created_at
)
INSERT INTO context_traces (created_at, trace_id, sequence, candidate_id, candidate_kind,
    outcome, reason_code, score, similarity, text_rank, recency, tokens, budget_used, preview)
SELECT call.created_at, call.trace_id, d.*
FROM call, (VALUES (0, %s::uuid, 'fact', 'included', 'relevance', 1.0, 1.0, 0.0, 1.0, 3, 3, 'a'),
                   (1, %s::uuid, 'fact', 'excluded', 'budget', 0.5, 0.5, 0.0, 1.0, 3, 3, 'b')) AS d
"""


def previous_version_writes(conn: psycopg.Connection, project_id: str) -> tuple[uuid.UUID, ...]:
    """Two facts in a conflict and a traced call, written as the previous version writes them:
    (conflict id, trace id)."""
    facts = [
        conn.execute(
            "INSERT INTO facts (project_id, subject_id, predicate, value, statement, embedding,"
            " embedding_model) VALUES (%s, 's', 'city', '\"x\"', %s,"
            " array_fill(0.1, ARRAY[384])::vector, 'm') RETURNING id",
            (project_id, statement),
        ).fetchone()[0]
        for statement in ("Ana lives in Lyon", "Ana lives in Paris")
    ]
    (conflict_id,) = conn.execute(
        "INSERT INTO conflict_sets (project_id, subject_id) VALUES (%s, 's') RETURNING id",
        (project_id,),
    ).fetchone()
    conn.execute(PREVIOUS_MEMBERS, (conflict_id, facts))
    trace_id = uuid.uuid4()
    conn.execute(PREVIOUS_SAVE_TRACE, (trace_id, project_id, *facts))
    return conflict_id, trace_id


def projects_of(conn: psycopg.Connection, conflict_id: uuid.UUID, trace_id: uuid.UUID) -> list:
    members = conn.execute(
        "SELECT project_id FROM conflict_members WHERE conflict_id = %s", (conflict_id,)
    ).fetchall()
    decisions = conn.execute(
        "SELECT project_id FROM context_traces WHERE trace_id = %s ORDER BY sequence",
        (trace_id,),
    ).fetchall()
    return [p for (p,) in members + decisions]


def test_the_upgrade_gives_members_and_decisions_their_project(
    fresh_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of the previous version (0013) with a conflict, a traced call and a decision
    whose call is gone: after 0014-0017 each member and decision holds its project, the orphan is
    gone, and the keys and foreign keys carry the project, validated."""
    from satchel.server.platform.storage import migrations

    migrate_up_to(fresh_database, "0013", tmp_path, monkeypatch)
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conflict_id, trace_id = previous_version_writes(conn, "before")
        orphan = uuid.uuid4()
        conn.execute(
            "INSERT INTO context_traces (trace_id, sequence, candidate_id, candidate_kind,"
            " outcome, reason_code, score, similarity, text_rank, recency, tokens, budget_used)"
            " VALUES (%s, 0, %s, 'fact', 'included', 'relevance', 1, 1, 0, 1, 3, 3)",
            (orphan, uuid.uuid4()),
        )

    assert migrations.apply_migrations(fresh_database)[:4] == [
        "0014_distribution_columns",
        "0015_distribution_keys",
        "0016_trace_distribution_keys",
        "0017_validate_distribution_keys",
    ]

    with psycopg.connect(fresh_database) as conn:
        assert projects_of(conn, conflict_id, trace_id) == ["before"] * 4
        assert conn.execute(
            "SELECT count(*) FROM context_traces WHERE trace_id = %s", (orphan,)
        ).fetchone() == (0,)
        keys = dict(
            conn.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE contype IN ('p', 'f') AND conparentid = 0 AND convalidated"
                " AND conrelid::regclass::text = ANY(%s)",
                (["events", "facts", "conflict_sets", "conflict_members", "context_calls"],),
            ).fetchall()
        )
    assert keys["events_pkey"] == "PRIMARY KEY (id, project_id)"
    assert keys["facts_pkey"] == "PRIMARY KEY (id, project_id)"
    assert keys["conflict_members_pkey"] == "PRIMARY KEY (conflict_id, fact_id, project_id)"
    assert keys["context_calls_pkey"] == "PRIMARY KEY (trace_id, created_at, project_id)"
    assert keys["facts_superseded_by_fkey"] == (
        "FOREIGN KEY (superseded_by, project_id) REFERENCES facts(id, project_id)"
    )
    assert keys["conflict_members_fact_id_fkey"] == (
        "FOREIGN KEY (fact_id, project_id) REFERENCES facts(id, project_id)"
    )


async def test_a_previous_version_server_keeps_writing_during_the_upgrade(
    pg_dsn: str, project_id: str
) -> None:
    """A server of the previous version, still running while the new one migrated, writes
    conflict members and trace decisions without their project: each gets its project (the
    migration's triggers), and the new server reads the trace back."""
    from satchel.server.context.storage.traces import load_trace

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conflict_id, trace_id = previous_version_writes(conn, project_id)
        assert projects_of(conn, conflict_id, trace_id) == [project_id] * 4
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        loaded = await load_trace(conn, project_id, trace_id)
        assert loaded is not None and [d["preview"] for d in loaded[1]] == ["a", "b"]
        assert await load_trace(conn, "another-project", trace_id) is None
