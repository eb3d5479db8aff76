"""Hybrid ranking (the default) against the real database and model: BM25 over stemmed lexemes
for facts and events, one ranked list, episodes lifted by their neighbours, and episodes that
never bring back what the filters hid. The seed's ranking is tested in test_context.py."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf import duration_pb2
from helpers.memory import event_request, fact_request
from helpers.memory import stub as memory_stub
from helpers.paths import ROOT
from test_context import assemble, assert_facts, trace_of, ts

from satchel.server.context.storage.candidates import fetch_fact_candidates
from satchel.server.context.storage.episodes import fetch_episodes
from satchel.server.context.storage.plan import plan_query
from satchel.server.context.storage.sql import Scope
from satchel.v1 import context_pb2 as pb
from satchel.v1 import memory_pb2

FACT, EPISODE = pb.CANDIDATE_KIND_FACT, pb.CANDIDATE_KIND_EPISODE
INCLUDED, EXCLUDED = pb.DECISION_OUTCOME_INCLUDED, pb.DECISION_OUTCOME_EXCLUDED
W_SIMILARITY, W_TEXT, W_RECENCY = 0.7, 0.3, 0.02


def own_score(d: pb.Decision) -> float:
    return W_SIMILARITY * d.similarity + W_TEXT * d.text_rank + W_RECENCY * d.recency


async def record(
    channel: grpc.aio.Channel, project_id: str, text: str, at: datetime | None = None, **fields
) -> str:
    speaker = fields.pop("speaker", "Caroline")
    extra = {"occurred_at": ts(at)} if at is not None else {}
    reply = await memory_stub(channel).RecordEvent(
        event_request(project_id, payload={"speaker": speaker, "text": text}, **extra, **fields)
    )
    return reply.event.id


async def test_facts_and_episodes_are_ranked_in_one_list_on_cosine_and_bm25(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    await assert_facts(channel, project_id, ["Caroline paints landscapes on Sundays"])
    base = datetime.now(UTC) - timedelta(days=3)
    lake, traffic = "I went painting by the lake with my brushes", "Traffic was awful this morning"
    await record(channel, project_id, lake, base, speaker="Ana")
    await record(channel, project_id, traffic, base + timedelta(days=1), speaker="Ana")
    reply = await assemble(channel, project_id, "What did Caroline paint?", max_distance=0.0)
    trace = await trace_of(channel, project_id, reply.trace_id)
    decided = list(trace.decisions)
    assert {d.candidate_kind for d in decided} == {FACT, EPISODE}
    scores = [d.score for d in decided]
    assert scores == sorted(scores, reverse=True), "one pass over both kinds, in score order"
    by_preview = {d.preview: d for d in decided}
    # Stemmed: "paint" matches "paints" and "painting"; the best match of each kind ranks 1.
    assert by_preview["Caroline paints landscapes on Sundays"].text_rank == 1.0
    assert by_preview[f"Ana: {lake}"].text_rank == 1.0
    assert by_preview[f"Ana: {traffic}"].text_rank == 0.0
    for d in decided:
        assert d.score >= own_score(d) - 1e-9
        if d.candidate_kind == FACT:
            assert math.isclose(d.score, own_score(d), abs_tol=1e-9)


async def test_a_reply_rises_with_the_question_it_answers(
    channel: grpc.aio.Channel, project_id: str, start_server
) -> None:
    """The reply shares no word with the query; its neighbour, the question it answers, does."""
    start = datetime.now(UTC) - timedelta(days=40)
    question = await record(
        channel, project_id, "Did you see the northern lights in Tromso?", start, speaker="Ana"
    )
    reply_id = await record(
        channel, project_id, "Yes! Last winter, it was magical", start + timedelta(seconds=15)
    )
    for day in range(1, 9):  # later chatter, more than an hour away from both
        await record(
            channel,
            project_id,
            f"Ordinary day {day}: groceries, laundry and a long walk",
            start + timedelta(days=day),
        )
    query = "When were the northern lights seen?"
    reply = await assemble(channel, project_id, query, budget_tokens=70)
    trace = await trace_of(channel, project_id, reply.trace_id)
    by_id = {d.candidate_id: d for d in trace.decisions}
    lifted, asked = by_id[reply_id], by_id[question]
    assert lifted.text_rank == 0.0
    expected = 0.6 * own_score(asked) + 0.4 * own_score(lifted)
    assert math.isclose(lifted.score, expected, abs_tol=1e-9) and lifted.score > own_score(lifted)
    served = [e.event_id for e in reply.packet.episodes]
    assert served[:2] == [question, reply_id]

    async with start_server(episode_context_weight=0.0) as alone:
        reply = await assemble(alone, project_id, query, budget_tokens=70)
        trace = await trace_of(alone, project_id, reply.trace_id)
    (unlifted,) = [d for d in trace.decisions if d.candidate_id == reply_id]
    assert math.isclose(unlifted.score, own_score(unlifted), abs_tol=1e-9)


async def test_neighbours_are_within_the_context_gap(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    start = datetime.now(UTC) - timedelta(days=2)
    question = await record(channel, project_id, "Where is the violin recital?", start)
    far = await record(channel, project_id, "Okay see you", start + timedelta(hours=2))
    reply = await assemble(channel, project_id, "Where is the violin recital?")
    trace = await trace_of(channel, project_id, reply.trace_id)
    (later,) = [d for d in trace.decisions if d.candidate_id == far]
    assert question in {d.candidate_id for d in trace.decisions}
    assert math.isclose(later.score, own_score(later), abs_tol=1e-9), "2 h apart: no neighbour"


async def test_an_episode_that_outranks_its_fact_is_served(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    said = "My cat Miso knocked my coffee over this morning"
    event_id = await record(channel, project_id, said, speaker="Ana")
    (fact_id,) = await assert_facts(
        channel, project_id, ["Ana has a grey cat called Miso"], source_event_ids=[event_id]
    )
    reply = await assemble(channel, project_id, "What did the cat do to the coffee?")
    assert event_id in [e.event_id for e in reply.packet.episodes]
    trace = await trace_of(channel, project_id, reply.trace_id)
    fact = next(d for d in trace.decisions if d.candidate_id == fact_id)
    assert (fact.outcome, fact.reason_code) == (EXCLUDED, "source_already_served")


async def test_episodes_never_bring_back_what_the_filters_hid(
    channel: grpc.aio.Channel, seed_channel: grpc.aio.Channel, project_id: str
) -> None:
    memory = memory_stub(channel)
    now = datetime.now(UTC)
    old_budget = await record(channel, project_id, "My budget is around 2000 euros", speaker="Ana")
    new_budget = await record(channel, project_id, "Actually my budget is 3000 euros now")
    (first,) = await assert_facts(
        channel, project_id, ["Ana's budget is 2000 euros"], source_event_ids=[old_budget]
    )
    await memory.AssertFact(
        fact_request(
            project_id,
            predicate="budget",
            value=3000,
            statement="Ana's budget is 3000 euros",
            source_event_ids=[new_budget],
            supersedes_fact_ids=[first],
        )
    )
    berlin = await record(channel, project_id, "I'm in Berlin this week", now - timedelta(days=9))
    await memory.AssertFact(
        fact_request(
            project_id,
            predicate="location",
            value="Berlin",
            statement="Ana is in Berlin",
            valid_from=ts(now - timedelta(days=9)),
            stale_after=duration_pb2.Duration(seconds=7 * 86400),
            source_event_ids=[berlin],
        )
    )
    flight = await record(channel, project_id, "My flight to Oslo leaves on May 3")
    dates = []
    for day in ("May 3", "May 5"):
        reply = await memory.AssertFact(
            fact_request(
                project_id,
                predicate="flight_date",
                value=day,
                statement=f"Ana's flight to Oslo leaves on {day}",
                source_event_ids=[flight],
            )
        )
        dates.append(reply.fact.id)
    await memory.OpenConflict(
        memory_pb2.OpenConflictRequest(project_id=project_id, subject_id="user-1", fact_ids=dates)
    )
    hidden = {old_budget, berlin, flight}
    for ranking in (channel, seed_channel):
        for query in ("What is Ana's budget?", "Where is Ana this week?", "When is the flight?"):
            reply = await assemble(ranking, project_id, query)
            served = {e.event_id for e in reply.packet.episodes}
            assert not served & hidden, query
            trace = await trace_of(ranking, project_id, reply.trace_id)
            for d in trace.decisions:
                if d.candidate_id in hidden:
                    assert (d.outcome, d.reason_code) == (EXCLUDED, "source_facts_hidden")
    reply = await assemble(channel, project_id, "What is Ana's budget?")
    assert "Ana's budget is 3000 euros" in [f.statement for f in reply.packet.facts]


async def test_french_text_is_stemmed_in_french(channel: grpc.aio.Channel, project_id: str) -> None:
    await assert_facts(
        channel,
        project_id,
        ["Les chats de Léa mangeaient des croquettes au saumon", "Le train part à midi"],
    )
    reply = await assemble(channel, project_id, "Que mange le chat de Léa ?")
    trace = await trace_of(channel, project_id, reply.trace_id)
    by_preview = {d.preview: d for d in trace.decisions}
    assert by_preview["Les chats de Léa mangeaient des croquettes au saumon"].text_rank == 1.0
    assert by_preview["Le train part à midi"].text_rank == 0.0
    assert reply.packet.facts[0].statement.startswith("Les chats")


def _bm25(tf: int, df: int, documents: int, length: int, average: float) -> float:
    idf = math.log(1 + (documents - df + 0.5) / (df + 0.5))
    return idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / average))


async def test_text_rank_is_okapi_bm25_over_the_scope_statistics(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    statements = [
        "Jordan bakes sourdough bread",
        "Jordan bakes bread and bakes bagels every Sunday morning",
        "Priya grows tomatoes",
        "Priya sings in a choir",
    ]
    await assert_facts(channel, project_id, statements)
    await record(channel, project_id, "Bread again tonight, Jordan insisted", speaker="Priya")
    await record(channel, project_id, "He bakes bread, then more bread", speaker="Priya")
    runtime = server.runtime.value
    cfg = runtime.settings.context
    scope = Scope(project_id, "user-1", datetime.now(UTC), historical=False)
    query = "Who bakes bread?"
    async with runtime.pool.connection() as conn:
        plan = await plan_query(conn, scope, query, cfg)
        assert plan.terms == ["bake", "bread"]  # stemmed, "who" is a stop word
        cur = await conn.execute(
            """
            SELECT lexemes::text, lexeme_tokens, statement FROM facts WHERE project_id = %s
            UNION ALL SELECT lexemes::text, lexeme_tokens, text FROM events WHERE project_id = %s
            """,
            (project_id, project_id),
        )
        documents = await cur.fetchall()
        # The statistics kept on write equal a recount of the scope's documents.
        cur = await conn.execute(
            "SELECT lexeme, documents FROM scope_lexemes WHERE project_id = %s", (project_id,)
        )
        counted = dict(await cur.fetchall())
        cur = await conn.execute(
            "SELECT documents, tokens FROM scope_documents WHERE project_id = %s", (project_id,)
        )
        sizes = await cur.fetchone()
        vector = await runtime.embed_query(query)
        rows = await fetch_fact_candidates(conn, scope, vector, cfg, plan)
        episodes = await fetch_episodes(conn, scope, vector, cfg, plan)

    parsed = []
    for lexemes, tokens, text in documents:
        tf = Counter()
        for item in lexemes.split(" "):
            lexeme, _, positions = item.partition(":")
            tf[lexeme.strip("'")] = len(positions.split(","))
        parsed.append((text, tf, tokens))
    df = Counter(lexeme for _, tf, _ in parsed for lexeme in tf)
    assert counted == dict(df)
    assert sizes == (len(parsed), sum(tokens for *_, tokens in parsed))
    average = sizes[1] / sizes[0]
    assert math.isclose(plan.avg_tokens, average)
    raw = {
        text: sum(_bm25(tf[t], df[t], len(parsed), tokens, average) for t in plan.terms if tf[t])
        for text, tf, tokens in parsed
    }
    best_fact = max(raw[s] for s in statements)
    by_statement = {r.statement: r for r in rows.facts}
    for statement in statements:
        expected = raw[statement] / best_fact
        assert math.isclose(by_statement[statement].text_rank, expected, abs_tol=1e-9)
    # Two "bakes" in a longer fact: BM25 saturates tf and normalises length.
    assert by_statement[statements[0]].text_rank != by_statement[statements[1]].text_rank
    # Events are ranked alike, divided by the best event; "bread" twice reads its frequency.
    events = {text: raw[text] for text, *_ in parsed if text not in statements}
    assert len(events) == 2
    best_event = max(events.values())
    by_text = {r.text: r for r in episodes}
    for text, value in events.items():
        assert math.isclose(by_text[text].text_rank, value / best_event, abs_tol=1e-9)


async def test_a_value_stated_again_later_is_served_newest_first(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    now = datetime.now(UTC)
    stated = [(700, "Ben lives in Paris"), (200, "Ben lives in Lyon"), (10, "Ben lives in Nantes")]
    for days, statement in stated:
        await memory_stub(channel).AssertFact(
            fact_request(
                project_id,
                predicate="home_city",
                value=statement.split()[-1],
                statement=statement,
                valid_from=ts(now - timedelta(days=days)),
            )
        )
    await assert_facts(channel, project_id, ["Ben's sister lives in Toronto"])
    reply = await assemble(channel, project_id, "Where does Ben live?")
    order = [f.statement for f in reply.packet.facts]
    assert [s for s in order if s in dict(map(reversed, stated))] == [
        "Ben lives in Nantes",
        "Ben lives in Lyon",
        "Ben lives in Paris",
    ]
    trace = await trace_of(channel, project_id, reply.trace_id)
    lifted = [d for d in trace.decisions if d.score > own_score(d) + 1e-9]
    lowered = [d for d in trace.decisions if d.score < own_score(d) - 1e-9]
    assert not lowered, "nothing is lowered"
    assert lifted and all(d.preview in ("Ben lives in Nantes", "Ben lives in Lyon") for d in lifted)


def test_the_knowledge_update_benchmark_runs_every_ranking(settings, test_root) -> None:
    import asyncio
    import sys
    from dataclasses import replace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import knowledge_updates

    results = asyncio.run(knowledge_updates.run(replace(settings, data_dir=test_root / "ku")))
    assert set(results) == set(knowledge_updates.RANKINGS)
    for result in results.values():
        assert result["scenarios"] == len(knowledge_updates.SCENARIOS)
        assert 0 <= result["newest_first"] <= result["scenarios"]
    default = results["hybrid (default)"]
    assert default["newest_first"] >= results["hybrid, newer-wins off"]["newest_first"]


async def test_scored_columns_stay_in_their_rows(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    """Vectors and lexemes are read for every scored document: none is stored in TOAST, where
    each read would be an index lookup more (migration 0009)."""
    await assert_facts(channel, project_id, ["Jordan bakes sourdough bread every Sunday"])
    await record(channel, project_id, "Bread again tonight, Jordan insisted " * 8)
    async with server.runtime.value.pool.connection() as conn:
        cur = await conn.execute(
            """
            SELECT count(*) FILTER (WHERE pg_column_toast_chunk_id(embedding) IS NOT NULL
                                       OR pg_column_toast_chunk_id(lexemes) IS NOT NULL),
                   count(*)
            FROM (SELECT embedding, lexemes FROM facts WHERE project_id = %(p)s
                  UNION ALL SELECT embedding, lexemes FROM events WHERE project_id = %(p)s) d
            """,
            {"p": project_id},
        )
        assert await cur.fetchone() == (0, 2)
