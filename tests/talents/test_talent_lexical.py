"""The lexical side of talent relevance, and hybrid scoring in `select` (pure maths)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from satchel.server.talents.domain.lexical import LexicalIndex, analyze, language
from satchel.server.talents.domain.selection import (
    Reason,
    ScorableTalent,
    Scoring,
    SelectionParams,
    select,
    stems,
)


def test_words_are_stemmed_in_their_language_and_lose_their_accents() -> None:
    assert language(["je", "veux", "des", "tests", "pour", "le", "composant"]) == "french"
    assert language(["write", "the", "tests", "for", "this", "component"]) == "english"
    assert analyze("Écrire des tests unitaires pour le déploiement") == [
        "ecrir",
        "test",
        "unitair",
        "deploi",
    ]
    assert analyze("Testing the deployments") == ["test", "deploy"]


def test_a_rare_word_counts_more_than_a_common_one() -> None:
    index = LexicalIndex.of(
        [
            "Pinia store for Vue code",
            "React code review",
            "Python code style",
            "Go code layout",
        ]
    )
    scores, full = index.scores("tidy the Pinia code")
    assert scores.argmax() == 0
    assert index.idf["pinia"] > index.idf["code"]
    # A candidate of mean length holding each known term once scores the sum of their IDF.
    assert math.isclose(full, index.idf["pinia"] + index.idf["code"])
    none, nothing = index.scores("banana bread")
    assert not none.any() and nothing == 0.0


def _talent(id: str, text: str) -> ScorableTalent:
    return ScorableTalent(id=id, name=id, text=text, stems=frozenset(), tokens=10)


CANDIDATES = [
    _talent("a", "Docker images and compose files"),
    _talent("b", "Pinia stores for Vue"),
    _talent("c", "pytest fixtures"),
    _talent("d", "Terraform modules"),
]
# Unit vectors: the task lies nearest to "a", then "b".
VECTORS = np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
TASK = np.array([0.9, 0.3, 0.1])


def test_hybrid_scoring_adds_the_lexical_rank_to_the_plain_cosine() -> None:
    params = SelectionParams(floor=-1.0, margin=10.0, scoring=Scoring.HYBRID, text_weight=0.5)
    result = select(CANDIDATES, VECTORS, TASK, stems("Pinia"), params, task="Add a Pinia store")
    decisions = {d.id: d for d in (*result.kept, *result.excluded)}
    assert result.kept[0].id == "b"  # second by cosine, first with its words
    assert decisions["b"].text_rank == 1.0 and decisions["a"].text_rank == 0.0
    unit_task = TASK / np.linalg.norm(TASK)
    for i, talent in enumerate(CANDIDATES):
        d = decisions[talent.id]
        assert math.isclose(
            d.similarity, float(VECTORS[i] @ unit_task / np.linalg.norm(VECTORS[i]))
        )
        assert math.isclose(d.score, d.similarity + 0.12 * d.stem_hits + 0.5 * d.text_rank)


def test_the_seed_scoring_has_no_lexical_rank() -> None:
    params = SelectionParams(floor=-1.0, margin=10.0)
    result = select(CANDIDATES, VECTORS, TASK, stems("Pinia"), params, task="Add a Pinia store")
    assert all(d.text_rank == 0.0 for d in (*result.kept, *result.excluded))
    assert result.kept[0].id == "a"


def test_max_served_caps_what_relevance_keeps() -> None:
    params = SelectionParams(floor=-1.0, margin=10.0, max_served=2)
    result = select(CANDIDATES, VECTORS, TASK, set(), params)
    assert [d.id for d in result.kept] == ["a", "b"]
    over = [d for d in result.excluded if d.reason == Reason.OVER_MAX_SERVED]
    assert [d.id for d in over] == [d.id for d in result.excluded if d.score > 0]


def test_the_gate_reads_the_similarity_of_the_scoring_never_the_words() -> None:
    """Hybrid: the best plain cosine below the floor (and no stem hit) is out of domain, even
    when the task's words match a talent's text; the seed: the best centred similarity."""
    hybrid = SelectionParams(floor=0.5, scoring=Scoring.HYBRID)
    far = select(CANDIDATES, VECTORS, np.array([0.0, 0.0, -1.0]), set(), hybrid, task="Docker")
    assert far.out_of_domain and not far.kept
    assert max(d.text_rank for d in far.excluded) == 1.0
    near = select(CANDIDATES, VECTORS, np.array([1.0, 0.0, 0.0]), set(), hybrid, task="Docker")
    assert not near.out_of_domain and near.kept[0].id == "a"
    seed = select(CANDIDATES, VECTORS, TASK, set(), SelectionParams(floor=0.99))
    assert seed.out_of_domain and not seed.kept


@pytest.mark.parametrize("field, value", [("text_weight", -0.1), ("max_served", -1)])
def test_parameters_are_validated(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SelectionParams(**{field: value})  # type: ignore[arg-type]
