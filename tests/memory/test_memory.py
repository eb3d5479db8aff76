"""MemoryService over gRPC against the real database and model: events, facts, lifecycle,
idempotency under concurrency, conflicts, batches."""

from __future__ import annotations

import asyncio
import base64
import math
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import numpy as np
import psycopg
from google.protobuf import duration_pb2, json_format, timestamp_pb2
from helpers.memory import (
    event_request,
    expect_error,
    fact_request,
    fields_of,
    query,
    row_counts,
    struct,
    stub,
)

from satchel.server.memory.domain.rendering import derive_statement, render_event_text
from satchel.v1 import memory_pb2


def ts(moment: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(moment)
    return message


# --- events ----------------------------------------------------------------------------------


async def test_record_event_stores_rendering_and_defaults_occurred_at(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str, embedder
) -> None:
    payload = {"speaker": "Caroline", "text": "I moved to Lisbon in March", "turn": 3}
    before = datetime.now(UTC)
    reply = await stub(channel).RecordEvent(event_request(project_id, payload=payload))
    after = datetime.now(UTC)

    event = reply.event
    assert reply.created
    assert uuid.UUID(event.id)
    assert (event.project_id, event.subject_id, event.kind) == (
        project_id,
        "user-1",
        "conversation.message",
    )
    assert json_format.MessageToDict(event.payload) == payload
    assert event.text == render_event_text("conversation.message", payload)
    assert event.text == "Caroline: I moved to Lisbon in March turn=3"
    occurred = event.occurred_at.ToDatetime(tzinfo=UTC)
    assert before - timedelta(seconds=1) <= occurred <= after + timedelta(seconds=1)
    assert event.recorded_at == event.occurred_at  # both "now" of the same transaction

    (row,) = await query(
        pg_dsn, "SELECT embedding, embedding_model, text FROM events WHERE id = %s", event.id
    )
    expected = embedder.embed([event.text])[0]
    assert float(np.dot(row[0].to_numpy(), expected)) > 0.999
    assert row[1] == embedder.model_id and row[2] == event.text


async def test_record_event_keeps_given_occurred_at(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    moment = datetime(2024, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
    reply = await stub(channel).RecordEvent(
        event_request(project_id, occurred_at=ts(moment), kind="tool.call", payload={"tool": "ls"})
    )
    assert reply.event.occurred_at.ToDatetime(tzinfo=UTC) == moment
    assert reply.event.text == "tool.call tool=ls"
    assert reply.event.recorded_at.ToDatetime(tzinfo=UTC) > moment


async def test_record_event_idempotency_key_returns_first_and_writes_nothing(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    first = await api.RecordEvent(event_request(project_id, idempotency_key="msg-1"))
    again = await api.RecordEvent(
        event_request(project_id, idempotency_key="msg-1", payload={"text": "something else"})
    )
    assert first.created and not again.created
    assert again.event == first.event
    assert (await row_counts(pg_dsn, project_id))["events"] == 1
    # keys are per project
    other_project = f"{project_id}-b"
    other = await api.RecordEvent(event_request(other_project, idempotency_key="msg-1"))
    assert other.created and other.event.id != first.event.id


async def test_concurrent_record_event_same_key_writes_one_row(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    replies = await asyncio.gather(
        *(
            api.RecordEvent(event_request(project_id, idempotency_key="same", payload={"n": i}))
            for i in range(8)
        )
    )
    assert len({r.event.id for r in replies}) == 1
    assert sum(r.created for r in replies) == 1
    assert (await row_counts(pg_dsn, project_id))["events"] == 1


async def test_list_events_newest_first_in_pages(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    base = datetime(2025, 1, 1, tzinfo=UTC)
    batch = memory_pb2.BatchRecordEventsRequest(
        requests=[
            event_request(
                project_id, occurred_at=ts(base + timedelta(minutes=i % 5)), payload={"i": i}
            )
            for i in range(23)
        ]
    )
    created = (await api.BatchRecordEvents(batch)).events
    await api.RecordEvent(event_request(project_id, subject_id="someone-else"))

    seen: list[memory_pb2.Event] = []
    token = ""
    pages = 0
    while True:
        page = await api.ListEvents(
            memory_pb2.ListEventsRequest(
                project_id=project_id, subject_id="user-1", page_size=10, page_token=token
            )
        )
        pages += 1
        seen.extend(page.events)
        # an event recorded while paging is not in this listing (the snapshot is pinned)
        if pages == 1:
            await api.RecordEvent(event_request(project_id, payload={"late": True}))
        token = page.next_page_token
        if not token:
            break
    assert pages == 3
    assert sorted(e.id for e in seen) == sorted(e.id for e in created)
    keys = [(e.occurred_at.ToDatetime(), e.id) for e in seen]
    assert keys == sorted(keys, reverse=True)


# --- facts -----------------------------------------------------------------------------------


async def test_assert_fact_derives_statement_and_defaults(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str, embedder
) -> None:
    reply = await stub(channel).AssertFact(
        fact_request(project_id, predicate="invoice_language", value={"language": "fr"})
    )
    fact = reply.fact
    assert reply.created
    assert fact.statement == derive_statement("invoice_language", {"language": "fr"})
    assert fact.statement == "invoice language: language = fr"
    assert fact.confidence == 1.0
    assert fact.status == memory_pb2.FACT_STATUS_ACTIVE
    assert fact.HasField("recorded_from") and not fact.HasField("recorded_to")
    assert not fact.HasField("valid_from") and not fact.HasField("valid_to")
    assert not fact.HasField("stale_after")
    assert json_format.MessageToDict(fact.value) == {"language": "fr"}

    (row,) = await query(
        pg_dsn, "SELECT embedding, embedding_model FROM facts WHERE id = %s", fact.id
    )
    assert row[1] == embedder.model_id
    assert float(np.dot(row[0].to_numpy(), embedder.embed([fact.statement])[0])) > 0.999


async def test_assert_fact_keeps_every_field(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str, embedder
) -> None:
    api = stub(channel)
    event = (await api.RecordEvent(event_request(project_id))).event
    valid_from = datetime(2024, 1, 1, tzinfo=UTC)
    valid_to = datetime(2030, 1, 1, tzinfo=UTC)
    reply = await api.AssertFact(
        fact_request(
            project_id,
            predicate="home.city",
            value="Lisbon",
            statement="Caroline lives in Lisbon",
            confidence=0.0,
            valid_from=ts(valid_from),
            valid_to=ts(valid_to),
            source_event_ids=[event.id, event.id],
            stale_after=duration_pb2.Duration(seconds=86400 * 30),
        )
    )
    fact = reply.fact
    assert fact.statement == "Caroline lives in Lisbon"
    assert fact.confidence == 0.0  # explicitly set: not the default
    assert fact.valid_from.ToDatetime(tzinfo=UTC) == valid_from
    assert fact.valid_to.ToDatetime(tzinfo=UTC) == valid_to
    assert list(fact.source_event_ids) == [event.id]
    assert fact.stale_after.ToTimedelta() == timedelta(days=30)
    assert json_format.MessageToDict(fact.value) == "Lisbon"
    (row,) = await query(pg_dsn, "SELECT embedding FROM facts WHERE id = %s", fact.id)
    assert float(np.dot(row[0].to_numpy(), embedder.embed(["Caroline lives in Lisbon"])[0])) > 0.999


async def test_assert_fact_same_predicate_twice_keeps_both_active(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    await api.AssertFact(fact_request(project_id, value="fr"))
    await api.AssertFact(fact_request(project_id, value="en"))
    listed = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1")
    )
    assert [json_format.MessageToDict(f.value) for f in listed.facts] == ["fr", "en"]


async def test_assert_fact_idempotency(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    first = await api.AssertFact(fact_request(project_id, idempotency_key="k1", value="fr"))
    again = await api.AssertFact(fact_request(project_id, idempotency_key="k1", value="de"))
    assert first.created and not again.created and again.fact == first.fact
    assert (await row_counts(pg_dsn, project_id))["facts"] == 1


async def test_concurrent_assert_fact_same_key_writes_one_row(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    old = (await api.AssertFact(fact_request(project_id, value="old"))).fact
    replies = await asyncio.gather(
        *(
            api.AssertFact(
                fact_request(
                    project_id,
                    idempotency_key="same",
                    value=f"v{i}",
                    supersedes_fact_ids=[old.id],
                )
            )
            for i in range(8)
        )
    )
    assert len({r.fact.id for r in replies}) == 1
    assert sum(r.created for r in replies) == 1
    counts = await row_counts(pg_dsn, project_id)
    assert counts["facts"] == 2 and counts["active"] == 1


async def test_supersedes_fact_ids_supersede_in_the_same_transaction(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    old = (await api.AssertFact(fact_request(project_id, value="fr"))).fact
    new = await api.AssertFact(fact_request(project_id, value="en", supersedes_fact_ids=[old.id]))
    new_fact = new.fact
    listed = await api.ListFacts(
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-1", include_inactive=True
        )
    )
    by_id = {f.id: f for f in listed.facts}
    superseded = by_id[old.id]
    assert superseded.status == memory_pb2.FACT_STATUS_SUPERSEDED
    assert superseded.superseded_by == new_fact.id
    # no valid_from on the successor: the old fact's validity ends when it was superseded
    assert superseded.valid_to == new_fact.recorded_from
    assert not superseded.HasField("recorded_to")  # history kept
    assert by_id[new_fact.id].status == memory_pb2.FACT_STATUS_ACTIVE
    current = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1")
    )
    assert [f.id for f in current.facts] == [new_fact.id]


async def test_supersede_with_successor_valid_from_closes_at_it(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    moved = datetime(2024, 6, 1, tzinfo=UTC)
    old = (await api.AssertFact(fact_request(project_id, value="Paris", valid_from=ts(start)))).fact
    reply = await api.AssertFact(
        fact_request(project_id, value="Lyon", valid_from=ts(moved), supersedes_fact_ids=[old.id])
    )
    listed = await api.ListFacts(
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-1", include_inactive=True
        )
    )
    superseded = next(f for f in listed.facts if f.id == old.id)
    assert superseded.valid_to.ToDatetime(tzinfo=UTC) == moved
    assert superseded.superseded_by == reply.fact.id


async def test_supersede_fact_rpc(channel: grpc.aio.Channel, project_id: str) -> None:
    api = stub(channel)
    a = (await api.AssertFact(fact_request(project_id, value="a"))).fact
    b = (await api.AssertFact(fact_request(project_id, value="b"))).fact
    other_subject = (await api.AssertFact(fact_request(project_id, "user-2", value="c"))).fact
    reply = await api.SupersedeFact(
        memory_pb2.SupersedeFactRequest(
            project_id=project_id, fact_id=a.id, superseded_by_fact_id=b.id
        )
    )
    assert reply.fact.id == a.id
    assert reply.fact.status == memory_pb2.FACT_STATUS_SUPERSEDED
    assert reply.fact.superseded_by == b.id
    assert reply.fact.HasField("valid_to")

    def supersede(fact_id: str, by: str, project: str = project_id) -> Awaitable[Any]:
        return api.SupersedeFact(
            memory_pb2.SupersedeFactRequest(
                project_id=project, fact_id=fact_id, superseded_by_fact_id=by
            )
        )

    code, violations, _ = await expect_error(supersede(a.id, b.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and fields_of(violations) == ["fact_id"]
    code, violations, _ = await expect_error(supersede(b.id, a.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert fields_of(violations) == ["superseded_by_fact_id"]
    code, violations, _ = await expect_error(supersede(b.id, other_subject.id))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields_of(violations) == ["superseded_by_fact_id"]
    code, violations, _ = await expect_error(supersede(b.id, str(uuid.uuid4())))
    assert code == grpc.StatusCode.NOT_FOUND and fields_of(violations) == ["superseded_by_fact_id"]
    code, violations, _ = await expect_error(supersede(b.id, other_subject.id, "other-project"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert fields_of(violations) == ["fact_id", "superseded_by_fact_id"]
    code, violations, _ = await expect_error(supersede(b.id, b.id))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields_of(violations) == ["superseded_by_fact_id"]


async def test_retire_fact(channel: grpc.aio.Channel, project_id: str) -> None:
    api = stub(channel)
    fact = (await api.AssertFact(fact_request(project_id))).fact
    reply = await api.RetireFact(
        memory_pb2.RetireFactRequest(project_id=project_id, fact_id=fact.id, reason="user said so")
    )
    retired = reply.fact
    assert retired.status == memory_pb2.FACT_STATUS_RETIRED
    assert retired.status_reason == "user said so"
    assert retired.recorded_to.ToDatetime() > retired.recorded_from.ToDatetime()
    current = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1")
    )
    assert list(current.facts) == []
    history = await api.ListFacts(
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-1", include_inactive=True
        )
    )
    assert [f.id for f in history.facts] == [fact.id]

    code, violations, reason = await expect_error(
        api.RetireFact(memory_pb2.RetireFactRequest(project_id=project_id, fact_id=fact.id))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and fields_of(violations) == ["fact_id"]
    assert reason == "FACT_NOT_ACTIVE"
    code, violations, _ = await expect_error(
        api.RetireFact(
            memory_pb2.RetireFactRequest(project_id=project_id, fact_id=str(uuid.uuid4()))
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND and fields_of(violations) == ["fact_id"]
    code, _, _ = await expect_error(
        api.RetireFact(memory_pb2.RetireFactRequest(project_id="someone-else", fact_id=fact.id))
    )
    assert code == grpc.StatusCode.NOT_FOUND


async def test_list_facts_pages(channel: grpc.aio.Channel, project_id: str) -> None:
    api = stub(channel)
    batch = memory_pb2.BatchAssertFactsRequest(
        requests=[fact_request(project_id, predicate=f"p{i}", value=i) for i in range(25)]
    )
    created = (await api.BatchAssertFacts(batch)).facts
    request = memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1", page_size=10)
    pages: list[list[str]] = []
    while True:
        page = await api.ListFacts(request)
        pages.append([f.id for f in page.facts])
        if len(pages) == 1:  # asserted while paging: not in this listing's snapshot
            await api.AssertFact(fact_request(project_id, predicate="late"))
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert [len(p) for p in pages] == [10, 10, 5]
    listed = [fid for page in pages for fid in page]
    assert sorted(listed) == sorted(f.id for f in created)
    # one batch shares recorded_from: the order is by id within it
    assert listed == sorted(listed, key=uuid.UUID)
    everything = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1", page_size=5000)
    )
    assert len(everything.facts) == 26 and not everything.next_page_token
    default = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1")
    )
    assert len(default.facts) == 26


def _forged_tokens(issued: str) -> list[str]:
    """Tokens the server did not issue: the issued one altered, unsigned documents (one nested
    deeper than any JSON parser recursion), and one too long to read."""
    document, _, tag = issued.partition(".")
    raw = base64.urlsafe_b64decode(document + "=" * (-len(document) % 4))
    later = raw.replace(b'"k":["', b'"k":["9')  # the same listing, another position

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    return [
        f"{b64(later)}.{tag}",
        b64(raw),
        f"{b64(raw)}.{b64(bytes(16))}",
        f"{b64(b'[' * 50_000 + b']' * 50_000)}.{tag}",
        b64(b"[" * 300 + b"]" * 300),
        issued + "A" * 600,
    ]


async def test_page_token_is_bound_to_its_listing(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    await api.BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(
            requests=[fact_request(project_id, value=i) for i in range(3)]
        )
    )
    page = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1", page_size=1)
    )
    assert page.next_page_token
    for request in (
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-2", page_token=page.next_page_token
        ),
        memory_pb2.ListFactsRequest(
            project_id=project_id,
            subject_id="user-1",
            include_inactive=True,
            page_token=page.next_page_token,
        ),
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-1", page_token="not a token"
        ),
        *(
            memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1", page_token=t)
            for t in _forged_tokens(page.next_page_token)
        ),
    ):
        code, violations, _ = await expect_error(api.ListFacts(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert fields_of(violations) == ["page_token"]
    code, violations, _ = await expect_error(
        api.ListEvents(
            memory_pb2.ListEventsRequest(
                project_id=project_id, subject_id="user-1", page_token=page.next_page_token
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["page_token"]
    code, violations, _ = await expect_error(
        api.ListFacts(
            memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1", page_size=-1)
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["page_size"]


# --- conflicts -------------------------------------------------------------------------------


async def _open_conflicts(api: Any, project_id: str, count: int) -> list[str]:
    """Open `count` conflicts of two fresh facts each, one after the other; their ids in order."""
    batch = memory_pb2.BatchAssertFactsRequest(
        requests=[fact_request(project_id, predicate="city", value=i) for i in range(2 * count)]
    )
    facts = [f.id for f in (await api.BatchAssertFacts(batch)).facts]
    opened = []
    for i in range(count):
        request = memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id="user-1", fact_ids=facts[2 * i : 2 * i + 2]
        )
        opened.append((await api.OpenConflict(request)).conflict.id)
    return opened


async def test_list_conflicts_pages(channel: grpc.aio.Channel, project_id: str) -> None:
    api = stub(channel)
    opened = await _open_conflicts(api, project_id, 7)
    request = memory_pb2.ListConflictsRequest(
        project_id=project_id, subject_id="user-1", page_size=3
    )
    pages: list[list[memory_pb2.Conflict]] = []
    while True:
        page = await api.ListConflicts(request)
        pages.append(list(page.conflicts))
        if len(pages) == 1:  # opened while paging: newer than the first page, never listed later
            (late,) = await _open_conflicts(api, project_id, 1)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert [len(p) for p in pages] == [3, 3, 1]
    listed = [c for p in pages for c in p]
    assert [c.id for c in listed] == opened[::-1], "newest opened_at first, each once"
    keys = [(c.opened_at.ToDatetime(), uuid.UUID(c.id)) for c in listed]
    assert keys == sorted(keys, reverse=True)

    await api.ResolveConflict(
        memory_pb2.ResolveConflictRequest(
            project_id=project_id,
            conflict_id=opened[0],
            winning_fact_id=listed[-1].fact_ids[0],
        )
    )
    everything = await api.ListConflicts(
        memory_pb2.ListConflictsRequest(
            project_id=project_id, subject_id="user-1", include_resolved=True, page_size=5000
        )
    )
    assert [c.id for c in everything.conflicts] == [late, *opened[::-1]]
    assert not everything.next_page_token
    default = await api.ListConflicts(
        memory_pb2.ListConflictsRequest(project_id=project_id, subject_id="user-1")
    )
    assert [c.id for c in default.conflicts] == [late, *opened[:0:-1]], "open ones only"
    assert not default.next_page_token


async def test_list_conflicts_refuses_bad_page_tokens_and_sizes(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    await _open_conflicts(api, project_id, 2)
    page = await api.ListConflicts(
        memory_pb2.ListConflictsRequest(project_id=project_id, subject_id="user-1", page_size=1)
    )
    assert len(page.conflicts) == 1 and page.next_page_token
    facts = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1", page_size=1)
    )
    for request in (
        memory_pb2.ListConflictsRequest(
            project_id=project_id,
            subject_id="user-1",
            include_resolved=True,
            page_token=page.next_page_token,
        ),
        memory_pb2.ListConflictsRequest(
            project_id=project_id, subject_id="user-2", page_token=page.next_page_token
        ),
        memory_pb2.ListConflictsRequest(
            project_id=project_id, subject_id="user-1", page_token=facts.next_page_token
        ),
        *(
            memory_pb2.ListConflictsRequest(
                project_id=project_id, subject_id="user-1", page_token=token
            )
            for token in ["not a token", *_forged_tokens(page.next_page_token)]
        ),
    ):
        code, violations, _ = await expect_error(api.ListConflicts(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert fields_of(violations) == ["page_token"], request
    code, violations, _ = await expect_error(
        api.ListConflicts(
            memory_pb2.ListConflictsRequest(
                project_id=project_id, subject_id="user-1", page_size=-1
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["page_size"]


async def test_conflict_lifecycle(channel: grpc.aio.Channel, project_id: str, pg_dsn: str) -> None:
    api = stub(channel)
    paris = (await api.AssertFact(fact_request(project_id, predicate="city", value="Paris"))).fact
    lyon = (await api.AssertFact(fact_request(project_id, predicate="city", value="Lyon"))).fact
    nice = (await api.AssertFact(fact_request(project_id, predicate="city", value="Nice"))).fact

    opened = (
        await api.OpenConflict(
            memory_pb2.OpenConflictRequest(
                project_id=project_id,
                subject_id="user-1",
                fact_ids=[paris.id, lyon.id, nice.id, lyon.id],
                note="three cities",
            )
        )
    ).conflict
    assert opened.status == memory_pb2.CONFLICT_STATUS_OPEN
    assert sorted(opened.fact_ids) == sorted([paris.id, lyon.id, nice.id])
    assert opened.note == "three cities" and opened.HasField("opened_at")
    assert not opened.HasField("resolved_at") and not opened.winning_fact_id

    listed = await api.ListConflicts(
        memory_pb2.ListConflictsRequest(project_id=project_id, subject_id="user-1")
    )
    assert [c.id for c in listed.conflicts] == [opened.id]

    # a fact already in an open conflict cannot join another
    fourth = (await api.AssertFact(fact_request(project_id, predicate="city", value="Oslo"))).fact
    code, violations, _ = await expect_error(
        api.OpenConflict(
            memory_pb2.OpenConflictRequest(
                project_id=project_id, subject_id="user-1", fact_ids=[fourth.id, nice.id]
            )
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and fields_of(violations) == ["fact_ids[1]"]
    assert (await row_counts(pg_dsn, project_id))["conflicts"] == 1

    # the winner must be a member
    code, violations, _ = await expect_error(
        api.ResolveConflict(
            memory_pb2.ResolveConflictRequest(
                project_id=project_id, conflict_id=opened.id, winning_fact_id=fourth.id
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["winning_fact_id"]

    resolved = (
        await api.ResolveConflict(
            memory_pb2.ResolveConflictRequest(
                project_id=project_id, conflict_id=opened.id, winning_fact_id=lyon.id
            )
        )
    ).conflict
    assert resolved.status == memory_pb2.CONFLICT_STATUS_RESOLVED
    assert resolved.winning_fact_id == lyon.id and resolved.HasField("resolved_at")

    facts = await api.ListFacts(
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-1", include_inactive=True
        )
    )
    by_id = {f.id: f for f in facts.facts}
    assert by_id[lyon.id].status == memory_pb2.FACT_STATUS_ACTIVE
    for loser in (paris, nice):
        assert by_id[loser.id].status == memory_pb2.FACT_STATUS_SUPERSEDED
        assert by_id[loser.id].superseded_by == lyon.id
        assert by_id[loser.id].HasField("valid_to")
        assert opened.id in by_id[loser.id].status_reason

    assert not (
        await api.ListConflicts(
            memory_pb2.ListConflictsRequest(project_id=project_id, subject_id="user-1")
        )
    ).conflicts
    everything = await api.ListConflicts(
        memory_pb2.ListConflictsRequest(
            project_id=project_id, subject_id="user-1", include_resolved=True
        )
    )
    assert [c.id for c in everything.conflicts] == [opened.id]

    code, violations, _ = await expect_error(
        api.ResolveConflict(
            memory_pb2.ResolveConflictRequest(
                project_id=project_id, conflict_id=opened.id, winning_fact_id=lyon.id
            )
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION and fields_of(violations) == ["conflict_id"]
    code, violations, _ = await expect_error(
        api.ResolveConflict(
            memory_pb2.ResolveConflictRequest(
                project_id=project_id, conflict_id=str(uuid.uuid4()), winning_fact_id=lyon.id
            )
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND and fields_of(violations) == ["conflict_id"]

    # after resolution, the facts are free to be in a new conflict (superseded ones are not)
    again = await api.OpenConflict(
        memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id="user-1", fact_ids=[lyon.id, fourth.id]
        )
    )
    assert again.conflict.status == memory_pb2.CONFLICT_STATUS_OPEN
    code, violations, _ = await expect_error(
        api.OpenConflict(
            memory_pb2.OpenConflictRequest(
                project_id=project_id, subject_id="user-1", fact_ids=[paris.id, nice.id]
            )
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert fields_of(violations) == ["fact_ids[0]", "fact_ids[1]"]


async def test_open_conflict_checks(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    a = (await api.AssertFact(fact_request(project_id, value="a"))).fact
    b = (await api.AssertFact(fact_request(project_id, "user-2", value="b"))).fact

    def open_(*ids: str, subject: str = "user-1") -> Awaitable[Any]:
        return api.OpenConflict(
            memory_pb2.OpenConflictRequest(project_id=project_id, subject_id=subject, fact_ids=ids)
        )

    code, violations, _ = await expect_error(open_(a.id))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["fact_ids"]
    code, violations, _ = await expect_error(open_(a.id, a.id))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["fact_ids"]
    code, violations, _ = await expect_error(open_(a.id, b.id))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["fact_ids[1]"]
    code, violations, _ = await expect_error(open_(a.id, str(uuid.uuid4())))
    assert code == grpc.StatusCode.NOT_FOUND and fields_of(violations) == ["fact_ids[1]"]
    code, violations, _ = await expect_error(open_(a.id, ""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["fact_ids[1]"]
    assert (await row_counts(pg_dsn, project_id))["conflicts"] == 0


async def test_concurrent_open_conflicts_on_one_fact_open_one(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    facts = (
        await api.BatchAssertFacts(
            memory_pb2.BatchAssertFactsRequest(
                requests=[fact_request(project_id, value=i) for i in range(5)]
            )
        )
    ).facts
    shared = facts[0].id
    calls = [
        api.OpenConflict(
            memory_pb2.OpenConflictRequest(
                project_id=project_id, subject_id="user-1", fact_ids=[shared, f.id]
            )
        )
        for f in facts[1:]
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    ok = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(ok) == 1 and len(failed) == 3
    assert {e.code() for e in failed} == {grpc.StatusCode.FAILED_PRECONDITION}
    assert (await row_counts(pg_dsn, project_id))["open"] == 1


# --- batches ---------------------------------------------------------------------------------


async def test_batch_record_events_in_order_with_idempotency(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str, embedder
) -> None:
    api = stub(channel)
    known = (await api.RecordEvent(event_request(project_id, idempotency_key="known"))).event
    requests = [
        event_request(
            project_id,
            payload={"text": f"message number {i} " + "and more " * (i % 7)},
            idempotency_key=f"k{i}",
        )
        for i in range(70)  # more than two embedding batches of 32, of varied lengths
    ]
    requests[5] = event_request(project_id, idempotency_key="known", payload={"text": "new?"})
    requests[9] = event_request(project_id, idempotency_key="k3", payload={"text": "dup"})
    reply = await api.BatchRecordEvents(memory_pb2.BatchRecordEventsRequest(requests=requests))
    events = reply.events
    assert len(events) == 70
    assert events[5] == known
    assert events[9] == events[3]
    assert [e.text for i, e in enumerate(events) if i not in (5, 9)] == [
        f"message number {i} " + "and more " * (i % 7) for i in range(70) if i not in (5, 9)
    ]
    assert (await row_counts(pg_dsn, project_id))["events"] == 1 + 68
    # every row holds the vector of its own text (the server batches texts by length)
    rows = await query(
        pg_dsn, "SELECT id::text, text, embedding FROM events WHERE project_id = %s", project_id
    )
    assert len(rows) == 69
    expected = embedder.embed([text for _, text, _ in rows])
    for (event_id, _, vector), wanted in zip(rows, expected, strict=True):
        assert float(np.dot(vector.to_numpy(), wanted)) > 0.999, event_id
    # the same batch again writes nothing
    again = await api.BatchRecordEvents(memory_pb2.BatchRecordEventsRequest(requests=requests))
    assert list(again.events) == list(events)
    assert (await row_counts(pg_dsn, project_id))["events"] == 69


async def test_batch_assert_facts_reference_earlier_events(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    events = (
        await api.BatchRecordEvents(
            memory_pb2.BatchRecordEventsRequest(
                requests=[event_request(project_id, payload={"text": f"m{i}"}) for i in range(3)]
            )
        )
    ).events
    old = (await api.AssertFact(fact_request(project_id, predicate="city", value="Paris"))).fact
    reply = await api.BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(
            requests=[
                fact_request(
                    project_id,
                    predicate="city",
                    value="Lyon",
                    source_event_ids=[events[0].id],
                    supersedes_fact_ids=[old.id],
                ),
                fact_request(
                    project_id,
                    predicate="pet",
                    value="cat",
                    source_event_ids=[events[1].id, events[2].id],
                    idempotency_key="pet",
                ),
                fact_request(project_id, predicate="pet", value="dog", idempotency_key="pet"),
            ]
        )
    )
    facts = reply.facts
    assert [json_format.MessageToDict(f.value) for f in facts] == ["Lyon", "cat", "cat"]
    assert facts[1] == facts[2]
    assert list(facts[1].source_event_ids) == [events[1].id, events[2].id]
    counts = await row_counts(pg_dsn, project_id)
    assert counts == {"events": 3, "facts": 3, "active": 2, "conflicts": 0, "open": 0}


async def test_failed_batch_writes_nothing(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    old = (await api.AssertFact(fact_request(project_id, predicate="city", value="Paris"))).fact
    before = await row_counts(pg_dsn, project_id)
    requests = [fact_request(project_id, predicate=f"p{i}", value=i) for i in range(40)]
    requests[0] = fact_request(project_id, value="Lyon", supersedes_fact_ids=[old.id])
    requests[33] = fact_request(project_id, value="x", source_event_ids=[str(uuid.uuid4())])
    code, violations, _ = await expect_error(
        api.BatchAssertFacts(memory_pb2.BatchAssertFactsRequest(requests=requests))
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert fields_of(violations) == ["requests[33].source_event_ids[0]"]
    assert await row_counts(pg_dsn, project_id) == before  # old is still active too

    requests[33] = fact_request(project_id, value="x", confidence=2.0)
    requests[12] = fact_request(project_id, predicate="")
    code, violations, _ = await expect_error(
        api.BatchAssertFacts(memory_pb2.BatchAssertFactsRequest(requests=requests))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields_of(violations) == ["requests[12].predicate", "requests[33].confidence"]
    events = [event_request(project_id) for _ in range(3)]
    events[2] = event_request(project_id, kind="bad\x07kind")
    code, violations, _ = await expect_error(
        api.BatchRecordEvents(memory_pb2.BatchRecordEventsRequest(requests=events))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == [
        "requests[2].kind"
    ]
    assert await row_counts(pg_dsn, project_id) == before


async def test_batch_size_limits(channel: grpc.aio.Channel, project_id: str) -> None:
    api = stub(channel)
    for call in (
        api.BatchRecordEvents(memory_pb2.BatchRecordEventsRequest()),
        api.BatchAssertFacts(memory_pb2.BatchAssertFactsRequest()),
        api.BatchRecordEvents(
            memory_pb2.BatchRecordEventsRequest(requests=[event_request(project_id)] * 1001)
        ),
        api.BatchAssertFacts(
            memory_pb2.BatchAssertFactsRequest(requests=[fact_request(project_id)] * 1001)
        ),
    ):
        code, violations, _ = await expect_error(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and fields_of(violations) == ["requests"]


async def test_concurrent_batches_sharing_keys_do_not_deadlock(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    keys = [f"key-{i}" for i in range(10)]
    forward = [event_request(project_id, idempotency_key=k, payload={"k": k}) for k in keys]
    calls = [
        api.BatchRecordEvents(
            memory_pb2.BatchRecordEventsRequest(requests=forward if i % 2 else forward[::-1])
        )
        for i in range(4)
    ]
    replies = await asyncio.gather(*calls)
    ids = [sorted(e.id for e in r.events) for r in replies]
    assert all(i == ids[0] for i in ids)
    assert (await row_counts(pg_dsn, project_id))["events"] == 10


async def test_concurrent_fact_batches_count_shared_words_without_deadlock(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    statements = [f"{a} {b} note" for a in words for b in words if a != b]
    calls = [
        api.BatchAssertFacts(
            memory_pb2.BatchAssertFactsRequest(
                requests=[
                    fact_request(project_id, statement=s)
                    for s in (statements if i % 2 else statements[::-1])[i::4]
                ]
            )
        )
        for i in range(4)
    ]
    await asyncio.gather(*calls)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute(
            "SELECT term, facts FROM fact_term_counts WHERE project_id = %s", (project_id,)
        )
        counts = dict(await cur.fetchall())
    # Each word is the first word of 5 statements and the second of 5 others.
    assert counts == {**{w: 10 for w in words}, "note": len(statements)}


async def test_fact_value_numbers_and_payload_round_trip(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    fact = (await api.AssertFact(fact_request(project_id, predicate="age", value=30))).fact
    assert fact.statement == "age: 30"
    assert fact.value.number_value == 30
    fact = (await api.AssertFact(fact_request(project_id, predicate="ratio", value=0.25))).fact
    assert fact.statement == "ratio: 0.25"
    event = (
        await api.RecordEvent(
            memory_pb2.RecordEventRequest(
                project_id=project_id,
                subject_id="user-1",
                kind="note",
                payload=struct({"nested": {"list": [1, "two", None, True]}, "é": "ü"}),
            )
        )
    ).event
    assert json_format.MessageToDict(event.payload) == {
        "nested": {"list": [1, "two", None, True]},
        "é": "ü",
    }
    assert not math.isnan(event.occurred_at.seconds)
