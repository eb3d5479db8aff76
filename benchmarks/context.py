"""Context retrieval benchmark: exact full scan vs two-phase, top-10 agreement, whole calls.

    .venv/bin/python benchmarks/context.py [--sizes 10000 100000] [--queries 200]

Loads synthetic scopes (vectors mixing real embeddings of an activity, a person and a city,
templated statements, validity dates spread over two years) into a scratch database on
the embedded PostgreSQL (or SATCHEL_DATABASE_URL), then prints side by side, in one run: the
exact full-scan latency, the two-phase latency (p50/p90) and its top-10 agreement with the exact
ranking for several K, the query embedding alone, and whole AssembleContext calls over gRPC.
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

from satchel.server.config import Settings
from satchel.server.storage import context as store
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


def synthetic_facts(n: int, parts: dict[str, np.ndarray], rng: np.random.Generator) -> list[tuple]:
    """Templated statements whose vectors mix real embeddings of their activity, person and
    city (plus noise): facts cluster by activity, and the person named still matters."""
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
    return rows


def load_scope(dsn: str, project: str, rows: list[tuple]) -> float:
    """COPY the facts in, then build the HNSW index once (as a bulk load should); seconds."""
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
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute(create_index)
        conn.execute("VACUUM ANALYZE facts")
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure_sql(
    dsn: str, settings: Settings, project: str, queries: list[tuple[str, np.ndarray]]
) -> None:
    pool = create_pool(dsn, min_size=1, max_size=2, ef_search=settings.hnsw_ef_search)
    await pool.open(wait=True)
    scope = store.Scope(project, "s", datetime.now(UTC), historical=False)
    exact_cfg = replace(settings.context, candidate_limit=10)
    async with pool.connection() as conn:
        exact_ms, exact_top = [], []
        for text, vector in queries:
            started = time.perf_counter()
            rows = await store.fetch_fact_candidates(
                conn, scope, text, vector, exact_cfg, exact=True
            )
            exact_ms.append((time.perf_counter() - started) * 1000)
            exact_top.append([str(r["id"]) for r in rows[:10]])
        print(
            f"  exact full scan          p50 {percentile(exact_ms, 0.5):7.2f} ms"
            f"   p90 {percentile(exact_ms, 0.9):7.2f} ms"
        )
        # The searched words need no vector: a context call looks them up while the query is
        # embedded. Timed apart, then given to every two-phase run.
        terms_ms, terms = [], []
        for text, _ in queries:
            started = time.perf_counter()
            terms.append(await store.searched_terms(conn, scope, text, settings.context))
            terms_ms.append((time.perf_counter() - started) * 1000)
        print(
            f"  searched-words lookup    p50 {percentile(terms_ms, 0.5):7.2f} ms"
            f"   p90 {percentile(terms_ms, 0.9):7.2f} ms   (overlaps the query embedding)"
        )
        # (K, R, newest window, K max): "fixed" runs one round, "adaptive" widens while needed.
        # Window 64 keeping 64 is the previous design (the 64 newest facts, all scored).
        grid = [
            (64, 64, 64, 64),
            (64, 64, 64, 1024),
            (64, 64, 2048, 64),
            (64, 64, 2048, 1024),
            (128, 128, 2048, 1024),
            (64, 64, 4096, 1024),
        ]
        for top_k, recent_k, window, top_k_max in grid:
            cfg = replace(
                settings.context,
                retrieval_top_k=top_k,
                recency_top_k=recent_k,
                newest_window=window,
                retrieval_top_k_max=top_k_max,
            )
            times, same, overlap = [], 0, 0.0
            runs = zip(queries, terms, exact_top, strict=True)
            for (text, vector), words, exact in runs:
                started = time.perf_counter()
                rows = await store.fetch_fact_candidates(
                    conn, scope, text, vector, cfg, terms=words
                )
                times.append((time.perf_counter() - started) * 1000)
                got = [str(r["id"]) for r in rows[:10]]
                same += set(got) == set(exact)
                overlap += len(set(got) & set(exact)) / max(1, len(exact))
            mode = "adaptive" if top_k_max > top_k else "fixed   "
            print(
                f"  two-phase K={top_k:<3} R={recent_k:<3} window={window:<4} {mode}"
                f"  p50 {percentile(times, 0.5):7.2f} ms   p90 {percentile(times, 0.9):7.2f} ms"
                f"   top-10 identical {100 * same / len(queries):5.1f} %"
                f"   overlap {100 * overlap / len(queries):5.1f} %"
            )
    await pool.close()


async def measure_calls(settings: Settings, project: str, texts: list[str], embedder) -> None:
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
    e50, c50 = statistics.median(embed_ms), statistics.median(call_ms)
    print(f"  query embedding alone    p50 {e50:7.2f} ms   p90 {percentile(embed_ms, 0.9):7.2f} ms")
    print(
        f"  AssembleContext (gRPC)   p50 {c50:7.2f} ms   p90 {percentile(call_ms, 0.9):7.2f} ms"
        f"   ratio to embedding {c50 / e50:4.2f}x"
    )


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
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
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
        print(f"satchel context benchmark, {os.cpu_count()} cores, {datetime.now(UTC):%Y-%m-%d}")
        for size in args.sizes:
            project = f"bench-{size}"
            seconds = load_scope(dsn, project, synthetic_facts(size, parts, rng))
            print(
                f"\n{size} facts in one scope (loaded in {seconds:.0f} s), {len(queries)} queries"
            )
            asyncio.run(measure_sql(dsn, settings, project, queries))
            asyncio.run(measure_calls(settings, project, texts, embedder))
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
