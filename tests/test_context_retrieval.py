"""Two-phase retrieval against the exact ranking, and the floor calibration command."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from google.protobuf import timestamp_pb2
from memory_helpers import fact_request
from memory_helpers import stub as memory_stub

from satchel.server import cli
from satchel.server.storage import context as store
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


def _ts(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


async def test_adaptive_two_phase_matches_the_exact_top_10(
    channel: grpc.aio.Channel, project_id: str, server
) -> None:
    rng = random.Random(3)
    now = datetime.now(UTC)
    requests = [
        fact_request(
            project_id,
            predicate="hobby",
            statement=f"{rng.choice(PEOPLE)} {rng.choice(HOBBIES)} every week",
            valid_from=_ts(now - timedelta(days=rng.uniform(0, 200))),
        )
        for _ in range(150)
    ]
    await memory_stub(channel).BatchAssertFacts(
        memory_pb2.BatchAssertFactsRequest(requests=requests)
    )
    runtime = server.runtime.value
    cfg = replace(runtime.settings.context, retrieval_top_k=8, recency_top_k=8, newest_top_k=8)
    fixed = replace(cfg, retrieval_top_k_max=8)
    scope = store.Scope(project_id, "user-1", now, historical=False)
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
            exact = await store.fetch_fact_candidates(conn, scope, query, vector, cfg, exact=True)
            adaptive = await store.fetch_fact_candidates(conn, scope, query, vector, cfg)
            assert [r["id"] for r in adaptive[:10]] == [r["id"] for r in exact[:10]], query
            narrow = await store.fetch_fact_candidates(conn, scope, query, vector, fixed)
            misses_when_fixed += [r["id"] for r in narrow[:10]] != [r["id"] for r in exact[:10]]
    assert misses_when_fixed > 0, "the scope is large enough for K=8 alone to miss"


def test_unseen_score_bound_reads_each_source() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    params = {
        "top_k": 4,
        "recent_k": 4,
        "newest_k": 4,
        "newest_window": 100,
        "at": at,
        "recent_since": at - timedelta(days=90),
        "tau_seconds": 30 * 86400.0,
        "w_similarity": 0.6,
        "w_text_rank": 0.25,
        "w_recency": 0.15,
    }
    row = {
        "vector_rows": 4,
        "vector_max_distance": 0.5,
        "recent_rows": 4,
        "recent_max_distance": 0.7,
        "window_rows": 100,
        "window_oldest": at - timedelta(days=3),
        "newest_rows": 4,
        "newest_min_partial": 0.2,
        "text_rows": 1,
        "text_min_rank": 0.9,
    }
    old = 0.6 * 0.5 + 0.15 * math.exp(-3)  # the recency window's edge: 90 days = 3 tau
    recent = 0.6 * 0.3 + 0.15 * math.exp(-0.1)  # the 100th newest fact is 3 days old
    newest = 0.2  # the lowest partial score kept from the window
    assert abs(store.unseen_score_bound(row, params) - max(old, recent, newest)) < 1e-9
    in_window = {**row, "newest_min_partial": 0.5}
    assert abs(store.unseen_score_bound(in_window, params) - 0.5) < 1e-9
    # A source that returned fewer rows than asked returned everything it could.
    assert store.unseen_score_bound({**row, "vector_rows": 3}, params) == float("-inf")
    whole_scope = {**row, "window_rows": 40, "newest_rows": 3}
    assert store.unseen_score_bound(whole_scope, params) == float("-inf")
    assert store.unseen_score_bound({**whole_scope, "newest_rows": 4}, params) == newest
    no_recent_left = {**row, "recent_rows": 3}
    assert abs(store.unseen_score_bound(no_recent_left, params) - max(old, newest)) < 1e-9
    # Without the newest window, an unseen fact may be brand new.
    no_window = {**params, "newest_k": 0}
    brand_new = 0.6 * 0.3 + 0.15 * 1.0
    assert (
        abs(
            store.unseen_score_bound(row, no_window)
            - max(brand_new, 0.6 * 0.5 + 0.15 * math.exp(-3))
        )
        < 1e-9
    )
    full_text = {**row, "text_rows": 4, "text_min_rank": 0.2}
    assert abs(store.unseen_score_bound(full_text, params) - (max(old, recent) + 0.05)) < 1e-9
    ranked = [{"score": s, **row} for s in (0.9, 0.8, 0.7, 0.6)]
    assert store.is_exact(ranked, params, top_n=3)
    assert not store.is_exact([{**r, "score": r["score"] - 0.5} for r in ranked], params, 3)


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
