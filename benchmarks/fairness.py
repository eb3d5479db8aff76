"""One client floods AssembleContext; how slow does another client's call get?

    .venv/bin/python benchmarks/fairness.py [--flood 400] [--calls 60] [--facts 300]

Starts `satchel serve` on a scratch embedded database (as benchmarks/load.py does, whose seeding
it reuses), then measures a second client's sequential AssembleContext calls: first alone
(unloaded), then while a first client, in its own process, keeps `--flood` calls in flight on
its own connection (a refused call is sent again after 1 s, gRPC's first retry backoff). Prints
both medians and their ratio, the flood's calls by status code (RESOURCE_EXHAUSTED beyond its
admission limit) and how long it ran. Auth is off: a client is its connection. SATCHEL_*
settings of the environment reach the server (SATCHEL_MAX_ACTIVE_CALLS=4 …).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).parent))
import load  # benchmarks/load.py: server start, seeding

from satchel.v1 import context_pb2, context_pb2_grpc

PROJECT = "fairness"
SUBJECTS = 5  # the facts spread over user-0…user-4


async def timed_calls(
    stub: context_pb2_grpc.ContextServiceStub, project: str, n: int
) -> list[float]:
    latencies = []
    for i in range(n):
        request = context_pb2.AssembleContextRequest(
            project_id=project,
            subject_id=f"user-{i % SUBJECTS}",
            query="Where does Priya live?",
        )
        started = time.perf_counter()
        await stub.AssembleContext(request, timeout=60)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def flood(target: str, project: str, in_flight: int, stop: asyncio.Event) -> Counter[str]:
    codes: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(target, options=load.OWN_CONNECTION) as channel:
        stub = context_pb2_grpc.ContextServiceStub(channel)

        async def worker(i: int) -> None:
            request = context_pb2.AssembleContextRequest(
                project_id=project,
                subject_id=f"user-{i % SUBJECTS}",
                query="Who plays the violin?",
            )
            while not stop.is_set():
                try:
                    await stub.AssembleContext(request, timeout=120)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as err:
                    codes[err.code().name] += 1
                    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        await asyncio.sleep(1.0)  # gRPC's own first retry backoff

        await asyncio.gather(*(worker(i) for i in range(in_flight)))
    return codes


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="satchel-fairness-", dir="/var/tmp") as scratch:
        process, target = load.start_server(Path(scratch))
        try:
            async with grpc.aio.insecure_channel(target, options=load.OWN_CONNECTION) as channel:
                await load.wait_serving(channel, timeout=120)
                project = PROJECT
                await load.seed(channel, project, args.facts, SUBJECTS, random.Random(7))
                stub = context_pb2_grpc.ContextServiceStub(channel)
                await timed_calls(stub, project, 10)  # warm up
                alone = await timed_calls(stub, project, args.calls)
                flood_command = ["--flood-target", target, "--flood", str(args.flood)]
                flooder = subprocess.Popen(
                    [sys.executable, __file__, *flood_command],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                await asyncio.sleep(3)  # the flood is at its peak
                started = time.perf_counter()
                loaded = await timed_calls(stub, project, args.calls)
                elapsed = time.perf_counter() - started
                output, _ = flooder.communicate(b"stop\n", timeout=300)
                codes = json.loads(output)
        finally:
            load.stop_server(process)
    a, b = statistics.median(alone), statistics.median(loaded)
    print(
        f"another client's AssembleContext p50: alone {a:.1f} ms, during the flood {b:.1f} ms"
        f" (x{b / a:.2f}); p95 during the flood {sorted(loaded)[int(0.95 * len(loaded))]:.1f} ms"
    )
    print(
        f"the flood ({args.flood} calls in flight on one connection): {dict(codes)}"
        f" in {elapsed + 3:.0f} s"
    )
    return 0


async def flood_until_told(target: str, in_flight: int) -> None:
    """The flooding client's process: flood until a line on stdin, then print its codes."""
    stop = asyncio.Event()
    flooding = asyncio.create_task(flood(target, PROJECT, in_flight, stop))
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop.set()
    print(json.dumps(await flooding))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=400, help="calls in flight (max 2000)")
    parser.add_argument("--calls", type=int, default=60, help="the other client's calls")
    parser.add_argument("--facts", type=int, default=300)
    parser.add_argument("--flood-target", help=argparse.SUPPRESS)  # the flooding process
    args = parser.parse_args(argv)
    args.flood = max(1, min(args.flood, 2000))
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.flood_target:
        asyncio.run(flood_until_told(arguments.flood_target, arguments.flood))
    else:
        sys.exit(asyncio.run(main(arguments)))
