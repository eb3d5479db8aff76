"""Rendering of facts and events: token estimate, statements, event texts, excerpts."""

from __future__ import annotations

import random

import pytest

from satchel.server.memory.domain.rendering import (
    derive_statement,
    excerpt,
    render_event_text,
)
from satchel.server.platform.tokens import estimate_tokens


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 1),
        ("abc", 1),
        ("abcd", 1),
        ("abcdefg", 1),
        ("abcdefgh", 2),
        ("x" * 9, 2),
        ("x" * 401, 100),
    ],
)
def test_estimate_tokens_is_length_over_four_at_least_one(text: str, expected: int) -> None:
    assert estimate_tokens(text) == expected


def test_derive_statement_seed_example() -> None:
    assert derive_statement("invoice_language", {"language": "fr"}) == (
        "invoice language: language = fr"
    )


def test_derive_statement_sorts_dict_keys_whatever_the_insertion_order() -> None:
    first = derive_statement("contact", {"phone": "555", "email": "a@b.c", "age": 40})
    second = derive_statement("contact", {"age": 40, "email": "a@b.c", "phone": "555"})
    assert first == second == "contact: age = 40, email = a@b.c, phone = 555"


@pytest.mark.parametrize(
    ("predicate", "value", "expected"),
    [
        ("user.preferred_name", "Ana", "user preferred name: Ana"),
        ("pet-name", "Rex", "pet name: Rex"),
        ("is_vegetarian", True, "is vegetarian: true"),
        ("has_car", False, "has car: false"),
        ("manager", None, "manager: none"),
        ("age", 42, "age: 42"),
        ("score", 0.5, "score: 0.5"),
        ("languages", ["fr", "en"], "languages: fr, en"),
        ("mixed", ["a", 3, None, False], "mixed: a, 3, none, false"),
        (
            "address",
            {"city": "Zürich", "geo": {"lon": 8, "lat": 47}},
            'address: city = Zürich, geo = {"lat":47,"lon":8}',
        ),
        ("nested", [{"b": 1, "a": 2}], 'nested: {"a":2,"b":1}'),
        ("empty_dict", {}, "empty dict: {}"),
        ("empty_list", [], "empty list: []"),
        ("nickname", "", 'nickname: ""'),
        ("", "bare", "bare"),
        ("ville_préférée", "Montréal", "ville préférée: Montréal"),
    ],
)
def test_derive_statement_values(predicate: str, value: object, expected: str) -> None:
    assert derive_statement(predicate, value) == expected


def test_render_event_text_conversation_reads_naturally() -> None:
    payload = {"speaker": "Caroline", "text": "I went to a LGBTQ support group yesterday"}
    assert render_event_text("conversation.message", payload) == (
        "Caroline: I went to a LGBTQ support group yesterday"
    )


def test_render_event_text_appends_other_keys_sorted_after_the_text() -> None:
    payload = {"session": 3, "text": "Hello", "speaker": "Mel", "date": "8 May 2023"}
    assert render_event_text("conversation.message", payload) == (
        "Mel: Hello date=8 May 2023 session=3"
    )


def test_render_event_text_role_and_content_keep_non_ascii() -> None:
    payload = {"role": "user", "content": "Je préfère les factures en français"}
    rendered = render_event_text("conversation.message", payload)
    assert rendered == "user: Je préfère les factures en français"
    assert "\\u" not in rendered


def test_render_event_text_without_speaker_is_the_text_alone() -> None:
    assert render_event_text("note", {"body": "Deploy froze at 18:00"}) == "Deploy froze at 18:00"


def test_render_event_text_text_key_priority() -> None:
    payload = {"message": "second", "text": "first", "content": "third"}
    assert render_event_text("x", payload) == "first content=third message=second"


def test_render_event_text_kind_prefix_without_text_key() -> None:
    payload = {"name": "grep", "args": {"pattern": "é", "path": "src"}}
    assert render_event_text("tool.call", payload) == (
        'tool.call args={"path":"src","pattern":"é"} name=grep'
    )


def test_render_event_text_non_string_or_blank_text_is_not_a_text() -> None:
    assert render_event_text("m", {"content": [{"type": "text"}], "ok": True}) == (
        'm content=[{"type":"text"}] ok=true'
    )
    assert render_event_text("m", {"text": "   ", "value": None}) == "m text=    value=null"


def test_render_event_text_empty_payload_is_the_kind() -> None:
    assert render_event_text("session.start", {}) == "session.start"


def test_render_event_text_is_independent_of_key_order() -> None:
    keys = ["speaker", "text", "session", "date", "mood"]
    values = {"speaker": "Jon", "text": "hi", "session": 1, "date": "d", "mood": "ok"}
    rng = random.Random(7)
    renderings = set()
    for _ in range(20):
        rng.shuffle(keys)
        renderings.add(render_event_text("k", {key: values[key] for key in keys}))
    assert renderings == {"Jon: hi date=d mood=ok session=1"}


def test_excerpt_keeps_short_text() -> None:
    assert excerpt("short text") == "short text"
    assert excerpt("x" * 600) == "x" * 600


def test_excerpt_cuts_on_a_word_boundary() -> None:
    assert excerpt("hello wonderful world", 12) == "hello…"
    assert excerpt("hello world again", 12) == "hello world…"
    assert excerpt("hello world", 6) == "hello…"


def test_excerpt_hard_cuts_a_single_long_word() -> None:
    assert excerpt("abcdefghijkl", 5) == "abcd…"


def test_excerpt_default_limit_is_600() -> None:
    text = ("word " * 200).strip()
    cut = excerpt(text)
    assert len(cut) <= 600
    assert cut.endswith("word…")


def test_excerpt_never_exceeds_the_limit_and_is_a_prefix() -> None:
    rng = random.Random(11)
    alphabet = "ab é\n"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        limit = rng.randint(1, 40)
        cut = excerpt(text, limit)
        assert len(cut) <= limit
        if len(text) <= limit:
            assert cut == text
        else:
            assert cut.endswith("…")
            assert text.startswith(cut[:-1])


def test_excerpt_rejects_a_non_positive_limit() -> None:
    with pytest.raises(ValueError):
        excerpt("text", 0)
