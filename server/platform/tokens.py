"""Counting tokens, defined once: the estimate (characters / 4) and a real tokenizer.

A context budget bounds the rendered block the agent puts in its prompt (`SATCHEL_BUDGET_COUNTS
=block`): packing charges each line of the block its `bound`, an upper bound of what the line
adds to the whole block's `count` (a line and the newline after it), so the block's count never
exceeds the sum charged. `SATCHEL_TOKENIZER` names a Hugging Face `tokenizer.json` (the LLM's
own, say) to count with; unset, the estimate. Talent selections and the evaluation use the
estimate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from satchel.server.platform.config import ConfigError, Settings

ESTIMATE = "chars/4"


def estimate_tokens(text: str) -> int:
    """The estimate of a text's tokens: `max(1, len(text) // 4)`."""
    return max(1, len(text) // 4)


class TokenCounter(Protocol):
    """Counts a text's tokens; `bound` is at least what a part adds to a text it is joined to
    (with a newline)."""

    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...

    def bound(self, part: str) -> int: ...


class CharacterEstimate:
    """The estimate: characters / 4."""

    name = ESTIMATE

    def count(self, text: str) -> int:
        return estimate_tokens(text)

    def bound(self, part: str) -> int:
        # Rounded up, with its newline: the parts' bounds sum to at least the whole's estimate.
        return -(-(len(part) + 1) // 4)


class TokenizerCounter:
    """A Hugging Face tokenizer (`tokenizer.json`), without special tokens."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception on a bad file
            raise ConfigError(f"SATCHEL_TOKENIZER {path} is not a tokenizer.json: {exc}") from exc
        # A model's file may pad or truncate its inputs (an embedder's does): a count must not.
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.name = f"tokenizer:{path.name}"

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def bound(self, part: str) -> int:
        # A token more for the newline and a merge across the join, which tokenizers may make.
        return self.count(part) + 1


def counter_of(settings: Settings) -> TokenCounter:
    """The counter `settings` name (SATCHEL_TOKENIZER), else the estimate."""
    if settings.tokenizer is None:
        return CharacterEstimate()
    return TokenizerCounter(settings.tokenizer)
