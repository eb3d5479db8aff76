-- depends: 0012_trace_retention
-- Scope indexes (README "Running at scale", "Large scopes"): a scope holding more active facts
-- than SATCHEL_EXACT_SCOPE_MAX gets indexes of its own, partial indexes of `facts` on its
-- (project, subject) and status = 'active': an HNSW graph of its vectors, and GIN indexes of
-- its lexemes (hybrid text rank) and of its words (multi-hop, the seed's text rank). Under a
-- scope filter, the global HNSW graph is walked across every tenant's facts (~200 ms for a
-- 100,000-fact scope among a million facts, benchmarks/context.md) and a global GIN index lists
-- a word's matches in every scope; the scope's own indexes hold its facts alone.
--
-- The servers build and drop these indexes themselves (server/scope_indexes.py, CREATE and
-- DROP INDEX CONCURRENTLY, one replica at a time); this table records which scope has indexes
-- (named `index_prefix` + _hnsw, _lexemes, _words), and whether they are ready to serve (a build that died leaves `building`, rebuilt by
-- the next run). A context call reads it to plan its statement for its own scope's values,
-- which a partial index needs.
CREATE TABLE scope_indexes (
    project_id    text NOT NULL,
    subject_id    text NOT NULL,
    index_prefix  text NOT NULL UNIQUE,
    state         text NOT NULL CHECK (state IN ('building', 'ready')),
    -- active facts of the scope when the build started, and how long the build took
    facts         integer NOT NULL,
    build_seconds double precision,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, subject_id)
);
