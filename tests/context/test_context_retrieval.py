"""Two-phase retrieval against the exact ranking, and the floor calibration command."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2
from helpers.memory import fact_request
from helpers.memory import stub as memory_stub

from satchel.server import cli
from satchel.server.context.domain.retrieval import (
    SourceReport,
    Weights,
    holds_top,
    unseen_score_bound,
)
from satchel.server.context.domain.scored import FactCandidates
from satchel.server.context.storage.candidates import fetch_fact_candidates
from satchel.server.context.storage.plan import plan_query
from satchel.server.context.storage.sql import Scope
from satchel.server.platform.storage.pool import create_pool
from satchel.v1 import memory_pb2

PEOPLE = ["Caroline", "Melanie", "Jordan", "Priya", "Tomas", "Aiko"]
HOBBIES = [
    "plays the violin",
    "runs marathons",
    "paints watercolours",
    "bakes sourdough bread",
    "climbs at the gym",
    "grows tomatoes",
]


def ids(candidates: FactCandidates) -> list[str]:
    return [fact.id for fact in candidates.facts]


def _ts(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


async def _assert_hobbies(channel: grpc.aio.Channel, requests: list) -> None:
    await memory_stub(channel).BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(requests=requests)
    )


@pytest.mark.parametrize("ranking", ["hybrid", "seed"])
async def test_adaptive_two_phase_matches_the_exact_top_10(
    channel: grpc.aio.Channel, project_id: str, server, ranking: str
) -> None:
    rng = random.Random(3)
    now = datetime.now(UTC)
    await _assert_hobbies(
        channel,
        [
            fact_request(
                project_id,
                predicate="hobby",
                statement=f"{rng.choice(PEOPLE)} {rng.choice(HOBBIES)} every week",
                valid_from=_ts(now - timedelta(days=rng.uniform(0, 200))),
            )
            for _ in range(150)
        ],
    )
    runtime = server.runtime.value
    # Two phases for a scope of more than 16 facts, a window of 16 newest facts.
    cfg = replace(
        runtime.settings.context.with_ranking(ranking),
        retrieval_top_k=8,
        exact_scope_max=16,
        newest_window=16,
        newest_top_k=8,
    )
    fixed = replace(cfg, retrieval_top_k_max=8)
    scope = Scope(project_id, "user-1", now, historical=False)
    misses_when_fixed = 0
    async with runtime.pool.connection() as conn:
        # The last two share no word with the statements: only the vector sources find them.
        queries = (
            "Who plays the violin?",
            "Which person bakes bread?",
            "Tomas hobbies",
            "Who makes music?",
            "Which friend enjoys gardening?",
        )
        for query in queries:
            vector = await runtime.embed_query(query)
            plan = await plan_query(conn, scope, query, cfg)
            assert plan.scope_facts == 17, "counted up to one more than the exact path takes"
            exact = await fetch_fact_candidates(conn, scope, vector, cfg, plan, exact=True)
            adaptive = await fetch_fact_candidates(conn, scope, vector, cfg, plan)
            assert not adaptive.exact, "the two-phase statement served it"
            assert ids(adaptive)[:10] == ids(exact)[:10], query
            narrow = await fetch_fact_candidates(conn, scope, vector, fixed, plan)
            misses_when_fixed += ids(narrow)[:10] != ids(exact)[:10]
        # By default a scope this small is scored exactly, in one statement.
        plan = await plan_query(conn, scope, "Who plays the violin?", runtime.settings.context)
        assert plan.scope_facts == 150
        rows = await fetch_fact_candidates(conn, scope, vector, runtime.settings.context, plan)
        assert rows.exact
    assert misses_when_fixed > 0, "the scope is large enough for K=8 alone to miss"


async def test_a_scope_hnsw_cannot_reach_is_scored_exactly(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    rng = random.Random(5)
    await _assert_hobbies(
        channel,
        [
            fact_request(project_id, statement=f"{rng.choice(PEOPLE)} {rng.choice(HOBBIES)}")
            for _ in range(40)
        ],
    )
    runtime = server.runtime.value
    # The fallback is shared by both rankings; the seed's statement is the one whose plan the
    # settings below force onto a short HNSW scan.
    cfg = replace(
        runtime.settings.context.with_ranking("seed"),
        exact_scope_max=8,
        newest_window=8,
        newest_top_k=4,
        retrieval_top_k=8,
        retrieval_top_k_max=32,
    )
    scope = Scope(project_id, "user-1", datetime.now(UTC), historical=False)
    query = "Who grows tomatoes?"
    vector = await runtime.embed_query(query)
    # A connection of its own: a pooled one may hold the statement prepared by an earlier
    # test, with a generic plan made before the settings below (which then never apply).
    pool = create_pool(
        runtime.settings.database_url, min_size=1, max_size=1,
        ef_search=runtime.settings.hnsw_ef_search,
    )  # fmt: skip
    await pool.open(wait=True)
    async with pool.connection() as conn:
        plan = await plan_query(conn, scope, query, cfg)
        exact = await fetch_fact_candidates(conn, scope, vector, cfg, plan, exact=True)
        # The HNSW scan (the planner's choice on a large table; sorting is the small test
        # table's) returns a single tuple, as a scan that gives up does for a scope that is a
        # tiny share of a large table: the vector source comes back short at every K, which
        # bounds nothing, so the scope is scored fact by fact. (Without iterative scans the
        # scan returns at most ef_search tuples whatever the table holds; a cap on the tuples
        # an iterative scan visits held only when the session's other tests had filled the
        # table.)
        await conn.execute("SET enable_sort = off")
        await conn.execute("SET hnsw.ef_search = 1")
        await conn.execute("SET hnsw.iterative_scan = off")
        try:
            rows = await fetch_fact_candidates(conn, scope, vector, cfg, plan)
        finally:
            await conn.execute("SET hnsw.iterative_scan = relaxed_order")
            await conn.execute(f"SET hnsw.ef_search = {runtime.settings.hnsw_ef_search}")
            await conn.execute("RESET enable_sort")
    await pool.close()
    assert rows.exact, "the exact statement served it"
    assert ids(rows) == ids(exact)


async def test_searched_words_leave_out_words_too_common_in_the_scope(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    statements = [f"Caroline {hobby} every week" for hobby in HOBBIES] + ["Melanie has a cat"]
    await memory_stub(channel).BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(
            requests=[fact_request(project_id, statement=s) for s in statements]
        )
    )
    await memory_stub(channel).AssertFact(fact_request(project_id, statement="Caroline rests"))
    runtime = server.runtime.value
    scope = Scope(project_id, "user-1", datetime.now(UTC), historical=False)
    cfg = replace(runtime.settings.context.with_ranking("seed"), text_term_max_facts=6)
    async with runtime.pool.connection() as conn:
        # The seed's words: "caroline" is in 7 facts, "week" in 6, "melanie" in 1, "dogs" in
        # none ("every" is a stop word).
        plan = await plan_query(conn, scope, "Does Caroline, Melanie walk dogs every week?", cfg)
        assert plan.terms == ["melanie", "walk", "dogs", "week"]
        # The counts kept on write equal a recount of the scope's facts.
        cur = await conn.execute(
            """
            SELECT c.term, c.facts, (
                SELECT count(*) FROM facts f
                WHERE f.project_id = c.project_id AND f.subject_id = c.subject_id
                  AND f.search_vector @@ to_tsquery('simple', quote_literal(c.term))
            ) FROM fact_term_counts c WHERE c.project_id = %s
            """,
            (project_id,),
        )
        counts = {term: (kept, recount) for term, kept, recount in await cur.fetchall()}
    assert counts["caroline"] == (7, 7) and counts["melanie"] == (1, 1)
    assert all(kept == recount for kept, recount in counts.values()), counts


def test_unseen_score_bound_reads_each_source() -> None:
    weights = Weights(similarity=0.6, text_rank=0.25, recency=0.15, tau_seconds=30 * 86400.0)
    report = SourceReport(
        window_rows=100,
        window_limit=100,
        window_oldest_age_seconds=3 * 86400.0,
        newest_rows=4,
        newest_limit=4,
        newest_min_partial=0.2,
        vector_rows=4,
        vector_limit=4,
        vector_max_distance=0.5,
        text_rows=1,
        text_limit=4,
        text_min_rank=0.9,
    )
    older = 0.6 * 0.5 + 0.15 * math.exp(-0.1)  # the window's oldest fact is 3 days old
    assert abs(unseen_score_bound(report, weights) - older) < 1e-9
    # An unseen fact of the window scores at most the lowest partial score kept from it.
    kept_high = replace(report, newest_min_partial=0.5)
    assert abs(unseen_score_bound(kept_high, weights) - 0.5) < 1e-9
    # A window that was not full held every visible fact: only its unkept facts are unseen.
    whole_scope = replace(report, window_rows=40, newest_rows=3)
    assert unseen_score_bound(whole_scope, weights) == float("-inf")
    assert unseen_score_bound(replace(whole_scope, newest_rows=4), weights) == 0.2
    # A vector source that came back short (HNSW's scan limit) gives no bound.
    assert unseen_score_bound(replace(report, vector_rows=3), weights) == float("inf")
    # A full text source: an unseen fact may rank up to its K-th rank.
    full_text = replace(report, text_rows=4, text_min_rank=0.2)
    assert abs(unseen_score_bound(full_text, weights) - (older + 0.25 * 0.2)) < 1e-9
    # Without a window, an unseen fact may be brand new.
    no_window = replace(report, window_limit=0, window_rows=0, window_oldest_age_seconds=None)
    assert abs(unseen_score_bound(no_window, weights) - (0.6 * 0.5 + 0.15)) < 1e-9
    assert holds_top([0.9, 0.8, 0.7, 0.6], older, top_n=3)
    assert not holds_top([0.4, 0.3, 0.2, 0.1], older, top_n=3)
    assert not holds_top([0.9, 0.8], older, top_n=3), "too few scored to know"
    assert holds_top([0.1], float("-inf"), top_n=3)


def test_calibrate_floor_proposes_a_threshold_from_labelled_pairs(
    tmp_path: Path, capsys, test_root: Path, monkeypatch
) -> None:
    pairs = [
        ("Where does Caroline live?", "Caroline moved to Lisbon last spring", True),
        ("Where does Caroline live?", "Caroline's home is a flat in Lisbon", True),
        ("What pet does Melanie have?", "Melanie adopted a rescue dog", True),
        ("What pet does Melanie have?", "Melanie's cat sleeps on the sofa", True),
        ("Where does Caroline live?", "Quarterly revenue rose by ten percent", False),
        ("Where does Caroline live?", "The printer on floor two is jammed", False),
        ("What pet does Melanie have?", "Bake the bread at 220 degrees", False),
        ("What pet does Melanie have?", "The train to Porto leaves at nine", False),
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "\n".join(json.dumps({"query": q, "text": t, "relevant": r}) for q, t, r in pairs)
    )
    monkeypatch.setenv("SATCHEL_DATA_DIR", str(test_root / "data"))
    assert cli.main(["calibrate-floor", "--pairs", str(path), "--keep", "1.0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model_id"] == "all-MiniLM-L6-v2-onnx-qint8"
    assert (result["relevant"], result["irrelevant"]) == (4, 4)
    assert result["relevant_percentiles"]["p50"] < result["irrelevant_percentiles"]["p50"]
    assert result["relevant_percentiles"]["p95"] <= result["threshold"]
    assert result["irrelevant_dropped"] == 1.0, "these unrelated texts all sit past the floor"
    assert cli.main(["calibrate-floor", "--pairs", str(tmp_path / "missing.jsonl")]) == 2
