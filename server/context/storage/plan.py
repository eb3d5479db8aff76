"""Before the query is embedded: the searched words, the scope's size, versions and whether it
has events (one round trip, `plan_query`), which choose the path of the call's other
statements."""

from __future__ import annotations

from dataclasses import dataclass, field

from psycopg import AsyncConnection

from satchel.server.context.domain.text_query import MAX_QUERY_TERMS, query_terms
from satchel.server.context.ranking import ranking_of
from satchel.server.context.storage.sql import VERSION, Scope, scope_params
from satchel.server.platform.config import ContextSettings
from satchel.server.platform.storage.statements import Statement, fetch_all


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
    # Whether the scope has any event: a scope without is asked for no episodes.
    scope_events: bool = True
    # The versions of the scope's events and facts (hybrid ranking; None: not read), see
    # context/scope_cache.py.
    events_version: int | None = None
    facts_version: int | None = None


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


_SCOPE_EVENTS = """EXISTS (
    SELECT 1 FROM events e
    WHERE e.project_id = %(project_id)s AND e.subject_id = %(subject_id)s
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
{_SCOPE_INDEXED} AS scope_indexed,
{_SCOPE_EVENTS} AS scope_events
"""


PLAN_SQL = Statement.parse(_PLAN_SQL_TEXT)


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
       {_SCOPE_EVENTS} AS scope_events,
       ({VERSION.format(kind="events")}) AS events_version,
       ({VERSION.format(kind="facts")}) AS facts_version
FROM terms
"""


PLAN_HYBRID_SQL = Statement.parse(_PLAN_HYBRID_SQL_TEXT)


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
        **scope_params(scope),
        "term_max_facts": cfg.text_term_max_facts,
        "exact_scope_max": cfg.exact_scope_max,
    }
    if ranking_of(cfg).bm25_text_rank:
        params |= {"query": query, "max_terms": MAX_QUERY_TERMS}
        [row] = await fetch_all(conn, PLAN_HYBRID_SQL, params)
        return QueryPlan(
            terms=list(row["terms"]),
            scope_facts=int(row["scope_facts"]),
            idfs=[float(x) for x in row["idfs"]],
            avg_tokens=float(row["avg_tokens"]),
            scope_indexed=bool(row["scope_indexed"]),
            scope_events=bool(row["scope_events"]),
            events_version=int(row["events_version"]),
            facts_version=int(row["facts_version"]),
        )
    params["terms"] = query_terms(query)
    [row] = await fetch_all(conn, PLAN_SQL, params)
    return QueryPlan(
        list(row["terms"]),
        int(row["scope_facts"]),
        scope_indexed=bool(row["scope_indexed"]),
        scope_events=bool(row["scope_events"]),
    )
