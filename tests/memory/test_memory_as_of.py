"""ListFacts and ListEvents as of an instant: what was valid (or had occurred) then, as
recorded then."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf import json_format, timestamp_pb2
from helpers.memory import event_request, fact_request, stub

from satchel.v1 import memory_pb2, memory_pb2_grpc

MICRO = timedelta(microseconds=1)


def ts(moment: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(moment)
    return message


def when(message: timestamp_pb2.Timestamp) -> datetime:
    return message.ToDatetime(tzinfo=UTC)


async def values_as_of(
    api: memory_pb2_grpc.MemoryServiceStub,
    project_id: str,
    at: datetime | None,
    *,
    include_inactive: bool = False,
) -> list[object]:
    request = memory_pb2.ListFactsRequest(
        project_id=project_id, subject_id="user-1", include_inactive=include_inactive
    )
    if at is not None:
        request.as_of.CopyFrom(ts(at))
    reply = await api.ListFacts(request)
    return [json_format.MessageToDict(f.value) for f in reply.facts]


async def test_as_of_follows_supersession_and_retirement(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    paris = (await api.AssertFact(fact_request(project_id, predicate="city", value="Paris"))).fact
    t1 = when(paris.recorded_from)
    await asyncio.sleep(0.05)
    lyon = (
        await api.AssertFact(
            fact_request(project_id, predicate="city", value="Lyon", supersedes_fact_ids=[paris.id])
        )
    ).fact
    t2 = when(lyon.recorded_from)
    await asyncio.sleep(0.05)
    # Backdated successor: Nice is valid from shortly after t2, but only recorded at t3.
    nice_from = t2 + timedelta(milliseconds=10)
    nice = (
        await api.AssertFact(
            fact_request(
                project_id,
                predicate="city",
                value="Nice",
                valid_from=ts(nice_from),
                supersedes_fact_ids=[lyon.id],
            )
        )
    ).fact
    t3 = when(nice.recorded_from)
    assert t1 < t2 < nice_from < t3
    await asyncio.sleep(0.05)
    retired = (
        await api.RetireFact(
            memory_pb2.RetireFactRequest(project_id=project_id, fact_id=nice.id, reason="moved")
        )
    ).fact
    t4 = when(retired.recorded_to)

    assert await values_as_of(api, project_id, t1 - MICRO) == []
    assert await values_as_of(api, project_id, t1) == ["Paris"]
    assert await values_as_of(api, project_id, t2 - MICRO) == ["Paris"]
    assert await values_as_of(api, project_id, t2) == ["Lyon"]
    # Between Nice's valid_from and its recording, the record still said Lyon (valid_to open):
    # as recorded then, Lyon; today's record closes Lyon at nice_from.
    assert await values_as_of(api, project_id, nice_from + MICRO) == ["Lyon"]
    assert await values_as_of(api, project_id, t3 - MICRO) == ["Lyon"]
    assert await values_as_of(api, project_id, t3) == ["Nice"]
    assert await values_as_of(api, project_id, t4 - MICRO) == ["Nice"]
    assert await values_as_of(api, project_id, t4) == []
    assert await values_as_of(api, project_id, None) == []

    assert await values_as_of(api, project_id, t2 - MICRO, include_inactive=True) == ["Paris"]
    assert await values_as_of(api, project_id, t3, include_inactive=True) == [
        "Paris",
        "Lyon",
        "Nice",
    ]
    history = await api.ListFacts(
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-1", include_inactive=True
        )
    )
    by_value = {json_format.MessageToDict(f.value): f for f in history.facts}
    assert when(by_value["Paris"].valid_to) == t2
    assert when(by_value["Lyon"].valid_to) == nice_from
    assert by_value["Nice"].status == memory_pb2.FACT_STATUS_RETIRED


async def test_as_of_uses_validity_windows(channel: grpc.aio.Channel, project_id: str) -> None:
    api = stub(channel)
    expired = (
        await api.AssertFact(
            fact_request(
                project_id,
                value="expired",
                valid_from=ts(datetime(2020, 1, 1, tzinfo=UTC)),
                valid_to=ts(datetime(2021, 1, 1, tzinfo=UTC)),
            )
        )
    ).fact
    recorded = when(expired.recorded_from)
    future_from = recorded + timedelta(days=30)
    await api.AssertFact(fact_request(project_id, value="future", valid_from=ts(future_from)))
    await api.AssertFact(
        fact_request(
            project_id,
            value="until-next-week",
            valid_to=ts(recorded + timedelta(days=7)),
        )
    )
    # Valid in 2020, but not recorded before today: as recorded then, nothing was known.
    assert await values_as_of(api, project_id, datetime(2020, 6, 1, tzinfo=UTC)) == []
    assert await values_as_of(api, project_id, None) == ["until-next-week"]
    assert await values_as_of(api, project_id, None, include_inactive=True) == [
        "expired",
        "future",
        "until-next-week",
    ]
    assert await values_as_of(api, project_id, recorded + timedelta(days=10)) == []
    assert await values_as_of(api, project_id, future_from) == ["future"]


async def test_successor_valid_before_the_old_fact_leaves_it_never_valid(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    june = datetime(2024, 6, 1, tzinfo=UTC)
    january = datetime(2024, 1, 1, tzinfo=UTC)
    old = (await api.AssertFact(fact_request(project_id, value="June", valid_from=ts(june)))).fact
    new = (
        await api.AssertFact(
            fact_request(
                project_id, value="January", valid_from=ts(january), supersedes_fact_ids=[old.id]
            )
        )
    ).fact
    history = await api.ListFacts(
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id="user-1", include_inactive=True
        )
    )
    superseded = next(f for f in history.facts if f.id == old.id)
    assert superseded.valid_to == superseded.valid_from  # empty interval: never valid
    assert superseded.superseded_by == new.id
    assert await values_as_of(api, project_id, None) == ["January"]
    # before the supersession the record held June, valid from June on
    assert await values_as_of(api, project_id, when(new.recorded_from) - MICRO) == ["June"]


async def test_as_of_pages_keep_their_instant(channel: grpc.aio.Channel, project_id: str) -> None:
    api = stub(channel)
    first = (
        await api.BatchAssertFacts(
            memory_pb2.BatchAssertFactsRequest(
                requests=[fact_request(project_id, value=i) for i in range(5)]
            )
        )
    ).facts
    at = when(first[0].recorded_from)
    await api.AssertFact(fact_request(project_id, value="later"))
    request = memory_pb2.ListFactsRequest(
        project_id=project_id, subject_id="user-1", page_size=2, as_of=ts(at)
    )
    seen: list[str] = []
    while True:
        page = await api.ListFacts(request)
        seen.extend(f.id for f in page.facts)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    assert sorted(seen) == sorted(f.id for f in first)
    request.page_token = ""
    request.as_of.CopyFrom(ts(at + MICRO))
    page = await api.ListFacts(request)
    request.page_token = page.next_page_token
    request.as_of.CopyFrom(ts(at))
    try:
        await api.ListFacts(request)
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    else:
        raise AssertionError("a token used with another as_of must be refused")


async def test_events_as_of_had_occurred_and_were_recorded_by_then(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    now = datetime.now(UTC)

    async def record(text: str, occurred_at: datetime) -> memory_pb2.Event:
        request = event_request(project_id, payload={"text": text}, occurred_at=ts(occurred_at))
        return (await api.RecordEvent(request)).event

    yesterday = await record("yesterday", now - timedelta(days=1))
    listed_at = when(yesterday.recorded_at)
    await asyncio.sleep(0.05)
    # Recorded after `listed_at`, although it happened two days ago; and one still to come.
    await record("two days ago, told late", now - timedelta(days=2))
    await record("tomorrow", now + timedelta(days=1))

    async def texts(at: datetime | None, page_size: int = 0) -> list[str]:
        request = memory_pb2.ListEventsRequest(
            project_id=project_id, subject_id="user-1", page_size=page_size
        )
        if at is not None:
            request.as_of.CopyFrom(ts(at))
        seen: list[str] = []
        while True:
            page = await api.ListEvents(request)
            seen += [json_format.MessageToDict(e.payload)["text"] for e in page.events]
            if not page.next_page_token:
                return seen
            request.page_token = page.next_page_token

    assert await texts(listed_at) == ["yesterday"]
    assert await texts(listed_at - MICRO) == []
    assert await texts(datetime.now(UTC)) == ["yesterday", "two days ago, told late"]
    assert await texts(None) == ["tomorrow", "yesterday", "two days ago, told late"]
    later = datetime.now(UTC)
    assert await texts(later, page_size=1) == ["yesterday", "two days ago, told late"]

    first = await api.ListEvents(
        memory_pb2.ListEventsRequest(
            project_id=project_id, subject_id="user-1", page_size=1, as_of=ts(later)
        )
    )
    assert first.next_page_token
    other_instant = memory_pb2.ListEventsRequest(
        project_id=project_id,
        subject_id="user-1",
        page_size=1,
        as_of=ts(later + MICRO),
        page_token=first.next_page_token,
    )
    try:
        await api.ListEvents(other_instant)
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    else:
        raise AssertionError("a token used with another as_of must be refused")
