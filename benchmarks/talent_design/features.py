"""Per catalogue and task: the raw signals every method of probe.py is built from.

For a catalogue: the talents' short and full vectors, the new BM25F index, the baseline BM25
(benchmarks/catalogue_baselines.py: stemmed, over the full text) and the old hybrid's pieces
(server/domain: cosine over `ScorableTalent.text`, stem hits, talent_lexical BM25). For a set of
task texts: dense (tasks x talents) matrices of each signal.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from ranking import LexicalIndex, TalentText, full_text, short_text, task_terms
from vectors import Vectors


def unit(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-9)


@dataclass(eq=False)
class Catalogue:
    """A catalogue's talents with everything computed once per catalogue."""

    key: str
    talents: tuple[TalentText, ...]
    vectors: Vectors
    short: np.ndarray = field(init=False)
    full: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.short = unit(self.vectors.passages([short_text(t) for t in self.talents]))
        self.full = unit(self.vectors.passages([full_text(t) for t in self.talents]))
        self.ids = [t.id for t in self.talents]
        self.index_of = {t: i for i, t in enumerate(self.ids)}

    @functools.cached_property
    def lexical(self) -> LexicalIndex:
        return LexicalIndex.build(self.talents)

    @functools.cached_property
    def baseline(self):
        from catalogue_baselines import BM25

        return BM25([full_text(t) for t in self.talents])

    @functools.cached_property
    def old(self):
        """The server's hybrid pieces: ScorableTalent texts, their vectors, stems, index."""
        from satchel.server.talents.domain.lexical import LexicalIndex as OldIndex
        from satchel.server.talents.domain.selection import ScorableTalent

        scorable = [
            ScorableTalent.build(id=t.id, name=t.name, summary=t.summary, body=t.body, tags=t.tags)
            for t in self.talents
        ]
        vectors = unit(self.vectors.passages([s.text for s in scorable]))
        return scorable, vectors, OldIndex.of([s.text for s in scorable])


@dataclass(eq=False)
class Signals:
    """Dense (tasks x talents) signals for some task texts over a catalogue."""

    cs: np.ndarray  # cosine with the short text
    cf: np.ndarray  # cosine with the full text
    lex: np.ndarray  # BM25F (ranking.LexicalIndex)
    q: np.ndarray  # task vectors, unit
    terms: list[list[str]]


def signals(cat: Catalogue, texts: list[str]) -> Signals:
    q = unit(cat.vectors.queries(texts))
    terms = [task_terms(t) for t in texts]
    lex = np.stack([cat.lexical.scores(t) for t in terms]) if texts else np.zeros((0, len(cat.ids)))
    return Signals(q @ cat.short.T, q @ cat.full.T, lex.astype(np.float32), q, terms)


def baseline_bm25(cat: Catalogue, texts: list[str]) -> np.ndarray:
    return np.stack([cat.baseline.scores(t) for t in texts]).astype(np.float32)


def old_hybrid(cat: Catalogue, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The server's hybrid score (cosine + 0.12 x stem hits + 0.3 x BM25 / best), its plain
    cosine and stem hits, for the gate (best cosine < 0.22 and no stem hit)."""
    from satchel.server.talents.domain.selection import stems

    scorable, vectors, index = cat.old
    q = unit(cat.vectors.queries(texts))
    cos = q @ vectors.T
    hits = np.zeros_like(cos)
    lex = np.zeros_like(cos)
    for i, text in enumerate(texts):
        st = stems(text)
        hits[i] = [len(s.stems & st) for s in scorable]
        bm, _ = index.scores(text)
        best = bm.max() if len(bm) else 0
        lex[i] = bm / best if best > 0 else 0
    return cos + 0.12 * hits + 0.3 * lex, cos, hits
