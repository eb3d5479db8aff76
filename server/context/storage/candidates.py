"""Fact candidates: every visible fact scored exactly (a small scope), or two-phase retrieval.

A scope that holds at most `exact_scope_max` active facts is scored exactly: every fact, in
one statement. A larger one is retrieved in two phases, also in one statement. Phase 1
gathers ids from three sources: the newest facts of the scope (each scored on cosine +
recency, the best kept), the K nearest facts by cosine (HNSW) and the K best full-text matches
(GIN). Phase 2 computes the hybrid score of their union only, reading just the columns packing
needs; phase 1 is widened while a fact it left out could still enter the top
(`domain/retrieval.py`). The same filters serve "now" (status = active, still valid) and
point-in-time calls (`as_of`: valid then, as recorded then).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psycopg import AsyncConnection

from satchel.server.context.domain.retrieval import (
    SourceReport,
    holds_top,
    unseen_score_bound,
)
from satchel.server.context.domain.scored import FactCandidates, ScoredFact
from satchel.server.context.ranking import ranking_of
from satchel.server.context.storage.plan import QueryPlan
from satchel.server.context.storage.sql import Scope, call_params, for_scope, render
from satchel.server.platform.config import ContextSettings
from satchel.server.platform.storage.pool import generic_plans
from satchel.server.platform.storage.statements import Statement, fetch_all

# The exact path: the hybrid score of every visible fact, reading only what the score needs;
# the other columns are read for the best ones only. Serves small scopes and the benchmarks'
# reference ranking. One pass over the scope's facts (`scan`) reads each fact's distance,
# recency input and raw text rank (computed for matching facts only); the best are ranked from
# it. (Joining the text matches to the facts instead was a nested loop: PostgreSQL cannot
# estimate how many facts match, and rescanned the matches for every fact.)
_EXACT_SQL = """
WITH q AS MATERIALIZED ({text_query}),
scan AS MATERIALIZED (
    SELECT f.id, f.since_epoch, f.embedding <=> %(vector)s AS distance,
           CASE WHEN {match} THEN {raw_rank} END AS raw
    FROM facts f, q WHERE {visible}
),
hits AS (SELECT id, raw FROM scan WHERE raw IS NOT NULL),
text_full AS ({text_full}),
best AS (
    SELECT id, text_rank FROM (
        SELECT s.id, s.distance, s.since_epoch,
               least(1.0, coalesce(s.raw, 0.0) / {text_full_value}) AS text_rank
        FROM scan s
    ) f
    ORDER BY {scanned_score} DESC, id
    LIMIT %(candidate_limit)s
),
scored AS (
    SELECT {pooled_columns} FROM facts f JOIN best AS pool USING (id), q
    WHERE f.project_id = %(project_id)s
),
{restated}
SELECT scored.*, {score} AS score, {text_full_value} AS text_full, {restates} AS restates
FROM scored {join_restated} ORDER BY score DESC, id
"""


# Two-phase retrieval. Phase 1 has three sources, each returning what bounds the score of a
# fact it left out: the newest facts (a date index scan; each is scored on cosine + recency
# and the best `newest_k` go on: the lowest kept partial score, how many were read, how old
# the oldest is), the K nearest facts (HNSW, iterative scan under the scope filter: the K-th
# distance) and the K best full-text matches (GIN: the K-th rank). Phase 2 scores the union
# and reports those bounds on every row.
_CANDIDATES_SQL = """
WITH q AS MATERIALIZED ({text_query}),
hits AS MATERIALIZED (
    SELECT f.id, {raw_rank} AS raw FROM facts f, q WHERE {visible} AND {match}
),
text_full AS ({text_full}),
newest AS (
    SELECT f.id, f.since_epoch,
        {partial_score} AS partial_score
    FROM facts f WHERE {visible}
    ORDER BY coalesce(f.valid_from, f.recorded_from) DESC LIMIT %(newest_window)s
),
by_newest AS (
    SELECT id, partial_score FROM newest ORDER BY partial_score DESC LIMIT %(newest_k)s
),
by_vector AS (
    SELECT f.id, f.embedding <=> %(vector)s AS distance FROM facts f WHERE {visible}
    ORDER BY f.embedding <=> %(vector)s LIMIT %(top_k)s
),
by_text AS (
    SELECT id, least(1.0, raw / {text_full_value}) AS rank FROM hits
    ORDER BY raw DESC LIMIT %(top_k)s
),
bounds AS (
    SELECT (SELECT count(*) FROM newest) AS window_rows,
           (SELECT min(since_epoch) FROM newest) AS window_oldest,
           (SELECT count(*) FROM by_newest) AS newest_rows,
           (SELECT min(partial_score) FROM by_newest) AS newest_min_partial,
           (SELECT count(*) FROM by_vector) AS vector_rows,
           (SELECT max(distance) FROM by_vector) AS vector_max_distance,
           (SELECT count(*) FROM by_text) AS text_rows,
           (SELECT min(rank) FROM by_text) AS text_min_rank
),
pool AS (
    SELECT id, max(rank) AS text_rank FROM (
        SELECT id, NULL::float8 AS rank FROM by_newest
        UNION ALL SELECT id, NULL FROM by_vector
        UNION ALL SELECT id, rank FROM by_text
    ) sources GROUP BY id
),
best AS (
    SELECT f.id, pool.text_rank FROM facts f JOIN pool USING (id), q
    WHERE f.project_id = %(project_id)s
    ORDER BY {pooled_fact_score} DESC, f.id LIMIT %(candidate_limit)s
),
scored AS (
    SELECT {pooled_columns} FROM facts f JOIN best AS pool USING (id), q
    WHERE f.project_id = %(project_id)s
),
{restated}
SELECT scored.*, {score} AS score, {text_full_value} AS text_full, {restates} AS restates,
       bounds.*
FROM scored {join_restated} CROSS JOIN bounds ORDER BY score DESC, id
"""


EXACT_SQL = render(_EXACT_SQL)


CANDIDATES_SQL = render(_CANDIDATES_SQL)


def source_report(row: dict[str, Any], params: dict[str, Any]) -> SourceReport:
    """The bounds that phase 1 reported on a row of the candidates statement."""
    oldest = row["window_oldest"]
    return SourceReport(
        window_rows=row["window_rows"],
        window_limit=params["newest_window"],
        window_oldest_age_seconds=None if oldest is None else params["at_epoch"] - oldest,
        newest_rows=row["newest_rows"],
        newest_limit=params["newest_k"],
        newest_min_partial=row["newest_min_partial"],
        vector_rows=row["vector_rows"],
        vector_limit=params["top_k"],
        vector_max_distance=row["vector_max_distance"],
        text_rows=row["text_rows"],
        text_limit=params["top_k"],
        text_min_rank=row["text_min_rank"],
    )


async def fetch_fact_candidates(
    conn: AsyncConnection,
    scope: Scope,
    vector: np.ndarray,
    cfg: ContextSettings,
    plan: QueryPlan,
    *,
    exact: bool = False,
) -> FactCandidates:
    """Scored fact candidates, best first (at most `candidate_limit`).

    Exact for a scope of at most `exact_scope_max` active facts, or when asked (the reference
    ranking). Otherwise two-phase: while a fact phase 1 left out could still enter the top
    `exact_top_n`, phase 1 is widened (K x 4, up to `retrieval_top_k_max`) and run again; a
    scope where HNSW cannot find K facts at K max is scored exactly. A scope with indexes of
    its own (scope_indexes.py) starts at K = `scope_index_top_k`, its statement written for
    the scope (`for_scope`): a generic plan of the shared one cannot use a partial index, and
    would walk the global HNSW graph.
    """
    params = call_params(scope, vector, cfg, plan)
    variant = (ranking_of(cfg).name, scope.historical)
    if exact or plan.scope_facts <= cfg.exact_scope_max:
        async with generic_plans(conn):
            rows = await fetch_all(conn, EXACT_SQL[variant], params)
    elif not plan.scope_indexed or scope.historical:  # history is not in a scope's indexes
        async with generic_plans(conn):
            rows = await _two_phase(conn, params, cfg, variant, CANDIDATES_SQL[variant])
    else:
        top_k = min(max(cfg.scope_index_top_k, cfg.retrieval_top_k), cfg.retrieval_top_k_max)
        params["top_k"] = top_k
        statement = for_scope(CANDIDATES_SQL[variant], scope.project_id, scope.subject_id)
        async with generic_plans(conn):
            rows = await _two_phase(conn, params, cfg, variant, statement)
    text_full = float(rows[0]["text_full"]) if rows else None
    two_phase = bool(rows) and "window_rows" in rows[0]
    return FactCandidates([ScoredFact.from_row(r) for r in rows], text_full, exact=not two_phase)


async def _two_phase(
    conn: AsyncConnection,
    params: dict[str, Any],
    cfg: ContextSettings,
    variant: tuple[str, bool],
    statement: Statement,
) -> list[dict[str, Any]]:
    """Phase 1 widened until it holds the top (see `fetch_fact_candidates`), then phase 2."""
    top_n = min(cfg.exact_top_n, cfg.candidate_limit)
    while True:
        rows = await fetch_all(conn, statement, params)
        if not rows:
            return rows
        report = source_report(rows[0], params)
        bound = unseen_score_bound(report, ranking_of(cfg).weights)
        if holds_top([float(r["score"]) for r in rows], bound, top_n):
            return rows
        if params["top_k"] >= cfg.retrieval_top_k_max:
            if report.vector_rows < params["top_k"]:
                # HNSW cannot reach enough of this scope's facts: score every one of them.
                return await fetch_all(conn, EXACT_SQL[variant], params)
            return rows
        params["top_k"] = min(params["top_k"] * 4, cfg.retrieval_top_k_max)
        params["newest_k"] = min(params["newest_k"] * 4, params["newest_window"])
