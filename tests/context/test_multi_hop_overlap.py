"""The multi-hop pass of hybrid ranking starts before the episodes arrive, on a guess of its
entities, and runs again on the right ones when the guess missed (server/context/service.py).

The database is replaced by crafted rows: what is tested is the order of the work, not the
SQL (tests/test_context*.py run the multi-hop pass against the real database)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from satchel.server.context import service as assembly
from satchel.server.context.domain.packing import MULTI_HOP_EXPANSION
from satchel.server.context.domain.scored import FactCandidates, ScoredEpisode, ScoredFact
from satchel.server.context.service import Packet
from satchel.server.context.storage.plan import QueryPlan
from satchel.server.embedding.fake import FakeEmbedder
from satchel.server.platform import reads
from satchel.server.platform.config import ContextSettings, Settings
from satchel.server.platform.runtime import Runtime
from satchel.server.platform.tokens import estimate_tokens


def _fact(fact_id: str, statement: str, score: float) -> ScoredFact:
    return ScoredFact(
        id=fact_id, predicate="note", value=statement, statement=statement,
        confidence=1.0, valid_from=None, source_event_ids=[], since_epoch=0.0,
        similarity=score, text_rank=0.0, recency=0.0, score=score,
        expired=False, in_open_conflict=False,
    )  # fmt: skip


EPISODE_TEXT = "We talked for a long while about the garden and the weather. " * 4
FACTS = [_fact("f1", "Bruno likes tea", 0.9), _fact("f2", "Carla bakes Carla's cake", 0.5)]
EPISODE = ScoredEpisode(
    id="e1", kind="message", occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
    text=EPISODE_TEXT, similarity=0.8, text_rank=0.0, recency=0.0, score=0.8,
    context_similarity=0.0, source_facts_hidden=False,
)  # fmt: skip


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Crafted rows for every statement; returns the entities of each multi-hop pass run."""
    hops: list[list[str]] = []

    @contextlib.asynccontextmanager
    async def no_connection(pool: Any) -> AsyncIterator[None]:
        yield None

    async def plan(conn: Any, scope: Any, query: str, cfg: Any) -> QueryPlan:
        return QueryPlan(terms=[], scope_facts=len(FACTS))

    async def facts(*args: Any, **kwargs: Any) -> FactCandidates:
        return FactCandidates(list(FACTS), text_full=1.0)

    async def episodes(*args: Any, **kwargs: Any) -> list[ScoredEpisode]:
        await asyncio.sleep(0.05)  # the episodes arrive last
        return [EPISODE]

    async def multi_hop(conn: Any, scope: Any, vector: Any, cfg: Any, plan: Any,
                        entities: list[str], *rest: Any) -> list[ScoredFact]:  # fmt: skip
        hops.append(list(entities))
        return [_fact("hop-" + "+".join(entities), "x", 0.1)]

    async def save_trace(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(assembly, "autocommit", no_connection)  # the trace's
    monkeypatch.setattr(reads, "autocommit", no_connection)  # the reads'
    monkeypatch.setattr(assembly, "plan_query", plan)
    monkeypatch.setattr(assembly, "fetch_fact_candidates", facts)
    monkeypatch.setattr(assembly, "fetch_episodes", episodes)
    monkeypatch.setattr(assembly, "fetch_multi_hop", multi_hop)
    monkeypatch.setattr(assembly, "save_trace", save_trace)
    return hops


async def _assemble(ranking: str, budget: int) -> tuple[list[Any], Packet]:
    # the budgets below are the served texts' estimates (the items budget)
    settings = Settings(context=ContextSettings(ranking=ranking, budget_counts="items"))
    runtime = Runtime(settings=settings, pool=None, embedder=FakeEmbedder())  # type: ignore[arg-type]
    request = assembly.ContextRequest("p", "s", "What do they like?", budget)
    items = [item async for item in assembly.assemble(runtime, request)]
    packet = items[-1]
    assert isinstance(packet, Packet)
    return [item for item in items[:-1] if not isinstance(item, assembly.PassEnd)], packet


def _hop_ids(decisions: list[Any]) -> list[str]:
    return [d.candidate.id for d in decisions if d.reason_code == MULTI_HOP_EXPANSION]


async def test_a_missed_guess_runs_the_pass_again_on_the_retained_facts_entities(
    database: list[list[str]],
) -> None:
    # Room for f1 and the episode but not f2: packed alone, the facts retain f1 and f2.
    budget = estimate_tokens("Bruno likes tea") + estimate_tokens(EPISODE_TEXT) + 1
    decisions, packet = await _assemble("hybrid", budget)
    assert database == [["Carla", "Bruno"], ["Bruno"]], "the guess, then the retained facts'"
    assert _hop_ids(decisions) == ["hop-Bruno"]
    assert [f.id for f in packet.facts] == ["f1", "hop-Bruno"]


async def test_a_right_guess_is_the_only_pass(database: list[list[str]]) -> None:
    decisions, _ = await _assemble("hybrid", budget=4000)  # everything fits: the same facts
    assert database == [["Carla", "Bruno"]]
    assert _hop_ids(decisions) == ["hop-Carla+Bruno"]


async def test_seed_ranking_runs_its_pass_on_the_packed_facts(database: list[list[str]]) -> None:
    decisions, _ = await _assemble("seed", budget=4000)
    assert database == [["Carla", "Bruno"]]
    assert _hop_ids(decisions) == ["hop-Carla+Bruno"]
