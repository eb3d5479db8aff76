"""Watchers that never read: do they slow anyone else down?

    .venv/bin/python benchmarks/stalled_watchers.py [--watchers 500] [--per-connection 64]
        [--calls 40] [--settle 60] [--small-windows]

Starts `satchel serve` on a scratch embedded database (benchmarks/load.py's start and seeding;
SATCHEL_MAX_WATCHES_PER_CLIENT raised to `--per-connection`), then measures another client's
health check, AssembleContext and StreamContext, `--calls` of each:

- alone;
- right after `--watchers` WatchTraces streams of the same project are opened that never read
  (`--per-connection` a connection; gRPC's default HTTP/2 windows, which grow, or small fixed
  ones with `--small-windows`), so that every context call is offered to all of them while
  their windows and queues fill;
- `--settle` seconds later, the watchers still open and still not reading;
- after they are closed.

Prints p50 and p95 of each phase, and each phase's p50 over the p50 alone.
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
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent))
import load  # benchmarks/load.py: server start, seeding

from satchel.v1 import context_pb2, context_pb2_grpc

STALLED = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16 * 1024)]
METHODS = ("health", "AssembleContext", "StreamContext")


async def timings(channel: grpc.aio.Channel, project: str, calls: int) -> dict[str, list[float]]:
    """Milliseconds of `calls` calls of each method, interleaved."""
    context = context_pb2_grpc.ContextServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    for i in range(calls):
        subject = f"user-{i % 5}"
        started = time.perf_counter()
        await health.Check(health_pb2.HealthCheckRequest(), timeout=60)
        times["health"].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await context.AssembleContext(
            context_pb2.AssembleContextRequest(
                project_id=project, subject_id=subject, query="Who moved to Lima?"
            ),
            timeout=60,
        )
        times["AssembleContext"].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        request = context_pb2.StreamContextRequest(
            project_id=project, subject_id=subject, query="Who plays the violin?"
        )
        async for _ in context.StreamContext(request, timeout=60):
            pass
        times["StreamContext"].append((time.perf_counter() - started) * 1000)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def print_table(phases: dict[str, dict[str, list[float]]]) -> None:
    alone = phases["alone"]
    header = "".join(f"{m + ' p50 / p95 ms':>32}" for m in METHODS)
    print(f"{'phase':<40}{header}")
    for phase, times in phases.items():
        cells = ""
        for method in METHODS:
            median = statistics.median(times[method])
            ratio = median / statistics.median(alone[method])
            cells += f"{f'{median:.2f} / {p95(times[method]):.2f} (x{ratio:.1f})':>32}"
        print(f"{phase:<40}{cells}")


async def main(args: argparse.Namespace) -> int:
    os.environ["SATCHEL_MAX_WATCHES_PER_CLIENT"] = str(args.per_connection)
    phases: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="satchel-watchers-", dir="/var/tmp") as scratch:
        process, target = load.start_server(Path(scratch))
        try:
            async with grpc.aio.insecure_channel(target, options=load.OWN_CONNECTION) as channel:
                await load.wait_serving(channel, timeout=120)
                project = "watchers"
                await load.seed(channel, project, 300, 5, random.Random(7))
                await timings(channel, project, 5)  # warm up
                phases["alone"] = await timings(channel, project, args.calls)
                channels, watches = [], []
                for first in range(0, args.watchers, args.per_connection):
                    options = (STALLED if args.small_windows else []) + load.OWN_CONNECTION
                    stalled = grpc.aio.insecure_channel(target, options=options)
                    channels.append(stalled)
                    stub = context_pb2_grpc.ContextServiceStub(stalled)
                    for _ in range(min(args.per_connection, args.watchers - first)):
                        request = context_pb2.WatchTracesRequest(project_id=project)
                        watches.append(stub.WatchTraces(request))
                await asyncio.gather(*(w.initial_metadata() for w in watches))
                label = f"{len(watches)} watchers never reading"
                phases[label] = await timings(channel, project, args.calls)
                await asyncio.sleep(args.settle)
                phases[f"... {args.settle:.0f} s later"] = await timings(
                    channel, project, args.calls
                )
                for watch in watches:
                    watch.cancel()
                for stalled in channels:
                    await stalled.close()
                await asyncio.sleep(1)
                phases["watchers closed"] = await timings(channel, project, args.calls)
        finally:
            load.stop_server(process)
    print_table(phases)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=500, help="stalled watchers (max 2048)")
    parser.add_argument("--per-connection", type=int, default=64, help="watchers a connection")
    parser.add_argument("--calls", type=int, default=40, help="calls of each method a phase")
    parser.add_argument("--small-windows", action="store_true", help="16 kB windows, no BDP")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds before the 3rd phase")
    args = parser.parse_args(argv)
    args.watchers = max(1, min(args.watchers, 2048))
    args.per_connection = max(1, min(args.per_connection, 1024))
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
