"""Greedy packing of scored candidates into one token budget, one traced decision at a time.

Pure: no I/O. A `Packer` lives for one context call; its passes (facts, multi-hop facts,
episodes) share the budget, and every decision is yielded as soon as it is made so the caller can
stream it while packing continues.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Final

from satchel.server.context.domain.block import BlockCosts
from satchel.server.platform.tokens import estimate_tokens

INCLUDED: Final = "included"
EXCLUDED: Final = "excluded"
BLOCKED: Final = "blocked"
OUTCOMES: Final = (INCLUDED, EXCLUDED, BLOCKED)

FACT: Final = "fact"
EPISODE: Final = "episode"
KINDS: Final = (FACT, EPISODE)

RELEVANCE: Final = "relevance"
MULTI_HOP_EXPANSION: Final = "multi_hop_expansion"
OVER_BUDGET: Final = "over_budget"
BELOW_RELEVANCE_FLOOR: Final = "below_relevance_floor"
CONFLICT_OPEN: Final = "conflict_open"
VOLATILITY_EXPIRED: Final = "volatility_expired"
SOURCE_ALREADY_SERVED: Final = "source_already_served"
SOURCE_FACTS_HIDDEN: Final = "source_facts_hidden"
REASON_CODES: Final = (
    RELEVANCE,
    MULTI_HOP_EXPANSION,
    OVER_BUDGET,
    BELOW_RELEVANCE_FLOOR,
    CONFLICT_OPEN,
    VOLATILITY_EXPIRED,
    SOURCE_ALREADY_SERVED,
    SOURCE_FACTS_HIDDEN,
)

HIDDEN_OUTCOMES: Final[dict[str, str]] = {
    CONFLICT_OPEN: BLOCKED,
    VOLATILITY_EXPIRED: EXCLUDED,
    SOURCE_FACTS_HIDDEN: EXCLUDED,
}
"""Outcome of a candidate hidden by a hard filter, by its `blocked_reason`. An episode is
`source_facts_hidden` when every fact drawn from its event is hidden (superseded, retired, no
longer valid, expired or in an open conflict): serving it would bring back what they hid."""

STATUS_OK: Final = "ok"
STATUS_DEGRADED: Final = "degraded"
NO_RELEVANT_MEMORY: Final = "no_relevant_memory"

DEFAULT_BUDGET_TOKENS: Final = 900


@dataclass(frozen=True)
class Candidate:
    """A fact or an episode offered to the packer, with its rendered text and scores.

    `blocked_reason` is set (a key of `HIDDEN_OUTCOMES`) when a hard filter hides it. `sources`
    are the events a fact was drawn from (empty for an episode, whose event is its `id`).
    `context_similarity`: for an episode ranked by its neighbour, that neighbour's similarity,
    which the relevance floor reads instead of its own when higher. `cost`: the tokens it
    costs the budget (its line of the block, `block.py`); None: the estimate of its `text`
    (the seed's items budget). `group`: the header its line sits under in the block ("":
    none), which costs `group_cost` more with the group's first item.
    """

    id: str
    kind: str
    text: str
    similarity: float
    text_rank: float
    recency: float
    score: float
    blocked_reason: str | None = None
    sources: frozenset[str] = frozenset()
    context_similarity: float = 0.0
    cost: int | None = None
    group: str = ""
    group_cost: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown candidate kind {self.kind!r}")
        if self.blocked_reason is not None and self.blocked_reason not in HIDDEN_OUTCOMES:
            raise ValueError(f"unknown blocked_reason {self.blocked_reason!r}")
        if not math.isfinite(self.score):
            raise ValueError(f"candidate {self.id!r} has a non-finite score")

    @cached_property
    def tokens(self) -> int:
        """The tokens it costs the budget: `cost`, else the estimate of its text."""
        return estimate_tokens(self.text) if self.cost is None else self.cost

    @property
    def distance(self) -> float:
        """Cosine distance to the query: `1 - similarity`."""
        return 1.0 - self.similarity


@dataclass(frozen=True)
class Decision:
    """One traced decision; `budget_used` is the tokens spent once it is made."""

    sequence: int
    candidate: Candidate
    outcome: str
    reason_code: str
    budget_used: int


def _ranked(candidates: Iterable[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (-c.score, c.id))


class Packer:
    """Greedy packer over one budget shared by every pass of a context call.

    Each pass method is a generator: nothing is decided until it is iterated, and each decision
    updates the packer's state before it is yielded. A candidate (by kind and id) gets at most one
    decision per packer; later occurrences are skipped silently.
    """

    def __init__(
        self, budget_tokens: int, max_distance: float = 0.0, costs: BlockCosts | None = None
    ) -> None:
        if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int):
            raise ValueError("budget_exceeded: budget_tokens must be a positive integer")
        if budget_tokens <= 0:
            raise ValueError("budget_exceeded: budget_tokens must be a positive integer")
        self._budget = budget_tokens
        self._max_distance = max_distance
        self._used = 0
        self._sequence = 0
        self._decided: set[tuple[str, str]] = set()
        self._decisions: list[Decision] = []
        self._included: list[Candidate] = []
        self._hidden: dict[str, int] = {}
        self._gated_out = 0
        self._served_episodes: set[str] = set()
        self._served_fact_sources: set[str] = set()
        self._costs = costs
        self._included_kinds: set[str] = set()
        self._included_groups: set[tuple[str, str]] = set()

    @property
    def budget_tokens(self) -> int:
        """The budget of the whole call."""
        return self._budget

    @property
    def max_distance(self) -> float:
        """The relevance floor (maximum cosine distance); 0 or less means off."""
        return self._max_distance

    @property
    def used(self) -> int:
        """Tokens spent by included candidates."""
        return self._used

    @property
    def remaining(self) -> int:
        """Tokens still available."""
        return self._budget - self._used

    @property
    def included(self) -> list[Candidate]:
        """Included candidates, in inclusion order."""
        return list(self._included)

    @property
    def decisions(self) -> list[Decision]:
        """Every decision made so far, in sequence order."""
        return list(self._decisions)

    @property
    def hidden_counts(self) -> dict[str, int]:
        """Candidates hidden by a hard filter, per reason code (only reasons that occurred)."""
        return dict(self._hidden)

    @property
    def gated_out(self) -> int:
        """Candidates excluded by the relevance floor."""
        return self._gated_out

    @property
    def considered(self) -> int:
        """Candidates decided, whatever the outcome."""
        return len(self._decisions)

    def _is_decided(self, candidate: Candidate) -> bool:
        return (candidate.kind, candidate.id) in self._decided

    def _decide(self, candidate: Candidate, outcome: str, reason_code: str) -> Decision:
        self._decided.add((candidate.kind, candidate.id))
        self._sequence += 1
        decision = Decision(self._sequence, candidate, outcome, reason_code, self._used)
        self._decisions.append(decision)
        return decision

    def _below_floor(self, candidate: Candidate) -> bool:
        nearest = max(candidate.similarity, candidate.context_similarity)
        return self._max_distance > 0 and 1.0 - nearest > self._max_distance

    def block(self, candidates: Iterable[Candidate]) -> Iterator[Decision]:
        """Decide candidates hidden by a hard filter, in score order; others are ignored.

        `conflict_open` is `blocked`, `volatility_expired` is `excluded`; no budget is spent.
        """
        for candidate in _ranked(candidates):
            reason = candidate.blocked_reason
            if reason is None or self._is_decided(candidate):
                continue
            self._hidden[reason] = self._hidden.get(reason, 0) + 1
            yield self._decide(candidate, HIDDEN_OUTCOMES[reason], reason)

    def pack(
        self,
        candidates: Iterable[Candidate],
        *,
        gated: bool = True,
        reason: str = RELEVANCE,
        skip_served: bool = False,
    ) -> Iterator[Decision]:
        """Pack candidates by descending score (ties by id) into the remaining budget.

        Order of decisions: hidden candidates (as `block`), then, when `gated` and the floor is
        on, floor exclusions (`below_relevance_floor`), then, in score order, inclusions with
        `reason` or exclusions: `over_budget` (a candidate too large is skipped and packing
        continues) or, with `skip_served`, `source_already_served` for what the packet already
        says: an episode whose event an included fact was drawn from, or a fact every source
        event of which is an included episode. Whichever of the two ranks higher is served.
        `reason` is `relevance` (main pass) or `multi_hop_expansion`.
        """
        if reason not in (RELEVANCE, MULTI_HOP_EXPANSION):
            raise ValueError(f"not an inclusion reason: {reason!r}")
        ranked = _ranked(candidates)
        return self._pack(ranked, gated=gated, reason=reason, skip_served=skip_served)

    def _already_served(self, candidate: Candidate) -> bool:
        if candidate.kind == EPISODE:
            return candidate.id in self._served_fact_sources
        return bool(candidate.sources) and candidate.sources <= self._served_episodes

    def _cost(self, candidate: Candidate) -> int:
        """What including `candidate` spends: its tokens, and with block costs the tags of the
        block (the first line served), its section's header (the first of its kind) and its
        group's header (the first of its group)."""
        costs = self._costs
        if costs is None:
            return candidate.tokens
        extra = costs.wrapper if not self._included else 0
        if candidate.kind not in self._included_kinds:
            extra += costs.facts_header if candidate.kind == FACT else costs.episodes_header
        if candidate.group and (candidate.kind, candidate.group) not in self._included_groups:
            extra += candidate.group_cost
        return candidate.tokens + extra

    def _include(self, candidate: Candidate, reason: str) -> Decision:
        self._used += self._cost(candidate)
        self._included.append(candidate)
        self._included_kinds.add(candidate.kind)
        if candidate.group:
            self._included_groups.add((candidate.kind, candidate.group))
        if candidate.kind == EPISODE:
            self._served_episodes.add(candidate.id)
        else:
            self._served_fact_sources.update(candidate.sources)
        return self._decide(candidate, INCLUDED, reason)

    def _pack(
        self, ranked: list[Candidate], *, gated: bool, reason: str, skip_served: bool
    ) -> Iterator[Decision]:
        yield from self.block(ranked)
        if gated:
            for candidate in ranked:
                if not self._is_decided(candidate) and self._below_floor(candidate):
                    self._gated_out += 1
                    yield self._decide(candidate, EXCLUDED, BELOW_RELEVANCE_FLOOR)
        for candidate in ranked:
            if self._is_decided(candidate):
                continue
            if skip_served and self._already_served(candidate):
                yield self._decide(candidate, EXCLUDED, SOURCE_ALREADY_SERVED)
            elif self._cost(candidate) <= self.remaining:
                yield self._include(candidate, reason)
            else:
                yield self._decide(candidate, EXCLUDED, OVER_BUDGET)


def packet_status(hidden_counts: dict[str, int]) -> tuple[str, list[str]]:
    """The packet `status` and its warnings; any warning makes it `degraded`."""
    warnings: list[str] = []
    conflicts = hidden_counts.get(CONFLICT_OPEN, 0)
    if conflicts > 0:
        warnings.append(f"open_conflict: {conflicts} fact(s) hidden pending conflict resolution")
    expired = hidden_counts.get(VOLATILITY_EXPIRED, 0)
    if expired > 0:
        warnings.append(
            f"volatility_expired: {expired} fact(s) hidden past their volatility horizon"
        )
    return (STATUS_DEGRADED if warnings else STATUS_OK), warnings


def empty_reason(packer: Packer) -> str:
    """`no_relevant_memory` when the relevance floor emptied the call, else ""."""
    if not packer.included and packer.gated_out > 0:
        return NO_RELEVANT_MEMORY
    return ""
