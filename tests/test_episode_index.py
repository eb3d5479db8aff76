"""Episodes ranked in memory (server/episode_index.py, domain/episode_ranking.py) against the
real database and model: the same episodes, scores and flags as the hybrid episodes statement;
a scope is held only while its events do not change (migration 0018's version), loaded once it
is read twice at one version, within its bounds."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import grpc
import numpy as np
from memory_helpers import event_request, fact_request
from memory_helpers import stub as memory_stub
from test_context import SUBJECT, assemble, ts

from satchel.server import context as assembly
from satchel.server.domain.episode_ranking import ScopeEvents
from satchel.server.episode_index import EpisodeIndex
from satchel.server.runtime import Runtime
from satchel.server.storage import context as store
from satchel.v1 import memory_pb2

START = datetime(2024, 3, 2, 18, 0, tzinfo=UTC)
# Three sessions of one conversation; the last turn of the second comes two hours after the one
# before it (beyond the one-hour neighbour gap). Some words repeat within a turn (BM25's tf).
SESSIONS = [
    [
        ("Maya", "I finally adopted a dog, a rescue greyhound called Biscuit!"),
        ("Tom", "Congrats! How is Biscuit settling in?"),
        ("Maya", "He sleeps all day, then runs and runs and runs in the park at dusk."),
        ("Tom", "Greyhounds are sprinters, lazy the rest of the time."),
        ("Maya", "My landlord was fine with it, which surprised me."),
        ("Tom", "Did you have to pay a pet deposit?"),
        ("Maya", "Yes, 300 euros, refundable if the flat is fine when I leave."),
        ("Tom", "Fair enough. I am still looking for a flat near the river."),
    ],
    [
        ("Tom", "I signed the lease for the river flat yesterday!"),
        ("Maya", "Amazing, when do you move?"),
        ("Tom", "On the first of May. I need to buy a sofa, a bed and a desk."),
        ("Maya", "Try the flea market on Sundays, I got my desk there."),
        ("Tom", "Good idea. How is the new job going, by the way?"),
        ("Maya", "Busy. We ship the mobile app next week, so lots of testing, testing."),
        ("Tom", "Fingers crossed for the launch."),
        ("Maya", "The launch went well, no crash in the first hour!"),
    ],
    [
        ("Maya", "Biscuit stole a whole baguette from the kitchen table this morning."),
        ("Tom", "Ha, greyhounds are tall enough to reach anything."),
        ("Maya", "I now keep the bread in the oven."),
        ("Tom", "I moved in, the flat is great but the desk is wobbly."),
        ("Maya", "Put a folded card under the short leg."),
        ("Tom", "Did that. Also, my sister Lena visits in June."),
        ("Maya", "Take her to the river walk, it is lovely in June."),
    ],
]
QUERIES = [
    "What is the name of Maya's dog?",
    "How much was the pet deposit?",
    "When does Tom move into the river flat?",
    "Where did Maya buy her desk?",
    "What did the dog steal?",
    "How did the app launch go?",
    "Who visits Tom in June?",
    "What breed is Biscuit?",
    "furniture for the new flat",
    "weather in Madrid",
]


def turn_times() -> list[datetime]:
    times = []
    for day, session in enumerate(SESSIONS):
        at = START + timedelta(days=9 * day)
        for i in range(len(session)):
            late = day == 1 and i == len(session) - 1
            at += timedelta(hours=2) if late else timedelta(seconds=40)
            times.append(at)
    return times


async def load_conversation(channel: grpc.aio.Channel, project_id: str) -> list[str]:
    """Record the conversation; a fact drawn from the deposit turn is retired (its episode is
    then flagged), one from the adoption turn stays."""
    turns = [turn for session in SESSIONS for turn in session]
    requests = [
        event_request(project_id, payload={"speaker": speaker, "text": text}, occurred_at=ts(at))
        for (speaker, text), at in zip(turns, turn_times(), strict=True)
    ]
    reply = await memory_stub(channel).BatchRecordEvents(
        memory_pb2.BatchRecordEventsRequest(requests=requests)
    )
    ids = [e.id for e in reply.events]
    memory = memory_stub(channel)
    kept = await memory.AssertFact(
        fact_request(
            project_id,
            predicate="dog",
            value="Biscuit",
            statement="Maya has a rescue greyhound called Biscuit",
            source_event_ids=[ids[0]],
        )
    )
    assert kept.fact.id
    retired = await memory.AssertFact(
        fact_request(
            project_id,
            predicate="pet_deposit",
            value="300 euros",
            statement="Maya paid a 300 euro pet deposit",
            source_event_ids=[ids[6]],
        )
    )
    await memory.RetireFact(
        memory_pb2.RetireFactRequest(project_id=project_id, fact_id=retired.fact.id, reason="x")
    )
    return ids


def runtime_with(runtime: Runtime, **context: object) -> Runtime:
    """A runtime on the same pool and model with other context settings."""
    settings = replace(runtime.settings, context=replace(runtime.settings.context, **context))
    return Runtime(settings=settings, pool=runtime.pool, embedder=runtime.embedder)


def scope_of(project_id: str) -> store.Scope:
    return store.Scope(project_id, SUBJECT, datetime.now(UTC), historical=False)


async def both_rankings(runtime, scope: store.Scope, query: str, events: ScopeEvents):
    """The episodes of `query` from the statement and from memory (`events` held)."""
    cfg = runtime.settings.context
    vector = await runtime.embed_query(query)
    index = runtime.episode_index

    async def fetch(statement, *args):
        async with runtime.pool.connection() as conn:
            return await statement(conn, *args)

    async with runtime.pool.connection() as conn:
        plan = await store.plan_query(conn, scope, query, cfg)
    assert plan.events_version == events.version
    from_statement = await fetch(store.fetch_episodes, scope, vector, cfg, plan)
    hits = index.stats.hits
    index.put((scope.project_id, scope.subject_id), events)
    from_memory = await assembly.fetch_episodes(runtime, scope, vector, plan, fetch)
    assert index.stats.hits == hits + 1, "served from memory"
    return from_statement, from_memory


def assert_same_episodes(expected: list[dict], actual: list[dict]) -> None:
    """Same episodes, scores and flags; two episodes may swap only on a tie (float32 cosines
    are summed in another order by numpy than by pgvector)."""
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        if want["id"] != got["id"]:
            assert math.isclose(want["score"], got["score"], abs_tol=1e-6)
        for part in ("score", "similarity", "text_rank", "recency", "context_similarity"):
            assert math.isclose(want[part] or 0.0, got[part], abs_tol=1e-6), part
    by_id = {row["id"]: row for row in expected}
    for row in actual:
        want = by_id[row["id"]]
        assert (row["kind"], row["text"], row["occurred_at"]) == (
            want["kind"],
            want["text"],
            want["occurred_at"],
        )
        assert row["source_facts_hidden"] == want["source_facts_hidden"]


async def test_episodes_ranked_in_memory_equal_the_statements(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    ids = await load_conversation(channel, project_id)
    runtime = server.runtime.value
    async with runtime.pool.connection() as conn:
        events = await store.load_scope_events(conn, project_id, SUBJECT, max_events=1000)
    assert events is not None and events.ids == ids  # in conversation order
    assert events.postings["run"][1].tolist() == [3.0]  # "runs and runs and runs"
    scope = scope_of(project_id)
    lifted = flagged = 0
    for query in QUERIES:
        expected, actual = await both_rankings(runtime, scope, query, events)
        assert_same_episodes(expected, actual)
        lifted += sum(1 for row in actual if row["context_similarity"] > 0)
        flagged += sum(1 for row in actual if row["source_facts_hidden"])
    assert lifted and flagged, "neighbours' lifts and hidden sources were compared"
    # Other parameters: no neighbour weight, a small pool and top, a gap that links sessions.
    for overrides in (
        {"episode_context_weight": 0.0, "episode_pool": 3, "episode_top_k": 4},
        {"episode_context_gap_seconds": 30 * 86400.0},
    ):
        other = runtime_with(runtime, **overrides)
        for query in QUERIES[:4]:
            assert_same_episodes(*await both_rankings(other, scope, query, events))


async def test_a_scope_read_twice_unchanged_is_then_served_from_memory(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    await load_conversation(channel, project_id)
    index: EpisodeIndex = server.runtime.value.episode_index
    query = "What did the dog steal?"
    first = await assemble(channel, project_id, query)
    await assemble(channel, project_id, query)  # the second read at this version: loaded
    await index.wait_loaded()
    hits = index.stats.hits
    served = await assemble(channel, project_id, query)
    assert index.stats.hits == hits + 1
    assert [e.event_id for e in served.packet.episodes] == [
        e.event_id for e in first.packet.episodes
    ]
    assert any("baguette" in e.excerpt for e in served.packet.episodes)

    # A new event moves the version: the next calls read the statement, and see it.
    memory = memory_stub(channel)
    new = await memory.RecordEvent(
        event_request(
            project_id, payload={"speaker": "Maya", "text": "Biscuit also stole a croissant."}
        )
    )
    after = await assemble(channel, project_id, "What did Biscuit steal?")
    assert index.stats.hits == hits + 1
    assert new.event.id in [e.event_id for e in after.packet.episodes]
    await assemble(channel, project_id, "What did Biscuit steal?")
    await index.wait_loaded()
    again = await assemble(channel, project_id, "What did Biscuit steal?")
    assert index.stats.hits == hits + 2
    assert [e.event_id for e in again.packet.episodes] == [
        e.event_id for e in after.packet.episodes
    ]

    # A deleted event moves it too: never served from the copy that still holds it.
    await memory.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=new.event.id)
    )
    gone = await assemble(channel, project_id, "What did Biscuit steal?")
    assert index.stats.hits == hits + 2
    assert new.event.id not in [e.event_id for e in gone.packet.episodes]

    # A call as of a past instant reads the statement (history is not held).
    await assemble(channel, project_id, query, as_of=ts(datetime.now(UTC)))
    assert index.stats.hits == hits + 2


async def version_of(runtime: Runtime, project_id: str) -> int:
    async with runtime.pool.connection() as conn:
        plan = await store.plan_query(conn, scope_of(project_id), "x", runtime.settings.context)
    assert plan.events_version is not None
    return plan.events_version


async def test_every_write_of_a_scopes_events_gives_it_a_new_version(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    runtime = server.runtime.value
    assert await version_of(runtime, project_id) == 0  # never written
    memory = memory_stub(channel)
    seen = []
    first = await memory.RecordEvent(event_request(project_id))
    seen.append(await version_of(runtime, project_id))
    other = await memory.RecordEvent(event_request(project_id, subject_id="user-2"))
    assert await version_of(runtime, project_id) == seen[-1], "another scope's write"
    await memory.AssertFact(fact_request(project_id, source_event_ids=[first.event.id]))
    assert await version_of(runtime, project_id) == seen[-1], "facts do not move it"
    await memory.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=first.event.id)
    )
    seen.append(await version_of(runtime, project_id))
    await memory.RecordEvent(event_request(project_id))
    seen.append(await version_of(runtime, project_id))
    await memory.DeleteSubject(
        memory_pb2.DeleteSubjectRequest(project_id=project_id, subject_id=SUBJECT)
    )
    assert len(set(seen)) == len(seen) and 0 not in seen
    # Deleted with the subject: back to 0, which is never held (a copy held at 0 would match).
    assert await version_of(runtime, project_id) == 0
    async with runtime.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT subject_id FROM scope_versions WHERE project_id = %s", (project_id,)
        )
        assert await cur.fetchall() == [("user-2",)]
    index = EpisodeIndex(runtime.pool, max_bytes=2**20, max_events=100)
    index.put((project_id, SUBJECT), fake_events(0, 1))
    assert index.lookup(project_id, SUBJECT, 0) is None
    assert other.event.id


def fake_events(version: int, count: int) -> ScopeEvents:
    """Events of `count` rows for the index's bookkeeping (no ranking)."""
    vectors = np.ones((count, 4), dtype=np.float32)
    return ScopeEvents(
        version=version,
        ids=[f"id-{i}" for i in range(count)],
        kinds=["message"] * count,
        texts=["x" * 100] * count,
        occurred_at=[START] * count,
        occurred_us=np.zeros(count, dtype=np.int64),
        vectors=vectors,
        norms=np.full(count, 2.0),
        lexeme_tokens=np.ones(count),
        postings={},
    )


def test_the_index_holds_at_most_its_budget_dropping_the_least_recently_read() -> None:
    sizes = fake_events(1, 10).nbytes
    index = EpisodeIndex(pool=None, max_bytes=2 * sizes + sizes // 2, max_events=100)  # type: ignore[arg-type]
    for scope in ("a", "b"):
        index.put(("p", scope), fake_events(1, 10))
    assert index.lookup("p", "a", 1) is not None  # "a" read: "b" is now the oldest
    index.put(("p", "c"), fake_events(1, 10))
    assert index.lookup("p", "b", 1) is None
    assert index.lookup("p", "a", 1) is not None and index.lookup("p", "c", 1) is not None
    assert index.bytes <= index.max_bytes and index.stats.evictions == 1
    assert index.lookup("p", "a", 2) is None, "another version is not served"
    index.put(("p", "huge"), fake_events(1, 40))  # more than the whole budget: not held
    assert index.lookup("p", "huge", 1) is None and len(index) == 2


async def test_a_scope_beyond_the_event_limit_is_not_held(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    for text in ("one", "two", "three", "four"):
        await memory_stub(channel).RecordEvent(
            event_request(project_id, payload={"speaker": "Maya", "text": text})
        )
    runtime = server.runtime.value
    version = await version_of(runtime, project_id)
    index = EpisodeIndex(runtime.pool, max_bytes=2**20, max_events=3)
    for _ in range(3):
        assert index.lookup(project_id, SUBJECT, version) is None
        await index.wait_loaded()
    assert (index.stats.loads, index.stats.too_large, len(index)) == (1, 1, 0)
    async with runtime.pool.connection() as conn:
        assert await store.load_scope_events(conn, project_id, SUBJECT, 3) is None
        assert await store.load_scope_events(conn, project_id, SUBJECT, 4) is not None
