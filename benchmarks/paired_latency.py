"""Two servers side by side on one database: each LoCoMo question asked of A and of B in turn.

A change's effect on a context call's latency is smaller than this machine's drift between two
runs (up to 15 %); asking the same question of both servers back to back, the order alternating,
cancels the drift. Packets are compared too: a latency change must not change what is served.

    # a server on the change, the LoCoMo dev conversations loaded into it and kept (--keep;
    # without it the eval deletes its project when it ends), printing the project's id:
    SATCHEL_DATA_DIR=/var/tmp/paired SATCHEL_LISTEN=127.0.0.1:50081 .venv/bin/satchel serve &
    .venv/bin/satchel eval locomo --address 127.0.0.1:50081 --no-baselines --keep --json \\
        | jq .run.project_id
    # the base, from another checkout with its own .venv, on the same database:
    git worktree add /var/tmp/base <base revision> && /var/tmp/base/scripts/setup
    SATCHEL_DATABASE_URL='postgresql://postgres:@/postgres?host=/var/tmp/paired/pg' \\
        SATCHEL_LISTEN=127.0.0.1:50082 /var/tmp/base/.venv/bin/satchel serve &
    .venv/bin/python benchmarks/paired_latency.py --a 127.0.0.1:50082 --b 127.0.0.1:50081 \\
        --project <project_id> [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import grpc

from satchel.server.evaluation import datasets, locomo
from satchel.v1 import context_pb2, context_pb2_grpc

WARMUP = 30


def _served(reply: context_pb2.AssembleContextResponse) -> list[str]:
    return [f.id for f in reply.packet.facts] + [e.event_id for e in reply.packet.episodes]


def _summary(name: str, latencies: list[float]) -> str:
    ordered = sorted(latencies)
    pct = {p: ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in (0.9, 0.99)}
    return (
        f"{name}: p50 {statistics.median(ordered):.2f} ms, p90 {pct[0.9]:.2f}, "
        f"p99 {pct[0.99]:.2f}, mean {statistics.mean(ordered):.2f} ({len(ordered)} calls)"
    )


async def run(a: str, b: str, project: str, data: Path, rounds: int) -> None:
    questions = [
        (conversation.sample_id, question.text)
        for conversation in datasets.load(data)[1]
        for question in conversation.questions
    ]
    async with grpc.aio.insecure_channel(a) as channel_a, grpc.aio.insecure_channel(b) as channel_b:
        stubs = {
            "A": context_pb2_grpc.ContextServiceStub(channel_a),
            "B": context_pb2_grpc.ContextServiceStub(channel_b),
        }

        async def ask(server: str, subject: str, query: str) -> tuple[float, list[str]]:
            request = context_pb2.AssembleContextRequest(
                project_id=project, subject_id=subject, query=query
            )
            started = time.perf_counter()
            reply = await stubs[server].AssembleContext(request)
            return (time.perf_counter() - started) * 1000, _served(reply)

        for subject, query in questions[:WARMUP]:
            for server in stubs:
                await ask(server, subject, query)
        latencies: dict[str, list[float]] = {"A": [], "B": []}
        differing = 0
        for round_ in range(rounds):
            for i, (subject, query) in enumerate(questions):
                order = ("A", "B") if (i + round_) % 2 == 0 else ("B", "A")
                served = {}
                for server in order:
                    ms, served[server] = await ask(server, subject, query)
                    latencies[server].append(ms)
                differing += served["A"] != served["B"]
    print(_summary(f"A {a}", latencies["A"]))
    print(_summary(f"B {b}", latencies["B"]))
    ratio = statistics.median(latencies["B"]) / statistics.median(latencies["A"])
    print(f"B/A p50: {ratio:.3f}; packets differing: {differing} of {len(latencies['A'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="host:port of the base server")
    parser.add_argument("--b", required=True, help="host:port of the changed server")
    parser.add_argument("--project", required=True, help="the project the eval loaded")
    parser.add_argument(
        "--data",
        type=Path,
        default=locomo.beside_checkout(locomo.DEFAULT_DATA),
        help="the LoCoMo JSON the eval loaded (default: ../shared/data beside the checkout)",
    )
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(run(args.a, args.b, args.project, args.data, args.rounds))


if __name__ == "__main__":
    main()
