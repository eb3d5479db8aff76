-- depends: 0017_validate_distribution_keys
-- A version of each scope's events, for the servers' in-memory episode indexes
-- (server/episode_index.py): every statement that inserts, updates or deletes events gives each
-- scope it touched a new version, drawn from one sequence (never reused, even after a scope is
-- deleted and written again). A server serves a scope's episodes from memory only while the
-- version it loaded is the scope's current one, which a context call reads as it plans.
--
-- Triggers rather than the server's code: writers of any version (a rolling upgrade) move the
-- version too. Statement-level, with transition tables: one upsert per statement, in key order
-- (like the scope statistics of migration 0008), taken in the writer's transaction.
-- Scopes written before this migration have no row: version 0, until their next write, and a
-- deleted scope's row goes with it; servers never hold a scope at version 0.
SET lock_timeout = '10s';

CREATE SEQUENCE scope_event_version;

CREATE TABLE scope_versions (
    project_id text NOT NULL,
    subject_id text NOT NULL,
    events     bigint NOT NULL,
    PRIMARY KEY (project_id, subject_id)
);

CREATE FUNCTION satchel_new_event_versions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scope_versions AS v (project_id, subject_id, events)
    SELECT project_id, subject_id, nextval('scope_event_version')
    FROM (SELECT DISTINCT project_id, subject_id FROM changed_events) scopes
    ORDER BY project_id, subject_id
    ON CONFLICT (project_id, subject_id) DO UPDATE SET events = excluded.events;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_inserted_version AFTER INSERT ON events
    REFERENCING NEW TABLE AS changed_events
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_event_versions();
CREATE TRIGGER events_updated_version AFTER UPDATE ON events
    REFERENCING OLD TABLE AS changed_events
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_event_versions();
CREATE TRIGGER events_deleted_version AFTER DELETE ON events
    REFERENCING OLD TABLE AS changed_events
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_new_event_versions();
