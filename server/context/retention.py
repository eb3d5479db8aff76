"""Trace retention, run by the server itself: before it serves, then every `interval` seconds.

Each run makes the coming days' trace partitions and drops the days older than the retention
(context/storage/traces.py); replicas share the work through the function's advisory lock, so any
number of them may run this. A failed run (the database away) is logged and retried at the
next interval: calls keep finding a partition for days (`DAYS_AHEAD`), and a trace whose day
has none makes it (context/storage/, `save_trace`).
"""

from __future__ import annotations

import asyncio

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from satchel.server.context.storage.traces import Maintenance, maintain_traces
from satchel.server.platform.storage.pool import autocommit

log = structlog.get_logger(__name__)


class TraceRetention:
    """The maintenance loop of one replica."""

    def __init__(self, pool: AsyncConnectionPool, *, retention_days: int, interval: float) -> None:
        self._pool = pool
        self.retention_days = retention_days
        self.interval = interval
        self.runs = 0  # completed runs, whether or not this replica held the lock

    async def run_once(self) -> Maintenance:
        """One maintenance run."""
        async with autocommit(self._pool) as conn:
            done = await maintain_traces(conn, self.retention_days)
        self.runs += 1
        if done.created or done.dropped:
            log.info(
                "trace_partitions_maintained",
                days_created=done.created,
                days_dropped=done.dropped,
                retention_days=self.retention_days,
            )
        return done

    async def try_once(self) -> None:
        """One maintenance run; a failure is logged (the next run retries)."""
        try:
            await self.run_once()
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            log.warning("trace_maintenance_failed", error=str(exc), retry_s=self.interval)

    async def run(self) -> None:
        """Run every `interval` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            await self.try_once()
