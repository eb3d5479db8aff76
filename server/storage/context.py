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

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import orjson
import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from satchel.server.config import ContextSettings
from satchel.server.domain.episode_ranking import ScopeEvents
from satchel.server.domain.fact_ranking import NEVER, ScopeFacts
from satchel.server.domain.hybrid_scores import postings_of
from satchel.server.domain.retrieval import SourceReport, Weights, holds_top, unseen_score_bound
from satchel.server.domain.text_query import MAX_QUERY_TERMS, TS_RANK_UNIT, query_terms
from satchel.server.storage.memory import FACT_VISIBLE_AT
from satchel.server.storage.pool import generic_plans, per_call_plans
from satchel.server.storage.retention import maintain_traces
from satchel.server.storage.statements import Statement, fetch_all

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
    """What a context call knows before its query is embedded: the searched words, the
    scope's active facts (counted up to one more than `exact_scope_max`), and whether the scope
    has indexes of its own (migration 0013), which its statements must be planned for
    its values to use.

    Hybrid ranking only: `terms` are stemmed lexemes with their BM25 `idfs` and `avg_tokens`
    the scope's average document length (facts and events alike).
    """

    terms: list[str]
    scope_facts: int
    idfs: list[float] = field(default_factory=list)
    avg_tokens: float = 1.0
    scope_indexed: bool = False
    # The versions of the scope's events and facts (hybrid ranking; None: not read), see
    # scope_cache.py.
    events_version: int | None = None
    facts_version: int | None = None


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

# The recency of a fact `f` at %(at)s: exp(-age / tau), ages in the future counting as 0 and
# exponents below -700 as -700 (exp(-700) ~ 1e-304: PostgreSQL raises on underflow, which a fact
# or an event ~61 years old, or a far `as_of`, reached). `since_epoch` is when its validity
# starts, in seconds (a stored column: migration 0007).
_DECAY = "exp(greatest(least({since} - %(at_epoch)s, 0.0) / %(tau_seconds)s, -700.0))"
_RECENCY = _DECAY.format(since="f.since_epoch")

# The older facts among the `scored` ones that each restates (domain/updates.py): same predicate,
# valid earlier, vectors at least %(newer_wins)s close in cosine (0: off). The vectors of the
# scored facts are read once (`vectors`), only when the rule is on, and every pair is compared
# in one join.
_RESTATED = """vectors AS MATERIALIZED (
    SELECT f.id, f.embedding FROM facts f JOIN scored USING (id)
    WHERE %(newer_wins)s > 0 AND f.project_id = %(project_id)s
),
restated AS (
    SELECT n.id, array_agg(o.id) AS restates
    FROM scored n JOIN vectors vn ON vn.id = n.id
    JOIN scored o ON o.predicate = n.predicate AND o.since_epoch < n.since_epoch
    JOIN vectors vo ON vo.id = o.id
    WHERE 1 - (vo.embedding <=> vn.embedding) >= %(newer_wins)s
    GROUP BY n.id
)"""
_RESTATES = "coalesce(restated.restates, '{}')"
_JOIN_RESTATED = "LEFT JOIN restated USING (id)"

# The hard filters that hide a visible fact `f` at %(at)s.
# (The age is compared, not the instant it ends: valid_from + stale_after can pass 9999-12-31.)
_EXPIRED = """(f.stale_after IS NOT NULL
        AND %(at)s - coalesce(f.valid_from, f.recorded_from) >= f.stale_after)"""
_IN_OPEN_CONFLICT = """EXISTS (
        SELECT 1 FROM conflict_members m
        JOIN conflict_sets c ON c.id = m.conflict_id AND c.project_id = m.project_id
        WHERE m.fact_id = f.id AND m.project_id = f.project_id AND c.opened_at <= %(at)s
          AND (c.status = 'open' OR c.resolved_at > %(at)s)
    )"""

# The columns packing needs, the score parts and the hard-filter flags of a fact `f`.
_SCORED_COLUMNS = f"""
    f.id, f.predicate, f.value, f.statement, f.confidence, f.valid_from, f.source_event_ids,
    f.since_epoch,
    1 - (f.embedding <=> %(vector)s) AS similarity,
    {{text_rank}} AS text_rank,
    {_RECENCY} AS recency,
    {_EXPIRED} AS expired,
    {_IN_OPEN_CONFLICT} AS in_open_conflict
"""

# Okapi BM25 (k1 = 1.2, b = 0.75) of a document `{d}` for the searched lexemes `q.terms` and their
# IDF `q.idfs`. A document that holds each searched lexeme at most once (none of them among its
# `repeated_lexemes`, migration 0009) has tf = 1 for the lexemes it holds: its BM25 is the sum of
# their IDF times 2.2 / (1 + K), K = 1.2 x its length norm, one `@@` per searched lexeme (`q.qN`,
# NULL beyond the query's lexemes). Otherwise its frequencies are read from its lexemes: those of
# the query are marked (weight A) and kept alone, so only they are unnested. Inline rather than
# a SQL function: a call per document cost 5x more.
_BM25_K = "1.2 * (0.25 + 0.75 * {d}.lexeme_tokens / %(avg_tokens)s)"
_TERM_SLOTS = range(1, MAX_QUERY_TERMS + 1)
_BM25_HELD_IDFS = " + ".join(
    f"CASE WHEN {{d}}.lexemes @@ q.q{i} THEN q.idf{i} ELSE 0.0 END" for i in _TERM_SLOTS
)
_BM25 = f"""(CASE WHEN {{d}}.repeated_lexemes @@ q.tsq THEN (
    SELECT coalesce(sum(t.idf * cardinality(l.positions) * 2.2
        / (cardinality(l.positions) + {_BM25_K})), 0.0)
    FROM unnest(ts_filter(setweight({{d}}.lexemes, 'A', q.terms), '{{{{a}}}}')) AS l
    JOIN unnest(q.terms, q.idfs) AS t(term, idf) ON t.term = l.lexeme
) ELSE ({_BM25_HELD_IDFS}) * 2.2 / (1 + {_BM25_K}) END)"""
_HYBRID_QUERY = """SELECT satchel_any_lexeme(%(terms)s::text[]) AS tsq,
    %(terms)s::text[] AS terms, %(idfs)s::float8[] AS idfs, """ + ", ".join(
    f"satchel_any_lexeme((%(terms)s::text[])[{i}:{i}]) AS q{i}, (%(idfs)s::float8[])[{i}] AS idf{i}"
    for i in _TERM_SLOTS
)


@dataclass(frozen=True)
class TextRank:
    """How a ranking matches and ranks text: the query `q.tsq`, what a document `{d}` matches
    it on, its raw rank, and the CTE `text_full` (what a raw rank is divided by, from the
    matches `hits`). Every text rank is `least(1, raw / text_full)`, on the cosine's scale."""

    query: str
    match: str
    raw: str
    full: str


TEXT_RANKS = {
    # The seed: any searched word (see `plan_query`) through websearch_to_tsquery, which accepts
    # any text; ts_rank_cd over the `simple` configuration, divided by what a fact holding each
    # searched word once gets (0.1 per word).
    "seed": TextRank(
        query="SELECT websearch_to_tsquery('simple', %(text_query)s) AS tsq",
        match="{d}.search_vector @@ q.tsq",
        raw="ts_rank_cd({d}.search_vector, q.tsq)",
        full="SELECT %(text_rank_full)s::float8 AS value",
    ),
    # Hybrid: any searched lexeme (stemmed in the query's language), Okapi BM25 with the scope's
    # statistics (migration 0008), divided by the best BM25 among the visible documents of the
    # same kind (facts, or events), so that the best match ranks 1.
    "hybrid": TextRank(
        query=_HYBRID_QUERY,
        match="{d}.lexemes @@ q.tsq",
        raw=_BM25,
        full="SELECT greatest(coalesce(max(raw), 0.0), 1e-12) AS value FROM hits",
    ),
}
# A statement that ranks a few facts only (multi-hop) takes the candidates' `text_full`.
_GIVEN_TEXT_FULL = "SELECT %(text_rank_full)s::float8 AS value"
_TEXT_FULL = "(SELECT value FROM text_full)"


def _text_rank_of(text: TextRank, alias: str) -> str:
    """The text rank of document `alias`: 0 unless it matches (the raw rank is the costly part
    of scoring, so it runs on matching documents only)."""
    raw = text.raw.format(d=alias)
    return (
        f"CASE WHEN {text.match.format(d=alias)} THEN least(1.0, {raw} / {_TEXT_FULL}) ELSE 0.0 END"
    )


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
# The scope's active facts, counted up to one more than `exact_scope_max` (an index-only scan).
_SCOPE_FACTS = """(SELECT count(*) FROM (
    SELECT 1 FROM facts f
    WHERE f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s
      AND f.status = 'active'
    LIMIT %(exact_scope_max)s + 1
) scope)"""
_SCOPE_INDEXED = """EXISTS (
    SELECT 1 FROM scope_indexes v
    WHERE v.project_id = %(project_id)s AND v.subject_id = %(subject_id)s AND v.state = 'ready'
)"""
_PLAN_SQL_TEXT = f"""
SELECT ARRAY(
    SELECT t.term FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, position)
    LEFT JOIN fact_term_counts c
        ON c.project_id = %(project_id)s AND c.subject_id = %(subject_id)s AND c.term = t.term
    WHERE coalesce(c.facts, 0) <= %(term_max_facts)s
    ORDER BY t.position
) AS terms,
{_SCOPE_FACTS} AS scope_facts,
{_SCOPE_INDEXED} AS scope_indexed
"""
PLAN_SQL = Statement.parse(_PLAN_SQL_TEXT)

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
    ORDER BY %(w_similarity)s * (1 - f.distance) + %(w_text_rank)s * f.text_rank
        + %(w_recency)s * {recency} DESC, id
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

# Multi-hop: per entity, the facts mentioning it that lie nearest to the query (the query's
# vector is reused: no new embedding), then the usual scoring of those few. An entity found in
# very many facts is searched among its first `hop_scan_limit` matches only, which bounds the
# cost of a common name (a documented trade-off, like phase 1's K). A large scope finds the
# mentions through the text index (GIN: the scope's own when it has one); a small one reads its
# facts' words once through the scope index, so a name common in other scopes costs it nothing,
# and takes its first matches by id (as the scope cache does, domain/fact_ranking.py).
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

# Events visible at %(at)s, and whether every fact drawn from an event `e` is hidden (superseded,
# retired, no longer valid, expired or in an open conflict): such an episode would serve again
# what the filters hid.
_VISIBLE_EVENTS = """
    e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s
    AND (NOT %(historical)s OR (e.occurred_at <= %(at)s AND e.recorded_at <= %(at)s))
"""
_EVENT_RECENCY = _DECAY.format(since="satchel_epoch(e.occurred_at)")
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
# The same flag for episodes ranked in memory (server/scope_cache.py) while the scope's facts
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
           %(w_similarity)s * (1 - (e.embedding <=> %(vector)s))
               + %(w_recency)s * {event_recency} AS score
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
    SELECT parts.*,
           %(w_similarity)s * similarity + %(w_text_rank)s * text_rank
               + %(w_recency)s * recency AS own_score
    FROM (
        SELECT s.id, s.occurred_at, 1 - s.distance AS similarity,
               least(1.0, coalesce(s.raw, 0.0) / {_TEXT_FULL}) AS text_rank,
               {_DECAY.format(since="satchel_epoch(s.occurred_at)")} AS recency
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

# The version of a scope's events or facts (migration 0018; 0 before their first write since).
_VERSION = """SELECT coalesce(max(v.{kind}), 0) AS version FROM scope_versions v
    WHERE v.project_id = %(project_id)s AND v.subject_id = %(subject_id)s"""

# Before the query is embedded, hybrid ranking: the query's lexemes (stemmed in its language)
# found in at most `term_max_facts` documents (facts and events) of the scope, in query order,
# with their IDF and the scope's average document length; the scope's active facts as in
# PLAN_SQL.
_PLAN_HYBRID_SQL_TEXT = f"""
WITH words AS (
    SELECT d.lexeme, d.positions[1] AS position
    FROM unnest(to_tsvector(satchel_text_config(%(query)s), %(query)s)) AS d
),
sizes AS (
    SELECT coalesce(max(s.documents), 0) AS documents, coalesce(max(s.tokens), 0) AS tokens
    FROM scope_documents s
    WHERE s.project_id = %(project_id)s AND s.subject_id = %(subject_id)s
),
terms AS (
    SELECT w.lexeme, w.position,
           ln(1 + (sizes.documents - c.documents + 0.5) / (c.documents + 0.5)) AS idf
    FROM words w, sizes, scope_lexemes c
    WHERE c.project_id = %(project_id)s AND c.subject_id = %(subject_id)s
      AND c.lexeme = w.lexeme AND c.documents <= %(term_max_facts)s
    ORDER BY w.position LIMIT %(max_terms)s
)
SELECT coalesce(array_agg(lexeme ORDER BY position), '{{}}') AS terms,
       coalesce(array_agg(idf ORDER BY position), '{{}}') AS idfs,
       (SELECT greatest(tokens::float8 / greatest(documents, 1), 1.0) FROM sizes) AS avg_tokens,
       {_SCOPE_FACTS} AS scope_facts,
       {_SCOPE_INDEXED} AS scope_indexed,
       ({_VERSION.format(kind="events")}) AS events_version,
       ({_VERSION.format(kind="facts")}) AS facts_version
FROM terms
"""
PLAN_HYBRID_SQL = Statement.parse(_PLAN_HYBRID_SQL_TEXT)


def _render(template: str) -> dict[tuple[str, bool], Statement]:
    """The variants of a statement, by (ranking, historical)."""
    variants = {}
    for ranking, text in TEXT_RANKS.items():
        fact_rank = _text_rank_of(text, "f")
        pooled_rank = f"coalesce(pool.text_rank, {fact_rank})"
        for historical, visible in ((False, _CURRENT_FACTS), (True, _FACTS_AS_OF)):
            variants[(ranking, historical)] = Statement.parse(
                template.format(
                    visible=visible,
                    visible_events=_VISIBLE_EVENTS,
                    expired=_EXPIRED,
                    in_open_conflict=_IN_OPEN_CONFLICT,
                    recency=_RECENCY,
                    event_recency=_EVENT_RECENCY,
                    columns=_SCORED_COLUMNS.format(text_rank=fact_rank),
                    pooled_columns=_SCORED_COLUMNS.format(text_rank=pooled_rank),
                    score=_SCORE,
                    text_query=text.query,
                    match=text.match.format(d="f"),
                    raw_rank=text.raw.format(d="f"),
                    event_match=text.match.format(d="e"),
                    event_raw_rank=text.raw.format(d="e"),
                    text_full=text.full,
                    given_text_full=_GIVEN_TEXT_FULL,
                    text_full_value=_TEXT_FULL,
                    own_of_pool=_POOLED_OWN,
                    restates=_RESTATES,
                    restated=_RESTATED,
                    join_restated=_JOIN_RESTATED,
                    own_of_neighbours=_NEIGHBOURS_OWN,
                    pooled_fact_score=_FACT_SCORE.format(text_rank=pooled_rank),
                )
            )
    return variants


EXACT_SQL = _render(_EXACT_SQL)
CANDIDATES_SQL = _render(_CANDIDATES_SQL)
MULTI_HOP_SQL = _render(_MULTI_HOP_SQL.replace("{hop}", _HOP_BY_INDEX))
MULTI_HOP_SCAN_SQL = _render(_MULTI_HOP_SQL.replace("{hop}", _HOP_BY_SCAN))
EPISODES_SQL = _render(_EPISODES_SQL)
HYBRID_EPISODES_SQL = _render(_HYBRID_EPISODES_SQL)
HIDDEN_SOURCES_SQL = _render(_HIDDEN_SOURCES_SQL)


def _scope_params(scope: Scope) -> dict[str, Any]:
    return {
        "project_id": scope.project_id,
        "subject_id": scope.subject_id,
        "at": scope.at,
        "at_epoch": scope.at.timestamp(),
        "historical": scope.historical,
    }


def _params(
    scope: Scope, vector: np.ndarray, cfg: ContextSettings, plan: QueryPlan | None = None
) -> dict[str, Any]:
    terms = plan.terms if plan is not None else []
    if cfg.ranking == "hybrid":
        text = {
            "terms": terms,
            "idfs": plan.idfs if plan is not None else [],
            "avg_tokens": plan.avg_tokens if plan is not None else 1.0,
            "text_rank_full": 1.0,  # multi-hop: the candidates' text_full
        }
    else:
        text = {
            "text_query": " or ".join(terms),
            "text_rank_full": TS_RANK_UNIT * max(1, len(terms)),
        }
    return {
        **_scope_params(scope),
        **text,
        "vector": vector,
        "top_k": cfg.retrieval_top_k,
        "newest_k": min(cfg.newest_top_k, cfg.newest_window),
        "newest_window": cfg.newest_window,
        "candidate_limit": cfg.candidate_limit,
        "episode_k": cfg.episode_top_k,
        "episode_pool": cfg.episode_pool,
        "context_weight": cfg.episode_context_weight,
        "context_gap": timedelta(seconds=cfg.episode_context_gap_seconds),
        "tau_seconds": cfg.recency_tau_days * 86400.0,
        "w_similarity": cfg.weight_similarity,
        "w_text_rank": cfg.weight_text_rank,
        "w_recency": cfg.weight_recency,
        "newer_wins": cfg.newer_wins_similarity if cfg.ranking == "hybrid" else 0.0,
        "per_entity": cfg.multi_hop_max_per_entity,
        "hop_scan_limit": MULTI_HOP_SCAN_LIMIT,
    }


async def plan_query(
    conn: AsyncConnection, scope: Scope, query: str, cfg: ContextSettings
) -> QueryPlan:
    """The query's searched words and the scope's size, in one round trip without a vector (a
    context call runs it while the query is embedded).

    A word held by more facts of the scope than `text_term_max_facts` (hybrid: documents) is
    left out: too common to rank by, and ranking all its matches would cost more than the
    vector search.
    """
    params = {
        **_scope_params(scope),
        "term_max_facts": cfg.text_term_max_facts,
        "exact_scope_max": cfg.exact_scope_max,
    }
    if cfg.ranking == "hybrid":
        params |= {"query": query, "max_terms": MAX_QUERY_TERMS}
        [row] = await fetch_all(conn, PLAN_HYBRID_SQL, params)
        return QueryPlan(
            terms=list(row["terms"]),
            scope_facts=int(row["scope_facts"]),
            idfs=[float(x) for x in row["idfs"]],
            avg_tokens=float(row["avg_tokens"]),
            scope_indexed=bool(row["scope_indexed"]),
            events_version=int(row["events_version"]),
            facts_version=int(row["facts_version"]),
        )
    params["terms"] = query_terms(query)
    [row] = await fetch_all(conn, PLAN_SQL, params)
    return QueryPlan(
        list(row["terms"]), int(row["scope_facts"]), scope_indexed=bool(row["scope_indexed"])
    )


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
    scope where HNSW cannot find K facts at K max is scored exactly. A scope with indexes of
    its own (scope_indexes.py) starts at K = `scope_index_top_k`, planned for each call's
    values: a generic plan cannot use a partial index, and would walk the global HNSW graph.
    """
    params = _params(scope, vector, cfg, plan)
    variant = (cfg.ranking, scope.historical)
    if exact or plan.scope_facts <= cfg.exact_scope_max:
        async with generic_plans(conn):
            return await fetch_all(conn, EXACT_SQL[variant], params)
    if not plan.scope_indexed or scope.historical:  # history is not in a scope's indexes
        async with generic_plans(conn):
            return await _two_phase(conn, params, cfg, variant)
    params["top_k"] = min(max(cfg.scope_index_top_k, cfg.retrieval_top_k), cfg.retrieval_top_k_max)
    async with per_call_plans(conn):
        return await _two_phase(conn, params, cfg, variant)


async def _two_phase(
    conn: AsyncConnection,
    params: dict[str, Any],
    cfg: ContextSettings,
    variant: tuple[str, bool],
) -> list[dict[str, Any]]:
    """Phase 1 widened until it holds the top (see `fetch_fact_candidates`), then phase 2."""
    top_n = min(cfg.exact_top_n, cfg.candidate_limit)
    while True:
        rows = await fetch_all(conn, CANDIDATES_SQL[variant], params)
        if not rows:
            return rows
        report = source_report(rows[0], params)
        bound = unseen_score_bound(report, weights_of(cfg))
        if holds_top([float(r["score"]) for r in rows], bound, top_n):
            return rows
        if params["top_k"] >= cfg.retrieval_top_k_max:
            if report.vector_rows < params["top_k"]:
                # HNSW cannot reach enough of this scope's facts: score every one of them.
                return await fetch_all(conn, EXACT_SQL[variant], params)
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
    text_full: float | None = None,
) -> list[dict[str, Any]]:
    """Facts sharing an entity with the retained ones (no new embedding), best first; hybrid
    text ranks are divided by the candidates' `text_full` (their best BM25).

    A scope scored exactly (at most `exact_scope_max` facts) scans its own facts' words, with
    the statement's generic plan (`generic_plans`: 4.9 → 2.2 ms on LoCoMo); a larger one looks
    the entities up in the text index, planned for each call's values, which its generic plan
    would not suit (a 100,000-fact scope's call 40 → 60 ms) and which a scope index needs.
    """
    params = _params(scope, vector, cfg, plan)
    if text_full is not None and cfg.ranking == "hybrid":
        params["text_rank_full"] = text_full
    params["entities"] = list(entities)
    params["exclude"] = list(exclude_ids)
    variant = (cfg.ranking, scope.historical)
    if plan.scope_facts <= cfg.exact_scope_max:
        async with generic_plans(conn):
            return await fetch_all(conn, MULTI_HOP_SCAN_SQL[variant], params)
    async with per_call_plans(conn):
        return await fetch_all(conn, MULTI_HOP_SQL[variant], params)


async def fetch_episodes(
    conn: AsyncConnection, scope: Scope, vector: np.ndarray, cfg: ContextSettings, plan: QueryPlan
) -> list[dict[str, Any]]:
    """The scope's best events, best first, with their score parts and whether the facts drawn
    from them are all hidden: hybrid, scored like facts and lifted by their neighbours; seed,
    the nearest to the query vector (HNSW)."""
    if cfg.episode_top_k == 0:
        return []
    params = _params(scope, vector, cfg, plan)
    variant = (cfg.ranking, scope.historical)
    if cfg.ranking != "hybrid":  # the seed's HNSW search, planned for each call's values
        async with per_call_plans(conn):
            return await fetch_all(conn, EPISODES_SQL[variant], params)
    async with generic_plans(conn):
        return await fetch_all(conn, HYBRID_EPISODES_SQL[variant], params)


async def fetch_hidden_sources(
    conn: AsyncConnection, scope: Scope, cfg: ContextSettings, event_ids: Sequence[str]
) -> dict[str, bool]:
    """Whether the facts drawn from each event are all hidden (episodes ranked in memory)."""
    if not event_ids:
        return {}
    params = {**_scope_params(scope), "event_ids": list(event_ids)}
    async with generic_plans(conn):
        rows = await fetch_all(conn, HIDDEN_SOURCES_SQL[(cfg.ranking, scope.historical)], params)
    return {r["id"]: r["source_facts_hidden"] for r in rows}


# Microseconds since the epoch of a finite instant (NULL for NULL).
_MICROS = "(extract(epoch FROM {0}) * 1000000)::int8"
# A stemmed document's lexemes and their frequencies (BM25).
_LEXEMES = """ARRAY(SELECT l.lexeme FROM unnest({d}.lexemes) AS l) AS lexemes,
       ARRAY(SELECT greatest(cardinality(l.positions), 1) FROM unnest({d}.lexemes) AS l)
           AS frequencies"""

# A scope's events in conversation order with what hybrid ranking reads, and the version they
# are (one statement: one snapshot). A scope without events still returns its version (one row
# of NULL events); one beyond the limit is counted first (an index-only scan), and then none is
# read.
_SCOPE_EVENTS_SQL = f"""
WITH version AS (
    SELECT ({_VERSION.format(kind="events")}) AS version,
           (SELECT count(*) FROM (
               SELECT 1 FROM events e
               WHERE e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s
               LIMIT %(max_rows)s + 1
           ) n) > %(max_rows)s AS too_large
)
SELECT version.version, version.too_large, e.id::text AS id, e.kind, e.text, e.occurred_at,
       isfinite(e.occurred_at) AS finite,
       CASE WHEN isfinite(e.occurred_at) THEN {_MICROS.format("e.occurred_at")} END
           AS occurred_us,
       e.embedding, e.lexeme_tokens, {_LEXEMES.format(d="e")}
FROM version LEFT JOIN events e
    ON e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s AND NOT version.too_large
ORDER BY e.occurred_at, e.id
LIMIT %(max_rows)s + 1
"""

# A scope's active facts in id order, likewise, with their conflicts' instants, and the events
# its other facts were drawn from.
_SCOPE_FACTS_SQL = f"""
WITH version AS (
    SELECT ({_VERSION.format(kind="facts")}) AS version,
           ARRAY(
               SELECT DISTINCT s.event_id::text
               FROM facts h CROSS JOIN LATERAL unnest(h.source_event_ids) AS s(event_id)
               WHERE h.project_id = %(project_id)s AND h.subject_id = %(subject_id)s
                 AND h.status <> 'active'
           ) AS inactive_sources
)
SELECT version.version, version.inactive_sources, f.id::text AS id, f.predicate, f.value,
       f.statement, f.confidence, f.valid_from, f.source_event_ids::text[] AS source_event_ids,
       f.since_epoch,
       coalesce(isfinite(f.valid_from), true) AND isfinite(f.recorded_from)
           AND coalesce(isfinite(f.valid_to), true) AS finite,
       {_MICROS.format("coalesce(f.valid_from, f.recorded_from)")} AS anchor_us,
       {_MICROS.format("f.valid_to")} AS valid_to_us,
       {_MICROS.format("f.stale_after")} AS stale_after_us,
       ARRAY(
           SELECT ARRAY[{_MICROS.format("c.opened_at")},
                        CASE WHEN c.status = 'resolved' THEN {_MICROS.format("c.resolved_at")} END]
           FROM conflict_members m
           JOIN conflict_sets c ON c.id = m.conflict_id AND c.project_id = m.project_id
           WHERE m.fact_id = f.id AND m.project_id = f.project_id
       ) AS conflicts,
       f.embedding, f.lexeme_tokens, {_LEXEMES.format(d="f")},
       ARRAY(SELECT w.lexeme FROM unnest(f.search_vector) AS w) AS words
FROM version LEFT JOIN facts f
    ON f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s AND f.status = 'active'
ORDER BY f.id
LIMIT %(max_rows)s + 1
"""


async def _scope_rows(
    conn: AsyncConnection, sql: str, project_id: str, subject_id: str, max_rows: int
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The first row (the version) and the rows of a scope statement; None above `max_rows`
    rows or when an instant is infinite (the statements serve such scopes)."""
    params = {"project_id": project_id, "subject_id": subject_id, "max_rows": max_rows}
    cur = conn.cursor(row_factory=dict_row, binary=True)
    await cur.execute(sql, params)
    rows = await cur.fetchall()
    first = rows[0]
    rows = [r for r in rows if r["id"] is not None]
    if first.get("too_large") or len(rows) > max_rows or not all(r["finite"] for r in rows):
        return None
    return first, rows


def _vectors(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The rows' embeddings as one float32 matrix, and their norms."""
    if not rows:
        return np.zeros((0, 0), dtype=np.float32), np.zeros(0)
    vectors = np.stack([r["embedding"].to_numpy() for r in rows]).astype(np.float32, copy=False)
    return vectors, np.linalg.norm(vectors.astype(np.float64), axis=1)


async def load_scope_events(
    conn: AsyncConnection, project_id: str, subject_id: str, max_rows: int
) -> ScopeEvents | None:
    """A scope's events as hybrid ranking reads them in memory; None above `max_rows`."""
    loaded = await _scope_rows(conn, _SCOPE_EVENTS_SQL, project_id, subject_id, max_rows)
    if loaded is None:
        return None
    return await asyncio.to_thread(_scope_events, *loaded)  # off the event loop: ~20 µs a row


def _scope_events(first: dict[str, Any], rows: list[dict[str, Any]]) -> ScopeEvents:
    vectors, norms = _vectors(rows)
    events = ScopeEvents(
        version=int(first["version"]),
        ids=[r["id"] for r in rows],
        kinds=[r["kind"] for r in rows],
        texts=[r["text"] for r in rows],
        occurred_at=[r["occurred_at"] for r in rows],
        occurred_us=np.array([r["occurred_us"] for r in rows], dtype=np.int64),
        vectors=vectors,
        norms=norms,
        lexeme_tokens=np.array([r["lexeme_tokens"] for r in rows], dtype=np.float64),
        postings=postings_of([(r["lexemes"], r["frequencies"]) for r in rows]),
    )
    events.prepare()
    return events


async def load_scope_facts(
    conn: AsyncConnection, project_id: str, subject_id: str, max_rows: int
) -> ScopeFacts | None:
    """A scope's active facts as hybrid ranking reads them in memory; None above `max_rows`."""
    loaded = await _scope_rows(conn, _SCOPE_FACTS_SQL, project_id, subject_id, max_rows)
    if loaded is None:
        return None
    return await asyncio.to_thread(_scope_facts, *loaded)


def _lowered(words: list[str]) -> tuple[list[str], list[int]]:
    """A fact's words lower-cased as entities are (a database whose LC_CTYPE is C lowers ASCII
    only), each once."""
    lowered = sorted({word.lower() for word in words})
    return lowered, [1] * len(lowered)


def _scope_facts(first: dict[str, Any], rows: list[dict[str, Any]]) -> ScopeFacts:
    vectors, norms = _vectors(rows)

    def instants(column: str, missing: int) -> np.ndarray:
        return np.array([missing if r[column] is None else r[column] for r in rows], dtype=np.int64)

    facts = ScopeFacts(
        version=int(first["version"]),
        ids=[r["id"] for r in rows],
        predicates=[r["predicate"] for r in rows],
        values=[r["value"] for r in rows],
        statements=[r["statement"] for r in rows],
        confidences=[float(r["confidence"]) for r in rows],
        valid_from=[r["valid_from"] for r in rows],
        source_event_ids=[list(r["source_event_ids"]) for r in rows],
        since_epoch=np.array([r["since_epoch"] for r in rows], dtype=np.float64),
        anchor_us=instants("anchor_us", 0),
        valid_to_us=instants("valid_to_us", NEVER),
        stale_after_us=instants("stale_after_us", -1),
        vectors=vectors,
        norms=norms,
        lexeme_tokens=np.array([r["lexeme_tokens"] for r in rows], dtype=np.float64),
        postings=postings_of([(r["lexemes"], r["frequencies"]) for r in rows]),
        words=postings_of([_lowered(r["words"]) for r in rows]),
        conflicts={
            i: [(opened, NEVER if resolved is None else resolved) for opened, resolved in found]
            for i, r in enumerate(rows)
            if (found := r["conflicts"])
        },
        inactive_sources=frozenset(first["inactive_sources"]),
    )
    facts.prepare()
    return facts


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


def _save_trace_sql(durable: bool) -> str:
    """The statement that saves a trace; not `durable`, it commits without waiting for the WAL
    flush: `set_config(..., true)` sets synchronous_commit for the statement's own transaction
    (autocommit: the statement itself)."""
    relax = "" if durable else "relaxed AS (SELECT set_config('synchronous_commit', 'off', true)),"
    return f"""
WITH {relax}
call AS (
    INSERT INTO context_calls (trace_id, project_id, subject_id, query, budget_tokens, as_of,
        status, warnings, empty_reason, tokens_used, facts_served, episodes_served,
        embed_ms, retrieve_ms, pack_ms, total_ms)
    VALUES (%(trace_id)s, %(project_id)s, %(subject_id)s, %(query)s, %(budget_tokens)s,
        %(as_of)s, %(status)s, %(warnings)s, %(empty_reason)s, %(tokens_used)s,
        %(facts_served)s, %(episodes_served)s, %(embed_ms)s, %(retrieve_ms)s, %(pack_ms)s,
        %(total_ms)s)
    -- WatchTraces across replicas: the call is announced on `satchel_traces`, delivered on
    -- commit (a data-modifying CTE runs to completion, even for a call without decisions).
    RETURNING project_id, trace_id, created_at, pg_notify('satchel_traces', json_build_object(
        'project_id', project_id, 'subject_id', subject_id, 'trace_id', trace_id)::text)
)
INSERT INTO context_traces (project_id, created_at, {", ".join(TRACE_COLUMNS)})
SELECT call.project_id, call.created_at, call.trace_id, d.*
FROM call, {"" if durable else "relaxed, "}json_to_recordset(%(decisions)s::json) AS d(
    sequence int, candidate_id uuid, candidate_kind text, outcome text, reason_code text,
    score float8, similarity float8, text_rank float8, recency float8, tokens int,
    budget_used int, preview text
)
"""


_SAVE_TRACE_SQL = {durable: _save_trace_sql(durable) for durable in (True, False)}
# Tries of a trace whose day has no partition (each after making the missing ones).
_PARTITION_ATTEMPTS = 4


async def save_trace(
    conn: AsyncConnection,
    call: CallRecord,
    decision_rows: Sequence[Sequence[Any]],
    *,
    durable: bool = False,
) -> None:
    """Persist a call and all its decisions in one statement (one round trip), committed on
    return; `durable`: once its WAL is on disk too (SATCHEL_TRACE_DURABLE_COMMIT).

    Each decision row holds the values of `TRACE_COLUMNS[1:]`, in order, ids as strings. The
    decisions travel as one JSON array, written by orjson: adapting a dozen typed arrays
    instead took ~1.5 ms of the event loop per call, the standard library's encoder ~0.6 ms.
    """
    params: dict[str, Any] = dict(call.__dict__)
    names = TRACE_COLUMNS[1:]
    rows = [dict(zip(names, row, strict=True)) for row in decision_rows]
    params["decisions"] = orjson.dumps(rows).decode()
    for attempt in range(_PARTITION_ATTEMPTS):
        try:
            await conn.execute(_SAVE_TRACE_SQL[durable], params)
            return
        except psycopg.errors.CheckViolation as exc:
            if not _no_partition(exc) or attempt == _PARTITION_ATTEMPTS - 1:
                raise
        # No partition for today (maintenance could not run for days): make it, then save;
        # another session may be making it (the maintenance lock is taken): wait for it.
        if (await maintain_traces(conn, retention_days=0)).created == 0:
            await asyncio.sleep(0.1 * (attempt + 1))


def _no_partition(exc: psycopg.errors.CheckViolation) -> bool:
    """The error of a row whose partition does not exist."""
    return (exc.diag.message_primary or "").startswith("no partition of relation")


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
        " WHERE trace_id = %s AND project_id = %s ORDER BY sequence",
        (trace_id, project_id),
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
