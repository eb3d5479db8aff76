"""Bulk ingestion benchmark: events/s and facts/s through the Batch RPCs over gRPC.

    .venv/bin/python benchmarks/ingest.py [--rows 10000] [--batch 500]

Starts a satchel server in this process on a temporary embedded PostgreSQL (or on
SATCHEL_DATABASE_URL, in a fresh project), loads `--rows` events with BatchRecordEvents, then
`--rows` facts citing those events with BatchAssertFacts, and prints the rates and the share of
the wall time the server spent embedding. Results: benchmarks/ingest.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import grpc
from google.protobuf import json_format, struct_pb2

from satchel.server.platform.app import SatchelServer
from satchel.server.platform.config import Settings
from satchel.server.platform.logs import configure_logging
from satchel.server.platform.runtime import Runtime
from satchel.v1 import memory_pb2, memory_pb2_grpc

NAMES = ["Caroline", "Melanie", "Jordan", "Priya", "Tomas", "Aiko", "Lucas", "Amara", "Noah"]
PLACES = ["Lisbon", "Boston", "Nairobi", "Osaka", "Porto", "Denver", "Lyon", "Oslo", "Quito"]
TOPICS = [
    "the pottery class on Saturday",
    "a new job at the hospital",
    "the trip to the mountains",
    "invoices that must be written in French",
    "the deployment pipeline that keeps failing",
    "adopting a second cat",
    "learning the violin again",
    "the book club meeting next week",
    "moving to a bigger flat",
    "a marathon in the spring",
]
VERBS = ["talked about", "asked about", "is worried about", "is excited about", "mentioned"]
PREDICATES = ["home_city", "job", "hobby", "pet", "language", "plan", "preference", "goal"]


class EmbedClock:
    """Wraps Runtime.embed_passages to add up the time the server spends embedding."""

    def __init__(self, runtime: Runtime) -> None:
        self.seconds = 0.0
        self.texts = 0
        inner = runtime.embed_passages

        async def timed(texts: Sequence[str]):
            started = time.perf_counter()
            try:
                return await inner(texts)
            finally:
                self.seconds += time.perf_counter() - started
                self.texts += len(texts)

        runtime.embed_passages = timed  # type: ignore[method-assign]

    def reset(self) -> None:
        self.seconds = 0.0
        self.texts = 0


def message_payload(rng: random.Random, i: int) -> dict[str, object]:
    name, place = rng.choice(NAMES), rng.choice(PLACES)
    text = (
        f"{name} {rng.choice(VERBS)} {rng.choice(TOPICS)} while in {place};"
        f" they also {rng.choice(VERBS)} {rng.choice(TOPICS)}."
    )
    return {"speaker": name, "text": text, "turn": i}


def event_requests(project: str, count: int, rng: random.Random):
    for i in range(count):
        payload = json_format.ParseDict(message_payload(rng, i), struct_pb2.Struct())
        yield memory_pb2.RecordEventRequest(
            project_id=project,
            subject_id=f"user-{i % 10}",
            kind="conversation.message",
            payload=payload,
            idempotency_key=f"event-{i}",
        )


def fact_requests(project: str, events: Sequence[memory_pb2.Event], rng: random.Random):
    for i, event in enumerate(events):
        predicate = rng.choice(PREDICATES)
        value = json_format.ParseDict(
            {"topic": rng.choice(TOPICS), "place": rng.choice(PLACES)}, struct_pb2.Value()
        )
        yield memory_pb2.AssertFactRequest(
            project_id=project,
            subject_id=event.subject_id,
            predicate=predicate,
            value=value,
            confidence=round(rng.uniform(0.5, 1.0), 2),
            source_event_ids=[event.id],
            idempotency_key=f"fact-{i}",
        )


def chunks(items: list, size: int) -> list[list]:
    return [items[start : start + size] for start in range(0, len(items), size)]


async def load(
    label: str,
    call,
    batches: list,
    clock: EmbedClock,
) -> tuple[list, float, list[float]]:
    clock.reset()
    out: list = []
    latencies: list[float] = []
    started = time.perf_counter()
    for batch in batches:
        t0 = time.perf_counter()
        out.extend(await call(batch))
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - started
    rows = sum(len(b) for b in batches)
    print(
        f"{label:7} {rows:6d} rows in {wall:7.1f} s = {rows / wall:7.1f} rows/s"
        f" | embedding {clock.seconds:6.1f} s ({100 * clock.seconds / wall:4.1f} % of wall,"
        f" {1000 * clock.seconds / max(clock.texts, 1):.2f} ms/text)"
        f" | batch p50 {statistics.median(latencies):5.2f} s, max {max(latencies):5.2f} s"
    )
    return out, wall, latencies


def describe_machine() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    return (
        f"{time.strftime('%Y-%m-%d')} commit {commit or '?'} | {platform.platform()} |"
        f" {os.cpu_count()} cores | Python {platform.python_version()}"
        f" | load average {os.getloadavg()[0]:.2f}"
    )


async def run(rows: int, batch_size: int, seed: int) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="satchel-bench-", dir="/var/tmp"))
    settings = replace(
        Settings.from_env(),
        data_dir=data_dir,
        listen="127.0.0.1:0",
        log_level="warning",
    )
    server = SatchelServer(settings)
    try:
        started = time.perf_counter()
        await server.start()
        print(f"server ready in {time.perf_counter() - started:.1f} s ({describe_machine()})")
        runtime = server.runtime()
        clock = EmbedClock(runtime)
        print(f"model {runtime.embedder.model_id}, batches of {batch_size}, {rows} rows each")
        project = f"bench-{uuid.uuid4().hex[:8]}"
        rng = random.Random(seed)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            api = memory_pb2_grpc.MemoryServiceStub(channel)

            async def record(batch: list) -> list:
                reply = await api.BatchRecordEvents(
                    memory_pb2.BatchRecordEventsRequest(requests=batch)
                )
                return list(reply.events)

            async def assert_(batch: list) -> list:
                reply = await api.BatchAssertFacts(
                    memory_pb2.BatchAssertFactsRequest(requests=batch)
                )
                return list(reply.facts)

            event_batches = chunks(list(event_requests(project, rows, rng)), batch_size)
            events, _, _ = await load("events", record, event_batches, clock)
            fact_batches = chunks(list(fact_requests(project, events, rng)), batch_size)
            facts, _, _ = await load("facts", assert_, fact_batches, clock)
            assert len(events) == len(facts) == rows
            # a replay of the first batches is answered from the idempotency keys: no embedding
            await load("replay", record, event_batches[:2], clock)
        print(f"done, load average {os.getloadavg()[0]:.2f} (other work on the machine counts)")
    finally:
        await server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="events and facts to load")
    parser.add_argument("--batch", type=int, default=500, help="rows per Batch RPC (<= 1000)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    configure_logging("warning", "console")
    # The embedded PostgreSQL is orphaned unless the process exits normally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(run(args.rows, args.batch, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
