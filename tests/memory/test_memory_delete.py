"""Forgetting (issue 18): DeleteEvent, DeleteSubject and DeleteProject against the real server
and database: exactly their scope's rows go (traces quoting them too), as-of reads no longer see
them, a repeated call deletes nothing, bad input is INVALID_ARGUMENT, and a project key deletes
its own project's data only."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import grpc
import psycopg
from helpers.memory import event_request, expect_error, fact_request, fields_of, query, stub
from helpers.servers import bearer, channel_to, new_key, running

from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2

ZERO = memory_pb2.DeletedCounts()


def counts(**fields: int) -> memory_pb2.DeletedCounts:
    return memory_pb2.DeletedCounts(**fields)


async def say(api, project_id: str, subject_id: str, text: str) -> str:
    payload = {"speaker": "maya", "text": text}
    reply = await api.RecordEvent(event_request(project_id, subject_id, payload=payload))
    return reply.event.id


async def fact(api, project_id: str, subject_id: str, statement: str, **fields) -> str:
    request = fact_request(
        project_id, subject_id, predicate=fields.pop("predicate", "note"), **fields
    )
    request.statement = statement
    return (await api.AssertFact(request)).fact.id


async def context_call(channel: grpc.aio.Channel, project_id: str, subject_id: str, q: str) -> str:
    reply = await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(
        context_pb2.AssembleContextRequest(
            project_id=project_id, subject_id=subject_id, query=q, max_distance=0
        )
    )
    return reply.trace_id


async def decisions_quoting(dsn: str, ids: list[str]) -> int:
    (row,) = await query(
        dsn, "SELECT count(*) FROM context_traces WHERE candidate_id = ANY(%s::uuid[])", ids
    )
    return row[0]


async def scope_rows(dsn: str, project_id: str, subject_id: str | None = None) -> dict[str, int]:
    """Rows of every table holding a project's (or one scope's) data."""
    where = "project_id = %(p)s" + (" AND subject_id = %(s)s" if subject_id else "")
    tables = (
        "events",
        "facts",
        "conflict_sets",
        "context_calls",
        "fact_term_counts",
        "scope_lexemes",
        "scope_documents",
    )
    sql = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t} WHERE {where})" for t in tables)

    def run() -> tuple[int, ...]:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(sql, {"p": project_id, "s": subject_id}).fetchone()
        assert row is not None
        return row

    row = await asyncio.to_thread(run)
    rows = dict(zip(tables, row, strict=True))
    (decisions,) = await query(
        dsn,
        "SELECT count(*) FROM context_traces t JOIN context_calls c USING (trace_id)"
        f" WHERE c.{where.replace(' AND ', ' AND c.')}".replace("%(p)s", "%s").replace(
            "%(s)s", "%s"
        ),
        *([project_id, subject_id] if subject_id else [project_id]),
    )
    rows["context_traces"] = decisions[0]
    return rows


async def statistics_match_the_rows(dsn: str, project_id: str, subject_id: str) -> None:
    """The scope statistics counted on write equal a recount of the remaining rows."""
    stored = await query(
        dsn,
        "SELECT lexeme, documents FROM scope_lexemes WHERE project_id = %s AND subject_id = %s"
        " ORDER BY lexeme",
        project_id,
        subject_id,
    )
    recount = await query(
        dsn,
        "SELECT lexeme, count(*) FROM ("
        " SELECT unnest(tsvector_to_array(lexemes)) AS lexeme FROM facts"
        " WHERE project_id = %s AND subject_id = %s"
        " UNION ALL SELECT unnest(tsvector_to_array(lexemes)) FROM events"
        " WHERE project_id = %s AND subject_id = %s) w GROUP BY lexeme ORDER BY lexeme",
        project_id,
        subject_id,
        project_id,
        subject_id,
    )
    assert stored == recount
    terms = await query(
        dsn,
        "SELECT term, facts FROM fact_term_counts WHERE project_id = %s AND subject_id = %s"
        " ORDER BY term",
        project_id,
        subject_id,
    )
    term_recount = await query(
        dsn,
        "SELECT t, count(*) FROM facts, unnest(tsvector_to_array(search_vector)) AS t"
        " WHERE project_id = %s AND subject_id = %s GROUP BY t ORDER BY t",
        project_id,
        subject_id,
    )
    assert terms == term_recount
    documents = await query(
        dsn,
        "SELECT documents, tokens FROM scope_documents WHERE project_id = %s AND subject_id = %s",
        project_id,
        subject_id,
    )
    totals = await query(
        dsn,
        "SELECT count(*), sum(n) FROM (SELECT lexeme_tokens AS n FROM facts"
        " WHERE project_id = %s AND subject_id = %s UNION ALL SELECT lexeme_tokens FROM events"
        " WHERE project_id = %s AND subject_id = %s) d",
        project_id,
        subject_id,
        project_id,
        subject_id,
    )
    assert documents == ([] if totals[0][0] == 0 else [(totals[0][0], totals[0][1])])


async def listed_facts(api, project_id: str, subject_id: str, **fields) -> set[str]:
    reply = await api.ListFacts(
        memory_pb2.ListFactsRequest(project_id=project_id, subject_id=subject_id, **fields)
    )
    return {f.id for f in reply.facts}


async def listed_events(api, project_id: str, subject_id: str, **fields) -> set[str]:
    reply = await api.ListEvents(
        memory_pb2.ListEventsRequest(project_id=project_id, subject_id=subject_id, **fields)
    )
    return {e.id for e in reply.events}


def as_of_now() -> dict:
    from google.protobuf import timestamp_pb2

    moment = timestamp_pb2.Timestamp()
    moment.FromDatetime(datetime.now(UTC))
    return {"as_of": moment}


async def test_delete_event_takes_the_facts_drawn_from_it_alone_and_their_traces(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    lisbon = await say(api, project_id, "maya", "I live in Lisbon with my cat Miso")
    night = await say(api, project_id, "maya", "I work night shifts at the hospital")
    old_home = await fact(api, project_id, "maya", "Maya lives in Faro", predicate="home_city")
    home = await fact(
        api,
        project_id,
        "maya",
        "Maya lives in Lisbon",
        predicate="home_city",
        source_event_ids=[lisbon],
        supersedes_fact_ids=[old_home],
    )
    cat = await fact(
        api, project_id, "maya", "Maya has a cat named Miso", source_event_ids=[lisbon, night]
    )
    job = await fact(api, project_id, "maya", "Maya is a nurse", predicate="job")
    conflict = await api.OpenConflict(
        memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id="maya", fact_ids=[home, job], note="Lisbon?"
        )
    )
    # Another subject, untouched.
    other_event = await say(api, project_id, "ben", "I live in Lisbon too")
    other_fact = await fact(
        api, project_id, "ben", "Ben lives in Lisbon", source_event_ids=[other_event]
    )
    trace_id = await context_call(channel, project_id, "maya", "Where does Maya live in Lisbon?")
    other_trace = await context_call(channel, project_id, "ben", "Where does Ben live in Lisbon?")
    quoting = await decisions_quoting(pg_dsn, [lisbon, home])
    assert quoting >= 1, "the context call considered the event or its fact"
    before = await scope_rows(pg_dsn, project_id, "ben")

    reply = await api.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=lisbon)
    )
    assert reply.deleted == counts(
        events=1, facts=1, conflicts=1, trace_decisions=quoting, facts_unlinked=1
    )

    assert await decisions_quoting(pg_dsn, [lisbon, home]) == 0
    trace = (
        await context_pb2_grpc.ContextServiceStub(channel).GetTrace(
            context_pb2.GetTraceRequest(project_id=project_id, trace_id=trace_id)
        )
    ).trace
    assert trace.trace_id == trace_id, "the call stays, without the decisions quoting them"
    assert {d.candidate_id for d in trace.decisions}.isdisjoint({lisbon, home})
    # Deleted, not retired: no listing sees them, as of now or with the inactive facts.
    for fields in (
        {},
        {"include_inactive": True},
        as_of_now(),
        {"include_inactive": True} | as_of_now(),
    ):
        assert await listed_facts(api, project_id, "maya", **fields) <= {old_home, cat, job}
    assert await listed_facts(api, project_id, "maya", include_inactive=True) == {
        old_home,
        cat,
        job,
    }
    assert await listed_events(api, project_id, "maya") == {night}
    assert await listed_events(api, project_id, "maya", **as_of_now()) == {night}
    facts = {
        f.id: f
        for f in (
            await api.ListFacts(
                memory_pb2.ListFactsRequest(
                    project_id=project_id, subject_id="maya", include_inactive=True
                )
            )
        ).facts
    }
    assert list(facts[cat].source_event_ids) == [night], "kept, without the deleted source"
    assert facts[old_home].status == memory_pb2.FACT_STATUS_SUPERSEDED
    assert facts[old_home].superseded_by == "", "its successor no longer exists"
    conflicts = await api.ListConflicts(
        memory_pb2.ListConflictsRequest(
            project_id=project_id, subject_id="maya", include_resolved=True
        )
    )
    assert [c.id for c in conflicts.conflicts] == []
    assert conflict.conflict.id
    # The job fact left the deleted conflict: it is no longer blocked.
    packet = await context_pb2_grpc.ContextServiceStub(channel).AssembleContext(
        context_pb2.AssembleContextRequest(
            project_id=project_id, subject_id="maya", query="What is Maya's job?", max_distance=0
        )
    )
    assert job in {f.id for f in packet.packet.facts}
    await statistics_match_the_rows(pg_dsn, project_id, "maya")

    # Idempotent, and nothing else moved.
    again = await api.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=lisbon)
    )
    assert again.deleted == ZERO
    assert await scope_rows(pg_dsn, project_id, "ben") == before
    assert await listed_facts(api, project_id, "ben") == {other_fact}
    assert other_trace


async def test_delete_subject_forgets_one_scope_only(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    other_project = project_id + "-other"
    for project in (project_id, other_project):
        for subject in ("maya", "ben"):
            said = await say(api, project, subject, f"{subject} moved to Porto last week")
            first = await fact(
                api, project, subject, f"{subject} lives in Porto", source_event_ids=[said]
            )
            second = await fact(api, project, subject, f"{subject} lives in Braga")
            await api.OpenConflict(
                memory_pb2.OpenConflictRequest(
                    project_id=project, subject_id=subject, fact_ids=[first, second]
                )
            )
            await context_call(channel, project, subject, f"Where does {subject} live?")
    maya = await scope_rows(pg_dsn, project_id, "maya")
    assert maya["events"] == 1 and maya["context_calls"] == 1 and maya["context_traces"] >= 1
    untouched = {
        (p, s): await scope_rows(pg_dsn, p, s)
        for p, s in ((project_id, "ben"), (other_project, "maya"), (other_project, "ben"))
    }
    (trace_id,) = await query(
        pg_dsn,
        "SELECT trace_id::text FROM context_calls WHERE project_id = %s AND subject_id = 'maya'",
        project_id,
    )

    reply = await api.DeleteSubject(
        memory_pb2.DeleteSubjectRequest(project_id=project_id, subject_id="maya")
    )
    assert reply.deleted == counts(
        events=1, facts=2, conflicts=1, traces=1, trace_decisions=maya["context_traces"]
    )
    assert all(n == 0 for n in (await scope_rows(pg_dsn, project_id, "maya")).values())
    for fields in ({}, {"include_inactive": True}, {"include_inactive": True} | as_of_now()):
        assert await listed_facts(api, project_id, "maya", **fields) == set()
    assert await listed_events(api, project_id, "maya", **as_of_now()) == set()
    code, _, _ = await expect_error(
        context_pb2_grpc.ContextServiceStub(channel).GetTrace(
            context_pb2.GetTraceRequest(project_id=project_id, trace_id=trace_id[0])
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    for (p, s), rows in untouched.items():
        assert await scope_rows(pg_dsn, p, s) == rows, (p, s)

    again = await api.DeleteSubject(
        memory_pb2.DeleteSubjectRequest(project_id=project_id, subject_id="maya")
    )
    assert again.deleted == ZERO
    # The scope starts afresh: writing to it again works and is counted from zero.
    await say(api, project_id, "maya", "Hello again")
    await statistics_match_the_rows(pg_dsn, project_id, "maya")


async def test_delete_project_forgets_every_scope_of_it_only(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    api = stub(channel)
    other_project = project_id + "-kept"
    for project in (project_id, other_project):
        for subject in ("maya", "ben", "zoe"):
            said = await say(api, project, subject, f"{subject} adopted a dog called Rex")
            await fact(api, project, subject, f"{subject} has a dog", source_event_ids=[said])
            await context_call(channel, project, subject, f"Does {subject} have a pet?")
    mine = await scope_rows(pg_dsn, project_id)
    kept = await scope_rows(pg_dsn, other_project)

    reply = await api.DeleteProject(memory_pb2.DeleteProjectRequest(project_id=project_id))
    assert reply.deleted == counts(
        events=3, facts=3, traces=3, trace_decisions=mine["context_traces"]
    )
    assert all(n == 0 for n in (await scope_rows(pg_dsn, project_id)).values())
    assert await scope_rows(pg_dsn, other_project) == kept
    stats = await context_pb2_grpc.ContextServiceStub(channel).GetStatsOverview(
        context_pb2.GetStatsOverviewRequest(project_id=project_id)
    )
    assert stats.context_calls == 0
    again = await api.DeleteProject(memory_pb2.DeleteProjectRequest(project_id=project_id))
    assert again.deleted == ZERO


async def test_deletes_validate_their_fields(channel: grpc.aio.Channel) -> None:
    api = stub(channel)
    cases = [
        (
            api.DeleteEvent(memory_pb2.DeleteEventRequest(project_id="", event_id="nope")),
            ["project_id", "event_id"],
        ),
        (api.DeleteEvent(memory_pb2.DeleteEventRequest(project_id="p")), ["event_id"]),
        (
            api.DeleteSubject(memory_pb2.DeleteSubjectRequest(project_id=" p", subject_id="")),
            ["project_id", "subject_id"],
        ),
        (api.DeleteProject(memory_pb2.DeleteProjectRequest(project_id="x" * 201)), ["project_id"]),
        (api.DeleteProject(memory_pb2.DeleteProjectRequest()), ["project_id"]),
    ]
    for call, expected in cases:
        code, violations, _ = await expect_error(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert fields_of(violations) == expected


async def test_a_project_key_deletes_its_own_projects_data_only(
    settings: Settings, pg_dsn: str
) -> None:
    project, other = "del-a-" + str(time.time_ns()), "del-b-" + str(time.time_ns())
    key, other_key, admin = await asyncio.gather(
        asyncio.to_thread(new_key, pg_dsn, project),
        asyncio.to_thread(new_key, pg_dsn, other),
        asyncio.to_thread(new_key, pg_dsn, None),
    )
    async with running(settings, auth="required") as server, channel_to(server) as channel:
        api = stub(channel)
        mine, theirs = bearer(key), bearer(other_key)
        own_event = await api.RecordEvent(event_request(project), metadata=mine)
        their_event = await api.RecordEvent(event_request(other), metadata=theirs)
        kept = await scope_rows(pg_dsn, other)
        denied = [
            api.DeleteProject(memory_pb2.DeleteProjectRequest(project_id=other), metadata=mine),
            api.DeleteSubject(
                memory_pb2.DeleteSubjectRequest(project_id=other, subject_id="user-1"),
                metadata=mine,
            ),
            api.DeleteEvent(
                memory_pb2.DeleteEventRequest(project_id=other, event_id=their_event.event.id),
                metadata=mine,
            ),
        ]
        for call in denied:
            code, _, reason = await expect_error(call)
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PROJECT_NOT_ALLOWED")
        # Their event's id under my project is unknown there: nothing is deleted.
        reply = await api.DeleteEvent(
            memory_pb2.DeleteEventRequest(project_id=project, event_id=their_event.event.id),
            metadata=mine,
        )
        assert reply.deleted == ZERO
        assert await scope_rows(pg_dsn, other) == kept
        # My own project: allowed to my key.
        reply = await api.DeleteEvent(
            memory_pb2.DeleteEventRequest(project_id=project, event_id=own_event.event.id),
            metadata=mine,
        )
        assert reply.deleted == counts(events=1)
        reply = await api.DeleteProject(
            memory_pb2.DeleteProjectRequest(project_id=project), metadata=mine
        )
        assert reply.deleted == ZERO
        # An admin key may delete any project; the project's keys stay valid.
        reply = await api.DeleteProject(
            memory_pb2.DeleteProjectRequest(project_id=other), metadata=bearer(admin)
        )
        assert reply.deleted == counts(events=1)
        listed = await api.ListEvents(
            memory_pb2.ListEventsRequest(project_id=other, subject_id="user-1"), metadata=theirs
        )
        assert list(listed.events) == []


async def test_delete_event_waits_for_a_fact_citing_it(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str
) -> None:
    """A fact asserted concurrently with the deletion of its source event is deleted with it
    (or, asserted after, refused as citing an unknown event): never left citing a deleted id."""
    api = stub(channel)
    for _ in range(5):
        said = await say(api, project_id, "maya", "I moved to Porto")
        results = await asyncio.gather(
            fact(api, project_id, "maya", "Maya lives in Porto", source_event_ids=[said]),
            api.DeleteEvent(memory_pb2.DeleteEventRequest(project_id=project_id, event_id=said)),
            return_exceptions=True,
        )
        if isinstance(results[0], grpc.aio.AioRpcError):
            assert results[0].code() == grpc.StatusCode.NOT_FOUND
        (row,) = await query(
            pg_dsn,
            "SELECT count(*) FROM facts WHERE %s::uuid = ANY(source_event_ids)",
            said,
        )
        assert row[0] == 0
    await statistics_match_the_rows(pg_dsn, project_id, "maya")


async def test_the_sdk_deletes(address: str, project_id: str) -> None:
    from satchel.client import AsyncSatchelClient, SatchelClient

    async with AsyncSatchelClient(address) as satchel:
        said = await satchel.record_event(project_id, "maya", "note", {"text": "forget me"})
        await satchel.assert_fact(
            project_id, "maya", "secret", "x", source_event_ids=[said.event.id]
        )
        reply = await satchel.delete_event(project_id, said.event.id)
        assert (reply.deleted.events, reply.deleted.facts) == (1, 1)
        assert (await satchel.delete_event(project_id, said.event.id)).deleted == ZERO
        await satchel.record_event(project_id, "ben", "note", {"text": "me too"})
        assert (await satchel.delete_subject(project_id, "ben")).deleted.events == 1

    def blocking() -> None:
        with SatchelClient(address) as satchel:
            satchel.record_event(project_id, "zoe", "note", {"text": "and me"})
            assert satchel.delete_subject(project_id, "nobody").deleted == ZERO
            assert satchel.delete_event(project_id, str(uuid.uuid4())).deleted == ZERO
            assert satchel.delete_project(project_id).deleted.events == 1
            assert satchel.delete_project(project_id).deleted == ZERO

    await asyncio.to_thread(blocking)
