-- depends: 0019_scope_versions_per_kind
-- Talents for tool search: a tool's input schema, and a per-project version of the active set.
--
-- A talent that is a tool carries the JSON Schema of its input (JSON text; '' for other
-- talents): SearchTools serves it, and relevance scores its parameters with the body.
--
-- Every ResolveTalents call checks that its in-memory copy of the project's active talents is
-- current. It read a digest of the whole active set (every activation joined with its talent,
-- sorted, aggregated, hashed): O(active talents) per call, 3-4 ms at 1,000 talents, 40 ms at
-- 10,000. A version row per project, moved by triggers, is one index lookup.
SET lock_timeout = '10s';

ALTER TABLE talents ADD COLUMN input_schema text NOT NULL DEFAULT '';

CREATE SEQUENCE talent_version_seq AS bigint;

CREATE TABLE talent_project_versions (
    project_id text PRIMARY KEY,
    version    bigint NOT NULL
);

INSERT INTO talent_project_versions (project_id, version)
SELECT project_id, nextval('talent_version_seq')
FROM (SELECT DISTINCT project_id FROM talent_activations) AS projects;

-- Give a project's active set a new version.
CREATE FUNCTION satchel_move_talent_version(project text) RETURNS void
    LANGUAGE sql AS $$
        INSERT INTO talent_project_versions (project_id, version)
        VALUES (project, nextval('talent_version_seq'))
        ON CONFLICT (project_id) DO UPDATE SET version = EXCLUDED.version
    $$;

-- An activation turned on or off (or removed) moves its project's version.
CREATE FUNCTION satchel_talent_activation_moved() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP <> 'INSERT' THEN
            PERFORM satchel_move_talent_version(OLD.project_id);
        END IF;
        IF TG_OP <> 'DELETE' THEN
            PERFORM satchel_move_talent_version(NEW.project_id);
        END IF;
        RETURN NULL;
    END
    $$;

CREATE TRIGGER talent_activations_move_version
    AFTER INSERT OR UPDATE OR DELETE ON talent_activations
    FOR EACH ROW EXECUTE FUNCTION satchel_talent_activation_moved();

-- A talent replaced (content, roles, edges: an upsert updates its row) or removed moves the
-- version of every project where it is active.
CREATE FUNCTION satchel_talent_moved() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM satchel_move_talent_version(a.project_id)
        FROM talent_activations a
        WHERE a.talent_id = OLD.id AND a.active;
        RETURN NULL;
    END
    $$;

CREATE TRIGGER talents_move_version
    AFTER UPDATE OR DELETE ON talents
    FOR EACH ROW EXECUTE FUNCTION satchel_talent_moved();
