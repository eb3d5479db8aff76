"""How context calls rank (SATCHEL_RANKING), decided in one place.

`ranking_of(settings)` turns the setting into a `Ranking`: the score's weights and what the
chosen ranking does, each named for its effect. Everything else reads these attributes instead
of comparing the setting's string.

- **hybrid** (the default): BM25 text ranks over the scope's statistics; facts and episodes
  packed in one ranked list; episodes ranked like facts and lifted by their neighbours; a
  restated value's newest statement first; the scope cache may rank a scope in memory.
- **seed**: the seed's behaviour: `ts_rank_cd` text ranks; the facts packed, then multi-hop,
  then the nearest episodes (cosine and recency); nothing ranked in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from satchel.server.context.domain.score import Weights
from satchel.server.platform.config import ContextSettings

HYBRID = "hybrid"


@dataclass(frozen=True)
class Ranking:
    """One ranking's choices (see the module's docstring)."""

    name: str
    weights: Weights
    bm25_text_rank: bool
    """Text ranks are BM25 over stemmed lexemes (else the seed's ts_rank_cd over words)."""
    packs_episodes_with_facts: bool
    """Facts and episodes are packed in one list (else facts, multi-hop, then episodes)."""
    ranks_episodes_like_facts: bool
    """Episodes are scored like facts and lifted by their neighbours (else: the nearest, on
    cosine and recency)."""
    newer_wins_similarity: float
    """Of two statements of one value at least this close, the newer ranks first (0: off)."""
    ranks_in_memory: bool
    """The scope cache may rank a held scope instead of the statements."""


def _weight(value: float | None) -> float:
    if value is None:  # ContextSettings gives every unset weight its ranking's default
        raise ValueError("a weight of the hybrid score is unset")
    return value


@cache
def ranking_of(settings: ContextSettings) -> Ranking:
    """The ranking `settings` choose (one per settings object)."""
    weights = Weights(
        similarity=_weight(settings.weight_similarity),
        text_rank=_weight(settings.weight_text_rank),
        recency=_weight(settings.weight_recency),
        tau_seconds=settings.recency_tau_days * 86400.0,
    )
    hybrid = settings.ranking == HYBRID
    return Ranking(
        name=settings.ranking,
        weights=weights,
        bm25_text_rank=hybrid,
        packs_episodes_with_facts=hybrid,
        ranks_episodes_like_facts=hybrid,
        newer_wins_similarity=settings.newer_wins_similarity if hybrid else 0.0,
        ranks_in_memory=hybrid,
    )
