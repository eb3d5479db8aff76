"""Watchers that never read: do they slow anyone else down?

    .venv/bin/python benchmarks/stalled_watchers.py [--watchers 512] [--calls 30]

Starts `satchel serve` on a scratch embedded database (benchmarks/load.py's start and seeding),
measures a client's health check and AssembleContext medians, then opens `--watchers`
WatchTraces streams of the same project that never read (16 a connection, the default
per-client limit; small HTTP/2 windows), so that every context call is offered to all of them
and their queues fill, and measures again. Prints both medians side by side.
"""

from __future__ import annotations

import argparse
import asyncio
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
PER_CONNECTION = 16


async def medians(channel: grpc.aio.Channel, project: str, calls: int) -> tuple[float, float]:
    context = context_pb2_grpc.ContextServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    checks, assembled = [], []
    for i in range(calls):
        started = time.perf_counter()
        await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
        checks.append((time.perf_counter() - started) * 1000)
        request = context_pb2.AssembleContextRequest(
            project_id=project, subject_id=f"user-{i % 5}", query="Who moved to Lima?"
        )
        started = time.perf_counter()
        await context.AssembleContext(request, timeout=60)
        assembled.append((time.perf_counter() - started) * 1000)
    return statistics.median(checks), statistics.median(assembled)


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="satchel-watchers-", dir="/var/tmp") as scratch:
        process, target = load.start_server(Path(scratch))
        try:
            async with grpc.aio.insecure_channel(target, options=load.OWN_CONNECTION) as channel:
                await load.wait_serving(channel, timeout=120)
                project = "watchers"
                await load.seed(channel, project, 300, 5, random.Random(7))
                await medians(channel, project, 5)  # warm up
                alone = await medians(channel, project, args.calls)
                channels, watches = [], []
                for first in range(0, args.watchers, PER_CONNECTION):
                    options = STALLED + load.OWN_CONNECTION
                    stalled = grpc.aio.insecure_channel(target, options=options)
                    channels.append(stalled)
                    stub = context_pb2_grpc.ContextServiceStub(stalled)
                    for _ in range(min(PER_CONNECTION, args.watchers - first)):
                        request = context_pb2.WatchTracesRequest(project_id=project)
                        watches.append(stub.WatchTraces(request))
                await asyncio.gather(*(w.initial_metadata() for w in watches))
                watched = await medians(channel, project, args.calls)
                for watch in watches:
                    watch.cancel()
                for stalled in channels:
                    await stalled.close()
        finally:
            load.stop_server(process)
    print(f"{'':<34}{'health p50 ms':>14}{'AssembleContext p50 ms':>24}")
    print(f"{'alone':<34}{alone[0]:>14.2f}{alone[1]:>24.1f}")
    label = f"{len(watches)} watchers never reading"
    print(f"{label:<34}{watched[0]:>14.2f}{watched[1]:>24.1f}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=512, help="stalled watchers (max 2048)")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    args.watchers = max(1, min(args.watchers, 2048))
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
