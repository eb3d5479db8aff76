"""Context assembly: one routine that yields every decision as it is made, then the packet.

`assemble` is the only path: StreamContext forwards each item as it comes, AssembleContext
collects them. After each packing pass it yields `PASS_END`: what was decided so far can be
sent together, the next decisions wait for the database.

Order of work: embed the query (meanwhile, the database to read is chosen, `reads.ReadRouter`,
and the searched terms and the scope's versions are looked up there); fetch scored fact
candidates (two-phase) and episodes, or rank them in memory where the scope cache holds the
scope at those versions (`scope_cache.py`); pack (hybrid ranking: facts and episodes in one
list; seed: the facts); if budget remains, one multi-hop pass over entities of the retained
facts (full-text only, never gated); seed only: the episodes into what remains; persist the
trace (on the primary); the packet. What the packet already says is left out
(`source_already_served`).

The multi-hop pass does not wait for the episodes: seed ranking knows its entities once the
facts are packed; hybrid ranking starts it on the entities of the facts packed alone, and runs
it again in the rare call where the packing with episodes retained other entities.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from satchel.server.config import ContextSettings
from satchel.server.domain.entities import extract_entities
from satchel.server.domain.episode_ranking import EpisodeQuery, ScopeEvents, rank_episodes
from satchel.server.domain.fact_ranking import FactQuery, FactRanking, ScopeFacts, hidden_sources
from satchel.server.domain.packing import (
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
from satchel.server.domain.rendering import excerpt
from satchel.server.domain.trace_ids import new_trace_id
from satchel.server.domain.updates import newer_first
from satchel.server.reads import ReadTarget
from satchel.server.runtime import Runtime
from satchel.server.storage import context as store
from satchel.server.storage.pool import autocommit

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
    """What the agent receives, plus the trace id under which every decision is stored."""

    trace_id: str
    facts: list[ServedFact]
    episodes: list[ServedEpisode]
    warnings: list[str]
    status: str
    empty_reason: str
    budget_tokens: int
    tokens_used: int


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


def _fact_candidate(row: dict[str, Any]) -> Candidate:
    blocked = None
    if row["in_open_conflict"]:
        blocked = CONFLICT_OPEN
    elif row["expired"]:
        blocked = VOLATILITY_EXPIRED
    return Candidate(
        id=str(row["id"]),
        kind=FACT,
        text=row["statement"],
        similarity=float(row["similarity"]),
        text_rank=float(row["text_rank"]),
        recency=float(row["recency"]),
        score=float(row["score"]),
        blocked_reason=blocked,
        sources=frozenset(str(e) for e in row["source_event_ids"]),
    )


def _fact_candidates(rows: list[dict[str, Any]]) -> list[Candidate]:
    """The rows as candidates; of two statements of one value, the newer ranks first."""
    candidates = [_fact_candidate(r) for r in rows]
    restates = {str(r["id"]): [str(o) for o in r["restates"]] for r in rows if r["restates"]}
    if not restates:
        return candidates
    since = {str(r["id"]): float(r["since_epoch"]) for r in rows}
    return newer_first(candidates, since, restates)


def _episode_candidate(row: dict[str, Any]) -> Candidate:
    return Candidate(
        id=str(row["id"]),
        kind=EPISODE,
        text=excerpt(row["text"], EPISODE_EXCERPT_CHARS),
        similarity=float(row["similarity"]),
        text_rank=float(row["text_rank"]),
        recency=float(row["recency"]),
        score=float(row["score"]),
        blocked_reason=SOURCE_FACTS_HIDDEN if row["source_facts_hidden"] else None,
        context_similarity=float(row["context_similarity"] or 0.0),
    )


def _hop_sources(packer: Packer) -> tuple[str, ...] | None:
    """The texts the multi-hop entities are drawn from: the retained facts; None when no
    budget remains (no pass)."""
    if packer.remaining <= 0:
        return None
    return tuple(c.text for c in packer.included if c.kind == FACT)


def _hop_entities(sources: tuple[str, ...] | None, query: str, max_entities: int) -> list[str]:
    """The entities of the multi-hop pass: none when no budget remains."""
    if sources is None:
        return []
    return extract_entities(sources, query, max_entities)


def _likely_hop_sources(
    request: ContextRequest, facts: list[Candidate], skip_served: bool
) -> tuple[str, ...] | None:
    """The multi-hop sources of a packing of the facts alone: hybrid packing ranks episodes
    among the facts, and mostly retains the same facts, so its pass can start on this guess
    while the episodes load (it runs again, on the right entities, when the guess missed)."""
    packer = Packer(request.budget_tokens, max_distance=request.max_distance)
    for _ in packer.pack(facts, skip_served=skip_served):
        pass
    return _hop_sources(packer)


def _done(value: Any) -> asyncio.Future[Any]:
    """An awaitable that already holds `value` (rows ranked in memory)."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _micros(instant: datetime) -> int:
    return (instant - EPOCH) // timedelta(microseconds=1)


def _held_facts(runtime: Runtime, scope: store.Scope, plan: store.QueryPlan) -> ScopeFacts | None:
    """The scope's facts when the cache holds them at the version this call reads (hybrid
    ranking, now, a scope scored exactly)."""
    cfg = runtime.settings.context
    if (
        cfg.ranking != "hybrid"
        or scope.historical
        or plan.facts_version is None
        or plan.scope_facts > cfg.exact_scope_max
    ):
        return None
    return runtime.scope_cache.facts(scope.project_id, scope.subject_id, plan.facts_version)


def _scoring(
    cfg: ContextSettings, scope: store.Scope, vector: np.ndarray, plan: store.QueryPlan
) -> dict[str, Any]:
    """What the in-memory rankings of facts and episodes share: the call's vector, terms and
    instant, and the hybrid score's weights."""
    return {
        "vector": vector,
        "terms": plan.terms,
        "idfs": plan.idfs,
        "avg_tokens": plan.avg_tokens,
        "at_epoch": scope.at.timestamp(),
        "tau_seconds": cfg.recency_tau_days * 86400.0,
        "w_similarity": cfg.weight_similarity,
        "w_text_rank": cfg.weight_text_rank,
        "w_recency": cfg.weight_recency,
    }


def _fact_query(
    cfg: ContextSettings, scope: store.Scope, vector: np.ndarray, plan: store.QueryPlan
) -> FactQuery:
    return FactQuery(
        **_scoring(cfg, scope, vector, plan),
        at_us=_micros(scope.at),
        candidate_limit=cfg.candidate_limit,
        newer_wins=cfg.newer_wins_similarity,
    )


def _held_events(runtime: Runtime, scope: store.Scope, plan: store.QueryPlan) -> ScopeEvents | None:
    """The scope's events when the cache holds them at the version this call reads (hybrid
    ranking, now, episodes asked for)."""
    cfg = runtime.settings.context
    if (
        cfg.ranking != "hybrid"
        or cfg.episode_top_k <= 0
        or scope.historical
        or plan.events_version is None
    ):
        return None
    return runtime.scope_cache.events(scope.project_id, scope.subject_id, plan.events_version)


async def ranked_episodes(
    runtime: Runtime,
    scope: store.Scope,
    vector: np.ndarray,
    plan: store.QueryPlan,
    fetch: Callable[..., Awaitable[Any]],
    events: ScopeEvents | None,
    facts: ScopeFacts | None = None,
) -> list[dict[str, Any]]:
    """The scope's best episodes: ranked in memory from the scope's `events` when held,
    otherwise by the episodes statement; whether their facts are all hidden, from the scope's
    `facts` when held."""
    cfg = runtime.settings.context
    if events is None:
        return await fetch(store.fetch_episodes, scope, vector, cfg, plan)
    query = EpisodeQuery(
        **_scoring(cfg, scope, vector, plan),
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
        hidden = await fetch(store.fetch_hidden_sources, scope, cfg, ids)
    return [
        {
            "id": events.ids[r.position],
            "kind": events.kinds[r.position],
            "occurred_at": events.occurred_at[r.position],
            "text": events.texts[r.position],
            "similarity": r.similarity,
            "text_rank": r.text_rank,
            "recency": r.recency,
            "score": r.score,
            "context_similarity": r.context_similarity,
            "source_facts_hidden": hidden[events.ids[r.position]],
        }
        for r in ranked
    ]


def _served_fact(row: dict[str, Any]) -> ServedFact:
    return ServedFact(
        id=str(row["id"]),
        predicate=row["predicate"],
        value=row["value"],
        statement=row["statement"],
        confidence=float(row["confidence"]),
        valid_from=row["valid_from"],
        source_event_ids=[str(e) for e in row["source_event_ids"]],
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


async def assemble(
    runtime: Runtime, request: ContextRequest, trace_id: uuid.UUID | None = None
) -> AsyncIterator[Decision | PassEnd | Packet]:
    """Yield each packing decision as it is made (`PASS_END` after each pass), then the
    persisted call's Packet."""
    cfg = runtime.settings.context
    trace_id = trace_id or new_trace_id()
    timer = _Timer()
    scope = store.Scope(
        request.project_id,
        request.subject_id,
        at=request.as_of or datetime.now(UTC),
        historical=request.as_of is not None,
    )
    reads = runtime.reads

    async def choose_and_plan() -> tuple[ReadTarget, store.QueryPlan]:
        target = await reads.choose(request.min_consistency_token)
        return target, await reads.run(
            target, store.plan_query, scope, request.query, cfg, planned=True
        )

    # Where to read, the searched words and the scope's size need no vector: found while
    # embedding (the statement is sent before the query is embedded, `Runtime.embed_query`).
    planning = asyncio.ensure_future(choose_and_plan())
    try:
        vector = await runtime.embed_query(request.query)
        target, plan = await planning
    finally:
        planning.cancel()
    mark = timer.add("embed", timer.started)

    def fetch(query: Any, *args: Any) -> Any:
        # A connection per query: none is held while decisions are streamed to the client.
        return reads.run(target, query, *args, planned=True)

    packer = Packer(request.budget_tokens, max_distance=request.max_distance)
    skip = cfg.skip_served_episodes
    # Hybrid: facts and episodes in one ranked list, a restated value's newest statement
    # first (the SQL finds restatements in hybrid ranking only); seed: facts, multi-hop, then
    # episodes.
    hybrid = cfg.ranking == "hybrid"
    held = _held_facts(runtime, scope, plan)
    held_events = _held_events(runtime, scope, plan)
    if held is not None:
        in_memory = FactRanking(held, _fact_query(cfg, scope, vector, plan))
        facts_task = _done(in_memory.candidates())
    else:
        facts_task = asyncio.ensure_future(
            fetch(store.fetch_fact_candidates, scope, vector, cfg, plan)
        )
    episodes = ranked_episodes(runtime, scope, vector, plan, fetch, held_events, held)
    episodes_task = asyncio.ensure_future(episodes)
    hop_task: asyncio.Future[list[dict[str, Any]]] | None = None
    unused: list[asyncio.Future[list[dict[str, Any]]]] = []  # passes on a wrong guess
    try:
        rows = await facts_task
        mark = timer.add("retrieve", mark)
        rows_by_id = {str(r["id"]): r for r in rows}
        fact_candidates = _fact_candidates(rows)
        text_full = float(rows[0]["text_full"]) if rows else None

        def multi_hop(entities: list[str]) -> asyncio.Future[list[dict[str, Any]]]:
            seen = list(rows_by_id)
            if held is not None:
                per_entity = cfg.multi_hop_max_per_entity
                hops = in_memory.multi_hop(
                    entities, set(seen), text_full or 1.0, per_entity, store.MULTI_HOP_SCAN_LIMIT
                )
                return _done(hops)
            hop = fetch(
                store.fetch_multi_hop, *(scope, vector, cfg, plan, entities, seen, text_full)
            )
            return asyncio.ensure_future(hop)

        if not hybrid:  # the facts are packed first: their multi-hop pass runs with the episodes
            for decision in packer.pack(fact_candidates, skip_served=skip):
                yield decision
            yield PASS_END
            mark = timer.add("pack", mark)
            hop_sources = _hop_sources(packer)
        elif held is None or held_events is None:
            # the pass a packing of the facts alone would need, run while episodes load
            hop_sources = _likely_hop_sources(request, fact_candidates, skip)
        else:  # all in memory: nothing to overlap, the pass runs on the packing's entities
            hop_sources = None
        hop_entities = _hop_entities(hop_sources, request.query, cfg.multi_hop_max_entities)
        if hop_entities:
            hop_task = multi_hop(hop_entities)
        episodes = await episodes_task
        mark = timer.add("retrieve", mark)
        episode_rows = {str(r["id"]): r for r in episodes}
        episode_candidates = [_episode_candidate(r) for r in episodes]
        if hybrid:
            for decision in packer.pack(fact_candidates + episode_candidates, skip_served=skip):
                yield decision
            yield PASS_END
            mark = timer.add("pack", mark)
            sources = _hop_sources(packer)
            entities = (
                hop_entities
                if sources == hop_sources
                else _hop_entities(sources, request.query, cfg.multi_hop_max_entities)
            )
            if entities != hop_entities:  # the guess missed: the pass the packing needs
                if hop_task is not None:
                    unused.append(hop_task)  # left to end: cancelling a query costs more
                hop_task = multi_hop(entities) if entities else None

        if hop_task is not None:
            hops = await hop_task
            mark = timer.add("retrieve", mark)
            rows_by_id.update((str(r["id"]), r) for r in hops)
            hop_pass = packer.pack(
                _fact_candidates(hops), gated=False, reason=MULTI_HOP_EXPANSION, skip_served=skip
            )
            for decision in hop_pass:
                yield decision
            yield PASS_END
            mark = timer.add("pack", mark)
        await asyncio.gather(*unused, return_exceptions=True)
    finally:
        for task in (facts_task, episodes_task, hop_task, *unused):
            if task is not None and not task.done():
                task.cancel()

    if not hybrid:
        for decision in packer.pack(episode_candidates, skip_served=skip):
            yield decision
        yield PASS_END
        timer.add("pack", mark)

    status, warnings = packet_status(packer.hidden_counts)
    facts = [_served_fact(rows_by_id[c.id]) for c in packer.included if c.kind == FACT]
    served_episodes = [
        ServedEpisode(c.id, episode_rows[c.id]["kind"], episode_rows[c.id]["occurred_at"], c.text)
        for c in packer.included
        if c.kind == EPISODE
    ]
    packet = Packet(
        trace_id=str(trace_id),
        facts=facts,
        episodes=served_episodes,
        warnings=warnings,
        status=status,
        empty_reason=empty_reason(packer),
        budget_tokens=request.budget_tokens,
        tokens_used=packer.used,
    )
    call = store.CallRecord(
        trace_id=trace_id,
        project_id=request.project_id,
        subject_id=request.subject_id,
        query=request.query,
        budget_tokens=request.budget_tokens,
        as_of=request.as_of,
        status=status,
        warnings=warnings,
        empty_reason=packet.empty_reason,
        tokens_used=packer.used,
        facts_served=len(facts),
        episodes_served=len(served_episodes),
        embed_ms=timer.spans.get("embed", 0.0),
        retrieve_ms=timer.spans.get("retrieve", 0.0),
        pack_ms=timer.spans.get("pack", 0.0),
        total_ms=timer.total_ms(),
    )
    decision_rows = [_trace_row(d) for d in packer.decisions]
    async with autocommit(runtime.pool) as conn:  # the primary's
        await store.save_trace(conn, call, decision_rows, durable=cfg.trace_durable_commit)
    runtime.telemetry.observe_call(call)
    yield packet
