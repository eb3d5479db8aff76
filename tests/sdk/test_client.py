"""The Python SDK (satchel.client): both clients against the real server, and against a fake
server for what the real one cannot be made to do on demand (UNAVAILABLE once, slow calls,
WatchTraces). The sync client always runs in a thread: the servers share this event loop."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from satchel.client import (
    IDEMPOTENT_READS,
    AsyncSatchelClient,
    FieldViolation,
    RetryPolicy,
    SatchelClient,
    SatchelError,
    event_request,
    fact_request,
    service_config,
)
from satchel.v1 import (
    context_pb2,
    context_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    talent_pb2,
)

SUBJECT = "user-1"
FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05)


# --- the real server ----------------------------------------------------------------------


async def test_async_client_memory_context_and_talents(address: str, project_id: str) -> None:
    async with AsyncSatchelClient(address) as client:
        assert await client.health() == "SERVING"
        assert await client.health("satchel.v1.ContextService") == "SERVING"

        # memory: events
        first = await client.record_event(
            project_id,
            SUBJECT,
            "conversation.message",
            {"speaker": "Ana", "text": "I moved to Oslo"},
            idempotency_key="m1",
        )
        assert first.created and first.event.text
        again = await client.record_event(
            project_id, SUBJECT, "conversation.message", {"text": "other"}, idempotency_key="m1"
        )
        assert not again.created and again.event.id == first.event.id
        batch = await client.batch_record_events(
            event_request(project_id, SUBJECT, "conversation.message", {"text": f"message {i}"})
            for i in range(3)
        )
        assert len(batch.events) == 3
        page = await client.list_events(project_id, SUBJECT, page_size=2)
        assert len(page.events) == 2 and page.next_page_token
        every = [e.id async for e in client.iter_events(project_id, SUBJECT, page_size=2)]
        assert len(every) == 4 and first.event.id in every
        as_of_first = first.event.recorded_at.ToDatetime(tzinfo=UTC)
        then = client.iter_events(project_id, SUBJECT, as_of=as_of_first, page_size=2)
        assert [e.id async for e in then] == [first.event.id]

        # memory: facts, lifecycle, conflicts
        before = datetime.now(UTC)
        oslo = (
            await client.assert_fact(
                project_id,
                SUBJECT,
                "home_city",
                "Oslo",
                statement="Ana lives in Oslo",
                source_event_ids=[first.event.id],
                stale_after=timedelta(days=30),
                confidence=0.9,
            )
        ).fact
        assert oslo.statement == "Ana lives in Oslo" and oslo.confidence == pytest.approx(0.9)
        assert oslo.stale_after.ToTimedelta() == timedelta(days=30)
        assert list(oslo.source_event_ids) == [first.event.id]
        facts = await client.batch_assert_facts(
            [
                fact_request(project_id, SUBJECT, "pet", {"kind": "dog", "name": "Rex"}),
                fact_request(project_id, SUBJECT, "job", "nurse", statement="Ana is a nurse"),
                fact_request(project_id, SUBJECT, "job", "doctor", statement="Ana is a doctor"),
            ]
        )
        pet, nurse, doctor = facts.facts
        assert pet.statement == "pet: kind = dog, name = Rex"
        retired = await client.retire_fact(project_id, pet.id, "wrong dog")
        assert retired.fact.status == memory_pb2.FACT_STATUS_RETIRED
        listed = await client.list_facts(project_id, SUBJECT)
        assert {f.id for f in listed.facts} == {oslo.id, nurse.id, doctor.id}
        as_of = await client.list_facts(project_id, SUBJECT, as_of=before)
        assert not as_of.facts
        everything = [
            f.id
            async for f in client.iter_facts(
                project_id, SUBJECT, page_size=1, include_inactive=True
            )
        ]
        assert sorted(everything) == sorted([oslo.id, pet.id, nurse.id, doctor.id])
        conflict = (await client.open_conflict(project_id, SUBJECT, [nurse.id, doctor.id])).conflict
        assert conflict.status == memory_pb2.CONFLICT_STATUS_OPEN
        assert [c.id for c in (await client.list_conflicts(project_id, SUBJECT)).conflicts] == [
            conflict.id
        ]

        # context: unary, stream, trace, stats
        reply = await client.assemble_context(project_id, SUBJECT, "Where does Ana live?")
        assert reply.packet.facts[0].id == oslo.id
        assert reply.packet.status == context_pb2.PACKET_STATUS_DEGRADED  # the open conflict
        messages = [
            m
            async for m in client.stream_context(
                project_id, SUBJECT, "Where does Ana live?", budget_tokens=50
            )
        ]
        assert all(m.HasField("decision") for m in messages[:-1])
        assert messages[-1].HasField("packet") and messages[-1].packet.budget_tokens == 50
        blocked = {m.decision.candidate_id: m.decision.reason_code for m in messages[:-1]}
        assert blocked[nurse.id] == blocked[doctor.id] == "conflict_open"
        trace = (await client.get_trace(project_id, messages[0].trace_id)).trace
        assert [d.candidate_id for d in trace.decisions] == [
            m.decision.candidate_id for m in messages[:-1]
        ]
        batched = [
            m
            async for m in client.stream_context(
                project_id,
                SUBJECT,
                "Where does Ana live?",
                budget_tokens=50,
                max_decisions_per_message=2,
            )
        ]
        assert all(m.HasField("decisions") for m in batched[:-1])
        assert [d.candidate_id for m in batched[:-1] for d in m.decisions.decisions] == [
            m.decision.candidate_id for m in messages[:-1]
        ]
        resolved = await client.resolve_conflict(project_id, conflict.id, nurse.id)
        assert resolved.conflict.winning_fact_id == nurse.id
        superseded = await client.supersede_fact(project_id, nurse.id, oslo.id)
        assert superseded.fact.superseded_by == oslo.id
        stats = await client.get_stats_overview(project_id)
        assert stats.context_calls == 3 and stats.injection_rate == 1.0

        # talents
        talent_id = f"{project_id}.docker"
        upserted = await client.upsert_talent(
            talent_pb2.Talent(
                id=talent_id, name="Docker", body="Use multi-stage builds.", tags=["docker"]
            )
        )
        assert upserted.created
        active = await client.set_talent_activation(project_id, talent_id)
        assert active.active
        talents = await client.list_talents(project_id, active_only=True)
        assert [t.id for t in talents.talents] == [talent_id]
        selection = (
            await client.resolve_talents(project_id, "Write a Dockerfile", relevance="off")
        ).selection
        assert [t.talent_id for t in selection.selected] == [talent_id]
        assert selection.relevance == talent_pb2.RELEVANCE_MODE_OFF
        doctor = await client.diagnose_project(project_id, roles=["backend"])
        assert list(doctor.roles_known) == ["backend"] and not doctor.findings


def sync_session(address: str, project_id: str) -> dict[str, object]:
    """Every family through the blocking client (called in a thread)."""
    seen: dict[str, object] = {}
    with SatchelClient(address, timeout=20) as client:
        seen["health"] = client.health()
        event = client.record_event(project_id, SUBJECT, "note", {"text": "Bo likes tea"}).event
        fact = client.assert_fact(
            project_id,
            SUBJECT,
            "drink",
            "tea",
            statement="Bo likes green tea",
            source_event_ids=[event.id],
        ).fact
        later = client.record_event(project_id, SUBJECT, "note", {"text": "Bo brews it at 5"})
        seen["events"] = [e.id for e in client.iter_events(project_id, SUBJECT)]
        seen["facts"] = [f.id for f in client.iter_facts(project_id, SUBJECT)]
        reply = client.assemble_context(project_id, SUBJECT, "What does Bo drink?")
        seen["packet_facts"] = [f.id for f in reply.packet.facts]
        seen["episodes"] = [e.event_id for e in reply.packet.episodes]
        with client.stream_context(project_id, SUBJECT, "What does Bo drink?") as stream:
            messages = list(stream)
        seen["stream_last"] = messages[-1].WhichOneof("event")
        seen["trace_len"] = len(client.get_trace(project_id, messages[0].trace_id).trace.decisions)
        seen["stream_len"] = len(messages) - 1
        seen["calls"] = client.get_stats_overview(project_id).context_calls
        seen["talents"] = len(client.list_talents(project_id).talents) >= 0
        seen["doctor"] = list(client.diagnose_project(project_id).findings)
        seen["fact"] = fact.id
        seen["event"] = event.id
        seen["later"] = later.event.id
    return seen


async def test_sync_client_against_the_real_server(address: str, project_id: str) -> None:
    seen = await asyncio.to_thread(sync_session, address, project_id)
    assert seen["health"] == "SERVING"
    assert seen["events"] == [seen["later"], seen["event"]] and seen["facts"] == [seen["fact"]]
    # The fact and its own event say the same: whichever ranks higher is served, the other is
    # left out (source_already_served); the other event is served.
    served = {*seen["packet_facts"], *seen["episodes"]}
    assert len(served & {seen["fact"], seen["event"]}) == 1 and seen["later"] in served
    assert seen["stream_last"] == "packet" and seen["trace_len"] == seen["stream_len"] == 3
    assert seen["calls"] == 2 and seen["doctor"] == []


async def test_errors_carry_code_violations_and_reason(address: str, project_id: str) -> None:
    async with AsyncSatchelClient(address) as client:
        with pytest.raises(SatchelError) as bad:
            await client.assemble_context(project_id, SUBJECT, "q", budget_tokens=0)
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert bad.value.reason == "BUDGET_EXCEEDED" and bad.value.domain == "satchel.dev"
        assert list(bad.value.violations) == ["budget_tokens"]
        assert str(bad.value) == (
            "INVALID_ARGUMENT: budget_tokens: must be a positive integer at most 100000"
        )
        with pytest.raises(SatchelError) as several:
            await client.record_event("", "", "", None)
        assert set(several.value.violations) == {"project_id", "subject_id", "kind"}
        with pytest.raises(SatchelError) as missing:
            await client.get_trace(project_id, "00000000-0000-0000-0000-000000000000")
        assert missing.value.code == grpc.StatusCode.NOT_FOUND
        assert missing.value.reason == "TRACE_NOT_FOUND" and not missing.value.field_violations
        with pytest.raises(SatchelError) as in_stream:
            async for _ in client.stream_context(project_id, SUBJECT, "  "):
                pass
        assert in_stream.value.violations.keys() == {"query"}
        with pytest.raises(ValueError, match="relevance must be one of"):
            await client.resolve_talents(project_id, "task", relevance="sometimes")

    def sync_error() -> SatchelError:
        with SatchelClient(address) as client:
            try:
                client.assemble_context(project_id, SUBJECT, "q", budget_tokens=-1)
            except SatchelError as exc:
                return exc
        raise AssertionError("no error")

    error = await asyncio.to_thread(sync_error)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.reason == "BUDGET_EXCEEDED"
    assert error.field_violations[0].field == "budget_tokens"


def test_error_text_lists_violations_the_message_does_not_spell_out() -> None:
    error = SatchelError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "bad request; a: too long",
        (FieldViolation("a", "too long"), FieldViolation("b", "must not be empty")),
        reason="INVALID_ARGUMENT",
    )
    assert str(error) == "INVALID_ARGUMENT: bad request; a: too long\n  b: must not be empty"
    assert error.violations == {"a": "too long", "b": "must not be empty"}


async def test_cancelling_a_stream_ends_iteration_quietly(address: str, project_id: str) -> None:
    async with AsyncSatchelClient(address) as client:
        await client.assert_fact(project_id, SUBJECT, "a", "x", statement="Ana has a cat")
        await client.assert_fact(project_id, SUBJECT, "b", "y", statement="Ana has a dog")
        seen = []
        async with client.stream_context(project_id, SUBJECT, "Ana's pets") as stream:
            async for message in stream:
                seen.append(message)
                stream.cancel()
        assert len(seen) == 1 and seen[0].HasField("decision")


async def test_unreachable_server_is_unavailable_after_bounded_retries() -> None:
    async with AsyncSatchelClient("127.0.0.1:1", timeout=5, retry=FAST_RETRY) as client:
        started = time.monotonic()
        with pytest.raises(SatchelError) as failed:
            await client.list_talents()
        assert failed.value.code == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 4


# --- a fake server: faults on demand ------------------------------------------------------


@dataclass
class Recorder:
    calls: Counter[str] = field(default_factory=Counter)
    metadata: list[dict[str, str]] = field(default_factory=list)
    remaining: list[float | None] = field(default_factory=list)

    def note(self, name: str, context: grpc.aio.ServicerContext) -> int:
        self.calls[name] += 1
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        self.remaining.append(context.time_remaining())
        return self.calls[name]


class FlakyMemory(memory_pb2_grpc.MemoryServiceServicer):
    """The first ListFacts and every AssertFact fail with UNAVAILABLE; ListEvents is slow."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def ListFacts(self, request, context):  # type: ignore[no-untyped-def]
        if self.recorder.note("ListFacts", context) == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        return memory_pb2.ListFactsResponse(facts=[memory_pb2.Fact(id="f-1")])

    async def AssertFact(self, request, context):  # type: ignore[no-untyped-def]
        self.recorder.note("AssertFact", context)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "database down")

    async def ListConflicts(self, request, context):  # type: ignore[no-untyped-def]
        self.recorder.note("ListConflicts", context)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "still down")

    async def ListEvents(self, request, context):  # type: ignore[no-untyped-def]
        self.recorder.note("ListEvents", context)
        await asyncio.sleep(3)
        return memory_pb2.ListEventsResponse()


class WatchingContext(context_pb2_grpc.ContextServiceServicer):
    """WatchTraces sends two decisions and the packet of one call, then ends."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def WatchTraces(self, request, context):  # type: ignore[no-untyped-def]
        self.recorder.note("WatchTraces", context)
        subject = request.subject_id or "anyone"
        for sequence in (1, 2):
            yield context_pb2.WatchTracesResponse(
                trace_id="t-1",
                subject_id=subject,
                decision=context_pb2.Decision(sequence=sequence, candidate_id=f"c-{sequence}"),
            )
        yield context_pb2.WatchTracesResponse(
            trace_id="t-1", subject_id=subject, packet=context_pb2.ContextPacket(tokens_used=9)
        )

    async def GetStatsOverview(self, request, context):  # type: ignore[no-untyped-def]
        self.recorder.note("GetStatsOverview", context)
        return context_pb2.GetStatsOverviewResponse(context_calls=7)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder()
    server = grpc.aio.server()
    memory_pb2_grpc.add_MemoryServiceServicer_to_server(FlakyMemory(recorder), server)
    context_pb2_grpc.add_ContextServiceServicer_to_server(WatchingContext(recorder), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", recorder
    finally:
        await server.stop(0)


async def test_reads_are_retried_on_unavailable_writes_are_not(
    fake: tuple[str, Recorder],
) -> None:
    address, recorder = fake
    async with AsyncSatchelClient(address, retry=FAST_RETRY) as client:
        reply = await client.list_facts("p", SUBJECT)
        assert [f.id for f in reply.facts] == ["f-1"] and recorder.calls["ListFacts"] == 2
        with pytest.raises(SatchelError) as write:
            await client.assert_fact("p", SUBJECT, "x", "y")
        assert write.value.code == grpc.StatusCode.UNAVAILABLE
        assert write.value.message == "database down" and recorder.calls["AssertFact"] == 1
        with pytest.raises(SatchelError) as exhausted:
            await client.list_conflicts("p", SUBJECT)
        assert exhausted.value.message == "still down" and recorder.calls["ListConflicts"] == 4

    def sync_calls() -> tuple[list[str], grpc.StatusCode]:
        with SatchelClient(address, retry=FAST_RETRY) as client:
            facts = [f.id for f in client.list_facts("p", SUBJECT).facts]
            try:
                client.assert_fact("p", SUBJECT, "x", "y")
            except SatchelError as exc:
                return facts, exc.code
        raise AssertionError("the write succeeded")

    recorder.calls.clear()
    facts, code = await asyncio.to_thread(sync_calls)
    assert facts == ["f-1"] and code == grpc.StatusCode.UNAVAILABLE
    assert recorder.calls == Counter({"ListFacts": 2, "AssertFact": 1})


async def test_no_retry_policy_and_retries_stay_within_the_deadline(
    fake: tuple[str, Recorder],
) -> None:
    address, recorder = fake
    async with AsyncSatchelClient(address, retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(SatchelError):
            await client.list_facts("p", SUBJECT)
        assert recorder.calls["ListFacts"] == 1
    slow = RetryPolicy(max_attempts=10, initial_backoff=5, max_backoff=5)
    async with AsyncSatchelClient(address, retry=slow, timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(SatchelError) as late:
            await client.list_conflicts("p", SUBJECT)
        assert time.monotonic() - started < 2.5  # never sleeps past the deadline
        assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_retries_are_grpcs_own_and_writes_are_not_retried_even_with_a_key(
    fake: tuple[str, Recorder],
) -> None:
    """gRPC retries the read (its retry attempt carries `grpc-previous-rpc-attempts`); a write
    that carries an idempotency key is still not retried: the caller repeats it with the key."""
    address, recorder = fake
    async with AsyncSatchelClient(address, retry=FAST_RETRY) as client:
        await client.list_facts("p", SUBJECT)
        with pytest.raises(SatchelError):
            await client.assert_fact("p", SUBJECT, "x", "y", idempotency_key="k-1")
    assert recorder.calls["ListFacts"] == 2 and recorder.calls["AssertFact"] == 1
    first, retry = recorder.metadata[:2]
    assert "grpc-previous-rpc-attempts" not in first
    assert retry["grpc-previous-rpc-attempts"] == "1"


async def test_a_service_config_of_the_callers_own_wins(fake: tuple[str, Recorder]) -> None:
    address, recorder = fake
    options = [("grpc.service_config", json.dumps({"methodConfig": []}))]
    async with AsyncSatchelClient(address, retry=FAST_RETRY, options=options) as client:
        with pytest.raises(SatchelError) as failed:
            await client.list_facts("p", SUBJECT)
    assert failed.value.message == "warming up" and recorder.calls["ListFacts"] == 1


def test_service_config_is_plain_json_naming_only_the_idempotent_reads() -> None:
    config = json.loads(json.dumps(service_config(FAST_RETRY)))
    (method_config,) = config["methodConfig"]
    named = {f"/{n['service']}/{n['method']}" for n in method_config["name"]}
    assert named == IDEMPOTENT_READS
    assert not any(n.endswith(("/AssertFact", "/RecordEvent", "/AssembleContext")) for n in named)
    assert method_config["retryPolicy"] == {
        "maxAttempts": 4,
        "initialBackoff": "0.01s",
        "maxBackoff": "0.05s",
        "backoffMultiplier": 2.0,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    assert service_config()["methodConfig"][0]["retryPolicy"]["initialBackoff"] == "0.1s"
    assert "retryPolicy" not in service_config(RetryPolicy(max_attempts=1))["methodConfig"][0]
    capped = service_config(RetryPolicy(max_attempts=10))["methodConfig"][0]["retryPolicy"]
    assert capped["maxAttempts"] == 5  # gRPC's ceiling
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(retryable_codes=frozenset())


async def test_every_call_has_a_default_deadline(fake: tuple[str, Recorder]) -> None:
    address, recorder = fake
    async with AsyncSatchelClient(address) as client:
        await client.get_stats_overview("p")
        assert recorder.remaining[-1] is not None and 25 < recorder.remaining[-1] < 30.5
        await client.get_stats_overview("p", timeout=5)
        assert recorder.remaining[-1] is not None and recorder.remaining[-1] < 5.5
    async with AsyncSatchelClient(address, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(SatchelError) as late:
            await client.list_events("p", SUBJECT)
        assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 2

    def sync_deadline() -> grpc.StatusCode:
        with SatchelClient(address, timeout=0.3) as client:
            try:
                client.list_events("p", SUBJECT)
            except SatchelError as exc:
                return exc.code
        raise AssertionError("no deadline")

    assert await asyncio.to_thread(sync_deadline) == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_api_key_is_sent_as_a_bearer_token(fake: tuple[str, Recorder]) -> None:
    address, recorder = fake
    async with AsyncSatchelClient(address, api_key="sk-test") as client:
        await client.get_stats_overview("p")
    assert recorder.metadata[-1]["authorization"] == "Bearer sk-test"

    def sync_call() -> None:
        with SatchelClient(address, api_key="sk-sync", metadata=[("x-team", "a")]) as client:
            client.get_stats_overview("p")

    await asyncio.to_thread(sync_call)
    assert recorder.metadata[-1]["authorization"] == "Bearer sk-sync"
    assert recorder.metadata[-1]["x-team"] == "a"
    async with AsyncSatchelClient(address) as client:
        await client.get_stats_overview("p")
    assert "authorization" not in recorder.metadata[-1]


async def test_watch_traces_is_an_iterator(fake: tuple[str, Recorder]) -> None:
    address, recorder = fake
    async with AsyncSatchelClient(address) as client:
        messages = [m async for m in client.watch_traces("p", subject_id="s-1")]
    assert [m.WhichOneof("event") for m in messages] == ["decision", "decision", "packet"]
    assert {m.subject_id for m in messages} == {"s-1"}
    assert recorder.remaining[-1] is None  # no deadline on a watch by default

    def sync_watch() -> list[str]:
        with SatchelClient(address) as client:
            return [
                m.decision.candidate_id for m in client.watch_traces("p") if m.decision.sequence
            ]

    assert await asyncio.to_thread(sync_watch) == ["c-1", "c-2"]


async def test_unimplemented_rpc_maps_to_a_satchel_error(fake: tuple[str, Recorder]) -> None:
    address, _ = fake
    async with AsyncSatchelClient(address) as client:
        with pytest.raises(SatchelError) as missing:
            await client.get_trace("p", "t")
    assert missing.value.code == grpc.StatusCode.UNIMPLEMENTED


async def test_the_sdk_imports_no_cli_or_server_module() -> None:
    code = (
        "import sys, satchel.client;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " {'rich', 'psycopg', 'numpy', 'structlog'} or m.startswith('satchel.server')))"
    )
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_relevance_mode_accepts_names_and_known_enum_values_only() -> None:
    from satchel.client import requests as rq

    assert rq.relevance_mode("embeddings") == talent_pb2.RELEVANCE_MODE_EMBEDDINGS
    assert rq.relevance_mode(talent_pb2.RELEVANCE_MODE_OFF) == talent_pb2.RELEVANCE_MODE_OFF
    with pytest.raises(ValueError):
        rq.relevance_mode(7)
    with pytest.raises(ValueError):
        rq.relevance_mode("sometimes")
