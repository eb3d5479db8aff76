"""WatchTraces across replicas: one LISTEN connection per server, fanned out to local watchers.

Design (see docs/context.md, "Watching decisions live"):

- A call is announced only once its trace is committed (the statement that writes it NOTIFYs
  `satchel_traces`, delivered by PostgreSQL at commit to every listening replica). Watchers are
  sent the persisted decisions and a packet rebuilt from the persisted rows, never in-memory
  decisions before the commit: a watcher sees exactly what `GetTrace` returns, whichever
  replica served the call, and never a call that was rolled back or cancelled.
- The listener only routes: parsing a notification and offering a reference to each matching
  watcher's bounded queue never waits. A full queue drops the whole call and counts it
  (`Watcher.dropped`, sent to the watcher as `dropped_traces`). Each watcher's own task reads the
  call (a short pooled read, shared by the watchers of the same call) and sends it, so a slow
  watcher slows only itself, never a context call.
- Watchers take turns to write (`SendTurns`): fanning one call out to hundreds of watchers
  (each decision is a message) never crowds the other calls out of the event loop; watchers
  that cannot keep up fall behind and lose whole calls, counted. A write that waits on its
  client (HTTP/2 flow control: it is not reading) gives its turn away.
- The listener reconnects with backoff when the database goes away; it then catches up, from
  `context_calls`, the calls of watched projects created since shortly before the connection was
  last known alive (a call may then be announced twice; it is sent once).
- The same connection hears deletions (`satchel_erasures`): the calls read for watchers of the
  scope are forgotten (a queued call is read again, without what was deleted), and the hub's
  erasure subscribers (the scope cache) drop what they hold of it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from satchel.server.context.service import (
    EPISODE_EXCERPT_CHARS,
    Budget,
    Packet,
    ServedEpisode,
    ServedFact,
)
from satchel.server.context.storage import traces as store
from satchel.server.memory.domain.rendering import excerpt
from satchel.server.memory.storage.records import ERASURES
from satchel.server.platform.backoff import Backoff
from satchel.server.platform.config import ContextSettings
from satchel.server.platform.tokens import TokenCounter

log = structlog.get_logger(__name__)

RECONNECT_MIN_SECONDS = 0.2
RECONNECT_MAX_SECONDS = 5.0
PROBE_SECONDS = 15.0
CATCH_UP_MARGIN = timedelta(seconds=30)
CATCH_UP_LIMIT = 10_000
RECENT_TRACES = 10_000
LOAD_CACHE = 256
READ_ATTEMPTS = 10


@dataclass(frozen=True)
class TraceRef:
    """What a notification says: which call of which scope was committed."""

    project_id: str
    subject_id: str
    trace_id: str


@dataclass(frozen=True)
class WatchedCall:
    """A committed call as a watcher receives it: decisions in order, then the packet."""

    trace_id: str
    subject_id: str
    decisions: list[dict[str, Any]]
    packet: Packet
    # Its wire messages, built once by the gRPC layer for every watcher of the call.
    messages: list[Any] = field(default_factory=list, compare=False)


@dataclass
class HubStats:
    """Counters of one replica's hub (exported as metrics)."""

    notifications: int = 0
    dropped: int = 0
    caught_up: int = 0
    reconnects: int = 0
    connected: bool = False


class Watcher:
    """One WatchTraces stream: a filter and a bounded queue of committed calls to send."""

    def __init__(self, project_id: str, subject_id: str | None, maxsize: int) -> None:
        self.project_id = project_id
        self.subject_id = subject_id
        self.maxsize = maxsize
        self.dropped = 0
        self.closed = False
        self._pending: deque[TraceRef] = deque()
        self._ready = asyncio.Event()

    def matches(self, ref: TraceRef) -> bool:
        """True when the call is of this watch's project (and subject, when one is set)."""
        return ref.project_id == self.project_id and self.subject_id in (None, ref.subject_id)

    def offer(self, ref: TraceRef) -> bool:
        """Queue a call without waiting; False (and one more drop) when the queue is full."""
        if len(self._pending) >= self.maxsize:
            self.dropped += 1
            return False
        self._pending.append(ref)
        self._ready.set()
        return True

    @property
    def pending(self) -> list[TraceRef]:
        """The calls queued, not yet taken to be sent."""
        return list(self._pending)

    def close(self) -> None:
        """End the watch: `next` returns None from now on."""
        self.closed = True
        self._ready.set()

    async def next(self) -> TraceRef | None:
        """The next queued call; None once the watch is closed."""
        while not self._pending and not self.closed:
            self._ready.clear()
            await self._ready.wait()
        return None if self.closed else self._pending.popleft()


class SendTurns:
    """Watch streams take turns to send: at most `size` turns held at a time, given in the order
    they were asked for. So however many watchers there are, the event loop holds at most
    `size` watcher writes among the other calls' steps, and watchers share the time left.

    A turn is held while its message is written; a write still waiting after `hold` seconds
    waits on its client (HTTP/2 flow control: it is not reading) and gives its turn away.
    """

    def __init__(self, size: int = 1, hold: float = 0.02) -> None:
        self.hold = hold
        self.held = 0  # turns held now
        self.most_held = 0
        self.given_away = 0  # turns released by `hold` rather than by their write
        self._turns = asyncio.Semaphore(size)

    async def take(self) -> Turn:
        """Wait for a turn; release it once the message is written."""
        await self._turns.acquire()
        self.held += 1
        self.most_held = max(self.most_held, self.held)
        turn = Turn(self)
        turn.timer = asyncio.get_running_loop().call_later(self.hold, turn.give_away)
        return turn

    def _release(self) -> None:
        self.held -= 1
        self._turns.release()


class Turn:
    """One watcher's turn to send (see `SendTurns`)."""

    def __init__(self, turns: SendTurns) -> None:
        self._turns = turns
        self.timer: asyncio.TimerHandle | None = None
        self.released = False

    def release(self) -> None:
        """Give the turn to the next watcher (once; later calls do nothing)."""
        if not self.released:
            self.released = True
            if self.timer is not None:
                self.timer.cancel()
            self._turns._release()

    def give_away(self) -> None:
        """The write waits on its client: let the next watcher write meanwhile."""
        if not self.released:
            self._turns.given_away += 1
            self.release()


def rebuild_packet(stored: store.StoredCall, budget: Budget | None = None) -> Packet:
    """The packet of a committed call, from its included decisions and the served rows;
    rendered into its block under `budget` (the call's), when given."""
    call = stored.call
    facts: list[ServedFact] = []
    episodes: list[ServedEpisode] = []
    for d in stored.decisions:
        if d["outcome"] != "included":
            continue
        key = str(d["candidate_id"])
        if d["candidate_kind"] == "fact" and (row := stored.facts.get(key)) is not None:
            facts.append(
                ServedFact(
                    id=key,
                    predicate=row["predicate"],
                    value=row["value"],
                    statement=row["statement"],
                    confidence=float(row["confidence"]),
                    valid_from=row["valid_from"],
                    source_event_ids=[str(e) for e in row["source_event_ids"]],
                )
            )
        elif d["candidate_kind"] == "episode" and (row := stored.events.get(key)) is not None:
            text = excerpt(row["text"], EPISODE_EXCERPT_CHARS)
            episodes.append(ServedEpisode(key, row["kind"], row["occurred_at"], text))
    warnings = list(call["warnings"])
    block = budget.render(facts, episodes, warnings)[0] if budget is not None else ""
    return Packet(
        trace_id=str(call["trace_id"]),
        facts=facts,
        episodes=episodes,
        warnings=warnings,
        status=call["status"],
        empty_reason=call["empty_reason"],
        budget_tokens=call["budget_tokens"],
        tokens_used=call["tokens_used"],
        block=block,
        token_counter=budget.counter_name if budget is not None else "",
    )


def _of_scope(ref: TraceRef, project_id: str, subject_id: str | None) -> bool:
    return ref.project_id == project_id and subject_id in (None, ref.subject_id)


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    # Its waiters see the error; this keeps asyncio from logging a task nobody awaited.
    if not task.cancelled():
        task.exception()


class TraceHub:
    """One replica's listener and its local watchers."""

    def __init__(self, dsn: str, pool: AsyncConnectionPool, *, queue_size: int) -> None:
        self.queue_size = queue_size
        self.stats = HubStats()
        self.listener_pid: int | None = None
        self.reconnect_min = RECONNECT_MIN_SECONDS
        # How the server's calls count their budget, to render watched packets alike (set by
        # the Runtime; without it, packets come without their block).
        self.budget: Budget | None = None
        self._dsn = dsn
        self._pool = pool
        self._watchers: dict[str, set[Watcher]] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._loads: OrderedDict[TraceRef, asyncio.Task[WatchedCall | None]] = OrderedDict()
        self._erasures = 0  # deletions heard so far
        self._connected = asyncio.Event()
        self._last_alive: datetime | None = None
        self._task: asyncio.Task[None] | None = None
        self._erasure_subscribers: list[Callable[[str, str | None], None]] = []
        self.turns = SendTurns()

    def watchers_of(self, project_id: str) -> list[Watcher]:
        """The watchers of a project on this replica."""
        return list(self._watchers.get(project_id, ()))

    @property
    def watchers(self) -> int:
        """How many watch streams this replica serves."""
        return sum(len(ws) for ws in self._watchers.values())

    async def start(self, wait_seconds: float = 10.0) -> None:
        """Start listening; wait (bounded) for the first LISTEN so early watchers miss nothing."""
        self._task = asyncio.create_task(self._listen_forever(), name="satchel-watch-listener")
        try:
            await asyncio.wait_for(self._connected.wait(), wait_seconds)
        except TimeoutError:
            log.warning("watch_listener_not_ready", waited_seconds=wait_seconds)

    async def close(self) -> None:
        """Stop listening and end every watch (their streams end as UNAVAILABLE)."""
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        # Reads in flight are left to finish (short, and awaited by streams that are ending).
        self._loads.clear()

    @asynccontextmanager
    async def watch(self, project_id: str, subject_id: str | None) -> AsyncIterator[Watcher]:
        """Register a watcher for the duration of the block."""
        watcher = Watcher(project_id, subject_id, self.queue_size)
        self._watchers.setdefault(project_id, set()).add(watcher)
        try:
            yield watcher
        finally:
            watchers = self._watchers.get(project_id, set())
            watchers.discard(watcher)
            if not watchers:
                self._watchers.pop(project_id, None)

    async def calls(self, watcher: Watcher) -> AsyncIterator[WatchedCall]:
        """The committed calls of a watch, in announcement order, until the hub closes.

        A call that cannot be read (the database is away) is skipped and counted as dropped.
        """
        while (ref := await watcher.next()) is not None:
            try:
                watched = await self._load(ref)
            except (psycopg.Error, PoolTimeout, OSError) as exc:
                watcher.dropped += 1
                self.stats.dropped += 1
                log.warning("watch_read_failed", satchel_trace_id=ref.trace_id, error=str(exc))
                continue
            if watched is not None:
                yield watched

    def dispatch(self, ref: TraceRef) -> None:
        """Offer a committed call to the matching watchers; never waits."""
        if ref.trace_id in self._recent:
            return
        self._recent[ref.trace_id] = None
        if len(self._recent) > RECENT_TRACES:
            self._recent.popitem(last=False)
        for watcher in self._watchers.get(ref.project_id, ()):
            if watcher.matches(ref) and not watcher.offer(ref):
                self.stats.dropped += 1
                if watcher.dropped == 1 or watcher.dropped % 100 == 0:
                    log.warning(
                        "watch_fell_behind",
                        project_id=watcher.project_id,
                        dropped_traces=watcher.dropped,
                        queue_size=watcher.maxsize,
                    )

    def on_erasure(self, subscriber: Callable[[str, str | None], None]) -> None:
        """Call `subscriber(project_id, subject_id or None)` on every deletion announced."""
        self._erasure_subscribers.append(subscriber)

    def forget(self, project_id: str, subject_id: str | None) -> None:
        """Forget the calls read for watchers of a scope (of the whole project when
        `subject_id` is None): a call still queued is read again, after the deletion; a read in
        flight is read again (`_read`)."""
        self._erasures += 1
        for ref in [r for r in self._loads if _of_scope(r, project_id, subject_id)]:
            del self._loads[ref]

    def _on_erasure(self, payload: str) -> None:
        try:
            data = json.loads(payload)
            project_id, subject_id = str(data["project_id"]), data["subject_id"]
        except (ValueError, KeyError, TypeError):
            log.warning("bad_erasure_notification", payload=payload[:200])
            return
        subject = None if subject_id is None else str(subject_id)
        self.forget(project_id, subject)
        for subscriber in self._erasure_subscribers:
            subscriber(project_id, subject)

    def _on_notify(self, payload: str) -> None:
        self.stats.notifications += 1
        try:
            data = json.loads(payload)
            ref = TraceRef(str(data["project_id"]), str(data["subject_id"]), str(data["trace_id"]))
        except (ValueError, KeyError, TypeError):
            log.warning("watch_bad_notification", payload=payload[:200])
            return
        self.dispatch(ref)

    async def _load(self, ref: TraceRef) -> WatchedCall | None:
        # Watchers of the same call share one read; shielded so that one watcher leaving does
        # not cancel the read the others wait for.
        task = self._loads.get(ref)
        if task is None:
            task = asyncio.create_task(self._read(ref))
            task.add_done_callback(_retrieve_exception)
            self._loads[ref] = task
            if len(self._loads) > LOAD_CACHE:
                self._loads.popitem(last=False)
        return await asyncio.shield(task)

    async def _read(self, ref: TraceRef) -> WatchedCall | None:
        # A deletion heard while reading may have committed after the read began: read again,
        # so that no watcher is sent what was deleted before it was sent.
        for _ in range(READ_ATTEMPTS):
            erasures = self._erasures
            async with self._pool.connection() as conn:
                stored = await store.load_call(conn, ref.project_id, uuid.UUID(ref.trace_id))
            if erasures == self._erasures:
                break
        else:
            raise psycopg.OperationalError("deletions kept coming while the call was read")
        if stored is None:
            return None
        return WatchedCall(
            trace_id=ref.trace_id,
            subject_id=stored.call["subject_id"],
            decisions=stored.decisions,
            packet=rebuild_packet(stored, self._budget(stored.call["budget_tokens"])),
        )

    def render_like(self, counter: TokenCounter, context: ContextSettings) -> None:
        """Render watched packets as this server's calls render theirs."""
        self.budget = Budget.of(0, counter, context)

    def _budget(self, budget_tokens: int) -> Budget | None:
        return None if self.budget is None else replace(self.budget, tokens=budget_tokens)

    async def _listen_forever(self) -> None:
        backoff = Backoff(self.reconnect_min, RECONNECT_MAX_SECONDS)
        lost_at: datetime | None = None
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, application_name="satchel-watch"
                )
                async with conn:
                    await conn.execute(f"LISTEN {store.CHANNEL}")
                    await conn.execute(f"LISTEN {ERASURES}")
                    await self._probe(conn)
                    self.listener_pid = conn.info.backend_pid
                    self.stats.connected = True
                    self._connected.set()
                    if lost_at is not None:
                        self.stats.reconnects += 1
                        log.info("watch_listener_reconnected")
                        await self._catch_up(conn, lost_at - CATCH_UP_MARGIN)
                    backoff.reset()
                    while True:
                        async for notify in conn.notifies(timeout=PROBE_SECONDS):
                            if notify.channel == ERASURES:
                                self._on_erasure(notify.payload)
                            else:
                                self._on_notify(notify.payload)
                        await self._probe(conn)
            except (psycopg.Error, OSError) as exc:
                self.stats.connected = False
                self._connected.clear()
                lost_at = self._last_alive or lost_at
                delay = backoff.next()
                log.warning("watch_listener_lost", error=str(exc), retry_in_seconds=delay)
                await asyncio.sleep(delay)

    async def _probe(self, conn: psycopg.AsyncConnection) -> None:
        # Detects a connection that died silently, and dates the last moment it was alive.
        cur = await conn.execute("SELECT now()")
        row = await cur.fetchone()
        self._last_alive = row[0] if row else self._last_alive

    async def _catch_up(self, conn: psycopg.AsyncConnection, since: datetime) -> None:
        projects = list(self._watchers)
        if not projects:
            return
        rows = await store.calls_since(conn, projects, since, CATCH_UP_LIMIT)
        missed = [TraceRef(*row) for row in rows if row[2] not in self._recent]
        for ref in missed:
            self.dispatch(ref)
        self.stats.caught_up += len(missed)
        log.info("watch_caught_up", calls=len(missed), since=since.isoformat())
