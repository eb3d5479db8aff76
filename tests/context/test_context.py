"""ContextService against the real database and model: every rule of context assembly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import duration_pb2, json_format, timestamp_pb2
from helpers.memory import event_request, expect_error, fact_request
from helpers.memory import stub as memory_stub

from satchel.v1 import context_pb2 as pb
from satchel.v1 import context_pb2_grpc, memory_pb2

INCLUDED = pb.DECISION_OUTCOME_INCLUDED
EXCLUDED = pb.DECISION_OUTCOME_EXCLUDED
BLOCKED = pb.DECISION_OUTCOME_BLOCKED
SUBJECT = "user-1"

CAROLINE = [
    "Caroline moved to Lisbon in March 2023",
    "Caroline works as a nurse on night shifts",
    "Caroline is allergic to peanuts",
    "Caroline adopted a rescue dog named Biscuit",
    "Caroline plays the violin in a community orchestra",
    "Caroline's favourite food is pad thai",
]


def ts(moment: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(moment)
    return message


def context_stub(channel: grpc.aio.Channel) -> context_pb2_grpc.ContextServiceStub:
    return context_pb2_grpc.ContextServiceStub(channel)


async def assert_facts(
    channel: grpc.aio.Channel, project_id: str, statements: list[str], **fields
) -> list[str]:
    """Assert one fact per statement; return their ids in order."""
    ids = []
    for i, statement in enumerate(statements):
        reply = await memory_stub(channel).AssertFact(
            fact_request(
                project_id, predicate=f"note_{i}", value=statement, statement=statement, **fields
            )
        )
        ids.append(reply.fact.id)
    return ids


async def assemble(channel: grpc.aio.Channel, project_id: str, query: str, **fields):
    return await context_stub(channel).AssembleContext(
        pb.AssembleContextRequest(project_id=project_id, subject_id=SUBJECT, query=query, **fields)
    )


async def stream(channel: grpc.aio.Channel, project_id: str, query: str, **fields):
    call = context_stub(channel).StreamContext(
        pb.StreamContextRequest(project_id=project_id, subject_id=SUBJECT, query=query, **fields)
    )
    return [message async for message in call]


async def trace_of(channel: grpc.aio.Channel, project_id: str, trace_id: str) -> pb.Trace:
    reply = await context_stub(channel).GetTrace(
        pb.GetTraceRequest(project_id=project_id, trace_id=trace_id)
    )
    return reply.trace


def decisions_by_id(trace: pb.Trace) -> dict[str, pb.Decision]:
    return {d.candidate_id: d for d in trace.decisions}


async def test_packs_by_score_within_budget_and_traces_every_candidate(
    seed_channel: grpc.aio.Channel, project_id: str
) -> None:
    """The seed's formula (SATCHEL_RANKING=seed): 0.6 cosine + 0.25 text + 0.15 recency."""
    channel = seed_channel
    ids = await assert_facts(channel, project_id, CAROLINE)
    reply = await assemble(
        channel, project_id, "Which city did Caroline move to?", budget_tokens=25
    )
    packet = reply.packet
    assert packet.status == pb.PACKET_STATUS_OK and not packet.warnings
    assert packet.facts[0].statement == "Caroline moved to Lisbon in March 2023"
    assert 0 < packet.tokens_used <= 25 and packet.budget_tokens == 25
    served_tokens = sum(max(1, len(f.statement) // 4) for f in packet.facts)
    assert served_tokens == packet.tokens_used

    trace = await trace_of(channel, project_id, reply.trace_id)
    by_id = decisions_by_id(trace)
    assert set(ids) <= set(by_id), "every candidate of a small scope is decided"
    assert [d.sequence for d in trace.decisions] == list(range(1, len(trace.decisions) + 1))
    facts = [d for d in trace.decisions if d.candidate_kind == pb.CANDIDATE_KIND_FACT]
    scores = [d.score for d in facts]
    assert scores == sorted(scores, reverse=True), "the main pass decides in score order"
    assert {d.reason_code for d in facts} == {"relevance", "over_budget"}
    for d in facts:
        assert abs(d.score - (0.6 * d.similarity + 0.25 * d.text_rank + 0.15 * d.recency)) < 1e-9
        assert 0.99 < d.recency <= 1.0  # asserted just now
        assert d.budget_used <= 25
    included = [d.candidate_id for d in trace.decisions if d.outcome == INCLUDED]
    assert [f.id for f in packet.facts] == [i for i in included if i in ids]


async def test_budget_is_never_exceeded_across_facts_and_episodes(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    for text in ("I just moved to Lisbon!", "My dog Biscuit loves the beach", "Work was long"):
        await memory_stub(channel).RecordEvent(
            event_request(project_id, payload={"speaker": "Caroline", "text": text})
        )
    for budget in (1, 7, 19, 40, 60, 900):
        reply = await assemble(channel, project_id, "Tell me about Caroline", budget_tokens=budget)
        packet = reply.packet
        # the budget bounds the rendered block the agent reads, tags, dates and headers too
        assert packet.token_counter == "block:chars/4"
        assert packet.tokens_used == (max(1, len(packet.block) // 4) if packet.block else 0)
        assert packet.tokens_used <= budget
        assert packet.block.count("\n- ") == len(packet.facts) + len(packet.episodes)
        texts = sum(max(1, len(f.statement) // 4) for f in packet.facts) + sum(
            max(1, len(e.excerpt) // 4) for e in packet.episodes
        )
        assert texts < packet.tokens_used or not packet.block, "the block is more than its texts"
    assert len(packet.facts) == len(CAROLINE) and len(packet.episodes) == 3


async def test_default_budget_and_invalid_budgets(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    reply = await assemble(channel, project_id, "anything")
    assert reply.packet.budget_tokens == 900
    for budget in (0, -5, 10_000_000):
        code, violations, reason = await expect_error(
            assemble(channel, project_id, "anything", budget_tokens=budget)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert reason == "BUDGET_EXCEEDED"
        assert [field for field, _ in violations] == ["budget_tokens"]
    code, violations, _ = await expect_error(
        context_stub(channel).AssembleContext(pb.AssembleContextRequest(query="   "))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert {field for field, _ in violations} == {"project_id", "subject_id", "query"}


async def test_any_user_text_is_accepted_as_a_query(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE[:2])
    for query in ('"unbalanced quote', "a & b | !c", "-- DROP TABLE facts; ((", "ünïcødé ☃"):
        reply = await assemble(channel, project_id, query)
        assert reply.packet.status == pb.PACKET_STATUS_OK


async def test_hard_filters_scope_status_and_validity(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    now = datetime.now(UTC)
    kept, retired, ended = await assert_facts(
        channel,
        project_id,
        ["Caroline lives in Lisbon", "Caroline lives in Porto", "Caroline lives in Oslo"],
    )
    await memory_stub(channel).RetireFact(
        memory_pb2.RetireFactRequest(project_id=project_id, fact_id=retired, reason="wrong")
    )
    past = await memory_stub(channel).AssertFact(
        fact_request(
            project_id,
            predicate="home",
            statement="Caroline lives in Quito",
            valid_from=ts(now - timedelta(days=30)),
            valid_to=ts(now - timedelta(days=1)),
        )
    )
    other_subject = await memory_stub(channel).AssertFact(
        fact_request(project_id, subject_id="user-2", statement="Caroline lives in Denver")
    )
    other_project = await memory_stub(channel).AssertFact(
        fact_request(project_id + "-x", statement="Caroline lives in Austin")
    )
    reply = await assemble(channel, project_id, "Where does Caroline live?")
    trace = await trace_of(channel, project_id, reply.trace_id)
    decided = set(decisions_by_id(trace))
    assert kept in decided and ended in decided
    hidden = {retired, past.fact.id, other_subject.fact.id, other_project.fact.id}
    assert not hidden & decided, "hard filters apply before any score"
    assert {f.id for f in reply.packet.facts} == {kept, ended}


async def test_open_conflict_blocks_its_facts_and_degrades_the_packet(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    lisbon, porto, dog = await assert_facts(
        channel,
        project_id,
        ["Caroline lives in Lisbon", "Caroline lives in Porto", "Caroline has a dog named Biscuit"],
    )
    opened = await memory_stub(channel).OpenConflict(
        memory_pb2.OpenConflictRequest(
            project_id=project_id, subject_id=SUBJECT, fact_ids=[lisbon, porto], note="which city?"
        )
    )
    reply = await assemble(channel, project_id, "Where does Caroline live?")
    assert reply.packet.status == pb.PACKET_STATUS_DEGRADED
    assert list(reply.packet.warnings) == [
        "open_conflict: 2 fact(s) hidden pending conflict resolution"
    ]
    assert [f.id for f in reply.packet.facts] == [dog]
    by_id = decisions_by_id(await trace_of(channel, project_id, reply.trace_id))
    for fact_id in (lisbon, porto):
        assert (by_id[fact_id].outcome, by_id[fact_id].reason_code) == (BLOCKED, "conflict_open")
        assert by_id[fact_id].budget_used == 0 or by_id[fact_id].sequence < by_id[dog].sequence

    await memory_stub(channel).ResolveConflict(
        memory_pb2.ResolveConflictRequest(
            project_id=project_id, conflict_id=opened.conflict.id, winning_fact_id=porto
        )
    )
    reply = await assemble(channel, project_id, "Where does Caroline live?")
    assert reply.packet.status == pb.PACKET_STATUS_OK and not reply.packet.warnings
    assert {f.id for f in reply.packet.facts} == {porto, dog}


async def test_volatility_horizon_hides_stale_facts_with_a_warning(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    now = datetime.now(UTC)
    stale = await memory_stub(channel).AssertFact(
        fact_request(
            project_id,
            predicate="mood",
            statement="Caroline is feeling tired today",
            valid_from=ts(now - timedelta(days=2)),
            stale_after=duration_pb2.Duration(seconds=86400),
        )
    )
    fresh = await memory_stub(channel).AssertFact(
        fact_request(
            project_id,
            predicate="mood",
            statement="Caroline is excited about the trip",
            stale_after=duration_pb2.Duration(seconds=86400),
        )
    )
    reply = await assemble(channel, project_id, "How is Caroline feeling?")
    assert [f.id for f in reply.packet.facts] == [fresh.fact.id]
    assert reply.packet.status == pb.PACKET_STATUS_DEGRADED
    assert list(reply.packet.warnings) == [
        "volatility_expired: 1 fact(s) hidden past their volatility horizon"
    ]
    decision = decisions_by_id(await trace_of(channel, project_id, reply.trace_id))[stale.fact.id]
    assert (decision.outcome, decision.reason_code) == (EXCLUDED, "volatility_expired")


async def test_stream_sends_decisions_then_the_packet_equal_to_unary_and_trace(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    await memory_stub(channel).RecordEvent(
        event_request(project_id, payload={"speaker": "Caroline", "text": "Lisbon is lovely"})
    )
    query = "What does Caroline do for work?"
    messages = await stream(channel, project_id, query, budget_tokens=30)
    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds[-1] == "packet" and set(kinds[:-1]) == {"decision"}
    trace_id = messages[0].trace_id
    assert {m.trace_id for m in messages} == {trace_id}
    streamed = [m.decision for m in messages[:-1]]

    trace = await trace_of(channel, project_id, trace_id)
    assert list(trace.decisions) == streamed, "GetTrace returns exactly what was streamed"
    assert trace.query == query and trace.budget_tokens == 30 and trace.subject_id == SUBJECT
    assert trace.timings.total_ms >= trace.timings.embed_ms > 0
    assert trace.tokens_used == messages[-1].packet.tokens_used

    unary = await assemble(channel, project_id, query, budget_tokens=30)
    streamed_packet, unary_packet = messages[-1].packet, unary.packet
    assert [f.id for f in streamed_packet.facts] == [f.id for f in unary_packet.facts]
    assert [e.event_id for e in streamed_packet.episodes] == [
        e.event_id for e in unary_packet.episodes
    ]
    assert streamed_packet.tokens_used == unary_packet.tokens_used
    unary_trace = await trace_of(channel, project_id, unary.trace_id)
    assert [(d.candidate_id, d.outcome, d.reason_code) for d in unary_trace.decisions] == [
        (d.candidate_id, d.outcome, d.reason_code) for d in streamed
    ]


async def test_stream_sends_decisions_in_batches_when_asked(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """max_decisions_per_message > 1: the first decision alone, then batches of at most that
    many; the same decisions in the same order as one a message, and as GetTrace returns."""
    await assert_facts(channel, project_id, CAROLINE)
    for text in ("Lisbon is lovely", "Night shifts again, the ward was busy"):
        await memory_stub(channel).RecordEvent(
            event_request(project_id, payload={"speaker": "Caroline", "text": text})
        )
    query = "What does Caroline do for work?"
    one_by_one = await stream(channel, project_id, query)
    batched = await stream(channel, project_id, query, max_decisions_per_message=3)

    kinds = [m.WhichOneof("event") for m in batched]
    assert kinds[-1] == "packet" and set(kinds[:-1]) == {"decisions"}
    batches = [list(m.decisions.decisions) for m in batched[:-1]]
    assert len(batches[0]) == 1 and all(1 <= len(b) <= 3 for b in batches)
    flat = [d for b in batches for d in b]
    singles = [m.decision for m in one_by_one[:-1]]
    assert len(singles) >= 8 and len(batched) < len(one_by_one)

    def key(d: pb.Decision) -> tuple:
        return (d.sequence, d.candidate_id, d.outcome, d.reason_code)

    assert [key(d) for d in flat] == [key(d) for d in singles]
    trace = await trace_of(channel, project_id, batched[0].trace_id)
    assert list(trace.decisions) == flat
    assert [f.id for f in batched[-1].packet.facts] == [f.id for f in one_by_one[-1].packet.facts]

    code, violations, _ = await expect_error(
        stream(channel, project_id, query, max_decisions_per_message=257)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in violations] == ["max_decisions_per_message"]


async def test_a_packet_does_not_depend_on_the_calls_beside_it(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """Each query asked alone, then all of them at once (three times each, on the server's
    pool): every concurrent packet and trace equals the one asked alone."""
    await assert_facts(channel, project_id, CAROLINE)
    for text in ("Lisbon is lovely in March", "Biscuit chewed my violin case again"):
        await memory_stub(channel).RecordEvent(
            event_request(project_id, payload={"speaker": "Caroline", "text": text})
        )
    queries = [
        "Where does Caroline live?",
        "What does Caroline do for work?",
        "Tell me about Caroline's dog",
        "Which instrument does Caroline play?",
        "What should I not cook for Caroline?",
        "What is Caroline's favourite food?",
    ]

    async def packet_and_decisions(query: str) -> tuple[bytes, list[tuple], list[float]]:
        reply = await assemble(channel, project_id, query)
        trace = await trace_of(channel, project_id, reply.trace_id)
        decisions = [(d.candidate_id, d.outcome, d.reason_code) for d in trace.decisions]
        return (
            reply.packet.SerializeToString(deterministic=True),
            decisions,
            [d.score for d in trace.decisions],
        )

    alone = [await packet_and_decisions(q) for q in queries]
    together = await asyncio.gather(*(packet_and_decisions(q) for q in queries * 3))
    assert len({packet for packet, _, _ in alone}) == len(queries)  # the queries differ
    for i, (packet, decisions, scores) in enumerate(together):
        expected_packet, expected_decisions, expected_scores = alone[i % len(queries)]
        query = queries[i % len(queries)]
        assert (packet, decisions) == (expected_packet, expected_decisions), query
        # recency follows the clock, which moved between the calls: the last digits only
        assert scores == pytest.approx(expected_scores, abs=1e-4), query


async def test_episodes_fill_the_remaining_budget_after_facts(
    seed_channel: grpc.aio.Channel, project_id: str
) -> None:
    """The seed's order (SATCHEL_RANKING=seed): facts first, then episodes on cosine only."""
    channel = seed_channel
    fact_ids = await assert_facts(channel, project_id, CAROLINE[:2])
    texts = [
        "I finally moved to Lisbon, the light here is amazing",
        "Night shifts at the hospital are exhausting",
        "We should plan a picnic in the park next weekend with everyone",
    ]
    event_ids = []
    for i, text in enumerate(texts):
        reply = await memory_stub(channel).RecordEvent(
            event_request(
                project_id,
                payload={"speaker": "Caroline", "text": text},
                occurred_at=ts(datetime(2024, 5, 1 + i, tzinfo=UTC)),
            )
        )
        event_ids.append(reply.event.id)
    fact_tokens = sum(max(1, len(s) // 4) for s in CAROLINE[:2])
    budget = fact_tokens + 16
    reply = await assemble(channel, project_id, "Where did Caroline move?", budget_tokens=budget)
    packet = reply.packet
    assert {f.id for f in packet.facts} == set(fact_ids)
    assert packet.episodes and packet.episodes[0].event_id == event_ids[0]
    assert packet.episodes[0].excerpt == "Caroline: " + texts[0]
    assert packet.episodes[0].occurred_at.ToDatetime(tzinfo=UTC) == datetime(2024, 5, 1, tzinfo=UTC)
    assert packet.tokens_used <= budget
    trace = await trace_of(channel, project_id, reply.trace_id)
    kinds = [d.candidate_kind for d in trace.decisions]
    assert kinds.index(pb.CANDIDATE_KIND_EPISODE) > max(
        i for i, k in enumerate(kinds) if k == pb.CANDIDATE_KIND_FACT
    ), "episodes are packed after the facts"
    episodes = [d for d in trace.decisions if d.candidate_kind == pb.CANDIDATE_KIND_EPISODE]
    assert {d.reason_code for d in episodes} == {"relevance", "over_budget"}
    for d in episodes:
        assert d.text_rank == 0.0
        assert abs(d.score - (0.6 * d.similarity + 0.15 * d.recency)) < 1e-9


async def test_a_larger_budget_reads_deeper_lists_to_fill_it(
    channel: grpc.aio.Channel, project_id: str, start_server
) -> None:
    """Short messages: four episodes a call leave most of a large budget empty, unless the
    depth follows the budget (SATCHEL_DEPTH_BUDGET_TOKENS)."""
    for day in range(1, 21):
        await memory_stub(channel).RecordEvent(
            event_request(
                project_id,
                payload={"speaker": "Ana", "text": f"Piano practice, day {day}: scales again"},
                occurred_at=ts(datetime(2024, 5, day, tzinfo=UTC)),
            )
        )
    narrow = {"episode_top_k": 4, "episode_pool": 4, "recall_max_distance": 0.0}

    async def served(depth_budget_tokens: int, budget: int) -> tuple[int, int]:
        async with start_server(**narrow, depth_budget_tokens=depth_budget_tokens) as server:
            reply = await assemble(
                server, project_id, "How did Ana's piano practice go?", budget_tokens=budget
            )
            trace = await trace_of(server, project_id, reply.trace_id)
            return len(reply.packet.episodes), len(trace.decisions)

    assert (await served(100, 100))[1] == 4, "at the reference budget, the configured depth"
    assert await served(0, 600) == (4, 4), "a fixed depth whatever the budget"
    episodes, decisions = await served(100, 600)
    assert decisions == 20, "six times the reference budget: 24 asked, the scope's 20 read"
    assert episodes == 20, "and the short messages fill the budget"


async def test_an_episode_whose_fact_is_served_is_left_out(
    channel: grpc.aio.Channel, project_id: str, start_server
) -> None:
    said = "I finally moved to Lisbon, the light here is amazing"
    other = "Lisbon trams are always full in the morning"
    events = []
    for text in (said, other):
        reply = await memory_stub(channel).RecordEvent(
            event_request(project_id, payload={"speaker": "Caroline", "text": text})
        )
        events.append(reply.event.id)
    (fact_id,) = await assert_facts(
        channel, project_id, ["Caroline moved to Lisbon"], source_event_ids=[events[0]]
    )
    query = "Where did Caroline move to?"

    reply = await assemble(channel, project_id, query)
    assert [f.id for f in reply.packet.facts] == [fact_id]
    assert [e.event_id for e in reply.packet.episodes] == [events[1]]
    trace = await trace_of(channel, project_id, reply.trace_id)
    (left_out,) = [d for d in trace.decisions if d.candidate_id == events[0]]
    assert (left_out.outcome, left_out.reason_code) == (
        pb.DECISION_OUTCOME_EXCLUDED,
        "source_already_served",
    )

    async with start_server(skip_served_episodes=False) as unfiltered:
        reply = await assemble(unfiltered, project_id, query)
    assert {e.event_id for e in reply.packet.episodes} == set(events)


async def test_relevance_floor_gates_before_packing_and_reports_no_relevant_memory(
    project_id: str, start_server, channel: grpc.aio.Channel
) -> None:
    await assert_facts(channel, project_id, CAROLINE)
    await memory_stub(channel).RecordEvent(
        event_request(project_id, payload={"speaker": "Caroline", "text": "I adore my violin"})
    )
    async with start_server(recall_max_distance=0.55) as gated:
        off_topic = await assemble(gated, project_id, "quarterly revenue of semiconductor firms")
        assert not off_topic.packet.facts and not off_topic.packet.episodes
        assert off_topic.packet.empty_reason == "no_relevant_memory"
        assert off_topic.packet.status == pb.PACKET_STATUS_OK and not off_topic.packet.warnings
        trace = await trace_of(gated, project_id, off_topic.trace_id)
        assert trace.decisions and all(
            (d.outcome, d.reason_code) == (EXCLUDED, "below_relevance_floor")
            for d in trace.decisions
        )
        assert all(1 - d.similarity > 0.55 for d in trace.decisions)

        on_topic = await assemble(gated, project_id, "Which instrument does Caroline play?")
        assert on_topic.packet.empty_reason == ""
        assert on_topic.packet.facts[0].statement == CAROLINE[4]
        trace = await trace_of(gated, project_id, on_topic.trace_id)
        for d in trace.decisions:
            assert (d.reason_code == "below_relevance_floor") == (1 - d.similarity > 0.55)
    ungated = await assemble(
        channel, project_id, "quarterly revenue of semiconductor firms", max_distance=0.0
    )
    assert len(ungated.packet.facts) == len(CAROLINE) and ungated.packet.empty_reason == ""
    # A request's floor overrides the server's (0.75 by default here).
    overridden = await assemble(
        channel, project_id, "Which instrument does Caroline play?", max_distance=0.55
    )
    assert overridden.packet.facts[0].statement == CAROLINE[4]
    trace = await trace_of(channel, project_id, overridden.trace_id)
    for d in trace.decisions:
        assert (d.reason_code == "below_relevance_floor") == (1 - d.similarity > 0.55)


async def test_the_default_floor_is_the_one_calibrated_for_the_bundled_model(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    """A new user's server gates off-topic questions: the floor calibrated for MiniLM (0.75)."""
    from satchel.server.platform.config import recall_floor

    runtime = server.runtime.value
    assert runtime.settings.context.recall_max_distance is None
    assert recall_floor(runtime.settings.context, runtime.embedder.model_id) == 0.75
    await assert_facts(channel, project_id, CAROLINE)
    reply = await assemble(channel, project_id, "What is the weather in Madrid tomorrow?")
    assert not reply.packet.facts and reply.packet.empty_reason == "no_relevant_memory"
    trace = await trace_of(channel, project_id, reply.trace_id)
    assert all(1 - d.similarity > 0.75 for d in trace.decisions)
    on_topic = await assemble(channel, project_id, "Which city did Caroline move to?")
    assert on_topic.packet.facts[0].statement == CAROLINE[0]
    for bad in (-0.1, 2.5, float("nan")):
        code, violations, _ = await expect_error(
            assemble(channel, project_id, "q", max_distance=bad)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert [f for f, _ in violations] == ["max_distance"]


async def test_multi_hop_adds_a_fact_related_only_through_an_entity(
    project_id: str, start_server, channel: grpc.aio.Channel
) -> None:
    await assert_facts(
        channel,
        project_id,
        [
            "Caroline moved to Lisbon in March",
            "Caroline's sister lives in Toronto",
            "Lisbon hosts a famous tram line numbered 28",  # only linked through "Lisbon"
            "The weather forecast predicts heavy snowfall",
            "Quarterly revenue rose by ten percent",
        ],
    )
    # Two candidates handed to packing: the tram fact is left out of the main pass.
    async with start_server(candidate_limit=2, recall_max_distance=0.6) as narrow:
        reply = await assemble(narrow, project_id, "Where did Caroline move to?")
        statements = [f.statement for f in reply.packet.facts]
        assert statements[0] == "Caroline moved to Lisbon in March"
        assert "Lisbon hosts a famous tram line numbered 28" in statements
        trace = await trace_of(narrow, project_id, reply.trace_id)
        hop = [d for d in trace.decisions if d.reason_code == "multi_hop_expansion"]
        assert [d.preview for d in hop] == ["Lisbon hosts a famous tram line numbered 28"]
        assert 1 - hop[0].similarity > 0.6, "multi-hop is never gated by the floor"
        main = [d for d in trace.decisions if d.sequence < hop[0].sequence]
        assert all("tram" not in d.preview for d in main)


async def test_as_of_serves_the_memory_of_that_instant(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    first = await memory_stub(channel).AssertFact(
        fact_request(project_id, predicate="home", statement="Caroline lives in Lisbon")
    )
    await asyncio.sleep(0.05)
    between = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await memory_stub(channel).AssertFact(
        fact_request(
            project_id,
            predicate="home",
            statement="Caroline lives in Porto",
            supersedes_fact_ids=[first.fact.id],
        )
    )
    now_reply = await assemble(channel, project_id, "Where does Caroline live?")
    assert [f.statement for f in now_reply.packet.facts] == ["Caroline lives in Porto"]
    then = await assemble(channel, project_id, "Where does Caroline live?", as_of=ts(between))
    assert [f.statement for f in then.packet.facts] == ["Caroline lives in Lisbon"]
    trace = await trace_of(channel, project_id, then.trace_id)
    assert abs(trace.as_of.ToDatetime(tzinfo=UTC) - between) < timedelta(milliseconds=1)
    before_all = await assemble(
        channel, project_id, "Where does Caroline live?", as_of=ts(between - timedelta(days=1))
    )
    assert not before_all.packet.facts


async def test_get_trace_is_scoped_to_its_project(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    reply = await assemble(channel, project_id, "hello")
    code, _, _ = await expect_error(
        context_stub(channel).GetTrace(
            pb.GetTraceRequest(project_id=project_id + "-other", trace_id=reply.trace_id)
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    code, violations, _ = await expect_error(
        context_stub(channel).GetTrace(pb.GetTraceRequest(project_id=project_id, trace_id="nope"))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and violations[0][0] == "trace_id"


async def test_stats_overview_reports_the_injection_rate(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, CAROLINE[:1])
    await assemble(channel, project_id, "Where does Caroline live?")
    await assemble(channel, project_id, "Where does Caroline live?", budget_tokens=5)
    await context_stub(channel).AssembleContext(
        pb.AssembleContextRequest(project_id=project_id, subject_id="nobody", query="anything")
    )
    stats = await context_stub(channel).GetStatsOverview(
        pb.GetStatsOverviewRequest(project_id=project_id)
    )
    assert stats.context_calls == 3
    assert stats.calls_serving_facts == 1
    assert stats.calls_empty == 2
    assert abs(stats.injection_rate - 1 / 3) < 1e-9 and stats.hit_rate == stats.injection_rate
    assert 0 < stats.latency_p50_ms <= stats.latency_p95_ms <= stats.latency_p99_ms


async def test_packet_fact_carries_value_confidence_and_sources(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    event = await memory_stub(channel).RecordEvent(
        event_request(project_id, payload={"speaker": "Caroline", "text": "Invoices in French"})
    )
    valid_from = datetime(2024, 1, 2, tzinfo=UTC)
    fact = await memory_stub(channel).AssertFact(
        fact_request(
            project_id,
            value={"language": "fr"},
            confidence=0.8,
            valid_from=ts(valid_from),
            source_event_ids=[event.event.id],
        )
    )
    reply = await assemble(channel, project_id, "Which language for invoices?")
    served = reply.packet.facts[0]
    assert served.id == fact.fact.id
    assert json_format.MessageToDict(served.value) == {"language": "fr"}
    assert served.statement == "invoice language: language = fr"
    assert abs(served.confidence - 0.8) < 1e-9
    assert served.valid_from.ToDatetime(tzinfo=UTC) == valid_from
    assert list(served.source_event_ids) == [event.event.id]


async def _poll(condition, timeout: float = 15.0) -> bool:
    """Wait until the async `condition()` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await condition():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_cancelled_stream_stops_its_database_work(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str, server
) -> None:
    import psycopg

    await assert_facts(channel, project_id, CAROLINE[:2])
    pool = server.runtime.value.pool
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as watcher:

        async def waiting_inserts() -> int:
            cur = await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%INSERT INTO context_calls%%'"
            )
            return (await cur.fetchone())[0]

        async def inserting() -> bool:
            return await waiting_inserts() > 0

        async def not_inserting() -> bool:
            return await waiting_inserts() == 0

        async with await psycopg.AsyncConnection.connect(pg_dsn) as locker:
            # Hold the trace table: the call streams its decisions, then waits to persist.
            await locker.execute("LOCK TABLE context_calls IN ACCESS EXCLUSIVE MODE")
            call = context_stub(channel).StreamContext(
                pb.StreamContextRequest(project_id=project_id, subject_id=SUBJECT, query="hi")
            )
            first = await call.read()
            assert first.WhichOneof("event") == "decision"
            assert await _poll(inserting), "the call never reached its trace insert"
            call.cancel()
            assert await _poll(not_inserting), "the query kept running after the cancel"
            await locker.rollback()
        cur = await watcher.execute(
            "SELECT count(*) FROM context_calls WHERE trace_id = %s", (first.trace_id,)
        )
        assert (await cur.fetchone())[0] == 0, "a cancelled call persists nothing"

    async def pool_idle() -> bool:
        stats = pool.get_stats()
        return stats["pool_available"] == stats["pool_size"]

    assert await _poll(pool_idle), "the cancelled call kept a pooled connection"


SLOW_TRACE_SECONDS = 0.4


@pytest.fixture
async def slow_trace_writes(pg_dsn: str, project_id: str) -> AsyncIterator[None]:
    """Every context call of this test's project takes SLOW_TRACE_SECONDS to write its trace
    (a trigger on the call's row): a reply sent before the trace is committed would be seen."""
    import psycopg

    function = f"slow_trace_{project_id.replace('-', '_')}"
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN PERFORM pg_sleep({SLOW_TRACE_SECONDS}); RETURN NEW; END $$"
        )
        await conn.execute(
            f"CREATE TRIGGER {function} BEFORE INSERT ON context_calls FOR EACH ROW"
            f" WHEN (NEW.project_id = '{project_id}') EXECUTE FUNCTION {function}()"
        )
        try:
            yield
        finally:
            await conn.execute(f"DROP TRIGGER {function} ON context_calls")
            await conn.execute(f"DROP FUNCTION {function}()")


async def _committed_decisions(pg_dsn: str, trace_id: str) -> int | None:
    """The decisions stored for a call, read on a connection of its own (committed data only);
    None when the call's row is not there."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        call = await conn.execute("SELECT 1 FROM context_calls WHERE trace_id = %s", (trace_id,))
        if await call.fetchone() is None:
            return None
        rows = await conn.execute(
            "SELECT count(*) FROM context_traces WHERE trace_id = %s", (trace_id,)
        )
        return (await rows.fetchone())[0]


async def test_the_packet_is_sent_once_its_trace_is_committed(
    channel: grpc.aio.Channel, project_id: str, pg_dsn: str, slow_trace_writes: None
) -> None:
    """The packet is rendered while the trace is written, and sent only once the trace is
    committed: read from another connection the moment the reply (unary) or the packet message
    (stream) arrives, the call and every one of its decisions are there."""
    await assert_facts(channel, project_id, CAROLINE)
    loop = asyncio.get_running_loop()
    started = loop.time()
    reply = await assemble(channel, project_id, "Where does Caroline live?")
    assert loop.time() - started >= SLOW_TRACE_SECONDS  # the reply waited for the slow write
    trace = await trace_of(channel, project_id, reply.trace_id)
    assert await _committed_decisions(pg_dsn, reply.trace_id) == len(trace.decisions) > 0

    call = context_stub(channel).StreamContext(
        pb.StreamContextRequest(project_id=project_id, subject_id=SUBJECT, query="Caroline's job?")
    )
    decisions = 0
    async for message in call:
        if message.WhichOneof("event") == "decision":
            decisions += 1
            continue
        assert message.WhichOneof("event") == "packet"
        assert await _committed_decisions(pg_dsn, message.trace_id) == decisions > 0
