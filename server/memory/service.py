"""The memory write path's application service: embedding, transactions, reference checks.

The servicer hands over validated requests (`NewEvent`, `NewFact`, ids); this module embeds
texts off the event loop in batches of EMBED_BATCH, runs one transaction per request through
`satchel.server.memory.storage.records`, and raises NOT_FOUND / INVALID_ARGUMENT /
FAILED_PRECONDITION
with the field path of every bad reference. A failed request writes nothing.

Idempotency: a request whose `(project_id, idempotency_key)` is already stored returns the
stored row (`created = False`) and writes nothing, whatever else it holds. Keys are looked up
before embedding (a retry costs no model time); concurrent writers of one key are serialised by
the unique index (`INSERT ... ON CONFLICT DO NOTHING`, then the winner's row is read back).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

import numpy as np
from psycopg import AsyncConnection

from satchel.server.memory.storage import records as store
from satchel.server.memory.storage.records import (
    ConflictRow,
    EventRow,
    FactRow,
    FactState,
    NewEvent,
    NewFact,
)
from satchel.server.platform.errors import FailedPrecondition, InvalidArgument, NotFound
from satchel.server.platform.runtime import Runtime

EMBED_BATCH = 32
"""Texts per embedding call (measured best on 2 cores; see TOOLING.md)."""

RowT = TypeVar("RowT", EventRow, FactRow)


@dataclass(frozen=True)
class Written(Generic[RowT]):
    """A stored row and whether this request created it (False: idempotent replay)."""

    row: RowT
    created: bool


@dataclass
class _Problems:
    """Reference problems of a request, raised by kind: invalid, then missing, then state."""

    invalid: list[tuple[str, str]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    state: list[tuple[str, str]] = field(default_factory=list)

    def raise_if_any(self) -> None:
        if self.invalid:
            raise InvalidArgument(self.invalid, reason="CROSS_SCOPE_REFERENCE")
        if self.missing:
            raise NotFound(
                "; ".join(f"{f}: {why}" for f, why in self.missing),
                reason="NOT_FOUND",
                violations=self.missing,
            )
        if self.state:
            raise FailedPrecondition(
                "; ".join(f"{f}: {why}" for f, why in self.state),
                reason="FAILED_PRECONDITION",
                violations=self.state,
            )


async def embed_texts(runtime: Runtime, texts: Sequence[str]) -> np.ndarray:
    """Embed passages in batches of EMBED_BATCH (each batch off the event loop)."""
    if not texts:
        return np.zeros((0, runtime.embedder.dimension), dtype=np.float32)
    # A model batch is padded to its longest text: batching texts of similar length wastes less.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    ordered = [texts[i] for i in order]
    parts = [
        await runtime.embed_passages(ordered[start : start + EMBED_BATCH])
        for start in range(0, len(ordered), EMBED_BATCH)
    ]
    vectors = np.empty((len(texts), parts[0].shape[1]), dtype=parts[0].dtype)
    vectors[order] = np.vstack(parts)
    return vectors


def _plan(
    keys: Sequence[tuple[str, str] | None], existing: Mapping[tuple[str, str], object]
) -> tuple[list[int], dict[int, int]]:
    """Which items to insert, and which repeat a key of an earlier item of the same request.

    Returns (indexes to insert, {repeating index: index of the first item with that key}).
    Items whose key is already stored are in neither.
    """
    to_insert: list[int] = []
    repeats: dict[int, int] = {}
    first: dict[tuple[str, str], int] = {}
    for index, key in enumerate(keys):
        if key is not None and key in existing:
            continue
        if key is not None and key in first:
            repeats[index] = first[key]
            continue
        if key is not None:
            first[key] = index
        to_insert.append(index)
    # Keyed rows are inserted in key order: two batches sharing keys then wait on each other in
    # the same order instead of deadlocking.
    to_insert.sort(key=lambda i: (keys[i] is not None, keys[i] or ("", "")))
    return to_insert, repeats


def _event_key(event: NewEvent) -> tuple[str, str] | None:
    return (event.project_id, event.idempotency_key) if event.idempotency_key else None


def _fact_key(fact: NewFact) -> tuple[str, str] | None:
    return (fact.project_id, fact.idempotency_key) if fact.idempotency_key else None


async def record_events(runtime: Runtime, events: Sequence[NewEvent]) -> list[Written[EventRow]]:
    """Store events (one transaction), in request order, honouring idempotency keys."""
    keys = [_event_key(e) for e in events]
    wanted = sorted({k for k in keys if k is not None})
    async with runtime.pool.connection() as conn:
        existing = await store.find_events_by_keys(conn, wanted)
    to_insert, repeats = _plan(keys, existing)
    vectors = await embed_texts(runtime, [events[i].text for i in to_insert])
    results: dict[int, Written[EventRow]] = {}
    async with runtime.pool.connection() as conn, conn.transaction():
        rows = await store.insert_events(
            conn, [events[i] for i in to_insert], vectors, runtime.embedder.model_id
        )
        lost = [keys[i] for i, row in zip(to_insert, rows, strict=True) if row is None]
        if lost:  # a concurrent writer stored these keys first
            existing.update(await store.find_events_by_keys(conn, [k for k in lost if k]))
        for index, row in zip(to_insert, rows, strict=True):
            if row is not None:
                results[index] = Written(row, True)
        written = [(w.row.project_id, w.row.id) for w in results.values()]
        for project_id, ids in store.by_project(written).items():
            await store.count_lexemes(conn, "events", project_id, ids)
    return _assemble(keys, existing, results, repeats)


def _assemble(
    keys: Sequence[tuple[str, str] | None],
    existing: dict[tuple[str, str], RowT],
    results: dict[int, Written[RowT]],
    repeats: dict[int, int],
) -> list[Written[RowT]]:
    out: list[Written[RowT]] = []
    for index, key in enumerate(keys):
        if index in results:
            out.append(results[index])
        elif index in repeats:
            out.append(Written(out[repeats[index]].row, False))
        else:
            assert key is not None
            out.append(Written(existing[key], False))
    return out


async def assert_facts(
    runtime: Runtime, facts: Sequence[NewFact], paths: Sequence[str]
) -> list[Written[FactRow]]:
    """Store active facts (one transaction), in request order, honouring idempotency keys.

    `paths[i]` prefixes the field paths of item i's errors ("" or "requests[3].").
    Source events must exist in the fact's scope; superseded facts must be active facts of
    the same scope, and become superseded by the new fact in the same transaction.
    """
    keys = [_fact_key(f) for f in facts]
    wanted = sorted({k for k in keys if k is not None})
    async with runtime.pool.connection() as conn:
        existing = await store.find_facts_by_keys(conn, wanted)
    to_insert, repeats = _plan(keys, existing)
    vectors = await embed_texts(runtime, [facts[i].statement for i in to_insert])
    results: dict[int, Written[FactRow]] = {}
    async with runtime.pool.connection() as conn, conn.transaction():
        # Insert first: a concurrent writer of the same key waits here until the first commits,
        # then gets the first fact back instead of failing on what the first one changed.
        rows = await store.insert_facts(
            conn, [facts[i] for i in to_insert], vectors, runtime.embedder.model_id
        )
        lost = [keys[i] for i, row in zip(to_insert, rows, strict=True) if row is None]
        if lost:
            existing.update(await store.find_facts_by_keys(conn, [k for k in lost if k]))
        created = [(i, row) for i, row in zip(to_insert, rows, strict=True) if row is not None]
        pairs = await _check_fact_references(conn, facts, paths, created)
        for project_id, project_pairs in store.by_project(pairs).items():
            await store.supersede_facts(conn, project_id, project_pairs)
        for project_id, ids in store.by_project((r.project_id, r.id) for _, r in created).items():
            await store.count_fact_terms(conn, project_id, ids)
        for index, row in created:
            results[index] = Written(row, True)
    return _assemble(keys, existing, results, repeats)


def _other_subject(kind: str, ref: uuid.UUID, subject: str, expected: str) -> str:
    return f"{kind} {ref} belongs to subject {subject!r}, not {expected!r}: another scope"


async def _check_fact_references(
    conn: AsyncConnection,
    facts: Sequence[NewFact],
    paths: Sequence[str],
    created: Sequence[tuple[int, FactRow]],
) -> list[tuple[str, tuple[uuid.UUID, uuid.UUID]]]:
    """Check the source events and superseded facts of the created facts; return the
    (project, (superseded, successor)) pairs to apply."""
    subjects: dict[tuple[str, uuid.UUID], str] = {}
    states: dict[tuple[str, uuid.UUID], FactState] = {}
    events = {(facts[i].project_id, e) for i, _ in created for e in facts[i].source_event_ids}
    for project_id, ids in store.by_project(sorted(events)).items():
        found = await store.event_subjects(conn, project_id, ids)
        subjects.update({(project_id, e): subject for e, subject in found.items()})
    olds = {(facts[i].project_id, f) for i, _ in created for f in facts[i].supersedes_fact_ids}
    for project_id, ids in store.by_project(sorted(olds)).items():
        locked = await store.lock_facts(conn, project_id, ids)
        states.update({(project_id, f): state for f, state in locked.items()})
    problems = _Problems()
    claimed: dict[uuid.UUID, str] = {}
    pairs: list[tuple[str, tuple[uuid.UUID, uuid.UUID]]] = []
    for index, row in created:
        fact, prefix = facts[index], paths[index]
        for j, event_id in enumerate(fact.source_event_ids):
            path = f"{prefix}source_event_ids[{j}]"
            subject = subjects.get((fact.project_id, event_id))
            if subject is None:
                problems.missing.append((path, f"event {event_id} does not exist"))
            elif subject != fact.subject_id:
                problems.invalid.append(
                    (path, _other_subject("event", event_id, subject, fact.subject_id))
                )
        for j, old_id in enumerate(fact.supersedes_fact_ids):
            path = f"{prefix}supersedes_fact_ids[{j}]"
            state = states.get((fact.project_id, old_id))
            if state is None:
                problems.missing.append((path, f"fact {old_id} does not exist"))
            elif state.subject_id != fact.subject_id:
                problems.invalid.append(
                    (
                        path,
                        _other_subject("fact", old_id, state.subject_id, fact.subject_id),
                    )
                )
            elif state.status != "active":
                problems.state.append((path, f"fact {old_id} is {state.status}, not active"))
            elif old_id in claimed:
                problems.state.append(
                    (path, f"fact {old_id} is already superseded by {claimed[old_id]}")
                )
            else:
                claimed[old_id] = prefix.rstrip(".") or "this request"
                pairs.append((fact.project_id, (old_id, row.id)))
    problems.raise_if_any()
    return pairs


async def retire_fact(
    runtime: Runtime, project_id: str, fact_id: uuid.UUID, reason: str
) -> FactRow:
    """Retire an active fact: it leaves the record now and is kept for history."""
    async with runtime.pool.connection() as conn, conn.transaction():
        row = await store.retire_fact(conn, project_id, fact_id, reason)
        if row is not None:
            return row
        current = await store.get_fact(conn, project_id, fact_id)
    if current is None:
        raise NotFound(
            f"fact {fact_id} does not exist",
            reason="FACT_NOT_FOUND",
            violations=[("fact_id", f"fact {fact_id} does not exist")],
        )
    raise FailedPrecondition(
        f"fact {fact_id} is {current.status}: only active facts can be retired",
        reason="FACT_NOT_ACTIVE",
        violations=[("fact_id", f"fact {fact_id} is {current.status}, not active")],
    )


async def supersede_fact(
    runtime: Runtime, project_id: str, fact_id: uuid.UUID, successor_id: uuid.UUID
) -> FactRow:
    """Mark an active fact superseded by another active fact of the same scope."""
    async with runtime.pool.connection() as conn, conn.transaction():
        states = await store.lock_facts(conn, project_id, [fact_id, successor_id])
        problems = _Problems()
        old, new = states.get(fact_id), states.get(successor_id)
        for name, fid, state in (
            ("fact_id", fact_id, old),
            ("superseded_by_fact_id", successor_id, new),
        ):
            if state is None:
                problems.missing.append((name, f"fact {fid} does not exist"))
            elif state.status != "active":
                problems.state.append((name, f"fact {fid} is {state.status}, not active"))
        if old and new and old.subject_id != new.subject_id:
            problems.invalid.append(
                (
                    "superseded_by_fact_id",
                    f"fact {successor_id} belongs to subject {new.subject_id!r},"
                    f" fact {fact_id} to {old.subject_id!r}",
                )
            )
        problems.raise_if_any()
        (row,) = await store.supersede_facts(conn, project_id, [(fact_id, successor_id)])
        return row


async def open_conflict(
    runtime: Runtime,
    *,
    project_id: str,
    subject_id: str,
    fact_ids: Sequence[uuid.UUID],
    note: str,
) -> ConflictRow:
    """Open a conflict set over two or more active facts of one scope (none in another open
    conflict): they are blocked from context until it is resolved."""
    async with runtime.pool.connection() as conn, conn.transaction():
        states = await store.lock_facts(conn, project_id, fact_ids)
        problems = _Problems()
        for j, fid in enumerate(fact_ids):
            path, state = f"fact_ids[{j}]", states.get(fid)
            if state is None:
                problems.missing.append((path, f"fact {fid} does not exist"))
            elif state.subject_id != subject_id:
                problems.invalid.append(
                    (path, f"fact {fid} belongs to subject {state.subject_id!r}")
                )
            elif state.status != "active":
                problems.state.append((path, f"fact {fid} is {state.status}, not active"))
        problems.raise_if_any()
        already = await store.open_conflicts_of(conn, project_id, fact_ids)
        for j, fid in enumerate(fact_ids):
            if fid in already:
                problems.state.append(
                    (f"fact_ids[{j}]", f"fact {fid} is in open conflict {already[fid]}")
                )
        problems.raise_if_any()
        return await store.insert_conflict(
            conn, project_id=project_id, subject_id=subject_id, note=note, fact_ids=fact_ids
        )


async def resolve_conflict(
    runtime: Runtime, project_id: str, conflict_id: uuid.UUID, winning_fact_id: uuid.UUID
) -> ConflictRow:
    """Close an open conflict: the winner stays active, the other active members become
    superseded by it (same rule as SupersedeFact)."""
    async with runtime.pool.connection() as conn, conn.transaction():
        conflict = await store.get_conflict(conn, project_id, conflict_id, lock=True)
        if conflict is None:
            raise NotFound(
                f"conflict {conflict_id} does not exist",
                reason="CONFLICT_NOT_FOUND",
                violations=[("conflict_id", f"conflict {conflict_id} does not exist")],
            )
        if conflict.status != "open":
            raise FailedPrecondition(
                f"conflict {conflict_id} is already {conflict.status}",
                reason="CONFLICT_NOT_OPEN",
                violations=[("conflict_id", f"conflict {conflict_id} is {conflict.status}")],
            )
        if winning_fact_id not in conflict.fact_ids:
            raise InvalidArgument(
                [("winning_fact_id", f"fact {winning_fact_id} is not a member of the conflict")],
                reason="NOT_A_CONFLICT_MEMBER",
            )
        states = await store.lock_facts(conn, project_id, conflict.fact_ids)
        winner = states[winning_fact_id]
        if winner.status != "active":
            raise FailedPrecondition(
                f"fact {winning_fact_id} is {winner.status}: the winner must be active",
                reason="FACT_NOT_ACTIVE",
                violations=[("winning_fact_id", f"fact {winning_fact_id} is {winner.status}")],
            )
        losers = [
            fid
            for fid in conflict.fact_ids
            if fid != winning_fact_id and states[fid].status == "active"
        ]
        await store.supersede_facts(
            conn,
            project_id,
            [(fid, winning_fact_id) for fid in losers],
            reason=f"conflict {conflict_id} resolved in favour of fact {winning_fact_id}",
        )
        return await store.resolve_conflict(conn, project_id, conflict_id, winning_fact_id)


async def list_facts(
    runtime: Runtime,
    *,
    project_id: str,
    subject_id: str,
    at: datetime | None,
    include_inactive: bool,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
    min_consistency_token: str = "",
) -> tuple[list[FactRow], datetime]:
    """A page of facts (see `storage.memory.list_facts`) and the instant it was read at
    (`at`, or the database's now when None)."""

    async def read(conn: AsyncConnection) -> tuple[list[Any], datetime]:
        instant = at or await store.database_now(conn)
        rows = await store.list_facts(
            conn,
            project_id=project_id,
            subject_id=subject_id,
            at=instant,
            include_inactive=include_inactive,
            after=after,
            limit=limit,
        )
        return rows, instant

    return await runtime.reads.read(read, token=min_consistency_token)


async def list_events(
    runtime: Runtime,
    *,
    project_id: str,
    subject_id: str,
    recorded_by: datetime | None,
    occurred_by: datetime | None,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
    min_consistency_token: str = "",
) -> tuple[list[EventRow], datetime]:
    """A page of events, newest first, and the instant the listing is pinned to."""

    async def read(conn: AsyncConnection) -> tuple[list[Any], datetime]:
        instant = recorded_by or await store.database_now(conn)
        rows = await store.list_events(
            conn,
            project_id=project_id,
            subject_id=subject_id,
            recorded_by=instant,
            occurred_by=occurred_by,
            before=before,
            limit=limit,
        )
        return rows, instant

    return await runtime.reads.read(read, token=min_consistency_token)


async def list_conflicts(
    runtime: Runtime,
    *,
    project_id: str,
    subject_id: str,
    include_resolved: bool,
    opened_by: datetime | None,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
    min_consistency_token: str = "",
) -> tuple[list[ConflictRow], datetime]:
    """A page of conflicts, newest first, and the instant the listing is pinned to
    (`opened_by`, or the database's now when None)."""

    async def read(conn: AsyncConnection) -> tuple[list[Any], datetime]:
        instant = opened_by or await store.database_now(conn)
        rows = await store.list_conflicts(
            conn,
            project_id=project_id,
            subject_id=subject_id,
            include_resolved=include_resolved,
            opened_by=instant,
            before=before,
            limit=limit,
        )
        return rows, instant

    return await runtime.reads.read(read, token=min_consistency_token)


async def delete_event(runtime: Runtime, project_id: str, event_id: uuid.UUID) -> store.Deleted:
    """Forget an event (one transaction); an unknown one deletes nothing (idempotent)."""
    async with runtime.pool.connection() as conn, conn.transaction():
        deleted = await store.delete_event(conn, project_id, event_id)
    if deleted.subject_id is not None:
        runtime.forget_scope(project_id, deleted.subject_id)
    return deleted


async def delete_scopes(runtime: Runtime, project_id: str, subject_id: str | None) -> store.Deleted:
    """Forget one subject of a project, or the whole project with `subject_id` None (one
    transaction); nothing left to delete returns zero counts (idempotent)."""
    async with runtime.pool.connection() as conn, conn.transaction():
        deleted = await store.delete_scopes(conn, project_id, subject_id)
    runtime.forget_scope(project_id, subject_id)
    return deleted
