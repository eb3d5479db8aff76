-- depends: 0019_scope_versions_per_kind
-- Talents for tool search: a tool's input schema, and a per-project version of the active set.
--
-- A talent that is a tool carries the JSON Schema of its input (JSON text; '' for other
-- talents): SearchTools serves it, and relevance scores its parameters with the body.
--
-- Every ResolveTalents call checks that its in-memory copy of the project's active talents is
-- current. It read a digest of the whole active set (every activation joined with its talent,
-- sorted, aggregated, hashed): O(active talents) per call, 3-4 ms at 1,000 talents, 40 ms at
-- 10,000. Two version rows, moved by triggers, replace it: one per project for its activations
-- (distributed by project, as talent_activations), one for the shared catalogue (a reference
-- table, as talents: any upsert moves it).
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

CREATE TABLE talent_catalogue_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint NOT NULL
);

INSERT INTO talent_catalogue_version (version) VALUES (nextval('talent_version_seq'));

-- An activation turned on or off (or removed) gives its project's active set a new version.
CREATE FUNCTION satchel_talent_activation_moved() RETURNS trigger
    LANGUAGE plpgsql AS $$
    DECLARE
        project text := CASE WHEN TG_OP = 'DELETE' THEN OLD.project_id ELSE NEW.project_id END;
    BEGIN
        INSERT INTO talent_project_versions (project_id, version)
        VALUES (project, nextval('talent_version_seq'))
        ON CONFLICT (project_id) DO UPDATE SET version = EXCLUDED.version;
        RETURN NULL;
    END
    $$;

CREATE TRIGGER talent_activations_move_version
    AFTER INSERT OR UPDATE OR DELETE ON talent_activations
    FOR EACH ROW EXECUTE FUNCTION satchel_talent_activation_moved();

-- A talent created, replaced (content, roles, edges: an upsert updates its row) or removed gives
-- the catalogue a new version.
CREATE FUNCTION satchel_talent_catalogue_moved() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE talent_catalogue_version SET version = nextval('talent_version_seq');
        RETURN NULL;
    END
    $$;

CREATE TRIGGER talents_move_catalogue_version
    AFTER INSERT OR UPDATE OR DELETE ON talents
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_talent_catalogue_moved();
