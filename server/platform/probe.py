"""The database probe: notices PostgreSQL going away and coming back.

Every `interval` seconds it runs `SELECT 1` on a connection of its own (not a pooled one, so a
busy pool never looks like a dead database). On the first failure the database is marked down:
health turns NOT_SERVING and the interceptor refuses satchel.v1 calls at once with UNAVAILABLE
(`DATABASE_UNAVAILABLE`) instead of letting them wait for a connection. When the probe succeeds
again, every pool's connections are checked (broken ones are replaced) and a pooled connection
of each must answer too, then the database is marked up and health turns SERVING: after an
outage a pool may still be waiting out its reconnection backoff, and SERVING means a call would
succeed now, not in 18 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

log = structlog.get_logger(__name__)


class DatabaseProbe:
    """Tracks whether the database answers; `up` is read by the interceptors."""

    def __init__(
        self,
        dsn: str,
        pools: Sequence[AsyncConnectionPool],
        *,
        interval: float,
        timeout: float,
        on_change: Callable[[bool], Awaitable[None]],
    ) -> None:
        self.up = True
        self._dsn = dsn
        self._pools = list(pools)
        self._interval = interval
        self._timeout = timeout
        self._on_change = on_change
        self._conn: psycopg.AsyncConnection | None = None

    async def run(self) -> None:
        """Probe until cancelled."""
        try:
            while True:
                await asyncio.sleep(self._interval)
                await self.probe_once()
        finally:
            await self._close()

    async def probe_once(self) -> bool:
        """One probe; on a change of state, heal the pools (when back) and notify."""
        ok = await self._check()
        if ok and not self.up:
            try:
                for pool in self._pools:
                    await asyncio.wait_for(pool.check(), self._timeout * 4)
                    async with pool.connection(timeout=self._timeout) as conn:
                        await conn.execute("SELECT 1")
            except Exception as exc:  # a pool is not back yet: try again next time
                log.warning("database_pool_check_failed", error=str(exc) or type(exc).__name__)
                return False
        if ok != self.up:
            self.up = ok
            log.warning("database_available" if ok else "database_unavailable")
            await self._on_change(ok)
        return ok

    async def _check(self) -> bool:
        try:
            async with asyncio.timeout(self._timeout):
                if self._conn is None or self._conn.closed:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self._dsn, autocommit=True, connect_timeout=max(1, int(self._timeout))
                    )
                await self._conn.execute("SELECT 1")
            return True
        except (TimeoutError, psycopg.Error, OSError) as exc:
            if self.up:
                log.warning("database_probe_failed", error=str(exc) or type(exc).__name__)
            await self._close()
            return False

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a broken connection is closed anyway
                await asyncio.wait_for(conn.close(), 1)
