-- depends: 0005_api_keys
-- Rebuild the HNSW indexes with ef_construction 128 (pgvector's default is 64). With the default
-- graph, queries that sit far from every dense cluster ("Tell me what Kofi saves money for.")
-- missed facts far nearer than the 64th returned one in 5 of 60 benchmark queries at 100k facts;
-- with 128 the two-phase top-10 equals the exact one for 95 % of them, at the same query cost
-- (benchmarks/context.md). Building costs about twice as long; inserts a little more.

DROP INDEX facts_embedding_hnsw;
CREATE INDEX facts_embedding_hnsw ON facts
    USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128);

DROP INDEX events_embedding_hnsw;
CREATE INDEX events_embedding_hnsw ON events
    USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128);
