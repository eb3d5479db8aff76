"""Which scopes get indexes of their own (pure; context/storage/scope_indexes.py applies it).

Under a scope filter, an HNSW scan of the global graph walks every tenant's vectors to find
one scope's nearest, and a global text index lists a word's matches in every scope; a large
scope is served from partial indexes holding its facts alone: an HNSW graph, and GIN indexes of
its lexemes and of its words (benchmarks/context.md, "A million facts over a thousand
scopes"). A scope earns them above `min_facts` active facts (the two-phase path's cut) and
keeps them down to half of that, so a scope near the cut is not built and dropped in turn; at
most `max_indexes` scopes have them, the largest first (each partial index is one more
predicate for the planner and for every insert to check).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

ScopeKey = tuple[str, str]  # (project_id, subject_id)

INDEX_PREFIX = "facts_scope_"


@dataclass(frozen=True)
class IndexPlan:
    """What a maintenance run does: scopes to index (largest first) and scopes to unindex."""

    build: list[ScopeKey]
    drop: list[ScopeKey]


@dataclass(frozen=True)
class ScopeIndexNames:
    """The names of one scope's indexes: a fixed prefix and a hash of its keys (any text, any
    length, fits PostgreSQL's 63-byte names), then the kind."""

    prefix: str

    @classmethod
    def of(cls, scope: ScopeKey) -> ScopeIndexNames:
        digest = hashlib.sha256(f"{scope[0]}\x00{scope[1]}".encode()).hexdigest()[:20]
        return cls(f"{INDEX_PREFIX}{digest}")

    @property
    def vector(self) -> str:
        """HNSW over `embedding`."""
        return f"{self.prefix}_hnsw"

    @property
    def lexemes(self) -> str:
        """GIN over `lexemes` (the hybrid text rank)."""
        return f"{self.prefix}_lexemes"

    @property
    def words(self) -> str:
        """GIN over `search_vector` (multi-hop, the seed's text rank)."""
        return f"{self.prefix}_words"

    @property
    def all(self) -> tuple[str, str, str]:
        """Every index of the scope, in build order."""
        return (self.vector, self.lexemes, self.words)


def plan_indexes(
    sizes: Mapping[ScopeKey, int],
    indexed: set[ScopeKey],
    *,
    min_facts: int,
    max_indexes: int,
) -> IndexPlan:
    """The scopes to build and drop, given the active facts of the scopes that may qualify
    (`sizes`; a scope absent holds fewer than half of `min_facts`) and those already indexed.

    Every scope above `min_facts` qualifies, and an indexed one while it keeps at least half of
    it; of those, the `max_indexes` largest keep or get an index (ties by keys).
    """
    keep_from = min_facts // 2
    qualified = [
        scope
        for scope, facts in sizes.items()
        if facts > min_facts or (scope in indexed and facts >= keep_from)
    ]
    chosen = sorted(qualified, key=lambda s: (-sizes[s], s))[:max_indexes]
    wanted = set(chosen)
    return IndexPlan(
        build=[scope for scope in chosen if scope not in indexed],
        drop=sorted(indexed - wanted),
    )
