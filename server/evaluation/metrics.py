"""Evidence coverage, summaries and the baselines of the LoCoMo harness (pure, no I/O).

A gold evidence turn is covered by a packet when the packet holds that turn's episode or a fact
sourced from that turn. Evidence recall is the share of all gold evidence turns covered (micro
average over (question, turn) pairs); "all covered" is the share of questions whose every gold
turn is covered. Questions without any evidence turn are left out of both and counted apart.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from satchel.server.context.domain.text_query import STOP_WORDS

_WORD = re.compile(r"\w+")


def covered_turns(
    episode_event_ids: Iterable[str],
    fact_source_event_ids: Iterable[Iterable[str]],
    turn_of_event: Mapping[str, str],
) -> frozenset[str]:
    """The turns a packet covers: its episodes' turns and its facts' source turns."""
    events = set(episode_event_ids)
    for sources in fact_source_event_ids:
        events.update(sources)
    return frozenset(turn_of_event[e] for e in events if e in turn_of_event)


@dataclass(frozen=True)
class Outcome:
    """What one system gave for one question: turns covered, tokens spent, latency (ms)."""

    covered: frozenset[str]
    tokens: int
    latency_ms: float | None = None
    trace_id: str = ""


@dataclass
class Summary:
    """Coverage figures of one system over a set of questions."""

    questions: int = 0
    without_evidence: int = 0
    evidence_turns: int = 0
    covered_turns: int = 0
    all_covered: int = 0
    tokens: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def add(self, gold: Collection[str], outcome: Outcome) -> None:
        """Count one question with its gold turns and the system's outcome."""
        self.questions += 1
        self.tokens.append(outcome.tokens)
        if outcome.latency_ms is not None:
            self.latencies.append(outcome.latency_ms)
        gold = set(gold)
        if not gold:
            self.without_evidence += 1
            return
        hit = len(gold & outcome.covered)
        self.evidence_turns += len(gold)
        self.covered_turns += hit
        self.all_covered += hit == len(gold)

    @property
    def recall(self) -> float | None:
        """Share of the gold evidence turns covered."""
        return self.covered_turns / self.evidence_turns if self.evidence_turns else None

    @property
    def all_covered_share(self) -> float | None:
        """Share of the questions (with evidence) whose every gold turn is covered."""
        scored = self.questions - self.without_evidence
        return self.all_covered / scored if scored else None

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "questions": self.questions,
            "questions_without_evidence": self.without_evidence,
            "evidence_turns": self.evidence_turns,
            "covered_turns": self.covered_turns,
            "evidence_recall": _round(self.recall),
            "all_evidence_covered": _round(self.all_covered_share),
            "mean_tokens": _round(float(np.mean(self.tokens)) if self.tokens else None, 1),
            "latency_p50_ms": _round(percentile(self.latencies, 50), 1),
            "latency_p95_ms": _round(percentile(self.latencies, 95), 1),
        }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation); None for no values."""
    return float(np.percentile(values, q)) if len(values) else None


def summarise(
    rows: Iterable[tuple[int, Collection[str], Outcome]],
    categories: Mapping[int, str],
    *,
    excluded_from_overall: Collection[int] = (),
) -> dict[str, Summary]:
    """`overall`, `overall_without_<name>` for each excluded category, and one summary per
    category name, from (category, gold turns, outcome) rows."""
    overall, partial = Summary(), Summary()
    by_category = {name: Summary() for name in categories.values()}
    for category, gold, outcome in rows:
        overall.add(gold, outcome)
        if category not in excluded_from_overall:
            partial.add(gold, outcome)
        name = categories.get(category)
        if name is not None:
            by_category[name].add(gold, outcome)
    result = {"overall": overall}
    if excluded_from_overall:
        names = "_".join(categories.get(c, str(c)) for c in sorted(excluded_from_overall))
        result[f"overall_without_{names}"] = partial
    result.update(by_category)
    return result


def pack_ranked(
    ranked: Iterable[str], tokens: Mapping[str, int], budget: int
) -> tuple[list[str], int]:
    """Greedy packing by rank: take each item that still fits, skip the others.

    The same rule as satchel's packer (a candidate too large is skipped, packing goes on).
    Returns the packed items in rank order and the tokens used.
    """
    packed, used = [], 0
    for item in ranked:
        cost = tokens[item]
        if used + cost <= budget:
            packed.append(item)
            used += cost
    return packed, used


def recall_at(ranked: Sequence[str], gold: Collection[str], k: int) -> tuple[int, int]:
    """(gold items among the top k, gold items)."""
    top = set(ranked[:k])
    return sum(1 for g in set(gold) if g in top), len(set(gold))


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (`\\w+`), as a plain full-text index would see them."""
    return _WORD.findall(text.lower())


@functools.cache
def _stemmer() -> Any:
    # py-rust-stemmers ships with fastembed (a dependency of the server).
    from py_rust_stemmers import SnowballStemmer

    return SnowballStemmer("english")


def analyze(text: str) -> list[str]:
    """What the BM25 baseline indexes: lower-cased words minus stop words, Snowball-stemmed
    (English), as a tuned search engine would."""
    stemmer = _stemmer()
    return [stemmer.stem_word(w) for w in tokenize(text) if w not in STOP_WORDS]


class Bm25:
    """Okapi BM25 over a small fixed corpus (k1 = 1.2, b = 0.75, Lucene's idf)."""

    def __init__(
        self,
        documents: Sequence[str],
        k1: float = 1.2,
        b: float = 0.75,
        analyzer: Callable[[str], list[str]] = analyze,
    ) -> None:
        self._analyze = analyzer
        self._docs = [Counter(analyzer(d)) for d in documents]
        self._lengths = np.array([sum(d.values()) for d in self._docs], dtype=float)
        self._avg = float(self._lengths.mean()) if len(self._docs) else 0.0
        self._k1, self._b = k1, b
        df: Counter[str] = Counter()
        for doc in self._docs:
            df.update(doc.keys())
        n = len(self._docs)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every document for `query`."""
        result = np.zeros(len(self._docs))
        norm = self._k1 * (1 - self._b + self._b * self._lengths / (self._avg or 1.0))
        for term in set(self._analyze(query)):
            idf = self._idf.get(term)
            if idf is None:
                continue
            tf = np.array([doc.get(term, 0) for doc in self._docs], dtype=float)
            result += idf * tf * (self._k1 + 1) / (tf + norm)
        return result


def rank(scores: np.ndarray, ids: Sequence[str]) -> list[str]:
    """`ids` by descending score (ties keep corpus order)."""
    order = np.argsort(-scores, kind="stable")
    return [ids[i] for i in order]
