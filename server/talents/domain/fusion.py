"""Fused talent relevance: three signals, a gate calibrated per catalogue, a cut by evidence.

Pure maths, no I/O. A task is compared with every candidate three ways: the cosine with the
candidate's short text (name, summary, tags, triggers: what it is *for*), the cosine with its
full text (with the body and the tool's parameters: what it *takes*), and BM25F over its fields
in any language (`talent_lexical.FieldIndex`, `talent_terms`). Each signal is z-scored over the
candidates for this task and the three are summed: a signal that separates the candidates well
for this task (a rare word that one tool names, a Chinese bigram where the English model's
cosines are noise) counts for more than one that does not, with no weight to tune per
catalogue. On the validation halves of our labelled sets it beats stemmed BM25, either cosine
and a sum on a fixed scale at every depth (benchmarks/talents.md).

The out-of-domain gate is calibrated per candidate set: satchel ships 180 requests that need no
talent (chit-chat, general knowledge, creative writing, in six languages, `unrelated_tasks.json`);
a task passes when its best similarity to a candidate reaches what the most talent-like quarter
of those reach on this catalogue (their 75th percentile) and, for an English task, when it is
closer to that candidate than to the nearest of those requests (a task in another language must
instead share a word with some candidate, and match the candidates' words better than those
requests in its script do by accident). A fixed floor cannot do this: the best of hundreds of
cosines is high for any task on a broad catalogue, and the right floor differs by catalogue and
model. Why it abstained is reported with the figures.

How many talents to serve follows the evidence: those within `margin` (z units) of the best, so a
clear winner stands alone and a task that several talents fit gets several; `max_served` and the
budget only bound it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from satchel.server.talents.domain.lexical import FieldIndex
from satchel.server.talents.domain.terms import CJK_CHARACTER, is_english, script_of, task_terms

LEXICAL_WEIGHT = 1.0
"""The weight of BM25F's z-score beside the two cosines' (1.0 measured best on the DEV sets)."""

GATE_QUANTILE = 0.75
"""The gate sits at this quantile of the best similarities the shipped unrelated tasks reach on
the catalogue (SATCHEL_TALENT_GATE_QUANTILE): higher lets fewer unrelated tasks through and gates
more real ones (the trade-off curve is in benchmarks/talents.md). Not 1.0: on a broad catalogue
some of the shipped requests do match a tool ("the history of chess" and a chess tool)."""

CONTRAST = -0.05
"""An English task must also be closer to its best talent than to the nearest shipped unrelated
request, give or take this much: "Why do cats purr?" is nearer "Why is the sky blue?" than any
tool, though a broad catalogue's best tool may pass the level. Only English tasks: the bundled
MiniLM reads other languages too poorly (for every language it gated 44 % of our French real
tasks); a task in another language must share a word with some talent instead (not with a
multilingual model). Measured in
benchmarks/talents.md."""

WORD_GATE_SCRIPTS = ("cjk", "latin")
"""The scripts (`terms.script_of`) by which tasks in another language than English are judged
on their words."""

WORD_GATE_QUANTILE = 0.25
"""A task in another language than English, which an English model reads poorly, must match
some talent's words (its best BM25F) better than this quantile of the accidental matches: the
best BM25F of the shipped unrelated requests of its script that share a word with the
catalogue. MiniLM gives every Chinese text a cosine of 0.6-0.7 with every Chinese tool, so
Chinese chit-chat passed the level, sharing one common bigram with some tool ("天的"). Higher
quantiles stop more unrelated tasks and gate more French ones (benchmarks/talents.md)."""

SIMILARITY_GATE_MIN = 0.15
"""The gate never sits below this, whatever the calibration says."""

MAX_SUB_INTENTS = 4
"""A task is split into at most this many sub-intents."""

SUB_INTENT_DEPTH = 0.875
"""A sub-intent's best is lifted to this fraction of the margin below the whole task's best:
inside the cut, behind the whole task's strong matches (measured in benchmarks/talents.md)."""

SUB_INTENT_STEP = 1e-3
"""...and each next part's a little lower (keeps their order)."""

SUB_INTENT_MIN_WORDS = 3
"""A part of a task shorter than this is not an intent of its own ("and then", "thanks")."""

_SUB_INTENT_BREAK = re.compile(
    r"[.!?;]+(?=\s|$)|[\u3002\uff01\uff1f\uff1b]+|\s+(?:and then|and|then)\s+", re.IGNORECASE
)

Z_FLOOR = 1e-6
"""A signal whose spread over the candidates is below this (one candidate, or identical ones)
contributes nothing to the fused score."""


@dataclass(frozen=True)
class Gate:
    """The out-of-domain gate of one candidate set: a task passes when its best similarity
    reaches `similarity` and, for an English task, exceeds its similarity to the nearest shipped
    unrelated request by more than `contrast`, for a task in another language, when some
    candidate shares a word with it (`shared_word`: false for a multilingual model, whose
    similarities cross languages; `contrast` None: the level alone), and its best BM25F exceeds
    `word_levels[script]` (WORD_GATE_QUANTILE, per script). `calibration_tasks`: how
    many unrelated tasks set it (0: not calibrated, SIMILARITY_GATE_MIN alone)."""

    similarity: float
    calibration_tasks: int = 0
    contrast: float | None = None
    shared_word: bool = True
    word_levels: tuple[tuple[str, float], ...] = ()

    def word_level(self, script: str) -> float | None:
        return dict(self.word_levels).get(script)


@dataclass(frozen=True)
class GateReport:
    """What the gate saw of one task: its thresholds, the task's best similarity to a
    candidate and, when the second test applied, its similarity to the nearest shipped
    unrelated request (English) or its best word match and best BM25F (other languages)."""

    gate: Gate
    best_similarity: float
    unrelated_similarity: float | None = None
    best_word_match: float | None = None
    best_word_score: float | None = None
    word_score_level: float | None = None

    @property
    def below_level(self) -> bool:
        return self.best_similarity < self.gate.similarity

    @property
    def nearer_unrelated(self) -> bool:
        if self.gate.contrast is None or self.unrelated_similarity is None:
            return False
        return self.best_similarity - self.unrelated_similarity <= self.gate.contrast

    @property
    def no_shared_word(self) -> bool:
        return self.best_word_match is not None and self.best_word_match <= 0

    @property
    def few_words(self) -> bool:
        if self.best_word_score is None or self.word_score_level is None:
            return False
        return self.best_word_score <= self.word_score_level

    @property
    def admitted(self) -> bool:
        return not (
            self.below_level or self.nearer_unrelated or self.no_shared_word or self.few_words
        )

    def note(self) -> str:
        """Why the gate abstained, for people."""
        if self.below_level:
            calibrated = (
                f", the level of the {self.gate.calibration_tasks} shipped unrelated tasks"
                if self.gate.calibration_tasks
                else ""
            )
            return (
                f"best similarity {self.best_similarity:.2f} below this catalogue's gate"
                f" {self.gate.similarity:.2f}{calibrated}"
            )
        if self.no_shared_word:
            return (
                f"best similarity {self.best_similarity:.2f}, but no talent shares a word with"
                " the task"
            )
        if self.few_words:
            return (
                f"best similarity {self.best_similarity:.2f}, but its best word match"
                f" {self.best_word_score:.1f} does not exceed {self.word_score_level:.1f},"
                " what the shipped unrelated requests in its script reach by accident here"
            )
        return (
            f"best similarity {self.best_similarity:.2f}, but {self.unrelated_similarity:.2f}"
            " to a request that needs no talent"
        )


@dataclass(frozen=True)
class Evidence:
    """One task against every candidate (all shape (n,)): the cosines with the short and full
    texts, BM25F, and BM25F over the most any candidate could score for the task's words
    (`word_match`, in [0, 1])."""

    short: np.ndarray
    full: np.ndarray
    bm25f: np.ndarray
    word_match: np.ndarray

    @property
    def similarity(self) -> np.ndarray:
        """The better of the two cosines, per candidate."""
        best: np.ndarray = np.maximum(self.short, self.full)
        return best

    @property
    def fused(self) -> np.ndarray:
        """z(short) + z(full) + LEXICAL_WEIGHT x z(BM25F), z over the candidates."""
        fused: np.ndarray = _z(self.short) + _z(self.full) + LEXICAL_WEIGHT * _z(self.bm25f)
        return fused

    @property
    def best_similarity(self) -> float:
        return float(self.similarity.max()) if len(self.short) else -1.0


def _z(values: np.ndarray) -> np.ndarray:
    spread = float(values.std()) if len(values) else 0.0
    if spread < Z_FLOOR:
        return np.zeros(len(values))
    z: np.ndarray = (values - values.mean()) / spread
    return z


def sub_intents(task: str) -> list[str]:
    """The parts of a task that asks for several things ("Find a flight to Oslo and book a
    hotel near the station"): split at sentence ends and at "and" / "then", kept when at least
    SUB_INTENT_MIN_WORDS words long; [] when the task has fewer than two such parts."""
    parts = [part.strip(" ,\uff0c") for part in _SUB_INTENT_BREAK.split(task)]
    kept = [part for part in parts if _words(part) >= SUB_INTENT_MIN_WORDS]
    return kept[:MAX_SUB_INTENTS] if len(kept) >= 2 else []


def _words(text: str) -> int:
    """Words of a text, counting two CJK characters as one (CJK writes no spaces)."""
    cjk = len(CJK_CHARACTER.findall(text))
    return len(CJK_CHARACTER.sub(" ", text).split()) + cjk // 2


def merged_scores(whole: np.ndarray, parts: Sequence[np.ndarray], margin: float) -> np.ndarray:
    """The whole task's fused scores, with the best candidate of each sub-intent (by its own
    scores, when it has any) lifted into the cut: to SUB_INTENT_DEPTH x `margin` below the whole
    task's best, in the parts' order. A task that asks for a flight and a hotel gets both tools,
    and the whole task's strong matches keep their ranks. Without parts, the whole task's
    scores."""
    if not parts or len(whole) == 0:
        return whole
    merged = whole.copy()
    floor = float(whole.max()) - SUB_INTENT_DEPTH * margin
    for rank, scores in enumerate(parts, start=1):
        if not scores.any():
            continue
        best = int(np.argmax(scores))
        merged[best] = max(merged[best], floor - SUB_INTENT_STEP * rank)
    return merged


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    rows = np.asarray(matrix, dtype=np.float32)
    if rows.ndim != 2:
        raise ValueError(f"vectors must be 2-D, got shape {rows.shape}")
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit: np.ndarray = rows / np.maximum(norms, 1e-9)
    return unit


@dataclass(frozen=True, eq=False)
class FusedSpace:
    """The candidates' side of fused relevance, built once per candidate set: unit vectors of
    their short and full texts, their BM25F index and their calibrated gate. The gate reads the
    unrelated tasks' vectors, not their words: shared words leak (a haiku about snow and a
    Snowflake rule), measured in benchmarks/talents.md."""

    short: np.ndarray
    full: np.ndarray
    lexical: FieldIndex
    gate: Gate
    unrelated: np.ndarray | None = None

    @classmethod
    def of(
        cls,
        short_vectors: np.ndarray,
        full_vectors: np.ndarray,
        lexical: FieldIndex,
        unrelated: np.ndarray | None = None,
        quantile: float = GATE_QUANTILE,
        multilingual: bool = False,
        unrelated_texts: Sequence[str] = (),
        word_quantile: float = WORD_GATE_QUANTILE,
    ) -> FusedSpace:
        """The space of these candidates (row i = candidate i), its gate calibrated on the
        vectors of the `unrelated` tasks (query prefix included), shape (m, d), at `quantile`,
        and on their `unrelated_texts` when given (each script's accidental word matches, at
        `word_quantile`); `multilingual`: the model's similarities cross languages (no word
        test)."""
        short, full = _unit_rows(short_vectors), _unit_rows(full_vectors)
        if not len(short) == len(full) == len(lexical):
            raise ValueError(f"{len(short)}, {len(full)} vectors for {len(lexical)} candidates")
        if not len(short) or unrelated is None or not len(unrelated):
            return cls(short, full, lexical, Gate(SIMILARITY_GATE_MIN))
        vectors = _unit_rows(unrelated)
        best = np.maximum(vectors @ short.T, vectors @ full.T).max(axis=1)
        gate = replace(calibrate(best.tolist(), quantile), shared_word=not multilingual)
        if not multilingual and unrelated_texts:
            levels = word_levels(lexical, unrelated_texts, word_quantile)
            gate = replace(gate, word_levels=levels)
        return cls(short, full, lexical, gate, vectors)

    def __len__(self) -> int:
        return len(self.short)

    def judge(
        self, evidence: Evidence, task_vector: np.ndarray, english: bool, script: str = "latin"
    ) -> GateReport:
        """The gate's verdict on a task (its evidence and vector). Beyond the level, an
        `english` task is compared with the unrelated requests; a task in another language,
        which an English model reads too poorly for that, must share a word with some
        candidate and match the candidates' words better than the unrelated requests of its
        `script` (`terms.script_of`) do by accident (not with a multilingual model). Neither
        applies when the gate has no contrast (a request's floor)."""
        if self.gate.contrast is None:
            return GateReport(self.gate, evidence.best_similarity)
        if not english:
            if not self.gate.shared_word:
                return GateReport(self.gate, evidence.best_similarity)
            words = float(evidence.word_match.max()) if len(evidence.word_match) else 0.0
            score = float(evidence.bm25f.max()) if len(evidence.bm25f) else 0.0
            return GateReport(
                self.gate,
                evidence.best_similarity,
                best_word_match=words,
                best_word_score=score,
                word_score_level=self.gate.word_level(script),
            )
        nearest = None
        if self.unrelated is not None:
            task = np.asarray(task_vector, dtype=np.float32).reshape(-1)
            task = task / max(float(np.linalg.norm(task)), 1e-9)
            nearest = float((self.unrelated @ task).max())
        return GateReport(self.gate, evidence.best_similarity, nearest)

    def word_scores(self, terms: Sequence[str]) -> np.ndarray:
        """z(BM25F) over the candidates for these terms: how a sub-intent ranks them (by its
        words alone: embedding each part would multiply a call's cost)."""
        return _z(self.lexical.scores(terms))

    def part_scores(self, vectors: np.ndarray, terms: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Each sub-intent's fused scores over the candidates, as `evidence(...).fused` gives a
        whole task's (row i of `vectors` and `terms[i]`: part i); each matrix is read once for
        all parts (10,000 talents are 15 MB a matrix)."""
        if len(self.short) == 0 or not len(vectors):
            return [np.zeros(len(self.short)) for _ in terms]
        parts = _unit_rows(vectors)
        short, full = (self.short @ parts.T).T, (self.full @ parts.T).T
        return [
            _z(short[i].astype(np.float64))
            + _z(full[i].astype(np.float64))
            + LEXICAL_WEIGHT * _z(self.lexical.scores(words))
            for i, words in enumerate(terms)
        ]

    def evidence(self, task_vector: np.ndarray, terms: Sequence[str]) -> Evidence:
        """The task against every candidate (`terms`: `talent_terms.task_terms(task)`)."""
        task = np.asarray(task_vector, dtype=np.float32).reshape(-1)
        if len(self.short) == 0:
            empty = np.zeros(0)
            return Evidence(empty, empty, empty, empty)
        if task.shape[0] != self.short.shape[1]:
            raise ValueError(
                f"task vector has {task.shape[0]} dims, talents have {self.short.shape[1]}"
            )
        task = task / max(float(np.linalg.norm(task)), 1e-9)
        bm25f = self.lexical.scores(terms)
        scale = self.lexical.most(terms)
        return Evidence(
            (self.short @ task).astype(np.float64),
            (self.full @ task).astype(np.float64),
            bm25f,
            bm25f / scale if scale > 0 else bm25f,
        )


def word_levels(
    lexical: FieldIndex, unrelated_texts: Sequence[str], quantile: float = WORD_GATE_QUANTILE
) -> tuple[tuple[str, float], ...]:
    """Per script (WORD_GATE_SCRIPTS), the `quantile` of the best BM25F of the unrelated
    requests in other languages than English that share a word with these candidates (none:
    no level for that script)."""
    best: dict[str, list[float]] = {script: [] for script in WORD_GATE_SCRIPTS}
    for text in unrelated_texts:
        if is_english(text):
            continue
        scores = lexical.scores(task_terms(text))
        if len(scores) and scores.max() > 0:
            best[script_of(text)].append(float(scores.max()))
    return tuple(
        (script, float(np.quantile(values, quantile))) for script, values in best.items() if values
    )


def calibrate(best_similarities: Sequence[float], quantile: float = GATE_QUANTILE) -> Gate:
    """The gate that the unrelated tasks' best similarities on a catalogue call for."""
    if not 0 <= quantile <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    level = float(np.quantile(best_similarities, quantile))
    return Gate(
        max(level, SIMILARITY_GATE_MIN), calibration_tasks=len(best_similarities), contrast=CONTRAST
    )
