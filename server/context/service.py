"""Context assembly: one routine that yields every decision as it is made, then the packet.

`assemble` is the only path: StreamContext forwards each item as it comes, AssembleContext
collects them. After each packing pass it yields `PASS_END`: what was decided so far can be
sent together, the next decisions wait for the database. A call (`ContextCall`) runs these
stages, in this order:

1. **plan**: embed the query; meanwhile the database to read is chosen (`reads.ReadRouter`) and
   the searched terms, the scope's size and its versions are looked up there.
2. **candidates**: the scored facts (two-phase) and episodes, ranked in memory where the scope
   cache holds the scope at those versions (`scope_cache.py`), else by the statements
   (`storage/`); both return the typed rows of `domain/scored.py`, scored as `domain/score.py`
   defines.
3. **pack**: greedy packing under the budget (`domain/packing.py`): hybrid ranking packs facts
   and episodes in one list, the seed the facts alone (`ranking.py` says which).
4. **expand**: if budget remains, one multi-hop pass over the entities of the retained facts
   (full-text only, never gated); the seed then packs the episodes into what remains.
5. **trace**: the decisions and the call persisted (on the primary); the packet.

What the packet already says is left out (`source_already_served`). The multi-hop pass does not
wait for the episodes: the seed knows its entities once the facts are packed; hybrid ranking
starts it on the entities of the facts packed alone, and runs it again in the rare call where
the packing with episodes retained other entities.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from satchel.server.context.domain.block import (
    BlockCosts,
    Entry,
    episode_entry,
    fact_entry,
    render_block,
)
from satchel.server.context.domain.entities import extract_entities
from satchel.server.context.domain.episode_ranking import EpisodeQuery, ScopeEvents, rank_episodes
from satchel.server.context.domain.fact_ranking import (
    FactQuery,
    FactRanking,
    ScopeFacts,
    hidden_sources,
)
from satchel.server.context.domain.packing import (
    CONFLICT_OPEN,
    EPISODE,
    FACT,
    MULTI_HOP_EXPANSION,
    SOURCE_FACTS_HIDDEN,
    VOLATILITY_EXPIRED,
    Candidate,
    Decision,
    Packer,
    empty_reason,
    packet_status,
)
from satchel.server.context.domain.scored import FactCandidates, ScoredEpisode, ScoredFact
from satchel.server.context.domain.trace_ids import new_trace_id
from satchel.server.context.domain.updates import newer_first
from satchel.server.context.ranking import Ranking, ranking_of
from satchel.server.context.storage.candidates import fetch_fact_candidates
from satchel.server.context.storage.episodes import fetch_episodes, fetch_hidden_sources
from satchel.server.context.storage.multi_hop import fetch_multi_hop
from satchel.server.context.storage.plan import QueryPlan, plan_query
from satchel.server.context.storage.sql import MULTI_HOP_SCAN_LIMIT, Scope
from satchel.server.context.storage.traces import CallRecord, save_trace
from satchel.server.memory.domain.rendering import excerpt
from satchel.server.platform.config import ContextSettings
from satchel.server.platform.runtime import Runtime
from satchel.server.platform.storage.pool import autocommit
from satchel.server.platform.tokens import ESTIMATE, TokenCounter

T = TypeVar("T")

EPISODE_EXCERPT_CHARS = 600
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PREVIEW_CHARS = 160


@dataclass(frozen=True)
class ContextRequest:
    """A validated context call."""

    project_id: str
    subject_id: str
    query: str
    budget_tokens: int
    as_of: datetime | None = None
    # The relevance floor of this call (cosine distance; 0: off).
    max_distance: float = 0.0
    # A write's consistency token this call must see (read replicas); empty: none.
    min_consistency_token: str = ""


@dataclass(frozen=True)
class ServedFact:
    id: str
    predicate: str
    value: Any
    statement: str
    confidence: float
    valid_from: datetime | None
    source_event_ids: list[str]


@dataclass(frozen=True)
class ServedEpisode:
    event_id: str
    kind: str
    occurred_at: datetime
    excerpt: str


@dataclass(frozen=True)
class Packet:
    """What the agent receives, plus the trace id under which every decision is stored.
    `block`: the packet rendered for a prompt (`domain/block.py`); `tokens_used`: its tokens
    as `token_counter` counts them (`block:<counter>`), or with SATCHEL_BUDGET_COUNTS=items
    the sum of the served texts' estimates (`items:chars/4`)."""

    trace_id: str
    facts: list[ServedFact]
    episodes: list[ServedEpisode]
    warnings: list[str]
    status: str
    empty_reason: str
    budget_tokens: int
    tokens_used: int
    block: str = ""
    token_counter: str = ""


@dataclass(frozen=True)
class Budget:
    """How a call's budget counts (SATCHEL_BUDGET_COUNTS): the rendered block's tokens with
    `counter`, or (`block` False) the seed's sum of the served texts' estimates; the block's
    `layout` (SATCHEL_BLOCK_LAYOUT)."""

    tokens: int
    counter: TokenCounter
    block: bool
    layout: str

    @classmethod
    def of(cls, tokens: int, counter: TokenCounter, context: ContextSettings) -> Budget:
        """A budget of `tokens` counted as `context` says (SATCHEL_BUDGET_COUNTS, _BLOCK_LAYOUT)."""
        return cls(tokens, counter, context.budget_counts == "block", context.block_layout)

    @cached_property
    def costs(self) -> BlockCosts | None:
        """What packing charges beyond the lines (None: nothing, the items budget); counted
        once a call, whatever the packers it makes."""
        return BlockCosts.of(self.counter) if self.block else None

    def line_cost(self, line: str) -> int | None:
        """What a candidate's line costs (None: its text's estimate, the items budget)."""
        return self.counter.bound(line) if self.block else None

    def group_cost(self, group: str) -> int:
        """What a group's header costs with its first item (0: none, or the items budget)."""
        return self.counter.bound(group) if self.block and group else 0

    def fact_entry(self, fact: ServedFact | ScoredFact) -> Entry:
        """The fact's place in this call's block layout."""
        return fact_entry(
            fact.statement,
            fact.predicate,
            fact.value,
            fact.valid_from,
            fact.confidence,
            self.layout,
        )

    def episode_entry(self, occurred_at: datetime | None, kind: str, excerpt: str) -> Entry:
        """The episode's place in this call's block layout."""
        return episode_entry(occurred_at, kind, excerpt, self.layout)

    @property
    def counter_name(self) -> str:
        return f"block:{self.counter.name}" if self.block else f"items:{ESTIMATE}"

    def render(
        self, facts: list[ServedFact], episodes: list[ServedEpisode], warnings: list[str]
    ) -> tuple[str, int | None]:
        """The packet's block and, for a block budget, its tokens (the notes are kept when
        they fit)."""
        counted: dict[str, int] = {}  # the block with its notes is counted once, kept or not

        def count(text: str) -> int:
            if text not in counted:
                counted[text] = self.counter.count(text)
            return counted[text]

        block = render_block(
            [self.fact_entry(f) for f in facts],
            [self.episode_entry(e.occurred_at, e.kind, e.excerpt) for e in episodes],
            warnings,
            fits=(lambda text: count(text) <= self.tokens) if self.block else None,
        )
        if not self.block:
            return block, None
        return block, count(block) if block else 0


def budget_of(runtime: Runtime, budget_tokens: int) -> Budget:
    """A call's budget under the server's settings."""
    return Budget.of(budget_tokens, runtime.tokens, runtime.settings.context)


@dataclass(frozen=True)
class PassEnd:
    """The end of a packing pass (the decisions before it are all there is until the next)."""


PASS_END = PassEnd()


@dataclass
class _Timer:
    started: float = field(default_factory=time.perf_counter)
    spans: dict[str, float] = field(default_factory=dict)

    def add(self, span: str, since: float) -> float:
        now = time.perf_counter()
        self.spans[span] = self.spans.get(span, 0.0) + (now - since) * 1000
        return now

    def total_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000


def _fact_candidates(rows: list[ScoredFact], budget: Budget) -> list[Candidate]:
    """The rows as packing candidates; of two statements of one value, the newer ranks first."""
    candidates = [_fact_candidate(r, budget) for r in rows]
    restates = {r.id: r.restates for r in rows if r.restates}
    if not restates:
        return candidates
    return newer_first(candidates, {r.id: r.since_epoch for r in rows}, restates)


def _fact_candidate(row: ScoredFact, budget: Budget) -> Candidate:
    hidden = VOLATILITY_EXPIRED if row.expired else None
    entry = budget.fact_entry(row)
    return Candidate(
        id=row.id,
        kind=FACT,
        text=row.statement,
        similarity=row.similarity,
        text_rank=row.text_rank,
        recency=row.recency,
        score=row.score,
        blocked_reason=CONFLICT_OPEN if row.in_open_conflict else hidden,
        sources=frozenset(row.source_event_ids),
        cost=budget.line_cost(entry.line),
        group=entry.group,
        group_cost=budget.group_cost(entry.group),
    )


def _episode_candidate(row: ScoredEpisode, budget: Budget) -> Candidate:
    text = excerpt(row.text, EPISODE_EXCERPT_CHARS)
    entry = budget.episode_entry(row.occurred_at, row.kind, text)
    return Candidate(
        id=row.id,
        kind=EPISODE,
        text=text,
        similarity=row.similarity,
        text_rank=row.text_rank,
        recency=row.recency,
        score=row.score,
        blocked_reason=SOURCE_FACTS_HIDDEN if row.source_facts_hidden else None,
        context_similarity=row.context_similarity,
        cost=budget.line_cost(entry.line),
        group=entry.group,
        group_cost=budget.group_cost(entry.group),
    )


def _served_fact(row: ScoredFact) -> ServedFact:
    return ServedFact(
        row.id,
        row.predicate,
        row.value,
        row.statement,
        row.confidence,
        row.valid_from,
        row.source_event_ids,
    )


def _trace_row(decision: Decision) -> tuple[Any, ...]:
    c = decision.candidate
    return (
        decision.sequence,
        c.id,
        c.kind,
        decision.outcome,
        decision.reason_code,
        c.score,
        c.similarity,
        c.text_rank,
        c.recency,
        c.tokens,
        decision.budget_used,
        c.text[:PREVIEW_CHARS],
    )


def _done(value: T) -> asyncio.Future[T]:
    """An awaitable that already holds `value` (rows ranked in memory)."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _micros(instant: datetime) -> int:
    return (instant - EPOCH) // timedelta(microseconds=1)


def _hop_sources(packer: Packer) -> tuple[str, ...] | None:
    """The texts the multi-hop entities are drawn from: the retained facts; None when no
    budget remains (no pass)."""
    if packer.remaining <= 0:
        return None
    return tuple(c.text for c in packer.included if c.kind == FACT)


def fact_query(
    ranking: Ranking,
    cfg: ContextSettings,
    scope: Scope,
    vector: np.ndarray,
    plan: QueryPlan,
) -> FactQuery:
    """What ranks a call's facts in memory (the exact statement's parameters)."""
    return FactQuery(
        vector=vector,
        terms=plan.terms,
        idfs=plan.idfs,
        avg_tokens=plan.avg_tokens,
        at_epoch=scope.at.timestamp(),
        at_us=_micros(scope.at),
        weights=ranking.weights,
        candidate_limit=cfg.candidate_limit,
        newer_wins=ranking.newer_wins_similarity,
    )


def held_facts(
    runtime: Runtime, ranking: Ranking, scope: Scope, plan: QueryPlan
) -> ScopeFacts | None:
    """The scope's facts when the cache holds them at the version this call reads (a ranking
    that ranks in memory, now, a scope scored exactly)."""
    cfg = runtime.settings.context
    if (
        not ranking.ranks_in_memory
        or scope.historical
        or plan.facts_version is None
        or plan.scope_facts > cfg.exact_scope_max
    ):
        return None
    return runtime.scope_cache.facts(scope.project_id, scope.subject_id, plan.facts_version)


def held_events(
    runtime: Runtime, ranking: Ranking, scope: Scope, plan: QueryPlan
) -> ScopeEvents | None:
    """The scope's events when the cache holds them at the version this call reads (a ranking
    that ranks in memory, now, episodes asked for)."""
    if (
        not ranking.ranks_in_memory
        or runtime.settings.context.episode_top_k <= 0
        or scope.historical
        or plan.events_version is None
    ):
        return None
    return runtime.scope_cache.events(scope.project_id, scope.subject_id, plan.events_version)


async def ranked_episodes(
    runtime: Runtime,
    ranking: Ranking,
    scope: Scope,
    vector: np.ndarray,
    plan: QueryPlan,
    fetch: Callable[..., Awaitable[Any]],
    events: ScopeEvents | None,
    facts: ScopeFacts | None = None,
    cfg: ContextSettings | None = None,
) -> list[ScoredEpisode]:
    """The scope's best episodes: ranked in memory from the scope's `events` when held,
    otherwise by the episodes statement; whether their facts are all hidden, from the scope's
    `facts` when held. `cfg`: the call's settings (`ContextSettings.for_budget`), else the
    server's."""
    cfg = cfg if cfg is not None else runtime.settings.context
    if events is None:
        if not plan.scope_events:  # no statement for a scope that has no events
            return []
        rows: list[ScoredEpisode] = await fetch(fetch_episodes, scope, vector, cfg, plan)
        return rows
    query = EpisodeQuery(
        vector=vector,
        terms=plan.terms,
        idfs=plan.idfs,
        avg_tokens=plan.avg_tokens,
        at_epoch=scope.at.timestamp(),
        weights=ranking.weights,
        pool=cfg.episode_pool,
        k=cfg.episode_top_k,
        context_weight=cfg.episode_context_weight,
        gap_us=round(cfg.episode_context_gap_seconds * 1e6),
    )
    ranked = rank_episodes(events, query)
    ids = [events.ids[r.position] for r in ranked]
    if facts is not None:
        hidden = hidden_sources(facts, _micros(scope.at), ids)
    else:
        hidden = await fetch(fetch_hidden_sources, scope, cfg, ids)
    return [
        ScoredEpisode(
            id=events.ids[r.position],
            kind=events.kinds[r.position],
            occurred_at=events.occurred_at[r.position],
            text=events.texts[r.position],
            similarity=r.similarity,
            text_rank=r.text_rank,
            recency=r.recency,
            score=r.score,
            context_similarity=r.context_similarity,
            source_facts_hidden=hidden[events.ids[r.position]],
        )
        for r in ranked
    ]


@dataclass
class _Candidates:
    """A call's candidates as they arrive: facts first, then episodes; its multi-hop pass, and
    the passes run on a guess that missed (left to end: cancelling a query costs more)."""

    facts: asyncio.Future[FactCandidates]
    episodes: asyncio.Future[list[ScoredEpisode]]
    hop: asyncio.Future[list[ScoredFact]] | None = None
    unused: list[asyncio.Future[list[ScoredFact]]] = field(default_factory=list)

    def cancel(self) -> None:
        for task in (self.facts, self.episodes, self.hop, *self.unused):
            if task is not None and not task.done():
                task.cancel()


class ContextCall:
    """One context call through its stages: `plan`, `candidates`, `passes` (pack and expand),
    `record` (see the module's docstring)."""

    def __init__(self, runtime: Runtime, request: ContextRequest, trace_id: uuid.UUID) -> None:
        self.runtime = runtime
        self.request = request
        self.trace_id = trace_id
        self.cfg = runtime.settings.context.for_budget(request.budget_tokens)
        self.ranking = ranking_of(self.cfg)
        self.timer = _Timer()
        self.mark = self.timer.started
        self.scope = Scope(
            request.project_id,
            request.subject_id,
            at=request.as_of or datetime.now(UTC),
            historical=request.as_of is not None,
        )
        self.budget = budget_of(runtime, request.budget_tokens)
        self.packer = self._packer()
        self.facts: dict[str, ScoredFact] = {}
        self.episodes: dict[str, ScoredEpisode] = {}

    def _packer(self) -> Packer:
        return Packer(
            self.request.budget_tokens,
            max_distance=self.request.max_distance,
            costs=self.budget.costs,
        )

    def _span(self, name: str) -> None:
        self.mark = self.timer.add(name, self.mark)

    # --- 1. plan ------------------------------------------------------------------------------

    async def plan(self) -> None:
        """Embed the query; meanwhile, choose where to read and plan the call there (the
        statement is sent before the query is embedded, `Runtime.embed_query`)."""
        reads = self.runtime.reads

        async def choose_and_plan() -> tuple[Any, QueryPlan]:
            target = await reads.choose(self.request.min_consistency_token)
            plan = await reads.run(
                target, plan_query, self.scope, self.request.query, self.cfg, planned=True
            )
            return target, plan

        planning = asyncio.ensure_future(choose_and_plan())
        try:
            self.vector = await self.runtime.embed_query(self.request.query)
            self.target, self.query_plan = await planning
        finally:
            planning.cancel()
        self._span("embed")
        self.held_facts = held_facts(self.runtime, self.ranking, self.scope, self.query_plan)
        self.held_events = held_events(self.runtime, self.ranking, self.scope, self.query_plan)
        self.in_memory = (
            None
            if self.held_facts is None
            else FactRanking(
                self.held_facts,
                fact_query(self.ranking, self.cfg, self.scope, self.vector, self.query_plan),
            )
        )

    def _fetch(self, statement: Any, *args: Any) -> Any:
        # A connection per statement: none is held while decisions are streamed to the client.
        return self.runtime.reads.run(self.target, statement, *args, planned=True)

    # --- 2. candidates ------------------------------------------------------------------------

    def candidates(self) -> _Candidates:
        """Start retrieving the facts and the episodes (in memory when the scope is held)."""
        if self.in_memory is not None:
            facts = _done(self.in_memory.candidates())
        else:
            facts = asyncio.ensure_future(
                self._fetch(
                    fetch_fact_candidates, self.scope, self.vector, self.cfg, self.query_plan
                )
            )
        episodes = ranked_episodes(
            self.runtime,
            self.ranking,
            self.scope,
            self.vector,
            self.query_plan,
            self._fetch,
            self.held_events,
            self.held_facts,
            self.cfg,
        )
        return _Candidates(facts, asyncio.ensure_future(episodes))

    def _multi_hop(
        self, entities: list[str], text_full: float | None
    ) -> asyncio.Future[list[ScoredFact]]:
        """The multi-hop pass over `entities`, excluding the facts already candidates."""
        seen = list(self.facts)
        if self.in_memory is not None:
            per_entity = self.cfg.multi_hop_max_per_entity
            return _done(
                self.in_memory.multi_hop(
                    entities, set(seen), text_full or 1.0, per_entity, MULTI_HOP_SCAN_LIMIT
                )
            )
        args = (self.scope, self.vector, self.cfg, self.query_plan, entities, seen, text_full)
        pass_: asyncio.Future[list[ScoredFact]] = asyncio.ensure_future(
            self._fetch(fetch_multi_hop, *args)
        )
        return pass_

    def _entities(self, sources: tuple[str, ...] | None) -> list[str]:
        """The multi-hop entities of these retained facts' texts (none: no budget left)."""
        if sources is None:
            return []
        return extract_entities(sources, self.request.query, self.cfg.multi_hop_max_entities)

    # --- 3 and 4. pack and expand -------------------------------------------------------------

    def _pack(self, candidates: list[Candidate], **how: Any) -> Any:
        return self.packer.pack(candidates, skip_served=self.cfg.skip_served_episodes, **how)

    def _likely_hop_sources(self, facts: list[Candidate]) -> tuple[str, ...] | None:
        """The multi-hop sources of a packing of the facts alone: hybrid packing ranks episodes
        among the facts and mostly retains the same facts, so its pass can start on this
        guess while the episodes load."""
        packer = self._packer()
        for _ in packer.pack(facts, skip_served=self.cfg.skip_served_episodes):
            pass
        return _hop_sources(packer)

    async def passes(self, found: _Candidates) -> AsyncIterator[Decision | PassEnd]:
        """The packing passes' decisions, each pass followed by `PASS_END`."""
        candidates = await found.facts
        self._span("retrieve")
        self.facts = {r.id: r for r in candidates.facts}
        facts = _fact_candidates(candidates.facts, self.budget)
        together = self.ranking.packs_episodes_with_facts

        if not together:  # the facts first: their multi-hop pass runs while episodes load
            for decision in self._pack(facts):
                yield decision
            yield PASS_END
            self._span("pack")
            guess = _hop_sources(self.packer)
        elif self.held_facts is None or self.held_events is None:
            guess = self._likely_hop_sources(facts)  # run while the episodes load
        else:  # all in memory: nothing to overlap, the pass runs on the packing's entities
            guess = None
        entities = self._entities(guess)
        if entities:
            found.hop = self._multi_hop(entities, candidates.text_full)

        episode_rows = await found.episodes
        self._span("retrieve")
        self.episodes = {r.id: r for r in episode_rows}
        episodes = [_episode_candidate(r, self.budget) for r in episode_rows]
        if together:
            for decision in self._pack(facts + episodes):
                yield decision
            yield PASS_END
            self._span("pack")
            retained = _hop_sources(self.packer)
            needed = entities if retained == guess else self._entities(retained)
            if needed != entities:  # the guess missed: the pass the packing needs
                if found.hop is not None:
                    found.unused.append(found.hop)
                entities = needed
                found.hop = self._multi_hop(entities, candidates.text_full) if entities else None

        if found.hop is not None:
            hops = await found.hop
            self._span("retrieve")
            self.facts.update((r.id, r) for r in hops)
            expansion = self._pack(
                _fact_candidates(hops, self.budget), gated=False, reason=MULTI_HOP_EXPANSION
            )
            for decision in expansion:
                yield decision
            yield PASS_END
            self._span("pack")
        await asyncio.gather(*found.unused, return_exceptions=True)

        if not together:
            for decision in self._pack(episodes):
                yield decision
            yield PASS_END
            self._span("pack")

    # --- 5. trace -----------------------------------------------------------------------------

    async def record(self) -> Packet:
        """Persist the call and its decisions (on the primary); the packet."""
        packer, request = self.packer, self.request
        status, warnings = packet_status(packer.hidden_counts)
        facts = [_served_fact(self.facts[c.id]) for c in packer.included if c.kind == FACT]
        episodes = [
            ServedEpisode(c.id, self.episodes[c.id].kind, self.episodes[c.id].occurred_at, c.text)
            for c in packer.included
            if c.kind == EPISODE
        ]
        block, block_tokens = self.budget.render(facts, episodes, warnings)
        packet = Packet(
            trace_id=str(self.trace_id),
            facts=facts,
            episodes=episodes,
            warnings=warnings,
            status=status,
            empty_reason=empty_reason(packer),
            budget_tokens=request.budget_tokens,
            tokens_used=packer.used if block_tokens is None else block_tokens,
            block=block,
            token_counter=self.budget.counter_name,
        )
        spans = self.timer.spans
        call = CallRecord(
            trace_id=self.trace_id,
            project_id=request.project_id,
            subject_id=request.subject_id,
            query=request.query,
            budget_tokens=request.budget_tokens,
            as_of=request.as_of,
            status=status,
            warnings=warnings,
            empty_reason=packet.empty_reason,
            tokens_used=packet.tokens_used,
            facts_served=len(facts),
            episodes_served=len(episodes),
            embed_ms=spans.get("embed", 0.0),
            retrieve_ms=spans.get("retrieve", 0.0),
            pack_ms=spans.get("pack", 0.0),
            total_ms=self.timer.total_ms(),
        )
        decision_rows = [_trace_row(d) for d in packer.decisions]
        async with autocommit(self.runtime.pool) as conn:  # the primary's
            await save_trace(conn, call, decision_rows, durable=self.cfg.trace_durable_commit)
        self.runtime.telemetry.observe_call(call)
        return packet


async def assemble(
    runtime: Runtime, request: ContextRequest, trace_id: uuid.UUID | None = None
) -> AsyncIterator[Decision | PassEnd | Packet]:
    """Yield each packing decision as it is made (`PASS_END` after each pass), then the
    persisted call's Packet."""
    call = ContextCall(runtime, request, trace_id or new_trace_id())
    await call.plan()
    found = call.candidates()
    try:
        async for item in call.passes(found):
            yield item
    finally:
        found.cancel()
    yield await call.record()
