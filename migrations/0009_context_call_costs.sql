-- depends: 0008_hybrid_text_rank
-- Three costs of every context call, measured on the LoCoMo scopes (benchmarks/locomo.md,
-- "Latency"):
--
-- 1. Columns read back from TOAST. A fact or event row with its 384-dim vector (1.5 kB) is about
--    2.2 kB, above PostgreSQL's 2 kB TOAST threshold: pgvector's default storage (EXTERNAL)
--    moved the vector out of line, and every cosine fetched it through the TOAST index (a third
--    of the cost of scoring a scope's events); with the vector kept in the row, the lexemes
--    moved out instead, and every BM25 fetched them. Rows up to 4 kB now stay whole (a 768-dim
--    vector's row too), and MAIN keeps a vector in its row even then: the other long columns
--    (text, payload, lexemes) move out first.
-- 2. BM25's term frequencies. Reading a searched lexeme's frequency from a document's tsvector
--    costs ~8 µs a document. Most documents hold each lexeme once, and then BM25 only needs which
--    searched lexemes they hold (one `@@` each, ~0.1 µs). `repeated_lexemes` holds the lexemes a
--    document holds more than once: only a document holding a searched one among them takes the
--    slow path (server/storage/context.py, `_BM25`).
-- 3. Announcing a trace. The NOTIFY of migration 0004 moves from a PL/pgSQL trigger (0.7 ms a
--    call) into the statement that writes the trace; it is still delivered on commit only.
--
-- Adding the generated columns rewrites both tables, which stores the existing rows whole.

ALTER TABLE facts SET (toast_tuple_target = 4080);
ALTER TABLE events SET (toast_tuple_target = 4080);
ALTER TABLE facts ALTER COLUMN embedding SET STORAGE MAIN;
ALTER TABLE events ALTER COLUMN embedding SET STORAGE MAIN;

-- The lexemes a tsvector holds at more than one position.
CREATE FUNCTION satchel_repeated_lexemes(doc tsvector) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN array_to_tsvector(
        ARRAY(SELECT d.lexeme FROM unnest(doc) AS d WHERE cardinality(d.positions) > 1)
    );

ALTER TABLE facts ADD COLUMN repeated_lexemes tsvector GENERATED ALWAYS AS (
    satchel_repeated_lexemes(to_tsvector(satchel_text_config(statement), statement))
) STORED;
ALTER TABLE events ADD COLUMN repeated_lexemes tsvector GENERATED ALWAYS AS (
    satchel_repeated_lexemes(to_tsvector(satchel_text_config(text), text))
) STORED;

DROP TRIGGER context_calls_notify ON context_calls;
DROP FUNCTION satchel_notify_trace();
