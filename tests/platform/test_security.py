"""Security: API keys on every satchel.v1 RPC, project isolation, the key cache, TLS."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from pathlib import Path

import grpc
import psycopg
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers.memory import event_request, expect_error, fact_request, query
from helpers.servers import (
    Rpc,
    bearer,
    call_code,
    channel_to,
    make_certificates,
    new_key,
    poll,
    running,
    satchel_cli,
    satchel_rpcs,
)

from satchel.server.platform.auth import (
    SHOWN_PREFIX_CHARS,
    KeyCache,
    Principal,
    bearer_key,
    hash_key,
    request_projects,
)
from satchel.server.platform.config import Settings, listens_on_loopback_only
from satchel.server.platform.errors import Unauthenticated
from satchel.server.platform.storage.keys import revoke_key
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, talent_pb2

DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def scoped_request(rpc: Rpc, project_id: str) -> Message:
    """A request of `rpc` naming `project_id` wherever the message has a project field."""
    request = rpc.request()
    for field in request.DESCRIPTOR.fields:
        if field.name == "project_id":
            request.project_id = project_id
        elif (
            field.is_repeated
            and field.message_type is not None
            and "project_id" in field.message_type.fields_by_name
        ):
            getattr(request, field.name).add(project_id=project_id)
    return request


def test_auth_defaults_to_required_unless_listening_on_loopback_only() -> None:
    for listen in ("127.0.0.1:50051", "127.0.0.2:1", "[::1]:50051", "localhost:1"):
        assert listens_on_loopback_only(listen), listen
        assert not Settings.from_env({"SATCHEL_LISTEN": listen}).auth_required()
    for listen in ("0.0.0.0:50051", "[::]:1", "10.1.2.3:1", "satchel.example:1"):
        assert Settings.from_env({"SATCHEL_LISTEN": listen}).auth_required(), listen
    assert Settings.from_env({"SATCHEL_AUTH": "required"}).auth_required()
    assert not Settings.from_env(
        {"SATCHEL_AUTH": "disabled", "SATCHEL_LISTEN": "0.0.0.0:1"}
    ).auth_required()


def test_bearer_header_parsing_and_request_projects() -> None:
    assert bearer_key((("authorization", "Bearer abc"),)) == "abc"
    assert bearer_key((("Authorization", "bearer  abc "),)) == "abc"
    for metadata in ((), (("authorization", "Basic abc"),), (("authorization", "Bearer "),)):
        with pytest.raises(Unauthenticated):
            bearer_key(metadata)
    batch = memory_pb2.BatchRecordEventsRequest(
        requests=[memory_pb2.RecordEventRequest(project_id=p) for p in ("a", "b", "")]
    )
    assert request_projects(batch) == (True, {"a", "b"})
    assert request_projects(talent_pb2.ListTalentsRequest()) == (True, set())
    assert request_projects(talent_pb2.UpsertTalentRequest()) == (False, set())


async def test_key_cache_shares_lookups_and_expires() -> None:
    now = [0.0]
    calls: list[bytes] = []

    async def lookup(key_hash: bytes) -> Principal | None:
        calls.append(key_hash)
        await asyncio.sleep(0.01)
        return Principal("k1", "p") if key_hash == b"good" else None

    cache = KeyCache(lookup, ttl=5, clock=lambda: now[0], max_entries=3)
    results = await asyncio.gather(*(cache.get(b"good") for _ in range(10)))
    assert all(r == Principal("k1", "p") for r in results) and calls == [b"good"]
    assert await cache.get(b"bad") is None and await cache.get(b"bad") is None
    assert calls == [b"good", b"bad"], "unknown keys are cached too"
    now[0] = 6.0
    await cache.get(b"good")
    assert calls.count(b"good") == 2, "an expired entry is looked up again"
    for i in range(10):
        await cache.get(bytes([i]))
    assert len(cache._unknown) <= 3, "the cache is bounded"
    await cache.get(b"good")
    assert calls.count(b"good") == 2, "a flood of unknown keys does not evict a key in use"
    for i in range(10):
        cache._store(bytes([100 + i]), Principal(f"k{i}", "p"))
    assert len(cache._entries) <= 3, "known keys are bounded too"


async def test_an_unknown_key_costs_no_write(pg_dsn: str) -> None:
    """Looking a key up writes only for a known key whose last use is older than a minute."""
    from satchel.server.platform.storage import keys as key_store

    project = "sec-w-" + str(time.time_ns())
    key = await asyncio.to_thread(new_key, pg_dsn, project)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await conn.execute("SET default_transaction_read_only = on")
        await conn.commit()
        assert await key_store.find_active_key(conn, hash_key("satchel_unknown")) is None
        assert await key_store.find_active_key(conn, b"\x00" * 32) is None
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # a first use is noted
            await key_store.find_active_key(conn, hash_key(key))
        await conn.rollback()
        await conn.execute("SET default_transaction_read_only = off")
        await conn.commit()
        found = await key_store.find_active_key(conn, hash_key(key))
        assert found is not None and found[1] == project
        await conn.execute("SET default_transaction_read_only = on")
        await conn.commit()
        assert await key_store.find_active_key(conn, hash_key(key)) == found, "noted a moment ago"


async def test_every_rpc_checks_the_key_and_its_project(settings: Settings, pg_dsn: str) -> None:
    project, other = "sec-a-" + str(time.time_ns()), "sec-b-" + str(time.time_ns())
    key = await asyncio.to_thread(new_key, pg_dsn, project)
    admin = await asyncio.to_thread(new_key, pg_dsn, None)
    async with running(settings, auth="required") as server, channel_to(server) as channel:
        rpcs = satchel_rpcs()
        assert len(rpcs) >= 21
        for rpc in rpcs:
            mine = scoped_request(rpc, project)
            for metadata in ((), bearer("satchel_not-a-key"), (("authorization", "Basic x"),)):
                code, _ = await call_code(channel, rpc, mine, metadata=metadata, timeout=5)
                assert code == UNAUTHENTICATED, (rpc.name, metadata, code)
            code, _ = await call_code(
                channel, rpc, scoped_request(rpc, other), metadata=bearer(key), timeout=5
            )
            assert code == DENIED, (rpc.name, code)
            for credentials in (key, admin):
                code, _ = await call_code(
                    channel, rpc, mine, metadata=bearer(credentials), timeout=1, read_all=False
                )
                expected_denied = rpc.name == "UpsertTalent" and credentials == key
                assert (code == DENIED) == expected_denied, (rpc.name, code)
                assert code != UNAUTHENTICATED, (rpc.name, code)
        # A batch naming another project in any item is refused as a whole.
        batch = memory_pb2.BatchRecordEventsRequest(
            requests=[event_request(project), event_request(other)]
        )
        code, _ = await call_code(channel, _rpc("BatchRecordEvents"), batch, metadata=bearer(key))
        assert code == DENIED
        # The shared catalogue: any key reads it, only an admin key writes it.
        code, _ = await call_code(
            channel, _rpc("ListTalents"), talent_pb2.ListTalentsRequest(), metadata=bearer(key)
        )
        assert code == grpc.StatusCode.OK
        # Health and reflection stay open.
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        assert [reply async for reply in reflection]


def _rpc(name: str) -> Rpc:
    return next(r for r in satchel_rpcs() if r.name == name)


async def test_another_projects_memory_and_traces_are_not_found(
    settings: Settings, pg_dsn: str
) -> None:
    project, other = "iso-a-" + str(time.time_ns()), "iso-b-" + str(time.time_ns())
    key, other_key = await asyncio.gather(
        asyncio.to_thread(new_key, pg_dsn, project), asyncio.to_thread(new_key, pg_dsn, other)
    )
    async with running(settings, auth="required") as server, channel_to(server) as channel:
        from satchel.v1 import context_pb2_grpc, memory_pb2_grpc

        memory = memory_pb2_grpc.MemoryServiceStub(channel)
        context = context_pb2_grpc.ContextServiceStub(channel)
        theirs, mine = bearer(other_key), bearer(key)
        event = await memory.RecordEvent(event_request(other), metadata=theirs)
        facts = [
            (
                await memory.AssertFact(
                    fact_request(other, predicate=f"p{i}", statement=f"Secret number {i}"),
                    metadata=theirs,
                )
            ).fact.id
            for i in range(2)
        ]
        conflict = await memory.OpenConflict(
            memory_pb2.OpenConflictRequest(project_id=other, subject_id="user-1", fact_ids=facts),
            metadata=theirs,
        )
        their_call = await context.AssembleContext(
            context_pb2.AssembleContextRequest(
                project_id=other, subject_id="user-1", query="secret number"
            ),
            metadata=theirs,
        )
        own = await memory.AssertFact(fact_request(project), metadata=mine)

        watch = context.WatchTraces(
            context_pb2.WatchTracesRequest(project_id=project), metadata=mine
        )
        await asyncio.sleep(0.5)  # let the watch subscribe

        not_found = [
            context.GetTrace(
                context_pb2.GetTraceRequest(project_id=project, trace_id=their_call.trace_id),
                metadata=mine,
            ),
            memory.RetireFact(
                memory_pb2.RetireFactRequest(project_id=project, fact_id=facts[0]), metadata=mine
            ),
            memory.SupersedeFact(
                memory_pb2.SupersedeFactRequest(
                    project_id=project, fact_id=facts[0], superseded_by_fact_id=own.fact.id
                ),
                metadata=mine,
            ),
            memory.SupersedeFact(
                memory_pb2.SupersedeFactRequest(
                    project_id=project, fact_id=own.fact.id, superseded_by_fact_id=facts[0]
                ),
                metadata=mine,
            ),
            memory.ResolveConflict(
                memory_pb2.ResolveConflictRequest(
                    project_id=project,
                    conflict_id=conflict.conflict.id,
                    winning_fact_id=facts[0],
                ),
                metadata=mine,
            ),
            memory.OpenConflict(
                memory_pb2.OpenConflictRequest(
                    project_id=project, subject_id="user-1", fact_ids=[own.fact.id, facts[0]]
                ),
                metadata=mine,
            ),
            memory.AssertFact(
                fact_request(project, source_event_ids=[event.event.id]), metadata=mine
            ),
        ]
        for call in not_found:
            code, _, _ = await expect_error(call)
            assert code == grpc.StatusCode.NOT_FOUND
        listed = await memory.ListFacts(
            memory_pb2.ListFactsRequest(
                project_id=project, subject_id="user-1", include_inactive=True
            ),
            metadata=mine,
        )
        assert [f.id for f in listed.facts] == [own.fact.id]
        packet = await context.AssembleContext(
            context_pb2.AssembleContextRequest(
                project_id=project, subject_id="user-1", query="secret number"
            ),
            metadata=mine,
        )
        assert {f.id for f in packet.packet.facts} <= {own.fact.id}
        # Their rows are untouched.
        their_facts = await memory.ListFacts(
            memory_pb2.ListFactsRequest(project_id=other, subject_id="user-1"), metadata=theirs
        )
        assert {f.id for f in their_facts.facts} == set(facts)
        # The watcher of my project saw my call, never theirs (made before and after mine).
        await context.AssembleContext(
            context_pb2.AssembleContextRequest(project_id=other, subject_id="user-1", query="x"),
            metadata=theirs,
        )
        seen: set[str] = set()
        async for message in watch:
            seen.add(message.trace_id)
            if message.WhichOneof("event") == "packet":
                break
        watch.cancel()
        assert seen == {packet.trace_id}


async def test_revoked_keys_stop_working_within_the_cache_time(
    settings: Settings, pg_dsn: str
) -> None:
    project = "rev-" + str(time.time_ns())
    env = {"SATCHEL_DATABASE_URL": pg_dsn}
    async with running(settings, auth="required", auth_cache_seconds=2.0) as server:
        code, out = await satchel_cli("keys", "create", "--project", project, env=env)
        assert code == 0, out
        key = out.strip().splitlines()[-1]
        assert key.startswith("satchel_") and " " not in key
        async with channel_to(server) as channel:
            request = context_pb2.GetStatsOverviewRequest(project_id=project)
            rpc = _rpc("GetStatsOverview")
            assert server.keys is not None
            lookups, started = server.keys.lookups, time.monotonic()
            for _ in range(30):
                code, details = await call_code(channel, rpc, request, metadata=bearer(key))
                assert code == grpc.StatusCode.OK, details
            # One lookup per key and cache time (2 s), not one per call.
            most = 1 + int((time.monotonic() - started) / 2.0)
            assert 1 <= server.keys.lookups - lookups <= most

            code, listing = await satchel_cli("keys", "list", "--project", project, env=env)
            assert code == 0 and key[:14] in listing and "active" in listing, listing
            code, out = await satchel_cli("keys", "revoke", "--key", key, env=env)
            assert code == 0 and "revoked" in out, out
            revoked_at = time.monotonic()

            async def refused() -> bool:
                code, _ = await call_code(channel, rpc, request, metadata=bearer(key))
                return code == UNAUTHENTICATED

            assert await poll(refused, timeout=10)
            assert time.monotonic() - revoked_at <= 2.0 + 1.0
            code, out = await satchel_cli("keys", "revoke", "--key", "satchel_unknown", env=env)
            assert code == 1
            code, out = await satchel_cli("keys", "create", env=env)
            assert code == 2 and "--project" in out


def _created(out: str) -> tuple[str, str]:
    """(key id, key) from the output of `satchel keys create`."""
    lines = out.strip().splitlines()
    found = re.search(r"created key ([0-9a-f-]{36}) for ", lines[-2])
    assert found, out
    return found.group(1), lines[-1]


def _api_keys_rows(dsn: str) -> list[tuple[tuple[str, object], ...]]:
    """Every column of every row of `api_keys`, as (column, value) pairs."""
    with psycopg.connect(dsn) as conn:
        cur = conn.execute("SELECT * FROM api_keys")
        names = [column.name for column in cur.description or ()]
        return [tuple(zip(names, row, strict=True)) for row in cur.fetchall()]


async def test_keys_create_stores_only_a_hash_of_the_key(settings: Settings, pg_dsn: str) -> None:
    project = "hash-" + str(time.time_ns())
    env = {"SATCHEL_DATABASE_URL": pg_dsn}
    code, out = await satchel_cli("keys", "create", "--project", project, env=env)
    assert code == 0, out
    key_id, key = _created(out)
    assert key.startswith("satchel_") and len(key) > SHOWN_PREFIX_CHARS + 20
    secret = key[SHOWN_PREFIX_CHARS:]  # what is never kept in clear, even in part
    rows = await asyncio.to_thread(_api_keys_rows, pg_dsn)
    mine = [dict(row) for row in rows if str(dict(row)["id"]) == key_id]
    assert len(mine) == 1, "the created key is stored"
    assert mine[0]["project_id"] == project
    assert bytes(mine[0]["key_hash"]) == hashlib.sha256(key.encode()).digest()
    assert mine[0]["prefix"] == key[:SHOWN_PREFIX_CHARS]
    for row in rows:
        for column, value in row:
            if isinstance(value, bytes | bytearray | memoryview):
                stored = bytes(value)
                assert key.encode() not in stored and secret.encode() not in stored, column
            assert key not in str(value) and secret not in str(value), column
    # Every column as PostgreSQL renders it (bytea as hex): neither the key nor its bytes.
    dumped = "\n".join(str(row[0]) for row in await query(pg_dsn, "SELECT t::text FROM api_keys t"))
    assert secret not in dumped and secret.encode().hex() not in dumped
    code, listing = await satchel_cli("keys", "list", "--project", project, env=env)
    assert code == 0 and key_id in listing and secret not in listing, listing


async def test_a_key_revoked_by_its_id_stops_working(settings: Settings, pg_dsn: str) -> None:
    project = "revid-" + str(time.time_ns())
    env = {"SATCHEL_DATABASE_URL": pg_dsn}
    async with running(settings, auth="required", auth_cache_seconds=1.0) as server:
        created = []
        for _ in range(2):
            code, out = await satchel_cli("keys", "create", "--project", project, env=env)
            assert code == 0, out
            created.append(_created(out))
        (key_id, key), (_, kept) = created
        async with channel_to(server) as channel:
            request = context_pb2.GetStatsOverviewRequest(project_id=project)
            rpc = _rpc("GetStatsOverview")

            async def status(credentials: str) -> grpc.StatusCode:
                code, _ = await call_code(channel, rpc, request, metadata=bearer(credentials))
                return code

            assert await status(key) == grpc.StatusCode.OK
            assert await status(kept) == grpc.StatusCode.OK

            code, out = await satchel_cli("keys", "revoke", key_id, env=env)
            assert code == 0 and f"revoked key {key_id}" in out, out

            async def refused() -> bool:
                return await status(key) == UNAUTHENTICATED

            assert await poll(refused, timeout=10), "the revoked key still works"
            assert await status(kept) == grpc.StatusCode.OK, "only the named key is revoked"
            code, listing = await satchel_cli("keys", "list", "--project", project, env=env)
            assert code == 0, listing
            states = {line.split()[0]: line for line in listing.strip().splitlines()}
            assert "revoked" in states[key_id] and "active" not in states[key_id], listing
            assert sum("active" in line for line in states.values()) == 1, listing
            # Revoking again keeps it revoked; an unknown id or a malformed one is refused.
            code, out = await satchel_cli("keys", "revoke", key_id, env=env)
            assert code == 0 and f"revoked key {key_id}" in out, out
            assert await status(key) == UNAUTHENTICATED
            code, out = await satchel_cli("keys", "revoke", str(uuid.uuid4()), env=env)
            assert code == 1 and "no such key" in out, out
            code, out = await satchel_cli("keys", "revoke", "not-a-uuid", env=env)
            assert code == 2 and "UUID" in out, out
            assert await status(kept) == grpc.StatusCode.OK


async def test_tls_and_client_certificates(settings: Settings, tmp_path: Path) -> None:
    certs = await asyncio.to_thread(make_certificates, tmp_path / "certs")
    ca = certs.ca.read_bytes()
    request = health_pb2.HealthCheckRequest()

    async def check(port: int, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
        target = f"127.0.0.1:{port}"
        channel = (
            grpc.aio.secure_channel(target, credentials)
            if credentials is not None
            else grpc.aio.insecure_channel(target)
        )
        async with channel:
            try:
                await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
                reply = await channel.unary_unary(
                    "/satchel.v1.ContextService/GetStatsOverview",
                    request_serializer=context_pb2.GetStatsOverviewRequest.SerializeToString,
                    response_deserializer=context_pb2.GetStatsOverviewResponse.FromString,
                )(context_pb2.GetStatsOverviewRequest(project_id="tls"), timeout=5)
                assert reply.context_calls == 0
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    tls = {"tls_cert": certs.server_cert, "tls_key": certs.server_key}
    async with running(settings, **tls) as server:
        assert await check(server.port, grpc.ssl_channel_credentials(ca)) == grpc.StatusCode.OK
        assert await check(server.port, None) == grpc.StatusCode.UNAVAILABLE
        env = {
            "SATCHEL_LISTEN": f"127.0.0.1:{server.port}",
            "SATCHEL_TLS_CERT": str(certs.server_cert),
            "SATCHEL_TLS_KEY": str(certs.server_key),
        }
        code, out = await satchel_cli("healthcheck", "--tls-ca", str(certs.ca), env=env)
        assert code == 0 and "SERVING" in out, out

    async with running(settings, **tls, tls_client_ca=certs.ca) as server:
        anonymous = grpc.ssl_channel_credentials(ca)
        assert await check(server.port, anonymous) == grpc.StatusCode.UNAVAILABLE
        client = grpc.ssl_channel_credentials(
            ca, certs.client_key.read_bytes(), certs.client_cert.read_bytes()
        )
        assert await check(server.port, client) == grpc.StatusCode.OK
        env = {
            "SATCHEL_LISTEN": f"127.0.0.1:{server.port}",
            "SATCHEL_TLS_CERT": str(certs.server_cert),
            "SATCHEL_TLS_KEY": str(certs.server_key),
            "SATCHEL_TLS_CLIENT_CA": str(certs.ca),
        }
        code, out = await satchel_cli("healthcheck", "--tls-ca", str(certs.ca), env=env)
        assert code == 0 and "SERVING" in out, out


def test_tls_settings_are_validated(tmp_path: Path) -> None:
    from satchel.server.platform.config import ConfigError

    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    for env, message in (
        ({"SATCHEL_TLS_CERT": str(cert)}, "go together"),
        ({"SATCHEL_TLS_CERT": str(cert), "SATCHEL_TLS_KEY": str(tmp_path / "no")}, "not a file"),
        ({"SATCHEL_TLS_CLIENT_CA": str(cert)}, "needs SATCHEL_TLS_CERT"),
        ({"SATCHEL_AUTH": "maybe"}, "SATCHEL_AUTH"),
    ):
        with pytest.raises(ConfigError, match=message):
            Settings.from_env(env)


async def test_a_watch_ends_when_its_key_is_revoked(settings: Settings, pg_dsn: str) -> None:
    """A WatchTraces stream opened before its key was revoked ends UNAUTHENTICATED within the
    cache time (the promise of docs/operations.md, "Security"), even while no call is made to
    watch."""
    project = "revwatch-" + str(time.time_ns())
    key = await asyncio.to_thread(new_key, pg_dsn, project)
    async with (
        running(settings, auth="required", auth_cache_seconds=1.0) as server,
        channel_to(server) as channel,
    ):
        stub = context_pb2_grpc.ContextServiceStub(channel)
        watch = stub.WatchTraces(
            context_pb2.WatchTracesRequest(project_id=project), metadata=bearer(key)
        )
        await watch.initial_metadata()
        await asyncio.sleep(1.5)  # the stream outlives a cache time while the key is valid
        assert not watch.done()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            revoke_key(conn, key_hash=hash_key(key))
        revoked_at = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in watch:
                pass
        assert ended.value.code() == UNAUTHENTICATED
        assert time.monotonic() - revoked_at <= 1.0 + 1.5  # cache time, and a check's slack
