"""Knowledge updates: when a value changes over time, does the newest statement rank first?

A small hand-written set (no external data): each scenario is one subject whose value of a
predicate was stated two or three times, months apart, and never superseded (an agent that
did not link the statements), among unrelated facts that are old too. One context call per
scenario asks for the current value; the scenario passes when the newest statement is served
before every older one. Beside it, how far down the packet the newest statement sits.

    .venv/bin/python benchmarks/knowledge_updates.py            # hybrid and seed rankings
    .venv/bin/python benchmarks/knowledge_updates.py --json

Runs an in-process server on a scratch embedded database (or SATCHEL_DATABASE_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from google.protobuf import struct_pb2, timestamp_pb2

from satchel.server.platform.app import SatchelServer
from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

# (question, predicate, [(days ago, statement)] oldest first)
SCENARIOS: list[tuple[str, str, list[tuple[int, str]]]] = [
    (
        "What is Ana's budget for the trip?",
        "trip_budget",
        [(300, "Ana's budget for the trip is 2000 euros"), (20, "Ana's trip budget is 3000 euros")],
    ),
    (
        "Where does Ben live?",
        "home_city",
        [(700, "Ben lives in Paris"), (200, "Ben lives in Lyon"), (10, "Ben lives in Nantes")],
    ),
    (
        "Who is Chloe's manager?",
        "manager",
        [(400, "Chloe's manager is Marc"), (30, "Chloe now reports to Sofia")],
    ),
    (
        "What phone does Dev use?",
        "phone",
        [(500, "Dev uses an old Nokia phone"), (15, "Dev switched to a Pixel phone")],
    ),
    (
        "How many hours a week does Emma work?",
        "work_hours",
        [(365, "Emma works 40 hours a week"), (60, "Emma works 32 hours a week")],
    ),
    (
        "What is Farid's favourite programming language?",
        "favourite_language",
        [
            (900, "Farid's favourite programming language is Java"),
            (300, "Farid's favourite programming language is Go"),
            (5, "Farid's favourite programming language is Rust"),
        ],
    ),
    (
        "Which gym does Gina go to?",
        "gym",
        [(250, "Gina goes to the Basic-Fit gym"), (12, "Gina goes to the climbing gym downtown")],
    ),
    (
        "What is Hugo's diet?",
        "diet",
        [(420, "Hugo eats everything"), (40, "Hugo became vegetarian")],
    ),
    (
        "What car does Ines drive?",
        "car",
        [(600, "Ines drives a Renault Clio"), (25, "Ines drives an electric Tesla")],
    ),
    (
        "What is Jon's job?",
        "job",
        [(800, "Jon is a barista"), (90, "Jon works as a nurse"), (7, "Jon is a paramedic now")],
    ),
    (
        "Where does Kim keep her spare key?",
        "spare_key",
        [(150, "Kim keeps her spare key under the mat"), (3, "Kim's spare key is with Lea")],
    ),
    (
        "What time does Luis start work?",
        "start_time",
        [(330, "Luis starts work at 9 am"), (14, "Luis starts work at 7 am")],
    ),
]
DISTRACTORS = [
    (500, "The subject likes long walks by the river"),
    (450, "The subject has a sister in Toronto"),
    (380, "The subject is allergic to peanuts"),
    (260, "The subject plays chess on Sundays"),
]
RANKINGS = {
    "hybrid (default)": {},
    "hybrid, newer-wins off": {"newer_wins_similarity": 0.0},
    "hybrid, off, rec. 0.15": {"newer_wins_similarity": 0.0, "weight_recency": 0.15},
    "seed": {"ranking": "seed"},
}


def _ts(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


async def load(channel: grpc.aio.Channel, project: str) -> None:
    memory = memory_pb2_grpc.MemoryServiceStub(channel)
    now = datetime.now(UTC)
    requests = []
    for index, (_, predicate, versions) in enumerate(SCENARIOS):
        for days, statement in [*versions, *DISTRACTORS]:
            requests.append(
                memory_pb2.AssertFactRequest(
                    project_id=project,
                    subject_id=f"s{index}",
                    predicate=predicate if (days, statement) in versions else "note",
                    value=struct_pb2.Value(string_value=statement),
                    statement=statement,
                    valid_from=_ts(now - timedelta(days=days)),
                )
            )
    await memory.BatchAssertFacts(memory_pb2.BatchAssertFactsRequest(requests=requests))


async def ask(channel: grpc.aio.Channel, project: str) -> dict[str, object]:
    context = context_pb2_grpc.ContextServiceStub(channel)
    passed, positions = 0, []
    for index, (question, _, versions) in enumerate(SCENARIOS):
        reply = await context.AssembleContext(
            context_pb2.AssembleContextRequest(
                project_id=project, subject_id=f"s{index}", query=question
            )
        )
        order = [f.statement for f in reply.packet.facts]
        newest = versions[-1][1]
        position = order.index(newest) if newest in order else len(order)
        older = [order.index(s) for _, s in versions[:-1] if s in order]
        passed += all(position < o for o in older) and newest in order
        positions.append(position + 1)
    return {
        "scenarios": len(SCENARIOS),
        "newest_first": passed,
        "newest_first_share": round(passed / len(SCENARIOS), 3),
        "mean_rank_of_newest": round(sum(positions) / len(positions), 2),
    }


async def run(settings: Settings) -> dict[str, dict[str, object]]:
    results = {}
    for label, overrides in RANKINGS.items():
        context = settings.context
        if "ranking" in overrides:
            context = context.with_ranking(str(overrides["ranking"]))
        context = replace(context, **{k: v for k, v in overrides.items() if k != "ranking"})
        server = SatchelServer(replace(settings, context=context))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                project = f"ku-{uuid.uuid4().hex[:10]}"
                await load(channel, project)
                results[label] = await ask(channel, project)
        finally:
            await server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="satchel-ku-", dir="/var/tmp") as scratch:
        settings = replace(Settings.from_env(), listen="127.0.0.1:0")
        if settings.database_url is None:
            settings = replace(settings, data_dir=Path(scratch))
        results = asyncio.run(run(settings))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'ranking':24} newest first   mean rank of the newest")
    for label, r in results.items():
        print(
            f"{label:24} {r['newest_first']:>3}/{r['scenarios']:<3} ({r['newest_first_share']:.0%})"
            f"   {r['mean_rank_of_newest']}"
        )


if __name__ == "__main__":
    main()
