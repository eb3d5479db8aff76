"""The hybrid score of a context candidate, defined once: its parts, weights, recency form and
tie-breaks. Pure: no I/O.

    score = w_similarity * similarity + w_text_rank * text_rank + w_recency * recency

- **similarity**: the cosine of the query's and the candidate's vectors, pgvector's
  `1 - (a <=> b)`, in [-1, 1].
- **text_rank**, hybrid ranking: Okapi BM25 (k1 `BM25_K1`, b `BM25_B`) of the searched lexemes with
  the scope's IDF and average length, divided by the best BM25 among the visible candidates of
  the same kind (facts, or events; at least `TEXT_FULL_FLOOR`), at most 1: the best match ranks
  1, a candidate without a match 0. Seed ranking: `ts_rank_cd` over the `simple` configuration
  divided by what a text holding each searched word once gets, at most 1 (`text_query.py`).
- **recency**: `exp(-age / tau)`, the age counted from when a fact became valid (an event: when
  it occurred), an age in the future counting as 0, the exponent floored at
  `RECENCY_EXPONENT_FLOOR` (PostgreSQL raises on underflow).
- **weights** (`Weights`): SATCHEL_WEIGHT_SIMILARITY / _TEXT_RANK / _RECENCY and
  SATCHEL_RECENCY_TAU_DAYS; configuration, not contract.
- **ties**: the higher score first, then the smaller id (`best`; `ORDER BY score DESC, id`).
- **episodes**, hybrid ranking: their own score as above, lifted to
  `context_weight * best neighbour's own score + (1 - context_weight) * own` when that is higher.

Both engines derive from this module: the SQL statements (`context/storage/`) render their
score, recency and BM25 expressions with the `sql_*` functions below, and the in-memory rankings
(`fact_ranking.py`, `episode_ranking.py`) compute them with the NumPy functions; the cache
congruence suite (tests/context/test_cache_congruence.py), tests/context/test_scope_cache.py
and tests/context/test_score_sql.py check that both compute the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np

BM25_K1 = 1.2
BM25_B = 0.75
TEXT_FULL_FLOOR = 1e-12  # the least a text rank is divided by (no match: every rank 0)
RECENCY_EXPONENT_FLOOR = -700.0  # exp(-700) ~ 1e-304: below, PostgreSQL raises on underflow

Part = TypeVar("Part", float, np.ndarray)


@dataclass(frozen=True)
class Weights:
    """The weights of the score's parts and the recency time constant (seconds)."""

    similarity: float = 0.6
    text_rank: float = 0.25
    recency: float = 0.15
    tau_seconds: float = 30 * 86400.0

    def __post_init__(self) -> None:
        if self.tau_seconds <= 0:
            raise ValueError("tau_seconds must be positive")

    def combine(self, similarity: Part, text_rank: Part, recency: Part) -> Part:
        """The score of these parts (numbers or arrays)."""
        return self.similarity * similarity + self.text_rank * text_rank + self.recency * recency

    def recency_of(self, age_seconds: float) -> float:
        """The recency of a candidate `age_seconds` old (a future one counts as 0 seconds)."""
        return math.exp(max(-max(age_seconds, 0.0) / self.tau_seconds, RECENCY_EXPONENT_FLOOR))

    def sql_params(self) -> dict[str, float]:
        """The statements' parameters of these weights (see `sql_score`, `sql_recency`)."""
        return {
            "w_similarity": self.similarity,
            "w_text_rank": self.text_rank,
            "w_recency": self.recency,
            "tau_seconds": self.tau_seconds,
        }


# --- the score in SQL (the statements' expressions, rendered from the definitions above) -----


def sql_score(similarity: str, text_rank: str | None, recency: str) -> str:
    """The weighted sum of three SQL expressions (`text_rank` None: a score without it, the
    seed's episodes and phase 1's partial scores)."""
    text = "" if text_rank is None else f" + %(w_text_rank)s * {text_rank}"
    return f"%(w_similarity)s * {similarity}{text} + %(w_recency)s * {recency}"


def sql_recency(since_epoch: str) -> str:
    """The recency at `%(at_epoch)s` of a candidate valid (or occurred) since `since_epoch`
    (seconds since the epoch)."""
    return (
        f"exp(greatest(least({since_epoch} - %(at_epoch)s, 0.0) / %(tau_seconds)s, "
        f"{RECENCY_EXPONENT_FLOOR}))"
    )


def sql_bm25_norm(document: str) -> str:
    """BM25's length normalisation of a document `document` (K = k1 x ((1 - b) + b x len / avg))."""
    return f"{BM25_K1} * ({1 - BM25_B} + {BM25_B} * {document}.lexeme_tokens / %(avg_tokens)s)"


SQL_BM25_TF_SCALE = BM25_K1 + 1  # BM25's numerator: tf x (k1 + 1)
SQL_TEXT_FULL = f"greatest(coalesce(max(raw), 0.0), {TEXT_FULL_FLOOR})"


# --- the score in memory ------------------------------------------------------------------


class Postings(NamedTuple):
    """Each lexeme's documents (positions) and frequencies there, packed: one array of each for
    all lexemes, sliced by `offsets` (two small NumPy arrays per lexeme cost ~200 bytes beyond
    the postings, and a scope holds thousands of lexemes). Its members are left out of garbage
    collections, as a copy's rows are (`ScopeFacts`)."""

    slots: dict[str, int]  # lexeme -> its slot in `offsets`
    offsets: np.ndarray  # int64 (lexemes + 1): slot i's postings are [offsets[i], offsets[i+1])
    positions: np.ndarray  # int32
    frequencies: np.ndarray  # int32

    def get(self, lexeme: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The documents holding `lexeme` (ascending positions) and its frequency in each."""
        slot = self.slots.get(lexeme)
        if slot is None:
            return None
        start, end = self.offsets[slot], self.offsets[slot + 1]
        return self.positions[start:end], self.frequencies[start:end].astype(np.float64)

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def nbytes(self) -> int:
        """Roughly what they hold in memory (a dictionary entry and key per lexeme)."""
        arrays = self.offsets.nbytes + self.positions.nbytes + self.frequencies.nbytes
        return arrays + sum(100 + len(lexeme) for lexeme in self.slots)


def postings_of(documents: Sequence[tuple[Sequence[str], Sequence[int]]]) -> Postings:
    """Each lexeme's positions and frequencies among documents given as (lexemes, frequencies)."""
    grouped: dict[str, tuple[list[int], list[int]]] = {}
    for position, (lexemes, frequencies) in enumerate(documents):
        for lexeme, frequency in zip(lexemes, frequencies, strict=True):
            at, tf = grouped.setdefault(lexeme, ([], []))
            at.append(position)
            tf.append(frequency)
    lengths = [len(at) for at, _ in grouped.values()]
    return Postings(
        slots={lexeme: slot for slot, lexeme in enumerate(grouped)},
        offsets=np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))),
        positions=np.fromiter(
            (p for at, _ in grouped.values() for p in at), dtype=np.int32, count=sum(lengths)
        ),
        frequencies=np.fromiter(
            (f for _, tf in grouped.values() for f in tf), dtype=np.int32, count=sum(lengths)
        ),
    )


def cosine_similarity(vectors: np.ndarray, norms: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Each row's cosine with `vector` (float32 products, like pgvector's; float16 rows are
    widened first); none for no rows (an empty scope's matrix has no columns either)."""
    if len(vectors) == 0:
        return np.zeros(0)
    query = np.asarray(vector, dtype=np.float32)
    cosine = (vectors.astype(np.float32, copy=False) @ query) / (
        norms * float(np.linalg.norm(query))
    )
    return 1.0 - (1.0 - np.clip(cosine, -1.0, 1.0))  # the statements' 1 - distance


def bm25(
    postings: Postings,
    lengths: np.ndarray,
    terms: Sequence[str],
    idfs: Sequence[float],
    avg_tokens: float,
) -> np.ndarray:
    """Each document's raw BM25 for the searched lexemes; NaN where it holds none of them."""
    raw = np.full(len(lengths), np.nan)
    norm = BM25_K1 * ((1 - BM25_B) + BM25_B * lengths / avg_tokens)
    for term, idf in zip(terms, idfs, strict=True):
        posting = postings.get(term)
        if posting is None:
            continue
        at, tf = posting
        part = idf * tf * (BM25_K1 + 1) / (tf + norm[at])
        raw[at] = np.where(np.isnan(raw[at]), part, raw[at] + part)
    return raw


def text_ranks(
    raw: np.ndarray, scored: np.ndarray, full: float | None = None
) -> tuple[np.ndarray, float]:
    """The text rank of each document (0 without a match) and what the raw BM25 is divided by:
    `full` when given, else the best raw BM25 among the `scored` positions."""
    if full is None:
        matches = raw[scored]
        matches = matches[~np.isnan(matches)]
        full = max(float(matches.max()) if len(matches) else 0.0, TEXT_FULL_FLOOR)
    ranks = np.where(np.isnan(raw), 0.0, np.minimum(1.0, np.nan_to_num(raw) / full))
    return ranks, full


def decay(since_epoch: np.ndarray, at_epoch: float, tau_seconds: float) -> np.ndarray:
    """The recency of each candidate (see the module's docstring)."""
    exponent = np.minimum(since_epoch - at_epoch, 0.0) / tau_seconds
    return np.exp(np.maximum(exponent, RECENCY_EXPONENT_FLOOR))


def best(positions: np.ndarray, count: int, *keys: np.ndarray) -> np.ndarray:
    """The `count` positions lowest by `keys` (the first decides, the next break its ties)."""
    if len(positions) <= count:
        return positions
    first = keys[0][positions]
    near = positions[first <= np.partition(first, count - 1)[count - 1]]  # with the ties
    order: np.ndarray = np.lexsort(tuple(key[near] for key in reversed(keys)))
    kept: np.ndarray = near[order[:count]]
    return kept
