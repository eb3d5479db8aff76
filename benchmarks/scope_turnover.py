"""Where a median scope's call goes: one scope asked again and again, against calls turning over
every scope of about the median size, with the scope cache on or off (issue 39).

    .venv/bin/python benchmarks/context.py --scopes 1000 --total 1000000 --conversation 0
    # it prints "database user=postgres dbname=bench_… host=/var/tmp/satchel-bench-…/pg"
    .venv/bin/python benchmarks/scope_turnover.py --work /var/tmp/satchel-bench-… \
        --dbname bench_… [--calls 200] [--cache-mb 256 0]

An in-process server on the embedded PostgreSQL of that run (client and server share one
process and its event loop). Per case (one scope repeated, or the scopes of half to twice the
median size in turn; per cache size): the client's AssembleContext p50 / p95, the query's
embedding alone, and the server's own spans of the same calls (`context_calls`: embedding and
plan, retrieval, packing, total) with the trace's insert timed around `save_trace`. Results:
benchmarks/context.md (issue 39).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import context as bench
from scope_spread import median_sized

from satchel.server.context import service
from satchel.server.platform.config import Settings

PROJECT = "bench-scale"
WARM_UP = 10


def median_band(dsn: str) -> list[str]:
    """The project's scopes of half to twice the median size (of all its scopes)."""
    with psycopg.connect(dsn) as conn:
        sizes = dict(
            conn.execute(
                "SELECT subject_id, count(*) FROM facts WHERE project_id = %s"
                " AND status = 'active' GROUP BY subject_id",
                (PROJECT,),
            ).fetchall()
        )
    return sorted(median_sized(sizes))


async def measure(settings: Settings, subjects: list[str], texts: list[str]) -> dict[str, Any]:
    """Calls to `subjects` in turn (after a warm-up on the first): client and server figures."""
    import grpc

    from satchel.server.platform.app import SatchelServer
    from satchel.v1 import context_pb2, context_pb2_grpc

    saves: list[float] = []
    save_trace = service.save_trace

    async def timed_save(*args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        try:
            await save_trace(*args, **kwargs)
        finally:
            saves.append((time.perf_counter() - started) * 1000)

    service.save_trace = timed_save  # type: ignore[assignment]
    server = SatchelServer(replace(settings, listen="127.0.0.1:0"))
    await server.start()
    trace_ids, call_ms, embed_ms = [], [], []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = context_pb2_grpc.ContextServiceStub(channel)
            runtime = server.runtime.value

            def request(subject: str, text: str) -> Any:
                return context_pb2.AssembleContextRequest(
                    project_id=PROJECT, subject_id=subject, query=text
                )

            for text in texts[:WARM_UP]:
                await stub.AssembleContext(request(subjects[0], text))
            await asyncio.sleep(1)  # a copy asked for by the warm-up is loaded
            saves.clear()
            for i, text in enumerate(texts[WARM_UP:]):
                started = time.perf_counter()
                await runtime.embed_query(text + " ")
                embed_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                reply = await stub.AssembleContext(request(subjects[i % len(subjects)], text))
                call_ms.append((time.perf_counter() - started) * 1000)
                trace_ids.append(reply.trace_id)
    finally:
        await server.stop()
        service.save_trace = save_trace
    with psycopg.connect(settings.database_url) as conn:
        spans = conn.execute(
            "SELECT embed_ms, retrieve_ms, pack_ms, total_ms FROM context_calls"
            " WHERE trace_id = ANY(%s::uuid[])",
            (trace_ids,),
        ).fetchall()
    columns = list(zip(*spans, strict=True))
    return {
        "p50": statistics.median(call_ms),
        "p95": statistics.quantiles(call_ms, n=20)[-1],
        "embed": statistics.median(embed_ms),
        **{
            name: statistics.median(column)
            for name, column in zip(("plan", "retrieve", "pack", "total"), columns, strict=True)
        },
        "save": statistics.median(saves),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="context.py's work directory")
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cache-mb", type=int, nargs="+", default=[256, 0])
    args = parser.parse_args()
    from satchel.server.platform.logs import configure_logging

    configure_logging("warning", "console")
    with bench.kept_database(args.work, args.dbname) as dsn:
        band = median_band(dsn)
        texts = bench.questions(args.calls + WARM_UP, random.Random(5))
        print(f"{len(band)} scopes of about the median size; {args.calls} calls a case")
        print("| calls to | cache MB | p50 / p95 ms | embedding p50 ms | p50 / embedding |", end="")
        print(" server: embedding and plan / retrieval / packing / total ms | trace insert ms |")
        print("|---" * 7 + "|")
        for cache_mb in args.cache_mb:
            os.environ["SATCHEL_SCOPE_CACHE_MB"] = str(cache_mb)
            settings = replace(Settings.from_env(), database_url=dsn, data_dir=args.work)
            cases = (("one of them, again and again", band[len(band) // 2 :][:1]),)
            cases += ((f"the {len(band)} in turn (each read once)", band),)
            for label, subjects in cases:
                f = asyncio.run(measure(settings, subjects, texts))
                print(
                    f"| {label} | {cache_mb} | {f['p50']:.1f} / {f['p95']:.1f} | {f['embed']:.1f} |"
                    f" {f['p50'] / f['embed']:.2f}x | {f['plan']:.1f} / {f['retrieve']:.1f} /"
                    f" {f['pack']:.1f} / {f['total']:.1f} | {f['save']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
