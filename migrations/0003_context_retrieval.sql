-- depends: 0001_initial
-- Context retrieval: the recency source of phase 1 reads the newest facts of a scope from an
-- index, and the full-text index is kept without a pending list so that reads never scan one.

CREATE INDEX facts_scope_recency
    ON facts (project_id, subject_id, (coalesce(valid_from, recorded_from)) DESC)
    WHERE status = 'active';

ALTER INDEX facts_search_vector SET (fastupdate = off);
