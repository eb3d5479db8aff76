"""The score's SQL renderings (server/context/domain/score.py) compute in PostgreSQL what its
NumPy functions compute in memory, on random inputs."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from satchel.server.context.domain.score import (
    BM25_B,
    BM25_K1,
    Weights,
    decay,
    sql_bm25_norm,
    sql_recency,
    sql_score,
)

RNG = np.random.default_rng(35)
NOW = 1_800_000_000.0


def test_recency_and_score_agree_with_postgresql(pg_dsn: str) -> None:
    weights = Weights(similarity=0.55, text_rank=0.3, recency=0.15, tau_seconds=12 * 86400.0)
    since = NOW - RNG.choice([1, -1], 200) * 10 ** RNG.uniform(0, 12, 200)  # past, future, far
    similarity = RNG.uniform(-1, 1, 200)
    text_rank = RNG.uniform(0, 1, 200)
    expected_recency = decay(since, NOW, weights.tau_seconds)
    expected_score = weights.combine(similarity, text_rank, expected_recency)
    statement = f"""
        SELECT {sql_recency("x.since")} AS recency,
               {sql_score("x.similarity", "x.text_rank", sql_recency("x.since"))} AS score
        FROM unnest(%(since)s::float8[], %(similarity)s::float8[], %(text_rank)s::float8[])
            WITH ORDINALITY AS x(since, similarity, text_rank, n)
        ORDER BY x.n
    """
    params = {
        **weights.sql_params(),
        "at_epoch": NOW,
        "since": since.tolist(),
        "similarity": similarity.tolist(),
        "text_rank": text_rank.tolist(),
    }
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(statement, params).fetchall()
    assert [r[0] for r in rows] == pytest.approx(expected_recency.tolist(), rel=1e-12)
    assert [r[1] for r in rows] == pytest.approx(expected_score.tolist(), rel=1e-12, abs=1e-15)


def test_the_bm25_length_norm_agrees_with_postgresql(pg_dsn: str) -> None:
    lengths = RNG.integers(1, 400, 50).astype(float)
    average = 37.5
    expected = BM25_K1 * ((1 - BM25_B) + BM25_B * lengths / average)
    statement = f"""
        SELECT {sql_bm25_norm("d")} FROM unnest(%(lengths)s::float8[])
            WITH ORDINALITY AS d(lexeme_tokens, n) ORDER BY d.n
    """
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(statement, {"lengths": lengths.tolist(), "avg_tokens": average})
        got = [r[0] for r in rows.fetchall()]
    assert got == pytest.approx(expected.tolist(), rel=1e-12)
