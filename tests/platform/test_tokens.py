"""Token counting (server/platform/tokens.py): the estimate, a real tokenizer.json, and the
bounds packing charges so that a block never counts more than its parts were charged."""

from __future__ import annotations

import random

from helpers.paths import ROOT

from satchel.server.platform.tokens import CharacterEstimate, TokenizerCounter, estimate_tokens

TOKENIZER = ROOT / "server" / "embedding" / "assets" / "all-MiniLM-L6-v2" / "tokenizer.json"


def test_the_estimate_is_a_quarter_of_the_characters_at_least_one() -> None:
    assert [estimate_tokens(t) for t in ("", "abc", "abcdefgh", "x" * 4003)] == [1, 1, 2, 1000]


def test_a_tokenizer_counts_everything_without_padding_or_truncation() -> None:
    counter = TokenizerCounter(TOKENIZER)  # an embedder's file: it pads and truncates to 128
    assert counter.name == "tokenizer:tokenizer.json"
    assert counter.count("") == 0
    long = " ".join(["Caroline walked her dog Biscuit along the beach"] * 300)
    assert counter.count(long) > 2000


def test_the_parts_bounds_cover_the_joined_text() -> None:
    rng = random.Random(38)
    words = ["Lisbon", "über", "naïve", "dog", "2026-03-01", "(confidence", "0.80)", "-", ":"]
    for counter in (CharacterEstimate(), TokenizerCounter(TOKENIZER)):
        for _ in range(200):
            parts = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(6)]
            assert counter.count("\n".join(parts)) <= sum(counter.bound(p) for p in parts)
