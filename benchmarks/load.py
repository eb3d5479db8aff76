"""Load test of AssembleContext and StreamContext: a grpc.aio driver, loopback only.

    .venv/bin/python benchmarks/load.py [--workers 8] [--duration 10] [--facts 500]
    .venv/bin/python benchmarks/load.py --target 127.0.0.1:50051 --requests 2000
    .venv/bin/python benchmarks/load.py --target 127.0.0.1:50051 --seed-only --project load

Without --target it starts `satchel serve` in a subprocess on a scratch embedded database (a
temporary SATCHEL_DATA_DIR) and stops it afterwards. It seeds one project (facts spread over
a few subjects, a few episodes each), warms up, then runs each method in turn with N concurrent
workers on one channel for a fixed duration (or request count), and prints requests/s,
p50/p95/p99 latency (StreamContext: to the packet, and to the first decision) and errors by
code. Bounded: at most 64 workers, 300 s and 100 000 requests per method. `--seed-only` loads
the data ghz (benchmarks/ghz.json) expects, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

MAX_WORKERS = 64
MAX_SECONDS = 300.0
MAX_REQUESTS = 100_000
SUBJECTS = 5

NAMES = ["Caroline", "Melanie", "Jordan", "Priya", "Tomas", "Aiko", "Lucas", "Amara"]
CITIES = ["Lisbon", "Porto", "Berlin", "Osaka", "Lima", "Oslo", "Quito", "Accra"]
TEMPLATES = [
    "{name} moved to {city} last spring",
    "{name} works as a nurse on night shifts in {city}",
    "{name} is allergic to peanuts",
    "{name} adopted a rescue dog named Biscuit",
    "{name} plays the violin in a community orchestra in {city}",
    "{name}'s favourite food is pad thai",
    "{name} is training for the {city} marathon",
    "{name} prefers short answers in bullet points",
    "{name} is learning Portuguese on weekends",
    "{name} maintains a nightly invoice pipeline in PostgreSQL",
]
QUERIES = [
    "Where does {name} live?",
    "What does {name} do for work?",
    "Does {name} have any allergies?",
    "Tell me about {name}'s pets",
    "What are {name}'s hobbies?",
    "How should I format answers for {name}?",
    "What is {name} training for?",
]


@dataclass
class Result:
    """Latencies (seconds) and errors of one method's run."""

    method: str
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    first_decision: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        ok = len(self.latencies)
        summary: dict[str, Any] = {
            "method": self.method,
            "requests": ok + sum(self.errors.values()),
            "ok": ok,
            "errors": dict(self.errors),
            "seconds": round(self.seconds, 3),
            "requests_per_second": round(ok / self.seconds, 1) if self.seconds else 0.0,
        }
        for name, values in (
            ("latency_ms", self.latencies),
            ("first_decision_ms", self.first_decision),
        ):
            if values:
                summary[name] = {
                    f"p{q}": round(percentile(values, q) * 1000, 2) for q in (50, 95, 99)
                }
        return summary


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of values."""
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def is_loopback(target: str) -> bool:
    """True when host:port names this machine (127.0.0.0/8, ::1 or localhost)."""
    host = target.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _value(data: Any) -> struct_pb2.Value:
    return json_format.ParseDict(data, struct_pb2.Value())


async def seed(channel: grpc.aio.Channel, project: str, facts: int, rng: random.Random) -> None:
    """Facts spread over SUBJECTS subjects (user-0…), and three episodes per subject."""
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    requests = []
    for i in range(facts):
        name, city = NAMES[i % len(NAMES)], rng.choice(CITIES)
        statement = TEMPLATES[(i // len(NAMES)) % len(TEMPLATES)].format(name=name, city=city)
        requests.append(
            memory_pb2.AssertFactRequest(
                project_id=project,
                subject_id=f"user-{i % SUBJECTS}",
                predicate=f"note_{i}",
                value=_value(statement),
                statement=f"{statement} (note {i})",
            )
        )
    for start in range(0, len(requests), 100):
        batch = memory_pb2.BatchAssertFactsRequest(requests=requests[start : start + 100])
        await stub.BatchAssertFacts(batch, timeout=120)
    events = [
        memory_pb2.RecordEventRequest(
            project_id=project,
            subject_id=f"user-{s}",
            kind="conversation.message",
            payload=json_format.ParseDict(
                {
                    "speaker": "user",
                    "text": f"{NAMES[(s + k) % len(NAMES)]} says hi from {CITIES[k]}",
                },
                struct_pb2.Struct(),
            ),
        )
        for s in range(SUBJECTS)
        for k in range(3)
    ]
    await stub.BatchRecordEvents(memory_pb2.BatchRecordEventsRequest(requests=events), timeout=120)


async def run_method(
    channel: grpc.aio.Channel,
    method: str,
    project: str,
    workers: int,
    seconds: float,
    requests: int | None,
    rng: random.Random,
) -> Result:
    """`workers` concurrent loops calling `method` until the time or the request count is up."""
    stub = context_pb2_grpc.ContextServiceStub(channel)
    result = Result(method)
    deadline = time.perf_counter() + seconds
    issued = 0

    def next_request() -> dict[str, Any] | None:
        nonlocal issued
        if time.perf_counter() >= deadline or (requests is not None and issued >= requests):
            return None
        issued += 1
        name = rng.choice(NAMES)
        return {
            "project_id": project,
            "subject_id": f"user-{rng.randrange(SUBJECTS)}",
            "query": rng.choice(QUERIES).format(name=name),
        }

    async def worker() -> None:
        while (fields := next_request()) is not None:
            started = time.perf_counter()
            try:
                if method == "AssembleContext":
                    await stub.AssembleContext(
                        context_pb2.AssembleContextRequest(**fields), timeout=30
                    )
                else:
                    first = None
                    async for message in stub.StreamContext(
                        context_pb2.StreamContextRequest(**fields), timeout=30
                    ):
                        if first is None and message.HasField("decision"):
                            first = time.perf_counter() - started
                    if first is not None:
                        result.first_decision.append(first)
            except grpc.aio.AioRpcError as err:
                result.errors[err.code().name] += 1
                continue
            result.latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    result.seconds = time.perf_counter() - started
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_serving(channel: grpc.aio.Channel, timeout: float) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the server did not become SERVING within {timeout:.0f} s")
        await asyncio.sleep(0.2)


def start_server(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`satchel serve` on a scratch embedded database and a free loopback port."""
    target = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "SATCHEL_DATA_DIR": str(data_dir),
        "SATCHEL_LISTEN": target,
        "SATCHEL_LOG_LEVEL": "error",
        "GRPC_VERBOSITY": "ERROR",
    }
    env.pop("SATCHEL_DATABASE_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "satchel.server.cli", "serve"], env=env, stdout=subprocess.DEVNULL
    )
    return process, target


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def print_table(summaries: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    print(
        f"target {meta['target']}  workers {meta['workers']}  facts {meta['facts']}"
        f" ({SUBJECTS} subjects)  cpus {os.cpu_count()}"
    )
    print(
        f"{'method':<16}{'requests':>9}{'errors':>8}{'req/s':>8}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
    )
    for s in summaries:
        rows = [(s["method"], s.get("latency_ms"))]
        if "first_decision_ms" in s:
            rows.append(("  first decision", s["first_decision_ms"]))
        for i, (label, lat) in enumerate(rows):
            lat = lat or {"p50": 0, "p95": 0, "p99": 0}
            head = (
                f"{s['requests']:>9}{sum(s['errors'].values()):>8}{s['requests_per_second']:>8}"
                if i == 0
                else " " * 25
            )
            print(f"{label:<16}{head}{lat['p50']:>9}{lat['p95']:>9}{lat['p99']:>9}")
        if s["errors"]:
            print(f"{'':<16}errors by code: {s['errors']}")


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    process = None
    scratch = None
    target = args.target
    if target is None:
        scratch = tempfile.TemporaryDirectory(prefix="satchel-load-", dir="/var/tmp")
        process, target = start_server(Path(scratch.name))
    elif not is_loopback(target):
        print(f"load.py drives loopback servers only, not {target}", file=sys.stderr)
        return 2
    project = args.project or f"load-{uuid.uuid4().hex[:8]}"
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            await wait_serving(channel, 180)
            await seed(channel, project, args.facts, rng)
            if args.seed_only:
                print(
                    f"seeded project {project}: {args.facts} facts,"
                    f" subjects user-0…user-{SUBJECTS - 1}"
                )
                return 0
            summaries = []
            for method in args.methods:
                await run_method(channel, method, project, args.workers, args.warmup, None, rng)
                result = await run_method(
                    channel, method, project, args.workers, args.duration, args.requests, rng
                )
                summaries.append(result.summary())
    finally:
        if process is not None:
            stop_server(process)
        if scratch is not None:
            scratch.cleanup()
    meta = {
        "target": args.target or "embedded (subprocess)",
        "workers": args.workers,
        "facts": args.facts,
    }
    if args.json:
        print(json.dumps({**meta, "cpus": os.cpu_count(), "results": summaries}, indent=2))
    else:
        print_table(summaries, meta)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", help="host:port of a running server (loopback only)")
    parser.add_argument("--workers", type=int, default=8, help="concurrent callers (max 64)")
    parser.add_argument(
        "--duration",
        type=float,
        help="seconds per method (max 300; default 10, or 300 with --requests)",
    )
    parser.add_argument("--requests", type=int, help="stop each method after this many calls")
    parser.add_argument("--warmup", type=float, default=2.0, help="unrecorded seconds per method")
    parser.add_argument("--facts", type=int, default=500, help="facts to seed (max 20000)")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["AssembleContext", "StreamContext"],
        choices=["AssembleContext", "StreamContext"],
    )
    parser.add_argument("--project", help="project to seed and query (default: a new one)")
    parser.add_argument("--seed-only", action="store_true", help="seed the project, then exit")
    parser.add_argument("--seed", type=int, default=7, help="random seed")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = MAX_SECONDS if args.requests is not None else 10.0
    if not 1 <= args.workers <= MAX_WORKERS:
        parser.error(f"--workers must be in 1..{MAX_WORKERS}")
    if not 0 < args.duration <= MAX_SECONDS or not 0 <= args.warmup <= MAX_SECONDS:
        parser.error(f"--duration and --warmup must be at most {MAX_SECONDS:.0f} s")
    if args.requests is not None and not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be in 1..{MAX_REQUESTS}")
    if not 1 <= args.facts <= 20_000:
        parser.error("--facts must be in 1..20000")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
