"""Where reads go: the primary, or a streaming replica (SATCHEL_DATABASE_READ_URLS).

Context calls, lists, GetTrace and the stats read from the replicas in turn; writes and traces
go to the primary. A read given a consistency token (a write's `consistency_token`: the
primary's WAL position once it committed) reads the first replica, in turn, that has replayed
that far, polling them for at most `max_wait` seconds, then the primary. A replica that fails
(connection lost, pool exhausted) is skipped for `DOWN_SECONDS`, and the statement that failed
runs again on the primary: reads are idempotent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import structlog
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from satchel.server.platform.storage.pool import autocommit
from satchel.server.platform.storage.replicas import has_replayed, write_position

log = structlog.get_logger(__name__)

T = TypeVar("T")

DOWN_SECONDS = 5.0  # a failed replica is left alone this long
POLL_SECONDS = 0.01  # between two looks at the replicas' replay positions


@dataclass
class ReadTarget:
    """A database reads can go to, with its two pools (see `create_pool`)."""

    name: str
    pool: AsyncConnectionPool
    planned: AsyncConnectionPool
    down_until: float = 0.0


class ReadRouter:
    """Chooses the database of each read and runs its statements there."""

    def __init__(
        self, primary: ReadTarget, replicas: list[ReadTarget], max_wait: float = 0.0
    ) -> None:
        self.primary = primary
        self.replicas = replicas
        self.max_wait = max_wait
        self._next = 0

    def _in_turn(self) -> list[ReadTarget]:
        """The replicas not left alone, starting with the next in turn."""
        now = time.monotonic()
        start, self._next = self._next, self._next + 1
        count = len(self.replicas)
        turn = [self.replicas[(start + i) % count] for i in range(count)]
        return [replica for replica in turn if replica.down_until <= now]

    def mark_down(self, replica: ReadTarget, error: BaseException) -> None:
        replica.down_until = time.monotonic() + DOWN_SECONDS
        log.warning("read_replica_down", replica=replica.name, error=str(error)[:200])

    async def choose(self, token: str = "") -> ReadTarget:
        """The target of a read: a replica (one that replayed `token`, when given), else the
        primary."""
        if not self.replicas:
            return self.primary
        deadline = time.monotonic() + (self.max_wait if token else 0.0)
        while True:
            for replica in self._in_turn():
                if not token:
                    return replica
                try:
                    async with autocommit(replica.pool) as conn:
                        if await has_replayed(conn, token):
                            return replica
                except (psycopg.OperationalError, PoolTimeout) as exc:
                    self.mark_down(replica, exc)
            if time.monotonic() >= deadline:
                return self.primary
            await asyncio.sleep(POLL_SECONDS)

    async def run(
        self,
        target: ReadTarget,
        statement: Callable[..., Awaitable[T]],
        *args: Any,
        planned: bool = False,
        **kwargs: Any,
    ) -> T:
        """`statement(conn, *args, **kwargs)` on a connection of `target` (its planned pool
        when `planned`); on the primary when the replica fails."""
        try:
            return await _on(target.planned if planned else target.pool, statement, args, kwargs)
        except psycopg.errors.QueryCanceled:
            raise  # a deadline or a cancellation: not the replica's fault
        except (psycopg.OperationalError, PoolTimeout) as exc:
            if target is self.primary:
                raise
            self.mark_down(target, exc)
        pool = self.primary.planned if planned else self.primary.pool
        return await _on(pool, statement, args, kwargs)

    async def read(
        self, statement: Callable[..., Awaitable[T]], *args: Any, token: str = "", **kwargs: Any
    ) -> T:
        """`statement(conn, *args, **kwargs)` where `choose(token)` says, in one go."""
        return await self.run(await self.choose(token), statement, *args, **kwargs)

    async def consistency_token(self) -> str:
        """The token of every write committed so far: the primary's WAL position."""
        return await self.run(self.primary, write_position)

    async def close(self) -> None:
        """Close the replicas' pools (the primary's belong to the runtime)."""
        for replica in self.replicas:
            for pool in (replica.pool, replica.planned):
                await pool.close()


async def _on(
    pool: AsyncConnectionPool,
    statement: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    conn: AsyncConnection
    async with autocommit(pool) as conn:
        return await statement(conn, *args, **kwargs)
