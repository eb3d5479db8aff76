"""The scope cache cannot drift, run long: the property of
tests/context/test_cache_congruence.py until `--writes` writes were acknowledged.

    .venv/bin/python benchmarks/cache_congruence.py [--writes 2000] [--ops 24] [--seed N]

Starts an embedded PostgreSQL in a scratch directory and three servers on it in this process:
two that hold scopes in memory (default SATCHEL_SCOPE_CACHE_MB) and one without the cache.
Hypothesis draws scenarios of up to `--ops` operations (every memory write RPC, DeleteEvent,
DeleteSubject and DeleteProject among them, on two subjects of a fresh project each) and runs
them: after every acknowledged write the written scopes are read on the three servers, before
and after the cached servers hold them in memory, and the packets must be identical; no
deleted text may be served or stay in a cache's memory (tests/helpers/cache_congruence.py).
Prints the writes acknowledged, the reads made, how many reads were served from memory, and every
mismatch (exit 1 when there is one).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, seed
from hypothesis import settings as hypothesis_settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import grpc
from helpers.cache_congruence import Scenario, Server, Tally, operations

from satchel.server.platform.app import SatchelServer
from satchel.server.platform.config import Settings
from satchel.server.platform.logs import configure_logging
from satchel.server.platform.storage.embedded import start_pgserver
from satchel.server.platform.storage.migrations import apply_migrations


async def run(args: argparse.Namespace, scratch: Path) -> Tally:
    pg = await asyncio.to_thread(start_pgserver, scratch / "pg", cleanup_mode="delete")
    servers: list[SatchelServer] = []
    channels: list[grpc.aio.Channel] = []
    try:
        dsn = pg.get_uri()
        await asyncio.to_thread(apply_migrations, dsn)
        base = replace(
            Settings.from_env({}),
            database_url=dsn,
            data_dir=scratch,
            listen="127.0.0.1:0",
        )
        plain = replace(base, context=replace(base.context, scope_cache_mb=0))
        for settings in (base, base, plain):
            server = SatchelServer(settings)
            await server.start()
            servers.append(server)
            channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{server.port}"))
        scenario = Scenario(
            [
                Server("cache A (takes the writes)", channels[0], servers[0].runtime().scope_cache),
                Server("cache B", channels[1], servers[1].runtime().scope_cache),
                Server("no cache", channels[2], None),
            ]
        )
        loop = asyncio.get_running_loop()
        total = Tally()
        started = time.monotonic()

        def batch(batch_seed: int) -> None:
            """Up to 20 scenarios drawn from `batch_seed`, until enough writes are done."""

            @hypothesis_settings(
                max_examples=20,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @seed(batch_seed)
            @given(ops=operations(max_size=args.ops))
            def scenarios(ops: list) -> None:
                if total.writes >= args.writes:
                    return
                tally = asyncio.run_coroutine_threadsafe(scenario.run(ops), loop).result(600)
                total.add(tally)
                print(
                    f"\r{total.writes} writes, {total.reads} reads, "
                    f"{total.served_from_memory} from memory, "
                    f"{len(total.mismatches)} mismatches, {time.monotonic() - started:.0f} s",
                    end="",
                    flush=True,
                )
                assert not tally.mismatches, "\n".join(tally.mismatches[:5])

            scenarios()

        try:
            for batch_seed in itertools.count(args.seed):
                if total.writes >= args.writes:
                    break
                await asyncio.to_thread(batch, batch_seed)
        except AssertionError as failure:
            print(f"\nsmallest failing scenario:\n{failure}")
        print()
        return total
    finally:
        for channel in channels:
            await channel.close()
        for server in servers:
            await server.stop()
        await asyncio.to_thread(pg.cleanup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000, help="acknowledged writes to reach")
    parser.add_argument("--ops", type=int, default=24, help="operations a scenario at most")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="hypothesis seed")
    args = parser.parse_args()
    print(f"seed {args.seed}")
    configure_logging("error", "console")
    with tempfile.TemporaryDirectory(prefix="satchel-congruence-", dir="/var/tmp") as scratch:
        total = asyncio.run(run(args, Path(scratch)))
    print(
        f"writes acknowledged {total.writes} (refused as expected: {total.refused}), reads "
        f"{total.reads} ({total.served_from_memory} served from memory), "
        f"stale or hidden reads {len(total.mismatches)}"
    )
    for mismatch in total.mismatches[:20]:
        print(mismatch)
    return 1 if total.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
