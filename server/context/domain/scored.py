"""What both ranking engines return: scored facts and episodes, typed.

Pure: no I/O. The statements (`context/storage/`) and the in-memory rankings (`fact_ranking.py`,
`episode_ranking.py`) both produce these rows; the context call (`context/service.py`) reads
only them. Their score parts are those of `score.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ScoredFact:
    """A fact candidate: what packing and serving read, its score parts, its hard-filter flags
    and the older facts it restates (same predicate, close vectors: `updates.py`)."""

    id: str
    predicate: str
    value: Any
    statement: str
    confidence: float
    valid_from: datetime | None
    source_event_ids: list[str]
    since_epoch: float
    similarity: float
    text_rank: float
    recency: float
    score: float
    expired: bool
    in_open_conflict: bool
    restates: list[str] = field(default_factory=list)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScoredFact:
        """A row of the fact statements (ids as UUIDs, numbers as the driver reads them)."""
        return cls(
            id=str(row["id"]),
            predicate=row["predicate"],
            value=row["value"],
            statement=row["statement"],
            confidence=float(row["confidence"]),
            valid_from=row["valid_from"],
            source_event_ids=[str(e) for e in row["source_event_ids"]],
            since_epoch=float(row["since_epoch"]),
            similarity=float(row["similarity"]),
            text_rank=float(row["text_rank"]),
            recency=float(row["recency"]),
            score=float(row["score"]),
            expired=bool(row["expired"]),
            in_open_conflict=bool(row["in_open_conflict"]),
            restates=[str(o) for o in row["restates"]],
        )


@dataclass(frozen=True)
class FactCandidates:
    """A call's best facts, best first, and what their text ranks were divided by (the best
    BM25 among the visible facts; None for no candidate): multi-hop divides by it too.
    `exact`: every visible fact was scored (else two-phase retrieval found them)."""

    facts: list[ScoredFact]
    text_full: float | None
    exact: bool = True


@dataclass(frozen=True)
class ScoredEpisode:
    """An episode candidate (an event), its score parts and whether every fact drawn from it
    is hidden. `context_similarity`: the neighbour's similarity when a neighbour lifted it."""

    id: str
    kind: str
    occurred_at: datetime
    text: str
    similarity: float
    text_rank: float
    recency: float
    score: float
    context_similarity: float
    source_facts_hidden: bool

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScoredEpisode:
        """A row of the episode statements."""
        return cls(
            id=str(row["id"]),
            kind=row["kind"],
            occurred_at=row["occurred_at"],
            text=row["text"],
            similarity=float(row["similarity"]),
            text_rank=float(row["text_rank"]),
            recency=float(row["recency"]),
            score=float(row["score"]),
            context_similarity=float(row["context_similarity"] or 0.0),
            source_facts_hidden=bool(row["source_facts_hidden"]),
        )
