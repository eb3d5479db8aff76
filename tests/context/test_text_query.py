"""The full-text side of a context query: content words, OR-ed, normalised."""

from __future__ import annotations

from satchel.server.context.domain.entities import SENTENCE_STARTERS
from satchel.server.context.domain.text_query import (
    MAX_QUERY_TERMS,
    STOP_WORDS,
    TS_RANK_UNIT,
    query_terms,
)


def test_content_words_only_lower_cased_deduplicated_in_order() -> None:
    terms = query_terms("When did Caroline go to the LGBTQ support group? Caroline's GROUP!")
    assert terms == ["caroline", "go", "lgbtq", "support", "group"]


def test_operators_quotes_and_punctuation_never_reach_the_query() -> None:
    terms = query_terms('lisbon OR "pottery workshop" -french (( a_b x')
    assert terms == ["lisbon", "pottery", "workshop", "french"]


def test_french_and_accents_kept_function_words_dropped() -> None:
    assert query_terms("Où est-ce que Zoé a déménagé à Ørsta ?") == ["zoé", "déménagé", "ørsta"]
    assert {"où", "est", "que", "à"} <= STOP_WORDS


def test_stop_words_include_the_sentence_starters() -> None:
    assert SENTENCE_STARTERS <= STOP_WORDS
    assert {"what", "when", "did", "is", "or", "how"} <= STOP_WORDS


def test_empty_or_function_words_only_search_nothing() -> None:
    assert query_terms("") == [] and query_terms("what is it?") == []


def test_at_most_max_terms() -> None:
    words = " ".join(f"word{i}" for i in range(40))
    terms = query_terms(words)
    assert len(terms) == MAX_QUERY_TERMS and terms[0] == "word0"
    assert TS_RANK_UNIT == 0.1, "ts_rank_cd of one unweighted occurrence"
