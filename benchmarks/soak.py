"""Soak test: a steady mix of AssembleContext, StreamContext and writes for minutes or hours.

    .venv/bin/python benchmarks/soak.py [--duration 600] [--rate 12] [--window 60]
    .venv/bin/python benchmarks/soak.py --target 127.0.0.1:50051 [--api-key KEY] --duration 3600

Without --target it starts `satchel serve` in a subprocess (on SATCHEL_DATABASE_URL, else on a
scratch embedded database in a temporary SATCHEL_DATA_DIR), on loopback only, and stops it
afterwards; with --target it loads a running server (give --server-pid to sample its memory).
It seeds one project, then sends `--rate` calls per second at fixed intervals (open loop: a
slow server does not slow the load down): 50 % AssembleContext, 20 % StreamContext read to the
packet, 20 % AssertFact, 10 % RecordEvent, each with a 30 s deadline. Every `--window` seconds
it prints the calls, errors and latency percentiles of that window and the server's resident
memory (RSS); at the end, the totals and the RSS trend. Exit status 1 when any call failed.
Figures: benchmarks/soak.md. The CI test (tests/project/test_soak.py) runs it for 90 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

NAMES = ["Caroline", "Melanie", "Jordan", "Priya", "Tomas", "Aiko", "Lucas", "Amara"]
FACTS = [
    "{n} lives in {p}",
    "{n} works as a {j}",
    "{n} is learning the {i}",
    "{n} has a cat called {c}",
    "{n} prefers invoices in {l}",
]
PLACES = ["Lisbon", "Boston", "Nairobi", "Osaka", "Porto", "Denver", "Lyon", "Oslo"]
JOBS = ["nurse", "carpenter", "data engineer", "teacher", "pilot", "baker"]
INSTRUMENTS = ["violin", "piano", "cello", "drums", "flute"]
CATS = ["Biscuit", "Miso", "Pepper", "Luna", "Tofu"]
LANGUAGES = ["French", "German", "Portuguese", "Japanese", "English"]
QUESTIONS = [
    "Where does {n} live?",
    "What is {n}'s job?",
    "Which instrument does {n} play?",
    "What is the name of {n}'s cat?",
    "Which language for {n}'s invoices?",
]
MIX = (("assemble", 50), ("stream", 20), ("fact", 20), ("event", 10))
DEADLINE = 30.0
SUBJECTS = 4
MAX_IN_FLIGHT = 256


def _statement(rng: random.Random) -> str:
    return rng.choice(FACTS).format(
        n=rng.choice(NAMES),
        p=rng.choice(PLACES),
        j=rng.choice(JOBS),
        i=rng.choice(INSTRUMENTS),
        c=rng.choice(CATS),
        l=rng.choice(LANGUAGES),
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of values, 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def rss_mib(pid: int | None) -> float | None:
    """Resident memory of a process in MiB (Linux /proc), None when unknown."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


@dataclass
class Window:
    """What happened in one time window."""

    start_s: float
    calls: int = 0
    errors: int = 0
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    rss_mib: float | None = None

    def summary(self) -> dict[str, object]:
        every = [v for values in self.latencies_ms.values() for v in values]
        out: dict[str, object] = {
            "start_s": round(self.start_s),
            "calls": self.calls,
            "errors": self.errors,
            "p50_ms": round(percentile(every, 50), 1),
            "p95_ms": round(percentile(every, 95), 1),
            "p99_ms": round(percentile(every, 99), 1),
            "rss_mib": round(self.rss_mib, 1) if self.rss_mib is not None else None,
        }
        for kind, values in sorted(self.latencies_ms.items()):
            out[f"{kind}_p95_ms"] = round(percentile(values, 95), 1)
        return out


@dataclass
class Report:
    """The whole run: windows, totals, errors by code, memory at start and end."""

    duration_s: float
    rate: float
    windows: list[dict[str, object]]
    calls: int
    errors: int
    errors_by_code: dict[str, int]
    error_samples: list[str]
    skipped: int
    rss_start_mib: float | None
    rss_end_mib: float | None
    latency_ms: dict[str, dict[str, float]]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


class Soak:
    """Drives the load against one server and records every call."""

    def __init__(
        self,
        target: str,
        *,
        project: str,
        api_key: str | None,
        server_pid: int | None,
        seed: int = 7,
    ) -> None:
        self.target = target
        self.project = project
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.server_pid = server_pid
        self.rng = random.Random(seed)
        self.codes: Counter[str] = Counter()
        self.samples: list[str] = []
        self.all_latencies: dict[str, list[float]] = {}
        self.skipped = 0
        self._in_flight = 0
        self._counter = 0

    async def seed(self, channel: grpc.aio.Channel, facts: int) -> None:
        """`facts` facts and a few events spread over SUBJECTS subjects."""
        memory = memory_pb2_grpc.MemoryServiceStub(channel)
        for subject in range(SUBJECTS):
            requests = [
                self._fact(f"user-{subject}", f"seed-{subject}-{i}")
                for i in range(facts // SUBJECTS)
            ]
            for start in range(0, len(requests), 100):
                batch = memory_pb2.BatchAssertFactsRequest(requests=requests[start : start + 100])
                await memory.BatchAssertFacts(batch, metadata=self.metadata, timeout=120)

    def _fact(self, subject: str, key: str) -> memory_pb2.AssertFactRequest:
        from google.protobuf import struct_pb2

        statement = _statement(self.rng)
        return memory_pb2.AssertFactRequest(
            project_id=self.project,
            subject_id=subject,
            predicate="note",
            value=struct_pb2.Value(string_value=statement),
            statement=statement,
            idempotency_key=key,
        )

    async def _one(self, channel: grpc.aio.Channel, kind: str, window: Window) -> None:
        subject = f"user-{self.rng.randrange(SUBJECTS)}"
        question = self.rng.choice(QUESTIONS).format(n=self.rng.choice(NAMES))
        self._counter += 1
        started = time.perf_counter()
        try:
            if kind == "assemble":
                await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(
                    context_pb2.AssembleContextRequest(
                        project_id=self.project, subject_id=subject, query=question
                    ),
                    metadata=self.metadata,
                    timeout=DEADLINE,
                )
            elif kind == "stream":
                call = context_pb2_grpc.ContextServiceStub(channel).StreamContext(
                    context_pb2.StreamContextRequest(
                        project_id=self.project, subject_id=subject, query=question
                    ),
                    metadata=self.metadata,
                    timeout=DEADLINE,
                )
                replies = [reply async for reply in call]
                if not replies or replies[-1].WhichOneof("event") != "packet":
                    raise RuntimeError("the stream ended without a packet")
            elif kind == "fact":
                await memory_pb2_grpc.MemoryServiceStub(channel).AssertFact(
                    self._fact(subject, f"soak-{uuid.uuid4().hex}"),
                    metadata=self.metadata,
                    timeout=DEADLINE,
                )
            else:
                from google.protobuf import struct_pb2

                payload = struct_pb2.Struct()
                payload.update({"speaker": subject, "text": _statement(self.rng)})
                await memory_pb2_grpc.MemoryServiceStub(channel).RecordEvent(
                    memory_pb2.RecordEventRequest(
                        project_id=self.project,
                        subject_id=subject,
                        kind="conversation.message",
                        payload=payload,
                    ),
                    metadata=self.metadata,
                    timeout=DEADLINE,
                )
        except (grpc.aio.AioRpcError, RuntimeError) as exc:
            code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "STREAM"
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            self.codes[code] += 1
            window.errors += 1
            if len(self.samples) < 20:
                self.samples.append(f"{kind}: {code} {details}")
        else:
            elapsed = (time.perf_counter() - started) * 1000
            window.latencies_ms.setdefault(kind, []).append(elapsed)
            self.all_latencies.setdefault(kind, []).append(elapsed)
        finally:
            window.calls += 1
            self._in_flight -= 1

    async def run(
        self, duration: float, rate: float, window_s: float, *, quiet: bool = False
    ) -> Report:
        """Send `rate` calls/s for `duration` seconds; report by windows of `window_s`."""
        kinds = [k for k, weight in MIX for _ in range(weight)]
        async with grpc.aio.insecure_channel(self.target) as channel:
            rss_start = rss_mib(self.server_pid)
            loop = asyncio.get_running_loop()
            begin = loop.time()
            windows = [Window(0.0)]
            tasks: set[asyncio.Task[None]] = set()
            n = 0
            while True:
                due = begin + n / rate
                now = loop.time()
                if due - begin >= duration:
                    break
                if due > now:
                    await asyncio.sleep(due - now)
                elapsed = loop.time() - begin
                if elapsed >= windows[-1].start_s + window_s:
                    self._close_window(windows[-1], quiet)
                    windows.append(Window(windows[-1].start_s + window_s))
                n += 1
                if self._in_flight >= MAX_IN_FLIGHT:
                    self.skipped += 1
                    continue
                self._in_flight += 1
                task = asyncio.create_task(self._one(channel, self.rng.choice(kinds), windows[-1]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
            self._close_window(windows[-1], quiet)
            rss_end = rss_mib(self.server_pid)
        every = dict(self.all_latencies)
        every["all"] = [x for v in self.all_latencies.values() for x in v]
        return Report(
            duration_s=duration,
            rate=rate,
            windows=[w.summary() for w in windows],
            calls=sum(w.calls for w in windows),
            errors=sum(w.errors for w in windows),
            errors_by_code=dict(self.codes),
            error_samples=self.samples,
            skipped=self.skipped,
            rss_start_mib=rss_start,
            rss_end_mib=rss_end,
            latency_ms={
                kind: {
                    "p50": round(percentile(values, 50), 1),
                    "p95": round(percentile(values, 95), 1),
                    "p99": round(percentile(values, 99), 1),
                    "max": round(max(values, default=0.0), 1),
                }
                for kind, values in sorted(every.items())
            },
        )

    def _close_window(self, window: Window, quiet: bool) -> None:
        # Calls still running when a window closes are counted in it when they end.
        window.rss_mib = rss_mib(self.server_pid)
        if not quiet:
            print(_row(window.summary()), flush=True)


def _row(summary: dict[str, object]) -> str:
    return "  ".join(f"{k}={v}" for k, v in summary.items())


def start_server(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """`satchel serve` on 127.0.0.1 (a free port); returns the process and its address."""
    satchel = str(Path(sys.executable).parent / "satchel")
    full_env = {**os.environ, "SATCHEL_LISTEN": "127.0.0.1:0", "SATCHEL_LOG_FORMAT": "json"}
    full_env.update(env)
    log = log_path.open("w")
    proc = subprocess.Popen([satchel, "serve"], env=full_env, stdout=log, stderr=log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        text = log_path.read_text()
        port = re.search(r'"port": (\d+)', text)
        if port and '"server_ready"' in text:
            return proc, f"127.0.0.1:{port.group(1)}"
        if proc.poll() is not None:
            raise RuntimeError(f"satchel serve exited:\n{text}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("satchel serve did not become ready in 180 s")


def stop_server(proc: subprocess.Popen) -> int:
    """SIGTERM, then wait (the server drains and stops its embedded database)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def print_report(report: Report) -> None:
    print(
        f"\n{report.calls} calls in {report.duration_s:.0f} s at {report.rate:g}/s:"
        f" {report.errors} errors{' ' + str(report.errors_by_code) if report.errors else ''},"
        f" {report.skipped} skipped (more than {MAX_IN_FLIGHT} calls in flight)"
    )
    for kind, figures in report.latency_ms.items():
        print(f"  {kind:9} " + "  ".join(f"{k} {v:7.1f} ms" for k, v in figures.items()))
    if report.rss_start_mib is not None and report.rss_end_mib is not None:
        print(f"  server RSS {report.rss_start_mib:.0f} MiB -> {report.rss_end_mib:.0f} MiB")
    for sample in report.error_samples:
        print(f"  error: {sample}")


async def soak(args: argparse.Namespace) -> Report:
    proc = None
    target = args.target
    server_pid = args.server_pid
    scratch = None
    if target is None:
        env: dict[str, str] = {}
        if not os.environ.get("SATCHEL_DATABASE_URL"):
            scratch = tempfile.mkdtemp(prefix="satchel-soak-", dir="/var/tmp")
            env["SATCHEL_DATA_DIR"] = scratch
        log_path = Path(scratch or tempfile.mkdtemp(prefix="satchel-soak-")) / "serve.log"
        proc, target = await asyncio.to_thread(start_server, env, log_path)
        server_pid = proc.pid
        print(f"server {target} (pid {proc.pid}), log {log_path}", flush=True)
    try:
        runner = Soak(
            target,
            project=args.project or f"soak-{uuid.uuid4().hex[:8]}",
            api_key=args.api_key,
            server_pid=server_pid,
        )
        async with grpc.aio.insecure_channel(target) as channel:
            await runner.seed(channel, args.facts)
        return await runner.run(args.duration, args.rate, args.window)
    finally:
        if proc is not None:
            await asyncio.to_thread(stop_server, proc)
        if scratch is not None:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--rate", type=float, default=12.0, help="calls per second")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per report line")
    parser.add_argument("--facts", type=int, default=400, help="facts seeded before the load")
    parser.add_argument("--target", help="host:port of a running server (default: start one)")
    parser.add_argument("--server-pid", type=int, help="pid of --target, to sample its RSS")
    parser.add_argument("--api-key", default=os.environ.get("SATCHEL_API_KEY"))
    parser.add_argument("--project", help="project to load (default: a new one)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if not 0 < args.rate <= 200 or not 0 < args.duration <= 7 * 24 * 3600:
        parser.error("--rate must be in (0, 200] and --duration in (0, 1 week]")
    report = asyncio.run(soak(args))
    print_report(report)
    if args.json:
        args.json.write_text(report.to_json())
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
