"""MemoryService: the gRPC face of the write path.

Thin: validate every field (all violations of a request are reported together, with paths
such as `requests[2].source_event_ids[1]`), call `satchel.server.memory.service`, map rows to
messages.
Limits are in `satchel.server.platform.api.validation` and docs/memory.md ("Errors and limits").
"""

from __future__ import annotations

from google.protobuf import duration_pb2, json_format, struct_pb2
from grpc import aio

from satchel.server.memory import service as memory
from satchel.server.memory.domain.rendering import derive_statement, render_event_text
from satchel.server.memory.storage.records import (
    ConflictRow,
    Deleted,
    EventRow,
    FactRow,
    NewEvent,
    NewFact,
)
from satchel.server.platform.api.messages import timestamp_message, value_message
from satchel.server.platform.api.pagination import cut_page, decode_page_token, query_fingerprint
from satchel.server.platform.api.validation import (
    MAX_BATCH_ITEMS,
    MAX_REFERENCED_IDS,
    MAX_TEXT_CHARS,
    check_consistency_token,
    check_duration,
    check_id,
    check_json_size,
    check_page_size,
    check_text,
    check_timestamp,
    json_from_struct,
    json_from_value,
    parse_uuid,
    parse_uuids,
)
from satchel.server.platform.errors import Violations
from satchel.server.platform.runtime import RuntimeRef
from satchel.v1 import memory_pb2, memory_pb2_grpc

MAX_NOTE_CHARS = 4_000
"""Conflict notes and retirement reasons."""

MAX_CONFLICT_FACTS = 100
"""Facts of one conflict set."""

_FACT_STATUS = {
    "active": memory_pb2.FACT_STATUS_ACTIVE,
    "retired": memory_pb2.FACT_STATUS_RETIRED,
    "superseded": memory_pb2.FACT_STATUS_SUPERSEDED,
}
_CONFLICT_STATUS = {
    "open": memory_pb2.CONFLICT_STATUS_OPEN,
    "resolved": memory_pb2.CONFLICT_STATUS_RESOLVED,
}


# --- request validation ----------------------------------------------------------------------


def _scope(v: Violations, prefix: str, project_id: str, subject_id: str) -> None:
    check_id(v, f"{prefix}project_id", project_id)
    check_id(v, f"{prefix}subject_id", subject_id)


def new_event(v: Violations, request: memory_pb2.RecordEventRequest, prefix: str = "") -> NewEvent:
    """Validate a RecordEventRequest (violations go to `v`) and render its text."""
    _scope(v, prefix, request.project_id, request.subject_id)
    check_id(v, f"{prefix}kind", request.kind)
    check_id(v, f"{prefix}idempotency_key", request.idempotency_key, required=False)
    payload: dict[str, object] = {}
    if request.HasField("payload") and check_json_size(v, f"{prefix}payload", request.payload):
        payload = json_from_struct(v, f"{prefix}payload", request.payload)
    occurred_at = check_timestamp(
        v, f"{prefix}occurred_at", request.occurred_at, present=request.HasField("occurred_at")
    )
    return NewEvent(
        project_id=request.project_id,
        subject_id=request.subject_id,
        kind=request.kind,
        payload=payload,
        text=render_event_text(request.kind, payload),
        occurred_at=occurred_at,
        idempotency_key=request.idempotency_key or None,
    )


def new_fact(v: Violations, request: memory_pb2.AssertFactRequest, prefix: str = "") -> NewFact:
    """Validate an AssertFactRequest (violations go to `v`); derive its statement if empty."""
    _scope(v, prefix, request.project_id, request.subject_id)
    check_id(v, f"{prefix}predicate", request.predicate)
    check_id(v, f"{prefix}idempotency_key", request.idempotency_key, required=False)
    value: object = None
    if not request.HasField("value"):
        v.add(f"{prefix}value", "must be set")
    elif check_json_size(v, f"{prefix}value", request.value):
        value = json_from_value(v, f"{prefix}value", request.value)
    check_text(v, f"{prefix}statement", request.statement, max_chars=MAX_TEXT_CHARS)
    statement = request.statement.strip() or derive_statement(request.predicate, value)
    confidence = request.confidence if request.HasField("confidence") else 1.0
    if not 0.0 <= confidence <= 1.0:  # NaN fails too
        v.add(f"{prefix}confidence", "must be within [0, 1]")
    valid_from = check_timestamp(
        v, f"{prefix}valid_from", request.valid_from, present=request.HasField("valid_from")
    )
    valid_to = check_timestamp(
        v, f"{prefix}valid_to", request.valid_to, present=request.HasField("valid_to")
    )
    if valid_from is not None and valid_to is not None and valid_to <= valid_from:
        v.add(f"{prefix}valid_to", "must be after valid_from")
    stale_after = check_duration(
        v, f"{prefix}stale_after", request.stale_after, present=request.HasField("stale_after")
    )
    sources = parse_uuids(
        v, f"{prefix}source_event_ids", request.source_event_ids, max_count=MAX_REFERENCED_IDS
    )
    supersedes = parse_uuids(
        v, f"{prefix}supersedes_fact_ids", request.supersedes_fact_ids, max_count=MAX_REFERENCED_IDS
    )
    return NewFact(
        project_id=request.project_id,
        subject_id=request.subject_id,
        predicate=request.predicate,
        value=value,
        statement=statement,
        confidence=confidence,
        valid_from=valid_from,
        valid_to=valid_to,
        source_event_ids=tuple(sources),
        stale_after=stale_after,
        idempotency_key=request.idempotency_key or None,
        supersedes_fact_ids=tuple(supersedes),
    )


def _check_batch_size(v: Violations, count: int) -> None:
    if not 1 <= count <= MAX_BATCH_ITEMS:
        v.add("requests", f"must hold 1 to {MAX_BATCH_ITEMS} requests (has {count})")


# --- row to message mapping ------------------------------------------------------------------


def event_message(row: EventRow) -> memory_pb2.Event:
    """An events row as a satchel.v1.Event."""
    return memory_pb2.Event(
        id=str(row.id),
        project_id=row.project_id,
        subject_id=row.subject_id,
        kind=row.kind,
        payload=json_format.ParseDict(row.payload, struct_pb2.Struct()),
        occurred_at=timestamp_message(row.occurred_at),
        recorded_at=timestamp_message(row.recorded_at),
        text=row.text,
    )


def fact_message(row: FactRow) -> memory_pb2.Fact:
    """A facts row as a satchel.v1.Fact (its current state)."""
    stale_after = None
    if row.stale_after is not None:
        stale_after = duration_pb2.Duration()
        stale_after.FromTimedelta(row.stale_after)
    return memory_pb2.Fact(
        id=str(row.id),
        project_id=row.project_id,
        subject_id=row.subject_id,
        predicate=row.predicate,
        value=value_message(row.value),
        statement=row.statement,
        confidence=row.confidence,
        status=_FACT_STATUS[row.status],
        valid_from=timestamp_message(row.valid_from),
        valid_to=timestamp_message(row.valid_to),
        recorded_from=timestamp_message(row.recorded_from),
        recorded_to=timestamp_message(row.recorded_to),
        source_event_ids=[str(e) for e in row.source_event_ids],
        stale_after=stale_after,
        superseded_by=str(row.superseded_by) if row.superseded_by else "",
        status_reason=row.status_reason or "",
    )


def conflict_message(row: ConflictRow) -> memory_pb2.Conflict:
    """A conflict set as a satchel.v1.Conflict."""
    return memory_pb2.Conflict(
        id=str(row.id),
        project_id=row.project_id,
        subject_id=row.subject_id,
        fact_ids=[str(f) for f in row.fact_ids],
        status=_CONFLICT_STATUS[row.status],
        note=row.note,
        opened_at=timestamp_message(row.opened_at),
        resolved_at=timestamp_message(row.resolved_at),
        winning_fact_id=str(row.winning_fact_id) if row.winning_fact_id else "",
    )


def deleted_message(deleted: Deleted) -> memory_pb2.DeletedCounts:
    """What a delete removed, as a satchel.v1.DeletedCounts."""
    return memory_pb2.DeletedCounts(
        events=deleted.events,
        facts=deleted.facts,
        conflicts=deleted.conflicts,
        traces=deleted.traces,
        trace_decisions=deleted.trace_decisions,
        facts_unlinked=deleted.facts_unlinked,
    )


# --- the servicer ----------------------------------------------------------------------------


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    """Events, facts, their lifecycle and conflicts over gRPC."""

    def __init__(self, runtime: RuntimeRef) -> None:
        self._runtime = runtime

    async def _written(self) -> str:
        """The consistency token of the write that just committed."""
        return await self._runtime().reads.consistency_token()

    async def RecordEvent(
        self,
        request: memory_pb2.RecordEventRequest,
        context: aio.ServicerContext[memory_pb2.RecordEventRequest, memory_pb2.RecordEventResponse],
    ) -> memory_pb2.RecordEventResponse:
        """Store one event; a known idempotency key returns the first event (created=false)."""
        v = Violations()
        event = new_event(v, request)
        v.raise_if_any()
        (written,) = await memory.record_events(self._runtime(), [event])
        return memory_pb2.RecordEventResponse(
            event=event_message(written.row),
            created=written.created,
            consistency_token=await self._written(),
        )

    async def BatchRecordEvents(
        self,
        request: memory_pb2.BatchRecordEventsRequest,
        context: aio.ServicerContext[
            memory_pb2.BatchRecordEventsRequest, memory_pb2.BatchRecordEventsResponse
        ],
    ) -> memory_pb2.BatchRecordEventsResponse:
        """Store up to MAX_BATCH_ITEMS events in one transaction."""
        v = Violations()
        _check_batch_size(v, len(request.requests))
        v.raise_if_any()
        events = [new_event(v, item, f"requests[{i}].") for i, item in enumerate(request.requests)]
        v.raise_if_any()
        written = await memory.record_events(self._runtime(), events)
        return memory_pb2.BatchRecordEventsResponse(
            events=[event_message(w.row) for w in written], consistency_token=await self._written()
        )

    async def ListEvents(
        self,
        request: memory_pb2.ListEventsRequest,
        context: aio.ServicerContext[memory_pb2.ListEventsRequest, memory_pb2.ListEventsResponse],
    ) -> memory_pb2.ListEventsResponse:
        """Events of a scope (those that had occurred by `as_of` as recorded then, when
        given), newest occurred_at first, page by page."""
        v = Violations()
        _scope(v, "", request.project_id, request.subject_id)
        limit = check_page_size(v, "page_size", request.page_size)
        as_of = check_timestamp(v, "as_of", request.as_of, present=request.HasField("as_of"))
        fingerprint = query_fingerprint(
            "events", request.project_id, request.subject_id, as_of.isoformat() if as_of else ""
        )
        token = decode_page_token(
            v, "page_token", request.page_token, fingerprint, self._runtime().page_secret
        )
        consistency = check_consistency_token(
            v, "min_consistency_token", request.min_consistency_token
        )
        v.raise_if_any()
        rows, at = await memory.list_events(
            self._runtime(),
            min_consistency_token=consistency,
            project_id=request.project_id,
            subject_id=request.subject_id,
            recorded_by=token.at if token else as_of,
            occurred_by=as_of,
            before=token.last if token else None,
            limit=limit + 1,
        )
        rows, next_token = cut_page(
            rows,
            limit,
            lambda row: (row.occurred_at, row.id),
            secret=self._runtime().page_secret,
            fingerprint=fingerprint,
            at=at,
        )
        return memory_pb2.ListEventsResponse(
            events=[event_message(r) for r in rows], next_page_token=next_token
        )

    async def AssertFact(
        self,
        request: memory_pb2.AssertFactRequest,
        context: aio.ServicerContext[memory_pb2.AssertFactRequest, memory_pb2.AssertFactResponse],
    ) -> memory_pb2.AssertFactResponse:
        """Store one active fact; a known idempotency key returns the first fact."""
        v = Violations()
        fact = new_fact(v, request)
        v.raise_if_any()
        (written,) = await memory.assert_facts(self._runtime(), [fact], [""])
        return memory_pb2.AssertFactResponse(
            fact=fact_message(written.row),
            created=written.created,
            consistency_token=await self._written(),
        )

    async def BatchAssertFacts(
        self,
        request: memory_pb2.BatchAssertFactsRequest,
        context: aio.ServicerContext[
            memory_pb2.BatchAssertFactsRequest, memory_pb2.BatchAssertFactsResponse
        ],
    ) -> memory_pb2.BatchAssertFactsResponse:
        """Store up to MAX_BATCH_ITEMS facts in one transaction."""
        v = Violations()
        _check_batch_size(v, len(request.requests))
        v.raise_if_any()
        paths = [f"requests[{i}]." for i in range(len(request.requests))]
        items = zip(request.requests, paths, strict=True)
        facts = [new_fact(v, item, path) for item, path in items]
        v.raise_if_any()
        written = await memory.assert_facts(self._runtime(), facts, paths)
        return memory_pb2.BatchAssertFactsResponse(
            facts=[fact_message(w.row) for w in written], consistency_token=await self._written()
        )

    async def RetireFact(
        self,
        request: memory_pb2.RetireFactRequest,
        context: aio.ServicerContext[memory_pb2.RetireFactRequest, memory_pb2.RetireFactResponse],
    ) -> memory_pb2.RetireFactResponse:
        """Retire an active fact (kept for history and as-of reads)."""
        v = Violations()
        check_id(v, "project_id", request.project_id)
        fact_id = parse_uuid(v, "fact_id", request.fact_id)
        check_text(v, "reason", request.reason, max_chars=MAX_NOTE_CHARS)
        v.raise_if_any()
        assert fact_id is not None
        row = await memory.retire_fact(
            self._runtime(), request.project_id, fact_id, request.reason.strip()
        )
        return memory_pb2.RetireFactResponse(
            fact=fact_message(row), consistency_token=await self._written()
        )

    async def SupersedeFact(
        self,
        request: memory_pb2.SupersedeFactRequest,
        context: aio.ServicerContext[
            memory_pb2.SupersedeFactRequest, memory_pb2.SupersedeFactResponse
        ],
    ) -> memory_pb2.SupersedeFactResponse:
        """Mark a fact superseded by another active fact of its scope; returns the old fact."""
        v = Violations()
        check_id(v, "project_id", request.project_id)
        fact_id = parse_uuid(v, "fact_id", request.fact_id)
        successor = parse_uuid(v, "superseded_by_fact_id", request.superseded_by_fact_id)
        if fact_id is not None and fact_id == successor:
            v.add("superseded_by_fact_id", "must differ from fact_id")
        v.raise_if_any()
        assert fact_id is not None and successor is not None
        row = await memory.supersede_fact(self._runtime(), request.project_id, fact_id, successor)
        return memory_pb2.SupersedeFactResponse(
            fact=fact_message(row), consistency_token=await self._written()
        )

    async def ListFacts(
        self,
        request: memory_pb2.ListFactsRequest,
        context: aio.ServicerContext[memory_pb2.ListFactsRequest, memory_pb2.ListFactsResponse],
    ) -> memory_pb2.ListFactsResponse:
        """Facts valid at `as_of` (default now) as recorded then, or all recorded by then with
        `include_inactive`; ordered by (recorded_from, id), page by page."""
        v = Violations()
        _scope(v, "", request.project_id, request.subject_id)
        limit = check_page_size(v, "page_size", request.page_size)
        as_of = check_timestamp(v, "as_of", request.as_of, present=request.HasField("as_of"))
        fingerprint = query_fingerprint(
            "facts",
            request.project_id,
            request.subject_id,
            request.include_inactive,
            as_of.isoformat() if as_of else "",
        )
        token = decode_page_token(
            v, "page_token", request.page_token, fingerprint, self._runtime().page_secret
        )
        consistency = check_consistency_token(
            v, "min_consistency_token", request.min_consistency_token
        )
        v.raise_if_any()
        rows, at = await memory.list_facts(
            self._runtime(),
            min_consistency_token=consistency,
            project_id=request.project_id,
            subject_id=request.subject_id,
            at=token.at if token else as_of,
            include_inactive=request.include_inactive,
            after=token.last if token else None,
            limit=limit + 1,
        )
        rows, next_token = cut_page(
            rows,
            limit,
            lambda row: (row.recorded_from, row.id),
            secret=self._runtime().page_secret,
            fingerprint=fingerprint,
            at=at,
        )
        return memory_pb2.ListFactsResponse(
            facts=[fact_message(r) for r in rows], next_page_token=next_token
        )

    async def OpenConflict(
        self,
        request: memory_pb2.OpenConflictRequest,
        context: aio.ServicerContext[
            memory_pb2.OpenConflictRequest, memory_pb2.OpenConflictResponse
        ],
    ) -> memory_pb2.OpenConflictResponse:
        """Open a conflict over two or more distinct active facts of one scope."""
        v = Violations()
        _scope(v, "", request.project_id, request.subject_id)
        known = len(v.items)
        fact_ids = parse_uuids(v, "fact_ids", request.fact_ids, max_count=MAX_CONFLICT_FACTS)
        if len(v.items) == known and len(fact_ids) < 2:
            v.add("fact_ids", "must name at least 2 distinct facts")
        check_text(v, "note", request.note, max_chars=MAX_NOTE_CHARS)
        v.raise_if_any()
        row = await memory.open_conflict(
            self._runtime(),
            project_id=request.project_id,
            subject_id=request.subject_id,
            fact_ids=fact_ids,
            note=request.note.strip(),
        )
        return memory_pb2.OpenConflictResponse(
            conflict=conflict_message(row), consistency_token=await self._written()
        )

    async def ResolveConflict(
        self,
        request: memory_pb2.ResolveConflictRequest,
        context: aio.ServicerContext[
            memory_pb2.ResolveConflictRequest, memory_pb2.ResolveConflictResponse
        ],
    ) -> memory_pb2.ResolveConflictResponse:
        """Close an open conflict with a winning member; the others become superseded."""
        v = Violations()
        check_id(v, "project_id", request.project_id)
        conflict_id = parse_uuid(v, "conflict_id", request.conflict_id)
        winner = parse_uuid(v, "winning_fact_id", request.winning_fact_id)
        v.raise_if_any()
        assert conflict_id is not None and winner is not None
        row = await memory.resolve_conflict(
            self._runtime(), request.project_id, conflict_id, winner
        )
        return memory_pb2.ResolveConflictResponse(
            conflict=conflict_message(row), consistency_token=await self._written()
        )

    async def ListConflicts(
        self,
        request: memory_pb2.ListConflictsRequest,
        context: aio.ServicerContext[
            memory_pb2.ListConflictsRequest, memory_pb2.ListConflictsResponse
        ],
    ) -> memory_pb2.ListConflictsResponse:
        """Open conflicts of a scope (all with include_resolved), newest opened_at first, page
        by page."""
        v = Violations()
        _scope(v, "", request.project_id, request.subject_id)
        limit = check_page_size(v, "page_size", request.page_size)
        fingerprint = query_fingerprint(
            "conflicts", request.project_id, request.subject_id, request.include_resolved
        )
        token = decode_page_token(
            v, "page_token", request.page_token, fingerprint, self._runtime().page_secret
        )
        consistency = check_consistency_token(
            v, "min_consistency_token", request.min_consistency_token
        )
        v.raise_if_any()
        rows, at = await memory.list_conflicts(
            self._runtime(),
            min_consistency_token=consistency,
            project_id=request.project_id,
            subject_id=request.subject_id,
            include_resolved=request.include_resolved,
            opened_by=token.at if token else None,
            before=token.last if token else None,
            limit=limit + 1,
        )
        rows, next_token = cut_page(
            rows,
            limit,
            lambda row: (row.opened_at, row.id),
            secret=self._runtime().page_secret,
            fingerprint=fingerprint,
            at=at,
        )
        return memory_pb2.ListConflictsResponse(
            conflicts=[conflict_message(r) for r in rows], next_page_token=next_token
        )

    async def DeleteEvent(
        self,
        request: memory_pb2.DeleteEventRequest,
        context: aio.ServicerContext[memory_pb2.DeleteEventRequest, memory_pb2.DeleteEventResponse],
    ) -> memory_pb2.DeleteEventResponse:
        """Forget an event, the facts drawn from it alone and the trace decisions quoting them;
        an unknown event deletes nothing (idempotent)."""
        v = Violations()
        check_id(v, "project_id", request.project_id)
        event_id = parse_uuid(v, "event_id", request.event_id)
        v.raise_if_any()
        assert event_id is not None
        deleted = await memory.delete_event(self._runtime(), request.project_id, event_id)
        return memory_pb2.DeleteEventResponse(
            deleted=deleted_message(deleted), consistency_token=await self._written()
        )

    async def DeleteSubject(
        self,
        request: memory_pb2.DeleteSubjectRequest,
        context: aio.ServicerContext[
            memory_pb2.DeleteSubjectRequest, memory_pb2.DeleteSubjectResponse
        ],
    ) -> memory_pb2.DeleteSubjectResponse:
        """Forget every event, fact, conflict and trace of one scope (idempotent)."""
        v = Violations()
        _scope(v, "", request.project_id, request.subject_id)
        v.raise_if_any()
        deleted = await memory.delete_scopes(
            self._runtime(), request.project_id, request.subject_id
        )
        return memory_pb2.DeleteSubjectResponse(
            deleted=deleted_message(deleted), consistency_token=await self._written()
        )

    async def DeleteProject(
        self,
        request: memory_pb2.DeleteProjectRequest,
        context: aio.ServicerContext[
            memory_pb2.DeleteProjectRequest, memory_pb2.DeleteProjectResponse
        ],
    ) -> memory_pb2.DeleteProjectResponse:
        """Forget every scope of a project (idempotent); its API keys and talent settings stay."""
        v = Violations()
        check_id(v, "project_id", request.project_id)
        v.raise_if_any()
        deleted = await memory.delete_scopes(self._runtime(), request.project_id, None)
        return memory_pb2.DeleteProjectResponse(
            deleted=deleted_message(deleted), consistency_token=await self._written()
        )
