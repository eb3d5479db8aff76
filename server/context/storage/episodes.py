"""Episodes: the scope's best events with their score parts, and whether the facts drawn from
each are all hidden (an episode that would serve again what the filters hid)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from psycopg import AsyncConnection

from satchel.server.context.domain.score import (
    sql_recency,
)
from satchel.server.context.domain.scored import ScoredEpisode
from satchel.server.context.ranking import ranking_of
from satchel.server.context.storage.plan import QueryPlan
from satchel.server.context.storage.sql import (
    SCORE,
    TEXT_FULL,
    Scope,
    call_params,
    render,
    scope_params,
)
from satchel.server.platform.config import ContextSettings
from satchel.server.platform.storage.pool import generic_plans, per_call_plans
from satchel.server.platform.storage.statements import fetch_all

# Whether the facts drawn from each of the events `top` are all hidden (one GIN lookup for all).
_DRAWN = """
drawn AS (
    SELECT s.event_id, bool_or({visible} AND NOT {expired} AND NOT {in_open_conflict}) AS shown
    FROM facts f CROSS JOIN LATERAL unnest(f.source_event_ids) AS s(event_id)
    WHERE f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s
      AND f.source_event_ids && (SELECT array_agg(id) FROM top)
    GROUP BY s.event_id
)"""


_SOURCE_FACTS_HIDDEN = "coalesce(NOT drawn.shown, false) AS source_facts_hidden"


# The best events `top`, with whether the facts drawn from each are all hidden.
_EPISODES_TAIL = f"""{_DRAWN}
SELECT top.*, {_SOURCE_FACTS_HIDDEN}
FROM top LEFT JOIN drawn ON drawn.event_id = top.id
ORDER BY top.score DESC, top.id
"""


# The same flag for episodes ranked in memory (server/context/scope_cache.py) while the scope's
# facts
# are not held, by event id.
_HIDDEN_SOURCES_SQL = f"""
WITH top AS (SELECT unnest(%(event_ids)s::uuid[]) AS id),
{_DRAWN}
SELECT top.id::text AS id, {_SOURCE_FACTS_HIDDEN}
FROM top LEFT JOIN drawn ON drawn.event_id = top.id
"""


# The seed's episodes: the nearest events (HNSW), scored on cosine and recency.
_EPISODES_SQL = (
    """
WITH top AS (
    SELECT e.id, e.kind, e.occurred_at, e.text,
           1 - (e.embedding <=> %(vector)s) AS similarity, 0.0::float8 AS text_rank,
           {event_recency} AS recency, 0.0::float8 AS context_similarity,
           {seed_episode_score} AS score
    FROM events e
    WHERE {visible_events}
    ORDER BY e.embedding <=> %(vector)s LIMIT %(episode_k)s
),"""
    + _EPISODES_TAIL
)


# Hybrid episodes. Phase 1: one pass over the scope's events reads each one's instant, distance
# and BM25 (a common word, like a speaker's name, is in most of them: the text index would list
# its matches in every scope); the nearest events and the best BM25 matches are pooled and scored
# like facts (own score). Phase 2: the neighbours in the conversation of the best of them (the
# events just before and after each, within %(context_gap)s), scored too; then each event is
# lifted to its context score when higher: weight x its best neighbour's own score +
# (1 - weight) x its own. A reply ("Yes, last Sunday") then rises with the question it answers.
# Only the best `episode_k` pooled events look for neighbours: a lift is at most the best
# neighbour's score, so an event next to none of them could not enter the top. Every score
# comes from the pass; the events' own columns are read for the final top only.
# The own score of the scanned events joined to `{source}`, from what the pass read.
_EVENT_OWN = f"""
    SELECT parts.*, {SCORE} AS own_score
    FROM (
        SELECT s.id, s.occurred_at, 1 - s.distance AS similarity,
               least(1.0, coalesce(s.raw, 0.0) / {TEXT_FULL}) AS text_rank,
               {sql_recency("satchel_epoch(s.occurred_at)")} AS recency
        FROM scan s JOIN {{source}} USING (id)
        OFFSET 0  -- each part computed once (a flattened subquery would repeat them in the sum)
    ) parts
"""


_POOLED_OWN = _EVENT_OWN.format(source="pool")


_NEIGHBOURS_OWN = _EVENT_OWN.format(
    source="(SELECT DISTINCT b AS id FROM links WHERE b NOT IN (SELECT id FROM pooled)) n",
)


_HYBRID_EPISODES_SQL = (
    """
WITH q AS MATERIALIZED ({text_query}),
scan AS MATERIALIZED (
    SELECT e.id, e.occurred_at, e.embedding <=> %(vector)s AS distance,
           CASE WHEN {event_match} THEN {event_raw_rank} END AS raw
    FROM events e, q WHERE {visible_events}
),
hits AS (SELECT id, raw FROM scan WHERE raw IS NOT NULL),
text_full AS ({text_full}),
by_vector AS (SELECT id FROM scan ORDER BY distance, id LIMIT %(episode_pool)s),
by_text AS (
    SELECT id FROM scan WHERE raw IS NOT NULL ORDER BY raw DESC, distance, id LIMIT %(episode_pool)s
),
pool AS (SELECT id FROM by_vector UNION SELECT id FROM by_text),
pooled AS ({own_of_pool}),
seeds AS (SELECT id, occurred_at FROM pooled ORDER BY own_score DESC, id LIMIT %(episode_k)s),
links AS (
    SELECT p.id AS a, n.id AS b
    FROM seeds p
    CROSS JOIN LATERAL (
        (SELECT e.id FROM events e
         WHERE {visible_events} AND (e.occurred_at, e.id) < (p.occurred_at, p.id)
           AND e.occurred_at >= p.occurred_at - %(context_gap)s
         ORDER BY e.occurred_at DESC, e.id DESC LIMIT 1)
        UNION ALL
        (SELECT e.id FROM events e
         WHERE {visible_events} AND (e.occurred_at, e.id) > (p.occurred_at, p.id)
           AND e.occurred_at <= p.occurred_at + %(context_gap)s
         ORDER BY e.occurred_at, e.id LIMIT 1)
    ) n
),
own_scored AS (
    SELECT * FROM pooled
    UNION ALL ({own_of_neighbours})
),
context AS (
    SELECT l.x AS id, max(o.own_score) AS context_score,
           max(o.similarity) AS context_similarity
    FROM (SELECT a AS x, b AS y FROM links UNION ALL SELECT b, a FROM links) l
    JOIN own_scored o ON o.id = l.y
    GROUP BY l.x
),
lifted AS (
    SELECT o.*, c.context_similarity,
           %(context_weight)s * coalesce(c.context_score, 0.0)
               + (1 - %(context_weight)s) * o.own_score AS context_score
    FROM own_scored o LEFT JOIN context c USING (id)
),
best AS (
    SELECT id, similarity, text_rank, recency,
           greatest(own_score, context_score) AS score,
           -- a lifted episode is as near to the query as its nearest neighbour (the floor)
           CASE WHEN context_score > own_score THEN context_similarity ELSE 0.0 END
               AS context_similarity
    FROM lifted
    ORDER BY score DESC, id LIMIT %(episode_k)s
),
top AS (
    SELECT b.id, e.kind, e.occurred_at, e.text, b.similarity, b.text_rank, b.recency, b.score,
           b.context_similarity
    FROM best b JOIN events e USING (id) WHERE e.project_id = %(project_id)s
),"""
    + _EPISODES_TAIL
)


EPISODES_SQL = render(_EPISODES_SQL)


HYBRID_EPISODES_SQL = render(
    _HYBRID_EPISODES_SQL, own_of_pool=_POOLED_OWN, own_of_neighbours=_NEIGHBOURS_OWN
)


HIDDEN_SOURCES_SQL = render(_HIDDEN_SOURCES_SQL)


async def fetch_episodes(
    conn: AsyncConnection, scope: Scope, vector: np.ndarray, cfg: ContextSettings, plan: QueryPlan
) -> list[ScoredEpisode]:
    """The scope's best events, best first, with their score parts and whether the facts drawn
    from them are all hidden: hybrid, scored like facts and lifted by their neighbours; seed,
    the nearest to the query vector (HNSW)."""
    if cfg.episode_top_k == 0:
        return []
    ranking = ranking_of(cfg)
    params = call_params(scope, vector, cfg, plan)
    variant = (ranking.name, scope.historical)
    if ranking.ranks_episodes_like_facts:
        async with generic_plans(conn):
            rows = await fetch_all(conn, HYBRID_EPISODES_SQL[variant], params)
    else:  # the seed's HNSW search, planned for each call's values
        async with per_call_plans(conn):
            rows = await fetch_all(conn, EPISODES_SQL[variant], params)
    return [ScoredEpisode.from_row(r) for r in rows]


async def fetch_hidden_sources(
    conn: AsyncConnection, scope: Scope, cfg: ContextSettings, event_ids: Sequence[str]
) -> dict[str, bool]:
    """Whether the facts drawn from each event are all hidden (episodes ranked in memory)."""
    if not event_ids:
        return {}
    params = {**scope_params(scope), "event_ids": list(event_ids)}
    async with generic_plans(conn):
        variant = (ranking_of(cfg).name, scope.historical)
        rows = await fetch_all(conn, HIDDEN_SOURCES_SQL[variant], params)
    return {r["id"]: r["source_facts_hidden"] for r in rows}
