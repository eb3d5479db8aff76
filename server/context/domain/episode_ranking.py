"""Hybrid episode ranking over a scope's events held in memory.

Pure: no I/O. The same ranking as the hybrid episodes statement (`context/storage/episodes.py`,
`_HYBRID_EPISODES_SQL`), step for step: each event's cosine distance and Okapi BM25 (k1 1.2,
b 0.75, the scope's IDF and average length from the call's plan); the nearest `pool` events and
the `pool` best text matches, scored on similarity, text rank and recency (own score); the best
`k` of them look for their neighbours in the conversation (the events just before and after,
within `gap`); each event is lifted to weight x its best neighbour's own score + (1 - weight) x
its own when that is higher; the best `k`. A server holds a scope's events this way while they
do not change (`server/context/scope_cache.py`); the statement serves every other call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

import numpy as np

from satchel.server.context.domain.score import (
    Postings,
    Weights,
    best,
    bm25,
    cosine_similarity,
    decay,
    text_ranks,
)


@dataclass(frozen=True)
class ScopeEvents:
    """A scope's events at one version, in conversation order: (occurred_at, id); rows in
    tuples and arrays, which the garbage collector stops visiting (as `ScopeFacts`)."""

    version: int
    ids: tuple[str, ...]
    kinds: tuple[str, ...]
    texts: tuple[str, ...]
    occurred_at: tuple[datetime, ...]
    occurred_us: np.ndarray  # int64 microseconds since the epoch
    vectors: np.ndarray  # float32 (n, dim) as stored, or float16 (`scope_cache.py`)
    norms: np.ndarray  # float64 (n,): the stored vectors'
    lexeme_tokens: np.ndarray  # float64 (n,): each event's length for BM25
    postings: Postings  # stemmed lexemes (BM25)

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def id_order(self) -> np.ndarray:
        """Each event's rank by id (the statements' tie-breaker)."""
        order = np.empty(len(self.ids), dtype=np.int64)
        order[np.argsort(np.array(self.ids))] = np.arange(len(self.ids))
        return order

    @cached_property
    def nbytes(self) -> int:
        """Roughly what these events hold in memory (a row's id, kind, instant and list
        slots: ~400 bytes)."""
        arrays = (
            self.vectors.nbytes
            + self.norms.nbytes
            + self.occurred_us.nbytes
            + self.lexeme_tokens.nbytes
            + self.id_order.nbytes
        )
        text = sum(len(t) + 400 for t in self.texts)
        return arrays + self.postings.nbytes + text

    def prepare(self) -> None:
        """Compute what ranking derives once (as they are loaded, off the event loop)."""
        _ = self.nbytes


@dataclass(frozen=True)
class EpisodeQuery:
    """What ranks a call's episodes: its vector, its searched lexemes with their IDF, the
    score's weights and the statement's parameters."""

    vector: np.ndarray
    terms: Sequence[str]
    idfs: Sequence[float]
    avg_tokens: float
    at_epoch: float
    weights: Weights
    pool: int
    k: int
    context_weight: float
    gap_us: int


@dataclass(frozen=True)
class RankedEpisode:
    """An episode's score parts, as the statement returns them."""

    position: int
    similarity: float
    text_rank: float
    recency: float
    score: float
    context_similarity: float


def rank_episodes(events: ScopeEvents, query: EpisodeQuery) -> list[RankedEpisode]:
    """The best `query.k` episodes, best first (ties by id), as the hybrid statement ranks them."""
    if len(events) == 0 or query.k == 0:
        return []
    similarity = cosine_similarity(events.vectors, events.norms, query.vector)
    distance = 1.0 - similarity
    raw = bm25(events.postings, events.lexeme_tokens, query.terms, query.idfs, query.avg_tokens)
    matched = np.flatnonzero(~np.isnan(raw))
    text_rank, _ = text_ranks(raw, matched)
    recency = decay(events.occurred_us / 1e6, query.at_epoch, query.weights.tau_seconds)
    own = query.weights.combine(similarity, text_rank, recency)

    id_order = events.id_order
    by_vector = best(np.arange(len(events)), query.pool, distance, id_order)
    by_text = best(matched, query.pool, -raw, distance, id_order)
    pooled = np.union1d(by_vector, by_text)
    seeds = best(pooled, query.k, -own, id_order).tolist()

    occurred = events.occurred_us
    partners: dict[int, list[int]] = {}
    for seed in seeds:
        for neighbour in (seed - 1, seed + 1):
            if 0 <= neighbour < len(events) and abs(occurred[neighbour] - occurred[seed]) <= (
                query.gap_us
            ):
                partners.setdefault(seed, []).append(neighbour)
                partners.setdefault(neighbour, []).append(seed)
    scored = np.union1d(pooled, np.fromiter(partners, dtype=np.int64, count=len(partners)))
    context = np.zeros(len(scored))
    context_similarity = np.zeros(len(scored))
    for n, i in enumerate(scored.tolist()):
        linked = partners.get(i)
        if linked:
            context[n] = max(own[j] for j in linked)
            context_similarity[n] = max(similarity[j] for j in linked)
    weight = query.context_weight
    lifted = weight * context + (1 - weight) * own[scored]
    score = np.maximum(own[scored], lifted)
    top = np.lexsort((id_order[scored], -score))[: query.k]
    return [
        RankedEpisode(
            position=int(scored[n]),
            similarity=float(similarity[scored[n]]),
            text_rank=float(text_rank[scored[n]]),
            recency=float(recency[scored[n]]),
            score=float(score[n]),
            context_similarity=float(context_similarity[n]) if lifted[n] > own[scored[n]] else 0.0,
        )
        for n in top.tolist()
    ]
