"""Knowledge updates: the newer of two close statements of one predicate ranks first."""

from __future__ import annotations

import numpy as np

from satchel.server.domain.packing import EPISODE, FACT, Candidate
from satchel.server.domain.updates import STEP, Statement, newer_first


def cand(id: str, score: float, kind: str = FACT) -> Candidate:
    return Candidate(id, kind, "x", similarity=0.5, text_rank=0.0, recency=0.0, score=score)


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=float)
    return v / np.linalg.norm(v)


CLOSE, FAR = unit(1, 0.1), unit(0, 1)


def test_newer_restatements_are_lifted_above_the_older_in_chain() -> None:
    candidates = [cand("paris", 0.9), cand("lyon", 0.8), cand("nantes", 0.7), cand("x", 0.95)]
    statements = {
        "paris": Statement("home_city", 100.0, CLOSE),
        "lyon": Statement("home_city", 200.0, CLOSE),
        "nantes": Statement("home_city", 300.0, unit(1, 0)),
        "x": Statement("note", 50.0, CLOSE),  # another predicate: untouched
    }
    out = {c.id: c.score for c in newer_first(candidates, statements, 0.6)}
    assert out["paris"] == 0.9 and out["x"] == 0.95  # nothing is lowered
    assert out["lyon"] == 0.9 + STEP and out["nantes"] == 0.9 + STEP + STEP
    ranked = sorted(out, key=lambda i: -out[i])
    assert ranked == ["x", "nantes", "lyon", "paris"]


def test_far_statements_higher_newer_scores_and_episodes_are_left_alone() -> None:
    candidates = [cand("old", 0.9), cand("new", 0.8), cand("older", 0.5), cand("e", 0.99, EPISODE)]
    statements = {
        "old": Statement("observation", 100.0, FAR),  # same predicate, unrelated content
        "new": Statement("observation", 200.0, CLOSE),
        "older": Statement("observation", 10.0, CLOSE),  # already below the newer one
    }
    out = newer_first(candidates, statements, 0.6)
    assert [c.score for c in out] == [0.9, 0.8, 0.5, 0.99]
    assert (
        newer_first(candidates, {**statements, "old": Statement("observation", 100.0, CLOSE)}, 0)[
            0
        ].score
        == 0.9
    ), "0 turns the rule off"
