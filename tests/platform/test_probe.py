"""The database probe marks the database up only when the pool can serve a call again."""

from __future__ import annotations

from contextlib import asynccontextmanager

from psycopg_pool import PoolTimeout

from satchel.server.platform.probe import DatabaseProbe


class _RecoveringPool:
    """A pool whose connections come back after `outage` more requests (as psycopg_pool's do
    once its reconnection backoff ends), delegating to a real one afterwards."""

    def __init__(self, real, outage: int) -> None:
        self.real = real
        self.outage = outage

    async def check(self) -> None:
        await self.real.check()

    @asynccontextmanager
    async def connection(self, timeout: float):
        if self.outage > 0:
            self.outage -= 1
            raise PoolTimeout(f"couldn't get a connection after {timeout:.2f} sec")
        async with self.real.connection(timeout=timeout) as conn:
            yield conn


async def test_up_again_only_once_the_pool_serves(pg_dsn: str, server) -> None:
    changes: list[bool] = []

    async def on_change(up: bool) -> None:
        changes.append(up)

    pool = _RecoveringPool(server.runtime.value.pool, outage=2)
    probe = DatabaseProbe(pg_dsn, [pool], interval=0.1, timeout=1.0, on_change=on_change)
    probe.up = False  # as after an outage: PostgreSQL answers again, the pool does not yet
    assert await probe.probe_once() is False and probe.up is False
    assert await probe.probe_once() is False and probe.up is False
    assert changes == [], "health stays NOT_SERVING while a call would still fail"
    assert await probe.probe_once() is True and probe.up is True
    assert changes == [True]
    await probe._close()
