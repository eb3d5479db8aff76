"""In-memory copies of the scopes a server reads most: their events and their facts.

Hybrid ranking scores every event and every fact of a scope (cosine and BM25); done by the
database, these are the costliest statements of a context call. A scope that is read without
changing is worth holding in memory: the second call that finds a scope's events (or facts) at
the same version (migration 0018: every write gives them a new one) has them loaded in the
background, and the calls that find them at that version rank them in memory
(`domain.episode_ranking`, `domain.fact_ranking`: the statements' ranking step for step). A
write moves the version: the calls after it use the statements until the scope is read twice at
its new version, so a scope written between every read (an agent's own loop) is never loaded
for nothing. A scope at version 0 (not written since the migration, or deleted) is never held.

Vectors are held as stored (float32), or as float16 (`vector_type`): half their memory, at
cosines a few 1e-4 off the statements'.

Bounded: a scope with more than `max_rows` events (or facts) is not held (nor are the facts of
a scope above SATCHEL_EXACT_SCOPE_MAX, which are not ranked exactly), and the copies stay within
`max_bytes`. Admission (TinyLFU): a frequency sketch counts every scope's recent reads, and
when the cache is full a copy is loaded, and kept, only if the copies it would push out (the
least recently read first) were read less often lately (by a margin: see ADMISSION_MARGIN),
and the loader asks again before it reads; otherwise the calls go on with the
statements and it is asked again at a later read. Without it, a server reading more scopes in
turn than it can hold would load every copy and drop it before its next read, and be slower
than with no cache at all (benchmarks/context.md). One load runs at a time, from the primary,
and the loader rests between loads so that loading takes at most `load_share` of its time
(a load reads and builds a copy beside the calls, on the same cores: a burst of loads, as when
many scopes are read for the first time, would otherwise slow the calls it is meant to speed
up); a version is loaded at most once (a copy too large, a failed load or a lagging replica's
version is not asked for again), unless its copy was dropped or turned away for room.

Erasure: a copy found at an older version is dropped at once, and a deletion (DeleteEvent,
DeleteSubject, DeleteProject, announced to every server at commit) drops the scope's copies
and discards a load of it in flight, so deleted text does not stay in memory until eviction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from psycopg_pool import AsyncConnectionPool

from satchel.server.context.domain.episode_ranking import ScopeEvents
from satchel.server.context.domain.fact_ranking import ScopeFacts
from satchel.server.context.domain.frequency import FrequencySketch
from satchel.server.context.storage.scopes import load_scope_events, load_scope_facts
from satchel.server.platform.storage.pool import autocommit

log = logging.getLogger(__name__)

EVENTS, FACTS = "events", "facts"
ScopeKey = tuple[str, str, str]  # (EVENTS or FACTS, project_id, subject_id)
Held = ScopeEvents | ScopeFacts
_LOADERS = {EVENTS: load_scope_events, FACTS: load_scope_facts}
# A scope not written since migration 0018, or deleted (its version row goes with it): never
# held, as two different states of the scope share it.
NO_VERSION = 0
MAX_SIGHTINGS = 65_536  # scopes whose last version read is remembered
# A scope pushes a copy out only when read more than this many times beyond it lately. Under a
# round-robin, the copy to go first (the least recently read) is the next one due, so the scope
# just read is always one read ahead of it: without a margin, each would push the other out in
# turn, a load and an eviction at every read of a scope not held.
ADMISSION_MARGIN = 1


@dataclass
class _Sighting:
    """The version a scope's events (or facts) were last found at, and whether a load of that
    version was asked for."""

    version: int
    load_asked: bool = False


@dataclass
class ScopeCacheStats:
    """What the cache did with one kind (events or facts) since the server started."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    too_large: int = 0
    evictions: int = 0
    rejected: int = 0  # not loaded, or not kept: what it would push out is read about as often


class ScopeCache:
    """Scopes' events and facts held in memory, each at the version it was loaded."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        max_bytes: int,
        max_rows: int,
        load_share: float = 1.0,
        vector_type: str = "float32",
    ) -> None:
        self._pool = pool
        self.max_bytes = max_bytes
        self.max_rows = max_rows
        self.load_share = load_share
        self.vector_type = np.dtype(vector_type)
        self._scopes: OrderedDict[ScopeKey, Held] = OrderedDict()
        self._sightings: OrderedDict[ScopeKey, _Sighting] = OrderedDict()
        self._queue: OrderedDict[ScopeKey, None] = OrderedDict()  # an ordered set
        self._loader: asyncio.Task[None] | None = None
        self._loading: ScopeKey | None = None
        self._loading_erased = False  # the scope loading now was erased meanwhile
        self.bytes = 0
        self.stats = {EVENTS: ScopeCacheStats(), FACTS: ScopeCacheStats()}
        self.sketch = FrequencySketch()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_rows > 0

    def __len__(self) -> int:
        return len(self._scopes)

    def events(self, project_id: str, subject_id: str, version: int) -> ScopeEvents | None:
        """The scope's events if held at `version` (see `lookup`)."""
        held = self.lookup((EVENTS, project_id, subject_id), version)
        assert held is None or isinstance(held, ScopeEvents)
        return held

    def facts(self, project_id: str, subject_id: str, version: int) -> ScopeFacts | None:
        """The scope's active facts if held at `version` (see `lookup`)."""
        held = self.lookup((FACTS, project_id, subject_id), version)
        assert held is None or isinstance(held, ScopeFacts)
        return held

    def lookup(self, key: ScopeKey, version: int) -> Held | None:
        """What `key` names if held at `version`; otherwise None, and it is loaded when this
        is the second call in a row to find it at this version."""
        if not self.enabled or version == NO_VERSION:
            return None
        self.sketch.add(key)
        stats = self.stats[key[0]]
        held = self._scopes.get(key)
        if held is not None and held.version == version:
            self._scopes.move_to_end(key)
            stats.hits += 1
            return held
        stats.misses += 1
        if held is not None:  # an older version: never served again
            self._drop(key)
        seen = self._sightings.get(key)
        if seen is None or seen.version != version:
            self._sightings[key] = _Sighting(version)
            if len(self._sightings) > MAX_SIGHTINGS:
                self._sightings.popitem(last=False)
        elif not seen.load_asked:  # once a version: not again when too large or failing
            if self._admits(key):
                seen.load_asked = True
                self._enqueue(key)
            else:
                stats.rejected += 1
        self._sightings.move_to_end(key)
        return None

    def _admits(self, key: ScopeKey, nbytes: float | None = None) -> bool:
        """Whether a copy of `key` (`nbytes`; by default the usual size of a copy held) would be
        kept: it fits, or each copy it would push out was read less often lately, by more than
        ADMISSION_MARGIN. `put` decides so with the copy's real size; asking it before a load
        too, as the calls read the copies meanwhile, keeps the loader from reading copies that
        would be turned away."""
        if not self._scopes:
            return True
        usual = self.bytes / len(self._scopes)
        return self._outreads(key, self._victims(usual if nbytes is None else nbytes))

    def _outreads(self, key: ScopeKey, victims: list[ScopeKey]) -> bool:
        """Whether `key` was read lately more than ADMISSION_MARGIN times beyond each victim."""
        reads = self.sketch.estimate(key)
        return all(
            self.sketch.estimate(victim) + ADMISSION_MARGIN < reads
            for victim in victims
            if victim != key
        )

    def _victims(self, nbytes: float) -> list[ScopeKey]:
        """The copies a copy of `nbytes` would push out, the least recently read first."""
        victims, freed = [], 0
        for victim, copy in self._scopes.items():
            if self.bytes - freed + nbytes <= self.max_bytes:
                break
            victims.append(victim)
            freed += copy.nbytes
        return victims

    def _enqueue(self, key: ScopeKey) -> None:
        self._queue[key] = None
        if self._loader is None or self._loader.done():
            self._loader = asyncio.create_task(self._load_queued(), name="scope-cache-load")

    async def _load_queued(self) -> None:
        loading_seconds = 0.0  # the last load's
        while self._queue:
            if loading_seconds and self.load_share < 1:  # rest: loading keeps to its share
                await asyncio.sleep(loading_seconds * (1 - self.load_share) / self.load_share)
                if not self._queue:
                    break
            key, _ = self._queue.popitem(last=False)
            kind, project_id, subject_id = key
            if not self._admits(key):  # its copy would now be turned away: not read
                self.stats[kind].rejected += 1
                self._ask_again(key)
                loading_seconds = 0.0  # nothing read: no rest owed
                continue
            self._loading, self._loading_erased = key, False
            started = time.monotonic()
            try:
                async with autocommit(self._pool) as conn:
                    held = await _LOADERS[kind](
                        conn, project_id, subject_id, self.max_rows, self.vector_type
                    )
            except Exception:  # the calls keep using the statements
                log.exception("scope cache: loading %s failed", key)
                continue
            finally:
                self._loading = None
                loading_seconds = time.monotonic() - started
            self.stats[kind].loads += 1
            if self._loading_erased:
                continue
            if held is None:
                self.stats[kind].too_large += 1
                continue
            self.put(key, held)

    def put(self, key: ScopeKey, held: Held) -> None:
        """Hold a scope's events or facts, dropping the least recently read beyond the budget
        when this scope outreads each of them (`_outreads`); otherwise not held."""
        previous = self._scopes.pop(key, None)
        if previous is not None:
            self.bytes -= previous.nbytes
        if held.nbytes > self.max_bytes:
            self.stats[key[0]].too_large += 1
            return
        victims = self._victims(held.nbytes)
        if not self._outreads(key, victims):
            self.stats[key[0]].rejected += 1
            self._ask_again(key, held.version)
            return
        for victim in victims:
            self.stats[victim[0]].evictions += 1
            self._ask_again(victim, self._scopes[victim].version)
            self._drop(victim)
        self._scopes[key] = held
        self.bytes += held.nbytes

    def _ask_again(self, key: ScopeKey, version: int | None = None) -> None:
        """A copy of `key` at `version` left (or never entered) for room, or its queued load
        was skipped (any version): read again at its version, it is asked for again."""
        seen = self._sightings.get(key)
        if seen is not None and (version is None or seen.version == version):
            seen.load_asked = False

    def forget(self, project_id: str, subject_id: str | None) -> None:
        """Drop what is held of a scope (of every scope of the project when `subject_id` is
        None): its copies, its queued loads, a load in flight."""

        def erased(key: ScopeKey) -> bool:
            return key[1] == project_id and subject_id in (None, key[2])

        for key in [k for k in self._scopes if erased(k)]:
            self._drop(key)
        for key in [k for k in self._queue if erased(k)]:
            del self._queue[key]
        for key in [k for k in self._sightings if erased(k)]:
            del self._sightings[key]
        if self._loading is not None and erased(self._loading):
            self._loading_erased = True

    def copies(self, project_id: str) -> list[Held]:
        """The copies held of the project's scopes, whatever their version."""
        return [held for key, held in self._scopes.items() if key[1] == project_id]

    def held(self, project_id: str, subject_id: str) -> list[str]:
        """The kinds (EVENTS, FACTS) held of a scope, whatever their version."""
        return [kind for kind in (EVENTS, FACTS) if (kind, project_id, subject_id) in self._scopes]

    def _drop(self, key: ScopeKey) -> None:
        self.bytes -= self._scopes.pop(key).nbytes

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
