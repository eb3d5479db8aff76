"""Talent selection by relevance: centred embeddings, stem boost, out-of-domain gate, cut, budget.

Pure maths, no I/O. The caller embeds texts (`embedder.passage_prefix + talent.text` for talents,
`embedder.query_prefix + task` for the task), passes the vectors in, and closes the kept set over
hard edges afterwards (`talent_graph.requires_closure`).

Decisions on points the spec leaves open:

- Ties in score are broken by talent id, so every ordering is deterministic.
- A centred vector of (near) zero norm has no direction: it gets similarity 0.0. With a single
  candidate, centring leaves nothing, so that talent is scored on stem hits alone and passes the
  gate only with a stem hit. The same holds for all candidates when the task vector equals the
  candidates' mean.
- Budget: candidates are taken greedily in score order; one that does not fit is excluded
  `over_budget` and packing continues, so a later, smaller talent may still fit.
- A candidate that fails the margin is `below_margin`; `non_positive` is for one within the margin
  whose score is still <= 0.
- The top-3 fallback applies once the gate is open and nothing survived the cut (margin, positivity
  or budget); it ignores the budget.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

NOTE_OUT_OF_DOMAIN = "no specific talent for this task"
NOTE_FALLBACK = "no talent passed the cut; kept the top 3 by score"
NOTE_NO_CANDIDATES = "no candidate talents"
FALLBACK_COUNT = 3
STEM_LENGTH = 5
MIN_WORD_LETTERS = 4

_LETTERS = re.compile(r"[^\W\d_]+")
_ZERO_NORM = 1e-9


class Reason(StrEnum):
    """Why a talent is served or not; values are the wire strings of `satchel.v1`."""

    PINNED = "pinned"
    RELEVANCE = "relevance"
    FALLBACK_TOP3 = "fallback_top3"
    RELEVANCE_OFF = "relevance_off"
    REQUIRES_CLOSURE = "requires_closure"
    OUT_OF_DOMAIN = "out_of_domain"
    BELOW_MARGIN = "below_margin"
    NON_POSITIVE = "non_positive"
    OVER_BUDGET = "over_budget"
    NOT_ACTIVE = "not_active"


def estimate_tokens(text: str) -> int:
    """Token estimate shared with memory packing: a quarter of the characters, at least 1."""
    return max(1, len(text) // 4)


def stems(text_or_words: str | Iterable[str]) -> set[str]:
    """Stems of the words of at least 4 letters: accents stripped, lower-cased, 5-char prefix.

    Words are runs of letters, so "use-case" yields "case" only and digits split words.
    """
    texts = [text_or_words] if isinstance(text_or_words, str) else list(text_or_words)
    result: set[str] = set()
    for text in texts:
        decomposed = unicodedata.normalize("NFKD", text)
        plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).lower()
        result.update(
            word[:STEM_LENGTH] for word in _LETTERS.findall(plain) if len(word) >= MIN_WORD_LETTERS
        )
    return result


def talent_text(name: str, summary: str, tags: Iterable[str], triggers: Iterable[str]) -> str:
    """The embedded text of a talent: name, summary, tags, triggers, one non-empty line each."""
    parts = [name, summary, ", ".join(tags), ", ".join(triggers)]
    return "\n".join(part for part in (p.strip() for p in parts) if part)


@dataclass(frozen=True)
class ScorableTalent:
    """A candidate as selection sees it. `tokens` is the cost of serving `body`."""

    id: str
    name: str
    text: str
    stems: frozenset[str]
    tokens: int
    body: str = ""
    # Served whatever the task (never scored): see `satchel.server.talents.resolve_selection`.
    pinned: bool = False

    @classmethod
    def build(
        cls,
        id: str,
        name: str,
        summary: str = "",
        body: str = "",
        tags: Sequence[str] = (),
        triggers: Sequence[str] = (),
        task_types: Sequence[str] = (),
        pinned: bool = False,
    ) -> ScorableTalent:
        """Derive text, stems (tags + triggers + task_types) and tokens (of the body)."""
        return cls(
            id=id,
            name=name,
            text=talent_text(name, summary, tags, triggers),
            stems=frozenset(stems([*tags, *triggers, *task_types])),
            tokens=estimate_tokens(body),
            body=body,
            pinned=pinned,
        )


@dataclass(frozen=True)
class SelectionParams:
    """Tunables of the relevance cut; defaults from the spec."""

    floor: float = 0.18
    beta: float = 0.12
    margin: float = 0.15
    budget_tokens: int = 2000

    def __post_init__(self) -> None:
        if self.budget_tokens < 1:
            raise ValueError(f"budget_tokens must be a positive integer, got {self.budget_tokens}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")


@dataclass(frozen=True)
class ScoredTalent:
    """One candidate's decision: `similarity` is the centred cosine, `score` adds the boost."""

    id: str
    score: float
    similarity: float
    stem_hits: int
    reason: Reason
    tokens: int


@dataclass(frozen=True)
class SelectionResult:
    """Kept talents in serving order, excluded ones by descending score, and why."""

    kept: tuple[ScoredTalent, ...]
    excluded: tuple[ScoredTalent, ...]
    out_of_domain: bool = False
    note: str = ""

    @property
    def kept_ids(self) -> list[str]:
        return [talent.id for talent in self.kept]


@dataclass(frozen=True, eq=False)
class CentredSpace:
    """The candidates' side of centring, computed once per candidate set: their mean `mu` and
    their centred, normalised vectors. Reusing it across tasks gives the same similarities as
    `centred_similarities` without recentring the candidates on every call."""

    mu: np.ndarray
    centred: np.ndarray

    @classmethod
    def of(cls, talent_vectors: np.ndarray) -> CentredSpace:
        """Centre talent vectors of shape (n, d)."""
        vectors = np.asarray(talent_vectors, dtype=np.float64)
        if vectors.ndim != 2:
            raise ValueError(f"talent_vectors must be 2-D, got shape {vectors.shape}")
        if len(vectors) == 0:
            return cls(np.zeros(vectors.shape[1]), vectors)
        mu = vectors.mean(axis=0)
        return cls(mu, _normalize_rows(vectors - mu))

    def __len__(self) -> int:
        return len(self.centred)

    def similarities(self, task_vector: np.ndarray) -> np.ndarray:
        """cos(normalize(task - mu), centred_i) for every candidate; (n,) float64."""
        task = np.asarray(task_vector, dtype=np.float64).reshape(-1)
        if len(self.centred) == 0:
            return np.zeros(0)
        if task.shape[0] != self.centred.shape[1]:
            dims = self.centred.shape[1]
            raise ValueError(f"task vector has {task.shape[0]} dims, talents have {dims}")
        centred_task = _normalize_rows((task - self.mu)[np.newaxis, :])[0]
        return np.clip(self.centred @ centred_task, -1.0, 1.0)


def centred_similarities(talent_vectors: np.ndarray, task_vector: np.ndarray) -> np.ndarray:
    """cos(normalize(task - mu), normalize(v_i - mu)) with mu the mean of the talent vectors.

    Zero-norm centred vectors give 0.0. Shapes: (n, d) and (d,); returns (n,) float64.
    """
    return CentredSpace.of(talent_vectors).similarities(task_vector)


def _normalize_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    # Rows that are zero up to rounding (e.g. one candidate minus its own mean) stay zero.
    safe = np.where(norms > _ZERO_NORM, norms, 1.0)
    return np.where(norms > _ZERO_NORM, matrix / safe, 0.0)


def _score(
    candidates: Sequence[ScorableTalent],
    talent_vectors: np.ndarray | CentredSpace | None,
    task_vector: np.ndarray | None,
    task_stems: Set[str],
    beta: float,
) -> list[tuple[ScorableTalent, float, float, int]]:
    """(talent, score, similarity, hits) per candidate, sorted by score desc then id."""
    if talent_vectors is None or task_vector is None:
        similarity = np.zeros(len(candidates))
    else:
        if len(talent_vectors) != len(candidates):
            raise ValueError(f"{len(talent_vectors)} vectors for {len(candidates)} candidates")
        space = (
            talent_vectors
            if isinstance(talent_vectors, CentredSpace)
            else CentredSpace.of(talent_vectors)
        )
        similarity = space.similarities(task_vector)
    rows = []
    for talent, sim in zip(candidates, similarity.tolist(), strict=True):
        hits = len(talent.stems & task_stems)
        rows.append((talent, sim + beta * hits, sim, hits))
    rows.sort(key=lambda row: (-row[1], row[0].id))
    return rows


def _decision(row: tuple[ScorableTalent, float, float, int], reason: Reason) -> ScoredTalent:
    talent, score, similarity, hits = row
    return ScoredTalent(talent.id, score, similarity, hits, reason, talent.tokens)


def select(
    candidates: Sequence[ScorableTalent],
    talent_vectors: np.ndarray | CentredSpace,
    task_vector: np.ndarray,
    task_stems: Set[str],
    params: SelectionParams | None = None,
) -> SelectionResult:
    """Relevance on: gate, margin cut and budget over the candidates (row i of vectors = i).

    `talent_vectors` may be a precomputed `CentredSpace` of the same candidates.
    """
    params = params or SelectionParams()
    if not candidates:
        return SelectionResult(kept=(), excluded=(), note=NOTE_NO_CANDIDATES)
    rows = _score(candidates, talent_vectors, task_vector, task_stems, params.beta)

    if max(row[2] for row in rows) < params.floor and sum(row[3] for row in rows) == 0:
        excluded = tuple(_decision(row, Reason.OUT_OF_DOMAIN) for row in rows)
        return SelectionResult((), excluded, out_of_domain=True, note=NOTE_OUT_OF_DOMAIN)

    threshold = rows[0][1] - params.margin
    kept: list[ScoredTalent] = []
    excluded: list[ScoredTalent] = []
    used = 0
    for row in rows:
        talent, score = row[0], row[1]
        if score < threshold:
            excluded.append(_decision(row, Reason.BELOW_MARGIN))
        elif score <= 0:
            excluded.append(_decision(row, Reason.NON_POSITIVE))
        elif used + talent.tokens > params.budget_tokens:
            excluded.append(_decision(row, Reason.OVER_BUDGET))
        else:
            used += talent.tokens
            kept.append(_decision(row, Reason.RELEVANCE))

    if not kept:
        # Nothing kept means `excluded` lists every row, in the same score order.
        top = tuple(_decision(row, Reason.FALLBACK_TOP3) for row in rows[:FALLBACK_COUNT])
        return SelectionResult(top, tuple(excluded[FALLBACK_COUNT:]), note=NOTE_FALLBACK)
    return SelectionResult(tuple(kept), tuple(excluded))


def order_without_relevance(
    candidates: Sequence[ScorableTalent],
    task_stems: Set[str] = frozenset(),
    talent_vectors: np.ndarray | CentredSpace | None = None,
    task_vector: np.ndarray | None = None,
    beta: float = SelectionParams.beta,
) -> SelectionResult:
    """Relevance off: keep every candidate (`relevance_off`); the task only orders them.

    Order is by the same score as `select` (centred similarity + beta * stem hits) when both
    vectors are given, else by beta * stem hits alone (similarity 0.0); ties by id. No gate,
    no margin, no budget.
    """
    rows = _score(candidates, talent_vectors, task_vector, task_stems, beta)
    kept = tuple(_decision(row, Reason.RELEVANCE_OFF) for row in rows)
    return SelectionResult(kept=kept, excluded=(), note="" if kept else NOTE_NO_CANDIDATES)
