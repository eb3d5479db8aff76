"""Scope indexes (a large scope's own HNSW and GIN indexes), maintained by the server itself:
a first run as it starts serving, then every `interval` seconds (or once, `satchel
index-scopes`).

A run reads the sizes of the scopes that may qualify, decides which scopes get or lose an index
of their own (context/domain/scope_indexes.py), drops, then builds, largest first, each concurrently
(writes go on; a 100,000-fact scope among a million facts builds in ~80 s). It also rebuilds an
index whose earlier build died. Runs hold a session advisory lock: one server at a time, the
others skip. A scope whose build or drop fails is logged and retried at the next run, the
others go on; meanwhile a scope without its indexes is served by the global ones, as before.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import psycopg
import structlog

from satchel.server.context.domain.scope_indexes import ScopeKey, plan_indexes
from satchel.server.context.storage import scope_indexes as store
from satchel.server.platform.config import Settings

log = structlog.get_logger(__name__)


@dataclass
class Outcome:
    """What one run did: scopes built (with seconds each) and dropped; `locked` False when
    another server held the lock and this run did nothing."""

    locked: bool = True
    built: dict[ScopeKey, float] = field(default_factory=dict)
    dropped: list[ScopeKey] = field(default_factory=list)


class ScopeIndexes:
    """The scope index maintenance of one server."""

    def __init__(
        self,
        dsn: str,
        *,
        min_facts: int,
        max_indexes: int,
        interval: float,
        build_memory_mb: int,
        connect_timeout: int = 5,
    ) -> None:
        self._dsn = dsn
        self.min_facts = min_facts
        self.max_indexes = max_indexes
        self.interval = interval
        self.build_memory_mb = build_memory_mb
        self._connect_timeout = connect_timeout
        self.runs = 0  # completed runs, whether or not this server held the lock

    @classmethod
    def from_settings(cls, settings: Settings, dsn: str) -> ScopeIndexes:
        """The maintenance as the settings configure it (the cut: SATCHEL_EXACT_SCOPE_MAX)."""
        return cls(
            dsn,
            min_facts=settings.context.exact_scope_max,
            max_indexes=settings.scope_index_max,
            interval=settings.scope_index_maintenance_seconds,
            build_memory_mb=settings.scope_index_build_memory_mb,
            connect_timeout=settings.db_connect_timeout,
        )

    async def run_once(self) -> Outcome:
        """One maintenance run, on a connection of its own (builds outlast statement timeouts)."""
        async with await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, connect_timeout=self._connect_timeout
        ) as conn:
            await conn.execute("SET statement_timeout = 0")
            # Never queue behind a lock for long (a migration, a LOCK TABLE): a build that waits
            # more than this for a lock, or for an older transaction, fails and the next run
            # retries it.
            await conn.execute("SET lock_timeout = '5s'")
            await conn.execute(f"SET maintenance_work_mem = '{int(self.build_memory_mb)}MB'")
            if not await store.try_lock(conn):
                self.runs += 1
                return Outcome(locked=False)
            try:
                outcome = await self._maintain(conn)
            finally:
                await store.unlock(conn)
        self.runs += 1
        return outcome

    async def _maintain(self, conn: psycopg.AsyncConnection) -> Outcome:
        """Drop what no longer qualifies, then build (and rebuild) the rest, largest first."""
        sizes = await store.scope_sizes(conn, self.min_facts // 2)
        indexed = await store.registry(conn)
        plan = plan_indexes(
            sizes, set(indexed), min_facts=self.min_facts, max_indexes=self.max_indexes
        )
        outcome = Outcome()
        for scope in plan.drop:
            try:
                await store.drop(conn, scope)
            except psycopg.Error as exc:
                _log_failure("drop", scope, exc)
                continue
            outcome.dropped.append(scope)
            log.info("scope_index_dropped", project_id=scope[0], subject_id=scope[1])
        broken = [s for s, usable in indexed.items() if not usable and s not in plan.drop]
        for scope in sorted([*plan.build, *broken], key=lambda s: (-sizes.get(s, 0), s)):
            facts = sizes.get(scope, 0)
            try:
                seconds = await store.build(conn, scope, facts)
            except psycopg.Error as exc:
                _log_failure("build", scope, exc)
                continue
            outcome.built[scope] = seconds
            log.info(
                "scope_index_built",
                project_id=scope[0],
                subject_id=scope[1],
                facts=facts,
                seconds=round(seconds, 1),
            )
        return outcome

    async def try_once(self) -> None:
        """One run; a failure is logged (the next run retries)."""
        try:
            await self.run_once()
        except (psycopg.Error, OSError) as exc:
            log.warning("scope_index_maintenance_failed", error=str(exc), retry_s=self.interval)

    async def run(self) -> None:
        """Run now, then every `interval` seconds, until cancelled."""
        while True:
            await self.try_once()
            await asyncio.sleep(self.interval)


def _log_failure(action: str, scope: ScopeKey, exc: psycopg.Error) -> None:
    """A scope's build or drop failed: the next run retries it, the other scopes go on."""
    log.warning(
        f"scope_index_{action}_failed", project_id=scope[0], subject_id=scope[1], error=str(exc)
    )
