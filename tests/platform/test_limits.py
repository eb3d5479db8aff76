"""The documented limits (docs/operations.md, "Limits"): each one at its edge, with a clear
error."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import grpc
import psycopg
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from helpers.memory import error_details, event_request, fact_request, struct, value
from helpers.servers import bearer, channel_to, new_key, poll, running, satchel_rpcs

from satchel.server.platform.api.validation import (
    MAX_BATCH_ITEMS,
    MAX_BUDGET_TOKENS,
    MAX_ID_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_QUERY_CHARS,
    MAX_REFERENCED_IDS,
    MAX_TEXT_CHARS,
)
from satchel.server.platform.app import MAX_MESSAGE_BYTES
from satchel.server.platform.config import Settings
from satchel.server.talents.api import MAX_BODY_CHARS, MAX_LIST_ITEMS
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc, talent_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
RPCS = {rpc.name: rpc for rpc in satchel_rpcs()}


def _context(query: str = "hello", **fields: object) -> context_pb2.AssembleContextRequest:
    return context_pb2.AssembleContextRequest(
        project_id="limits", subject_id="user-1", query=query, **fields
    )


def _sized(make: Callable[[int], Message], size: int) -> Message:
    """`make(n)` for the n whose message serializes to exactly `size` bytes."""
    n = size
    for _ in range(5):
        n += size - make(n).ByteSize()
    assert make(n).ByteSize() == size
    return make(n)


def _talent(**fields: object) -> talent_pb2.UpsertTalentRequest:
    fields.setdefault("body", "Do it well.")
    return talent_pb2.UpsertTalentRequest(
        talent=talent_pb2.Talent(id="limits.talent", name="Limits", **fields)
    )


# (what, rpc, request at the limit, request past it, violated field)
EDGES = [
    (
        "query length",
        "AssembleContext",
        _context("q" * MAX_QUERY_CHARS),
        _context("q" * (MAX_QUERY_CHARS + 1)),
        "query",
    ),
    (
        "budget",
        "AssembleContext",
        _context(budget_tokens=MAX_BUDGET_TOKENS),
        _context(budget_tokens=MAX_BUDGET_TOKENS + 1),
        "budget_tokens",
    ),
    (
        "budget not positive",
        "AssembleContext",
        _context(budget_tokens=1),
        _context(budget_tokens=-5),
        "budget_tokens",
    ),
    (
        "task length",
        "ResolveTalents",
        talent_pb2.ResolveTalentsRequest(project_id="limits", task="t" * MAX_QUERY_CHARS),
        talent_pb2.ResolveTalentsRequest(project_id="limits", task="t" * (MAX_QUERY_CHARS + 1)),
        "task",
    ),
    (
        "event payload",
        "RecordEvent",
        event_request(
            "limits",
            payload=json_format.MessageToDict(
                _sized(lambda n: struct({"text": "x" * n}), MAX_PAYLOAD_BYTES)
            ),
        ),
        event_request(
            "limits",
            payload=json_format.MessageToDict(
                _sized(lambda n: struct({"text": "x" * n}), MAX_PAYLOAD_BYTES + 1)
            ),
        ),
        "payload",
    ),
    (
        "fact value",
        "AssertFact",
        fact_request(
            "limits",
            value=json_format.MessageToDict(
                _sized(lambda n: value({"v": "x" * n}), MAX_PAYLOAD_BYTES)
            ),
            statement="big",
        ),
        fact_request(
            "limits",
            value=json_format.MessageToDict(
                _sized(lambda n: value({"v": "x" * n}), MAX_PAYLOAD_BYTES + 1)
            ),
            statement="big",
        ),
        "value",
    ),
    (
        "statement",
        "AssertFact",
        fact_request("limits", statement="s" * MAX_TEXT_CHARS),
        fact_request("limits", statement="s" * (MAX_TEXT_CHARS + 1)),
        "statement",
    ),
    (
        "id length",
        "ListFacts",
        memory_pb2.ListFactsRequest(project_id="p" * MAX_ID_CHARS, subject_id="s"),
        memory_pb2.ListFactsRequest(project_id="p" * (MAX_ID_CHARS + 1), subject_id="s"),
        "project_id",
    ),
    (
        "page size",
        "ListEvents",
        memory_pb2.ListEventsRequest(project_id="limits", subject_id="s", page_size=10**9),
        memory_pb2.ListEventsRequest(project_id="limits", subject_id="s", page_size=-1),
        "page_size",
    ),
    (
        "batch size",
        "BatchRecordEvents",
        memory_pb2.BatchRecordEventsRequest(requests=[event_request("limits")]),
        memory_pb2.BatchRecordEventsRequest(
            requests=[event_request("limits")] * (MAX_BATCH_ITEMS + 1)
        ),
        "requests",
    ),
    (
        "empty batch",
        "BatchAssertFacts",
        memory_pb2.BatchAssertFactsRequest(requests=[fact_request("limits")]),
        memory_pb2.BatchAssertFactsRequest(),
        "requests",
    ),
    (
        "referenced ids",
        "AssertFact",
        fact_request("limits", source_event_ids=[]),
        fact_request(
            "limits",
            source_event_ids=["00000000-0000-0000-0000-000000000000"] * (MAX_REFERENCED_IDS + 1),
        ),
        "source_event_ids",
    ),
    (
        "talents: list items",
        "UpsertTalent",
        _talent(tags=[f"t{i}" for i in range(MAX_LIST_ITEMS)]),
        _talent(tags=[f"t{i}" for i in range(MAX_LIST_ITEMS + 1)]),
        "talent.tags",
    ),
    (
        "talents: body",
        "UpsertTalent",
        _talent(body="b" * MAX_BODY_CHARS),
        _talent(body="b" * (MAX_BODY_CHARS + 1)),
        "talent.body",
    ),
    (
        "talents: roles asked of the doctor",
        "DiagnoseProject",
        talent_pb2.DiagnoseProjectRequest(project_id="limits", roles=["r"] * MAX_LIST_ITEMS),
        talent_pb2.DiagnoseProjectRequest(project_id="limits", roles=["r"] * (MAX_LIST_ITEMS + 1)),
        "roles",
    ),
]


async def _unary(channel: grpc.aio.Channel, name: str, request: Message) -> Message:
    rpc = RPCS[name]
    return await channel.unary_unary(
        rpc.path,
        request_serializer=rpc.request.SerializeToString,
        response_deserializer=rpc.response.FromString,
    )(request, timeout=60)


@pytest.mark.parametrize(("what", "rpc", "edge", "past", "field"), EDGES, ids=[e[0] for e in EDGES])
async def test_each_limit_accepts_its_edge_and_refuses_past_it(
    channel: grpc.aio.Channel, what: str, rpc: str, edge: Message, past: Message, field: str
) -> None:
    await _unary(channel, rpc, edge)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _unary(channel, rpc, past)
    code, violations, _ = error_details(refused.value)
    assert code == INVALID, what
    assert field in [f for f, _ in violations], (what, violations)
    assert field in refused.value.details(), "the message names the field"


async def test_messages_over_16_mib_are_refused(channel: grpc.aio.Channel) -> None:
    assert MAX_MESSAGE_BYTES == 16 * 1024 * 1024
    huge = memory_pb2.BatchRecordEventsRequest(
        requests=[event_request("limits", payload={"text": "x" * 60_000})] * 290
    )
    assert huge.ByteSize() > MAX_MESSAGE_BYTES
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _unary(channel, "BatchRecordEvents", huge)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_concurrent_streams_per_client_are_limited(
    settings: Settings, pg_dsn: str, project_id: str
) -> None:
    """Streams held open by a table lock: a client's third is refused, another client's is not,
    and a slot frees when a stream ends."""
    key, other_key = await asyncio.gather(
        asyncio.to_thread(new_key, pg_dsn, project_id),
        asyncio.to_thread(new_key, pg_dsn, project_id),
    )
    request = context_pb2.StreamContextRequest(
        project_id=project_id, subject_id="user-1", query="hello"
    )
    async with (
        running(settings, auth="required", max_streams_per_client=2) as server,
        channel_to(server) as chan,
    ):
        stub = context_pb2_grpc.ContextServiceStub(chan)
        async with await psycopg.AsyncConnection.connect(pg_dsn) as locker:
            await locker.execute("LOCK TABLE context_calls IN ACCESS EXCLUSIVE MODE")
            # No fact in the project: no decision to send, the streams wait on the lock.
            held = [stub.StreamContext(request, metadata=bearer(key)) for _ in range(2)]
            assert await poll(lambda: _open(server, 2)), "the two streams never started"
            third = stub.StreamContext(request, metadata=bearer(key))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await third.read()
            code, _, reason = error_details(refused.value)
            assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
            others = stub.StreamContext(request, metadata=bearer(other_key))
            assert await poll(lambda: _open(server, 3)), "another client is not limited"
            held[0].cancel()
            assert await poll(lambda: _open(server, 2))
            again = stub.StreamContext(request, metadata=bearer(key))
            assert await poll(lambda: _open(server, 3)), "a freed slot is usable again"
            await locker.rollback()
        for stream in (held[1], others, again):
            replies = [m async for m in stream]
            assert replies[-1].WhichOneof("event") == "packet"
        assert await poll(lambda: _open(server, 0))


async def _open(server, count: int) -> bool:
    return sum(server.access.streams._open.values()) == count


async def test_watches_are_counted_apart_per_connection_when_auth_is_disabled(
    settings: Settings, project_id: str
) -> None:
    """Without auth a client is its connection. A connection's watches are limited on their own:
    at its limit, it can still stream context, and so can every other connection."""
    async with running(settings, max_watches_per_client=1, max_streams_per_client=1) as server:
        started = time.monotonic()
        address = f"127.0.0.1:{server.port}"
        # Its own subchannel pool: another TCP connection, not a share of the first channel's.
        own_connection = [("grpc.use_local_subchannel_pool", 1)]
        async with (
            channel_to(server) as chan,
            grpc.aio.insecure_channel(address, options=own_connection) as other_chan,
        ):
            stub = context_pb2_grpc.ContextServiceStub(chan)
            watch = stub.WatchTraces(context_pb2.WatchTracesRequest(project_id=project_id))
            assert await poll(lambda: _watching(server, 1))
            second = stub.WatchTraces(context_pb2.WatchTracesRequest(project_id=project_id))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await second.read()
            code, _, reason = error_details(refused.value)
            assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_WATCHES")
            request = context_pb2.StreamContextRequest(
                project_id=project_id, subject_id="user-1", query="hello"
            )
            for client in (stub, context_pb2_grpc.ContextServiceStub(other_chan)):
                replies = [m async for m in client.StreamContext(request)]
                assert replies[-1].WhichOneof("event") == "packet"
            other_watch = context_pb2_grpc.ContextServiceStub(other_chan).WatchTraces(
                context_pb2.WatchTracesRequest(project_id=project_id)
            )
            assert await poll(lambda: _watching(server, 2)), "another connection may watch"
            watch.cancel()
            other_watch.cancel()
        assert time.monotonic() - started < 30


async def _watching(server, count: int) -> bool:
    return sum(server.access.watches._open.values()) == count


async def test_errors_about_huge_fields_stay_small_enough_for_the_trailers(
    channel: grpc.aio.Channel,
) -> None:
    """A 20k-character bad JSON key, a thousand bad items: a bounded INVALID_ARGUMENT."""
    bad_key = "\x01" + "k" * 20_000
    one = event_request("limits", payload={bad_key: "v"})
    many = memory_pb2.BatchRecordEventsRequest(
        requests=[event_request("limits", kind=" bad kind ")] * MAX_BATCH_ITEMS
    )
    for name, request in (("RecordEvent", one), ("BatchRecordEvents", many)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _unary(channel, name, request)
        code, violations, reason = error_details(refused.value)
        assert code == INVALID and reason == "INVALID_ARGUMENT", name
        assert 1 <= len(violations) <= 11 and all(len(f) <= 100 for f, _ in violations)
        assert len(refused.value.details().encode()) <= 512
    assert violations[-1] == ("…", f"and {MAX_BATCH_ITEMS - 10} more violations")


async def test_a_write_waiting_on_the_database_never_holds_the_reads_slot(
    settings: Settings, pg_dsn: str, project_id: str
) -> None:
    """One call running at a time: a RecordEvent blocked on a lock holds the writes' slot, and
    context calls still run (reads and writes are admitted apart)."""
    async with (
        running(settings, max_active_calls=1) as server,
        channel_to(server) as chan,
    ):
        memory = memory_pb2_grpc.MemoryServiceStub(chan)
        context = context_pb2_grpc.ContextServiceStub(chan)
        async with await psycopg.AsyncConnection.connect(pg_dsn) as locker:
            # EXCLUSIVE: the write path's statistics update waits, reads of the table do not.
            await locker.execute("LOCK TABLE scope_lexemes IN EXCLUSIVE MODE")
            write = asyncio.ensure_future(memory.RecordEvent(event_request(project_id)))
            assert await poll(lambda: _writes_running(server, 1)), "the write never started"
            reply = await context.AssembleContext(
                context_pb2.AssembleContextRequest(
                    project_id=project_id, subject_id="user-1", query="hello"
                ),
                timeout=20,
            )
            assert reply.trace_id and not write.done()
            await locker.rollback()
        assert (await write).event.id


async def _writes_running(server, count: int) -> bool:
    return server.access.write_admission.running == count


@pytest.mark.parametrize("connections", [1, 10])
async def test_a_flood_is_served_or_refused_never_cancelled(
    settings: Settings, project_id: str, connections: int
) -> None:
    """2,500 calls at once. On one connection, the calls past the per-client limit wait in the
    client (a connection's streams are capped at that limit): all are served. Over ten
    connections (ten clients without auth), admission refuses those past its total with
    RESOURCE_EXHAUSTED. gRPC core's own backlog limit used to cancel hundreds (CANCELLED,
    unlogged). Another connection's calls are served throughout."""
    flood_size = 2500
    async with running(settings) as server:
        address = f"127.0.0.1:{server.port}"
        own_connection = [("grpc.use_local_subchannel_pool", 1)]
        async with contextlib.AsyncExitStack() as stack:
            flood_channels = [
                await stack.enter_async_context(
                    grpc.aio.insecure_channel(address, options=own_connection)
                )
                for _ in range(connections)
            ]
            other_chan = await stack.enter_async_context(
                grpc.aio.insecure_channel(address, options=own_connection)
            )
            request = memory_pb2.ListFactsRequest(project_id=project_id, subject_id="user-1")

            async def one_call(n: int) -> tuple[grpc.StatusCode, str]:
                stub = memory_pb2_grpc.MemoryServiceStub(flood_channels[n % connections])
                try:
                    await stub.ListFacts(request, timeout=120)
                    return grpc.StatusCode.OK, ""
                except grpc.aio.AioRpcError as err:
                    code, _, reason = error_details(err)
                    return code, reason

            flood = [asyncio.create_task(one_call(n)) for n in range(flood_size)]
            other_stub = context_pb2_grpc.ContextServiceStub(other_chan)
            for _ in range(3):
                await other_stub.AssembleContext(_context(), timeout=120)
            outcomes = await asyncio.gather(*flood)
    served = outcomes.count((grpc.StatusCode.OK, ""))
    if connections == 1:
        assert served == flood_size
    else:
        assert set(outcomes) <= {
            (grpc.StatusCode.OK, ""),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER_BUSY"),
        }
        assert served >= Settings().max_calls
