"""Scopes ranked in memory (server/context/scope_cache.py, context/domain/episode_ranking.py and
context/domain/fact_ranking.py) against the real database and model: the same episodes, facts,
multi-hop
facts, scores and flags as the hybrid statements; a scope is held only while its events (or
facts) do not change (migration 0018's versions), loaded once it is read twice at one version,
within its bounds."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import time
import tracemalloc
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import numpy as np
from google.protobuf import duration_pb2
from helpers.memory import event_request, fact_request
from helpers.memory import stub as memory_stub
from helpers.servers import channel_to, running
from test_context import SUBJECT, assemble, ts

from satchel.server.context import scope_cache
from satchel.server.context import service as assembly
from satchel.server.context.domain.episode_ranking import ScopeEvents
from satchel.server.context.domain.fact_ranking import FactRanking
from satchel.server.context.domain.score import Postings, postings_of
from satchel.server.context.domain.scored import ScoredEpisode, ScoredFact
from satchel.server.context.ranking import ranking_of
from satchel.server.context.scope_cache import EVENTS, FACTS, ScopeCache
from satchel.server.context.storage.candidates import fetch_fact_candidates
from satchel.server.context.storage.episodes import fetch_episodes
from satchel.server.context.storage.multi_hop import fetch_multi_hop
from satchel.server.context.storage.plan import plan_query
from satchel.server.context.storage.scopes import load_scope_events, load_scope_facts
from satchel.server.context.storage.sql import Scope
from satchel.server.platform.config import Settings
from satchel.server.platform.runtime import Runtime
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
    await memory.AssertFact(  # expired: its episode is flagged too
        fact_request(
            project_id,
            predicate="dog_sleep",
            value="all day",
            statement="Biscuit sleeps all day",
            valid_from=ts(datetime.now(UTC) - timedelta(days=1)),
            stale_after=duration_pb2.Duration(seconds=60),
            source_event_ids=[ids[2]],
        )
    )
    return ids


def runtime_with(runtime: Runtime, **context: object) -> Runtime:
    """A runtime on the same pool and model with other context settings."""
    settings = replace(runtime.settings, context=replace(runtime.settings.context, **context))
    return Runtime(settings=settings, pool=runtime.pool, embedder=runtime.embedder)


def scope_of(project_id: str, subject_id: str = SUBJECT) -> Scope:
    return Scope(project_id, subject_id, datetime.now(UTC), historical=False)


async def both_rankings(
    runtime, scope: Scope, query: str, events: ScopeEvents, budget: int | None = None
):
    """The episodes of `query` from the statement and from memory (`events` held), for a call
    of `budget` tokens when given (its depths, `ContextSettings.for_budget`)."""
    cfg = runtime.settings.context
    if budget is not None:
        cfg = cfg.for_budget(budget)
    vector = await runtime.embed_query(query)
    index = runtime.scope_cache

    async def fetch(statement, *args):
        async with runtime.pool.connection() as conn:
            return await statement(conn, *args)

    async with runtime.pool.connection() as conn:
        plan = await plan_query(conn, scope, query, cfg)
    assert plan.events_version == events.version
    from_statement = await fetch(fetch_episodes, scope, vector, cfg, plan)
    hits = index.stats[EVENTS].hits
    index.put((EVENTS, scope.project_id, scope.subject_id), events)
    ranking = ranking_of(cfg)
    held = assembly.held_events(runtime, ranking, scope, plan)
    assert held is events
    from_memory = await assembly.ranked_episodes(
        runtime, ranking, scope, vector, plan, fetch, held, cfg=cfg
    )
    assert index.stats[EVENTS].hits == hits + 1, "served from memory"
    # With the scope's facts held too, the hidden sources are found in memory.
    async with runtime.pool.connection() as conn:
        facts = await load_scope_facts(conn, scope.project_id, scope.subject_id, 1000)
    assert facts is not None
    all_in_memory = await assembly.ranked_episodes(
        runtime, ranking, scope, vector, plan, fail, held, facts, cfg
    )
    assert all_in_memory == from_memory
    return from_statement, from_memory


async def fail(*args: object) -> None:
    raise AssertionError("no statement expected")


def assert_same_episodes(expected: list[ScoredEpisode], actual: list[ScoredEpisode]) -> None:
    """Same episodes, scores and flags; two episodes may swap only on a tie (float32 cosines
    are summed in another order by numpy than by pgvector)."""
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        if want.id != got.id:
            assert math.isclose(want.score, got.score, abs_tol=1e-6)
        for part in ("score", "similarity", "text_rank", "recency", "context_similarity"):
            assert math.isclose(getattr(want, part), getattr(got, part), abs_tol=1e-6), part
    by_id = {row.id: row for row in expected}
    for row in actual:
        want = by_id[row.id]
        assert (row.kind, row.text, row.occurred_at) == (want.kind, want.text, want.occurred_at)
        assert row.source_facts_hidden == want.source_facts_hidden


async def test_episodes_ranked_in_memory_equal_the_statements(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    ids = await load_conversation(channel, project_id)
    runtime = server.runtime.value
    async with runtime.pool.connection() as conn:
        events = await load_scope_events(conn, project_id, SUBJECT, max_rows=1000)
    assert events is not None and list(events.ids) == ids  # in conversation order
    assert events.postings.get("run")[1].tolist() == [3.0]  # "runs and runs and runs"
    scope = scope_of(project_id)
    lifted = flagged = 0
    for query in QUERIES:
        expected, actual = await both_rankings(runtime, scope, query, events)
        assert_same_episodes(expected, actual)
        lifted += sum(1 for row in actual if row.context_similarity > 0)
        flagged += sum(1 for row in actual if row.source_facts_hidden)
    assert lifted and flagged, "neighbours' lifts and hidden sources were compared"
    # Other parameters: no neighbour weight, a small pool and top, a gap that links sessions.
    for overrides in (
        {"episode_context_weight": 0.0, "episode_pool": 3, "episode_top_k": 4},
        {"episode_context_gap_seconds": 30 * 86400.0},
    ):
        other = runtime_with(runtime, **overrides)
        for query in QUERIES[:4]:
            assert_same_episodes(*await both_rankings(other, scope, query, events))
    # A call with a larger budget reads deeper lists, in memory as by the statement.
    narrow = runtime_with(runtime, episode_pool=3, episode_top_k=2, depth_budget_tokens=100)
    for query in QUERIES[:4]:
        expected, actual = await both_rankings(narrow, scope, query, events, budget=300)
        assert len(expected) > 2
        assert_same_episodes(expected, actual)


async def test_a_scope_read_twice_unchanged_is_then_served_from_memory(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    await load_conversation(channel, project_id)
    index: ScopeCache = server.runtime.value.scope_cache
    query = "What did the dog steal?"
    first = await assemble(channel, project_id, query)
    await assemble(channel, project_id, query)  # the second read at this version: loaded
    await index.wait_loaded()
    hits = index.stats[EVENTS].hits
    served = await assemble(channel, project_id, query)
    assert index.stats[EVENTS].hits == hits + 1
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
    assert index.stats[EVENTS].hits == hits + 1
    assert new.event.id in [e.event_id for e in after.packet.episodes]
    await assemble(channel, project_id, "What did Biscuit steal?")
    await index.wait_loaded()
    again = await assemble(channel, project_id, "What did Biscuit steal?")
    assert index.stats[EVENTS].hits == hits + 2
    assert [e.event_id for e in again.packet.episodes] == [
        e.event_id for e in after.packet.episodes
    ]

    # A deleted event moves it too: never served from the copy that still holds it.
    await memory.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=new.event.id)
    )
    gone = await assemble(channel, project_id, "What did Biscuit steal?")
    assert index.stats[EVENTS].hits == hits + 2
    assert new.event.id not in [e.event_id for e in gone.packet.episodes]

    # A call as of a past instant reads the statement (history is not held).
    await assemble(channel, project_id, query, as_of=ts(datetime.now(UTC)))
    assert index.stats[EVENTS].hits == hits + 2


async def version_of(runtime: Runtime, project_id: str) -> int:
    async with runtime.pool.connection() as conn:
        plan = await plan_query(conn, scope_of(project_id), "x", runtime.settings.context)
    assert plan.events_version is not None
    return plan.events_version


async def test_a_scope_without_events_is_asked_for_no_episodes(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    runtime = server.runtime.value
    memory = memory_stub(channel)
    await memory.AssertFact(fact_request(project_id, statement="Maya lives in Porto"))
    ranking, scope = ranking_of(runtime.settings.context), scope_of(project_id)
    vector = await runtime.embed_query("Where does Maya live?")
    statements: list[object] = []

    async def fetch(statement, *args):
        statements.append(statement)
        return []

    for seed in (False, True):
        cfg = runtime.settings.context
        cfg = replace(cfg, ranking="seed") if seed else cfg  # the plan statement of each ranking
        async with runtime.pool.connection() as conn:
            plan = await plan_query(conn, scope, "Where does Maya live?", cfg)
        assert not plan.scope_events
        episodes = await assembly.ranked_episodes(
            runtime, ranking, scope, vector, plan, fetch, events=None
        )
        assert episodes == [] and statements == []
    await memory.RecordEvent(event_request(project_id))
    async with runtime.pool.connection() as conn:
        plan = await plan_query(conn, scope, "Where does Maya live?", runtime.settings.context)
    assert plan.scope_events


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
    index = ScopeCache(runtime.pool, max_bytes=2**20, max_rows=100)
    index.put((EVENTS, project_id, SUBJECT), fake_events(0, 1))
    assert index.events(project_id, SUBJECT, 0) is None
    assert other.event.id


def fake_events(version: int, count: int) -> ScopeEvents:
    """Events of `count` rows for the index's bookkeeping (no ranking)."""
    vectors = np.ones((count, 4), dtype=np.float32)
    return ScopeEvents(
        version=version,
        ids=tuple(f"id-{i}" for i in range(count)),
        kinds=("message",) * count,
        texts=("x" * 100,) * count,
        occurred_at=(START,) * count,
        occurred_us=np.zeros(count, dtype=np.int64),
        vectors=vectors,
        norms=np.full(count, 2.0),
        lexeme_tokens=np.ones(count),
        postings=postings_of([]),
    )


def test_the_index_holds_at_most_its_budget_dropping_the_least_recently_read() -> None:
    sizes = fake_events(1, 10).nbytes
    index = ScopeCache(pool=None, max_bytes=2 * sizes + sizes // 2, max_rows=100)  # type: ignore[arg-type]
    for scope in ("a", "b"):
        index.put((EVENTS, "p", scope), fake_events(1, 10))
    assert index.events("p", "a", 1) is not None  # "a" read: "b" is now the oldest
    for _ in range(2):  # read twice lately, "b" never: "c" may push it out
        index.sketch.add((EVENTS, "p", "c"))
    index.put((EVENTS, "p", "c"), fake_events(1, 10))
    assert index.events("p", "b", 1) is None
    assert index.events("p", "a", 1) is not None and index.events("p", "c", 1) is not None
    assert index.bytes <= index.max_bytes and index.stats[EVENTS].evictions == 1
    assert index.events("p", "a", 2) is None, "another version is not served"
    assert index.held("p", "a") == [] and index.bytes == sizes, "and its copy is dropped"
    index.put((EVENTS, "p", "huge"), fake_events(1, 40))  # more than the whole budget: not held
    assert index.events("p", "huge", 1) is None and len(index) == 1


def loading_at_once(index: ScopeCache) -> None:
    """Loads happen as they are asked for, with copies of ten fake events (no database)."""

    def load(key: tuple[str, str, str]) -> None:
        index.put(key, fake_events(1, 10))

    index._enqueue = load  # type: ignore[method-assign]


def test_reading_more_scopes_in_turn_than_fit_keeps_a_stable_part_of_them() -> None:
    size = fake_events(1, 10).nbytes
    index = ScopeCache(pool=None, max_bytes=3 * size, max_rows=100)  # type: ignore[arg-type]
    loading_at_once(index)
    for _ in range(6):
        for scope in "abcdefgh":
            index.events("p", scope, 1)
    stats = index.stats[EVENTS]
    assert sorted(subject for _, _, subject in index._scopes) == ["a", "b", "c"]
    assert (stats.loads, stats.evictions) == (0, 0)  # `put` directly: no load counted
    assert stats.hits == 3 * 4, "a, b and c hit from the third round on"
    assert stats.rejected == 5 * 5, "d to h are turned away at each read from the second round"


def test_a_scope_read_once_more_than_the_copy_due_next_does_not_push_it_out() -> None:
    """Under a round-robin, the least recently read copy is the next one due: the scope just
    read is one read ahead of it, which is no reason to swap them (each would push the other
    out in turn)."""
    size = fake_events(1, 10).nbytes
    index = ScopeCache(pool=None, max_bytes=2 * size, max_rows=100)  # type: ignore[arg-type]
    loading_at_once(index)
    for scope in ("a", "c"):
        index.put((EVENTS, "p", scope), fake_events(1, 10))
    for scope in ("c", "a"):  # one round read them: c (read first) goes first
        assert index.events("p", scope, 1) is not None
    for _ in range(2):  # b read twice, once more than c
        assert index.events("p", "b", 1) is None
    assert index.held("p", "b") == [] and index.held("p", "c") == [EVENTS]
    assert index.stats[EVENTS].evictions == 0 and index.stats[EVENTS].rejected == 1


def test_a_scope_read_more_often_pushes_out_colder_ones() -> None:
    size = fake_events(1, 10).nbytes
    index = ScopeCache(pool=None, max_bytes=2 * size, max_rows=100)  # type: ignore[arg-type]
    loading_at_once(index)
    for scope in ("a", "a", "b", "b"):
        index.events("p", scope, 1)
    assert index.held("p", "a") == [EVENTS] and index.held("p", "b") == [EVENTS]
    assert index.events("p", "hot", 1) is None
    assert index.events("p", "hot", 1) is None, "read as often as a: turned away"
    assert index.events("p", "hot", 1) is None, "once more than a: within the margin"
    assert index.stats[EVENTS].rejected == 2 and index.held("p", "hot") == []
    assert index.events("p", "hot", 1) is None  # now read twice more than a: loaded
    assert index.held("p", "hot") == [EVENTS] and index.held("p", "a") == []
    assert index.events("p", "hot", 1) is not None and index.stats[EVENTS].evictions == 1


async def test_a_queued_load_whose_copy_would_be_turned_away_is_not_read(monkeypatch) -> None:
    """Between the read that asks for a load and the load, the calls read the copies held: if
    the copy would now be turned away, the loader does not read it (reads cost the database and
    the cores the calls use) and asks for it again at a later read."""
    size = fake_events(1, 10).nbytes
    index = ScopeCache(pool=None, max_bytes=2 * size, max_rows=100)  # type: ignore[arg-type]
    read: list[str] = []

    async def load(conn: object, project_id: str, subject_id: str, *limits: object) -> ScopeEvents:
        read.append(subject_id)
        return fake_events(1, 10)

    monkeypatch.setitem(scope_cache._LOADERS, EVENTS, load)
    monkeypatch.setattr(scope_cache, "autocommit", lambda pool: contextlib.nullcontext())
    for scope in ("a", "b"):
        index.put((EVENTS, "p", scope), fake_events(1, 10))
    for _ in range(3):  # read more often lately than a and b: its load is asked for
        index.events("p", "new", 1)
    assert list(index._queue) == [(EVENTS, "p", "new")]
    for scope in ("a", "a", "a", "b"):  # meanwhile a, the first to go, is read as often
        assert index.events("p", scope, 1) is not None
    await index.wait_loaded()
    assert read == [] and index.stats[EVENTS].rejected == 1 and index.held("p", "new") == []
    for _ in range(2):  # read twice more than a again: asked for, read, held
        index.events("p", "new", 1)
    await index.wait_loaded()
    assert read == ["new"] and index.held("p", "new") == [EVENTS]


async def scopes_of_one_event(
    channel: grpc.aio.Channel, runtime: Runtime, project_id: str, subjects: list[str]
) -> dict[str, int]:
    """One event recorded in each subject's scope; each scope's events version then."""
    for subject in subjects:
        await memory_stub(channel).RecordEvent(
            event_request(project_id, subject, payload={"speaker": "Maya", "text": subject})
        )
    versions = {}
    for subject in subjects:
        async with runtime.pool.connection() as conn:
            plan = await plan_query(
                conn, scope_of(project_id, subject), "x", runtime.settings.context
            )
        versions[subject] = plan.events_version
    return versions


async def test_a_cache_full_of_scopes_read_in_turn_stops_loading(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    subjects = [f"turn-{i}" for i in range(6)]
    runtime = server.runtime.value
    versions = await scopes_of_one_event(channel, runtime, project_id, subjects)
    async with runtime.pool.connection() as conn:
        held = await load_scope_events(conn, project_id, subjects[0], 100)
    assert held is not None
    index = ScopeCache(runtime.pool, max_bytes=2 * held.nbytes + held.nbytes // 2, max_rows=100)
    for _ in range(5):
        for subject in subjects:
            index.events(project_id, subject, versions[subject])
            await index.wait_loaded()
    stats = index.stats[EVENTS]
    assert stats.loads == 2 and stats.evictions == 0 and len(index) == 2
    assert stats.hits == 2 * 3 and stats.rejected == 4 * 4


async def test_the_loader_rests_between_loads_to_keep_its_share_of_time(
    channel: grpc.aio.Channel, project_id: str, server, monkeypatch
) -> None:
    """Loads queued in a burst run one at a time, each followed by a rest of (1 - share) /
    share times its duration, so that loading keeps to its share beside the calls."""
    subjects = [f"burst-{i}" for i in range(4)]
    runtime = server.runtime.value
    versions = await scopes_of_one_event(channel, runtime, project_id, subjects)
    spans: list[tuple[float, float]] = []

    async def timed_load(*args):
        started = time.monotonic()
        try:
            return await load_scope_events(*args)
        finally:
            spans.append((started, time.monotonic()))

    monkeypatch.setitem(scope_cache._LOADERS, EVENTS, timed_load)
    index = ScopeCache(runtime.pool, max_bytes=2**24, max_rows=100, load_share=0.25)
    for _ in range(2):  # a scope is loaded on its second read: four loads queued at once
        for subject in subjects:
            index.events(project_id, subject, versions[subject])
    await index.wait_loaded()
    assert len(spans) == 4 and len(index) == 4
    for (start, end), (next_start, _) in itertools.pairwise(spans):
        assert next_start - end >= 3 * (end - start), "a rest of 3x the load (share 1/4)"
    assert all(index.events(project_id, s, versions[s]) is not None for s in subjects)


async def test_a_scope_beyond_the_event_limit_is_not_held(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    for text in ("one", "two", "three", "four"):
        await memory_stub(channel).RecordEvent(
            event_request(project_id, payload={"speaker": "Maya", "text": text})
        )
    runtime = server.runtime.value
    version = await version_of(runtime, project_id)
    index = ScopeCache(runtime.pool, max_bytes=2**20, max_rows=3)
    for _ in range(3):
        assert index.events(project_id, SUBJECT, version) is None
        await index.wait_loaded()
    assert (index.stats[EVENTS].loads, index.stats[EVENTS].too_large, len(index)) == (1, 1, 0)
    async with runtime.pool.connection() as conn:
        assert await load_scope_events(conn, project_id, SUBJECT, 3) is None
        assert await load_scope_events(conn, project_id, SUBJECT, 4) is not None


FACTS_NOW = datetime.now(UTC)
# (predicate, statement, days ago it became valid, extra fields)
STATED = [
    ("dog", "Maya has a rescue greyhound called Biscuit", 300, {}),
    ("dog_food", "Biscuit eats salmon kibble twice a day", 200, {}),
    ("home", "Tom lives in a flat near the river", 40, {}),
    ("home", "Tom lives in the river flat since May", 10, {}),  # restates the one above
    ("home", "Tom lived with his sister Lena before", 400, {}),
    ("job", "Maya works on the mobile app team", 90, {}),
    ("trip", "Maya is in Porto this week", 20, {"stale_after": timedelta(days=7)}),
    ("sister", "Lena is Tom's sister and visits in June", 5, {}),
    ("gym", "Tom goes to the gym on Mondays", 60, {"valid_to": FACTS_NOW - timedelta(days=1)}),
    ("gym", "Tom runs by the river and runs again at dusk", 2, {}),
    ("desk", "Maya bought her desk at the flea market", 100, {}),
    ("desk", "Maya's desk is made of oak", 100, {}),
    ("car", "Tom sold his car", 30, {"valid_to": FACTS_NOW + timedelta(days=30)}),
    ("pay", "Maya earns more since the launch", 15, {}),
]
FACT_QUERIES = [
    "Where does Tom live?",
    "What does Biscuit eat?",
    "Where is Maya this week?",
    "Who is Lena?",
    "Where did Maya buy her desk?",
    "running by the river",
    "weather in Madrid",
]


async def load_facts(channel: grpc.aio.Channel, project_id: str) -> list[str]:
    """The facts above; two in an open conflict, two in a resolved one, one superseded."""
    memory = memory_stub(channel)
    ids = []
    for predicate, statement, days, extra in STATED:
        fields = {key: value for key, value in extra.items() if key != "stale_after"}
        if "stale_after" in extra:
            fields["stale_after"] = duration_pb2.Duration(
                seconds=int(extra["stale_after"].total_seconds())
            )
        if "valid_to" in extra:
            fields["valid_to"] = ts(extra["valid_to"])
        reply = await memory.AssertFact(
            fact_request(
                project_id,
                predicate=predicate,
                value=statement,
                statement=statement,
                valid_from=ts(FACTS_NOW - timedelta(days=days)),
                **{k: v for k, v in fields.items() if k != "valid_from"},
            )
        )
        ids.append(reply.fact.id)
    await memory.OpenConflict(
        memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id=SUBJECT, fact_ids=[ids[10], ids[11]]
        )
    )
    resolved = await memory.OpenConflict(
        memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id=SUBJECT, fact_ids=[ids[1], ids[5]]
        )
    )
    await memory.ResolveConflict(
        memory_pb2.ResolveConflictRequest(
            project_id=project_id, conflict_id=resolved.conflict.id, winning_fact_id=ids[1]
        )
    )
    await memory.AssertFact(
        fact_request(
            project_id,
            predicate="pay",
            value="more",
            statement="Maya earns a lot more since the launch",
            supersedes_fact_ids=[ids[13]],
        )
    )
    return ids


def assert_same_facts(expected: list[ScoredFact], actual: list[ScoredFact]) -> None:
    """Same facts, score parts, flags and restatements (ties may swap, as for episodes)."""
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        if want.id != got.id:
            assert math.isclose(want.score, got.score, abs_tol=1e-6)
        for part in ("score", "similarity", "text_rank", "recency", "since_epoch"):
            assert math.isclose(getattr(want, part), getattr(got, part), abs_tol=1e-6), part
    by_id = {row.id: row for row in expected}
    for row in actual:
        want = by_id[row.id]
        for column in ("predicate", "value", "statement", "valid_from", "expired"):
            assert getattr(row, column) == getattr(want, column), column
        assert row.in_open_conflict == want.in_open_conflict
        assert math.isclose(row.confidence, want.confidence)
        assert row.source_event_ids == want.source_event_ids
        assert sorted(row.restates) == sorted(want.restates)


async def test_facts_ranked_in_memory_equal_the_statements(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    ids = await load_facts(channel, project_id)
    runtime = server.runtime.value
    cfg = runtime.settings.context
    scope = scope_of(project_id)
    async with runtime.pool.connection() as conn:
        held = await load_scope_facts(conn, project_id, SUBJECT, max_rows=1000)
        cur = await conn.execute(
            "SELECT id::text FROM facts WHERE project_id = %s AND status = 'active' ORDER BY id",
            (project_id,),
        )
        active = [fact_id for (fact_id,) in await cur.fetchall()]
    assert held is not None and list(held.ids) == active and ids[13] not in active
    flags = restated = 0
    for query in FACT_QUERIES:
        vector = await runtime.embed_query(query)
        async with runtime.pool.connection() as conn:
            plan = await plan_query(conn, scope, query, cfg)
            assert plan.facts_version == held.version
            expected = await fetch_fact_candidates(conn, scope, vector, cfg, plan)
            query_parts = assembly.fact_query(ranking_of(cfg), cfg, scope, vector, plan)
            ranking = FactRanking(held, query_parts)
            actual = ranking.candidates()
            assert_same_facts(expected.facts, actual.facts)
            assert expected.text_full is not None and actual.text_full is not None
            assert math.isclose(expected.text_full, actual.text_full, rel_tol=1e-9)
            flags += sum(1 for r in actual.facts if r.expired or r.in_open_conflict)
            restated += sum(1 for r in actual.facts if r.restates)
            # Multi-hop from the best two, on a name and a word the scope holds.
            seen = [r.id for r in expected.facts[:2]]
            text_full = expected.text_full
            entities = ["Lena", "Biscuit", "Nobody"]
            hops = await fetch_multi_hop(conn, scope, vector, cfg, plan, entities, seen, text_full)
        in_memory = ranking.multi_hop(
            entities, set(seen), text_full, cfg.multi_hop_max_per_entity, 256
        )
        assert hops and not {r.id for r in in_memory} & set(seen)
        assert_same_facts(hops, in_memory)
    assert flags and restated, "the flags and restatements were compared"
    assert ids


async def test_held_copies_are_left_out_of_garbage_collections(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    """A copy's rows sit in tuples, arrays and dicts of them, which the collector stops
    tracking (a container once the collection before untracked its members: three full
    collections for a dict of tuples of tuples), so a full collection does not walk the rows
    of every copy held (with lists: 39 ms for 150 median scopes of the million-fact
    benchmark, against 6.5 ms)."""
    await load_conversation(channel, project_id)
    await load_facts(channel, project_id)
    runtime = server.runtime.value
    async with runtime.pool.connection() as conn:
        events = await load_scope_events(conn, project_id, SUBJECT, max_rows=1000)
        facts = await load_scope_facts(conn, project_id, SUBJECT, max_rows=1000)
    assert events is not None and facts is not None and len(events) and len(facts)
    for _ in range(3):
        gc.collect()
    for copy in (events, facts):
        for name, column in vars(copy).items():
            # A set is always tracked (one a copy: the events its inactive facts were drawn
            # from); a fact's value is held as its JSON text.
            if name == "inactive_sources":
                continue
            # Postings: one tuple a copy (a subclass, which the collector keeps walking) of
            # a dictionary and arrays, which it does not.
            members = column if isinstance(column, Postings) else (column,)
            for member in members:
                assert not gc.is_tracked(member), f"{type(copy).__name__}.{name} is walked"
    rows = [*facts.source_event_ids, *facts.conflicts.values(), *facts.drawn_from.values()]
    assert facts.conflicts and not any(gc.is_tracked(row) for row in rows)


async def test_a_write_of_facts_or_conflicts_moves_the_facts_version(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    runtime = server.runtime.value
    memory = memory_stub(channel)

    async def facts_version() -> int:
        async with runtime.pool.connection() as conn:
            plan = await plan_query(conn, scope_of(project_id), "x", runtime.settings.context)
        assert plan.facts_version is not None
        return plan.facts_version

    seen = [await facts_version()]
    first = await memory.AssertFact(fact_request(project_id, predicate="a", value="1"))
    seen.append(await facts_version())
    second = await memory.AssertFact(fact_request(project_id, predicate="b", value="2"))
    seen.append(await facts_version())
    opened = await memory.OpenConflict(
        memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id=SUBJECT, fact_ids=[first.fact.id, second.fact.id]
        )
    )
    seen.append(await facts_version())
    await memory.ResolveConflict(
        memory_pb2.ResolveConflictRequest(
            project_id=project_id, conflict_id=opened.conflict.id, winning_fact_id=first.fact.id
        )
    )
    seen.append(await facts_version())
    await memory.RetireFact(
        memory_pb2.RetireFactRequest(project_id=project_id, fact_id=first.fact.id, reason="x")
    )
    seen.append(await facts_version())
    told = await memory.RecordEvent(event_request(project_id))
    assert await facts_version() == seen[-1], "events do not move it"
    await memory.AssertFact(
        fact_request(project_id, predicate="c", value="3", source_event_ids=[told.event.id])
    )
    seen.append(await facts_version())
    # One transaction deletes the event (moving the events version) and the fact drawn from
    # it alone: the facts version moves too (migration 0019; 0018 moved one kind only).
    await memory.DeleteEvent(
        memory_pb2.DeleteEventRequest(project_id=project_id, event_id=told.event.id)
    )
    seen.append(await facts_version())
    assert seen[0] == 0 and len(set(seen)) == len(seen)
    # Written by hand, a fact moved to another subject moves both scopes' versions.
    async with runtime.pool.connection() as conn:
        await conn.execute(
            "UPDATE facts SET subject_id = 'user-9' WHERE project_id = %s AND id = %s",
            (project_id, second.fact.id),
        )
    async with runtime.pool.connection() as conn:  # after the commit, which moves them
        cur = await conn.execute(
            "SELECT subject_id, facts FROM scope_versions WHERE project_id = %s", (project_id,)
        )
        versions = dict(await cur.fetchall())
    assert versions[SUBJECT] not in seen and versions["user-9"] > 0


async def test_a_scope_read_twice_unchanged_serves_its_facts_from_memory(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    await load_facts(channel, project_id)
    cache: ScopeCache = server.runtime.value.scope_cache
    query = "Where does Tom live?"
    first, served = await served_from_memory(channel, project_id, cache, query)
    assert [f.id for f in served.packet.facts] == [f.id for f in first.packet.facts]
    hits = cache.stats[FACTS].hits
    # A retired fact is never served from the copy that still holds it.
    retired = served.packet.facts[0].id
    await memory_stub(channel).RetireFact(
        memory_pb2.RetireFactRequest(project_id=project_id, fact_id=retired, reason="moved")
    )
    after = await assemble(channel, project_id, query)
    assert cache.stats[FACTS].hits == hits
    assert retired not in [f.id for f in after.packet.facts]


async def served_from_memory(
    channel: grpc.aio.Channel, project_id: str, cache: ScopeCache, query: str
) -> tuple[Any, Any]:
    """A call, a second that has the scope's facts loaded, and a third served from them."""
    first = await assemble(channel, project_id, query)
    await assemble(channel, project_id, query)
    await cache.wait_loaded()
    hits = cache.stats[FACTS].hits
    served = await assemble(channel, project_id, query)
    assert cache.stats[FACTS].hits == hits + 1
    return first, served


async def test_a_copys_size_is_about_the_memory_it_takes(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    """`nbytes`, which the cache's budget counts, is within a third of what a loaded copy
    allocates: SATCHEL_SCOPE_CACHE_MB is the memory the copies take, not a figure of speech.
    The least of five loads: the server's other tasks may allocate during one."""
    await load_conversation(channel, project_id)
    await load_facts(channel, project_id)
    runtime = server.runtime.value
    for loader in (load_scope_events, load_scope_facts):
        allocated = []
        async with runtime.pool.connection() as conn:
            await loader(conn, project_id, SUBJECT, max_rows=1000)  # the first load's caches
            for _ in range(5):
                gc.collect()
                tracemalloc.start()
                try:
                    copy = await loader(conn, project_id, SUBJECT, max_rows=1000)
                    assert copy is not None and len(copy)
                    gc.collect()
                    allocated.append(tracemalloc.get_traced_memory()[0])
                finally:
                    tracemalloc.stop()
        assert 0.75 < copy.nbytes / min(allocated) < 1.33, (loader.__name__, allocated)


async def test_float16_copies_take_half_the_vector_memory_and_rank_alike(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    """SATCHEL_SCOPE_CACHE_VECTORS=float16: the same candidates as the statements and as float32
    copies, cosines within float16's rounding (not identical: benchmarks/context.md measures
    the packets)."""
    await load_conversation(channel, project_id)
    await load_facts(channel, project_id)
    runtime = server.runtime.value
    cfg = runtime.settings.context
    ranking = ranking_of(cfg)
    scope = scope_of(project_id)
    half = np.dtype(np.float16)
    async with runtime.pool.connection() as conn:
        exact = await load_scope_facts(conn, project_id, SUBJECT, 1000)
        compact = await load_scope_facts(conn, project_id, SUBJECT, 1000, half)
        exact_events = await load_scope_events(conn, project_id, SUBJECT, 1000)
        events = await load_scope_events(conn, project_id, SUBJECT, 1000, half)
    assert exact is not None and compact is not None
    assert exact_events is not None and events is not None
    assert compact.vectors.dtype == half and events.vectors.dtype == half
    assert compact.vectors.nbytes * 2 == exact.vectors.nbytes
    assert compact.nbytes < exact.nbytes - exact.vectors.nbytes // 3

    def assert_alike(expected: list, actual: list) -> None:
        assert {r.id for r in actual} == {r.id for r in expected}
        by_id = {r.id: r for r in expected}
        for row in actual:
            assert math.isclose(row.similarity, by_id[row.id].similarity, abs_tol=2e-3)

    for query in FACT_QUERIES:
        vector = await runtime.embed_query(query)
        async with runtime.pool.connection() as conn:
            plan = await plan_query(conn, scope, query, cfg)
            expected = await fetch_fact_candidates(conn, scope, vector, cfg, plan)
        parts = assembly.fact_query(ranking, cfg, scope, vector, plan)
        actual = FactRanking(compact, parts).candidates().facts
        assert_alike(expected.facts, actual)
        for row in actual:  # text and recency do not read vectors
            want = next(r for r in expected.facts if r.id == row.id)
            assert math.isclose(row.text_rank, want.text_rank, abs_tol=1e-6)
            assert math.isclose(row.recency, want.recency, abs_tol=1e-6)
        episodes = [
            await assembly.ranked_episodes(
                runtime, ranking, scope, vector, plan, fail, held, facts, cfg
            )
            for held, facts in ((exact_events, exact), (events, compact))
        ]
        assert episodes[0], query
        assert_alike(*episodes)


async def test_a_server_holds_the_vector_type_it_is_configured_with(
    settings: Settings, project_id: str
) -> None:
    """SATCHEL_SCOPE_CACHE_VECTORS reaches the copies a server loads, and they serve calls."""
    context = replace(settings.context, scope_cache_vectors="float16")
    async with running(settings, context=context) as compact, channel_to(compact) as channel:
        await load_facts(channel, project_id)
        cache: ScopeCache = compact.runtime.value.scope_cache
        first, served = await served_from_memory(channel, project_id, cache, "Where does Tom live?")
        (held,) = cache.copies(project_id)
        assert held.vectors.dtype == np.float16
        assert {f.id for f in served.packet.facts} == {f.id for f in first.packet.facts}


def test_a_copy_keeps_float32_vectors_whose_components_float16_cannot_hold() -> None:
    """A model whose vectors are not normalised may store components beyond float16's range
    (65,504): such a copy keeps them as stored rather than ranking on infinities."""
    from pgvector import Vector

    from satchel.server.context.storage.scopes import _vectors

    half = np.dtype(np.float16)
    rows = [{"embedding": Vector([3.0, 4.0])}, {"embedding": Vector([0.6, 0.8])}]
    vectors, norms = _vectors(rows, half)
    assert vectors.dtype == half and np.allclose(norms, [5.0, 1.0])  # the stored vectors'
    rows.append({"embedding": Vector([1e5, 1.0])})
    vectors, _ = _vectors(rows, half)
    assert vectors.dtype == np.float32 and np.isfinite(vectors).all()
