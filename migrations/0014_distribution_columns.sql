-- transactional: false
-- depends: 0013_scope_indexes
-- Keys a distributed PostgreSQL can shard by project (README "Running at scale", "Citus"),
-- part 1 of 4: Citus requires the distribution column in every primary key, unique key and
-- foreign key of a distributed table. The two tables whose rows lacked `project_id` get it
-- (conflict_members, context_traces), and the new keys of events, facts, conflict_sets and
-- conflict_members are built CONCURRENTLY, without blocking writes; 0015 swaps them in, 0016
-- rebuilds the trace tables' keys, 0017 validates the new foreign keys.
--
-- The keys keep `id` (`trace_id`) first, so a lookup by id alone, a server of the previous
-- version's during a rolling upgrade, still reads them through an index. That server writes
-- conflict members and trace decisions without `project_id`: a trigger fills it in from the
-- row's conflict (call) when it is missing, and costs a new server nothing (its WHEN clause).
--
-- Cost (README "Upgrades" gives measured times): every decision row is rewritten once (one
-- UPDATE; writes go on), and SET NOT NULL scans conflict_members and context_traces under
-- their lock. The file runs outside a transaction; each step can run again after a failure.
SET lock_timeout = '10s';

-- 1. The project of each conflict member and trace decision.
ALTER TABLE conflict_members ADD COLUMN IF NOT EXISTS project_id text;
ALTER TABLE context_traces ADD COLUMN IF NOT EXISTS project_id text;

CREATE OR REPLACE FUNCTION satchel_conflict_member_project() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.project_id := (SELECT c.project_id FROM conflict_sets c WHERE c.id = NEW.conflict_id);
    RETURN NEW;
END;
$$;

-- The decision's call is inserted by the same statement (a data-modifying CTE read before the
-- decisions are): a VOLATILE function sees it.
CREATE OR REPLACE FUNCTION satchel_trace_decision_project() RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    NEW.project_id := (SELECT c.project_id FROM context_calls c
        WHERE c.trace_id = NEW.trace_id AND c.created_at = NEW.created_at);
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS conflict_members_project ON conflict_members;
CREATE TRIGGER conflict_members_project BEFORE INSERT ON conflict_members
    FOR EACH ROW WHEN (NEW.project_id IS NULL)
    EXECUTE FUNCTION satchel_conflict_member_project();
DROP TRIGGER IF EXISTS context_traces_project ON context_traces;
CREATE TRIGGER context_traces_project BEFORE INSERT ON context_traces
    FOR EACH ROW WHEN (NEW.project_id IS NULL)
    EXECUTE FUNCTION satchel_trace_decision_project();

UPDATE conflict_members m SET project_id = c.project_id
FROM conflict_sets c WHERE m.project_id IS NULL AND c.id = m.conflict_id;
-- The legacy partition's decisions hold created_at '-infinity', not their call's: by trace_id.
UPDATE context_traces t SET project_id = c.project_id
FROM context_calls c WHERE t.project_id IS NULL AND c.trace_id = t.trace_id;
-- Decisions whose call is gone were never readable (GetTrace starts from the call).
DELETE FROM context_traces WHERE project_id IS NULL;

-- squawk-ignore adding-not-nullable-field
ALTER TABLE conflict_members ALTER COLUMN project_id SET NOT NULL;
-- squawk-ignore adding-not-nullable-field
ALTER TABLE context_traces ALTER COLUMN project_id SET NOT NULL;

-- 2. Keys with the project, built without blocking writes (a failed build leaves an INVALID
-- index: dropped and built again on the next attempt); 0015 makes them the primary keys.
DROP INDEX CONCURRENTLY IF EXISTS events_id_project;
CREATE UNIQUE INDEX CONCURRENTLY events_id_project ON events (id, project_id);
DROP INDEX CONCURRENTLY IF EXISTS facts_id_project;
CREATE UNIQUE INDEX CONCURRENTLY facts_id_project ON facts (id, project_id);
DROP INDEX CONCURRENTLY IF EXISTS conflict_sets_id_project;
CREATE UNIQUE INDEX CONCURRENTLY conflict_sets_id_project ON conflict_sets (id, project_id);
DROP INDEX CONCURRENTLY IF EXISTS conflict_members_id_project;
CREATE UNIQUE INDEX CONCURRENTLY conflict_members_id_project
    ON conflict_members (conflict_id, fact_id, project_id);
