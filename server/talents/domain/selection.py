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

Three scorings (`SelectionParams.scoring`). `fused` (the server's default, `talent_fusion`):
z-scored cosines of the short and full texts + BM25F, sub-intents lifted, a gate calibrated per
candidate set, a margin in z units and no positivity rule (z-scores are relative). `seed`: the
spec's score, centred similarity + beta x stem hits. `hybrid` (the previous default): the plain
cosine + beta x stem hits + text_weight x the task's BM25 over the candidates' texts divided by
the best candidate's (`talent_lexical`). Seed and hybrid gate on their own similarity (the best
below `floor` and no stem hit: out of domain; the lexical rank never opens the gate). All may
cap how many talents relevance serves (`max_served`, `over_max_served`). Measurements:
benchmarks/talents.md.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from satchel.server.platform.tokens import estimate_tokens
from satchel.server.talents.domain.fusion import FusedSpace, GateReport, merged_scores, sub_intents
from satchel.server.talents.domain.lexical import LexicalIndex, TalentFields
from satchel.server.talents.domain.terms import is_english, script_of, task_terms

NOTE_OUT_OF_DOMAIN = "no specific talent for this task"
NOTE_FALLBACK = "no talent passed the cut; kept the top 3 by score"
NOTE_NO_CANDIDATES = "no candidate talents"
FALLBACK_COUNT = 3
STEM_LENGTH = 5
MIN_WORD_LETTERS = 4
FULL_TEXT_CHARS = 1500
LISTED_EXCLUSIONS = 50
"""Fused scoring decides every candidate but lists only the best-scored exclusions (at least
this many): on a catalogue of thousands the tail is all below the margin (or out of domain)."""
SEED_FLOOR = 0.18
MAX_SCHEMA_LINES = 64

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
    OVER_MAX_SERVED = "over_max_served"
    OVER_BUDGET = "over_budget"
    NOT_ACTIVE = "not_active"


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


def schema_text(input_schema: str) -> str:
    """A tool's parameters as text: one line per property of its JSON Schema, "name: its
    description" (nested objects' properties too); '' when there is no schema."""
    try:
        schema = json.loads(input_schema) if input_schema.strip() else {}
    except ValueError:
        return ""
    lines: list[str] = []
    pending = [schema] if isinstance(schema, dict) else []
    while pending and len(lines) < MAX_SCHEMA_LINES:
        node = pending.pop(0)
        properties = node.get("properties")
        if not isinstance(properties, dict):
            continue
        for name, spec in properties.items():
            spec = spec if isinstance(spec, dict) else {}
            description = spec.get("description")
            lines.append(f"{name}: {description}" if isinstance(description, str) else str(name))
            pending += [x for x in (spec, spec.get("items")) if isinstance(x, dict)]
    return "\n".join(lines[:MAX_SCHEMA_LINES])


def served_definition(summary: str, input_schema: str) -> str:
    """What a talent without a body is served as: its summary, and its input schema when it is
    a tool."""
    schema = input_schema.strip()
    return "\n\n".join(part for part in (summary.strip(), schema and f"Input: {schema}") if part)


def talent_fields(
    name: str,
    summary: str = "",
    body: str = "",
    tags: Sequence[str] = (),
    input_schema: str = "",
) -> TalentFields:
    """What lexical relevance reads of a talent: its body and parameters bounded at
    FULL_TEXT_CHARS (a long rule's tail is mostly examples)."""
    parts = [body.strip() if body.strip() != summary.strip() else "", schema_text(input_schema)]
    rest = "\n".join(part for part in parts if part)[:FULL_TEXT_CHARS]
    return TalentFields(name=name, tags=", ".join(tags), summary=summary.strip(), body=rest)


def full_text(fields: TalentFields) -> str:
    """The second embedded text of fused relevance: name, tags, summary, body and parameters,
    at most FULL_TEXT_CHARS (the models read ~256 tokens anyway)."""
    head = f"{fields.name} ({fields.tags})" if fields.tags else fields.name
    lines = [head, fields.summary, fields.body]
    return "\n".join(line for line in lines if line)[:FULL_TEXT_CHARS]


@dataclass(frozen=True)
class ScorableTalent:
    """A candidate as selection sees it. `tokens` is the cost of serving `body`; `text` is
    embedded by every scoring, `full_text` too by the fused one, which reads `fields` with
    BM25F."""

    id: str
    name: str
    text: str
    stems: frozenset[str]
    tokens: int
    body: str = ""
    # Served whatever the task (never scored): see
    # `satchel.server.talents.service.resolve_selection`.
    pinned: bool = False
    fields: TalentFields | None = None
    full_text: str = ""
    input_schema: str = ""  # a tool's JSON Schema, as given

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
        input_schema: str = "",
    ) -> ScorableTalent:
        """Derive texts, fields, stems (tags + triggers + task_types) and what is served: the
        body, else the summary with the input schema (a tool's definition), and its tokens."""
        fields = talent_fields(name, summary, body, [*tags, *triggers, *task_types], input_schema)
        served = body.strip() or served_definition(summary, input_schema)
        return cls(
            id=id,
            name=name,
            text=talent_text(name, summary, tags, triggers),
            stems=frozenset(stems([*tags, *triggers, *task_types])),
            tokens=estimate_tokens(served),
            body=served,
            pinned=pinned,
            fields=fields,
            full_text=full_text(fields),
            input_schema=input_schema,
        )


class Scoring(StrEnum):
    """How relevance scores a candidate (see the module docstring)."""

    SEED = "seed"
    HYBRID = "hybrid"
    FUSED = "fused"


@dataclass(frozen=True)
class SelectionParams:
    """Tunables of the relevance cut; defaults from the spec (the seed's scoring, no cap).

    `floor` bounds the best similarity of the out-of-domain gate; None (fused scoring only):
    the gate calibrated for the candidates. `margin` is in the scoring's own units.
    `text_weight` weighs the lexical rank in hybrid scoring; `max_served` caps how many
    talents relevance keeps (0: no cap).
    """

    floor: float | None = SEED_FLOOR
    beta: float = 0.12
    margin: float = 0.15
    budget_tokens: int = 2000
    scoring: Scoring = Scoring.SEED
    text_weight: float = 0.3
    max_served: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "scoring", Scoring(self.scoring))
        if self.text_weight < 0:
            raise ValueError(f"text_weight must be >= 0, got {self.text_weight}")
        if self.max_served < 0:
            raise ValueError(f"max_served must be >= 0, got {self.max_served}")
        if self.budget_tokens < 1:
            raise ValueError(f"budget_tokens must be a positive integer, got {self.budget_tokens}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")


@dataclass(frozen=True)
class ScoredTalent:
    """One candidate's decision: `similarity` is the cosine the score used (centred in the
    seed's scoring, plain in hybrid), `text_rank` the lexical rank in [0, 1] (hybrid only)."""

    id: str
    score: float
    similarity: float
    stem_hits: int
    reason: Reason
    tokens: int
    text_rank: float = 0.0


@dataclass(frozen=True)
class SelectionResult:
    """Kept talents in serving order, excluded ones by descending score, and why."""

    kept: tuple[ScoredTalent, ...]
    excluded: tuple[ScoredTalent, ...]
    out_of_domain: bool = False
    note: str = ""
    # What the out-of-domain gate of fused scoring saw (None in the other scorings).
    gate: GateReport | None = None
    # Candidates left out of `excluded` (fused scoring): all scored below every listed one.
    unlisted: int = 0

    @property
    def kept_ids(self) -> list[str]:
        return [talent.id for talent in self.kept]


@dataclass(frozen=True, eq=False)
class CentredSpace:
    """The candidates' side of centring, computed once per candidate set: their mean `mu` and
    their centred, normalised vectors. Reusing it across tasks gives the same similarities as
    `centred_similarities` without recentring the candidates on every call. `unit` holds the
    plain vectors, normalised (hybrid scoring's cosine)."""

    mu: np.ndarray
    centred: np.ndarray
    unit: np.ndarray

    @classmethod
    def of(cls, talent_vectors: np.ndarray) -> CentredSpace:
        """Centre talent vectors of shape (n, d)."""
        vectors = np.asarray(talent_vectors, dtype=np.float64)
        if vectors.ndim != 2:
            raise ValueError(f"talent_vectors must be 2-D, got shape {vectors.shape}")
        if len(vectors) == 0:
            return cls(np.zeros(vectors.shape[1]), vectors, vectors)
        mu = vectors.mean(axis=0)
        return cls(mu, _normalize_rows(vectors - mu), _normalize_rows(vectors))

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
        similarities: np.ndarray = np.clip(self.centred @ centred_task, -1.0, 1.0)
        return similarities

    def cosines(self, task_vector: np.ndarray) -> np.ndarray:
        """The plain cosine between the task and every candidate; (n,) float64."""
        task = np.asarray(task_vector, dtype=np.float64).reshape(-1)
        if len(self.unit) == 0:
            return np.zeros(0)
        unit_task = _normalize_rows(task[np.newaxis, :])[0]
        cosines: np.ndarray = np.clip(self.unit @ unit_task, -1.0, 1.0)
        return cosines


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


@dataclass(frozen=True)
class _Row:
    """One candidate scored."""

    talent: ScorableTalent
    score: float
    similarity: float
    hits: int
    text_rank: float


def _space(
    candidates: Sequence[ScorableTalent], talent_vectors: np.ndarray | CentredSpace
) -> CentredSpace:
    if len(talent_vectors) != len(candidates):
        raise ValueError(f"{len(talent_vectors)} vectors for {len(candidates)} candidates")
    if isinstance(talent_vectors, CentredSpace):
        return talent_vectors
    return CentredSpace.of(talent_vectors)


def lexical_ranks(
    candidates: Sequence[ScorableTalent], task: str, lexical: LexicalIndex | None = None
) -> np.ndarray:
    """Each candidate's BM25 for `task` divided by the best candidate's ([0, 1], all 0 when no
    word matches); `lexical` is the candidates' index (built when None)."""
    lexical = lexical or LexicalIndex.of([talent.text for talent in candidates])
    bm25, _ = lexical.scores(task)
    best = float(bm25.max()) if len(bm25) else 0.0
    return bm25 / best if best > 0 else np.zeros(len(candidates))


def _score(
    candidates: Sequence[ScorableTalent],
    talent_vectors: np.ndarray | CentredSpace | None,
    task_vector: np.ndarray | None,
    task_stems: Set[str],
    beta: float,
    text_rank: np.ndarray | None = None,
    text_weight: float = 0.0,
) -> list[_Row]:
    """Every candidate scored, sorted by score desc then id. With `text_rank` (hybrid): plain
    cosine + beta x hits + text_weight x text rank; without: the seed's centred similarity +
    beta x hits."""
    hybrid = text_rank is not None
    ranks = text_rank if text_rank is not None else np.zeros(len(candidates))
    similarity = np.zeros(len(candidates))
    if talent_vectors is not None and task_vector is not None:
        space = _space(candidates, talent_vectors)
        similarity = space.cosines(task_vector) if hybrid else space.similarities(task_vector)
    rows = []
    for talent, sim, rank in zip(candidates, similarity.tolist(), ranks.tolist(), strict=True):
        hits = len(talent.stems & task_stems)
        rows.append(_Row(talent, sim + beta * hits + text_weight * rank, sim, hits, rank))
    rows.sort(key=lambda row: (-row.score, row.talent.id))
    return rows


def _decision(row: _Row, reason: Reason) -> ScoredTalent:
    return ScoredTalent(
        row.talent.id, row.score, row.similarity, row.hits, reason, row.talent.tokens, row.text_rank
    )


def select(
    candidates: Sequence[ScorableTalent],
    talent_vectors: np.ndarray | CentredSpace | FusedSpace,
    task_vector: np.ndarray,
    task_stems: Set[str],
    params: SelectionParams | None = None,
    *,
    task: str = "",
    lexical: LexicalIndex | None = None,
    part_vectors: np.ndarray | None = None,
) -> SelectionResult:
    """Relevance on: gate, margin cut, count cap and budget over the candidates (row i of
    vectors = i).

    `talent_vectors` is the candidates' `FusedSpace` in fused scoring; in the others, their
    vectors or a precomputed `CentredSpace`. Hybrid and fused scoring read the `task` text;
    hybrid the candidates' `lexical` index when given (else builds it). `part_vectors`: fused
    scoring, one row per sub-intent of the task (`sub_intents`), to score each like the whole
    task (else by its words).
    """
    params = params or SelectionParams()
    if not candidates:
        return SelectionResult(kept=(), excluded=(), note=NOTE_NO_CANDIDATES)
    if params.scoring == Scoring.FUSED:
        if not isinstance(talent_vectors, FusedSpace):
            raise ValueError("fused scoring needs the candidates' FusedSpace")
        return _select_fused(
            candidates, talent_vectors, task_vector, task_stems, task, params, part_vectors
        )
    if isinstance(talent_vectors, FusedSpace):
        raise ValueError(f"{params.scoring} scoring needs the candidates' vectors")
    ranks = lexical_ranks(candidates, task, lexical) if params.scoring == Scoring.HYBRID else None
    rows = _score(
        candidates, talent_vectors, task_vector, task_stems, params.beta, ranks, params.text_weight
    )
    floor = params.floor if params.floor is not None else SEED_FLOOR
    if max(row.similarity for row in rows) < floor and sum(row.hits for row in rows) == 0:
        excluded = tuple(_decision(row, Reason.OUT_OF_DOMAIN) for row in rows)
        return SelectionResult((), excluded, out_of_domain=True, note=NOTE_OUT_OF_DOMAIN)
    return _cut(rows, params)


def _select_fused(
    candidates: Sequence[ScorableTalent],
    space: FusedSpace,
    task_vector: np.ndarray,
    task_stems: Set[str],
    task: str,
    params: SelectionParams,
    part_vectors: np.ndarray | None = None,
) -> SelectionResult:
    """Fused scoring (`talent_fusion`): the gate calibrated for these candidates (its
    similarity bound replaced by `params.floor` when set) judges the whole task; the scores
    merge the whole task's and its sub-intents' (`merged_scores`: each part scored like the
    whole task with its row of `part_vectors`, else by its words); then the same cut as the
    others.
    Ties in score keep the candidates' order (the service passes them by id)."""
    if len(space) != len(candidates):
        raise ValueError(f"a space of {len(space)} talents for {len(candidates)} candidates")
    evidence = space.evidence(task_vector, task_terms(task))
    if params.floor is not None:  # the request's floor replaces the calibrated gate
        space = replace(space, gate=replace(space.gate, similarity=params.floor, contrast=None))
    parts = sub_intents(task)
    if part_vectors is not None and len(part_vectors) == len(parts):
        scores = space.part_scores(part_vectors, [task_terms(part) for part in parts])
    else:
        scores = [space.word_scores(task_terms(part)) for part in parts]
    fused = merged_scores(evidence.fused, scores, params.margin)
    report = space.judge(evidence, task_vector, is_english(task), script_of(task))
    # Only the rows that can be served or listed are built (a catalogue may hold thousands):
    # those within the margin and the LISTED_EXCLUSIONS next; the rest are counted.
    within = int((fused >= fused.max() - params.margin).sum()) if report.admitted else 0
    built = min(len(candidates), within + LISTED_EXCLUSIONS)
    order = np.argsort(-fused, kind="stable")[:built]
    similarity, lexical = evidence.similarity, evidence.word_match
    rows = [
        _Row(
            candidates[i],
            float(fused[i]),
            float(similarity[i]),
            len(candidates[i].stems & task_stems),
            float(lexical[i]),
        )
        for i in order.tolist()
    ]
    unlisted = len(candidates) - built
    if not report.admitted:
        excluded = tuple(_decision(row, Reason.OUT_OF_DOMAIN) for row in rows)
        note = f"{NOTE_OUT_OF_DOMAIN} ({report.note()})"
        return SelectionResult(
            (), excluded, out_of_domain=True, note=note, gate=report, unlisted=unlisted
        )
    # z-scores are relative: a candidate below the mean may still be the second best fit.
    return replace(_cut(rows, params, positive_only=False), gate=report, unlisted=unlisted)


def _cut(
    rows: Sequence[_Row], params: SelectionParams, *, positive_only: bool = True
) -> SelectionResult:
    """Margin, positivity (unless not `positive_only`), count cap and budget over rows sorted
    best first; the top three when nothing survives."""
    threshold = rows[0].score - params.margin
    cap = params.max_served or len(rows)
    kept: list[ScoredTalent] = []
    excluded: list[ScoredTalent] = []
    used = 0
    for row in rows:
        if row.score < threshold:
            excluded.append(_decision(row, Reason.BELOW_MARGIN))
        elif positive_only and row.score <= 0:
            excluded.append(_decision(row, Reason.NON_POSITIVE))
        elif len(kept) >= cap:
            excluded.append(_decision(row, Reason.OVER_MAX_SERVED))
        elif used + row.talent.tokens > params.budget_tokens:
            excluded.append(_decision(row, Reason.OVER_BUDGET))
        else:
            used += row.talent.tokens
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
