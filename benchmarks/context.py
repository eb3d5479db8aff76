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
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from satchel.server.config import ContextSettings, Settings
from satchel.server.storage import context as store
from satchel.server.storage import memory as memory_store
from satchel.server.storage.migrations import apply_migrations
from satchel.server.storage.pool import create_pool

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


def load_scope(dsn: str, project: str, rows: list[tuple]) -> float:
    """COPY the facts in, count their words as the write path does, then build the HNSW index
    once (as a bulk load should); seconds."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Rebuilt after the COPY exactly as the migrations define it.
        index = "SELECT pg_get_indexdef('facts_embedding_hnsw'::regclass)"
        create_index = conn.execute(index).fetchone()[0]
        conn.execute("DROP INDEX facts_embedding_hnsw")
        with conn.cursor().copy(
            "COPY facts (project_id, subject_id, predicate, value, statement, valid_from,"
            " embedding, embedding_model) FROM STDIN"
        ) as copy:
            for statement, vector, when in rows:
                literal = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
                copy.write_row(
                    (project, "s", "note", '{"kind": "synthetic"}', statement, when, literal, "b")
                )
        ids = conn.execute("SELECT array_agg(id) FROM facts WHERE project_id = %s", (project,))
        (fact_ids,) = ids.fetchone()
        conn.execute(memory_store.COUNT_FACT_TERMS_SQL, (fact_ids,))
        conn.execute(memory_store.COUNT_LEXEMES_SQL["facts"], {"ids": fact_ids})
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute(create_index)
        conn.execute("VACUUM ANALYZE facts")
    return time.perf_counter() - started


async def load_conversation(settings: Settings, project: str, facts: int, seed: int) -> float:
    """A conversation-sized scope written through the public API, as an agent would: twice as
    many events (messages) as facts, each fact sourced from one of them; seconds."""
    import grpc
    from google.protobuf import struct_pb2

    from satchel.server.app import SatchelServer
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
        f"   p90 {percentile(times, 0.9):7.2f} ms{tail}"
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
    dsn: str, settings: Settings, project: str, queries: list[tuple[str, np.ndarray]]
) -> None:
    pool = create_pool(dsn, min_size=1, max_size=2, ef_search=settings.hnsw_ef_search)
    await pool.open(wait=True)
    scope = store.Scope(project, "s", datetime.now(UTC), historical=False)
    defaults = settings.context
    async with pool.connection() as conn:
        # The searched words and the scope's size need no vector: a context call looks them up
        # while the query is embedded. Timed apart, then given to every run.
        plan_ms, plans = [], []
        for text, _ in queries:
            started = time.perf_counter()
            plans.append(await store.plan_query(conn, scope, text, defaults))
            plan_ms.append((time.perf_counter() - started) * 1000)
        exact_ms, exact_top = [], []
        reference = replace(defaults, candidate_limit=10)
        for (_, vector), plan in zip(queries, plans, strict=True):
            started = time.perf_counter()
            rows = await store.fetch_fact_candidates(
                conn, scope, vector, reference, plan, exact=True
            )
            exact_ms.append((time.perf_counter() - started) * 1000)
            exact_top.append([str(r["id"]) for r in rows[:10]])
        print(_row("exact full scan", exact_ms))
        print(_row("words and scope size (during the embedding)", plan_ms))

        async def run(cfg: ContextSettings, label: str) -> None:
            times, same, overlap = [], 0, 0.0
            for (text, vector), exact in zip(queries, exact_top, strict=True):
                plan = await store.plan_query(conn, scope, text, cfg)
                started = time.perf_counter()
                rows = await store.fetch_fact_candidates(conn, scope, vector, cfg, plan)
                times.append((time.perf_counter() - started) * 1000)
                got = [str(r["id"]) for r in rows[:10]]
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
        # Two phases (forced for a small scope), for scopes larger than the smallest window.
        larger = plans[0].scope_facts > min(window for _, window, _ in GRID)
        for top_k, window, top_k_max in GRID if larger else ():
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


async def measure_calls(settings: Settings, project: str, texts: list[str]) -> None:
    """Whole AssembleContext calls over gRPC vs the query embedding alone, interleaved."""
    import grpc

    from satchel.server.app import SatchelServer
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
                        project_id=project, subject_id="s", query=text
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
                        project_id=project, subject_id="s", query=text
                    )
                )
                call_ms.append((time.perf_counter() - started) * 1000)
    finally:
        await server.stop()
    ratio = statistics.median(call_ms) / statistics.median(embed_ms)
    print(_row("query embedding alone", embed_ms))
    print(_row("AssembleContext over gRPC", call_ms, f"   ratio to embedding {ratio:4.2f}x"))


def scratch_database(base_dsn: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(base_dsn)
    params["dbname"] = name
    return make_conninfo(**params)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--conversation", type=int, default=300, help="facts (0: none)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--load-order", choices=("chronological", "random"), default="chronological"
    )
    args = parser.parse_args()

    from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder
    from satchel.server.logs import configure_logging

    configure_logging("warning", "console")

    work = Path(tempfile.mkdtemp(prefix="satchel-bench-", dir="/var/tmp"))
    embedded = None
    base_dsn = os.environ.get("SATCHEL_DATABASE_URL")
    if not base_dsn:
        from satchel.server.storage.embedded import EmbeddedPostgres

        embedded = EmbeddedPostgres(work)
        base_dsn = embedded.start()
    try:
        dsn = scratch_database(base_dsn)
        apply_migrations(dsn)
        settings = replace(Settings.from_env(), database_url=dsn, data_dir=work)
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
            f" synthetic facts loaded {args.load_order}"
        )
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
