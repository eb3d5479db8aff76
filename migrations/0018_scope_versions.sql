-- depends: 0017_validate_distribution_keys
-- Versions of each scope's events and facts, for the servers' in-memory copies of the scopes
-- they read most (server/scope_cache.py): every statement that writes a scope's events gives
-- it a new events version; every statement that writes its facts or conflicts, a new facts
-- version; both drawn from one sequence (never reused, even after a scope is deleted and
-- written again). A server serves a scope from memory only while the version it loaded is the
-- scope's current one, which a context call reads as it plans.
--
-- Triggers rather than the server's code: writers of any version (a rolling upgrade) move the
-- versions too. Statement-level, with transition tables: one upsert per statement, in key order
-- (like the scope statistics of migration 0008), taken in the writer's transaction.
-- Scopes written before this migration have no row: version 0, until their next write, and a
-- deleted scope's row goes with it; servers never hold a scope at version 0.
SET lock_timeout = '10s';

CREATE SEQUENCE scope_version;

CREATE TABLE scope_versions (
    project_id text NOT NULL,
    subject_id text NOT NULL,
    events     bigint NOT NULL DEFAULT 0,
    facts      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, subject_id)
);

CREATE FUNCTION satchel_new_event_versions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scope_versions AS v (project_id, subject_id, events)
    SELECT project_id, subject_id, nextval('scope_version')
    FROM (SELECT DISTINCT project_id, subject_id FROM changed) scopes
    ORDER BY project_id, subject_id
    ON CONFLICT (project_id, subject_id) DO UPDATE SET events = excluded.events;
    RETURN NULL;
END
$$;

CREATE FUNCTION satchel_new_fact_versions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scope_versions AS v (project_id, subject_id, facts)
    SELECT project_id, subject_id, nextval('scope_version')
    FROM (SELECT DISTINCT project_id, subject_id FROM changed) scopes
    ORDER BY project_id, subject_id
    ON CONFLICT (project_id, subject_id) DO UPDATE SET facts = excluded.facts;
    RETURN NULL;
END
$$;

-- A conflict member names its scope through its set.
CREATE FUNCTION satchel_new_member_versions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scope_versions AS v (project_id, subject_id, facts)
    SELECT project_id, subject_id, nextval('scope_version')
    FROM (
        SELECT DISTINCT c.project_id, c.subject_id
        FROM changed m JOIN conflict_sets c ON c.id = m.conflict_id AND c.project_id = m.project_id
    ) scopes
    ORDER BY project_id, subject_id
    ON CONFLICT (project_id, subject_id) DO UPDATE SET facts = excluded.facts;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_inserted_version AFTER INSERT ON events
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_event_versions();
CREATE TRIGGER events_updated_version AFTER UPDATE ON events
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_event_versions();
CREATE TRIGGER events_deleted_version AFTER DELETE ON events
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_event_versions();

CREATE TRIGGER facts_inserted_version AFTER INSERT ON facts
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_fact_versions();
CREATE TRIGGER facts_updated_version AFTER UPDATE ON facts
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_fact_versions();
CREATE TRIGGER facts_deleted_version AFTER DELETE ON facts
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_fact_versions();

CREATE TRIGGER conflict_sets_inserted_version AFTER INSERT ON conflict_sets
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_fact_versions();
CREATE TRIGGER conflict_sets_updated_version AFTER UPDATE ON conflict_sets
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_fact_versions();
CREATE TRIGGER conflict_sets_deleted_version AFTER DELETE ON conflict_sets
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_fact_versions();
CREATE TRIGGER conflict_members_inserted_version AFTER INSERT ON conflict_members
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_member_versions();
