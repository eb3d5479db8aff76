"""Load test of AssembleContext and StreamContext: a grpc.aio driver, loopback only.

    .venv/bin/python benchmarks/load.py [--workers 1 4 8 16] [--duration 10] [--facts 500]
    .venv/bin/python benchmarks/load.py --target 127.0.0.1:50051 --requests 2000
    .venv/bin/python benchmarks/load.py --target 127.0.0.1:50051 --seed-only --project load

Without --target it starts `satchel serve` in a subprocess on a scratch embedded database (a
temporary SATCHEL_DATA_DIR) and stops it afterwards. It seeds one project (facts spread over
`--subjects` subjects, a few episodes each), warms up, then runs each method in turn with N
concurrent workers for a fixed duration (or request count), for each N of `--workers`, spread
over `--connections` connections (default 1; a server with SATCHEL_PROCESSES above 1, started
here with `--server-processes`, needs several to use its processes), and prints requests/s,
p50/p95/p99 latency (StreamContext: to the packet, and to the first decision) and errors by
code. The driver is one process of its own, not pinned.

Beside them, in the same run, the query embedding alone (unless `--no-baseline`): one process
per core, each embedding the same queries one at a time with the server's model settings (one
ONNX thread), for the same duration. Then the ratios: CPU per call (the server's processes' and
all its PostgreSQL processes', from /proc; the driver's own is printed beside it, not counted)
over the CPU of one embedding, throughput over the embedding-only throughput, StreamContext
over AssembleContext, and the single call's p50 (one worker) over one embedding's. CPU is
counted when the script started the server, or with `--server-pid` and `--pgdata` for a running
one.

Bounded: at most 64 workers, 300 s and 100 000 requests per method. `--seed-only` loads the
data ghz (benchmarks/ghz.json) expects, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import multiprocessing
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
# A channel with a connection of its own (gRPC shares one between channels by default).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
MAX_SECONDS = 300.0
MAX_REQUESTS = 100_000
MAX_FACTS = 200_000

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


def queries() -> list[str]:
    """Every question the driver and the embedding baseline ask."""
    return [q.format(name=name) for q in QUERIES for name in NAMES]


async def seed(
    channel: grpc.aio.Channel, project: str, facts: int, subjects: int, rng: random.Random
) -> None:
    """Facts spread over `subjects` subjects (user-0…), and three episodes per subject."""
    stub = memory_pb2_grpc.MemoryServiceStub(channel)
    batch: list[memory_pb2.AssertFactRequest] = []
    for i in range(facts):
        name, city = NAMES[i % len(NAMES)], rng.choice(CITIES)
        statement = TEMPLATES[(i // len(NAMES)) % len(TEMPLATES)].format(name=name, city=city)
        batch.append(
            memory_pb2.AssertFactRequest(
                project_id=project,
                subject_id=f"user-{i % subjects}",
                predicate=f"note_{i}",
                value=_value(statement),
                statement=f"{statement} (note {i})",
            )
        )
        if len(batch) == 100 or i == facts - 1:
            request = memory_pb2.BatchAssertFactsRequest(requests=batch)
            await stub.BatchAssertFacts(request, timeout=120)
            batch = []
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
        for s in range(subjects)
        for k in range(3)
    ]
    for start in range(0, len(events), 100):
        request = memory_pb2.BatchRecordEventsRequest(requests=events[start : start + 100])
        await stub.BatchRecordEvents(request, timeout=120)


async def run_method(
    channels: list[grpc.aio.Channel],
    method: str,
    project: str,
    subjects: int,
    workers: int,
    seconds: float,
    requests: int | None,
    rng: random.Random,
    stream_batch: int = 0,
) -> Result:
    """`workers` concurrent loops calling `method` until the time or the request count is up
    (StreamContext: with `stream_batch` as its max_decisions_per_message), spread over the
    channels (connections) in turn."""
    stubs = [context_pb2_grpc.ContextServiceStub(channel) for channel in channels]
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
            "subject_id": f"user-{rng.randrange(subjects)}",
            "query": rng.choice(QUERIES).format(name=name),
        }

    async def worker(stub: context_pb2_grpc.ContextServiceStub) -> None:
        while (fields := next_request()) is not None:
            started = time.perf_counter()
            try:
                if method == "AssembleContext":
                    await stub.AssembleContext(
                        context_pb2.AssembleContextRequest(**fields), timeout=30
                    )
                else:
                    first = None
                    request = context_pb2.StreamContextRequest(
                        **fields, max_decisions_per_message=stream_batch
                    )
                    async for message in stub.StreamContext(request, timeout=30):
                        if first is None and message.WhichOneof("event") != "packet":
                            first = time.perf_counter() - started
                    if first is not None:
                        result.first_decision.append(first)
            except grpc.aio.AioRpcError as err:
                result.errors[err.code().name] += 1
                continue
            result.latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker(stubs[i % len(stubs)]) for i in range(workers)))
    result.seconds = time.perf_counter() - started
    return result


# --- CPU from /proc ---------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def children_of(parents: set[int]) -> list[int]:
    """The live processes whose parent is one of `parents`."""
    children = []
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is not None and int(fields[1]) in parents:  # fields[1]: the parent's pid
            children.append(int(entry))
    return children


def postgres_pids(pgdata: Path) -> list[int]:
    """The postmaster of `pgdata` (first line of postmaster.pid) and its live children."""
    try:
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return []
    return [postmaster, *children_of({postmaster})]


@dataclass(frozen=True)
class CpuMeter:
    """CPU seconds used by the server's processes (those given and their children: the workers
    of SATCHEL_PROCESSES) and by every process of its PostgreSQL."""

    server_pids: tuple[int, ...]
    pgdata: Path | None

    def read(self) -> dict[str, float]:
        pids = postgres_pids(self.pgdata) if self.pgdata else []
        server = set(self.server_pids)
        server |= set(children_of(server)) - set(pids)
        # the postmaster's reaped children count in its cutime/cstime
        postgres = self._seconds(pids[:1], children=True) + self._seconds(pids[1:], children=False)
        return {
            "server": self._seconds(sorted(server), children=False),
            "postgres": postgres,
            # this driver's own, on the same cores: what the machine spends to send the calls
            "driver": time.process_time(),
        }

    @staticmethod
    def _seconds(pids: list[int], *, children: bool) -> float:
        total = 0
        for pid in pids:
            if (fields := _stat(pid)) is not None:
                # utime, stime (and cutime, cstime) are fields 14-17 of /proc/PID/stat
                total += int(fields[11]) + int(fields[12])
                if children:
                    total += int(fields[13]) + int(fields[14])
        return total / TICKS


# --- the query embedding alone ----------------------------------------------------------------


def _embed_alone(seconds: float, texts: list[str], results: Any) -> None:
    """In a process of its own: embed `texts` one at a time, in turn, for `seconds`."""
    from satchel.server.embedding import load_embedder
    from satchel.server.platform.config import Settings

    embedder = load_embedder(Settings.from_env())
    prefixed = [embedder.query_prefix + t for t in texts]
    for text in prefixed[:20]:  # warm-up
        embedder.embed([text])
    latencies = []
    cpu_started, started = time.process_time(), time.perf_counter()
    while time.perf_counter() - started < seconds:
        began = time.perf_counter()
        embedder.embed([prefixed[len(latencies) % len(prefixed)]])
        latencies.append(time.perf_counter() - began)
    results.put(
        {
            "queries": len(latencies),
            "seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu_started,
            "latencies": latencies,
        }
    )


def embedding_baseline(seconds: float, processes: int) -> dict[str, Any]:
    """Queries/s of `processes` single-thread embedders side by side, their CPU per query,
    and one embedder's latency when it runs alone."""
    spawn = multiprocessing.get_context("spawn")

    def run(count: int) -> list[dict[str, Any]]:
        results = spawn.Queue()
        workers = [
            spawn.Process(target=_embed_alone, args=(seconds, queries(), results))
            for _ in range(count)
        ]
        for worker in workers:
            worker.start()
        reports = [results.get(timeout=seconds + 300) for _ in workers]
        for worker in workers:
            worker.join()
        return reports

    alone = run(1)[0]
    together = run(processes)
    done = sum(r["queries"] for r in together)
    return {
        "processes": processes,
        "queries_per_second": round(sum(r["queries"] / r["seconds"] for r in together), 1),
        "cpu_ms_per_query": round(1000 * sum(r["cpu_seconds"] for r in together) / done, 2),
        "alone_ms": {
            f"p{q}": round(percentile(alone["latencies"], q) * 1000, 2) for q in (50, 95, 99)
        },
    }


def ratios(summaries: list[dict[str, Any]], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """What issue 15 asks of each run, as ratios to the embedding alone."""
    found: dict[str, Any] = {}
    by_key = {(s["method"], s["workers"]): s for s in summaries}
    for (method, workers), s in by_key.items():
        key = f"{method}@{workers}"
        row: dict[str, Any] = {}
        if lat := s.get("latency_ms"):
            row["p99_over_p50"] = round(lat["p99"] / lat["p50"], 2)
        if baseline:
            row["throughput_over_embedding"] = round(
                s["requests_per_second"] / baseline["queries_per_second"], 2
            )
            if "cpu_ms_per_call" in s:
                row["cpu_over_embedding"] = round(
                    s["cpu_ms_per_call"]["total"] / baseline["cpu_ms_per_query"], 2
                )
            if workers == 1 and lat:
                row["p50_over_embedding"] = round(lat["p50"] / baseline["alone_ms"]["p50"], 2)
        unary = by_key.get(("AssembleContext", workers))
        if method == "StreamContext" and unary and unary["requests_per_second"]:
            row["throughput_over_assemble"] = round(
                s["requests_per_second"] / unary["requests_per_second"], 2
            )
        found[key] = row
    return found


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


def start_server(data_dir: Path, processes: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    """`satchel serve` on a scratch embedded database and a free loopback port, with
    `processes` server processes (SATCHEL_PROCESSES)."""
    target = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "SATCHEL_DATA_DIR": str(data_dir),
        "SATCHEL_LISTEN": target,
        "SATCHEL_PROCESSES": str(processes),
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


def print_table(report: dict[str, Any]) -> None:
    print(
        f"target {report['target']}  facts {report['facts']} ({report['subjects']} subjects)"
        f"  stream batch {report['stream_batch']}  cpus {report['cpus']}"
        f"  connections {report['connections']}"
        f"  server processes {report['server_processes'] or 'as running'}"
        "  driver: one process, not pinned"
    )
    print(
        f"{'method':<16}{'workers':>8}{'requests':>9}{'errors':>8}{'req/s':>8}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'cpu ms/call':>13}{'driver cpu':>12}"
    )
    for s in report["results"]:
        rows = [(s["method"], s.get("latency_ms"))]
        if "first_decision_ms" in s:
            rows.append(("  first decision", s["first_decision_ms"]))
        for i, (label, lat) in enumerate(rows):
            lat = lat or {"p50": 0, "p95": 0, "p99": 0}
            cpu = s.get("cpu_ms_per_call", {}).get("total", "")
            driver = s.get("cpu_ms_per_call", {}).get("driver", "")
            head = (
                f"{s['workers']:>8}{s['requests']:>9}{sum(s['errors'].values()):>8}"
                f"{s['requests_per_second']:>8}"
                if i == 0
                else " " * 33
            )
            tail = f"{cpu:>13}{driver:>12}" if i == 0 else ""
            print(f"{label:<16}{head}{lat['p50']:>9}{lat['p95']:>9}{lat['p99']:>9}{tail}")
        if s["errors"]:
            print(f"{'':<16}errors by code: {s['errors']}")
    if baseline := report.get("embedding_alone"):
        print(
            f"embedding alone: {baseline['queries_per_second']} queries/s"
            f" ({baseline['processes']} single-thread processes),"
            f" {baseline['cpu_ms_per_query']} ms CPU a query,"
            f" p50 {baseline['alone_ms']['p50']} ms when alone"
        )
    for key, row in report.get("ratios", {}).items():
        print(f"  {key:<22} " + "  ".join(f"{k} {v}" for k, v in row.items()))


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    process = None
    scratch = None
    target = args.target
    meter = CpuMeter(tuple(args.server_pid), args.pgdata)
    if target is None:
        scratch = tempfile.TemporaryDirectory(prefix="satchel-load-", dir="/var/tmp")
        process, target = start_server(Path(scratch.name), args.server_processes)
        meter = CpuMeter((process.pid,), Path(scratch.name) / "pg")
    elif not is_loopback(target):
        print(f"load.py drives loopback servers only, not {target}", file=sys.stderr)
        return 2
    project = args.project or f"load-{uuid.uuid4().hex[:8]}"
    summaries = []
    baseline = None
    try:
        # The kernel spreads connections over a server's processes (SATCHEL_PROCESSES).
        channels = [
            grpc.aio.insecure_channel(target, options=OWN_CONNECTION)
            for _ in range(args.connections)
        ]
        channel = channels[0]
        try:
            await wait_serving(channel, 180)
            await seed(channel, project, args.facts, args.subjects, rng)
            if args.seed_only:
                print(
                    f"seeded project {project}: {args.facts} facts,"
                    f" subjects user-0…user-{args.subjects - 1}"
                )
                return 0
            for workers in args.workers:
                for method in args.methods:
                    await run_method(
                        channels,
                        method,
                        project,
                        args.subjects,
                        workers,
                        args.warmup,
                        None,
                        rng,
                        args.stream_batch,
                    )
                    before = meter.read()
                    result = await run_method(
                        channels,
                        method,
                        project,
                        args.subjects,
                        workers,
                        args.duration,
                        args.requests,
                        rng,
                        args.stream_batch,
                    )
                    after = meter.read()
                    summary = {"workers": workers, **result.summary()}
                    if meter.server_pids and summary["ok"]:
                        used = {k: 1000 * (after[k] - before[k]) / summary["ok"] for k in after}
                        used["total"] = used["server"] + used["postgres"]  # the driver apart
                        summary["cpu_ms_per_call"] = {k: round(v, 2) for k, v in used.items()}
                    summaries.append(summary)
        finally:
            await asyncio.gather(*(c.close() for c in channels))
        if not args.no_baseline:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
            baseline = await asyncio.to_thread(embedding_baseline, args.duration, cores)
    finally:
        if process is not None:
            stop_server(process)
        if scratch is not None:
            scratch.cleanup()
    report: dict[str, Any] = {
        "target": args.target or "embedded (subprocess)",
        "facts": args.facts,
        "subjects": args.subjects,
        "stream_batch": args.stream_batch,
        "connections": args.connections,
        "server_processes": args.server_processes if args.target is None else None,
        "cpus": os.cpu_count(),
        "results": summaries,
    }
    if baseline is not None:
        report["embedding_alone"] = baseline
    report["ratios"] = ratios(summaries, baseline)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", help="host:port of a running server (loopback only)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[8], help="concurrent callers, each (max 64)"
    )
    parser.add_argument(
        "--duration",
        type=float,
        help="seconds per method (max 300; default 10, or 300 with --requests)",
    )
    parser.add_argument("--requests", type=int, help="stop each method after this many calls")
    parser.add_argument("--warmup", type=float, default=2.0, help="unrecorded seconds per method")
    parser.add_argument("--facts", type=int, default=500, help=f"facts to seed (max {MAX_FACTS:,})")
    parser.add_argument("--subjects", type=int, default=5, help="scopes the facts spread over")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["AssembleContext", "StreamContext"],
        choices=["AssembleContext", "StreamContext"],
    )
    parser.add_argument(
        "--stream-batch",
        type=int,
        default=0,
        help="StreamContext's max_decisions_per_message (0: one decision a message)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=1,
        help="connections the workers are spread over (max 64; default 1)",
    )
    parser.add_argument(
        "--server-processes",
        type=int,
        default=1,
        help="without --target: the started server's SATCHEL_PROCESSES (default 1)",
    )
    parser.add_argument("--project", help="project to seed and query (default: a new one)")
    parser.add_argument("--seed-only", action="store_true", help="seed the project, then exit")
    parser.add_argument("--seed", type=int, default=7, help="random seed")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the embedding-alone measurement"
    )
    parser.add_argument(
        "--server-pid",
        type=int,
        nargs="+",
        default=[],
        help="with --target: the server's pid, or the pids of its processes (CPU)",
    )
    parser.add_argument(
        "--pgdata", type=Path, help="with --target: its PostgreSQL data directory (CPU)"
    )
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = MAX_SECONDS if args.requests is not None else 10.0
    if not all(1 <= w <= MAX_WORKERS for w in args.workers):
        parser.error(f"--workers must be in 1..{MAX_WORKERS}")
    if not 1 <= args.connections <= MAX_WORKERS:
        parser.error(f"--connections must be in 1..{MAX_WORKERS}")
    if not 1 <= args.server_processes <= 4:
        parser.error("--server-processes must be in 1..4")
    if not 0 < args.duration <= MAX_SECONDS or not 0 <= args.warmup <= MAX_SECONDS:
        parser.error(f"--duration and --warmup must be at most {MAX_SECONDS:.0f} s")
    if args.requests is not None and not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be in 1..{MAX_REQUESTS}")
    if not 1 <= args.facts <= MAX_FACTS:
        parser.error(f"--facts must be in 1..{MAX_FACTS}")
    if not 0 <= args.stream_batch <= 256:
        parser.error("--stream-batch must be in 0..256")
    if not 1 <= args.subjects <= min(args.facts, 1000):
        parser.error("--subjects must be in 1..min(facts, 1000)")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
