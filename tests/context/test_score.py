"""The hybrid score's definition (server/context/domain/score.py): weights, recency, ties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from satchel.server.context.domain.score import (
    RECENCY_EXPONENT_FLOOR,
    Weights,
    best,
    decay,
    sql_bm25_norm,
    sql_score,
)

DAY = 86400.0


def test_recency_decays_exponentially_and_the_future_counts_as_now() -> None:
    weights = Weights(tau_seconds=30 * DAY)
    assert weights.recency_of(0) == 1.0
    assert weights.recency_of(-3600) == 1.0
    assert weights.recency_of(30 * DAY) == pytest.approx(math.exp(-1))
    assert weights.recency_of(90 * DAY) == pytest.approx(math.exp(-3))
    assert weights.recency_of(1e9 * DAY) == math.exp(RECENCY_EXPONENT_FLOOR)  # floored, not 0
    with pytest.raises(ValueError):
        Weights(tau_seconds=0)


def test_the_vectorised_recency_is_the_scalar_one() -> None:
    weights = Weights(tau_seconds=7 * DAY)
    now = 1_800_000_000.0
    since = np.array([now, now + 3600, now - DAY, now - 70 * DAY, now - 1e12])
    expected = [weights.recency_of(now - s) for s in since]
    assert decay(since, now, weights.tau_seconds).tolist() == pytest.approx(expected)


def test_weights_combine_the_parts() -> None:
    weights = Weights()
    assert weights.combine(1.0, 0.0, 1.0) == pytest.approx(0.6 + 0.15)
    assert weights.combine(0.0, 1.0, 1.0) == pytest.approx(0.25 + 0.15)
    assert weights.combine(0.5, 0.2, math.exp(-1)) == pytest.approx(
        0.6 * 0.5 + 0.25 * 0.2 + 0.15 * math.exp(-1)
    )
    custom = Weights(similarity=1.0, text_rank=0.0, recency=0.0, tau_seconds=DAY)
    assert custom.combine(0.3, 0.9, 0.5) == pytest.approx(0.3)
    parts = np.array([0.1, 0.9])
    assert custom.combine(parts, parts, parts).tolist() == pytest.approx([0.1, 0.9])


def test_ties_go_to_the_smaller_id() -> None:
    scores = np.array([0.5, 0.9, 0.9, 0.1, 0.9])
    ids = np.arange(5)
    assert best(np.arange(5), 2, -scores, ids).tolist() == [1, 2]
    assert best(np.arange(5), 4, -scores, ids).tolist() == [1, 2, 4, 0]


def test_the_sql_renderings_name_the_statement_parameters() -> None:
    assert (
        sql_score("s", "t", "r") == "%(w_similarity)s * s + %(w_text_rank)s * t + %(w_recency)s * r"
    )
    assert sql_score("s", None, "r") == "%(w_similarity)s * s + %(w_recency)s * r"
    assert sql_bm25_norm("f") == "1.2 * (0.25 + 0.75 * f.lexeme_tokens / %(avg_tokens)s)"
    assert set(Weights().sql_params()) == {
        "w_similarity",
        "w_text_rank",
        "w_recency",
        "tau_seconds",
    }
