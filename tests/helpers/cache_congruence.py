"""Servers that hold scopes in memory serve what a server without the cache serves, after
every acknowledged write: the machinery of tests/context/test_cache_congruence.py (bounded, in the
suite) and benchmarks/cache_congruence.py (long runs).

A scenario is a list of operations drawn by hypothesis (`operations()`): every write RPC of the
memory service (events, batches, facts with sources and validity windows, supersessions,
retirements, conflicts opened and resolved, DeleteEvent / DeleteSubject / DeleteProject) on
two subjects of one project. After each acknowledged write, the written scopes are read on
every server and their packets must be identical; the servers with a cache then read again
until they rank the scope in memory, and the packets are compared again. Every text carries a
unique tag: a deleted event's tag, and the tags of the facts deleted with it, must never be
served again by any server.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2
from hypothesis import strategies as st

from satchel.server.context.scope_cache import ScopeCache
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

SUBJECTS = ("maya", "tom")
TOPICS = (
    "moved to Lisbon for a new job at the hospital",
    "adopted a rescue greyhound called Biscuit",
    "is allergic to peanuts and avoids satay",
    "plays the violin in a community orchestra",
    "is training for the Porto marathon in spring",
    "bought a second-hand desk at the flea market",
    "prefers short answers written as bullet points",
    "is learning Portuguese on weekends",
)
PREDICATES = ("home", "pet", "diet", "hobby", "goal")
QUERIES = ("Where does {name} live and work?", "What should I know about {name}'s dog?")
# days from now: a fact's valid_from (None: unset) and valid_to (None: open-ended)
VALID_FROM = (None, -400, -30, -1, 20)
VALID_TO = (None, None, 30, -2)


def operations(max_size: int = 16) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """Scenarios: lists of operations; ids are picked at run time among the live ones."""
    subject = st.integers(0, len(SUBJECTS) - 1)
    pick = st.integers(0, 1_000)
    topic = st.integers(0, len(TOPICS) - 1)
    operation = st.one_of(
        st.tuples(st.just("event"), subject, topic),
        st.tuples(st.just("events"), subject, st.lists(topic, min_size=2, max_size=4)),
        st.tuples(
            st.just("fact"),
            subject,
            st.integers(0, len(PREDICATES) - 1),
            topic,
            st.lists(pick, max_size=2),  # its source events
            st.sampled_from(VALID_FROM),
            st.sampled_from(VALID_TO),
        ),
        st.tuples(st.just("supersede"), subject, pick, pick),
        st.tuples(st.just("retire"), subject, pick),
        st.tuples(st.just("conflict"), subject, pick, pick),
        st.tuples(st.just("resolve"), subject, pick, st.booleans()),
        st.tuples(st.just("delete_event"), subject, pick),
        st.tuples(st.just("delete_subject"), subject),
        st.tuples(st.just("delete_project")),
    )
    return st.lists(operation, min_size=4, max_size=max_size)


@dataclass
class Server:
    """One server of the comparison: its channel and, when it has one, its scope cache."""

    name: str
    channel: grpc.aio.Channel
    cache: ScopeCache | None

    @property
    def context(self) -> context_pb2_grpc.ContextServiceStub:
        return context_pb2_grpc.ContextServiceStub(self.channel)


@dataclass
class Tally:
    """What a run did and found."""

    writes: int = 0
    refused: int = 0  # writes the server rightly refused (a fact no longer active, say)
    reads: int = 0
    served_from_memory: int = 0
    mismatches: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.writes += other.writes
        self.refused += other.refused
        self.reads += other.reads
        self.served_from_memory += other.served_from_memory
        self.mismatches += other.mismatches


@dataclass
class _Scope:
    events: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)  # active
    conflicts: list[tuple[str, list[str]]] = field(default_factory=list)  # open, with members
    sources: dict[str, list[str]] = field(default_factory=dict)  # fact -> its events


_serial = itertools.count()


def _tag() -> str:
    return f"ref{next(_serial):06d}x{uuid.uuid4().hex[:4]}"


def _ts(days: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(datetime.now(UTC) + timedelta(days=days))
    return stamp


def _pick(items: Sequence[str], index: int) -> str | None:
    return items[index % len(items)] if items else None


class Scenario:
    """Runs scenarios on `servers` (the first one takes the writes) and compares the reads."""

    def __init__(self, servers: list[Server]) -> None:
        self.servers = servers
        self.memory = memory_pb2_grpc.MemoryServiceStub(servers[0].channel)

    async def run(self, ops: list[tuple[Any, ...]]) -> Tally:
        """One scenario on a project of its own."""
        self.project = f"congruence-{uuid.uuid4().hex[:10]}"
        self.scopes = {s: _Scope() for s in SUBJECTS}
        self.erased: set[str] = set()  # tags of deleted texts
        self.texts: dict[str, str] = {}  # event or fact id -> its tag
        tally = Tally()
        for op in ops:
            written = await self._write(op, tally)
            for subject in written:
                await self._compare(subject, tally)
        return tally

    # --- writes ------------------------------------------------------------------------------

    async def _write(self, op: tuple[Any, ...], tally: Tally) -> list[str]:
        """Apply `op`; the subjects it wrote (none when it was refused or had nothing to do)."""
        kind = op[0]
        subject = SUBJECTS[op[1]] if len(op) > 1 else ""
        try:
            done = await getattr(self, f"_{kind}")(subject, *op[2:])
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                tally.refused += 1
                return []
            raise
        if done:
            tally.writes += 1
        return list(SUBJECTS) if kind == "delete_project" else ([subject] if done else [])

    def _event_request(self, subject: str, topic: int) -> tuple[memory_pb2.RecordEventRequest, str]:
        tag = _tag()
        name = subject.capitalize()
        payload = struct_pb2.Struct()
        json_format.ParseDict({"speaker": name, "text": f"{name} {TOPICS[topic]} ({tag})"}, payload)
        request = memory_pb2.RecordEventRequest(
            project_id=self.project, subject_id=subject, kind="message", payload=payload
        )
        return request, tag

    async def _event(self, subject: str, topic: int) -> bool:
        request, tag = self._event_request(subject, topic)
        reply = await self.memory.RecordEvent(request)
        self.scopes[subject].events.append(reply.event.id)
        self.texts[reply.event.id] = tag
        return True

    async def _events(self, subject: str, topics: list[int]) -> bool:
        requests, tags = [], []
        for topic in topics:
            request, tag = self._event_request(subject, topic)
            requests.append(request)
            tags.append(tag)
        reply = await self.memory.BatchRecordEvents(
            memory_pb2.BatchRecordEventsRequest(requests=requests)
        )
        for event, tag in zip(reply.events, tags, strict=True):
            self.scopes[subject].events.append(event.id)
            self.texts[event.id] = tag
        return True

    async def _fact(
        self,
        subject: str,
        predicate: int,
        topic: int,
        sources: list[int],
        valid_from: int | None,
        valid_to: int | None,
    ) -> bool:
        scope = self.scopes[subject]
        events = sorted({e for i in sources if (e := _pick(scope.events, i))})
        tag = _tag()
        statement = f"{subject.capitalize()} {TOPICS[topic]} ({tag})"
        value = struct_pb2.Value(string_value=TOPICS[topic])
        request = memory_pb2.AssertFactRequest(
            project_id=self.project,
            subject_id=subject,
            predicate=PREDICATES[predicate],
            value=value,
            statement=statement,
            source_event_ids=events,
        )
        if valid_from is not None:
            request.valid_from.CopyFrom(_ts(valid_from))
        if valid_to is not None and valid_to > (valid_from or 0):
            request.valid_to.CopyFrom(_ts(valid_to))
        reply = await self.memory.AssertFact(request)
        scope.facts.append(reply.fact.id)
        scope.sources[reply.fact.id] = events
        self.texts[reply.fact.id] = tag
        return True

    async def _supersede(self, subject: str, old: int, new: int) -> bool:
        facts = self.scopes[subject].facts
        older, newer = _pick(facts, old), _pick(facts, new)
        if older is None or newer is None or older == newer:
            return False
        await self.memory.SupersedeFact(
            memory_pb2.SupersedeFactRequest(
                project_id=self.project, fact_id=older, superseded_by_fact_id=newer
            )
        )
        facts.remove(older)
        return True

    async def _retire(self, subject: str, index: int) -> bool:
        fact = _pick(self.scopes[subject].facts, index)
        if fact is None:
            return False
        await self.memory.RetireFact(
            memory_pb2.RetireFactRequest(project_id=self.project, fact_id=fact, reason="test")
        )
        self.scopes[subject].facts.remove(fact)
        return True

    async def _conflict(self, subject: str, first: int, second: int) -> bool:
        facts = self.scopes[subject].facts
        members = sorted({f for i in (first, second) if (f := _pick(facts, i))})
        if len(members) < 2:
            return False
        reply = await self.memory.OpenConflict(
            memory_pb2.OpenConflictRequest(
                project_id=self.project, subject_id=subject, fact_ids=members
            )
        )
        self.scopes[subject].conflicts.append((reply.conflict.id, members))
        return True

    async def _resolve(self, subject: str, index: int, first_wins: bool) -> bool:
        scope = self.scopes[subject]
        if not scope.conflicts:
            return False
        conflict_id, members = scope.conflicts.pop(index % len(scope.conflicts))
        winner = members[0 if first_wins else -1]
        await self.memory.ResolveConflict(
            memory_pb2.ResolveConflictRequest(
                project_id=self.project, conflict_id=conflict_id, winning_fact_id=winner
            )
        )
        for loser in members:
            if loser != winner and loser in scope.facts:
                scope.facts.remove(loser)
        return True

    async def _delete_event(self, subject: str, index: int) -> bool:
        scope = self.scopes[subject]
        event = _pick(scope.events, index)
        if event is None:
            return False
        await self.memory.DeleteEvent(
            memory_pb2.DeleteEventRequest(project_id=self.project, event_id=event)
        )
        scope.events.remove(event)
        self.erased.add(self.texts[event])
        for fact, sources in list(scope.sources.items()):
            if event in sources:
                sources.remove(event)
                if not sources:  # drawn from it alone: deleted with it
                    del scope.sources[fact]
                    self.erased.add(self.texts[fact])
                    if fact in scope.facts:
                        scope.facts.remove(fact)
                    scope.conflicts = [c for c in scope.conflicts if fact not in c[1]]
        return True

    async def _delete_subject(self, subject: str) -> bool:
        await self.memory.DeleteSubject(
            memory_pb2.DeleteSubjectRequest(project_id=self.project, subject_id=subject)
        )
        self._forget(subject)
        return True

    async def _delete_project(self, _: str) -> bool:
        await self.memory.DeleteProject(memory_pb2.DeleteProjectRequest(project_id=self.project))
        for subject in SUBJECTS:
            self._forget(subject)
        return True

    def _forget(self, subject: str) -> None:
        scope = self.scopes[subject]
        self.erased.update(self.texts[i] for i in (*scope.events, *scope.sources))
        self.scopes[subject] = _Scope()

    # --- reads -------------------------------------------------------------------------------

    async def _compare(self, subject: str, tally: Tally) -> None:
        """Every server serves the same packets for the scope, before and after the servers
        with a cache hold it; no deleted text is served."""
        for query in QUERIES:
            text = query.format(name=subject.capitalize())
            await self._same_packets(subject, text, "after the write", tally)
            for server in self.servers:  # read twice at this version: loaded
                if server.cache is not None:
                    await self._assemble(server, subject, text, tally)
                    await self._assemble(server, subject, text, tally)
                    await server.cache.wait_loaded()
            hits = self._hits()
            await self._same_packets(subject, text, "once held in memory", tally)
            tally.served_from_memory += self._hits() - hits
        for server in self.servers:
            if server.cache is not None and not await self._forgotten(server.cache):
                tally.mismatches.append(f"{server.name}: holds deleted text in memory")

    async def _forgotten(self, cache: ScopeCache, timeout: float = 5.0) -> bool:
        """No copy the cache holds of the project quotes a deleted text (another server hears
        of a deletion from the database: give it a moment)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            held = " ".join(
                " ".join((*getattr(copy, "texts", ()), *getattr(copy, "statements", ())))
                for copy in cache.copies(self.project)
            )
            if not any(tag in held for tag in self.erased):
                return True
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.02)

    def _hits(self) -> int:
        return sum(
            stats.hits
            for server in self.servers
            if server.cache is not None
            for stats in server.cache.stats.values()
        )

    async def _assemble(
        self, server: Server, subject: str, query: str, tally: Tally
    ) -> context_pb2.ContextPacket:
        reply = await server.context.AssembleContext(
            context_pb2.AssembleContextRequest(
                project_id=self.project, subject_id=subject, query=query
            ),
            timeout=30,
        )
        tally.reads += 1
        return reply.packet

    async def _same_packets(self, subject: str, query: str, when: str, tally: Tally) -> None:
        packets = await asyncio.gather(
            *(self._assemble(server, subject, query, tally) for server in self.servers)
        )
        expected = packets[-1]  # the server without a cache
        for server, packet in zip(self.servers, packets, strict=True):
            where = f"{server.name}, {subject}, {query!r}, {when}"
            if packet != expected:
                tally.mismatches.append(f"{where}: {packet} != {expected}")
            served = str(packet)
            leaked = sorted(tag for tag in self.erased if tag in served)
            if leaked:
                tally.mismatches.append(f"{where}: serves deleted {leaked}")
