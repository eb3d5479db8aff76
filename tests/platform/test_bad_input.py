"""Bad input, property-based: thousands of generated requests to every satchel.v1 RPC.

Requests are generated from the message descriptors (a new RPC or field is fuzzed without a test
edit): random and hostile strings (control characters, 10k characters, other projects' ids,
unknown ids), huge and negative numbers, NaN and infinities, out-of-range timestamps, missing
fields; and, on the wire, bytes that are no protobuf at all or hold invalid UTF-8 in any string
field at any depth. They go to a server with auth required, with a key of project A (the
catalogue writes with an admin key), while project B holds facts, events, a conflict and a trace.

Properties: no status is INTERNAL, UNKNOWN, DATA_LOSS, UNAVAILABLE or RESOURCE_EXHAUSTED (nor a
hang: only WatchTraces may reach its deadline, having nothing to say), the server
keeps serving, and a refused request writes no row (row counts of every table and a fingerprint
of the rows an update could touch are equal before and after it).
"""

from __future__ import annotations

import asyncio
import math
import struct
import time
import uuid
from collections import Counter
from typing import Any

import grpc
import psutil
import psycopg
import pytest
from google.protobuf import struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from helpers.memory import event_request, fact_request
from helpers.servers import Rpc, bearer, channel_to, new_key, running, satchel_rpcs
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

pytestmark = pytest.mark.slow

FORBIDDEN = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.UNAVAILABLE,
    # Nothing generated here nears a real limit (16 MiB, streams per client): this would be an
    # error status too large for the trailers, which clients refuse.
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
EXAMPLES = 150
"""Generated messages per RPC (plus WIRE_EXAMPLES raw ones): over 5,000 requests in all."""
WIRE_EXAMPLES = 120
STREAM_EXAMPLES = 60
RSS_GROWTH_MAX = 256 * 2**20
"""How much the (in-process) server may grow while it answers them: bounded, whatever comes."""
WATCH_TIMEOUT = 0.3

COUNTED_TABLES = (
    "events",
    "facts",
    "conflict_sets",
    "conflict_members",
    "context_calls",
    "context_traces",
    "talents",
    "talent_edges",
    "talent_activations",
    "talent_embeddings",
    "talent_project_roles",
    "api_keys",
)
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def mostly(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`rare` one time in five, else `common` (shrinking towards `common`)."""
    return st.integers(0, 4).flatmap(lambda i: rare if i == 4 else common)


class Pools:
    """Values worth drawing: the ids of both projects, unknown ids, hostile text."""

    def __init__(self, project: str, other: str, ids: list[str], other_ids: list[str]) -> None:
        self.project = project
        self.other = other
        self.ids = ids
        self.other_ids = other_ids

    def text(self) -> st.SearchStrategy[str]:
        plain = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
        return st.one_of(
            plain,
            plain,
            st.sampled_from(["", " ", "user-1", "a b", "\x00", "\u202e", "é" * 3, "x" * 201]),
            st.integers(8_000, 10_050).map(lambda n: "q" * n),
        )

    def project_id(self) -> st.SearchStrategy[str]:
        return st.one_of(
            st.just(self.project), st.just(self.project), st.just(self.other), self.text()
        )

    def server_id(self) -> st.SearchStrategy[str]:
        return st.one_of(
            st.sampled_from(self.ids),
            st.sampled_from(self.other_ids),
            st.uuids().map(str),
            st.just(str(uuid.UUID(int=0))),
            self.text(),
        )

    def hostile_string(self, field: FieldDescriptor) -> st.SearchStrategy[str]:
        name = field.name
        if name == "project_id":
            return st.one_of(st.just(self.other), self.text())
        if name.endswith(("_id", "_ids")) and name not in ("subject_id", "talent_id"):
            return self.server_id()
        if name == "page_token":
            return st.one_of(self.text(), st.just("eyJ2IjoxfQ"))
        return self.text()

    def sane_string(self, field: FieldDescriptor) -> st.SearchStrategy[str]:
        """What a well-behaved client would send in this field."""
        name = field.name
        if name == "project_id":
            return st.just(self.project)
        if name == "subject_id":
            return st.just("user-1")
        if name in ("talent_id", "id", "requires", "includes", "recommends"):
            return st.sampled_from(["fuzz.a", "fuzz.b", "unknown.talent"])
        if name.endswith(("_id", "_ids")):
            return st.sampled_from(self.ids)
        if name in ("kind", "predicate", "role", "roles", "tags", "task_types", "triggers"):
            return st.sampled_from(["conversation.message", "likes", "backend", "docs"])
        if name in ("page_token", "idempotency_key", "statement", "note", "reason", "summary"):
            return st.one_of(st.just(""), st.text("abc ", max_size=8))
        return st.sampled_from(["Where does Caroline live?", "likes", "Fuzz", "write docs"])

    def string(self, field: FieldDescriptor) -> st.SearchStrategy[str]:
        sane = self.sane_string(field)
        return mostly(sane, self.hostile_string(field))


def json_values(pools: Pools) -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(2**70), 2**70).map(float),
        pools.text(),
    )
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(pools.text(), children, max_size=4),
        ),
        max_leaves=12,
    )


def to_value(data: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if data is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(data, bool):
        value.bool_value = data
    elif isinstance(data, float):
        value.number_value = data
    elif isinstance(data, str):
        value.string_value = data
    elif isinstance(data, list):
        value.list_value.values.extend(to_value(item) for item in data)
    else:
        for key, item in data.items():
            value.struct_value.fields[key].CopyFrom(to_value(item))
    return value


def messages(descriptor: Descriptor, pools: Pools, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of this type with any subset of fields set to hostile values."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    name = descriptor.full_name
    if name == "google.protobuf.Value":
        return json_values(pools).map(to_value)
    if name == "google.protobuf.Struct":
        return st.dictionaries(pools.text(), json_values(pools), max_size=4).map(
            lambda d: to_value(d).struct_value
        )
    if name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        sane = st.builds(cls, seconds=st.integers(0, 2 * 10**9), nanos=st.integers(0, 10**9 - 1))
        hostile = st.builds(
            cls,
            seconds=st.one_of(
                st.integers(-(2**63), 2**63 - 1),
                st.integers(-62_135_596_800, 253_402_300_799),
                st.sampled_from([-62_135_596_801, 253_402_300_800, -1]),
            ),
            nanos=st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 999_999_999)),
        )
        return mostly(sane, hostile)
    parts = {
        f.name: mostly(field_values(f, pools, depth), st.none())  # None: missing
        for f in descriptor.fields
    }
    return st.fixed_dictionaries(parts).map(lambda values: build(cls, values))


def field_values(field: FieldDescriptor, pools: Pools, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if depth >= 2:
            single: st.SearchStrategy[Any] = st.just(None)
        else:
            single = messages(field.message_type, pools, depth + 1)
    elif field.type == FieldDescriptor.TYPE_STRING:
        single = pools.string(field)
    elif field.type == FieldDescriptor.TYPE_BYTES:
        single = st.binary(max_size=64)
    elif field.type == FieldDescriptor.TYPE_BOOL:
        single = st.booleans()
    elif field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        single = mostly(
            st.floats(0, 1),
            st.one_of(
                st.floats(allow_nan=True, allow_infinity=True),
                st.sampled_from([-0.0, 1.0, -1.0, 1e308, -1e308, math.nan]),
            ),
        )
    elif field.type == FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        single = mostly(st.sampled_from(numbers), st.integers(-3, 12))
    else:
        low, high = _INT_RANGES[field.type]
        edges = [v for v in (low, high, -1, 0, 1, 1000, 1001, 100_001) if low <= v <= high]
        single = mostly(
            st.integers(0, 500), st.one_of(st.integers(low, high), st.sampled_from(edges))
        )
    if field.is_repeated:
        return st.lists(single, max_size=4)
    return single


def build(cls: type[Message], values: dict[str, Any]) -> Message:
    message = cls()
    for name, value in values.items():
        if value is None:
            continue
        field = cls.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name) if field.is_repeated or field.message_type else None
        if field.is_repeated:
            target.extend(v for v in value if v is not None)  # type: ignore[union-attr]
        elif field.message_type is not None:
            target.CopyFrom(value)  # type: ignore[union-attr]
        else:
            setattr(message, name, value)
    return message


# --- raw wire bytes --------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def wire_messages(descriptor: Descriptor, pools: Pools, depth: int = 0) -> st.SearchStrategy[bytes]:
    """Serialized messages whose string fields may hold any bytes (invalid UTF-8 above all)."""
    chunks = []
    for field in descriptor.fields:
        chunks.append(wire_field(field, pools, depth))
    return st.lists(st.one_of(*chunks), max_size=6).map(b"".join)


def wire_field(field: FieldDescriptor, pools: Pools, depth: int) -> st.SearchStrategy[bytes]:
    number = field.number
    if field.type == FieldDescriptor.TYPE_STRING:
        invalid = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\xfe", b"\xe2\x82"])
        payload = st.one_of(invalid, st.binary(max_size=24), pools.text().map(str.encode))
        return payload.map(lambda b: _key(number, 2) + _varint(len(b)) + b)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if depth >= 3:
            inner: st.SearchStrategy[bytes] = st.just(b"")
        else:
            inner = wire_messages(field.message_type, pools, depth + 1)
        return inner.map(lambda b: _key(number, 2) + _varint(len(b)) + b)
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64):
        return st.binary(min_size=8, max_size=8).map(lambda b: _key(number, 1) + b)
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32).map(lambda f: _key(number, 5) + struct.pack("<f", f))
    return st.integers(-(2**63), 2**64 - 1).map(lambda v: _key(number, 0) + _varint(v))


def raw_requests(rpc: Rpc, pools: Pools) -> st.SearchStrategy[bytes]:
    valid = messages(rpc.request.DESCRIPTOR, pools).map(lambda m: m.SerializeToString())
    return st.one_of(
        wire_messages(rpc.request.DESCRIPTOR, pools),
        wire_messages(rpc.request.DESCRIPTOR, pools),
        st.binary(max_size=64),
        st.tuples(valid, st.integers(0, 64)).map(lambda t: t[0][: t[1]]),  # truncated
        st.tuples(valid, st.binary(min_size=1, max_size=4)).map(lambda t: t[0] + t[1]),
    )


# --- the check -------------------------------------------------------------------------------


def _fingerprint(conn: psycopg.Connection, projects: tuple[str, str]) -> tuple[Any, ...]:
    counts = ", ".join(f"(SELECT count(*) FROM {table})" for table in COUNTED_TABLES)
    row = conn.execute(
        f"SELECT {counts},"
        " (SELECT md5(string_agg(id::text || status || coalesce(valid_to::text, '')"
        "   || coalesce(recorded_to::text, '') || coalesce(superseded_by::text, ''), ','"
        "   ORDER BY id)) FROM facts WHERE project_id = ANY(%(p)s)),"
        " (SELECT md5(string_agg(id::text || status, ',' ORDER BY id))"
        "   FROM conflict_sets WHERE project_id = ANY(%(p)s)),"
        " (SELECT max(updated_at) FROM talents)",
        {"p": list(projects)},
    ).fetchone()
    assert row is not None
    return tuple(row)


class Fuzzer:
    """Sends requests with a sync channel (from a worker thread) and checks each answer."""

    def __init__(self, address: str, dsn: str, pools: Pools, key: str, admin: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pools = pools
        self.key = key
        self.admin = admin
        self.codes: Counter[tuple[str, str]] = Counter()

    def close(self) -> None:
        self.channel.close()
        self.conn.close()

    def send(self, rpc: Rpc, request: bytes, admin: bool = False) -> None:
        before = _fingerprint(self.conn, (self.pools.project, self.pools.other))
        metadata = bearer(self.admin if admin else self.key)
        started = time.monotonic()
        code = grpc.StatusCode.OK
        try:
            if rpc.streaming:
                timeout = WATCH_TIMEOUT if rpc.name == "WatchTraces" else 60
                for _ in self.channel.unary_stream(rpc.path)(
                    request, metadata=metadata, timeout=timeout
                ):
                    pass
            else:
                self.channel.unary_unary(rpc.path)(request, metadata=metadata, timeout=60)
        except grpc.RpcError as err:
            code = err.code()
            details = err.details()
        else:
            details = ""
        self.codes[(rpc.name, code.name)] += 1
        assert code not in FORBIDDEN, (rpc.name, code, details, request[:300])
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            assert rpc.name == "WatchTraces", (rpc.name, "hung", time.monotonic() - started)
            return  # a valid watch: it simply had nothing to say before its deadline
        if code != grpc.StatusCode.OK:
            after = _fingerprint(self.conn, (self.pools.project, self.pools.other))
            assert after == before, (rpc.name, code, details, "a refused request wrote rows")

    def run(self, rpc: Rpc) -> None:
        streaming = rpc.streaming
        examples = STREAM_EXAMPLES if streaming else EXAMPLES
        common = hypothesis_settings(
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            max_examples=examples,
        )
        admin_sometimes = rpc.name == "UpsertTalent"

        @common
        @given(request=messages(rpc.request.DESCRIPTOR, self.pools), admin=st.booleans())
        def structured(request: Message, admin: bool) -> None:
            self.send(rpc, request.SerializeToString(), admin and admin_sometimes)

        @hypothesis_settings(common, max_examples=WIRE_EXAMPLES if not streaming else examples)
        @given(request=raw_requests(rpc, self.pools), admin=st.booleans())
        def wire(request: bytes, admin: bool) -> None:
            self.send(rpc, request, admin and admin_sometimes)

        structured()
        wire()


async def _seed(channel: grpc.aio.Channel, project: str, key: str) -> list[str]:
    """A few rows of every kind in `project`; returns their ids."""
    memory = memory_pb2_grpc.MemoryServiceStub(channel)
    auth = bearer(key)
    event = await memory.RecordEvent(event_request(project), metadata=auth)
    facts = [
        (
            await memory.AssertFact(
                fact_request(project, predicate=f"p{i}", statement=f"Caroline likes {i}"),
                metadata=auth,
            )
        ).fact.id
        for i in range(3)
    ]
    conflict = await memory.OpenConflict(
        memory_pb2.OpenConflictRequest(project_id=project, subject_id="user-1", fact_ids=facts[:2]),
        metadata=auth,
    )
    call = await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(
        context_pb2.AssembleContextRequest(project_id=project, subject_id="user-1", query="likes"),
        metadata=auth,
    )
    return [event.event.id, *facts, conflict.conflict.id, call.trace_id]


async def test_generated_requests_to_every_rpc_never_fail_internally_nor_write_when_refused(
    settings: Settings, pg_dsn: str
) -> None:
    stamp = str(time.time_ns())
    project, other = f"fuzz-a-{stamp}", f"fuzz-b-{stamp}"
    key, other_key, admin = await asyncio.gather(
        asyncio.to_thread(new_key, pg_dsn, project),
        asyncio.to_thread(new_key, pg_dsn, other),
        asyncio.to_thread(new_key, pg_dsn, None),
    )
    async with running(settings, auth="required") as server, channel_to(server) as channel:
        ids = await _seed(channel, project, key)
        other_ids = await _seed(channel, other, other_key)
        pools = Pools(project, other, ids, other_ids)
        fuzzer = Fuzzer(f"127.0.0.1:{server.port}", pg_dsn, pools, key, admin)
        started = time.monotonic()
        rss_before = psutil.Process().memory_info().rss
        try:
            for rpc in satchel_rpcs():
                await asyncio.to_thread(fuzzer.run, rpc)
        finally:
            fuzzer.close()
        total = sum(fuzzer.codes.values())
        by_code = Counter(code for (_, code) in fuzzer.codes.elements())
        print(
            f"\nbad input: {total} requests in {time.monotonic() - started:.0f} s: {dict(by_code)}"
        )
        assert total >= 5_000
        assert {name for name, _ in fuzzer.codes} == {rpc.name for rpc in satchel_rpcs()}
        grown = psutil.Process().memory_info().rss - rss_before
        assert grown < RSS_GROWTH_MAX, f"the process grew {grown / 2**20:.0f} MiB"
        # Still serving, and project B's rows are as they were.
        reply = await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(
            context_pb2.AssembleContextRequest(
                project_id=other, subject_id="user-1", query="likes"
            ),
            metadata=bearer(other_key),
        )
        assert reply.packet.facts or reply.packet.status
        facts = await memory_pb2_grpc.MemoryServiceStub(channel).ListFacts(
            memory_pb2.ListFactsRequest(project_id=other, subject_id="user-1"),
            metadata=bearer(other_key),
        )
        assert {f.id for f in facts.facts} == set(other_ids[1:4])
