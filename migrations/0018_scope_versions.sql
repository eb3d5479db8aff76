-- depends: 0017_validate_distribution_keys
-- Versions of each scope's events and facts, for the servers' in-memory copies of the scopes
-- they read most (server/scope_cache.py): every transaction that writes a scope's events gives
-- it a new events version; every one that writes its facts or conflicts, a new facts version;
-- both drawn from one sequence (never reused, even after a scope is deleted and
-- written again). A server serves a scope from memory only while the version it loaded is the
-- scope's current one, which a context call reads as it plans.
--
-- Triggers rather than the server's code: writers of any version (a rolling upgrade) move the
-- versions too. Constraint triggers deferred to the commit: a scope's version row is locked as
-- the writer commits, after every lock its statements took (locked as a statement ran, the row
-- deadlocked an AssertFact, which inserts its fact before it locks the source events, against a
-- DeleteEvent, which locks the event first). A transaction that writes several scopes has
-- already locked their statistics rows in key order (migration 0008), so two of them never
-- wait for each other's versions in a cycle. One upsert per row written; a row already moved
-- by this transaction is left as it is.
-- Scopes written before this migration have no row: version 0, until their next write; a
-- deleted scope's row goes with it (its deletion fires the pending triggers first), and a
-- TRUNCATE of a versioned table drops every row; servers never hold a scope at version 0.
SET lock_timeout = '10s';

CREATE TABLE scope_versions (
    project_id text NOT NULL,
    subject_id text NOT NULL,
    events     bigint NOT NULL DEFAULT 0,
    facts      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, subject_id)
);

-- Give a scope's `kind` ('events' or 'facts') a new version, once per transaction.
CREATE FUNCTION satchel_move_scope_version(kind text, project text, subject text) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    version bigint := 1 + floor(random() * 4503599627370495)::bigint;
BEGIN
    IF kind = 'events' THEN
        INSERT INTO scope_versions AS v (project_id, subject_id, events)
        VALUES (project, subject, version)
        ON CONFLICT (project_id, subject_id) DO UPDATE SET events = excluded.events
            WHERE v.xmin::text <> pg_current_xact_id()::xid::text;
    ELSE
        INSERT INTO scope_versions AS v (project_id, subject_id, facts)
        VALUES (project, subject, version)
        ON CONFLICT (project_id, subject_id) DO UPDATE SET facts = excluded.facts
            WHERE v.xmin::text <> pg_current_xact_id()::xid::text;
    END IF;
END
$$;

-- The scope of the written row (both, for an update that moves it); a conflict member names
-- its scope through its set.
CREATE FUNCTION satchel_new_scope_version() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    subject text;
BEGIN
    IF TG_TABLE_NAME = 'conflict_members' THEN
        SELECT c.subject_id INTO subject FROM conflict_sets c
        WHERE c.id = coalesce(NEW.conflict_id, OLD.conflict_id)
          AND c.project_id = coalesce(NEW.project_id, OLD.project_id);
        IF subject IS NOT NULL THEN  -- else deleted with its set, which moved the version
            PERFORM satchel_move_scope_version(
                'facts', coalesce(NEW.project_id, OLD.project_id), subject);
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM satchel_move_scope_version(TG_ARGV[0], NEW.project_id, NEW.subject_id);
    END IF;
    IF TG_OP = 'DELETE' OR (OLD.project_id, OLD.subject_id) <> (NEW.project_id, NEW.subject_id)
    THEN
        PERFORM satchel_move_scope_version(TG_ARGV[0], OLD.project_id, OLD.subject_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION satchel_forget_scope_versions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM scope_versions;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER events_version AFTER INSERT OR UPDATE OR DELETE ON events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION satchel_new_scope_version('events');
CREATE TRIGGER events_truncated_versions AFTER TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_forget_scope_versions();
CREATE CONSTRAINT TRIGGER facts_version AFTER INSERT OR UPDATE OR DELETE ON facts
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION satchel_new_scope_version('facts');
CREATE TRIGGER facts_truncated_versions AFTER TRUNCATE ON facts
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_forget_scope_versions();
CREATE CONSTRAINT TRIGGER conflict_sets_version AFTER INSERT OR UPDATE OR DELETE ON conflict_sets
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION satchel_new_scope_version('facts');
CREATE TRIGGER conflict_sets_truncated_versions AFTER TRUNCATE ON conflict_sets
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_forget_scope_versions();
CREATE CONSTRAINT TRIGGER conflict_members_version AFTER INSERT OR UPDATE OR DELETE ON conflict_members
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION satchel_new_scope_version('facts');
CREATE TRIGGER conflict_members_truncated_versions AFTER TRUNCATE ON conflict_members
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_forget_scope_versions();
