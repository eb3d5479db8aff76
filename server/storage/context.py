"""SQL of context assembly: candidate retrieval, multi-hop, episodes, traces and stats.

Retrieval is two-phase. Phase 1 gathers ids from indexes only: the top-K facts by cosine
(HNSW), the top-K by full-text rank (GIN), and the K most recent. Phase 2 computes the hybrid
score on that union only, reading just the columns packing needs. The same filters serve "now"
(status = active, still valid) and point-in-time calls (`as_of`: valid then, as recorded then).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from satchel.server.config import ContextSettings
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


# Facts visible at %(at)s. "now" uses the partial index on active facts; as_of reads history.
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
_RECENCY = """exp(-greatest(date_part('epoch', %(at)s - coalesce(f.valid_from, f.recorded_from)), 0)
    / %(tau_seconds)s)"""

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

# The text query: any of the searched words (see `searched_terms`), through
# websearch_to_tsquery, which accepts any text. The text rank is ts_rank_cd divided by what a
# fact holding each searched word once gets, capped at 1: it weighs on the cosine's scale.
_TEXT_QUERY = "SELECT websearch_to_tsquery('simple', %(text_query)s) AS tsq"
_TEXT_RANK = "least(1.0, ts_rank_cd(f.search_vector, q.tsq) / %(text_rank_full)s)"
# ts_rank_cd is the costly part of scoring: it runs on matching facts only (it is 0 elsewhere),
# and phase 2 reuses what the text source already computed.
_SCORED_TEXT_RANK = f"CASE WHEN f.search_vector @@ q.tsq THEN {_TEXT_RANK} ELSE 0.0 END"
_POOLED_TEXT_RANK = f"coalesce(pool.text_rank, {_SCORED_TEXT_RANK})"

# The content words of the query found in at most `term_max_facts` facts of the scope (each
# count stops there), in query order.
_SEARCHED_TERMS_SQL = """
SELECT t.term FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, position)
WHERE (
    SELECT count(*) FROM (
        SELECT 1 FROM facts f
        WHERE {visible} AND f.search_vector @@ plainto_tsquery('simple', t.term)
        LIMIT %(term_max_facts)s + 1
    ) m
) <= %(term_max_facts)s
ORDER BY t.position
"""

_SCORE = """
    %(w_similarity)s * similarity + %(w_text_rank)s * text_rank + %(w_recency)s * recency
"""

# Phase 1 has four sources: the K nearest facts (HNSW), the K nearest facts of the recency
# window (HNSW under a date filter: where recency still weighs), the newest facts (an index
# scan: each is scored on cosine + recency, the best go on), and the K best full-text matches
# (GIN). Each keeps what bounds the score of a fact it did not return (its K-th distance,
# partial score or rank); phase 2 scores the union and reports those bounds on every row.
_CANDIDATES_SQL = """
WITH q AS ({text_query}),
by_vector AS (
    SELECT f.id, f.embedding <=> %(vector)s AS distance FROM facts f WHERE {visible}
    ORDER BY f.embedding <=> %(vector)s LIMIT %(top_k)s
),
by_recent_vector AS (
    SELECT f.id, f.embedding <=> %(vector)s AS distance FROM facts f
    WHERE {visible} AND coalesce(f.valid_from, f.recorded_from) > %(recent_since)s
    ORDER BY f.embedding <=> %(vector)s LIMIT %(recent_k)s
),
newest AS (
    SELECT f.id, coalesce(f.valid_from, f.recorded_from) AS since,
        %(w_similarity)s * (1 - (f.embedding <=> %(vector)s)) + %(w_recency)s * {recency}
            AS partial_score
    FROM facts f WHERE {visible}
    ORDER BY coalesce(f.valid_from, f.recorded_from) DESC LIMIT %(newest_window)s
),
by_newest AS (
    SELECT id, partial_score FROM newest ORDER BY partial_score DESC LIMIT %(newest_k)s
),
by_text AS (
    SELECT id, least(1.0, raw_rank / %(text_rank_full)s) AS rank FROM (
        SELECT f.id, ts_rank_cd(f.search_vector, q.tsq) AS raw_rank FROM facts f, q
        WHERE {visible} AND f.search_vector @@ q.tsq
        ORDER BY raw_rank DESC LIMIT %(top_k)s
    ) matches
),
bounds AS (
    SELECT (SELECT count(*) FROM by_vector) AS vector_rows,
           (SELECT max(distance) FROM by_vector) AS vector_max_distance,
           (SELECT count(*) FROM by_recent_vector) AS recent_rows,
           (SELECT max(distance) FROM by_recent_vector) AS recent_max_distance,
           (SELECT count(*) FROM newest) AS window_rows,
           (SELECT min(since) FROM newest) AS window_oldest,
           (SELECT count(*) FROM by_newest) AS newest_rows,
           (SELECT min(partial_score) FROM by_newest) AS newest_min_partial,
           (SELECT count(*) FROM by_text) AS text_rows,
           (SELECT min(rank) FROM by_text) AS text_min_rank
),
pool AS (
    SELECT id, max(rank) AS text_rank FROM (
        SELECT id, NULL::float8 AS rank FROM by_vector
        UNION ALL SELECT id, NULL FROM by_recent_vector
        UNION ALL SELECT id, NULL FROM by_newest
        UNION ALL SELECT id, rank FROM by_text
    ) sources GROUP BY id
),
scored AS (
    SELECT {pooled_columns} FROM facts f JOIN pool USING (id), q
)
SELECT scored.*, {score} AS score, bounds.* FROM scored, bounds
ORDER BY score DESC, id LIMIT %(candidate_limit)s
"""

# The exact reference: the hybrid score of every visible fact (benchmarks and small scopes).
_EXACT_SQL = """
WITH q AS ({text_query}),
scored AS (SELECT {columns} FROM facts f, q WHERE {visible})
SELECT *, {score} AS score FROM scored ORDER BY score DESC, id LIMIT %(candidate_limit)s
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
       exp(-greatest(date_part('epoch', %(at)s - e.occurred_at), 0) / %(tau_seconds)s) AS recency
FROM events e
WHERE e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s
  AND (NOT %(historical)s OR (e.occurred_at <= %(at)s AND e.recorded_at <= %(at)s))
ORDER BY e.embedding <=> %(vector)s LIMIT %(episode_k)s
"""


def _render(template: str, historical: bool) -> str:
    visible = _FACTS_AS_OF if historical else _CURRENT_FACTS
    return template.format(
        visible=visible,
        recency=_RECENCY,
        columns=_SCORED_COLUMNS.format(text_rank=_SCORED_TEXT_RANK),
        pooled_columns=_SCORED_COLUMNS.format(text_rank=_POOLED_TEXT_RANK),
        score=_SCORE,
        text_query=_TEXT_QUERY,
        text_rank=_TEXT_RANK,
    )


# (now, as_of) variants of each statement, rendered once.
CANDIDATES_SQL = (_render(_CANDIDATES_SQL, False), _render(_CANDIDATES_SQL, True))
EXACT_SQL = (_render(_EXACT_SQL, False), _render(_EXACT_SQL, True))
MULTI_HOP_SQL = (_render(_MULTI_HOP_SQL, False), _render(_MULTI_HOP_SQL, True))
SEARCHED_TERMS_SQL = (_render(_SEARCHED_TERMS_SQL, False), _render(_SEARCHED_TERMS_SQL, True))


def _scope_params(scope: Scope) -> dict[str, Any]:
    return {
        "project_id": scope.project_id,
        "subject_id": scope.subject_id,
        "at": scope.at,
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
        "recent_k": cfg.recency_top_k,
        "newest_k": min(cfg.newest_top_k, cfg.newest_window),
        "newest_window": cfg.newest_window,
        "recent_since": scope.at - timedelta(days=cfg.recency_window_days),
        "candidate_limit": cfg.candidate_limit,
        "episode_k": cfg.episode_top_k,
        "tau_seconds": cfg.recency_tau_days * 86400.0,
        "w_similarity": cfg.weight_similarity,
        "w_text_rank": cfg.weight_text_rank,
        "w_recency": cfg.weight_recency,
        "per_entity": cfg.multi_hop_max_per_entity,
        "hop_scan_limit": MULTI_HOP_SCAN_LIMIT,
    }


async def searched_terms(
    conn: AsyncConnection, scope: Scope, query: str, cfg: ContextSettings
) -> list[str]:
    """The query's content words that the text search uses.

    A word found in more facts of the scope than `text_term_max_facts` is left out: too common
    to rank by, and ranking all its matches would cost more than the vector search. Needs no
    vector: a context call runs it once, while the query is embedded.
    """
    words = query_terms(query)
    if not words:
        return []
    params = {**_scope_params(scope), "terms": words, "term_max_facts": cfg.text_term_max_facts}
    cur = await conn.execute(SEARCHED_TERMS_SQL[scope.historical], params)
    return [row[0] for row in await cur.fetchall()]


def unseen_score_bound(row: dict[str, Any], params: dict[str, Any]) -> float:
    """The highest hybrid score a fact outside the union could have (-inf: none is left out).

    The newest facts (the window) were all scored on cosine + recency: an unseen one scores at
    most the lowest partial score kept from them. An older unseen fact is either inside the
    recency window (cosine at most the K-th nearest of the window) or older (cosine at most the
    K-th nearest overall, recency at most that of the window's edge), its recency at most that
    of the oldest fact of the newest window. A source that returned fewer rows than asked
    returned every fact it could. An unseen fact's text rank is at most the K-th best rank, or
    0 when the text source returned every match.
    """
    if row["vector_rows"] < params["top_k"]:
        return float("-inf")  # the vector source returned every visible fact
    rank = float(row["text_min_rank"]) if row["text_rows"] >= params["top_k"] else 0.0
    base = params["w_text_rank"] * rank

    def recency(since: datetime) -> float:
        age = (params["at"] - since).total_seconds()
        return math.exp(-max(age, 0.0) / params["tau_seconds"])

    bounds = []
    edge = 1.0  # the recency of the newest unseen fact outside the window
    if params["newest_k"]:
        if row["newest_rows"] >= params["newest_k"]:
            bounds.append(base + float(row["newest_min_partial"]))
        if row["window_rows"] < params["newest_window"]:
            return max(bounds, default=float("-inf"))  # the window holds every visible fact
        edge = recency(row["window_oldest"])
    nearest = 1.0 - float(row["vector_max_distance"])
    if params["recent_k"] == 0:
        bounds.append(base + params["w_similarity"] * nearest + params["w_recency"] * edge)
    elif row["recent_rows"] >= params["recent_k"]:
        nearest_recent = 1.0 - float(row["recent_max_distance"])
        bounds.append(base + params["w_similarity"] * nearest_recent + params["w_recency"] * edge)
    old = min(recency(params["recent_since"]), edge)
    bounds.append(base + params["w_similarity"] * nearest + params["w_recency"] * old)
    return max(bounds)


def is_exact(rows: list[dict[str, Any]], params: dict[str, Any], top_n: int) -> bool:
    """True when no fact outside the union can enter the top `top_n` (threshold algorithm)."""
    if not rows:
        return True
    bound = unseen_score_bound(rows[0], params)
    if bound == float("-inf") or top_n == 0:
        return True
    return len(rows) >= top_n and rows[top_n - 1]["score"] >= bound


async def fetch_fact_candidates(
    conn: AsyncConnection,
    scope: Scope,
    query: str,
    vector: np.ndarray,
    cfg: ContextSettings,
    *,
    exact: bool = False,
    terms: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Scored fact candidates, best first.

    Two-phase by default: if the bounds of phase 1 show that an unseen fact could still enter
    the top `exact_top_n`, phase 1 is widened (K x 4, up to `retrieval_top_k_max`) and run
    again. `exact` scores every visible fact instead (the reference ranking). `terms` are the
    query's `searched_terms` when the caller has them already.
    """
    if terms is None:
        terms = await searched_terms(conn, scope, query, cfg)
    params = _params(scope, vector, cfg, terms)
    cur = conn.cursor(row_factory=dict_row)
    if exact:
        await cur.execute(EXACT_SQL[scope.historical], params)
        return await cur.fetchall()
    while True:
        await cur.execute(CANDIDATES_SQL[scope.historical], params)
        rows = await cur.fetchall()
        if params["top_k"] >= cfg.retrieval_top_k_max or is_exact(rows, params, cfg.exact_top_n):
            return rows
        params["top_k"] = min(params["top_k"] * 4, cfg.retrieval_top_k_max)
        params["recent_k"] = min(params["recent_k"] * 4, cfg.retrieval_top_k_max)


async def fetch_multi_hop(
    conn: AsyncConnection,
    scope: Scope,
    query: str,
    vector: np.ndarray,
    cfg: ContextSettings,
    entities: Sequence[str],
    exclude_ids: Sequence[str],
    terms: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Facts sharing an entity with the retained ones (no new embedding), best first."""
    if terms is None:
        terms = await searched_terms(conn, scope, query, cfg)
    params = _params(scope, vector, cfg, terms)
    params["entities"] = list(entities)
    params["exclude"] = list(exclude_ids)
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(MULTI_HOP_SQL[scope.historical], params)
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
SELECT call.trace_id, d.* FROM call, unnest(
    %(sequence)s::int[], %(candidate_id)s::uuid[], %(candidate_kind)s::text[],
    %(outcome)s::text[], %(reason_code)s::text[], %(score)s::float8[], %(similarity)s::float8[],
    %(text_rank)s::float8[], %(recency)s::float8[], %(tokens)s::int[], %(budget_used)s::int[],
    %(preview)s::text[]
) AS d
"""


async def save_trace(
    conn: AsyncConnection, call: CallRecord, decision_rows: Sequence[Sequence[Any]]
) -> None:
    """Persist a call and all its decisions in one statement (one round trip)."""
    params: dict[str, Any] = dict(call.__dict__)
    columns = list(zip(*decision_rows, strict=True)) if decision_rows else [()] * 12
    params.update(zip(TRACE_COLUMNS[1:], (list(c) for c in columns), strict=True))
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
