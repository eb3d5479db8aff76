"""Hybrid fact ranking over a scope's active facts held in memory.

Pure: no I/O. The same rows as the exact hybrid statements (`_EXACT_SQL` in
`context/storage/candidates.py`, the multi-hop scan `_HOP_BY_SCAN` in `multi_hop.py`), step for
step, with the score of `score.py`: the facts visible at the call's instant
(valid then), each scored on cosine, BM25 over the scope's statistics divided by the best of
them, and recency; the best `candidate_limit` by score (ties by id) with their hard-filter flags
(expired, in an open conflict) and the older facts each restates (same predicate, vectors at
least `newer_wins` close). Multi-hop: per entity, the nearest of the first `scan_limit` visible
facts whose words hold it, scored alike against the candidates' best BM25 (`FactRanking`: the
score parts computed once for both). And whether the facts drawn from an event are all hidden
(an episode's `source_facts_hidden`). A server holds a scope's facts this way while they do not
change (`server/context/scope_cache.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

import numpy as np
import orjson

from satchel.server.context.domain.score import (
    Postings,
    Weights,
    best,
    bm25,
    cosine_similarity,
    decay,
    text_ranks,
)
from satchel.server.context.domain.scored import FactCandidates, ScoredFact

NEVER = np.iinfo(np.int64).max  # an instant after every other (no end, a conflict still open)


@dataclass(frozen=True)
class ScopeFacts:
    """A scope's active facts at one version, in id order, with what ranking and serving read.
    Instants are int64 microseconds since the epoch. Rows are held in tuples and arrays, which
    the garbage collector stops visiting (a list of every statement would be walked at every
    full collection, tens of milliseconds with hundreds of copies held)."""

    version: int
    ids: tuple[str, ...]
    predicates: tuple[str, ...]
    values: tuple[str, ...]  # JSON text, decoded for the rows a call ranks as the statements do
    statements: tuple[str, ...]
    confidences: tuple[float, ...]
    valid_from: tuple[datetime | None, ...]
    source_event_ids: tuple[tuple[str, ...], ...]
    since_epoch: np.ndarray  # float64: when each became valid (the stored column)
    anchor_us: np.ndarray  # coalesce(valid_from, recorded_from), what staleness counts from
    valid_to_us: np.ndarray  # NEVER when open-ended
    stale_after_us: np.ndarray  # -1 when it never goes stale
    vectors: np.ndarray  # float32 (n, dim) as stored, or float16 (`scope_cache.py`)
    norms: np.ndarray  # float64: the stored vectors'
    lexeme_tokens: np.ndarray
    postings: Postings  # stemmed lexemes (BM25)
    words: Postings  # the `simple` configuration's words (multi-hop)
    # position -> the (opened, resolved or NEVER) instants of the conflicts it is a member of
    conflicts: dict[int, tuple[tuple[int, int], ...]]
    # The events the scope's other facts (superseded, retired) were drawn from.
    inactive_sources: frozenset[str]

    @cached_property
    def position_of(self) -> dict[str, int]:
        """Each fact's position by id."""
        return {fact_id: i for i, fact_id in enumerate(self.ids)}

    @cached_property
    def drawn_from(self) -> dict[str, tuple[int, ...]]:
        """The positions of the facts drawn from each event."""
        drawn: dict[str, list[int]] = {}
        for i, events in enumerate(self.source_event_ids):
            for event_id in events:
                drawn.setdefault(event_id, []).append(i)
        return {event_id: tuple(positions) for event_id, positions in drawn.items()}

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def nbytes(self) -> int:
        """Roughly what these facts hold in memory."""
        arrays = sum(
            a.nbytes
            for a in (
                self.since_epoch,
                self.anchor_us,
                self.valid_to_us,
                self.stale_after_us,
                self.vectors,
                self.norms,
                self.lexeme_tokens,
            )
        )
        postings = self.postings.nbytes + self.words.nbytes
        # A row's statement (twice: as served and in its value, typically), id, predicate,
        # instants, sources, list slots and its entry by id; the events the other facts were
        # drawn from. (tests/context/test_scope_cache.py checks the sum against the memory
        # a loaded copy takes.)
        rows = sum(
            len(s) * 2 + 400 + 150 * len(e)
            for s, e in zip(self.statements, self.source_event_ids, strict=True)
        )
        return arrays + postings + rows + 150 * len(self.inactive_sources)

    def prepare(self) -> None:
        """Compute what ranking derives once (as they are loaded, off the event loop)."""
        _ = self.nbytes, self.drawn_from, self.position_of


@dataclass(frozen=True)
class FactQuery:
    """What ranks a call's facts: its vector and instant, its searched lexemes with their IDF,
    the score's weights and the statement's parameters."""

    vector: np.ndarray
    terms: Sequence[str]
    idfs: Sequence[float]
    avg_tokens: float
    at_epoch: float
    at_us: int
    weights: Weights
    candidate_limit: int
    newer_wins: float


@dataclass(frozen=True)
class _Scores:
    similarity: np.ndarray
    text_rank: np.ndarray
    recency: np.ndarray
    score: np.ndarray


def _visible(facts: ScopeFacts, at_us: int) -> np.ndarray:
    return np.flatnonzero(facts.valid_to_us > at_us)


def _expired(facts: ScopeFacts, i: int, at_us: int) -> bool:
    stale = facts.stale_after_us[i]
    return bool(stale >= 0 and at_us - facts.anchor_us[i] >= stale)


def _in_open_conflict(facts: ScopeFacts, i: int, at_us: int) -> bool:
    return any(opened <= at_us < resolved for opened, resolved in facts.conflicts.get(i, ()))


def hidden_sources(facts: ScopeFacts, at_us: int, event_ids: Sequence[str]) -> dict[str, bool]:
    """Whether every fact drawn from each event is hidden at `at_us` (not valid, expired, in
    an open conflict, superseded or retired): `source_facts_hidden`, as the statement says."""
    flags = {}
    for event_id in event_ids:
        drawn = facts.drawn_from.get(event_id, ())
        shown = any(
            facts.valid_to_us[i] > at_us
            and not _expired(facts, i, at_us)
            and not _in_open_conflict(facts, i, at_us)
            for i in drawn
        )
        flags[event_id] = bool(drawn or event_id in facts.inactive_sources) and not shown
    return flags


def _restated(
    facts: ScopeFacts, newer_wins: float, positions: Sequence[int]
) -> dict[int, list[str]]:
    """The older facts among `positions` that each restates (0: the rule is off)."""
    if newer_wins <= 0:
        return {}
    by_predicate: dict[str, list[int]] = {}
    for i in positions:
        by_predicate.setdefault(facts.predicates[i], []).append(i)
    restates: dict[int, list[str]] = {}
    for group in by_predicate.values():
        if len(group) < 2:
            continue
        vectors = facts.vectors[group].astype(np.float64) / facts.norms[group, None]
        since = facts.since_epoch[group]
        # [a, b]: fact b is older than fact a and close enough to be what a states again
        older = (since[None, :] < since[:, None]) & (vectors @ vectors.T >= newer_wins)
        for a in np.flatnonzero(older.any(axis=1)).tolist():
            restates[group[a]] = [facts.ids[group[b]] for b in np.flatnonzero(older[a]).tolist()]
    return restates


class FactRanking:
    """One call's score parts over a scope's held facts (cosine, raw BM25, recency), computed
    once for its candidates and its multi-hop pass."""

    def __init__(self, facts: ScopeFacts, query: FactQuery) -> None:
        self.facts = facts
        self.query = query
        self.visible = _visible(facts, query.at_us)
        self.similarity = cosine_similarity(facts.vectors, facts.norms, query.vector)
        self.raw = bm25(
            facts.postings, facts.lexeme_tokens, query.terms, query.idfs, query.avg_tokens
        )
        self.recency = decay(facts.since_epoch, query.at_epoch, query.weights.tau_seconds)

    def _scores(self, scored: np.ndarray, text_full: float | None) -> tuple[_Scores, float]:
        """The scores with text ranks divided by `text_full`, or by the best of `scored`."""
        text_rank, full = text_ranks(self.raw, scored, text_full)
        score = self.query.weights.combine(self.similarity, text_rank, self.recency)
        return _Scores(self.similarity, text_rank, self.recency, score), full

    def candidates(self) -> FactCandidates:
        """The best `candidate_limit` facts visible at the call's instant, best first, as the
        exact statement returns them, with the best BM25 their text ranks were divided by."""
        if len(self.visible) == 0:
            return FactCandidates([], None)
        scores, full = self._scores(self.visible, None)
        ids = np.arange(len(self.facts))
        top = best(self.visible, self.query.candidate_limit, -scores.score, ids).tolist()
        return FactCandidates(self._rows(top, scores), full)

    def multi_hop(
        self,
        entities: Sequence[str],
        exclude: Collection[str],
        text_full: float,
        per_entity: int,
        scan_limit: int,
    ) -> list[ScoredFact]:
        """Per entity, the `per_entity` visible facts nearest to the query (ties by id) among
        the first `scan_limit` by id whose words hold it, not in `exclude`; scored with
        `text_full`."""
        facts = self.facts
        eligible = np.zeros(len(facts), dtype=bool)
        eligible[self.visible] = True
        for fact_id in exclude:
            if (i := facts.position_of.get(fact_id)) is not None:
                eligible[i] = False
        distance = 1.0 - self.similarity
        ids = np.arange(len(facts))
        hop: set[int] = set()
        for entity in entities:
            posting = facts.words.get(entity.lower())
            if posting is None:
                continue
            mentions = posting[0][eligible[posting[0]]][:scan_limit]
            hop.update(best(mentions, per_entity, distance, ids).tolist())
        scores, _ = self._scores(np.arange(0), text_full)
        return self._rows(sorted(hop), scores)

    def _rows(self, positions: Sequence[int], scores: _Scores) -> list[ScoredFact]:
        """The statement's rows for `positions`, best first (ties by id)."""
        facts, at_us = self.facts, self.query.at_us
        restates = _restated(facts, self.query.newer_wins, positions)
        return [
            ScoredFact(
                id=facts.ids[i],
                predicate=facts.predicates[i],
                value=orjson.loads(facts.values[i]),
                statement=facts.statements[i],
                confidence=facts.confidences[i],
                valid_from=facts.valid_from[i],
                source_event_ids=list(facts.source_event_ids[i]),
                since_epoch=float(facts.since_epoch[i]),
                similarity=float(scores.similarity[i]),
                text_rank=float(scores.text_rank[i]),
                recency=float(scores.recency[i]),
                score=float(scores.score[i]),
                expired=_expired(facts, i, at_us),
                in_open_conflict=_in_open_conflict(facts, i, at_us),
                restates=restates.get(i, []),
            )
            for i in sorted(positions, key=lambda i: (-scores.score[i], i))
        ]
