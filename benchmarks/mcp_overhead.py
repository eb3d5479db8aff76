"""What `satchel mcp` adds to the gRPC call it wraps, over stdio and over Streamable HTTP.

    .venv/bin/python benchmarks/mcp_overhead.py [--calls 200]

Starts `satchel serve` (embedded PostgreSQL in a temporary directory, server defaults), fills a
scope with 300 facts and 300 events and a project with the 349 tools of the Azure MCP catalogue
(benchmarks/data/catalogues/), then starts `satchel mcp` twice on that server: over stdio (the
SDK's stdio client launches it, as a desktop host does) and over HTTP (`--http`, the SDK's
Streamable HTTP client). Each round calls, in a rotating order, AssembleContext through the
asyncio SDK (gRPC) and `assemble_context` through each MCP transport, then SearchTools and
`resolve_talents` likewise; every call has a query or task of its own. The first 20 rounds are
warm-up. Prints p50/p90/p99 per path and each MCP p50 as a ratio to the gRPC p50 measured in the
same rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from catalogues import load_catalogue  # noqa: E402
from talent_calibration import _wait_for_port  # noqa: E402

SATCHEL = str(Path(sys.executable).parent / "satchel")
WARM_UP = 20
PROJECT = "mcp-overhead"
SUBJECT = "bench"
THINGS = ["passport", "spare key", "laptop charger", "umbrella", "camera tripod", "tax return"]
THINGS += ["winter coat", "bicycle pump", "guitar tuner", "first-aid kit", "hiking boots"]
PLACES = ["attic", "garage", "desk drawer", "hallway closet", "kitchen shelf", "car trunk"]
PLACES += ["basement", "office locker", "wardrobe", "safe deposit box", "bookcase"]


def facts_and_queries(count: int, seed: int = 36) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    facts, queries = [], []
    for index in range(count):
        thing, place = rng.choice(THINGS), rng.choice(PLACES)
        facts.append(f"The {thing} number {index} is kept in the {place}.")
        queries.append(f"Where is the {thing} number {index}?")
    rng.shuffle(queries)
    return facts, queries


def percentiles(values: list[float]) -> tuple[float, float, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return float(p50), float(p90), float(p99)


async def seed(address: str) -> list[str]:
    """The scope's facts and events, the catalogue's tools; returns the catalogue's tasks."""
    from satchel.client import AsyncSatchelClient, event_request, fact_request
    from satchel.v1 import talent_pb2

    facts, _ = facts_and_queries(300)
    async with AsyncSatchelClient(address, timeout=120) as client:
        await client.batch_assert_facts(
            fact_request(PROJECT, SUBJECT, "location", text, statement=text) for text in facts
        )
        await client.batch_record_events(
            event_request(PROJECT, SUBJECT, "note", {"text": f"Reminder: {text}"}) for text in facts
        )
        catalogue = load_catalogue("azure_mcp")
        for tool in catalogue.tools:
            talent = talent_pb2.Talent(
                id=f"azure.{tool.id}"[:200],
                name=tool.name[:200],
                summary=tool.description,
                input_schema=json.dumps(tool.parameters) if tool.parameters else "",
            )
            await client.upsert_talent(talent)
            await client.set_talent_activation(PROJECT, talent.id)
    return [task.query for task in catalogue.tasks]


async def measure(address: str, calls: int) -> None:
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    from satchel.client import AsyncSatchelClient

    tasks = await seed(address)
    random.Random(36).shuffle(tasks)
    _, queries = facts_and_queries(300)
    queries = (queries * (3 * (calls + WARM_UP) // len(queries) + 1))[: 3 * (calls + WARM_UP)]
    scope = ["--address", address, "--project", PROJECT, "--subject", SUBJECT]
    port = _free_port()
    http = subprocess.Popen(
        [SATCHEL, "mcp", "--http", f"127.0.0.1:{port}", *scope], stderr=subprocess.DEVNULL
    )
    try:
        await _wait_for_tcp(port)
        stdio = StdioServerParameters(command=SATCHEL, args=["mcp", *scope])
        async with (
            AsyncSatchelClient(address) as grpc_client,
            Client(stdio) as stdio_client,
            Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp")) as http_client,
        ):
            paths: dict[str, Callable[[str, str], Awaitable[object]]] = {
                "gRPC (SDK)": lambda rpc, text: (
                    grpc_client.assemble_context(PROJECT, SUBJECT, text)
                    if rpc == "context"
                    else grpc_client.search_tools(PROJECT, text)
                ),
                "MCP stdio": lambda rpc, text: _tool(stdio_client, rpc, text),
                "MCP HTTP": lambda rpc, text: _tool(http_client, rpc, text),
            }
            timings = {(rpc, path): [] for rpc in ("context", "tools") for path in paths}
            texts = {"context": iter(queries), "tools": iter(tasks * 10)}
            order = list(paths)
            for round_index in range(calls + WARM_UP):
                order = order[1:] + order[:1]
                for rpc in ("context", "tools"):
                    for path in order:
                        started = time.perf_counter()
                        await paths[path](rpc, next(texts[rpc]))
                        elapsed = (time.perf_counter() - started) * 1000
                        if round_index >= WARM_UP:
                            timings[rpc, path].append(elapsed)
    finally:
        http.terminate()
        http.wait(timeout=30)
    print(f"\n{calls} calls per path and RPC (after {WARM_UP} warm-up rounds)\n")
    print("| call | path | p50 ms | p90 ms | p99 ms | p50 / gRPC p50 |")
    print("|---|---|---|---|---|---|")
    for rpc, name in (("context", "AssembleContext"), ("tools", "SearchTools")):
        base = percentiles(timings[rpc, "gRPC (SDK)"])[0]
        for path in paths:
            p50, p90, p99 = percentiles(timings[rpc, path])
            print(f"| {name} | {path} | {p50:.1f} | {p90:.1f} | {p99:.1f} | {p50 / base:.2f}x |")


async def _tool(client: object, rpc: str, text: str) -> object:
    from mcp import Client

    assert isinstance(client, Client)
    if rpc == "context":
        result = await client.call_tool("assemble_context", {"query": text})
    else:
        result = await client.call_tool("resolve_talents", {"task": text})
    if result.is_error:
        raise SystemExit(f"{rpc}: {result.content}")
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _wait_for_tcp(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit("satchel mcp --http did not listen")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="satchel-mcp-overhead-") as tmp:
        log_path = Path(tmp) / "serve.log"
        env = {
            **os.environ,
            "SATCHEL_DATA_DIR": str(Path(tmp) / "data"),
            "SATCHEL_LISTEN": "127.0.0.1:0",
            "SATCHEL_LOG_LEVEL": "info",
        }
        with log_path.open("w") as log_file:
            server = subprocess.Popen([SATCHEL, "serve"], env=env, stdout=log_file, stderr=log_file)
        try:
            port = _wait_for_port(log_path, server)
            asyncio.run(measure(f"127.0.0.1:{port}", args.calls))
        finally:
            server.terminate()
            server.wait(timeout=60)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nLoad average after the run: {load} ({os.cpu_count()} CPUs).")


if __name__ == "__main__":
    main()
