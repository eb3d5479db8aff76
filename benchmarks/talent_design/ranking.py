"""The design probe's texts and BM25F index (probe.py, features.py).

What was kept is in the server: the words in `server/talents/domain/terms.py` (imported here),
BM25F as `talent_lexical.FieldIndex`, the fusion, gate and cut in `talents/domain/fusion.py`. The
measurements that chose them are in `results.md` and benchmarks/talents.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# --- texts ---------------------------------------------------------------------------------

FULL_TEXT_CHARS = 1500
"""The full text (name, tags, summary, body) is cut here before embedding and indexing: the
embedding models read at most 256 (MiniLM) / 512 (e5) tokens anyway, and a long rule body's
tail is mostly examples that dilute BM25's length normalisation."""

SHORT_TEXT_CHARS = 600
"""The short text (name, tags, summary) is cut here: it is what the talent is *for*."""


@dataclass(frozen=True)
class TalentText:
    """What selection reads of a talent. For a tool: `name` its name, `tags` its group (MCP
    server, API provider...), `summary` its description, `body` one line a parameter."""

    id: str
    name: str
    summary: str = ""
    tags: tuple[str, ...] = ()
    body: str = ""


def _head(talent: TalentText) -> str:
    tags = ", ".join(t for t in talent.tags if t.strip())
    return f"{talent.name} ({tags})" if tags else talent.name


def short_text(talent: TalentText) -> str:
    """Name (tags) and summary: one line each."""
    lines = [_head(talent), talent.summary.strip()]
    return "\n".join(line for line in lines if line)[:SHORT_TEXT_CHARS]


def full_text(talent: TalentText) -> str:
    """Name (tags), summary, body, cut at FULL_TEXT_CHARS. For a catalogue tool this is
    `Tool.text()` of benchmarks/catalogues.py, cut."""
    body = talent.body.strip()
    lines = [_head(talent), talent.summary.strip(), "" if body == talent.summary.strip() else body]
    return "\n".join(line for line in lines if line)[:FULL_TEXT_CHARS]


# --- words ---------------------------------------------------------------------------------

# The words of talents and tasks: the server's own analyzer (ported from this probe).
from satchel.server.talents.domain.lexical import FieldIndex, TalentFields  # noqa: E402
from satchel.server.talents.domain.terms import (  # noqa: E402
    REQUEST_WORDS,
    STOP_WORDS,
    analyze,
    task_terms,
    text_language,
)

__all__ = ["REQUEST_WORDS", "STOP_WORDS", "analyze", "task_terms", "text_language"]


# --- lexical index (the server's BM25F) -----------------------------------------------------


def _fields(talent: TalentText) -> TalentFields:
    body = talent.body.strip()
    summary = talent.summary.strip()
    return TalentFields(
        name=talent.name,
        tags=" ".join(talent.tags),
        summary=summary,
        body="" if body == summary else body[:FULL_TEXT_CHARS],
    )


class LexicalIndex:
    """BM25F over a fixed talent set: `satchel.server.talents.domain.lexical.FieldIndex` (name
    x3, tags x1.5, summary x2, body x1) over these texts."""

    def __init__(self, index: FieldIndex) -> None:
        self.index = index

    @classmethod
    def build(cls, talents: Sequence[TalentText]) -> LexicalIndex:
        return cls(FieldIndex.of([_fields(t) for t in talents]))

    def scores(self, terms: Iterable[str]) -> np.ndarray:
        """Every talent's BM25F for these (distinct) terms."""
        return self.index.scores(terms)
