"""The SQL that the context statements share, rendered from the score's definition.

What a scope shows at an instant (facts visible now or as of a past instant, events), the score's
parts as SQL (`context/domain/score.py` renders the recency, BM25 and weighted sum), the two
text rankings (`TEXT_RANKS`: hybrid BM25, the seed's ts_rank_cd), the columns a scored fact
returns, and `render`, which writes each statement once per (ranking, historical) variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from satchel.server.context.domain.score import (
    SQL_BM25_TF_SCALE,
    SQL_TEXT_FULL,
    sql_bm25_norm,
    sql_recency,
    sql_score,
)
from satchel.server.context.domain.text_query import MAX_QUERY_TERMS, TS_RANK_UNIT
from satchel.server.context.ranking import ranking_of
from satchel.server.memory.storage.records import FACT_VISIBLE_AT
from satchel.server.platform.config import ContextSettings
from satchel.server.platform.storage.statements import Statement

if TYPE_CHECKING:
    from satchel.server.context.storage.plan import QueryPlan

MULTI_HOP_SCAN_LIMIT = 256


@dataclass(frozen=True)
class Scope:
    """What one context call may see: a scope, an instant, and whether that instant is now."""

    project_id: str
    subject_id: str
    at: datetime
    historical: bool


# Facts visible at %(at)s. "now" uses the partial indexes on active facts; as_of reads history.
CURRENT_FACTS = """
    f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s
    AND f.status = 'active'
    AND (f.valid_to IS NULL OR f.valid_to > %(at)s)
"""


FACTS_AS_OF = (
    """
    f.project_id = %(project_id)s AND f.subject_id = %(subject_id)s AND
"""
    + FACT_VISIBLE_AT
)


# The recency of a fact `f` at %(at)s (score.py); `since_epoch` is when its validity starts, in
# seconds (a stored column: migration 0007). An event's counts from when it occurred.
RECENCY = sql_recency("f.since_epoch")


# The older facts among the `scored` ones that each restates (context/domain/updates.py): same
# predicate,
# valid earlier, vectors at least %(newer_wins)s close in cosine (0: off). The vectors of the
# scored facts are read once (`vectors`), only when the rule is on, and every pair is compared
# in one join.
RESTATED = """vectors AS MATERIALIZED (
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


RESTATES = "coalesce(restated.restates, '{}')"


JOIN_RESTATED = "LEFT JOIN restated USING (id)"


# The hard filters that hide a visible fact `f` at %(at)s.
# (The age is compared, not the instant it ends: valid_from + stale_after can pass 9999-12-31.)
EXPIRED = """(f.stale_after IS NOT NULL
        AND %(at)s - coalesce(f.valid_from, f.recorded_from) >= f.stale_after)"""


IN_OPEN_CONFLICT = """EXISTS (
        SELECT 1 FROM conflict_members m
        JOIN conflict_sets c ON c.id = m.conflict_id AND c.project_id = m.project_id
        WHERE m.fact_id = f.id AND m.project_id = f.project_id AND c.opened_at <= %(at)s
          AND (c.status = 'open' OR c.resolved_at > %(at)s)
    )"""


# The columns packing needs, the score parts and the hard-filter flags of a fact `f`.
SCORED_COLUMNS = f"""
    f.id, f.predicate, f.value, f.statement, f.confidence, f.valid_from, f.source_event_ids,
    f.since_epoch,
    1 - (f.embedding <=> %(vector)s) AS similarity,
    {{text_rank}} AS text_rank,
    {RECENCY} AS recency,
    {EXPIRED} AS expired,
    {IN_OPEN_CONFLICT} AS in_open_conflict
"""


# Okapi BM25 (k1 = 1.2, b = 0.75) of a document `{d}` for the searched lexemes `q.terms` and their
# IDF `q.idfs`. A document that holds each searched lexeme at most once (none of them among its
# `repeated_lexemes`, migration 0009) has tf = 1 for the lexemes it holds: its BM25 is the sum of
# their IDF times 2.2 / (1 + K), K = 1.2 x its length norm, one `@@` per searched lexeme (`q.qN`,
# NULL beyond the query's lexemes). Otherwise its frequencies are read from its lexemes: those of
# the query are marked (weight A) and kept alone, so only they are unnested. Inline rather than
# a SQL function: a call per document cost 5x more.
BM25_K = sql_bm25_norm("{d}")


TERM_SLOTS = range(1, MAX_QUERY_TERMS + 1)


BM25_HELD_IDFS = " + ".join(
    f"CASE WHEN {{d}}.lexemes @@ q.q{i} THEN q.idf{i} ELSE 0.0 END" for i in TERM_SLOTS
)


BM25 = f"""(CASE WHEN {{d}}.repeated_lexemes @@ q.tsq THEN (
    SELECT coalesce(sum(t.idf * cardinality(l.positions) * {SQL_BM25_TF_SCALE}
        / (cardinality(l.positions) + {BM25_K})), 0.0)
    FROM unnest(ts_filter(setweight({{d}}.lexemes, 'A', q.terms), '{{{{a}}}}')) AS l
    JOIN unnest(q.terms, q.idfs) AS t(term, idf) ON t.term = l.lexeme
) ELSE ({BM25_HELD_IDFS}) * {SQL_BM25_TF_SCALE} / (1 + {BM25_K}) END)"""


HYBRID_QUERY = """SELECT satchel_any_lexeme(%(terms)s::text[]) AS tsq,
    %(terms)s::text[] AS terms, %(idfs)s::float8[] AS idfs, """ + ", ".join(
    f"satchel_any_lexeme((%(terms)s::text[])[{i}:{i}]) AS q{i}, (%(idfs)s::float8[])[{i}] AS idf{i}"
    for i in TERM_SLOTS
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
        query=HYBRID_QUERY,
        match="{d}.lexemes @@ q.tsq",
        raw=BM25,
        full=f"SELECT {SQL_TEXT_FULL} AS value FROM hits",
    ),
}


# A statement that ranks a few facts only (multi-hop) takes the candidates' `text_full`.
GIVEN_TEXT_FULL = "SELECT %(text_rank_full)s::float8 AS value"


TEXT_FULL = "(SELECT value FROM text_full)"


def text_rank_of(text: TextRank, alias: str) -> str:
    """The text rank of document `alias`: 0 unless it matches (the raw rank is the costly part
    of scoring, so it runs on matching documents only)."""
    raw = text.raw.format(d=alias)
    return (
        f"CASE WHEN {text.match.format(d=alias)} THEN least(1.0, {raw} / {TEXT_FULL}) ELSE 0.0 END"
    )


SCORE = sql_score("similarity", "text_rank", "recency")


# The same score straight from a fact `f`, to rank many facts before reading their columns.
FACT_SCORE = sql_score("(1 - (f.embedding <=> %(vector)s))", "{text_rank}", RECENCY)


# Events visible at %(at)s, and whether every fact drawn from an event `e` is hidden (superseded,
# retired, no longer valid, expired or in an open conflict): such an episode would serve again
# what the filters hid.
VISIBLE_EVENTS = """
    e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s
    AND (NOT %(historical)s OR (e.occurred_at <= %(at)s AND e.recorded_at <= %(at)s))
"""


EVENT_RECENCY = sql_recency("satchel_epoch(e.occurred_at)")


# The version of a scope's events or facts (migration 0018; 0 before their first write since).
VERSION = """SELECT coalesce(max(v.{kind}), 0) AS version FROM scope_versions v
    WHERE v.project_id = %(project_id)s AND v.subject_id = %(subject_id)s"""


def render(template: str, **fragments: str) -> dict[tuple[str, bool], Statement]:
    """The variants of a statement, by (ranking, historical): `template` with the shared
    fragments above and its own `fragments` filled in."""
    variants = {}
    for ranking, text in TEXT_RANKS.items():
        fact_rank = text_rank_of(text, "f")
        pooled_rank = f"coalesce(pool.text_rank, {fact_rank})"
        for historical, visible in ((False, CURRENT_FACTS), (True, FACTS_AS_OF)):
            variants[(ranking, historical)] = Statement.parse(
                template.format(
                    visible=visible,
                    visible_events=VISIBLE_EVENTS,
                    expired=EXPIRED,
                    in_open_conflict=IN_OPEN_CONFLICT,
                    recency=RECENCY,
                    event_recency=EVENT_RECENCY,
                    columns=SCORED_COLUMNS.format(text_rank=fact_rank),
                    pooled_columns=SCORED_COLUMNS.format(text_rank=pooled_rank),
                    score=SCORE,
                    text_query=text.query,
                    match=text.match.format(d="f"),
                    raw_rank=text.raw.format(d="f"),
                    event_match=text.match.format(d="e"),
                    event_raw_rank=text.raw.format(d="e"),
                    text_full=text.full,
                    given_text_full=GIVEN_TEXT_FULL,
                    text_full_value=TEXT_FULL,
                    restates=RESTATES,
                    restated=RESTATED,
                    join_restated=JOIN_RESTATED,
                    pooled_fact_score=FACT_SCORE.format(text_rank=pooled_rank),
                    scanned_score=sql_score("(1 - f.distance)", "f.text_rank", RECENCY),
                    partial_score=sql_score("(1 - (f.embedding <=> %(vector)s))", None, RECENCY),
                    seed_episode_score=sql_score(
                        "(1 - (e.embedding <=> %(vector)s))", None, EVENT_RECENCY
                    ),
                    **fragments,
                )
            )
    return variants


def scope_params(scope: Scope) -> dict[str, Any]:
    return {
        "project_id": scope.project_id,
        "subject_id": scope.subject_id,
        "at": scope.at,
        "at_epoch": scope.at.timestamp(),
        "historical": scope.historical,
    }


# Scopes with indexes of their own whose statements are kept written (`for_scope`).
SCOPED_STATEMENTS = 256


@lru_cache(maxsize=SCOPED_STATEMENTS)
def for_scope(statement: Statement, project_id: str, subject_id: str) -> Statement:
    """`statement` with one scope's project and subject written in: its generic plan, made once
    per connection, reads the partial indexes of a scope with indexes of its own, which a plan
    for each call's values did at 2-6 ms of planning a call (docs/scale.md "Large scopes")."""
    return statement.with_literals({"project_id": project_id, "subject_id": subject_id})


def call_params(
    scope: Scope, vector: np.ndarray, cfg: ContextSettings, plan: QueryPlan | None = None
) -> dict[str, Any]:
    terms = plan.terms if plan is not None else []
    ranking = ranking_of(cfg)
    if ranking.bm25_text_rank:
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
        **scope_params(scope),
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
        **ranking.weights.sql_params(),
        "newer_wins": ranking.newer_wins_similarity,
        "per_entity": cfg.multi_hop_max_per_entity,
        "hop_scan_limit": MULTI_HOP_SCAN_LIMIT,
    }
