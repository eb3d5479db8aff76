"""Unit tests of the pure talent-selection maths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from satchel.server.embedding.fake import FakeEmbedder
from satchel.server.talents.domain.selection import (
    NOTE_FALLBACK,
    NOTE_NO_CANDIDATES,
    NOTE_OUT_OF_DOMAIN,
    Reason,
    ScorableTalent,
    SelectionParams,
    SelectionResult,
    centred_similarities,
    order_without_relevance,
    select,
    stems,
    talent_text,
)


def unit(values: list[float]) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float64)
    return vector / np.linalg.norm(vector)


def geometry(similarities: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Talent vectors e_1..e_n and a task vector whose centred cosines are exactly `similarities`.

    With v_i = e_i, mu = (1/n) sum e_j and a task q = k * s where sum(s) = 0, the centred dot
    products are (q - mu) . (v_i - mu) = k * s_i; k is solved so that normalising gives s_i.
    """
    s = np.asarray(similarities, dtype=np.float64)
    n = len(s)
    assert abs(s.sum()) < 1e-12 and s @ s < n / (n - 1)
    k = math.sqrt(((n - 1) / n**2) / (1 - (n - 1) / n * (s @ s)))
    return np.eye(n), k * s


def talent(
    talent_id: str, tokens: int = 10, stem_set: frozenset[str] = frozenset()
) -> ScorableTalent:
    return ScorableTalent(
        id=talent_id, name=talent_id, text=talent_id, stems=stem_set, tokens=tokens, body=""
    )


def reasons(result: SelectionResult) -> dict[str, Reason]:
    return {t.id: t.reason for t in (*result.kept, *result.excluded)}


# --- text helpers -----------------------------------------------------------------------------


def test_stems_strip_accents_lowercase_and_take_five_char_prefix() -> None:
    assert stems("Modélisation des Échéances") == {"model", "echea"}
    assert stems("naïve CAFÉ") == {"naive", "cafe"}


def test_stems_drop_words_under_four_letters_and_split_on_non_letters() -> None:
    assert stems("use a DB api for the case") == {"case"}
    assert stems("use-case snake_case http2 e5") == {"case", "snake", "http"}
    assert stems("") == set()


def test_stems_of_several_words_is_the_union() -> None:
    assert stems(["Hexagonal", "ports and adapters", "hexagone"]) == {"hexag", "ports", "adapt"}


def test_talent_text_joins_name_summary_tags_triggers_skipping_empty_parts() -> None:
    text = talent_text("Use case", "", ["application", "use-case"], ["use case"])
    assert text == "Use case\napplication, use-case\nuse case"


def test_build_takes_stems_from_tags_triggers_task_types_only_and_tokens_from_body() -> None:
    built = ScorableTalent.build(
        "testing.pytest",
        "Pytest style",
        summary="Plain functions, no classes",
        body="b" * 81,
        tags=["testing"],
        triggers=["unit tests"],
        task_types=["refactoring"],
    )
    assert built.stems == frozenset({"testi", "unit", "tests", "refac"})
    assert built.tokens == 20
    assert built.text == "Pytest style\nPlain functions, no classes\ntesting\nunit tests"


def test_params_defaults_and_validation() -> None:
    assert SelectionParams() == SelectionParams(
        floor=0.18, beta=0.12, margin=0.15, budget_tokens=2000
    )
    with pytest.raises(ValueError, match="budget_tokens"):
        SelectionParams(budget_tokens=0)
    with pytest.raises(ValueError, match="margin"):
        SelectionParams(margin=-0.1)


# --- centring -----------------------------------------------------------------------------------


def test_geometry_helper_yields_the_requested_centred_similarities() -> None:
    vectors, task = geometry([0.3, 0.28, 0.26, -0.4, -0.44])
    assert np.allclose(centred_similarities(vectors, task), [0.3, 0.28, 0.26, -0.4, -0.44])


def test_centring_changes_the_ranking_against_raw_cosine() -> None:
    # Every talent shares a dominant direction (e5-like anisotropy); "a" has the most of it,
    # "b" carries the task's specific direction.
    vectors = np.stack(
        [
            unit([0.98, 0.2, 0, 0, 0]),
            unit([0.8, 0, 0.6, 0, 0]),
            unit([0.8, 0, 0, 0.6, 0]),
            unit([0.8, 0, 0, 0, 0.6]),
        ]
    )
    task = unit([0.95, 0, 0.25, 0, 0])
    raw = vectors @ task
    centred = centred_similarities(vectors, task)
    assert raw[0] > raw[1] > raw[2]
    assert centred[1] > centred[0] > centred[2]
    assert centred[1] == pytest.approx(0.6549, abs=1e-4)

    candidates = [talent(i) for i in "abcd"]
    result = select(candidates, vectors, task, set())
    assert result.kept_ids == ["b"]
    assert result.kept[0].similarity == pytest.approx(centred[1])
    assert reasons(result)["a"] is Reason.BELOW_MARGIN


def test_single_candidate_centres_to_zero_and_is_scored_on_stems_alone() -> None:
    vector = unit([0.6, 0.8])[np.newaxis, :]
    assert centred_similarities(vector, unit([0.6, 0.8])).tolist() == [0.0]

    lone = talent("lone", stem_set=frozenset({"graph"}))
    closed = select([lone], vector, unit([1.0, 0.0]), {"other"})
    assert closed.out_of_domain
    assert closed.excluded[0].similarity == 0.0

    opened = select([lone], vector, unit([1.0, 0.0]), {"graph"})
    assert opened.kept_ids == ["lone"]
    assert opened.kept[0].score == pytest.approx(0.12)
    assert opened.kept[0].reason is Reason.RELEVANCE


def test_identical_candidates_and_a_task_at_the_mean_give_zero_not_nan() -> None:
    same = np.stack([unit([0.3, 0.4, 0.5])] * 3).astype(np.float32)
    assert centred_similarities(same, unit([1.0, 0.0, 0.0])).tolist() == [0.0, 0.0, 0.0]

    vectors = np.stack([unit([1.0, 0.0]), unit([0.0, 1.0])])
    at_mean = vectors.mean(axis=0)
    assert centred_similarities(vectors, at_mean).tolist() == [0.0, 0.0]


def test_zero_norm_talent_vector_is_tolerated() -> None:
    vectors = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    similarities = centred_similarities(vectors, unit([1.0, 0.0, 0.0]))
    assert np.all(np.isfinite(similarities))
    assert int(np.argmax(similarities)) == 1


def test_mismatched_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="dims"):
        centred_similarities(np.eye(3), np.ones(2))
    with pytest.raises(ValueError, match="candidates"):
        select([talent("a")], np.eye(2), np.ones(2), set())


def test_zero_candidates_give_an_empty_selection() -> None:
    result = select([], np.zeros((0, 4)), np.ones(4), {"task"})
    assert result.kept == () and result.excluded == ()
    assert not result.out_of_domain
    assert result.note == NOTE_NO_CANDIDATES


# --- gate ---------------------------------------------------------------------------------------

EMBEDDER = FakeEmbedder()
CATALOGUE = [
    ScorableTalent.build(
        "architecture.hexagonal",
        "Hexagonal architecture",
        "Ports and adapters around a pure domain core",
        body="h" * 400,
        tags=["architecture", "hexagonal"],
        triggers=["hexagonal"],
    ),
    ScorableTalent.build(
        "architecture.use-case",
        "Use case",
        "One application service per use case",
        body="u" * 300,
        tags=["application", "use-case"],
        triggers=["use case"],
    ),
    ScorableTalent.build(
        "architecture.port-adapter",
        "Port and adapter",
        "Interfaces owned by the domain, implemented outside",
        body="p" * 300,
        tags=["ports", "adapters"],
        triggers=["repository interface"],
    ),
    ScorableTalent.build(
        "architecture.value-object",
        "Value object",
        "Immutable types compared by value",
        body="v" * 200,
        tags=["modelling"],
        triggers=["value object", "immutable"],
    ),
    ScorableTalent.build(
        "architecture.dependency-rule",
        "Dependency rule",
        "Source dependencies point inwards only",
        body="d" * 200,
        tags=["layers", "dependencies"],
        triggers=["import direction"],
    ),
    ScorableTalent.build(
        "frontend.css-grid",
        "CSS grid layout",
        "Page layout with CSS grid",
        body="c" * 200,
        tags=["css", "layout"],
        triggers=["grid", "responsive"],
    ),
]
CATALOGUE_VECTORS = EMBEDDER.embed([t.text for t in CATALOGUE])


def run(task: str, params: SelectionParams | None = None) -> SelectionResult:
    return select(CATALOGUE, CATALOGUE_VECTORS, EMBEDDER.embed([task])[0], stems(task), params)


def test_gate_closes_on_an_off_domain_task() -> None:
    result = run("Tweak flexbox spacing on navbar")
    assert result.out_of_domain
    assert result.note == NOTE_OUT_OF_DOMAIN == "no specific talent for this task"
    assert result.kept == ()
    assert len(result.excluded) == len(CATALOGUE)
    assert {t.reason for t in result.excluded} == {Reason.OUT_OF_DOMAIN}
    assert max(t.similarity for t in result.excluded) < 0.18
    assert sum(t.stem_hits for t in result.excluded) == 0


def test_gate_opens_on_a_stem_hit_even_below_the_floor() -> None:
    # "responsiveness" is a different word for the embedder but shares the stem "respo".
    result = run("Tweak flexbox spacing on navbar for responsiveness")
    similarities = [t.similarity for t in (*result.kept, *result.excluded)]
    assert max(similarities) < 0.18
    assert not result.out_of_domain
    top = result.kept[0]
    assert (top.id, top.stem_hits) == ("frontend.css-grid", 1)
    assert top.score == pytest.approx(top.similarity + 0.12)
    assert [t.stem_hits for t in result.kept[1:]] == [0] * (len(result.kept) - 1)


def test_gate_opens_on_similarity_alone() -> None:
    vectors, task = geometry([0.5, 0.4, -0.3, -0.6])
    result = select([talent(i) for i in "abcd"], vectors, task, set())
    assert not result.out_of_domain
    assert result.kept_ids == ["a", "b"]
    assert sum(t.stem_hits for t in (*result.kept, *result.excluded)) == 0


def test_floor_is_configurable() -> None:
    vectors, task = geometry([0.5, 0.4, -0.3, -0.6])
    result = select([talent(i) for i in "abcd"], vectors, task, set(), SelectionParams(floor=0.6))
    assert result.out_of_domain


# --- cut ----------------------------------------------------------------------------------------


def test_margin_cut_keeps_scores_within_margin_of_the_top_sorted() -> None:
    vectors, task = geometry([0.4, 0.5, -0.3, -0.6])
    # "c" climbs from -0.30 to 0.18 with four stem hits: 0.5 - 0.15 = 0.35 still cuts it.
    four = frozenset({"graph", "hexag", "layer", "ports"})
    candidates = [talent("a"), talent("b"), talent("c", stem_set=four), talent("d")]
    result = select(candidates, vectors, task, four)
    assert result.kept_ids == ["b", "a"]
    assert [t.score for t in result.kept] == pytest.approx([0.5, 0.4])
    assert [(t.id, t.reason) for t in result.excluded] == [
        ("c", Reason.BELOW_MARGIN),
        ("d", Reason.BELOW_MARGIN),
    ]
    assert result.excluded[0].score == pytest.approx(-0.3 + 4 * 0.12)
    assert result.excluded[0].stem_hits == 4

    wider = select(candidates, vectors, task, four, SelectionParams(margin=0.35))
    assert wider.kept_ids == ["b", "a", "c"]


def test_non_positive_scores_within_the_margin_are_excluded() -> None:
    # Top 0.10 (under the floor); "b" has a stem hit, which opens the gate: -0.05 + 0.12 = 0.07.
    vectors, task = geometry([0.1, -0.05, -0.03, -0.02])
    candidates = [talent("a"), talent("b", stem_set=frozenset({"hexag"})), talent("c"), talent("d")]
    result = select(candidates, vectors, task, {"hexag"})
    assert not result.out_of_domain
    assert result.kept_ids == ["a", "b"]
    assert [t.score for t in result.kept] == pytest.approx([0.1, 0.07])
    assert [(t.id, t.reason) for t in result.excluded] == [
        ("d", Reason.NON_POSITIVE),
        ("c", Reason.NON_POSITIVE),
    ]


def test_below_margin_takes_precedence_over_non_positive() -> None:
    vectors, task = geometry([0.5, 0.4, -0.3, -0.6])
    result = select([talent(i) for i in "abcd"], vectors, task, set())
    assert reasons(result)["d"] is Reason.BELOW_MARGIN


def test_budget_packs_by_score_skipping_what_does_not_fit() -> None:
    vectors, task = geometry([0.3, 0.28, 0.26, -0.4, -0.44])
    candidates = [
        talent("a", tokens=1500),
        talent("b", tokens=600),
        talent("c", tokens=400),
        talent("d", tokens=1),
        talent("e", tokens=1),
    ]
    result = select(candidates, vectors, task, set())
    assert result.kept_ids == ["a", "c"]
    assert sum(t.tokens for t in result.kept) == 1900
    assert [(t.id, t.reason) for t in result.excluded] == [
        ("b", Reason.OVER_BUDGET),
        ("d", Reason.BELOW_MARGIN),
        ("e", Reason.BELOW_MARGIN),
    ]
    assert result.excluded[0].score == pytest.approx(0.28)
    assert result.excluded[0].tokens == 600


def test_budget_prefers_the_higher_score_over_a_better_fit() -> None:
    vectors, task = geometry([0.3, 0.28, 0.26, -0.4, -0.44])
    candidates = [talent("a", tokens=900), talent("b", tokens=900), talent("c", tokens=900)]
    candidates += [talent("d"), talent("e")]
    result = select(candidates, vectors, task, set(), SelectionParams(budget_tokens=1000))
    assert result.kept_ids == ["a"]
    assert reasons(result)["b"] is reasons(result)["c"] is Reason.OVER_BUDGET


def test_fallback_keeps_top_three_when_everything_is_over_budget() -> None:
    vectors, task = geometry([0.3, 0.28, 0.26, -0.4, -0.44])
    candidates = [talent(i, tokens=500) for i in "abcde"]
    result = select(candidates, vectors, task, set(), SelectionParams(budget_tokens=100))
    assert result.note == NOTE_FALLBACK
    assert not result.out_of_domain
    assert result.kept_ids == ["a", "b", "c"]
    assert {t.reason for t in result.kept} == {Reason.FALLBACK_TOP3}
    assert [t.score for t in result.kept] == pytest.approx([0.3, 0.28, 0.26])
    assert [(t.id, t.reason) for t in result.excluded] == [
        ("d", Reason.BELOW_MARGIN),
        ("e", Reason.BELOW_MARGIN),
    ]


def test_fallback_with_fewer_than_three_candidates_keeps_them_all() -> None:
    vectors, task = geometry([0.4, -0.4])
    candidates = [talent("a", tokens=500), talent("b", tokens=500)]
    result = select(candidates, vectors, task, set(), SelectionParams(budget_tokens=10))
    assert result.kept_ids == ["a", "b"]
    assert result.excluded == ()


def test_equal_scores_are_ordered_by_id() -> None:
    same = np.stack([unit([1.0, 2.0])] * 3)
    candidates = [talent(i, stem_set=frozenset({"graph"})) for i in ("z", "m", "a")]
    result = select(candidates, same, unit([2.0, 1.0]), {"graph"})
    assert result.kept_ids == ["a", "m", "z"]


def test_seed_task_keeps_hexagonal_and_use_case_with_the_fake_embedder() -> None:
    result = run("Implement the UpdateProject use case in the hexagonal architecture")
    assert result.kept_ids == ["architecture.use-case", "architecture.hexagonal"]
    hexagonal = result.kept[1]
    assert hexagonal.stem_hits == 2
    assert hexagonal.tokens == 100
    assert hexagonal.score == pytest.approx(hexagonal.similarity + 0.24)
    assert {t.id: t.reason for t in result.excluded} == {
        "architecture.port-adapter": Reason.BELOW_MARGIN,
        "architecture.value-object": Reason.BELOW_MARGIN,
        "architecture.dependency-rule": Reason.BELOW_MARGIN,
        "frontend.css-grid": Reason.BELOW_MARGIN,
    }


# --- relevance off ------------------------------------------------------------------------------


def test_relevance_off_keeps_everything_ordered_by_stem_hits_then_id() -> None:
    candidates = [
        talent("c", tokens=5000),
        talent("b", stem_set=frozenset({"graph", "hexag"})),
        talent("a"),
        talent("d", stem_set=frozenset({"graph"})),
    ]
    result = order_without_relevance(candidates, {"graph", "hexag"})
    assert result.kept_ids == ["b", "d", "a", "c"]
    assert {t.reason for t in result.kept} == {Reason.RELEVANCE_OFF}
    assert result.excluded == ()
    assert [t.score for t in result.kept] == pytest.approx([0.24, 0.12, 0.0, 0.0])
    assert not result.out_of_domain


def test_relevance_off_with_vectors_orders_by_the_selection_score_without_cutting() -> None:
    vectors, task = geometry([0.3, 0.28, 0.26, -0.4, -0.44])
    candidates = [talent(i, tokens=5000) for i in "edcba"]
    result = order_without_relevance(candidates, set(), vectors, task)
    assert result.kept_ids == ["e", "d", "c", "b", "a"]
    assert [t.similarity for t in result.kept] == pytest.approx([0.3, 0.28, 0.26, -0.4, -0.44])


def test_relevance_off_does_not_gate_an_off_domain_task() -> None:
    task = "Tweak flexbox spacing on navbar"
    vector = EMBEDDER.embed([task])[0]
    result = order_without_relevance(CATALOGUE, stems(task), CATALOGUE_VECTORS, vector)
    assert len(result.kept) == len(CATALOGUE)
    assert not result.out_of_domain
