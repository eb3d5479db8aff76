"""Knowledge updates: a fact that restates older ones ranks just above them, nothing is lowered."""

from __future__ import annotations

from satchel.server.context.domain.packing import EPISODE, FACT, Candidate
from satchel.server.context.domain.updates import STEP, newer_first


def cand(id: str, score: float, kind: str = FACT) -> Candidate:
    return Candidate(id, kind, "x", similarity=0.5, text_rank=0.0, recency=0.0, score=score)


def test_newer_restatements_are_lifted_above_the_older_in_chain() -> None:
    candidates = [cand("paris", 0.9), cand("lyon", 0.8), cand("nantes", 0.7), cand("x", 0.95)]
    since = {"paris": 100.0, "lyon": 200.0, "nantes": 300.0, "x": 50.0}
    restates = {"lyon": ["paris"], "nantes": ["paris", "lyon"]}
    out = {c.id: c.score for c in newer_first(candidates, since, restates)}
    assert out["paris"] == 0.9 and out["x"] == 0.95  # nothing is lowered
    assert out["lyon"] == 0.9 + STEP and out["nantes"] == 0.9 + STEP + STEP
    assert sorted(out, key=lambda i: -out[i]) == ["x", "nantes", "lyon", "paris"]


def test_a_newer_fact_already_above_and_unknown_ids_are_left_alone() -> None:
    candidates = [cand("old", 0.4), cand("new", 0.8), cand("e", 0.99, EPISODE)]
    since = {"old": 1.0, "new": 2.0, "e": 3.0}
    out = newer_first(candidates, since, {"new": ["old", "not-a-candidate"]})
    assert [c.score for c in out] == [0.4, 0.8, 0.99]
    assert newer_first(candidates, since, {}) == candidates
