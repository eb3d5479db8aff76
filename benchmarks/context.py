"""Context retrieval benchmark: exact full scan vs two-phase, top-10 agreement, whole calls.

    .venv/bin/python benchmarks/context.py [--sizes 10000 100000] [--conversation 300]
        [--queries 200] [--load-order chronological|random]

Loads, into one facts table of a scratch database on the embedded PostgreSQL (or
SATCHEL_DATABASE_URL): a conversation-sized scope through the public API (facts and events,
as an agent writes them), then synthetic scopes of each size (vectors mixing real embeddings
of an activity, a person and a city, templated statements, validity dates spread over two
years, inserted oldest first as facts arrive, or in random order). Then prints for each scope,
side by side in one run: the exact full-scan latency, the two-phase latency (p50/p90) and its
top-10 agreement with the exact ranking for several settings, the query embedding alone, and
whole AssembleContext calls over gRPC.

    .venv/bin/python benchmarks/context.py --scopes 1000 --total 1000000 [--traces 100000]
        [--queries 100] --conversation 0

loads instead one project of many scopes of skewed sizes (the largest 100,000, 50,000 and
20,000 facts, one of 0.1 % of the total, the others log-normal, mostly small), written
interleaved and oldest first through one binary COPY, plus earlier calls' traces; then prints
the load's facts/s, the tables' and indexes' sizes, and for the three largest scopes, the
0.1 % one and the median one: exact vs two-phase retrieval and top-10 agreement, the rows the
K-nearest scan visits under the scope filter, and whole calls over gRPC. It measures them
twice, side by side: with the global HNSW index only (before), then after the scope index
maintenance has given each scope above SATCHEL_EXACT_SCOPE_MAX its own
(server/context/scope_indexes.py, timed; the servers of this phase keep them). Then whole
calls spread over every scope scored exactly, round-robin and Zipf, with the scope cache on
and off, each on a `satchel serve` of its own (`benchmarks/scope_spread.py`: hit rate, RSS and
the ratio to the query's embedding; `--spread-calls`, `--spread-cache-mb`). `--reuse DSN`
measures a database such a run loaded (its scope indexes dropped first) instead of loading
one; `--spread-only` with it runs the spread alone (scope indexes kept).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from scope_spread import run_spread

from satchel.server.context.storage.candidates import fetch_fact_candidates
from satchel.server.context.storage.plan import plan_query
from satchel.server.context.storage.sql import Scope
from satchel.server.memory.storage import records as memory_store
from satchel.server.platform.config import ContextSettings, Settings
from satchel.server.platform.storage.migrations import apply_migrations
from satchel.server.platform.storage.pool import create_pool

NAMES = [
    "Caroline",
    "Melanie",
    "Jordan",
    "Priya",
    "Tomas",
    "Aiko",
    "Lucas",
    "Amara",
    "Noah",
    "Sofia",
    "Mateo",
    "Leila",
    "Oskar",
    "Hana",
    "Diego",
    "Ines",
    "Felix",
    "Nadia",
    "Omar",
    "Clara",
    "Ravi",
    "Elena",
    "Kofi",
    "Mira",
    "Jonas",
    "Yuki",
    "Marco",
    "Zara",
    "Emil",
    "Lena",
]
CITIES = [
    "Lisbon",
    "Boston",
    "Nairobi",
    "Osaka",
    "Porto",
    "Denver",
    "Lyon",
    "Austin",
    "Seville",
    "Oslo",
    "Dublin",
    "Krakow",
    "Quito",
    "Hanoi",
    "Perth",
    "Bergen",
    "Turin",
    "Leeds",
    "Malmo",
    "Tartu",
]
VERBS = [
    "plays",
    "collects",
    "paints",
    "repairs",
    "teaches",
    "studies",
    "photographs",
    "sells",
    "builds",
    "writes about",
    "designs",
    "restores",
    "sings about",
    "reads about",
    "organises meetups about",
    "volunteers to help with",
    "is afraid of",
    "dreams about",
    "is allergic to",
    "makes videos about",
    "trains for",
    "saves money for",
    "argues with friends about",
    "records podcasts about",
    "draws comics about",
]
OBJECTS = [
    "jazz records",
    "vintage bicycles",
    "mountain landscapes",
    "Japanese poetry",
    "sourdough bread",
    "electric cars",
    "rescue dogs",
    "chess openings",
    "marathon running",
    "medieval history",
    "indoor climbing",
    "tomato plants",
    "string quartets",
    "street art",
    "board games",
    "sea kayaking",
    "quantum physics",
    "wooden furniture",
    "folk dancing",
    "vegetarian cooking",
    "old cameras",
    "football tactics",
    "bird watching",
    "space telescopes",
    "ceramic pottery",
    "craft beer",
    "tax law",
    "yoga retreats",
    "video game music",
    "night photography",
    "children's books",
    "peanut butter",
    "wind turbines",
    "sign language",
    "salsa dancing",
    "ancient coins",
]
ACTIVITIES = [f"{verb} {obj}" for verb in VERBS for obj in OBJECTS]
QUESTIONS = [
    "Who {verb} {obj}?",
    "Does {name} like {obj}?",
    "What does {name} think about {obj}?",
    "Tell me what {name} {verb}.",
    "Which friend {verb} {obj}?",
]


def questions(count: int, rng: random.Random) -> list[str]:
    """Questions in the vocabulary of the facts, some naming a person."""
    return [
        rng.choice(QUESTIONS).format(
            name=rng.choice(NAMES), verb=rng.choice(VERBS), obj=rng.choice(OBJECTS)
        )
        for _ in range(count)
    ]


def synthetic_facts(
    n: int, parts: dict[str, np.ndarray], rng: np.random.Generator, chronological: bool
) -> list[tuple]:
    """Templated statements whose vectors mix real embeddings of their activity, person and
    city (plus noise): facts cluster by activity, and the person named still matters. Oldest
    first when `chronological` (facts arrive over time), else in random order."""
    now = datetime.now(UTC)
    rows = []
    noise = rng.normal(0.0, 0.02, size=(n, parts["activity"].shape[1])).astype(np.float32)
    for i in range(n):
        a, p, c = (int(rng.integers(len(parts[k]))) for k in ("activity", "name", "city"))
        when = now - timedelta(days=float(rng.uniform(0, 730)))
        statement = f"{NAMES[p]} {ACTIVITIES[a]} in {CITIES[c]} since {when:%B %Y}"
        vector = (
            0.75 * parts["activity"][a] + 0.45 * parts["name"][p] + 0.25 * parts["city"][c]
        ) + noise[i]
        rows.append((statement, vector / np.linalg.norm(vector), when))
    if chronological:
        rows.sort(key=lambda row: row[2])
    return rows


def drop_hnsw(conn: psycopg.Connection) -> str:
    """Drop the facts' HNSW index before a bulk load; the statement that makes it again, exactly
    as the migrations define it."""
    create_index = conn.execute(
        "SELECT pg_get_indexdef('facts_embedding_hnsw'::regclass)"
    ).fetchone()[0]
    conn.execute("DROP INDEX facts_embedding_hnsw")
    return create_index


def count_words(conn: psycopg.Connection, project: str, batch: int = 20_000) -> None:
    """The word and lexeme counts the write path keeps, for a project's loaded facts, batch by
    batch as the write path adds them."""
    ids = [r[0] for r in conn.execute("SELECT id FROM facts WHERE project_id = %s", (project,))]
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        conn.execute(memory_store.COUNT_FACT_TERMS_SQL, (project, chunk))
        conn.execute(memory_store.COUNT_LEXEMES_SQL["facts"], {"project_id": project, "ids": chunk})


def load_scope(dsn: str, project: str, rows: list[tuple]) -> float:
    """COPY the facts in, count their words as the write path does, then build the HNSW index
    once (as a bulk load should); seconds."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        create_index = drop_hnsw(conn)
        with conn.cursor().copy(
            "COPY facts (project_id, subject_id, predicate, value, statement, valid_from,"
            " embedding, embedding_model) FROM STDIN"
        ) as copy:
            for statement, vector, when in rows:
                literal = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
                copy.write_row(
                    (project, "s", "note", '{"kind": "synthetic"}', statement, when, literal, "b")
                )
        count_words(conn, project)
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute(create_index)
        conn.execute("VACUUM ANALYZE facts")
    return time.perf_counter() - started


async def load_conversation(settings: Settings, project: str, facts: int, seed: int) -> float:
    """A conversation-sized scope written through the public API, as an agent would: twice as
    many events (messages) as facts, each fact sourced from one of them; seconds."""
    import grpc
    from google.protobuf import struct_pb2

    from satchel.server.platform.app import SatchelServer
    from satchel.v1 import memory_pb2, memory_pb2_grpc

    rng = random.Random(seed)
    started = time.perf_counter()
    server = SatchelServer(replace(settings, listen="127.0.0.1:0"))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            events = []
            for _ in range(2 * facts):
                payload = struct_pb2.Struct()
                payload.update(
                    {
                        "speaker": rng.choice(NAMES[:2]),
                        "text": f"I {rng.choice(ACTIVITIES)} in {rng.choice(CITIES)}"
                        f" with {rng.choice(NAMES)}",
                    }
                )
                events.append(
                    memory_pb2.RecordEventRequest(
                        project_id=project,
                        subject_id="s",
                        kind="conversation.message",
                        payload=payload,
                    )
                )
            recorded = await stub.BatchRecordEvents(
                memory_pb2.BatchRecordEventsRequest(requests=events)
            )
            event_ids = [e.id for e in recorded.events]
            requests = [
                memory_pb2.AssertFactRequest(
                    project_id=project,
                    subject_id="s",
                    predicate="note",
                    value=struct_pb2.Value(string_value="synthetic"),
                    statement=f"{rng.choice(NAMES)} {rng.choice(ACTIVITIES)}"
                    f" in {rng.choice(CITIES)}",
                    source_event_ids=[rng.choice(event_ids)],
                )
                for _ in range(facts)
            ]
            await stub.BatchAssertFacts(memory_pb2.BatchAssertFactsRequest(requests=requests))
    finally:
        await server.stop()
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _row(label: str, times: list[float], tail: str = "") -> str:
    return (
        f"  {label:<44} p50 {percentile(times, 0.5):7.2f} ms"
        f"   p90 {percentile(times, 0.9):7.2f} ms   p95 {percentile(times, 0.95):7.2f} ms{tail}"
    )


# (K, newest window, K max): "fixed" runs one round, "adaptive" widens while needed.
GRID = [
    (64, 2048, 64),
    (64, 2048, 1024),
    (64, 4096, 1024),
    (128, 3072, 1024),
    (128, 3584, 128),
    (128, 3584, 1024),
    (128, 4096, 1024),
    (256, 8192, 1024),
]


async def measure_sql(
    dsn: str,
    settings: Settings,
    project: str,
    queries: list[tuple[str, np.ndarray]],
    subject: str = "s",
    grid: bool = True,
) -> None:
    """Exact and two-phase retrieval of one scope: latency and top-10 agreement with the exact
    ranking, for the default settings and (`grid`) the settings of GRID."""
    pool = create_pool(dsn, min_size=1, max_size=2, ef_search=settings.hnsw_ef_search)
    await pool.open(wait=True)
    scope = Scope(project, subject, datetime.now(UTC), historical=False)
    defaults = settings.context
    async with pool.connection() as conn:
        # The searched words and the scope's size need no vector: a context call looks them up
        # while the query is embedded. Timed apart, then given to every run.
        plan_ms, plans = [], []
        for text, _ in queries:
            started = time.perf_counter()
            plans.append(await plan_query(conn, scope, text, defaults))
            plan_ms.append((time.perf_counter() - started) * 1000)
        exact_ms, exact_top = [], []
        reference = replace(defaults, candidate_limit=10)
        for (_, vector), plan in zip(queries, plans, strict=True):
            started = time.perf_counter()
            rows = await fetch_fact_candidates(conn, scope, vector, reference, plan, exact=True)
            exact_ms.append((time.perf_counter() - started) * 1000)
            exact_top.append([r.id for r in rows.facts[:10]])
        print(_row("exact full scan", exact_ms))
        print(_row("words and scope size (during the embedding)", plan_ms))

        async def run(cfg: ContextSettings, label: str) -> None:
            times, same, overlap = [], 0, 0.0
            for (text, vector), exact in zip(queries, exact_top, strict=True):
                plan = await plan_query(conn, scope, text, cfg)
                started = time.perf_counter()
                rows = await fetch_fact_candidates(conn, scope, vector, cfg, plan)
                times.append((time.perf_counter() - started) * 1000)
                got = [r.id for r in rows.facts[:10]]
                same += set(got) == set(exact)
                overlap += len(set(got) & set(exact)) / max(1, len(exact))
            tail = (
                f"   top-10 identical {100 * same / len(queries):5.1f} %"
                f"   overlap {100 * overlap / len(queries):5.1f} %"
            )
            print(_row(label, times, tail))

        exact_path = plans[0].scope_facts <= defaults.exact_scope_max
        if exact_path:
            await run(defaults, "default: exact path (a small scope)")
        elif not grid:
            await run(defaults, "default: two-phase")
        # Two phases (forced for a small scope), for scopes larger than the smallest window.
        larger = plans[0].scope_facts > min(window for _, window, _ in GRID)
        for top_k, window, top_k_max in GRID if larger and grid else ():
            cfg = replace(
                defaults,
                exact_scope_max=0,
                retrieval_top_k=top_k,
                newest_window=window,
                retrieval_top_k_max=top_k_max,
            )
            mode = "adaptive" if top_k_max > top_k else "fixed"
            default = not exact_path and (top_k, window, top_k_max) == (
                defaults.retrieval_top_k,
                defaults.newest_window,
                defaults.retrieval_top_k_max,
            )
            label = f"{'default: ' if default else ''}two-phase K={top_k} window={window} {mode}"
            await run(cfg, label)
    await pool.close()


async def measure_calls(
    settings: Settings, project: str, texts: list[str], subject: str = "s"
) -> None:
    """Whole AssembleContext calls over gRPC vs the query embedding alone, interleaved."""
    import grpc

    from satchel.server.platform.app import SatchelServer
    from satchel.v1 import context_pb2, context_pb2_grpc

    server = SatchelServer(replace(settings, listen="127.0.0.1:0"))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = context_pb2_grpc.ContextServiceStub(channel)
            runtime = server.runtime.value
            for text in texts[:5]:  # warm-up
                await stub.AssembleContext(
                    context_pb2.AssembleContextRequest(
                        project_id=project, subject_id=subject, query=text
                    )
                )
            call_ms, embed_ms = [], []
            for text in texts:
                started = time.perf_counter()
                await runtime.embed_query(text + " ")
                embed_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await stub.AssembleContext(
                    context_pb2.AssembleContextRequest(
                        project_id=project, subject_id=subject, query=text
                    )
                )
                call_ms.append((time.perf_counter() - started) * 1000)
    finally:
        await server.stop()
    ratio = statistics.median(call_ms) / statistics.median(embed_ms)
    print(_row("query embedding alone", embed_ms))
    print(_row("AssembleContext over gRPC", call_ms, f"   ratio to embedding {ratio:4.2f}x"))


# --- many scopes in one project (issue 18: a million facts over a thousand scopes) --------

LARGE_SCOPES = (100_000, 50_000, 20_000)
COPY_CHUNK = 50_000


def scope_sizes(scopes: int, total: int, rng: np.random.Generator) -> list[int]:
    """Skewed scope sizes summing to `total`: the LARGE_SCOPES that fit in a fifth of it, one
    scope of 0.1 % of it, and the others log-normal (most small, under 20,000)."""
    large = [size for size in LARGE_SCOPES if size <= total // 5]
    tenth = max(1, total // 1000)
    count = scopes - len(large) - 1
    remaining = total - sum(large) - tenth
    weights = rng.lognormal(0.0, 1.3, count)
    sizes = np.clip(np.floor(weights / weights.sum() * remaining), 1, 19_999).astype(int)
    sizes[int(np.argmin(sizes))] += remaining - int(sizes.sum())
    return [*large, tenth, *sizes.tolist()]


def load_many_scopes(
    dsn: str, project: str, sizes: list[int], parts: dict[str, np.ndarray], seed: int
) -> dict[str, float]:
    """Bulk-load the scopes' facts as tenants write them: interleaved, oldest first, one binary
    COPY; then the word counts the write path keeps and the HNSW index, built once. Seconds of
    each step."""
    from pgvector.psycopg import register_vector
    from psycopg.types.json import Jsonb

    rng = np.random.default_rng(seed)
    owners = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(owners)
    total = len(owners)
    now = datetime.now(UTC)
    ages = np.sort(rng.uniform(0.0, 730.0, total))[::-1]  # days; the oldest arrives first
    seconds: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        create_index = drop_hnsw(conn)
        started = time.perf_counter()
        value = Jsonb({"kind": "synthetic"})
        with conn.cursor().copy(
            "COPY facts (project_id, subject_id, predicate, value, statement, valid_from,"
            " embedding, embedding_model) FROM STDIN WITH (FORMAT BINARY)"
        ) as copy:
            copy.set_types(
                ["text", "text", "text", "jsonb", "text", "timestamptz", "vector", "text"]
            )
            for start in range(0, total, COPY_CHUNK):
                chunk = owners[start : start + COPY_CHUNK]
                n = len(chunk)
                a, p, c = (
                    rng.integers(len(parts[k]), size=n) for k in ("activity", "name", "city")
                )
                vectors = (
                    0.75 * parts["activity"][a] + 0.45 * parts["name"][p] + 0.25 * parts["city"][c]
                ) + rng.normal(0.0, 0.02, size=(n, parts["activity"].shape[1]))
                vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(
                    np.float32
                )
                for i in range(n):
                    when = now - timedelta(days=float(ages[start + i]))
                    statement = (
                        f"{NAMES[p[i]]} {ACTIVITIES[a[i]]} in {CITIES[c[i]]} since {when:%B %Y}"
                    )
                    subject = f"scope-{int(chunk[i]):04d}"
                    copy.write_row(
                        (project, subject, "note", value, statement, when, vectors[i], "b")
                    )
        seconds["copy"] = time.perf_counter() - started
        started = time.perf_counter()
        count_words(conn, project)
        seconds["word counts"] = time.perf_counter() - started
        started = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '4GB'")
        conn.execute(create_index)
        seconds["HNSW index"] = time.perf_counter() - started
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE facts")
        seconds["vacuum analyze"] = time.perf_counter() - started
    return seconds


def load_traces(dsn: str, project: str, subjects: list[str], calls: int, seed: int) -> float:
    """Earlier context calls' traces (30 decisions each, over the past week); seconds."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.cursor().copy(
            "COPY context_calls (trace_id, project_id, subject_id, query, budget_tokens, status,"
            " created_at, tokens_used, facts_served, total_ms) FROM STDIN WITH (FORMAT BINARY)"
        ) as copy:
            copy.set_types(
                ["uuid", "text", "text", "text", "int4", "text", "timestamptz", "int4", "int4",
                 "float8"]
            )  # fmt: skip
            made = []
            for _ in range(calls):
                trace_id, when = uuid.uuid4(), now - timedelta(days=rng.uniform(0, 7))
                made.append((trace_id, when))
                copy.write_row(
                    (trace_id, project, rng.choice(subjects), "what did they do lately?", 900,
                     "ok", when, 850, 8, 30.0)
                )  # fmt: skip
        with conn.cursor().copy(
            "COPY context_traces (project_id, trace_id, created_at, sequence, candidate_id,"
            " candidate_kind, outcome, reason_code, score, similarity, text_rank, recency,"
            " tokens, budget_used, preview) FROM STDIN WITH (FORMAT BINARY)"
        ) as copy:
            copy.set_types(
                ["text", "uuid", "timestamptz", "int4", "uuid", "text", "text", "text", "float8",
                 "float8", "float8", "float8", "int4", "int4", "text"]
            )  # fmt: skip
            for trace_id, when in made:
                for sequence in range(30):
                    copy.write_row(
                        (project, trace_id, when, sequence, uuid.uuid4(), "fact", "included",
                         "relevance", 0.5, 0.5, 0.1, 0.9, 28, 28 * (sequence + 1),
                         "Caroline hikes trails in Lisbon")
                    )  # fmt: skip
        conn.execute("VACUUM ANALYZE context_calls, context_traces")
    return time.perf_counter() - started


def sizes_report(dsn: str) -> list[str]:
    """The facts table, its indexes and the trace tables, by size."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_size_pretty(pg_relation_size(c.oid))"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')"
            " AND (c.relname LIKE 'facts%%' OR c.relname LIKE 'context_%%')"
            " AND pg_relation_size(c.oid) > 8192 ORDER BY pg_relation_size(c.oid) DESC"
        ).fetchall()
    return [f"  {name:<44} {size}" for name, size in rows]


async def nearest_rows_visited(
    dsn: str, settings: Settings, project: str, subject: str, vectors: list[np.ndarray]
) -> tuple[str, float, float]:
    """How PostgreSQL finds the scope's K nearest facts (phase 1's `by_vector`): the index it
    scans (HNSW under the scope filter, or the scope's own index for a small scope) and the
    rows it visits and keeps, means over the queries."""
    from pgvector.psycopg import register_vector_async

    visited, returned = 0.0, 0.0
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await register_vector_async(conn)
        await conn.execute(f"SET hnsw.ef_search = {settings.hnsw_ef_search}")
        await conn.execute("SET hnsw.iterative_scan = relaxed_order")
        await conn.execute("SET enable_seqscan = off")
        for vector in vectors:
            cur = await conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT f.id FROM facts f"
                " WHERE f.project_id = %s AND f.subject_id = %s AND f.status = 'active'"
                " ORDER BY f.embedding <=> %s LIMIT %s",
                (project, subject, vector, settings.context.retrieval_top_k),
            )
            plan = (await cur.fetchone())[0][0]["Plan"]
            while "Index Name" not in plan:
                plan = plan["Plans"][0]
            rows = plan["Actual Rows"]
            visited += rows + plan.get("Rows Removed by Filter", 0)
            returned += rows
    return plan["Index Name"], visited / len(vectors), returned / len(vectors)


async def measure_many_scopes(
    dsn: str,
    settings: Settings,
    project: str,
    sizes: list[int],
    queries: list[tuple[str, np.ndarray]],
) -> None:
    """Per chosen scope (the three largest, the 0.1 % one, the median one): exact vs two-phase
    retrieval with top-10 agreement, the HNSW scan's rows visited, whole calls over gRPC."""
    by_size = sorted(range(len(sizes)), key=lambda i: sizes[i])
    tenth = sizes.index(max(1, sum(sizes) // 1000))
    chosen = [*reversed(by_size[-3:]), tenth, by_size[len(by_size) // 2]]
    for index in chosen:
        subject = f"scope-{index:04d}"
        share = 100 * sizes[index] / sum(sizes)
        print(
            f"\n{subject}: {sizes[index]} facts ({share:.2f} % of the table),"
            f" {len(queries)} queries"
        )
        await measure_sql(dsn, settings, project, queries, subject=subject, grid=False)
        index, visited, kept = await nearest_rows_visited(
            dsn, settings, project, subject, [v for _, v in queries[:20]]
        )
        print(f"  K nearest: {index} scan, {visited:.0f} rows visited, {kept:.0f} kept")
        await measure_calls(settings, project, [t for t, _ in queries], subject=subject)


def loaded_sizes(dsn: str, project: str) -> list[int]:
    """The scope sizes of a database an earlier `--scopes` run loaded (scope-NNNN subjects)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT subject_id, count(*) FROM facts WHERE project_id = %s GROUP BY subject_id",
            (project,),
        ).fetchall()
    sizes = [0] * len(rows)
    for subject, count in rows:
        sizes[int(subject.removeprefix("scope-"))] = count
    return sizes


async def drop_scope_indexes(dsn: str) -> int:
    """Drop every scope index (the state before the maintenance); how many there were."""
    from satchel.server.context.storage import scope_indexes as index_store

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        scopes = list(await index_store.registry(conn))
        for scope in scopes:
            await index_store.drop(conn, scope)
    return len(scopes)


async def build_scope_indexes(dsn: str, settings: Settings) -> None:
    """One scope index maintenance run, as a server makes it; prints what it built."""
    from satchel.server.context.scope_indexes import ScopeIndexes

    started = time.perf_counter()
    outcome = await ScopeIndexes.from_settings(settings, dsn).run_once()
    seconds = time.perf_counter() - started
    built = sorted(outcome.built.items(), key=lambda item: -item[1])
    print(
        f"\nscope index maintenance: {len(built)} scopes above {settings.context.exact_scope_max}"
        f" facts indexed in {seconds:.0f} s ("
        + ", ".join(f"{subject} {took:.0f} s" for (_, subject), took in built[:4])
        + ", ...)"
    )
    with psycopg.connect(dsn) as conn:
        total, largest = conn.execute(
            "SELECT pg_size_pretty(sum(pg_relation_size(c.oid))),"
            " pg_size_pretty(max(pg_relation_size(c.oid)) FILTER (WHERE c.relname LIKE '%_hnsw'))"
            " FROM scope_indexes r JOIN pg_class c ON c.relname LIKE r.index_prefix || '\\_%'"
        ).fetchone()
    print(f"scope indexes: {total} in all, the largest HNSW {largest}")


def scratch_database(base_dsn: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(base_dsn)
    params["dbname"] = name
    return make_conninfo(**params)


@contextmanager
def kept_database(work: Path, dbname: str) -> Iterator[str]:
    """The DSN of `dbname`, a database an earlier run loaded and kept, on the embedded
    PostgreSQL of its work directory (started for the block, then stopped)."""
    from satchel.server.platform.storage.embedded import EmbeddedPostgres

    embedded = EmbeddedPostgres(work)
    params = conninfo_to_dict(embedded.start())
    params["dbname"] = dbname
    try:
        yield make_conninfo(**params)
    finally:
        embedded.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--conversation", type=int, default=300, help="facts (0: none)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--load-order", choices=("chronological", "random"), default="chronological"
    )
    parser.add_argument(
        "--scopes",
        type=int,
        default=0,
        help="instead of --sizes: this many scopes of one project, skewed, holding --total facts",
    )
    parser.add_argument("--total", type=int, default=1_000_000)
    parser.add_argument("--traces", type=int, default=100_000, help="earlier calls (--scopes)")
    parser.add_argument("--reuse", metavar="DSN", help="--scopes: measure this loaded database")
    parser.add_argument("--spread-only", action="store_true", help="--reuse: the spread alone")
    parser.add_argument("--spread-calls", type=int, default=4000, help="calls per spread case")
    parser.add_argument(
        "--spread-cache-mb", type=int, nargs="+", default=[256, 0], help="cache sizes to spread"
    )
    args = parser.parse_args()

    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder
    from satchel.server.platform.logs import configure_logging

    configure_logging("warning", "console")

    work = Path(tempfile.mkdtemp(prefix="satchel-bench-", dir="/var/tmp"))
    embedded = None
    base_dsn = os.environ.get("SATCHEL_DATABASE_URL")
    if not base_dsn:
        from satchel.server.platform.storage.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(work)
        base_dsn = embedded.start()
    try:
        dsn = args.reuse or scratch_database(base_dsn)
        apply_migrations(dsn)
        # The servers measured before the scope indexes never build them (this script does,
        # once); those measured after keep them (maintaining, they find nothing to do).
        maintained = replace(Settings.from_env(), database_url=dsn, data_dir=work)
        settings = replace(maintained, scope_index_max=0)
        embedder = FastEmbedEmbedder(cache_dir=work / "cache")
        rng = np.random.default_rng(args.seed)
        parts = {
            "activity": embedder.embed(ACTIVITIES),
            "name": embedder.embed(NAMES),
            "city": embedder.embed(CITIES),
        }
        pick = random.Random(args.seed)
        texts = questions(args.queries, pick)
        query_vectors = embedder.embed(texts)
        queries = list(zip(texts, query_vectors, strict=True))
        print(
            f"satchel context benchmark, {os.cpu_count()} cores, {datetime.now(UTC):%Y-%m-%d},"
            f" synthetic facts loaded {args.load_order}; database {dsn} (kept: --reuse it)"
        )
        if args.scopes and args.spread_only:
            if not args.reuse:
                parser.error("--spread-only measures a database loaded earlier: give --reuse")
            run_spread(dsn, texts, args.spread_calls, [str(mb) for mb in args.spread_cache_mb])
            return 0
        if args.scopes:
            if args.reuse:
                sizes = loaded_sizes(dsn, "bench-scale")
                dropped = asyncio.run(drop_scope_indexes(dsn))
                print(f"reusing {len(sizes)} loaded scopes, {dropped} scope indexes dropped")
            else:
                sizes = scope_sizes(args.scopes, args.total, rng)
                print(
                    f"{args.total} facts in one project over {len(sizes)} scopes: largest"
                    f" {sorted(sizes)[-3:]}, median {sorted(sizes)[len(sizes) // 2]}, smallest"
                    f" {min(sizes)}; {args.traces} earlier calls' traces"
                )
                seconds = load_many_scopes(dsn, "bench-scale", sizes, parts, args.seed)
                loading = sum(seconds.values())
                steps = ", ".join(f"{step} {value:.0f} s" for step, value in seconds.items())
                print(f"bulk load: {args.total / loading:.0f} facts/s ({loading:.0f} s: {steps})")
                subjects = [f"scope-{i:04d}" for i in range(len(sizes))]
                traced = load_traces(dsn, "bench-scale", subjects, args.traces, 1)
                print(f"traces loaded in {traced:.0f} s")
            print("sizes:")
            print("\n".join(sizes_report(dsn)))
            print("\n=== before: the global HNSW index only ===")
            asyncio.run(measure_many_scopes(dsn, settings, "bench-scale", sizes, queries))
            asyncio.run(build_scope_indexes(dsn, maintained))
            print("\n=== after: each scope above the exact cut has its own index ===")
            asyncio.run(measure_many_scopes(dsn, maintained, "bench-scale", sizes, queries))
            run_spread(dsn, texts, args.spread_calls, [str(mb) for mb in args.spread_cache_mb])
            return 0
        # Every scope is loaded first: they share one table, as tenants do.
        scopes = []
        if args.conversation:
            project = "bench-conversation"
            seconds = asyncio.run(load_conversation(settings, project, args.conversation, 1))
            scopes.append((project, f"{args.conversation} facts, {2 * args.conversation} events"))
            print(f"loaded the conversation scope through the API in {seconds:.0f} s")
        chronological = args.load_order == "chronological"
        for size in args.sizes:
            project = f"bench-{size}"
            rows = synthetic_facts(size, parts, rng, chronological)
            seconds = load_scope(dsn, project, rows)
            scopes.append((project, f"{size} facts"))
            print(f"loaded {size} facts in {seconds:.0f} s")
        for project, label in scopes:
            print(f"\n{label} in one scope, {len(queries)} queries")
            asyncio.run(measure_sql(dsn, settings, project, queries))
            asyncio.run(measure_calls(settings, project, texts))
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
