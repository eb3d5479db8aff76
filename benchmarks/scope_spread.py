"""Whole calls spread over many scopes: round-robin and Zipf, scope cache on and off.

Used by `benchmarks/context.py --scopes` (after its per-scope phases) or alone on a database
such a run loaded:

    .venv/bin/python benchmarks/scope_spread.py DSN [--calls 4000] [--cache-mb 256 0]
        [--spread round-robin Zipf] [--also DSN2 ...]

A cache size may name how the copies hold vectors: `256:float16` (SATCHEL_SCOPE_CACHE_VECTORS).

Per spread it starts one `satchel serve` per cache size on the database (subprocesses: their
RSS is the server's), all at once, then sends each AssembleContext call to every server in
turn, so that the sizes compared share the machine's noise. The calls go to the scopes of
project `bench-scale` scored exactly (at most SATCHEL_EXACT_SCOPE_MAX facts: every scope but
the few largest), the query's embedding timed alone in this process before each. Printed per
size: p50 / p95 of both, their ratio, the scope cache's hit rate, loads, evictions and copies
turned away over the measured calls (its metrics), the server's RSS, and p50 / p95 of the
calls to the scopes of about the median size (half to twice it), issue 39's targets, among
the calls to every scope. The first half of the calls warms the servers and their caches up
(a scope is loaded on its second read); the second half is measured.

- round-robin: every scope in turn, the same order each round;
- Zipf: scope of rank r drawn with probability ∝ 1 / r^1.1 (ranks shuffled over the scopes).

`SATCHEL_SPREAD_SERVER`, a command line, starts another build of the server instead (a paired
run against an earlier commit); `--also` serves copies of the database beside it, with the
same cache sizes (another physical layout of the same rows, say).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from satchel.server.embedding.port import Embedder

PROJECT = "bench-scale"
ZIPF_S = 1.1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def exact_scopes(dsn: str, exact_scope_max: int) -> dict[str, int]:
    """The project's scopes scored exactly and their active facts, smallest first."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT subject_id, count(*) FROM facts WHERE project_id = %s AND status = 'active'"
            " GROUP BY subject_id HAVING count(*) <= %s ORDER BY count(*), subject_id",
            (PROJECT, exact_scope_max),
        ).fetchall()
    return dict(rows)


def median_sized(sizes: dict[str, int]) -> set[str]:
    """The scopes of about the median size (half to twice it): the calls issue 39's targets
    are about, measured among the calls to every scope."""
    median = statistics.median(sizes.values())
    return {subject for subject, size in sizes.items() if median / 2 <= size <= median * 2}


def order(spread: str, scopes: list[str], calls: int, seed: int) -> Iterator[str]:
    """The scopes of `calls` calls."""
    if spread == "round-robin":
        for i in range(calls):
            yield scopes[i % len(scopes)]
        return
    rng = np.random.default_rng(seed)
    ranked = list(scopes)
    random.Random(seed).shuffle(ranked)
    weights = 1 / np.arange(1, len(ranked) + 1) ** ZIPF_S
    for i in rng.choice(len(ranked), size=calls, p=weights / weights.sum()):
        yield ranked[i]


COUNTERS = ("hits", "misses", "loads", "evictions", "rejected")


def _cache_counters(metrics_port: int) -> dict[str, float]:
    """The scope cache's counters (both kinds summed) from the server's metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    totals = {}
    for name in COUNTERS:
        pattern = rf"^satchel_scope_cache_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$"
        totals[name] = sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))
    return totals


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


async def _serving(channel: grpc.aio.Channel, timeout: float = 120) -> None:
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
            raise SystemExit("the server did not become SERVING")
        await asyncio.sleep(0.2)


def _start_server(dsn: str, data_dir: Path, cache: str) -> tuple[subprocess.Popen[bytes], str, int]:
    """`satchel serve` on the database with this cache (`MB` or `MB:vector type`; its own
    data directory): the process, its gRPC target, its metrics port."""
    target, metrics_port = f"127.0.0.1:{_free_port()}", _free_port()
    cache_mb, _, vectors = cache.partition(":")
    env = {
        **os.environ,
        "SATCHEL_DATABASE_URL": dsn,
        "SATCHEL_DATA_DIR": tempfile.mkdtemp(prefix=f"cache-{cache_mb}-", dir=data_dir),
        "SATCHEL_LISTEN": target,
        "SATCHEL_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        "SATCHEL_SCOPE_CACHE_MB": cache_mb,
        "SATCHEL_SCOPE_CACHE_VECTORS": vectors or "float32",
        "SATCHEL_LOG_LEVEL": "error",
        "GRPC_VERBOSITY": "ERROR",
    }
    command = shlex.split(os.environ.get("SATCHEL_SPREAD_SERVER", "")) or [
        sys.executable,
        "-m",
        "satchel.server.cli",
        "serve",
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL), target, metrics_port


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()


async def measure_cases(
    cases: list[tuple[str, str]],
    data_dir: Path,
    embedder: Embedder,
    texts: list[str],
    subjects: list[str],
    median_scopes: set[str],
) -> list[dict[str, float]]:
    """One server per case (a database and a cache size), all up at once; each call sent to
    every server in turn (which goes first alternates), so that they share the machine's
    noise. The first half of the calls warms up; figures of the second half, per case, for
    every call and for the calls to `median_scopes` (`median_p50`, `median_p95`)."""
    from satchel.v1 import context_pb2, context_pb2_grpc

    servers = [_start_server(dsn, data_dir, cache) for dsn, cache in cases]
    channels = [grpc.aio.insecure_channel(target) for _, target, _ in servers]
    try:
        for channel in channels:
            await _serving(channel)
        stubs = [context_pb2_grpc.ContextServiceStub(channel) for channel in channels]
        warm = len(subjects) // 2
        call_ms: list[list[float]] = [[] for _ in servers]
        median_ms: list[list[float]] = [[] for _ in servers]
        embed_ms: list[float] = []
        before = [dict.fromkeys(COUNTERS, 0.0) for _ in servers]
        for i, (subject, text) in enumerate(zip(subjects, texts, strict=False)):
            if i == warm:
                before = [_cache_counters(port) for _, _, port in servers]
            started = time.perf_counter()
            embedder.embed([embedder.query_prefix + text])
            if i >= warm:
                embed_ms.append((time.perf_counter() - started) * 1000)
            request = context_pb2.AssembleContextRequest(
                project_id=PROJECT, subject_id=subject, query=text
            )
            turn = list(range(len(stubs)))
            for k in turn[i % len(turn) :] + turn[: i % len(turn)]:
                sent = time.perf_counter()
                await stubs[k].AssembleContext(request)
                if i >= warm:
                    call_ms[k].append((time.perf_counter() - sent) * 1000)
                    if subject in median_scopes:
                        median_ms[k].append(call_ms[k][-1])
        after = [_cache_counters(port) for _, _, port in servers]
        rss = [_rss_mb(server.pid) for server, _, _ in servers]
    finally:
        for channel in channels:
            await channel.close()
        for server, _, _ in servers:
            _stop(server)
    embed = statistics.median(embed_ms)
    figures = []
    for k in range(len(servers)):
        counted = {name: after[k][name] - before[k][name] for name in COUNTERS}
        looked_up = counted["hits"] + counted["misses"]
        figures.append(
            {
                "p50": statistics.median(call_ms[k]),
                "p95": statistics.quantiles(call_ms[k], n=20)[-1],
                "median_p50": statistics.median(median_ms[k]),
                "median_p95": statistics.quantiles(median_ms[k], n=20)[-1],
                "embed": embed,
                "hit_rate": counted["hits"] / looked_up if looked_up else float("nan"),
                "rss": rss[k],
                **{name: counted[name] for name in ("loads", "evictions", "rejected")},
            }
        )
    return figures


SPREADS = ("round-robin", "Zipf")


def run_spread(
    dsn: str,
    texts: list[str],
    calls: int,
    cache_sizes: list[str],
    exact_scope_max: int = 10_000,
    spreads: tuple[str, ...] = SPREADS,
    other_dsns: tuple[str, ...] = (),
) -> None:
    """Each spread (round-robin, Zipf) over the cache sizes side by side, on `dsn` and on
    each of `other_dsns` (copies of it: another layout, say) with the same sizes; prints a
    Markdown table."""
    from satchel.server.embedding import load_embedder
    from satchel.server.platform.config import Settings

    data_dir = Path(tempfile.mkdtemp(prefix="satchel-spread-", dir="/var/tmp"))
    embedder = load_embedder(Settings.from_env())
    sizes = exact_scopes(dsn, exact_scope_max)
    scopes, median_scopes = list(sizes), median_sized(sizes)
    rng = random.Random(3)
    queries = [rng.choice(texts) for _ in range(calls)]
    databases = (dsn, *other_dsns)
    cases = [(db, cache) for db in databases for cache in cache_sizes]
    print(
        f"\n=== {calls} calls spread over the {len(scopes)} scopes scored exactly"
        f" (the first {calls // 2} warm up; cases served side by side); 'median-size': the"
        f" calls among them to the {len(median_scopes)} scopes of"
        f" {min(sizes[s] for s in median_scopes)}-{max(sizes[s] for s in median_scopes)} facts"
        f" (half to twice the median) ==="
    )
    database = "| database " if other_dsns else ""
    print(f"| spread {database}| cache MB | p50 ms | p95 ms | embedding p50 ms |", end="")
    print(" p50 / embedding | p95 / p50 | hit rate | loads / evictions / turned away |", end="")
    print(" server RSS MB | median-size p50 / p95 ms | their p50 / embedding | their p95 / p50 |")
    print("|---" * (13 + bool(other_dsns)) + "|")
    for spread in spreads:
        subjects = list(order(spread, scopes, calls, seed=11))
        figures = asyncio.run(
            measure_cases(cases, data_dir, embedder, queries, subjects, median_scopes)
        )
        for (db, cache), f in zip(cases, figures, strict=True):
            name = f"| {urllib.parse.urlsplit(db).path.lstrip('/')} " if other_dsns else ""
            off = cache.partition(":")[0] == "0"
            hit = "-" if off else f"{100 * f['hit_rate']:.0f} %"
            churn = "-" if off else f"{f['loads']:.0f} / {f['evictions']:.0f} / {f['rejected']:.0f}"
            print(
                f"| {spread} {name}| {cache} | {f['p50']:.1f} | {f['p95']:.1f} |"
                f" {f['embed']:.1f} | {f['p50'] / f['embed']:.2f}x | {f['p95'] / f['p50']:.2f} |"
                f" {hit} | {churn} | {f['rss']:.0f} |"
                f" {f['median_p50']:.1f} / {f['median_p95']:.1f} |"
                f" {f['median_p50'] / f['embed']:.2f}x | {f['median_p95'] / f['median_p50']:.2f} |",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn", help="a database loaded by benchmarks/context.py --scopes")
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--cache-mb", nargs="+", default=["256", "0"], help="MB[:float16]")
    parser.add_argument("--spread", nargs="+", choices=SPREADS, default=list(SPREADS))
    parser.add_argument(
        "--also", nargs="+", default=[], metavar="DSN", help="copies of the database, side by side"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from context import questions

    texts = questions(200, random.Random(7))
    run_spread(
        args.dsn,
        texts,
        args.calls,
        args.cache_mb,
        spreads=tuple(args.spread),
        other_dsns=tuple(args.also),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
