"""A scope with indexes of its own: its statements written for it (one generic plan a
connection) against the shared statements planned for each call's values (the code before
2026-12-07), paired in one server, call by call, on the same queries.

    .venv/bin/python benchmarks/context.py --sizes 100000 --conversation 0 --queries 100
    # it prints "database user=postgres dbname=bench_… host=/var/tmp/satchel-bench-…/pg"
    .venv/bin/python benchmarks/scope_statement_plans.py --work /var/tmp/satchel-bench-… \
        --dbname bench_… --build-indexes [--calls 120]

`--build-indexes` runs the scope index maintenance once (context.py's --sizes servers never
build them). Prints AssembleContext p50/p90/p95 of each way, the query embedding alone, and how
many packets were identical. Results: benchmarks/context.md (issue 39).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import context as bench

from satchel.server.context.storage import candidates, multi_hop
from satchel.server.platform.config import Settings
from satchel.server.platform.storage import pool

WRITTEN = {module: (module.for_scope, module.generic_plans) for module in (candidates, multi_hop)}


def _shared(statement: Any, project_id: str, subject_id: str) -> Any:
    return statement


def use(written: bool) -> None:
    """Written for the scope, generic plans (now); or shared, planned per call (before). On a
    scope with indexes of its own only these two statements' paths run, so the swap is exact."""
    for module, (for_scope, generic) in WRITTEN.items():
        module.for_scope = for_scope if written else _shared  # type: ignore[attr-defined]
        plans: Any = generic if written else pool.per_call_plans
        module.generic_plans = plans  # type: ignore[attr-defined]


async def paired(settings: Settings, project: str, subject: str, texts: list[str]) -> None:
    import grpc

    from satchel.server.platform.app import SatchelServer
    from satchel.v1 import context_pb2, context_pb2_grpc

    server = SatchelServer(replace(settings, listen="127.0.0.1:0"))
    await server.start()
    times: dict[str, list[float]] = {"written for the scope": [], "shared, per-call plans": []}
    embedding: list[float] = []
    identical = 0
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = context_pb2_grpc.ContextServiceStub(channel)
            for i, text in enumerate(texts):
                started = time.perf_counter()
                await server.runtime.value.embed_query(text + " ")
                embedding.append((time.perf_counter() - started) * 1000)
                served = []
                for way in list(times)[:: 1 if i % 2 else -1]:
                    use(way == "written for the scope")
                    request = context_pb2.AssembleContextRequest(
                        project_id=project, subject_id=subject, query=text
                    )
                    started = time.perf_counter()
                    reply = await stub.AssembleContext(request)
                    if i >= 6:  # warm-up: each connection plans once
                        times[way].append((time.perf_counter() - started) * 1000)
                    served.append([f.id for f in reply.packet.facts])
                identical += served[0] == served[1]
    finally:
        use(True)
        await server.stop()
    floor = statistics.median(embedding[6:])
    print(f"query embedding alone: p50 {floor:.2f} ms")
    for way, values in times.items():
        ranked = sorted(values)
        p50 = statistics.median(ranked)
        print(
            f"{way:24} p50 {p50:6.2f}  p90 {ranked[int(len(ranked) * 0.9)]:6.2f}"
            f"  p95 {ranked[int(len(ranked) * 0.95)]:6.2f} ms  ({p50 / floor:.1f}x the embedding)"
        )
    print(f"identical packets: {identical} of {len(texts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="context.py's work directory")
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--project", default="bench-100000")
    parser.add_argument("--subject", default="s")
    parser.add_argument("--calls", type=int, default=120)
    parser.add_argument("--build-indexes", action="store_true")
    args = parser.parse_args()
    from satchel.server.platform.logs import configure_logging

    configure_logging("warning", "console")
    with bench.kept_database(args.work, args.dbname) as dsn:
        settings = replace(Settings.from_env(), database_url=dsn, data_dir=args.work)
        if args.build_indexes:
            asyncio.run(bench.build_scope_indexes(dsn, settings))
        texts = bench.questions(args.calls, random.Random(5))
        asyncio.run(paired(settings, args.project, args.subject, texts))


if __name__ == "__main__":
    main()
