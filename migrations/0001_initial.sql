-- satchel: initial schema (facts, events, conflicts, context traces, talents).
-- The vector dimension (384) must match the embedder: the server refuses to start otherwise.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE satchel_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE events (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id      text NOT NULL,
    subject_id      text NOT NULL,
    kind            text NOT NULL,
    payload         jsonb NOT NULL DEFAULT '{}'::jsonb,
    text            text NOT NULL,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    idempotency_key text,
    embedding       vector(384) NOT NULL,
    embedding_model text NOT NULL
);
CREATE UNIQUE INDEX events_idempotency_key ON events (project_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_scope ON events (project_id, subject_id, occurred_at DESC);
CREATE INDEX events_embedding_hnsw ON events USING hnsw (embedding vector_cosine_ops);

CREATE TABLE facts (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id       text NOT NULL,
    subject_id       text NOT NULL,
    predicate        text NOT NULL,
    value            jsonb NOT NULL,
    statement        text NOT NULL,
    confidence       double precision NOT NULL DEFAULT 1.0
                     CHECK (confidence >= 0 AND confidence <= 1),
    status           text NOT NULL DEFAULT 'active'
                     CHECK (status IN ('active', 'retired', 'superseded')),
    status_reason    text,
    superseded_by    uuid REFERENCES facts (id),
    valid_from       timestamptz,
    valid_to         timestamptz,
    recorded_from    timestamptz NOT NULL DEFAULT now(),
    recorded_to      timestamptz,
    source_event_ids uuid[] NOT NULL DEFAULT '{}',
    stale_after      interval,
    idempotency_key  text,
    embedding        vector(384) NOT NULL,
    embedding_model  text NOT NULL,
    search_vector    tsvector GENERATED ALWAYS AS (to_tsvector('simple', statement)) STORED,
    CHECK (valid_to IS NULL OR valid_from IS NULL OR valid_to > valid_from)
);
CREATE UNIQUE INDEX facts_idempotency_key ON facts (project_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX facts_scope_active ON facts (project_id, subject_id) WHERE status = 'active';
CREATE INDEX facts_scope_recorded ON facts (project_id, subject_id, recorded_from);
CREATE INDEX facts_embedding_hnsw ON facts USING hnsw (embedding vector_cosine_ops);
CREATE INDEX facts_search_vector ON facts USING gin (search_vector);

CREATE TABLE conflict_sets (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id      text NOT NULL,
    subject_id      text NOT NULL,
    status          text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    note            text NOT NULL DEFAULT '',
    opened_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    winning_fact_id uuid REFERENCES facts (id)
);
CREATE INDEX conflict_sets_scope ON conflict_sets (project_id, subject_id, status);

CREATE TABLE conflict_members (
    conflict_id uuid NOT NULL REFERENCES conflict_sets (id) ON DELETE CASCADE,
    fact_id     uuid NOT NULL REFERENCES facts (id),
    PRIMARY KEY (conflict_id, fact_id)
);
CREATE INDEX conflict_members_fact ON conflict_members (fact_id);

-- One row per context call; its decisions are in context_traces.
CREATE TABLE context_calls (
    trace_id        uuid PRIMARY KEY,
    project_id      text NOT NULL,
    subject_id      text NOT NULL,
    query           text NOT NULL,
    budget_tokens   integer NOT NULL,
    as_of           timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    status          text NOT NULL,
    warnings        text[] NOT NULL DEFAULT '{}',
    empty_reason    text NOT NULL DEFAULT '',
    tokens_used     integer NOT NULL DEFAULT 0,
    facts_served    integer NOT NULL DEFAULT 0,
    episodes_served integer NOT NULL DEFAULT 0,
    embed_ms        double precision NOT NULL DEFAULT 0,
    retrieve_ms     double precision NOT NULL DEFAULT 0,
    pack_ms         double precision NOT NULL DEFAULT 0,
    total_ms        double precision NOT NULL DEFAULT 0
);
CREATE INDEX context_calls_project ON context_calls (project_id, created_at DESC);

-- One row per considered candidate of a context call, in decision order.
CREATE TABLE context_traces (
    trace_id       uuid NOT NULL REFERENCES context_calls (trace_id) ON DELETE CASCADE,
    sequence       integer NOT NULL,
    candidate_id   uuid NOT NULL,
    candidate_kind text NOT NULL CHECK (candidate_kind IN ('fact', 'episode')),
    outcome        text NOT NULL CHECK (outcome IN ('included', 'excluded', 'blocked')),
    reason_code    text NOT NULL,
    score          double precision NOT NULL,
    similarity     double precision NOT NULL,
    text_rank      double precision NOT NULL,
    recency        double precision NOT NULL,
    tokens         integer NOT NULL,
    budget_used    integer NOT NULL,
    preview        text NOT NULL DEFAULT '',
    PRIMARY KEY (trace_id, sequence)
);

CREATE TABLE talents (
    id         text PRIMARY KEY,
    name       text NOT NULL,
    summary    text NOT NULL DEFAULT '',
    body       text NOT NULL DEFAULT '',
    tags       text[] NOT NULL DEFAULT '{}',
    triggers   text[] NOT NULL DEFAULT '{}',
    task_types text[] NOT NULL DEFAULT '{}',
    roles      text[] NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Edges are kept even when their target is unknown: the doctor reports those.
CREATE TABLE talent_edges (
    talent_id text NOT NULL REFERENCES talents (id) ON DELETE CASCADE,
    kind      text NOT NULL CHECK (kind IN ('requires', 'includes', 'recommends')),
    target_id text NOT NULL,
    position  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (talent_id, kind, target_id),
    CHECK (talent_id <> target_id)
);

CREATE TABLE talent_activations (
    project_id text NOT NULL,
    talent_id  text NOT NULL REFERENCES talents (id) ON DELETE CASCADE,
    active     boolean NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, talent_id)
);

-- Talent vectors by content: computed once per (text, model), reused by every call.
CREATE TABLE talent_embeddings (
    text_sha256     text NOT NULL,
    embedding_model text NOT NULL,
    embedding       vector(384) NOT NULL,
    PRIMARY KEY (text_sha256, embedding_model)
);
