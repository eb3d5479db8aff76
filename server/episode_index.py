"""In-memory episode indexes: a server's copy of the events of the scopes it reads most.

Hybrid episode ranking scores every event of a scope (cosine and BM25) and lifts each by its
neighbours; done by the database it is the costliest statement of a context call. A scope that
is read without changing is worth holding in memory: the second call that finds a scope at the
same version (migration 0018: every write of its events gives it a new one) has it loaded in
the background, and the calls that find it at that version rank its episodes in memory
(`domain.episode_ranking`, the statement's ranking step for step). A write moves the version:
the calls after it use the statement until the scope is read twice at its new version again, so
a scope written between every read (an agent's own loop) is never loaded for nothing. A scope
at version 0 (not written since the migration, or deleted) is never held.

Bounded: a scope with more than `max_events` events is not held, and the least recently used
scopes are dropped beyond `max_bytes`. One load runs at a time, from the primary.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from satchel.server.domain.episode_ranking import ScopeEvents
from satchel.server.storage.context import load_scope_events
from satchel.server.storage.pool import autocommit

log = logging.getLogger(__name__)

ScopeKey = tuple[str, str]  # (project_id, subject_id)
# A scope not written since migration 0018, or deleted (its version row goes with it): never
# held, as two different states of the scope share it.
NO_VERSION = 0
MAX_SIGHTINGS = 65_536  # scopes whose last version read is remembered


@dataclass
class EpisodeIndexStats:
    """What the index did since the server started."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    too_large: int = 0
    evictions: int = 0


class EpisodeIndex:
    """The scopes' events held in memory, by scope, each at the version it was loaded."""

    def __init__(self, pool: AsyncConnectionPool, max_bytes: int, max_events: int) -> None:
        self._pool = pool
        self.max_bytes = max_bytes
        self.max_events = max_events
        self._scopes: OrderedDict[ScopeKey, ScopeEvents] = OrderedDict()
        self._sightings: OrderedDict[ScopeKey, int] = OrderedDict()
        self._too_large: dict[ScopeKey, int] = {}
        self._queue: list[ScopeKey] = []
        self._loader: asyncio.Task[None] | None = None
        self.bytes = 0
        self.stats = EpisodeIndexStats()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_events > 0

    def __len__(self) -> int:
        return len(self._scopes)

    def lookup(self, project_id: str, subject_id: str, version: int) -> ScopeEvents | None:
        """The scope's events if held at `version`; otherwise None, and the scope is loaded
        when this is the second call in a row to find it at this version."""
        if not self.enabled or version == NO_VERSION:
            return None
        key = (project_id, subject_id)
        held = self._scopes.get(key)
        if held is not None and held.version == version:
            self._scopes.move_to_end(key)
            self.stats.hits += 1
            return held
        self.stats.misses += 1
        if self._sightings.get(key) == version and self._too_large.get(key) != version:
            self._enqueue(key)
        self._sightings[key] = version
        self._sightings.move_to_end(key)
        if len(self._sightings) > MAX_SIGHTINGS:
            self._sightings.popitem(last=False)
        return None

    def _enqueue(self, key: ScopeKey) -> None:
        if key not in self._queue:
            self._queue.append(key)
        if self._loader is None or self._loader.done():
            self._loader = asyncio.create_task(self._load_queued(), name="episode-index-load")

    async def _load_queued(self) -> None:
        while self._queue:
            key = self._queue.pop(0)
            try:
                async with autocommit(self._pool) as conn:
                    events = await load_scope_events(conn, *key, self.max_events)
            except Exception:  # the calls keep using the statement
                log.exception("episode index: loading %s failed", key)
                continue
            self.stats.loads += 1
            if events is None:
                self.stats.too_large += 1
                self._too_large[key] = self._sightings.get(key, -1)
                continue
            self.put(key, events)

    def put(self, key: ScopeKey, events: ScopeEvents) -> None:
        """Hold a scope's events, dropping the least recently used scopes beyond the budget."""
        previous = self._scopes.pop(key, None)
        if previous is not None:
            self.bytes -= previous.nbytes
        if events.nbytes > self.max_bytes:
            return
        self._scopes[key] = events
        self.bytes += events.nbytes
        while self.bytes > self.max_bytes:
            _, dropped = self._scopes.popitem(last=False)
            self.bytes -= dropped.nbytes
            self.stats.evictions += 1

    async def wait_loaded(self) -> None:
        """Wait for the loads queued so far (tests, benchmarks)."""
        while self._loader is not None and not self._loader.done():
            await asyncio.shield(self._loader)

    async def close(self) -> None:
        """Stop loading."""
        self._queue.clear()
        if self._loader is not None:
            self._loader.cancel()
            await asyncio.gather(self._loader, return_exceptions=True)
