"""The lexical side of talent relevance: BM25 over candidates' texts, BM25F over their fields.

Pure, no I/O. `FieldIndex` (fused scoring, the default) scores a talent's name, tags, summary
and body as weighted fields, with the words of `talent_terms` (any language, CJK bigrams).
`LexicalIndex` (hybrid scoring) is Okapi BM25 over one text: words are lower-cased letter/digit
runs minus the English and French function words, stemmed with the Snowball stemmer of the text's
language (French when its French function words outnumber its English ones, as the SQL's
`satchel_text_config` decides), then stripped of accents, so that "tests unitaires" and "unit
testing" both reach "test", and "déployer" matches "deployer". IDF is computed over the candidate
set, which is what makes a rare word ("Pinia", "Solidity") count more than a common one ("code",
"file").
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from satchel.server.context.domain.text_query import STOP_WORDS
from satchel.server.talents.domain import terms as talent_terms

K1 = 1.2
B = 0.75

_WORD = re.compile(r"[^\W_]+")
_FRENCH_MARKERS_TEXT = """
le la les des une et est je tu il elle nous vous ils elles que qui pour dans pas du au aux
ce cette sur avec mon ma mes ton ta tes son sa ses leur mais ou où très aussi être avoir été
sont suis j c d l n qu s"""
_ENGLISH_MARKERS_TEXT = """
the and is are was were of to in it you that this for on with my your his her their our
be been have has had do does did not but or at by from what when where who how why which an
i me we they he she a"""
# The function words that tell French from English (as the SQL's `satchel_text_config`).
_FRENCH_MARKERS = frozenset(_FRENCH_MARKERS_TEXT.split())
_ENGLISH_MARKERS = frozenset(_ENGLISH_MARKERS_TEXT.split())


@functools.cache
def _stemmer(language: str) -> Any:
    from py_rust_stemmers import SnowballStemmer  # ships with fastembed, a dependency

    return SnowballStemmer(language)


def language(words: Sequence[str]) -> str:
    """'french' when French function words outnumber English ones among `words`, else
    'english'."""
    french = sum(1 for w in words if w in _FRENCH_MARKERS)
    english = sum(1 for w in words if w in _ENGLISH_MARKERS)
    return "french" if french > english else "english"


def _plain(word: str) -> str:
    decomposed = unicodedata.normalize("NFKD", word)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def analyze(text: str) -> list[str]:
    """The terms BM25 counts: content words, stemmed in the text's language, accents off."""
    words = _WORD.findall(text.casefold())
    stemmer = _stemmer(language(words))
    content = [w for w in words if len(w) >= 2 and w not in STOP_WORDS]
    return [_plain(stem) for stem in stemmer.stem_words(content)]


@dataclass(frozen=True, eq=False)
class LexicalIndex:
    """BM25 (k1 = 1.2, b = 0.75) over a fixed candidate set, built once per set.

    `postings[term]` holds the candidates that contain `term` and how often; `norms[i]` is
    k1 x (1 - b + b x length_i / mean length).
    """

    postings: dict[str, tuple[np.ndarray, np.ndarray]]
    idf: dict[str, float]
    norms: np.ndarray

    @classmethod
    def of(cls, texts: Sequence[str]) -> LexicalIndex:
        """Index the candidates' texts (row i = candidate i)."""
        documents = [Counter(analyze(text)) for text in texts]
        lengths = np.array([sum(d.values()) for d in documents], dtype=np.float64)
        mean = float(lengths.mean()) if len(documents) and lengths.mean() > 0 else 1.0
        rows: dict[str, list[tuple[int, int]]] = {}
        for i, document in enumerate(documents):
            for term, count in document.items():
                rows.setdefault(term, []).append((i, count))
        n = len(documents)
        postings = {
            term: (
                np.array([i for i, _ in hits], dtype=np.intp),
                np.array([c for _, c in hits], dtype=np.float64),
            )
            for term, hits in rows.items()
        }
        idf = {term: math.log(1 + (n - len(h) + 0.5) / (len(h) + 0.5)) for term, h in rows.items()}
        return cls(postings, idf, K1 * (1 - B + B * lengths / mean))

    def __len__(self) -> int:
        return len(self.norms)

    def scores(self, task: str) -> tuple[np.ndarray, float]:
        """Every candidate's BM25 for `task`, and the BM25 a candidate of mean length holding
        each of the task's known terms once would get (the scale: 0 when no term is known)."""
        result = np.zeros(len(self.norms))
        full = 0.0
        for term in dict.fromkeys(analyze(task)):
            posting = self.postings.get(term)
            if posting is None:
                continue
            idf = self.idf[term]
            rows, tf = posting
            result[rows] += idf * tf * (K1 + 1) / (tf + self.norms[rows])
            full += idf
        return result, full


FIELD_WEIGHTS: dict[str, float] = {"name": 3.0, "tags": 1.5, "summary": 2.0, "body": 1.0}
"""BM25F: a term's frequency in each field, length-normalised within the field, is weighted by
these and summed before saturation. The name and the summary say what a talent is for; the body
(parameters, rule text) mostly how (benchmarks/talents.md)."""


@dataclass(frozen=True)
class TalentFields:
    """What a talent says, field by field, for BM25F: `tags` its tags, triggers and task types,
    `body` its body and its tool parameters (bounded by the caller)."""

    name: str
    tags: str = ""
    summary: str = ""
    body: str = ""


@dataclass(frozen=True, eq=False)
class FieldIndex:
    """BM25F over a fixed candidate set, built once per set, in any language (`talent_terms`).

    `postings[term]` holds the candidates containing `term` and each one's whole contribution,
    idf x saturated weighted frequency: it does not depend on the task, so scoring a task is one
    sum per term. `most(terms)` bounds any candidate's score: the scale that makes a score
    comparable across tasks and catalogues.
    """

    postings: dict[str, tuple[np.ndarray, np.ndarray]]
    idf: dict[str, float]
    size: int

    @classmethod
    def of(cls, talents: Sequence[TalentFields]) -> FieldIndex:
        """Index the candidates' fields (row i = candidate i)."""
        counted = {
            name: [Counter(talent_terms.analyze(getattr(t, name))) for t in talents]
            for name in FIELD_WEIGHTS
        }
        weighted: dict[str, dict[int, float]] = {}
        for name, weight in FIELD_WEIGHTS.items():
            lengths = np.array([sum(c.values()) for c in counted[name]], dtype=np.float64)
            mean = float(lengths.mean()) if len(lengths) and lengths.mean() > 0 else 1.0
            norms = 1 - B + B * lengths / mean
            for i, counts in enumerate(counted[name]):
                for term, tf in counts.items():
                    row = weighted.setdefault(term, {})
                    row[i] = row.get(i, 0.0) + weight * tf / norms[i]
        n = len(talents)
        postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        idf: dict[str, float] = {}
        for term, rows in weighted.items():
            idf[term] = math.log(1 + (n - len(rows) + 0.5) / (len(rows) + 0.5))
            tfs = np.fromiter(rows.values(), dtype=np.float64, count=len(rows))
            postings[term] = (
                np.fromiter(rows.keys(), dtype=np.intp, count=len(rows)),
                idf[term] * tfs * (K1 + 1) / (tfs + K1),
            )
        return cls(postings, idf, n)

    def __len__(self) -> int:
        return self.size

    def scores(self, terms: Iterable[str]) -> np.ndarray:
        """Every candidate's BM25F for these distinct terms."""
        result = np.zeros(self.size)
        for term in terms:
            posting = self.postings.get(term)
            if posting is not None:
                result[posting[0]] += posting[1]
        return result

    def most(self, terms: Iterable[str]) -> float:
        """The most a candidate could score for these distinct terms: each saturated in every
        field (0 when no candidate holds any)."""
        return (K1 + 1) * sum(self.idf.get(term, 0.0) for term in terms)
