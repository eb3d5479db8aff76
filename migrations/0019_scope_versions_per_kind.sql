-- depends: 0018_scope_versions
-- A transaction that writes a scope's events and its facts moves both versions.
--
-- Migration 0018 moved a kind's version once per transaction by looking at the version row's
-- xmin: "already updated by this transaction". That guard is per row, not per kind: DeleteEvent
-- deletes an event (its trigger moves the events version, so the row's xmin is now this
-- transaction) and then the facts drawn from it alone, whose trigger then found the row
-- "already moved" and left the facts version as it was. Every server holding the scope's facts
-- in memory kept serving the deleted facts. Each kind now records the transaction that last
-- moved it.
SET lock_timeout = '10s';

ALTER TABLE scope_versions
    ADD COLUMN events_moved_by xid8,
    ADD COLUMN facts_moved_by xid8;

-- Give a scope's `kind` ('events' or 'facts') a new version, once per transaction and kind.
CREATE OR REPLACE FUNCTION satchel_move_scope_version(kind text, project text, subject text)
    RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    version bigint := 1 + floor(random() * 4503599627370495)::bigint;
    mover xid8 := pg_current_xact_id();
BEGIN
    IF kind = 'events' THEN
        INSERT INTO scope_versions AS v (project_id, subject_id, events, events_moved_by)
        VALUES (project, subject, version, mover)
        ON CONFLICT (project_id, subject_id) DO UPDATE
            SET events = excluded.events, events_moved_by = excluded.events_moved_by
            WHERE v.events_moved_by IS DISTINCT FROM excluded.events_moved_by;
    ELSE
        INSERT INTO scope_versions AS v (project_id, subject_id, facts, facts_moved_by)
        VALUES (project, subject, version, mover)
        ON CONFLICT (project_id, subject_id) DO UPDATE
            SET facts = excluded.facts, facts_moved_by = excluded.facts_moved_by
            WHERE v.facts_moved_by IS DISTINCT FROM excluded.facts_moved_by;
    END IF;
END
$$;
