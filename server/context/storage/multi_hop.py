"""Multi-hop: the facts that share an entity with the retained ones (no new embedding)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from psycopg import AsyncConnection

from satchel.server.context.domain.scored import ScoredFact
from satchel.server.context.ranking import ranking_of
from satchel.server.context.storage.plan import QueryPlan
from satchel.server.context.storage.sql import Scope, call_params, for_scope, render
from satchel.server.platform.config import ContextSettings
from satchel.server.platform.storage.pool import generic_plans, per_call_plans
from satchel.server.platform.storage.statements import fetch_all

# Multi-hop: per entity, the facts mentioning it that lie nearest to the query (the query's
# vector is reused: no new embedding), then the usual scoring of those few. An entity found in
# very many facts is searched among its first `hop_scan_limit` matches only, which bounds the
# cost of a common name (a documented trade-off, like phase 1's K). A large scope finds the
# mentions through the text index (GIN: the scope's own when it has one); a small one reads its
# facts' words once through the scope index, so a name common in other scopes costs it nothing,
# and takes its first matches by id (as the scope cache does, context/domain/fact_ranking.py).
_HOP_BY_INDEX = """hop AS (
    SELECT DISTINCT h.id FROM unnest(%(entities)s::text[]) AS e(entity)
    CROSS JOIN LATERAL (
        SELECT m.id FROM (
            SELECT f.id, f.embedding FROM facts f
            WHERE {visible}
              AND f.search_vector @@ plainto_tsquery('simple', e.entity)
              AND NOT (f.id = ANY(%(exclude)s::uuid[]))
            LIMIT %(hop_scan_limit)s
        ) m
        ORDER BY m.embedding <=> %(vector)s LIMIT %(per_entity)s
    ) h
)"""


_HOP_BY_SCAN = """scope_words AS MATERIALIZED (
    SELECT f.id, f.search_vector FROM facts f
    WHERE {visible} AND NOT (f.id = ANY(%(exclude)s::uuid[]))
),
hop AS (
    SELECT DISTINCT h.id FROM unnest(%(entities)s::text[]) AS e(entity)
    CROSS JOIN LATERAL (
        SELECT m.id FROM (
            SELECT w.id FROM scope_words w
            WHERE w.search_vector @@ plainto_tsquery('simple', e.entity)
            ORDER BY w.id LIMIT %(hop_scan_limit)s
        ) m JOIN facts f ON f.project_id = %(project_id)s AND f.id = m.id
        ORDER BY f.embedding <=> %(vector)s, f.id LIMIT %(per_entity)s
    ) h
)"""


_MULTI_HOP_SQL = """
WITH q AS MATERIALIZED ({text_query}),
text_full AS ({given_text_full}),
{hop},
scored AS (
    SELECT {columns} FROM facts f JOIN hop USING (id), q WHERE f.project_id = %(project_id)s
),
{restated}
SELECT scored.*, {score} AS score, {restates} AS restates
FROM scored {join_restated} ORDER BY score DESC, id
"""


MULTI_HOP_SQL = render(_MULTI_HOP_SQL.replace("{hop}", _HOP_BY_INDEX))


MULTI_HOP_SCAN_SQL = render(_MULTI_HOP_SQL.replace("{hop}", _HOP_BY_SCAN))


async def fetch_multi_hop(
    conn: AsyncConnection,
    scope: Scope,
    vector: np.ndarray,
    cfg: ContextSettings,
    plan: QueryPlan,
    entities: Sequence[str],
    exclude_ids: Sequence[str],
    text_full: float | None = None,
) -> list[ScoredFact]:
    """Facts sharing an entity with the retained ones (no new embedding), best first; hybrid
    text ranks are divided by the candidates' `text_full` (their best BM25).

    A scope scored exactly (at most `exact_scope_max` facts) scans its own facts' words, with
    the statement's generic plan (`generic_plans`: 4.9 → 2.2 ms on LoCoMo); a larger one looks
    the entities up in the text index: a scope with indexes of its own through its statement
    written for it (`for_scope`), whose generic plan reads the scope's words index; another
    planned for each call's values, which the shared generic plan would not suit (a
    100,000-fact scope's call 40 → 60 ms).
    """
    ranking = ranking_of(cfg)
    params = call_params(scope, vector, cfg, plan)
    if text_full is not None and ranking.bm25_text_rank:
        params["text_rank_full"] = text_full
    params["entities"] = list(entities)
    params["exclude"] = list(exclude_ids)
    variant = (ranking.name, scope.historical)
    if plan.scope_facts <= cfg.exact_scope_max:
        async with generic_plans(conn):
            rows = await fetch_all(conn, MULTI_HOP_SCAN_SQL[variant], params)
    elif plan.scope_indexed and not scope.historical:
        statement = for_scope(MULTI_HOP_SQL[variant], scope.project_id, scope.subject_id)
        async with generic_plans(conn):
            rows = await fetch_all(conn, statement, params)
    else:
        async with per_call_plans(conn):
            rows = await fetch_all(conn, MULTI_HOP_SQL[variant], params)
    return [ScoredFact.from_row(r) for r in rows]
