"""SQL of context assembly: candidate retrieval, multi-hop, episodes, traces and stats.

A scope that holds at most `exact_scope_max` active facts is scored exactly: every fact, in
one statement. A larger one is retrieved in two phases, also in one statement. Phase 1
gathers ids from three sources: the newest facts of the scope (each scored on cosine +
recency, the best kept), the K nearest facts by cosine (HNSW) and the K best full-text matches
(GIN). Phase 2 computes the hybrid score of their union only, reading just the columns packing
needs; phase 1 is widened while a fact it left out could still enter the top
(`domain.retrieval`). The same filters serve "now" (status = active, still valid) and
point-in-time calls (`as_of`: valid then, as recorded then).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import dict_row

from satchel.server.config import ContextSettings
from satchel.server.domain.retrieval import SourceReport, Weights, holds_top, unseen_score_bound
from satchel.server.domain.text_query import TS_RANK_UNIT, query_terms
from satchel.server.storage.memory import FACT_VISIBLE_AT

MULTI_HOP_SCAN_LIMIT = 256


@dataclass(frozen=True)
class Scope:
    """What one context call may see: a scope, an instant, and whether that instant is now."""

    project_id: str
    subject_id: str
    at: datetime
    historical: bool


@dataclass(frozen=True)
class QueryPlan:
    """What a context call knows before its query is embedded: the searched words, and the
    scope's active facts (counted up to one more than `exact_scope_max`)."""

    terms: list[str]
    scope_facts: int


# Facts visible at %(at)s. "now" uses the partial indexes on active facts; as_of reads history.
_CURRENT_FACTS = """
    f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s
    AND f.status = 'active'
    AND (f.valid_to IS NULL OR f.valid_to > %(at)s)
"""
_FACTS_AS_OF = (
    """
    f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s AND
"""
    + FACT_VISIBLE_AT
)

# The recency of a fact `f` at %(at)s: exp(-age / tau), ages in the future counting as 0.
# `since_epoch` is when its validity starts, in seconds (a stored column: migration 0007).
_RECENCY = "exp(least(f.since_epoch - %(at_epoch)s, 0.0) / %(tau_seconds)s)"

# The columns packing needs, the score parts and the hard-filter flags of a fact `f`.
_SCORED_COLUMNS = f"""
    f.id, f.predicate, f.value, f.statement, f.confidence, f.valid_from, f.source_event_ids,
    1 - (f.embedding <=> %(vector)s) AS similarity,
    {{text_rank}} AS text_rank,
    {_RECENCY} AS recency,
    (f.stale_after IS NOT NULL
        AND coalesce(f.valid_from, f.recorded_from) + f.stale_after <= %(at)s) AS expired,
    EXISTS (
        SELECT 1 FROM conflict_members m JOIN conflict_sets c ON c.id = m.conflict_id
        WHERE m.fact_id = f.id AND c.opened_at <= %(at)s
          AND (c.status = 'open' OR c.resolved_at > %(at)s)
    ) AS in_open_conflict
"""

# The text query: any of the searched words (see `plan_query`), through websearch_to_tsquery,
# which accepts any text. The text rank is ts_rank_cd divided by what a fact holding each
# searched word once gets, capped at 1: it weighs on the cosine's scale.
_TEXT_QUERY = "SELECT websearch_to_tsquery('simple', %(text_query)s) AS tsq"
_TEXT_RANK = "least(1.0, ts_rank_cd(f.search_vector, q.tsq) / %(text_rank_full)s)"
# ts_rank_cd is the costly part of scoring: it runs on matching facts only (it is 0 elsewhere),
# and phase 2 reuses what the text source already computed.
_SCORED_TEXT_RANK = f"CASE WHEN f.search_vector @@ q.tsq THEN {_TEXT_RANK} ELSE 0.0 END"
_POOLED_TEXT_RANK = f"coalesce(pool.text_rank, {_SCORED_TEXT_RANK})"

_SCORE = """
    %(w_similarity)s * similarity + %(w_text_rank)s * text_rank + %(w_recency)s * recency
"""
# The same score straight from a fact `f`, to rank many facts before reading their columns.
_FACT_SCORE = f"""%(w_similarity)s * (1 - (f.embedding <=> %(vector)s))
        + %(w_text_rank)s * {{text_rank}} + %(w_recency)s * {_RECENCY}"""

# Before the query is embedded: the content words of the query held by at most
# `term_max_facts` facts of the scope (as counted on write: migration 0007), in query order,
# and the scope's active facts, counted up to one more than `exact_scope_max` (an index-only
# scan: the count chooses the path, the filters of the path itself decide what is visible).
_PLAN_SQL = """
SELECT ARRAY(
    SELECT t.term FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, position)
    LEFT JOIN fact_term_counts c
        ON c.project_id = %(project_id)s AND c.subject_id = %(subject_id)s AND c.term = t.term
    WHERE coalesce(c.facts, 0) <= %(term_max_facts)s
    ORDER BY t.position
) AS terms,
(SELECT count(*) FROM (
    SELECT 1 FROM facts f
    WHERE f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s
      AND f.status = 'active'
    LIMIT %(exact_scope_max)s + 1
) scope) AS scope_facts
"""

# The exact path: the hybrid score of every visible fact, reading only what the score needs;
# the other columns are read for the best ones only. Serves small scopes and the benchmarks'
# reference ranking.
_EXACT_SQL = """
WITH q AS ({text_query}),
best AS (
    SELECT f.id FROM facts f, q WHERE {visible}
    ORDER BY {scored_fact_score} DESC, f.id LIMIT %(candidate_limit)s
),
scored AS (SELECT {columns} FROM facts f JOIN best USING (id), q)
SELECT *, {score} AS score FROM scored ORDER BY score DESC, id
"""

# Two-phase retrieval. Phase 1 has three sources, each returning what bounds the score of a
# fact it left out: the newest facts (a date index scan; each is scored on cosine + recency
# and the best `newest_k` go on: the lowest kept partial score, how many were read, how old
# the oldest is), the K nearest facts (HNSW, iterative scan under the scope filter: the K-th
# distance) and the K best full-text matches (GIN: the K-th rank). Phase 2 scores the union
# and reports those bounds on every row.
_CANDIDATES_SQL = """
WITH q AS ({text_query}),
newest AS (
    SELECT f.id, f.since_epoch,
        %(w_similarity)s * (1 - (f.embedding <=> %(vector)s)) + %(w_recency)s * {recency}
            AS partial_score
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
    SELECT id, least(1.0, raw_rank / %(text_rank_full)s) AS rank FROM (
        SELECT f.id, ts_rank_cd(f.search_vector, q.tsq) AS raw_rank FROM facts f, q
        WHERE {visible} AND f.search_vector @@ q.tsq
        ORDER BY raw_rank DESC LIMIT %(top_k)s
    ) matches
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
    ORDER BY {pooled_fact_score} DESC, f.id LIMIT %(candidate_limit)s
),
scored AS (SELECT {pooled_columns} FROM facts f JOIN best AS pool USING (id), q)
SELECT scored.*, {score} AS score, bounds.* FROM scored, bounds ORDER BY score DESC, id
"""

# Multi-hop: per entity, the facts mentioning it (GIN) that lie nearest to the query (the
# query's vector is reused: no new embedding), then the usual scoring of those few. An entity
# found in very many facts is searched among its first `hop_scan_limit` matches only, which
# bounds the cost of a common name (a documented trade-off, like phase 1's K).
_MULTI_HOP_SQL = """
WITH q AS ({text_query}),
hop AS (
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
),
scored AS (SELECT {columns} FROM facts f JOIN hop USING (id), q)
SELECT scored.*, {score} AS score FROM scored ORDER BY score DESC, id
"""

_EPISODES_SQL = """
SELECT e.id, e.kind, e.occurred_at, e.text,
       1 - (e.embedding <=> %(vector)s) AS similarity,
       exp(least(satchel_epoch(e.occurred_at) - %(at_epoch)s, 0.0) / %(tau_seconds)s) AS recency
FROM events e
WHERE e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s
  AND (NOT %(historical)s OR (e.occurred_at <= %(at)s AND e.recorded_at <= %(at)s))
ORDER BY e.embedding <=> %(vector)s LIMIT %(episode_k)s
"""


def _render(template: str) -> tuple[str, str]:
    """The (now, as_of) variants of a statement."""
    return tuple(  # type: ignore[return-value]
        template.format(
            visible=visible,
            recency=_RECENCY,
            columns=_SCORED_COLUMNS.format(text_rank=_SCORED_TEXT_RANK),
            pooled_columns=_SCORED_COLUMNS.format(text_rank=_POOLED_TEXT_RANK),
            score=_SCORE,
            text_query=_TEXT_QUERY,
            scored_fact_score=_FACT_SCORE.format(text_rank=_SCORED_TEXT_RANK),
            pooled_fact_score=_FACT_SCORE.format(text_rank=_POOLED_TEXT_RANK),
        )
        for visible in (_CURRENT_FACTS, _FACTS_AS_OF)
    )


EXACT_SQL = _render(_EXACT_SQL)
CANDIDATES_SQL = _render(_CANDIDATES_SQL)
MULTI_HOP_SQL = _render(_MULTI_HOP_SQL)


def _scope_params(scope: Scope) -> dict[str, Any]:
    return {
        "project_id": scope.project_id,
        "subject_id": scope.subject_id,
        "at": scope.at,
        "at_epoch": scope.at.timestamp(),
        "historical": scope.historical,
    }


def _params(
    scope: Scope, vector: np.ndarray, cfg: ContextSettings, terms: Sequence[str] = ()
) -> dict[str, Any]:
    return {
        **_scope_params(scope),
        "text_query": " or ".join(terms),
        "text_rank_full": TS_RANK_UNIT * max(1, len(terms)),
        "vector": vector,
        "top_k": cfg.retrieval_top_k,
        "newest_k": min(cfg.newest_top_k, cfg.newest_window),
        "newest_window": cfg.newest_window,
        "candidate_limit": cfg.candidate_limit,
        "episode_k": cfg.episode_top_k,
        "tau_seconds": cfg.recency_tau_days * 86400.0,
        "w_similarity": cfg.weight_similarity,
        "w_text_rank": cfg.weight_text_rank,
        "w_recency": cfg.weight_recency,
        "per_entity": cfg.multi_hop_max_per_entity,
        "hop_scan_limit": MULTI_HOP_SCAN_LIMIT,
    }


async def plan_query(
    conn: AsyncConnection, scope: Scope, query: str, cfg: ContextSettings
) -> QueryPlan:
    """The query's searched words and the scope's size, in one round trip without a vector (a
    context call runs it while the query is embedded).

    A word held by more facts of the scope than `text_term_max_facts` is left out: too common
    to rank by, and ranking all its matches would cost more than the vector search.
    """
    params = {
        **_scope_params(scope),
        "terms": query_terms(query),
        "term_max_facts": cfg.text_term_max_facts,
        "exact_scope_max": cfg.exact_scope_max,
    }
    cur = await conn.execute(_PLAN_SQL, params)
    terms, scope_facts = await cur.fetchone()  # type: ignore[misc]
    return QueryPlan(list(terms), int(scope_facts))


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


def weights_of(cfg: ContextSettings) -> Weights:
    """The hybrid score's weights as configured."""
    return Weights(
        similarity=cfg.weight_similarity,
        text_rank=cfg.weight_text_rank,
        recency=cfg.weight_recency,
        tau_seconds=cfg.recency_tau_days * 86400.0,
    )


async def fetch_fact_candidates(
    conn: AsyncConnection,
    scope: Scope,
    vector: np.ndarray,
    cfg: ContextSettings,
    plan: QueryPlan,
    *,
    exact: bool = False,
) -> list[dict[str, Any]]:
    """Scored fact candidates, best first (at most `candidate_limit`).

    Exact for a scope of at most `exact_scope_max` active facts, or when asked (the reference
    ranking). Otherwise two-phase: while a fact phase 1 left out could still enter the top
    `exact_top_n`, phase 1 is widened (K x 4, up to `retrieval_top_k_max`) and run again; a
    scope where HNSW cannot find K facts at K max is scored exactly.
    """
    params = _params(scope, vector, cfg, plan.terms)
    variant = int(scope.historical)
    cur = conn.cursor(row_factory=dict_row)
    if exact or plan.scope_facts <= cfg.exact_scope_max:
        await cur.execute(EXACT_SQL[variant], params)
        return await cur.fetchall()
    async with conn.transaction():
        # Planning this statement for each call's values cost about 2 ms, and its plan does
        # not depend on them: plan it once per connection (benchmarks/context.md).
        await cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        return await _two_phase(cur, params, cfg, variant)


async def _two_phase(
    cur: AsyncCursor[dict[str, Any]], params: dict[str, Any], cfg: ContextSettings, variant: int
) -> list[dict[str, Any]]:
    """Phase 1 widened until it holds the top (see `fetch_fact_candidates`), then phase 2."""
    top_n = min(cfg.exact_top_n, cfg.candidate_limit)
    while True:
        await cur.execute(CANDIDATES_SQL[variant], params, prepare=True)
        rows = await cur.fetchall()
        if not rows:
            return rows
        report = source_report(rows[0], params)
        bound = unseen_score_bound(report, weights_of(cfg))
        if holds_top([float(r["score"]) for r in rows], bound, top_n):
            return rows
        if params["top_k"] >= cfg.retrieval_top_k_max:
            if report.vector_rows < params["top_k"]:
                # HNSW cannot reach enough of this scope's facts: score every one of them.
                await cur.execute(EXACT_SQL[variant], params)
                return await cur.fetchall()
            return rows
        params["top_k"] = min(params["top_k"] * 4, cfg.retrieval_top_k_max)
        params["newest_k"] = min(params["newest_k"] * 4, params["newest_window"])


async def fetch_multi_hop(
    conn: AsyncConnection,
    scope: Scope,
    vector: np.ndarray,
    cfg: ContextSettings,
    plan: QueryPlan,
    entities: Sequence[str],
    exclude_ids: Sequence[str],
) -> list[dict[str, Any]]:
    """Facts sharing an entity with the retained ones (no new embedding), best first."""
    params = _params(scope, vector, cfg, plan.terms)
    params["entities"] = list(entities)
    params["exclude"] = list(exclude_ids)
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(MULTI_HOP_SQL[int(scope.historical)], params)
    return await cur.fetchall()


async def fetch_episodes(
    conn: AsyncConnection, scope: Scope, vector: np.ndarray, cfg: ContextSettings
) -> list[dict[str, Any]]:
    """The scope's events nearest to the query vector (HNSW)."""
    if cfg.episode_top_k == 0:
        return []
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(_EPISODES_SQL, _params(scope, vector, cfg))
    return await cur.fetchall()


@dataclass(frozen=True)
class CallRecord:
    """The summary row of one context call."""

    trace_id: uuid.UUID
    project_id: str
    subject_id: str
    query: str
    budget_tokens: int
    as_of: datetime | None
    status: str
    warnings: list[str]
    empty_reason: str
    tokens_used: int
    facts_served: int
    episodes_served: int
    embed_ms: float
    retrieve_ms: float
    pack_ms: float
    total_ms: float


TRACE_COLUMNS = (
    "trace_id",
    "sequence",
    "candidate_id",
    "candidate_kind",
    "outcome",
    "reason_code",
    "score",
    "similarity",
    "text_rank",
    "recency",
    "tokens",
    "budget_used",
    "preview",
)


_SAVE_TRACE_SQL = f"""
WITH call AS (
    INSERT INTO context_calls (trace_id, project_id, subject_id, query, budget_tokens, as_of,
        status, warnings, empty_reason, tokens_used, facts_served, episodes_served,
        embed_ms, retrieve_ms, pack_ms, total_ms)
    VALUES (%(trace_id)s, %(project_id)s, %(subject_id)s, %(query)s, %(budget_tokens)s,
        %(as_of)s, %(status)s, %(warnings)s, %(empty_reason)s, %(tokens_used)s,
        %(facts_served)s, %(episodes_served)s, %(embed_ms)s, %(retrieve_ms)s, %(pack_ms)s,
        %(total_ms)s)
    RETURNING trace_id
)
INSERT INTO context_traces ({", ".join(TRACE_COLUMNS)})
SELECT call.trace_id, d.* FROM call, json_to_recordset(%(decisions)s::json) AS d(
    sequence int, candidate_id uuid, candidate_kind text, outcome text, reason_code text,
    score float8, similarity float8, text_rank float8, recency float8, tokens int,
    budget_used int, preview text
)
"""


async def save_trace(
    conn: AsyncConnection, call: CallRecord, decision_rows: Sequence[Sequence[Any]]
) -> None:
    """Persist a call and all its decisions in one statement (one round trip).

    Each decision row holds the values of `TRACE_COLUMNS[1:]`, in order, ids as strings. The
    decisions travel as one JSON array: adapting a dozen typed arrays instead took ~1.5 ms of
    the event loop per call.
    """
    params: dict[str, Any] = dict(call.__dict__)
    names = TRACE_COLUMNS[1:]
    params["decisions"] = json.dumps([dict(zip(names, row, strict=True)) for row in decision_rows])
    await conn.execute(_SAVE_TRACE_SQL, params)


async def load_trace(
    conn: AsyncConnection, project_id: str, trace_id: uuid.UUID
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A call of this project and its decisions in order; None when there is no such call."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "SELECT * FROM context_calls WHERE trace_id = %s AND project_id = %s",
        (trace_id, project_id),
    )
    call = await cur.fetchone()
    if call is None:
        return None
    await cur.execute(
        f"SELECT {', '.join(TRACE_COLUMNS[1:])} FROM context_traces"
        " WHERE trace_id = %s ORDER BY sequence",
        (trace_id,),
    )
    return call, await cur.fetchall()


async def stats_overview(conn: AsyncConnection, project_id: str) -> dict[str, Any]:
    """Call counts, injection rate and latency percentiles of a project's context calls."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        """
        SELECT count(*) AS context_calls,
               count(*) FILTER (WHERE facts_served > 0) AS calls_serving_facts,
               count(*) FILTER (WHERE facts_served = 0 AND episodes_served = 0) AS calls_empty,
               coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY total_ms), 0) AS p50,
               coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY total_ms), 0) AS p95,
               coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY total_ms), 0) AS p99,
               coalesce(avg(tokens_used), 0) AS mean_tokens_used
        FROM context_calls WHERE project_id = %s
        """,
        (project_id,),
    )
    return await cur.fetchone()
