"""Greedy packing under one shared budget, with a decision for every candidate."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import pytest

from satchel.server.context.domain.packing import (
    BELOW_RELEVANCE_FLOOR,
    BLOCKED,
    CONFLICT_OPEN,
    EPISODE,
    EXCLUDED,
    FACT,
    INCLUDED,
    MULTI_HOP_EXPANSION,
    OVER_BUDGET,
    RELEVANCE,
    SOURCE_ALREADY_SERVED,
    SOURCE_FACTS_HIDDEN,
    STATUS_OK,
    VOLATILITY_EXPIRED,
    Candidate,
    Decision,
    Packer,
    empty_reason,
    packet_status,
)
from satchel.server.context.domain.score import Weights


def cand(
    id: str,
    tokens: int = 10,
    score: float = 0.5,
    similarity: float = 0.9,
    kind: str = FACT,
    blocked: str | None = None,
    sources: Iterable[str] = (),
) -> Candidate:
    """A candidate whose text is estimated at exactly `tokens` tokens."""
    return Candidate(
        id=id,
        kind=kind,
        text="x" * (4 * tokens),
        similarity=similarity,
        text_rank=0.0,
        recency=1.0,
        score=score,
        blocked_reason=blocked,
        sources=frozenset(sources),
    )


def summary(decisions: Iterable[Decision]) -> list[tuple[str, str, str]]:
    return [(d.candidate.id, d.outcome, d.reason_code) for d in decisions]


# --- candidates -------------------------------------------------------------------------


def test_candidate_tokens_and_distance() -> None:
    c = Candidate("f1", FACT, "a" * 37, 0.75, 0.1, 0.5, 0.6)
    assert c.tokens == 9
    assert c.distance == 0.25
    assert Candidate("f2", FACT, "", 0.2, 0.0, 0.0, 0.1).tokens == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"kind": "talent"}, {"blocked": "over_budget"}, {"score": math.nan}, {"score": math.inf}],
)
def test_candidate_rejects_invalid_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        cand("f", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("budget", [0, -5, True, 1.5, "900"])
def test_budget_must_be_a_positive_integer(budget: object) -> None:
    with pytest.raises(ValueError, match="budget_exceeded"):
        Packer(budget)  # type: ignore[arg-type]


# --- main packing -----------------------------------------------------------------------


def test_packs_by_descending_score_with_ties_by_id() -> None:
    packer = Packer(100)
    decisions = list(
        packer.pack([cand("c", score=0.2), cand("b", score=0.9), cand("a", score=0.9)])
    )
    assert summary(decisions) == [
        ("a", INCLUDED, RELEVANCE),
        ("b", INCLUDED, RELEVANCE),
        ("c", INCLUDED, RELEVANCE),
    ]
    assert [c.id for c in packer.included] == ["a", "b", "c"]
    assert packer.used == 30
    assert packer.remaining == 70


def test_over_budget_is_skipped_and_packing_continues() -> None:
    packer = Packer(10)
    decisions = list(
        packer.pack(
            [
                cand("big", tokens=6, score=0.9),
                cand("too_big", tokens=6, score=0.8),
                cand("small", tokens=4, score=0.7),
                cand("one_more", tokens=1, score=0.6),
            ]
        )
    )
    assert summary(decisions) == [
        ("big", INCLUDED, RELEVANCE),
        ("too_big", EXCLUDED, OVER_BUDGET),
        ("small", INCLUDED, RELEVANCE),
        ("one_more", EXCLUDED, OVER_BUDGET),
    ]
    assert [d.budget_used for d in decisions] == [6, 6, 10, 10]
    assert packer.used == 10
    assert packer.remaining == 0


def test_exact_fit_is_included() -> None:
    packer = Packer(25)
    decisions = list(packer.pack([cand("a", tokens=25)]))
    assert summary(decisions) == [("a", INCLUDED, RELEVANCE)]
    assert packer.remaining == 0


def test_decisions_are_yielded_one_by_one_as_state_changes() -> None:
    packer = Packer(50)
    stream = packer.pack([cand("a", tokens=20, score=0.9), cand("b", tokens=20, score=0.1)])
    assert packer.considered == 0
    first = next(stream)
    assert (first.sequence, first.candidate.id, first.budget_used) == (1, "a", 20)
    assert packer.used == 20
    assert packer.considered == 1
    second = next(stream)
    assert (second.sequence, second.budget_used) == (2, 40)
    with pytest.raises(StopIteration):
        next(stream)


def test_pack_rejects_a_reason_that_is_not_an_inclusion_reason() -> None:
    with pytest.raises(ValueError):
        Packer(10).pack([], reason=OVER_BUDGET)


# --- relevance floor --------------------------------------------------------------------


def test_floor_exclusions_come_first_in_score_order_then_packing() -> None:
    packer = Packer(100, max_distance=0.25)
    decisions = list(
        packer.pack(
            [
                cand("near_low", score=0.3, similarity=0.9),
                cand("far_high", score=0.95, similarity=0.5),
                cand("edge", score=0.5, similarity=0.75),
                cand("far_low", score=0.1, similarity=0.0),
                cand("near_high", score=0.8, similarity=0.8),
            ]
        )
    )
    assert summary(decisions) == [
        ("far_high", EXCLUDED, BELOW_RELEVANCE_FLOOR),
        ("far_low", EXCLUDED, BELOW_RELEVANCE_FLOOR),
        ("near_high", INCLUDED, RELEVANCE),
        ("edge", INCLUDED, RELEVANCE),
        ("near_low", INCLUDED, RELEVANCE),
    ]
    assert [d.sequence for d in decisions] == [1, 2, 3, 4, 5]
    assert packer.gated_out == 2
    assert empty_reason(packer) == ""


def test_floor_applies_regardless_of_remaining_budget() -> None:
    packer = Packer(1000, max_distance=0.3)
    decisions = list(packer.pack([cand("far", tokens=1, score=1.0, similarity=0.6)]))
    assert summary(decisions) == [("far", EXCLUDED, BELOW_RELEVANCE_FLOOR)]


@pytest.mark.parametrize("max_distance", [0.0, -0.5])
def test_floor_off_by_default_keeps_distant_candidates(max_distance: float) -> None:
    packer = Packer(100, max_distance=max_distance)
    decisions = list(packer.pack([cand("opposite", similarity=-1.0)]))
    assert summary(decisions) == [("opposite", INCLUDED, RELEVANCE)]
    assert packer.gated_out == 0


def test_floor_applies_to_episodes_too() -> None:
    packer = Packer(100, max_distance=0.2)
    decisions = list(packer.pack([cand("e1", kind=EPISODE, similarity=0.5)]))
    assert summary(decisions) == [("e1", EXCLUDED, BELOW_RELEVANCE_FLOOR)]


def test_gate_emptying_the_call_gives_no_relevant_memory_with_status_ok() -> None:
    packer = Packer(900, max_distance=0.2)
    list(packer.block([]))
    list(packer.pack([cand("f1", similarity=0.1), cand("f2", similarity=0.3)]))
    list(packer.pack([cand("e1", kind=EPISODE, similarity=0.5)]))
    assert packer.included == []
    assert packer.gated_out == 3
    assert empty_reason(packer) == "no_relevant_memory"
    assert packet_status(packer.hidden_counts) == ("ok", [])


def test_no_empty_reason_without_candidates_or_without_the_gate() -> None:
    nothing = Packer(900, max_distance=0.2)
    list(nothing.pack([]))
    assert empty_reason(nothing) == ""

    ungated = Packer(5)
    list(ungated.pack([cand("huge", tokens=50)]))
    assert ungated.included == []
    assert empty_reason(ungated) == ""

    only_blocked = Packer(900, max_distance=0.2)
    list(only_blocked.block([cand("f", blocked=CONFLICT_OPEN)]))
    assert empty_reason(only_blocked) == ""


def test_an_included_episode_means_the_call_was_not_emptied() -> None:
    packer = Packer(900, max_distance=0.2)
    list(packer.pack([cand("f1", similarity=0.1)]))
    list(packer.pack([cand("e1", kind=EPISODE, similarity=0.95)]))
    assert empty_reason(packer) == ""


# --- multi-hop and episodes -------------------------------------------------------------


def test_multi_hop_pass_is_never_floor_excluded() -> None:
    packer = Packer(100, max_distance=0.1)
    list(packer.pack([cand("f1", similarity=0.95, score=0.9)]))
    hop = list(
        packer.pack(
            [cand("far_hop", similarity=0.0, score=0.2), cand("f1", similarity=0.95)],
            gated=False,
            reason=MULTI_HOP_EXPANSION,
        )
    )
    assert summary(hop) == [("far_hop", INCLUDED, MULTI_HOP_EXPANSION)]
    assert hop[0].sequence == 2
    assert packer.gated_out == 0


def test_multi_hop_over_budget() -> None:
    packer = Packer(30)
    list(packer.pack([cand("f1", tokens=25)]))
    hop = list(packer.pack([cand("f2", tokens=6)], gated=False, reason=MULTI_HOP_EXPANSION))
    assert summary(hop) == [("f2", EXCLUDED, OVER_BUDGET)]


def test_duplicates_get_a_single_decision() -> None:
    packer = Packer(100)
    first = list(packer.pack([cand("f1", score=0.4), cand("f1", score=0.7, tokens=3)]))
    assert summary(first) == [("f1", INCLUDED, RELEVANCE)]
    assert first[0].candidate.score == 0.7
    again = list(packer.pack([cand("f1")], gated=False, reason=MULTI_HOP_EXPANSION))
    assert again == []
    assert packer.considered == 1
    assert packer.used == 3


def test_same_id_of_another_kind_is_another_candidate() -> None:
    packer = Packer(100)
    list(packer.pack([cand("same")]))
    episodes = list(packer.pack([cand("same", kind=EPISODE)]))
    assert summary(episodes) == [("same", INCLUDED, RELEVANCE)]


def test_excluded_fact_is_not_reconsidered_by_multi_hop() -> None:
    packer = Packer(10)
    list(packer.pack([cand("a", tokens=8, score=0.9), cand("b", tokens=5, score=0.5)]))
    assert list(packer.pack([cand("b", tokens=2)], gated=False, reason=MULTI_HOP_EXPANSION)) == []
    assert packer.used == 8


def test_facts_then_multi_hop_then_episodes_share_one_budget() -> None:
    packer = Packer(100)
    facts = list(packer.pack([cand("f1", tokens=40, score=0.9), cand("f2", tokens=30)]))
    hops = list(packer.pack([cand("f3", tokens=20)], gated=False, reason=MULTI_HOP_EXPANSION))
    episodes = list(
        packer.pack(
            [
                cand("e1", tokens=15, score=0.9, kind=EPISODE),
                cand("e2", tokens=10, score=0.8, kind=EPISODE),
                cand("e3", tokens=5, score=0.1, kind=EPISODE),
            ]
        )
    )
    assert summary(facts + hops + episodes) == [
        ("f1", INCLUDED, RELEVANCE),
        ("f2", INCLUDED, RELEVANCE),
        ("f3", INCLUDED, MULTI_HOP_EXPANSION),
        ("e1", EXCLUDED, OVER_BUDGET),
        ("e2", INCLUDED, RELEVANCE),
        ("e3", EXCLUDED, OVER_BUDGET),
    ]
    assert [d.sequence for d in facts + hops + episodes] == [1, 2, 3, 4, 5, 6]
    assert packer.used == 100
    assert [c.id for c in packer.included] == ["f1", "f2", "f3", "e2"]


def test_an_episode_a_served_fact_was_drawn_from_is_left_out_without_spending_budget() -> None:
    packer = Packer(20, max_distance=0.5)
    list(packer.pack([cand("f1", tokens=10, sources=("e3", "e2"))]))
    episodes = [
        cand("e1", tokens=5, score=0.9, kind=EPISODE),
        cand("e2", tokens=5, score=0.8, kind=EPISODE, similarity=0.1),  # below the floor
        cand("e3", tokens=5, score=0.7, kind=EPISODE),
        cand("e4", tokens=5, score=0.6, kind=EPISODE),
        cand("e5", tokens=5, score=0.5, kind=EPISODE),
    ]
    decisions = list(packer.pack(episodes, skip_served=True))
    assert summary(decisions) == [
        ("e2", EXCLUDED, BELOW_RELEVANCE_FLOOR),
        ("e1", INCLUDED, RELEVANCE),
        ("e3", EXCLUDED, SOURCE_ALREADY_SERVED),
        ("e4", INCLUDED, RELEVANCE),  # the room e3 would have taken
        ("e5", EXCLUDED, OVER_BUDGET),
    ]
    assert packer.used == 20 and packer.gated_out == 1


def test_in_one_list_whichever_of_a_fact_and_its_episode_ranks_higher_is_served() -> None:
    packer = Packer(100)
    mixed = [
        cand("e1", score=0.9, kind=EPISODE),  # outranks the fact drawn from it
        cand("f1", score=0.8, sources=("e1",)),
        cand("f2", score=0.7, sources=("e2",)),  # outranks its episode
        cand("e2", score=0.6, kind=EPISODE),
        cand("f3", score=0.5, sources=("e1", "e4")),  # e4 is not served: f3 says more
        cand("f4", score=0.4, sources=("e2",)),  # another fact of e2: never left out for f2
        cand("f5", score=0.3),  # no source
    ]
    assert summary(packer.pack(mixed, skip_served=True)) == [
        ("e1", INCLUDED, RELEVANCE),
        ("f1", EXCLUDED, SOURCE_ALREADY_SERVED),
        ("f2", INCLUDED, RELEVANCE),
        ("e2", EXCLUDED, SOURCE_ALREADY_SERVED),
        ("f3", INCLUDED, RELEVANCE),
        ("f4", INCLUDED, RELEVANCE),
        ("f5", INCLUDED, RELEVANCE),
    ]


def test_without_skip_served_a_fact_and_its_episode_are_both_served() -> None:
    packer = Packer(100)
    mixed = [cand("e1", score=0.9, kind=EPISODE), cand("f1", score=0.8, sources=("e1",))]
    assert [d.outcome for d in packer.pack(mixed)] == [INCLUDED, INCLUDED]


def test_an_episode_whose_facts_are_all_hidden_is_excluded_with_its_reason() -> None:
    packer = Packer(100)
    decisions = list(
        packer.pack(
            [
                cand("e1", score=0.9, kind=EPISODE, blocked=SOURCE_FACTS_HIDDEN),
                cand("e2", score=0.5, kind=EPISODE),
            ]
        )
    )
    assert summary(decisions) == [
        ("e1", EXCLUDED, SOURCE_FACTS_HIDDEN),
        ("e2", INCLUDED, RELEVANCE),
    ]
    assert packet_status(packer.hidden_counts) == (STATUS_OK, [])  # no warning of its own


# --- hard filters and status ------------------------------------------------------------


def test_block_hides_without_spending_budget() -> None:
    packer = Packer(50)
    decisions = list(
        packer.block(
            [
                cand("ok", score=0.99),
                cand("c1", score=0.2, blocked=CONFLICT_OPEN),
                cand("v1", score=0.5, blocked=VOLATILITY_EXPIRED),
                cand("c2", score=0.8, blocked=CONFLICT_OPEN),
            ]
        )
    )
    assert summary(decisions) == [
        ("c2", BLOCKED, CONFLICT_OPEN),
        ("v1", EXCLUDED, VOLATILITY_EXPIRED),
        ("c1", BLOCKED, CONFLICT_OPEN),
    ]
    assert [d.budget_used for d in decisions] == [0, 0, 0]
    assert packer.used == 0
    assert packer.hidden_counts == {CONFLICT_OPEN: 2, VOLATILITY_EXPIRED: 1}
    assert packer.considered == 3

    rest = list(packer.pack([cand("ok", score=0.99), cand("c1", blocked=CONFLICT_OPEN)]))
    assert summary(rest) == [("ok", INCLUDED, RELEVANCE)]
    assert rest[0].sequence == 4


def test_pack_decides_hidden_candidates_first() -> None:
    packer = Packer(50, max_distance=0.2)
    decisions = list(
        packer.pack(
            [
                cand("far", score=0.9, similarity=0.1),
                cand("hidden", score=0.1, similarity=0.1, blocked=VOLATILITY_EXPIRED),
                cand("near", score=0.5),
            ]
        )
    )
    assert summary(decisions) == [
        ("hidden", EXCLUDED, VOLATILITY_EXPIRED),
        ("far", EXCLUDED, BELOW_RELEVANCE_FLOOR),
        ("near", INCLUDED, RELEVANCE),
    ]
    assert packer.hidden_counts == {VOLATILITY_EXPIRED: 1}
    assert packer.gated_out == 1


def test_hidden_counts_is_a_copy() -> None:
    packer = Packer(50)
    list(packer.block([cand("c", blocked=CONFLICT_OPEN)]))
    packer.hidden_counts[CONFLICT_OPEN] = 99
    assert packer.hidden_counts == {CONFLICT_OPEN: 1}


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({}, ("ok", [])),
        ({CONFLICT_OPEN: 0, VOLATILITY_EXPIRED: 0}, ("ok", [])),
        (
            {CONFLICT_OPEN: 2},
            ("degraded", ["open_conflict: 2 fact(s) hidden pending conflict resolution"]),
        ),
        (
            {VOLATILITY_EXPIRED: 1},
            ("degraded", ["volatility_expired: 1 fact(s) hidden past their volatility horizon"]),
        ),
        (
            {VOLATILITY_EXPIRED: 3, CONFLICT_OPEN: 1},
            (
                "degraded",
                [
                    "open_conflict: 1 fact(s) hidden pending conflict resolution",
                    "volatility_expired: 3 fact(s) hidden past their volatility horizon",
                ],
            ),
        ),
    ],
)
def test_packet_status(counts: dict[str, int], expected: tuple[str, list[str]]) -> None:
    assert packet_status(counts) == expected


def test_status_from_a_packer_with_an_open_conflict() -> None:
    packer = Packer(50)
    list(packer.block([cand("c", blocked=CONFLICT_OPEN)]))
    status, warnings = packet_status(packer.hidden_counts)
    assert status == "degraded"
    assert warnings == ["open_conflict: 1 fact(s) hidden pending conflict resolution"]


# --- scoring ----------------------------------------------------------------------------


def test_reference_ranking_orders_by_the_hybrid_score() -> None:
    day = 86400.0
    rows = {
        "similar_old": (0.9, 0.0, 365 * day),
        "similar_new": (0.9, 0.0, 0.0),
        "keyword_hit": (0.5, 0.8, 10 * day),
        "unrelated": (0.1, 0.0, 0.0),
    }
    weights = Weights()
    candidates = [
        cand(name, score=weights.combine(sim, rank, weights.recency_of(age)))
        for name, (sim, rank, age) in rows.items()
    ]
    scores = {c.id: c.score for c in candidates}
    assert scores["similar_new"] == pytest.approx(0.54 + 0.15)
    assert scores["keyword_hit"] == pytest.approx(0.30 + 0.20 + 0.15 * math.exp(-1 / 3))
    assert scores["similar_old"] == pytest.approx(0.54 + 0.15 * math.exp(-365 / 30))
    decisions = list(Packer(900).pack(candidates))
    assert [d.candidate.id for d in decisions] == [
        "similar_new",
        "keyword_hit",
        "similar_old",
        "unrelated",
    ]


# --- properties over random calls -------------------------------------------------------


def reference_run(
    budget: int,
    max_distance: float,
    passes: list[tuple[list[Candidate], bool, str]],
) -> list[tuple[str, str, str, str]]:
    """A deliberately naive model of a whole call, for comparison."""
    seen: set[tuple[str, str]] = set()
    used = 0
    out: list[tuple[str, str, str, str]] = []

    def decide(c: Candidate, outcome: str, reason: str) -> None:
        seen.add((c.kind, c.id))
        out.append((c.kind, c.id, outcome, reason))

    for candidates, gated, reason in passes:
        ordered = sorted(candidates, key=lambda c: (-c.score, c.id))
        for c in ordered:
            if (c.kind, c.id) not in seen and c.blocked_reason == CONFLICT_OPEN:
                decide(c, BLOCKED, CONFLICT_OPEN)
            elif (c.kind, c.id) not in seen and c.blocked_reason == VOLATILITY_EXPIRED:
                decide(c, EXCLUDED, VOLATILITY_EXPIRED)
        for c in ordered:
            far = gated and max_distance > 0 and 1 - c.similarity > max_distance
            if (c.kind, c.id) not in seen and far:
                decide(c, EXCLUDED, BELOW_RELEVANCE_FLOOR)
        for c in ordered:
            if (c.kind, c.id) in seen:
                continue
            if used + c.tokens <= budget:
                used += c.tokens
                decide(c, INCLUDED, reason)
            else:
                decide(c, EXCLUDED, OVER_BUDGET)
    return out


def random_candidates(rng: random.Random, kind: str, ids: list[str], n: int) -> list[Candidate]:
    return [
        Candidate(
            id=rng.choice(ids),
            kind=kind,
            text="w" * rng.randint(0, 400),
            similarity=rng.uniform(-0.2, 1.0),
            text_rank=rng.random(),
            recency=rng.random(),
            score=round(rng.uniform(0, 1), 2),
            blocked_reason=rng.choice([None] * 8 + [CONFLICT_OPEN, VOLATILITY_EXPIRED])
            if kind == FACT
            else None,
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("seed", range(300))
def test_random_calls_respect_every_rule(seed: int) -> None:
    rng = random.Random(seed)
    budget = rng.randint(1, 600)
    max_distance = rng.choice([0.0, 0.0, rng.uniform(0.05, 0.9)])
    fact_ids = [f"f{i}" for i in range(rng.randint(1, 30))]
    facts = random_candidates(rng, FACT, fact_ids, rng.randint(0, 40))
    hops = random_candidates(rng, FACT, fact_ids, rng.randint(0, 10))
    episodes = random_candidates(rng, EPISODE, [f"e{i}" for i in range(8)], rng.randint(0, 8))

    packer = Packer(budget, max_distance=max_distance)
    decisions = [
        *packer.block(facts),
        *packer.pack(facts),
        *packer.pack(hops, gated=False, reason=MULTI_HOP_EXPANSION),
        *packer.pack(episodes),
    ]
    passes = [
        (facts, True, RELEVANCE),
        (hops, False, MULTI_HOP_EXPANSION),
        (episodes, True, RELEVANCE),
    ]
    expected = reference_run(budget, max_distance, passes)
    assert [(d.candidate.kind, d.candidate.id, d.outcome, d.reason_code) for d in decisions] == (
        expected
    )

    # Budget: never exceeded, spent exactly by inclusions, running total in each decision.
    assert packer.used <= budget
    assert packer.used == sum(c.tokens for c in packer.included)
    assert packer.remaining == budget - packer.used
    running = 0
    for d in decisions:
        if d.outcome == INCLUDED:
            running += d.candidate.tokens
        assert d.budget_used == running
        if d.reason_code == OVER_BUDGET:
            assert d.candidate.tokens > budget - d.budget_used

    # One decision per distinct candidate, numbered 1..n.
    keys = [(d.candidate.kind, d.candidate.id) for d in decisions]
    assert len(keys) == len(set(keys))
    assert set(keys) == {(c.kind, c.id) for c in facts + hops + episodes}
    assert [d.sequence for d in decisions] == list(range(1, len(decisions) + 1))
    assert packer.considered == len(decisions)

    # The floor: only gated passes, only beyond the distance, never for multi-hop inclusions.
    floored = [d for d in decisions if d.reason_code == BELOW_RELEVANCE_FLOOR]
    assert packer.gated_out == len(floored)
    assert all(max_distance > 0 and d.candidate.distance > max_distance for d in floored)
    for d in decisions:
        if d.outcome == INCLUDED and d.reason_code == RELEVANCE and max_distance > 0:
            assert d.candidate.distance <= max_distance

    # Hidden candidates never spend budget and are counted per reason.
    hidden = [d for d in decisions if d.reason_code in (CONFLICT_OPEN, VOLATILITY_EXPIRED)]
    assert sum(packer.hidden_counts.values()) == len(hidden)
    assert all(d.candidate.blocked_reason == d.reason_code for d in hidden)

    expect_empty = not packer.included and bool(floored)
    assert empty_reason(packer) == ("no_relevant_memory" if expect_empty else "")


def test_an_episode_ranked_by_its_neighbour_passes_the_floor_as_the_neighbour_does() -> None:
    packer = Packer(100, max_distance=0.5)
    lifted = Candidate("e1", EPISODE, "x" * 8, 0.2, 0.0, 0.0, 0.6, context_similarity=0.7)
    alone = Candidate("e2", EPISODE, "x" * 8, 0.2, 0.0, 0.0, 0.5, context_similarity=0.3)
    assert summary(packer.pack([lifted, alone])) == [
        ("e2", EXCLUDED, BELOW_RELEVANCE_FLOOR),
        ("e1", INCLUDED, RELEVANCE),
    ]
