-- depends: 0015_distribution_keys
-- Keys a distributed PostgreSQL can shard by project, part 3 of 4 (see 0014): the trace tables'
-- primary keys get `project_id`. They are partitioned tables, which have neither a concurrent
-- build nor USING INDEX: the keys are rebuilt in place, while context calls wait to save their
-- trace (README "Upgrades": ~1.5 s per million decisions kept).
SET lock_timeout = '10s';

-- squawk-ignore ban-drop-constraint
ALTER TABLE context_calls DROP CONSTRAINT context_calls_pkey,
    -- squawk-ignore constraint-missing-not-valid, adding-serial-primary-key-field
    ADD CONSTRAINT context_calls_pkey PRIMARY KEY (trace_id, created_at, project_id);
-- squawk-ignore ban-drop-constraint
ALTER TABLE context_traces DROP CONSTRAINT context_traces_pkey,
    -- squawk-ignore constraint-missing-not-valid, adding-serial-primary-key-field
    ADD CONSTRAINT context_traces_pkey PRIMARY KEY (trace_id, created_at, sequence, project_id);
