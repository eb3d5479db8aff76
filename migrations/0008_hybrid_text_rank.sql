-- depends: 0007_context_read_costs
-- A stemmed, IDF-weighted text rank (BM25) for facts *and* events (README "Context assembly",
-- benchmarks/locomo.md):
--
-- 1. satchel_text_config(text): the text search configuration of a text, `french` when it holds
--    more French than English function words, else `english` (Snowball stemming and stop words
--    of that language). Facts and events store their stemmed lexemes (`lexemes`) and how many
--    words those lexemes hold (`lexeme_tokens`, BM25's document length), both generated.
-- 2. scope_lexemes / scope_documents: per scope, how many documents (facts and events alike)
--    hold each lexeme, how many documents and words there are (BM25's document frequency, N and
--    average length). Counted on write, in the transaction that inserts the rows, in key order
--    (like fact_term_counts); facts and events are never deleted, so counts only grow.
-- 3. satchel_any_lexeme(text[]): the tsquery matching any of a query's lexemes (GIN). The BM25
--    of a document is computed inline by the context statements (server/storage/context.py).
-- 4. facts_source_events: finds the facts drawn from an event (an episode whose facts are all
--    hidden is not served).
--
-- Rows written before this migration are classified by the same function, so nothing needs
-- re-embedding; the table rewrites take about as long as migration 0007's.

CREATE FUNCTION satchel_text_config(body text) RETURNS regconfig
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN (
        SELECT count(*) FILTER (WHERE w = ANY ('{le,la,les,des,une,et,est,je,tu,il,elle,nous,vous,
            ils,elles,que,qui,pour,dans,pas,du,au,aux,ce,cette,sur,avec,mon,ma,mes,ton,ta,tes,son,
            sa,ses,leur,mais,ou,où,très,aussi,être,avoir,été,sont,suis,j,c,d,l,n,qu,s}'::text[]))
             - count(*) FILTER (WHERE w = ANY ('{the,and,is,are,was,were,of,to,in,it,you,that,this,
            for,on,with,my,your,his,her,their,our,be,been,have,has,had,do,does,did,not,but,or,at,
            by,from,what,when,where,who,how,why,which,an,i,me,we,they,he,she,a}'::text[]))
        FROM regexp_split_to_table(lower(body), '[^[:alpha:]]+') AS w
    ) > 0 THEN 'pg_catalog.french'::regconfig ELSE 'pg_catalog.english'::regconfig END;

-- How many words a tsvector's lexemes hold (a lexeme without positions counts once).
CREATE FUNCTION satchel_lexeme_tokens(doc tsvector) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (SELECT coalesce(sum(coalesce(array_length(d.positions, 1), 1)), 0)::integer
            FROM unnest(doc) AS d);

-- Lexemes are matched as they are (quoted): no parsing, stemming or operator in them applies.
CREATE FUNCTION satchel_any_lexeme(terms text[]) RETURNS tsquery
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (
        SELECT string_agg(
            '''' || replace(replace(t, '\', '\\'), '''', '''''') || '''', ' | ')::tsquery
        FROM unnest(terms) AS t WHERE t <> ''
    );

ALTER TABLE facts
    ADD COLUMN lexemes tsvector
        GENERATED ALWAYS AS (to_tsvector(satchel_text_config(statement), statement)) STORED,
    ADD COLUMN lexeme_tokens integer
        GENERATED ALWAYS AS (
            satchel_lexeme_tokens(to_tsvector(satchel_text_config(statement), statement))
        ) STORED;
CREATE INDEX facts_lexemes ON facts USING gin (lexemes) WITH (fastupdate = off);
CREATE INDEX facts_source_events ON facts USING gin (source_event_ids);

ALTER TABLE events
    ADD COLUMN lexemes tsvector
        GENERATED ALWAYS AS (to_tsvector(satchel_text_config(text), text)) STORED,
    ADD COLUMN lexeme_tokens integer
        GENERATED ALWAYS AS (satchel_lexeme_tokens(to_tsvector(satchel_text_config(text), text)))
        STORED;
CREATE INDEX events_lexemes ON events USING gin (lexemes) WITH (fastupdate = off);

CREATE TABLE scope_lexemes (
    project_id text NOT NULL,
    subject_id text NOT NULL,
    lexeme     text NOT NULL,
    documents  integer NOT NULL,
    PRIMARY KEY (project_id, subject_id, lexeme)
);

CREATE TABLE scope_documents (
    project_id text NOT NULL,
    subject_id text NOT NULL,
    documents  integer NOT NULL,
    tokens     bigint NOT NULL,
    PRIMARY KEY (project_id, subject_id)
);

INSERT INTO scope_lexemes (project_id, subject_id, lexeme, documents)
SELECT project_id, subject_id, lexeme, count(*) FROM (
    SELECT f.project_id, f.subject_id, t.lexeme
    FROM facts f CROSS JOIN unnest(tsvector_to_array(f.lexemes)) AS t(lexeme)
    UNION ALL
    SELECT e.project_id, e.subject_id, t.lexeme
    FROM events e CROSS JOIN unnest(tsvector_to_array(e.lexemes)) AS t(lexeme)
) words
GROUP BY project_id, subject_id, lexeme;

INSERT INTO scope_documents (project_id, subject_id, documents, tokens)
SELECT project_id, subject_id, count(*), sum(lexeme_tokens) FROM (
    SELECT project_id, subject_id, lexeme_tokens FROM facts
    UNION ALL
    SELECT project_id, subject_id, lexeme_tokens FROM events
) docs
GROUP BY project_id, subject_id;
