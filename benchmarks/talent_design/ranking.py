"""The design probe's texts and BM25F index (probe.py, features.py).

What was kept is in the server: the words in `server/domain/talent_terms.py` (imported here),
BM25F as `talent_lexical.FieldIndex`, the fusion, gate and cut in `talent_fusion.py`. The
measurements that chose them are in `results.md` and benchmarks/talents.md.
"""

from __future__ import annotations

import math
from collections import Counter
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
from satchel.server.domain.talent_terms import (  # noqa: E402
    REQUEST_WORDS,
    STOP_WORDS,
    analyze,
    task_terms,
    text_language,
)

__all__ = ["REQUEST_WORDS", "STOP_WORDS", "analyze", "task_terms", "text_language"]


# --- lexical index (BM25F) -------------------------------------------------------------------

K1 = 1.2
"""BM25 term-frequency saturation (the usual value)."""

B = 0.75
"""BM25 length normalisation, per field (the usual value)."""

FIELD_WEIGHTS: dict[str, float] = {"name": 3.0, "tags": 1.5, "summary": 2.0, "body": 1.0}
"""BM25F: a term's frequency in each field, length-normalised within the field, is weighted
by these and summed before saturation. The name and the summary say what a talent is for;
the body (parameters, rule text) mostly how. Tuned on the DEV sets (results.md)."""


def _fields(talent: TalentText) -> dict[str, str]:
    body = talent.body.strip()
    summary = talent.summary.strip()
    return {
        "name": talent.name,
        "tags": " ".join(talent.tags),
        "summary": summary,
        "body": "" if body == summary else body[:FULL_TEXT_CHARS],
    }


@dataclass(frozen=True, eq=False)
class LexicalIndex:
    """BM25F over a fixed talent set. `postings[term]` holds the rows containing `term` and
    each row's whole contribution idf x saturated weighted tf (it does not depend on the
    task, so a task's score is one sum per term). `idf_unknown` is the IDF a term in no
    talent would have (for the coverage of a task's terms)."""

    postings: dict[str, tuple[np.ndarray, np.ndarray]]
    idf: dict[str, float]
    idf_unknown: float
    size: int

    @classmethod
    def build(
        cls, talents: Sequence[TalentText], weights: dict[str, float] | None = None
    ) -> LexicalIndex:
        weights = FIELD_WEIGHTS if weights is None else weights
        names = list(weights)
        per_field = {f: [Counter(analyze(_fields(t)[f])) for t in talents] for f in names}
        n = len(talents)
        norms = {}
        for f in names:
            lengths = np.array([sum(c.values()) for c in per_field[f]], dtype=np.float64)
            mean = float(lengths.mean()) if n and lengths.mean() > 0 else 1.0
            norms[f] = 1 - B + B * lengths / mean
        weighted: dict[str, dict[int, float]] = {}
        for f in names:
            w = weights[f]
            if w == 0:
                continue
            for i, counts in enumerate(per_field[f]):
                for term, tf in counts.items():
                    row = weighted.setdefault(term, {})
                    row[i] = row.get(i, 0.0) + w * tf / norms[f][i]
        postings = {}
        idf = {}
        for term, rows in weighted.items():
            df = len(rows)
            idf[term] = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = np.fromiter(rows.values(), dtype=np.float64, count=df)
            postings[term] = (
                np.fromiter(rows.keys(), dtype=np.intp, count=df),
                idf[term] * tf * (K1 + 1) / (tf + K1),
            )
        return cls(postings, idf, math.log(1 + (n + 0.5) / 0.5), n)

    def scores(self, terms: Iterable[str]) -> np.ndarray:
        """Every talent's BM25F for these (distinct) terms."""
        result = np.zeros(self.size)
        for term in terms:
            posting = self.postings.get(term)
            if posting is not None:
                result[posting[0]] += posting[1]
        return result
