"""Scope indexes against real PostgreSQL (migration 0013): a scope above the exact cut gets
partial HNSW and GIN indexes of its own, built concurrently by the maintenance, and its context
calls use them; the maintenance drops what no longer qualifies, keeps the largest scopes under
its cap, rebuilds a build that died, runs on one server at a time, and runs as a server starts
and as `satchel index-scopes`.

Each test runs on a database of its own, with the exact cut lowered to 20 facts so that a scope
of a few dozen facts qualifies.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import grpc
import psycopg
import pytest
from helpers.memory import fact_request
from helpers.memory import stub as memory_stub
from test_context_retrieval import HOBBIES, PEOPLE

from satchel.server import cli
from satchel.server.context.domain.scope_indexes import ScopeIndexNames
from satchel.server.context.scope_indexes import ScopeIndexes
from satchel.server.context.storage import scope_indexes as index_store
from satchel.server.context.storage.candidates import fetch_fact_candidates
from satchel.server.context.storage.multi_hop import fetch_multi_hop
from satchel.server.context.storage.plan import plan_query
from satchel.server.context.storage.sql import Scope
from satchel.server.platform.config import Settings
from satchel.server.platform.storage.pool import create_pool
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2

MIN_FACTS = 20
PROJECT = "indexed"


def small_cut(settings: Settings, dsn: str, scope_index_max: int = 0) -> Settings:
    """Settings on `dsn` whose exact cut is MIN_FACTS facts."""
    return replace(
        settings,
        database_url=dsn,
        context=replace(
            settings.context,
            exact_scope_max=MIN_FACTS,
            # Small sources for scopes of a few dozen (or, grown, a few thousand) facts.
            newest_window=64,
            newest_top_k=64,
            retrieval_top_k=8,
            scope_index_top_k=8,  # a small share of the test scope, as 512 is of a large one
        ),
        scope_index_max=scope_index_max,
    )


@pytest.fixture
async def served(
    settings: Settings, fresh_database: str
) -> AsyncIterator[tuple[grpc.aio.Channel, Any, str]]:
    """A server on a database of its own whose maintenance builds nothing (SCOPE_INDEX_MAX 0):
    (channel, server, dsn)."""
    from satchel.server.platform.app import SatchelServer

    srv = SatchelServer(small_cut(settings, fresh_database))
    await srv.start()
    try:
        # Its own first maintenance run (building nothing) is over before the test runs its own.
        while srv.scope_indexes is None or srv.scope_indexes.runs == 0:
            await asyncio.sleep(0.05)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            yield channel, srv, fresh_database
    finally:
        await srv.stop()


def maintenance(dsn: str, max_indexes: int = 8) -> ScopeIndexes:
    """The maintenance as a server with the lowered cut runs it."""
    return ScopeIndexes(
        dsn, min_facts=MIN_FACTS, max_indexes=max_indexes, interval=3600, build_memory_mb=64
    )


async def write_facts(channel: grpc.aio.Channel, subject: str, count: int, seed: int) -> None:
    rng = random.Random(seed)
    await memory_stub(channel).BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(
            requests=[
                fact_request(
                    PROJECT,
                    subject_id=subject,
                    predicate="hobby",
                    statement=f"{rng.choice(PEOPLE)} {rng.choice(HOBBIES)} ({subject} {i})",
                )
                for i in range(count)
            ]
        )
    )


def grow(dsn: str, subject: str, copies: int) -> None:
    """Make a scope large enough that the planner prefers indexes to scanning it: `copies`
    variants of each of its facts, each vector moved a little (written in SQL: embedding
    thousands of statements would only slow the test)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT setseed(0.25)")
        conn.execute(
            "INSERT INTO facts (project_id, subject_id, predicate, value, statement, valid_from,"
            " embedding, embedding_model)"
            " SELECT f.project_id, f.subject_id, f.predicate, f.value, f.statement || ' #' || g,"
            "  f.recorded_from - make_interval(hours => g), f.embedding + n.noise,"
            "  f.embedding_model"
            " FROM facts f CROSS JOIN generate_series(1, %s) g CROSS JOIN LATERAL ("
            "  SELECT array_agg((random() - 0.5) * 0.02)::real[]::vector AS noise"
            "  FROM generate_series(1, 384) WHERE g > 0"  # one draw per copy
            " ) n WHERE f.project_id = %s AND f.subject_id = %s",
            (copies, PROJECT, subject),
        )
        conn.execute("ANALYZE facts")


def indexes_on_facts(dsn: str) -> dict[str, tuple[bool, str]]:
    """The scope indexes present: name -> (valid, definition)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, i.indisvalid, pg_get_indexdef(c.oid)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = 'facts'::regclass"
            " AND c.relname ~ '^facts_scope_[0-9a-f]{20}_(hnsw|lexemes|words)$'"
        ).fetchall()
    return {name: (valid, definition) for name, valid, definition in rows}


async def registry(dsn: str) -> dict[tuple[str, str], bool]:
    """The indexed scopes: whether each one's indexes serve."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await index_store.registry(conn)


async def index_scans(conn: psycopg.AsyncConnection, names: list[str]) -> int:
    """Scans of these indexes so far, this session's included (`conn` in autocommit)."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes WHERE indexrelname = ANY(%s)",
        (names,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_large_scope_gets_indexes_of_its_own_that_its_calls_use(served) -> None:
    channel, server, dsn = served
    await write_facts(channel, "large", 30, seed=1)
    await write_facts(channel, "small", 12, seed=2)
    grow(dsn, "large", 100)

    outcome = await maintenance(dsn).run_once()

    assert list(outcome.built) == [(PROJECT, "large")], "only the scope above the cut"
    assert await registry(dsn) == {(PROJECT, "large"): True}
    names = ScopeIndexNames.of((PROJECT, "large"))
    present = indexes_on_facts(dsn)
    assert set(present) == set(names.all)
    for valid, definition in present.values():
        assert valid
        assert "project_id = 'indexed'" in definition and "subject_id = 'large'" in definition
        assert "status = 'active'" in definition
    assert "USING hnsw (embedding vector_cosine_ops)" in present[names.vector][1]
    assert "USING gin (lexemes)" in present[names.lexemes][1]
    assert "USING gin (search_vector)" in present[names.words][1]

    # The retrieval statement of a call uses both (planned for the scope's values), and ranks
    # as the exact scan does.
    runtime = server.runtime.value
    cfg = runtime.settings.context
    scope = Scope(PROJECT, "large", datetime.now(UTC), historical=False)
    query = "Who bakes sourdough bread?"
    vector = await runtime.embed_query(query)
    pool = create_pool(dsn, min_size=1, max_size=1, ef_search=runtime.settings.hnsw_ef_search)
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            await conn.set_autocommit(True)
            plan = await plan_query(conn, scope, query, cfg)
            assert plan.scope_indexed and plan.scope_facts == MIN_FACTS + 1
            before = [await index_scans(conn, [n]) for n in (names.vector, names.lexemes)]
            # Sorting 3,000 facts costs the planner less than a graph walk; a scope of 100,000
            # would not (benchmarks/context.md): make sorting dear, as it is at that size.
            await conn.execute("SET enable_sort = off")
            rows = await fetch_fact_candidates(conn, scope, vector, cfg, plan)
            await conn.execute("RESET enable_sort")
            after = [await index_scans(conn, [n]) for n in (names.vector, names.lexemes)]
            exact = await fetch_fact_candidates(conn, scope, vector, cfg, plan, exact=True)
            words = await index_scans(conn, [names.words])
            await fetch_multi_hop(conn, scope, vector, cfg, plan, ["Melanie"], [], 1.0)
            assert await index_scans(conn, [names.words]) > words, "multi-hop used its GIN"
            await fetch_fact_candidates(conn, scope, vector, cfg, plan)
            plans = await conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%subject_id = ''large''%'"
            )
            prepared = await plans.fetchall()
    finally:
        await pool.close()
    # Each statement of the scope has the scope written in and runs one generic plan: planning
    # a call's values cost 2-6 ms of every call on a 100,000-fact scope.
    assert len(prepared) == 2, [text[:80] for text, _, _ in prepared]
    assert all(generic >= 1 and custom == 0 for _, generic, custom in prepared), prepared
    assert not rows.exact, "the two-phase statement served it"
    assert after[0] > before[0], "the scope's HNSW index was scanned"
    assert after[1] > before[1], "the scope's lexeme index was scanned"
    assert rows.facts[0].score == pytest.approx(exact.facts[0].score)
    top, exact_top = ({r.id for r in c.facts[:10]} for c in (rows, exact))
    assert len(top & exact_top) >= 8

    # Over gRPC: the packet serves the bread bakers, now and as of now (which reads history
    # through the global indexes).
    stub = context_pb2_grpc.ContextServiceStub(channel)
    now = context_pb2.AssembleContextRequest(project_id=PROJECT, subject_id="large", query=query)
    as_of = context_pb2.AssembleContextRequest()
    as_of.CopyFrom(now)
    as_of.as_of.GetCurrentTime()
    for request in (now, as_of):
        reply = await stub.AssembleContext(request)
        assert "bakes sourdough bread" in reply.packet.facts[0].statement


async def test_the_cap_keeps_the_largest_and_a_shrunk_scope_loses_its_indexes(served) -> None:
    channel, _, dsn = served
    await write_facts(channel, "larger", 40, seed=3)
    await write_facts(channel, "large", 25, seed=4)
    run = maintenance(dsn, max_indexes=1)

    assert list((await run.run_once()).built) == [(PROJECT, "larger")]
    assert set(await registry(dsn)) == {(PROJECT, "larger")}

    await memory_stub(channel).DeleteSubject(
        memory_pb2.DeleteSubjectRequest(project_id=PROJECT, subject_id="larger")
    )
    outcome = await run.run_once()
    assert outcome.dropped == [(PROJECT, "larger")]
    assert list(outcome.built) == [(PROJECT, "large")], "the freed place goes to the next"
    larger, large = ScopeIndexNames.of((PROJECT, "larger")), ScopeIndexNames.of((PROJECT, "large"))
    assert set(indexes_on_facts(dsn)) == set(large.all)
    assert set(await registry(dsn)) == {(PROJECT, "large")}
    assert larger.vector not in indexes_on_facts(dsn)

    # A run with nothing to change changes nothing.
    again = await run.run_once()
    assert (again.built, again.dropped) == ({}, [])
    # SCOPE_INDEX_MAX 0 drops what an earlier configuration built.
    assert (await maintenance(dsn, max_indexes=0).run_once()).dropped == [(PROJECT, "large")]
    assert indexes_on_facts(dsn) == {} and await registry(dsn) == {}


async def test_a_scope_keeps_its_indexes_down_to_half_the_cut(served) -> None:
    channel, _, dsn = served
    await write_facts(channel, "large", 24, seed=5)
    run = maintenance(dsn)
    assert list((await run.run_once()).built) == [(PROJECT, "large")]
    listed = await memory_stub(channel).ListFacts(
        memory_pb2.ListFactsRequest(project_id=PROJECT, subject_id="large", page_size=100)
    )
    ids = [fact.id for fact in listed.facts]
    for fact_id in ids[:10]:  # 14 active facts left: under the cut, above half of it
        await memory_stub(channel).RetireFact(
            memory_pb2.RetireFactRequest(project_id=PROJECT, fact_id=fact_id)
        )
    kept = await run.run_once()
    assert (kept.built, kept.dropped) == ({}, [])
    for fact_id in ids[10:15]:  # 9 left: under half
        await memory_stub(channel).RetireFact(
            memory_pb2.RetireFactRequest(project_id=PROJECT, fact_id=fact_id)
        )
    assert (await run.run_once()).dropped == [(PROJECT, "large")]
    assert indexes_on_facts(dsn) == {}


async def test_a_build_that_died_is_rebuilt(served) -> None:
    channel, _, dsn = served
    await write_facts(channel, "large", 30, seed=6)
    run = maintenance(dsn)
    await run.run_once()
    names = ScopeIndexNames.of((PROJECT, "large"))
    # What a server killed during a build leaves: the scope still `building`, an index missing
    # (a concurrent build that fails leaves it INVALID, which the planner ignores alike).
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE scope_indexes SET state = 'building'")
        conn.execute(f"DROP INDEX {names.lexemes}")
    assert await registry(dsn) == {(PROJECT, "large"): False}

    assert list((await run.run_once()).built) == [(PROJECT, "large")]
    assert await registry(dsn) == {(PROJECT, "large"): True}
    assert all(valid for valid, _ in indexes_on_facts(dsn).values())
    assert set(indexes_on_facts(dsn)) == set(names.all)


async def test_one_server_at_a_time_maintains_them(served) -> None:
    channel, _, dsn = served
    await write_facts(channel, "large", 30, seed=7)
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (index_store.LOCK_KEY,))
        outcome = await maintenance(dsn).run_once()
        assert not outcome.locked and outcome.built == {}
        assert await registry(dsn) == {}
    assert list((await maintenance(dsn).run_once()).built) == [(PROJECT, "large")]


async def test_a_server_maintains_them_as_it_starts_and_the_command_runs_once(
    served, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from satchel.server.platform.app import SatchelServer

    channel, _, dsn = served
    await write_facts(channel, "large", 30, seed=8)
    srv = SatchelServer(small_cut(settings, dsn, scope_index_max=4))
    await srv.start()
    try:
        for _ in range(300):
            if await registry(dsn) == {(PROJECT, "large"): True}:
                break
            await asyncio.sleep(0.1)
        assert await registry(dsn) == {(PROJECT, "large"): True}
    finally:
        await srv.stop()

    await write_facts(channel, "later", 30, seed=9)
    monkeypatch.setenv("SATCHEL_DATABASE_URL", dsn)
    monkeypatch.setenv("SATCHEL_EXACT_SCOPE_MAX", str(MIN_FACTS))
    assert await asyncio.to_thread(cli.main, ["index-scopes"]) == 0
    out = capsys.readouterr().out
    assert f"built   {PROJECT}/later" in out and "1 built, 0 dropped" in out
    assert set(await registry(dsn)) == {(PROJECT, "large"), (PROJECT, "later")}
