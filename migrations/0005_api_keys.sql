-- depends: 0003_context_retrieval
-- Per-project API keys (issue 7). A key is shown once, when created; only its SHA-256 is stored
-- (keys are 256 random bits: no salt or slow hash is needed against guessing). A NULL project_id
-- is an admin key: every project, and writes to the global talent catalogue.

CREATE TABLE api_keys (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id   text,
    key_hash     bytea NOT NULL UNIQUE,
    prefix       text NOT NULL,
    name         text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    last_used_at timestamptz
);
CREATE INDEX api_keys_project ON api_keys (project_id, created_at);
