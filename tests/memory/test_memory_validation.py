"""Every bad input of the write path gets a precise error: code, BadRequest field path, and no
row written. Never INTERNAL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from helpers.memory import (
    error_details,
    event_request,
    expect_error,
    fact_request,
    fields_of,
    row_counts,
    stub,
)

from satchel.server.platform.api.decoding import invalid_utf8_paths
from satchel.server.platform.api.validation import MAX_PAYLOAD_BYTES
from satchel.v1 import memory_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def big_payload() -> dict[str, Any]:
    return {"text": "x" * (MAX_PAYLOAD_BYTES + 1)}


def nan_value() -> struct_pb2.Value:
    return struct_pb2.Value(number_value=float("nan"))


EVENT_CASES: list[tuple[str, Callable[[str], memory_pb2.RecordEventRequest], list[str]]] = [
    ("empty project", lambda p: event_request(""), ["project_id"]),
    ("empty subject", lambda p: event_request(p, ""), ["subject_id"]),
    ("empty kind", lambda p: event_request(p, kind=""), ["kind"]),
    ("control char in kind", lambda p: event_request(p, kind="a\x00b"), ["kind"]),
    ("spaces around subject", lambda p: event_request(p, " u "), ["subject_id"]),
    ("long id", lambda p: event_request(p, "u" * 201), ["subject_id"]),
    (
        "control char in key",
        lambda p: event_request(p, idempotency_key="k\x1b"),
        ["idempotency_key"],
    ),
    ("payload too big", lambda p: event_request(p, payload=big_payload()), ["payload"]),
    (
        "control char in payload text",
        lambda p: event_request(p, payload={"text": "bell\x07"}),
        ["payload.text"],
    ),
    (
        "control char in nested payload",
        lambda p: event_request(p, payload={"items": [{"a b": "ok"}, {"x": "\x01"}]}),
        ["payload.items[1].x"],
    ),
    (
        "control char in payload key",
        lambda p: event_request(p, payload={"bad\x02key": 1}),
        ['payload["bad\\u0002key"]'],  # the path escapes what it cannot show
    ),
    (
        "occurred_at out of range",
        lambda p: event_request(p, occurred_at=timestamp_pb2.Timestamp(seconds=10**12)),
        ["occurred_at"],
    ),
    (
        "several at once",
        lambda p: event_request("", "", kind=""),
        ["project_id", "subject_id", "kind"],
    ),
]


@pytest.mark.parametrize(("case", "build", "fields"), EVENT_CASES, ids=[c[0] for c in EVENT_CASES])
async def test_record_event_rejects(
    channel: grpc.aio.Channel,
    project_id: str,
    pg_dsn: str,
    case: str,
    build: Callable[[str], Any],
    fields: list[str],
) -> None:
    code, violations, reason = await expect_error(stub(channel).RecordEvent(build(project_id)))
    assert code == INVALID, violations
    assert fields_of(violations) == fields
    assert reason
    assert (await row_counts(pg_dsn, project_id))["events"] == 0


def payload_nan(p: str) -> memory_pb2.RecordEventRequest:
    request = event_request(p)
    request.payload.fields["n"].number_value = float("inf")
    return request


async def test_record_event_rejects_non_finite_numbers(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    code, violations, _ = await expect_error(stub(channel).RecordEvent(payload_nan(project_id)))
    assert code == INVALID and fields_of(violations) == ["payload.n"]


def _fact(**fields: Any) -> Callable[[str], memory_pb2.AssertFactRequest]:
    return lambda p: fact_request(p, **fields)


FACT_CASES: list[tuple[str, Callable[[str], memory_pb2.AssertFactRequest], list[str]]] = [
    ("empty project", lambda p: fact_request(""), ["project_id"]),
    ("empty subject", lambda p: fact_request(p, ""), ["subject_id"]),
    ("empty predicate", _fact(predicate=""), ["predicate"]),
    ("control char in predicate", _fact(predicate="city\x7f"), ["predicate"]),
    ("confidence above 1", _fact(confidence=1.5), ["confidence"]),
    ("confidence below 0", _fact(confidence=-0.1), ["confidence"]),
    ("confidence NaN", _fact(confidence=float("nan")), ["confidence"]),
    (
        "valid_to equals valid_from",
        _fact(
            valid_from=timestamp_pb2.Timestamp(seconds=1_700_000_000),
            valid_to=timestamp_pb2.Timestamp(seconds=1_700_000_000),
        ),
        ["valid_to"],
    ),
    (
        "valid_to before valid_from",
        _fact(
            valid_from=timestamp_pb2.Timestamp(seconds=1_700_000_000),
            valid_to=timestamp_pb2.Timestamp(seconds=1_600_000_000),
        ),
        ["valid_to"],
    ),
    ("value too big", _fact(value={"text": "x" * (MAX_PAYLOAD_BYTES + 1)}), ["value"]),
    ("control char in value", _fact(value=["ok", "no\x0c"]), ["value[1]"]),
    ("control char in statement", _fact(statement="a\x00b"), ["statement"]),
    ("statement too long", _fact(statement="x" * 32_001), ["statement"]),
    ("empty source id", _fact(source_event_ids=["", str(uuid.uuid4())]), ["source_event_ids[0]"]),
    ("source id not a uuid", _fact(source_event_ids=["evt-1"]), ["source_event_ids[0]"]),
    ("empty superseded id", _fact(supersedes_fact_ids=[""]), ["supersedes_fact_ids[0]"]),
    (
        "negative stale_after",
        _fact(stale_after=duration_pb2.Duration(seconds=-5)),
        ["stale_after"],
    ),
    (
        "mixed-sign stale_after",
        _fact(stale_after=duration_pb2.Duration(seconds=5, nanos=-1)),
        ["stale_after"],
    ),
    (
        "too many source ids",
        _fact(source_event_ids=[str(uuid.uuid4())] * 257),
        ["source_event_ids"],
    ),
]


@pytest.mark.parametrize(("case", "build", "fields"), FACT_CASES, ids=[c[0] for c in FACT_CASES])
async def test_assert_fact_rejects(
    channel: grpc.aio.Channel,
    project_id: str,
    pg_dsn: str,
    case: str,
    build: Callable[[str], Any],
    fields: list[str],
) -> None:
    code, violations, _ = await expect_error(stub(channel).AssertFact(build(project_id)))
    assert code == INVALID, violations
    assert fields_of(violations) == fields
    assert (await row_counts(pg_dsn, project_id))["facts"] == 0


async def test_assert_fact_value_must_be_set_and_finite(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    api = stub(channel)
    unset = memory_pb2.AssertFactRequest(project_id=project_id, subject_id="u", predicate="p")
    code, violations, _ = await expect_error(api.AssertFact(unset))
    assert code == INVALID and fields_of(violations) == ["value"]
    code, violations, _ = await expect_error(
        api.AssertFact(
            memory_pb2.AssertFactRequest(
                project_id=project_id, subject_id="u", predicate="p", value=nan_value()
            )
        )
    )
    assert code == INVALID and fields_of(violations) == ["value"]


async def test_source_events_must_exist_in_the_same_scope(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    mine = (await api.RecordEvent(event_request(project_id))).event
    other_subject = (await api.RecordEvent(event_request(project_id, "user-2"))).event
    other_project = (await api.RecordEvent(event_request(f"{project_id}-x"))).event
    before = await row_counts(pg_dsn, project_id)

    code, violations, reason = await expect_error(
        api.AssertFact(fact_request(project_id, source_event_ids=[mine.id, other_subject.id]))
    )
    assert code == INVALID and fields_of(violations) == ["source_event_ids[1]"]
    assert "another scope" in violations[0][1] and reason == "CROSS_SCOPE_REFERENCE"

    unknown = str(uuid.uuid4())
    code, violations, _ = await expect_error(
        api.AssertFact(fact_request(project_id, source_event_ids=[unknown, mine.id]))
    )
    assert code == NOT_FOUND and fields_of(violations) == ["source_event_ids[0]"]
    assert unknown in violations[0][1]

    # another project's ids are unknown here (no existence leaks across projects)
    code, violations, _ = await expect_error(
        api.AssertFact(fact_request(project_id, source_event_ids=[other_project.id]))
    )
    assert code == NOT_FOUND and fields_of(violations) == ["source_event_ids[0]"]
    assert await row_counts(pg_dsn, project_id) == before


async def test_supersedes_must_be_active_facts_of_the_same_scope(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    active = (await api.AssertFact(fact_request(project_id, value="a"))).fact
    retired = (await api.AssertFact(fact_request(project_id, value="r"))).fact
    await api.RetireFact(memory_pb2.RetireFactRequest(project_id=project_id, fact_id=retired.id))
    elsewhere = (await api.AssertFact(fact_request(project_id, "user-2", value="e"))).fact
    before = await row_counts(pg_dsn, project_id)

    code, violations, _ = await expect_error(
        api.AssertFact(fact_request(project_id, supersedes_fact_ids=[active.id, retired.id]))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert fields_of(violations) == ["supersedes_fact_ids[1]"]
    code, violations, _ = await expect_error(
        api.AssertFact(fact_request(project_id, supersedes_fact_ids=[elsewhere.id]))
    )
    assert code == INVALID and fields_of(violations) == ["supersedes_fact_ids[0]"]
    code, violations, _ = await expect_error(
        api.AssertFact(fact_request(project_id, supersedes_fact_ids=[str(uuid.uuid4())]))
    )
    assert code == NOT_FOUND and fields_of(violations) == ["supersedes_fact_ids[0]"]
    # the failed requests wrote nothing: no new fact, the active one still active
    assert await row_counts(pg_dsn, project_id) == before
    listed = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1")
    )
    assert [f.id for f in listed.facts] == [active.id]


async def test_batch_cannot_supersede_one_fact_twice(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    old = (await api.AssertFact(fact_request(project_id, value="old"))).fact
    before = await row_counts(pg_dsn, project_id)
    code, violations, _ = await expect_error(
        api.BatchAssertFacts(
            memory_pb2.BatchAssertFactsRequest(
                requests=[
                    fact_request(project_id, value="a", supersedes_fact_ids=[old.id]),
                    fact_request(project_id, value="b", supersedes_fact_ids=[old.id]),
                ]
            )
        )
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert fields_of(violations) == ["requests[1].supersedes_fact_ids[0]"]
    assert "requests[0]" in violations[0][1]
    assert await row_counts(pg_dsn, project_id) == before


ID_CASES = [
    (
        "RetireFact",
        memory_pb2.RetireFactRequest(project_id="p", fact_id=""),
        ["fact_id"],
    ),
    (
        "RetireFact",
        memory_pb2.RetireFactRequest(project_id="", fact_id="nope"),
        ["project_id", "fact_id"],
    ),
    (
        "RetireFact",
        memory_pb2.RetireFactRequest(project_id="p", fact_id=str(uuid.uuid4()), reason="\x08"),
        ["reason"],
    ),
    (
        "SupersedeFact",
        memory_pb2.SupersedeFactRequest(project_id="p"),
        ["fact_id", "superseded_by_fact_id"],
    ),
    ("ListFacts", memory_pb2.ListFactsRequest(project_id="p"), ["subject_id"]),
    (
        "ListFacts",
        memory_pb2.ListFactsRequest(
            project_id="p", subject_id="s", as_of=timestamp_pb2.Timestamp(seconds=-(10**12))
        ),
        ["as_of"],
    ),
    ("ListEvents", memory_pb2.ListEventsRequest(subject_id="s"), ["project_id"]),
    (
        "ListEvents",
        memory_pb2.ListEventsRequest(project_id="p", subject_id="s", page_size=-3),
        ["page_size"],
    ),
    ("OpenConflict", memory_pb2.OpenConflictRequest(project_id="p", subject_id="s"), ["fact_ids"]),
    (
        "OpenConflict",
        memory_pb2.OpenConflictRequest(
            project_id="p", subject_id="s", fact_ids=[str(uuid.uuid4())] * 2, note="\x00"
        ),
        ["fact_ids", "note"],
    ),
    (
        "ResolveConflict",
        memory_pb2.ResolveConflictRequest(project_id="p", conflict_id="", winning_fact_id="x"),
        ["conflict_id", "winning_fact_id"],
    ),
    ("ListConflicts", memory_pb2.ListConflictsRequest(project_id="p"), ["subject_id"]),
]


@pytest.mark.parametrize(("method", "request_", "fields"), ID_CASES)
async def test_ids_and_text_are_checked(
    channel: grpc.aio.Channel, method: str, request_: Any, fields: list[str]
) -> None:
    code, violations, _ = await expect_error(getattr(stub(channel), method)(request_))
    assert code == INVALID
    assert fields_of(violations) == fields


# --- bytes that are not UTF-8 ----------------------------------------------------------------

MARK = "@@MARK@@"
NOT_UTF8 = b"\xff\xfe\xc3\x28\xa0\xa1\xe2\x28"  # as long as MARK: length prefixes stay valid


async def _raw_call(channel: grpc.aio.Channel, method: str, message: Any):
    raw = message.SerializeToString()
    assert MARK.encode() in raw
    call = channel.unary_unary(
        f"/satchel.v1.MemoryService/{method}",
        request_serializer=None,
        response_deserializer=None,
    )
    return await expect_error(call(raw.replace(MARK.encode(), NOT_UTF8)))


async def test_non_utf8_strings_are_invalid_argument_with_paths(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    code, violations, reason = await _raw_call(
        channel, "AssertFact", fact_request(project_id, statement=MARK)
    )
    assert code == INVALID and fields_of(violations) == ["statement"]
    assert reason == "INVALID_UTF8"

    code, violations, _ = await _raw_call(
        channel, "RecordEvent", event_request(project_id, payload={"text": MARK, "n": [1, MARK]})
    )
    assert code == INVALID  # map entries come in any order on the wire
    assert sorted(fields_of(violations)) == ["payload.n[1]", "payload.text"]

    batch = memory_pb2.BatchRecordEventsRequest(
        requests=[event_request(project_id), event_request(project_id, kind=MARK)]
    )
    code, violations, _ = await _raw_call(channel, "BatchRecordEvents", batch)
    assert code == INVALID and fields_of(violations) == ["requests[1].kind"]

    code, violations, _ = await _raw_call(
        channel, "AssertFact", fact_request(project_id, value={MARK: 1})
    )
    assert code == INVALID and fields_of(violations) == ["value"]
    assert (await row_counts(pg_dsn, project_id))["events"] == 0


async def test_garbage_bytes_are_invalid_argument(channel: grpc.aio.Channel) -> None:
    call = channel.unary_unary(
        "/satchel.v1.MemoryService/RecordEvent", request_serializer=None, response_deserializer=None
    )
    try:
        await call(b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
    except grpc.aio.AioRpcError as err:
        code, violations, reason = error_details(err)
    else:
        raise AssertionError("garbage was accepted")
    assert code == INVALID and fields_of(violations) == ["request"]
    assert reason == "MALFORMED_REQUEST"


def test_invalid_utf8_paths_walks_nested_and_repeated_fields() -> None:
    request = memory_pb2.BatchAssertFactsRequest(
        requests=[
            fact_request("p", source_event_ids=["a", MARK]),
            fact_request("p", value={"list": [{"deep": MARK}]}, predicate=MARK),
        ]
    )
    raw = request.SerializeToString().replace(MARK.encode(), NOT_UTF8)
    assert invalid_utf8_paths(request.DESCRIPTOR, raw) == [
        "requests[0].source_event_ids[1]",
        "requests[1].predicate",
        "requests[1].value.list[0].deep",
    ]


# --- nesting and the cost of explaining a decode error ----------------------------------------


def _nested_value(levels: int, leaf: bytes = b"\x1a\x01x") -> bytes:
    """A google.protobuf.Value holding `levels` JSON objects {"a": …} around a string leaf, built
    on the wire (protobuf itself refuses to build or parse more than 100 message levels)."""

    def length_delimited(number: int, body: bytes) -> bytes:
        return bytes([number << 3 | 2]) + _varint(len(body)) + body

    value = leaf  # Value.string_value = "x"
    for _ in range(levels):
        entry = length_delimited(1, b"a") + length_delimited(2, value)  # Struct.FieldsEntry
        value = length_delimited(5, length_delimited(1, entry))  # Value.struct_value
    return value


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


async def test_a_struct_nested_too_deep_is_invalid_argument_naming_its_field(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    head = memory_pb2.AssertFactRequest(
        project_id=project_id, subject_id="user-1", predicate="x", statement="deep"
    ).SerializeToString()
    value_number = memory_pb2.AssertFactRequest.DESCRIPTOR.fields_by_name["value"].number
    call = channel.unary_unary(
        "/satchel.v1.MemoryService/AssertFact", request_serializer=None, response_deserializer=None
    )
    for levels in (40, 400, 40_000):  # past the limit, past Python's recursion limit, far past
        body = _nested_value(levels)
        request = head + bytes([value_number << 3 | 2]) + _varint(len(body)) + body
        code, violations, reason = await expect_error(call(request))
        assert code == INVALID and len(violations) == 1, levels
        assert fields_of(violations)[0].startswith("value.a.a.a"), "where the limit is crossed"
        assert reason == "NESTED_TOO_DEEP"
        assert "deeper than 100 levels" in violations[0][1]
    assert (await row_counts(pg_dsn, project_id))["facts"] == 0


def test_explaining_a_deep_request_costs_memory_in_proportion_to_its_size() -> None:
    import tracemalloc

    from satchel.server.platform.api.decoding import UndecodableRequest

    data = _nested_value(150_000)  # ~2 MB, every level a copy of the rest before
    tracemalloc.start()
    try:
        error = UndecodableRequest(struct_pb2.Value.DESCRIPTOR, data).error()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.reason == "NESTED_TOO_DEEP"
    assert peak < len(data), f"peak {peak} bytes to explain {len(data)} bytes"


def test_reports_are_bounded_in_count_and_length() -> None:
    from satchel.server.platform.api.decoding import MAX_PATH_CHARS, MAX_REPORTED

    values = [{"k" * 5000: MARK} for _ in range(50)]
    request = fact_request("p", value={"list": values})
    raw = request.SerializeToString().replace(MARK.encode(), NOT_UTF8)
    paths = invalid_utf8_paths(request.DESCRIPTOR, raw)
    assert len(paths) == MAX_REPORTED
    assert all(len(p) <= MAX_PATH_CHARS + 1 for p in paths)
