-- depends: 0006_hnsw_build_quality
-- Two costs of every context call, paid once on write instead (benchmarks/context.md):
--
-- 1. fact_term_counts: how many facts of each scope hold each word (the lexemes of
--    search_vector). The text search leaves out words too common to rank by; it counted each
--    word's matches on every call (10 ms at 100k facts). Statements never change and facts are
--    never deleted, so a count only grows: the write path adds the new facts' words as the last
--    statement of its transaction, in one statement and in key order (writers of one scope
--    queue on a shared word, they never deadlock).
-- 2. since_epoch: when a fact's validity starts (valid_from, else recorded_from) in seconds
--    since 1970, stored. Recency is exp(-(at - since) / tau); converting the timestamp on each
--    scored row was a third of the cost of scoring the newest facts of a scope.

CREATE TABLE fact_term_counts (
    project_id text NOT NULL,
    subject_id text NOT NULL,
    term       text NOT NULL,
    facts      integer NOT NULL,
    PRIMARY KEY (project_id, subject_id, term)
);

INSERT INTO fact_term_counts (project_id, subject_id, term, facts)
SELECT f.project_id, f.subject_id, t.term, count(*)
FROM facts f CROSS JOIN unnest(tsvector_to_array(f.search_vector)) AS t(term)
GROUP BY f.project_id, f.subject_id, t.term;

-- The epoch of an instant does not depend on the session's time zone: immutable.
CREATE FUNCTION satchel_epoch(timestamptz) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN date_part('epoch', $1);

ALTER TABLE facts ADD COLUMN since_epoch double precision
    GENERATED ALWAYS AS (satchel_epoch(coalesce(valid_from, recorded_from))) STORED;
