"""Rule-based entity extraction for the multi-hop expansion."""

from __future__ import annotations

from satchel.server.context.domain.entities import SENTENCE_STARTERS, extract_entities


def test_ranked_by_frequency_across_texts() -> None:
    texts = [
        "Paris is where Melanie met Caroline.",
        "Melanie paints; Caroline volunteers.",
        "Melanie likes camping.",
    ]
    assert extract_entities(texts, "what does she like") == ["Melanie", "Caroline"]


def test_ties_broken_by_first_appearance() -> None:
    texts = ["Oscar met Bruno", "Bruno met Oscar", "Alice"]
    assert extract_entities(texts, "") == ["Oscar", "Bruno"]
    assert extract_entities(["Zed Abe Zed Abe"], "") == ["Zed", "Abe"]


def test_at_most_two_by_default_and_max_entities_honoured() -> None:
    texts = ["Anna Boris Chloe Dmitri Anna Boris Chloe Anna Boris Anna"]
    assert extract_entities(texts, "") == ["Anna", "Boris"]
    assert extract_entities(texts, "", max_entities=3) == ["Anna", "Boris", "Chloe"]
    assert extract_entities(texts, "", max_entities=1) == ["Anna"]
    assert extract_entities(texts, "", max_entities=0) == []


def test_sentence_starters_excluded_in_english_and_french() -> None:
    texts = [
        "The group met. The group laughed. Yesterday Jon came. When? Today. Also This That",
        "Les enfants et Hier encore. Aujourd'hui Nadia vient. Mais Quand Elle",
        "She said They We It And But What",
    ]
    assert extract_entities(texts, "", max_entities=5) == ["Jon", "Nadia"]


def test_starters_cover_the_brief_words() -> None:
    required = (
        "the le la les and et but this that when what yesterday today also she he they it we i"
    )
    assert set(required.split()) <= SENTENCE_STARTERS


def test_words_of_the_query_excluded_case_insensitively() -> None:
    texts = ["Caroline went to Boston with Caroline's friend Melanie. Caroline smiled."]
    assert extract_entities(texts, "When did CAROLINE go?") == ["Boston", "Melanie"]


def test_query_exclusion_is_a_whole_word_match() -> None:
    texts = ["Caroline Caroline Boston"]
    assert extract_entities(texts, "carol went there") == ["Caroline", "Boston"]


def test_accented_capitals_and_letters() -> None:
    texts = ["Élodie et Zoé vont à Ørsta. Élodie aime Zoé. Élodie chante."]
    assert extract_entities(texts, "") == ["Élodie", "Zoé"]
    assert extract_entities(texts, "que fait élodie") == ["Zoé", "Ørsta"]


def test_only_whole_capitalised_words_of_three_letters_or_more() -> None:
    texts = ["McDonald JavaScript LGBTQ Al Bo iPhone Paris2024 Rome"]
    assert extract_entities(texts, "") == ["Rome"]


def test_nothing_to_extract() -> None:
    assert extract_entities([], "query") == []
    assert extract_entities(["all lower case text"], "") == []


def test_calendar_names_and_words_also_seen_in_lower_case_are_not_entities() -> None:
    texts = [
        "On Friday Jon went dancing. Dancing helps Jon. According to Gina, May was busy.",
        "Painting is what Gina loves; she started painting in Rome.",
    ]
    assert extract_entities(texts, "", max_entities=5) == ["Jon", "Gina", "Rome"]
