-- depends: 0014_distribution_columns
-- Keys a distributed PostgreSQL can shard by project, part 2 of 4 (see 0014): the keys built
-- by 0014 become the primary keys of events, facts, conflict_sets and conflict_members, and the
-- foreign keys between them carry the project (NOT VALID here, validated by 0017 without
-- blocking writes). One short transaction: the four tables are locked in one order first.
SET lock_timeout = '10s';
LOCK TABLE facts, events, conflict_sets, conflict_members IN ACCESS EXCLUSIVE MODE;

-- The foreign keys on `id` alone depend on the primary keys being replaced.
-- squawk-ignore ban-drop-constraint
ALTER TABLE conflict_members DROP CONSTRAINT conflict_members_conflict_id_fkey;
-- squawk-ignore ban-drop-constraint
ALTER TABLE conflict_members DROP CONSTRAINT conflict_members_fact_id_fkey;
-- squawk-ignore ban-drop-constraint
ALTER TABLE conflict_sets DROP CONSTRAINT conflict_sets_winning_fact_id_fkey;
-- squawk-ignore ban-drop-constraint
ALTER TABLE facts DROP CONSTRAINT facts_superseded_by_fkey;

-- squawk-ignore ban-drop-constraint
ALTER TABLE events DROP CONSTRAINT events_pkey,
    ADD CONSTRAINT events_pkey PRIMARY KEY USING INDEX events_id_project;
-- squawk-ignore ban-drop-constraint
ALTER TABLE facts DROP CONSTRAINT facts_pkey,
    ADD CONSTRAINT facts_pkey PRIMARY KEY USING INDEX facts_id_project;
-- squawk-ignore ban-drop-constraint
ALTER TABLE conflict_sets DROP CONSTRAINT conflict_sets_pkey,
    ADD CONSTRAINT conflict_sets_pkey PRIMARY KEY USING INDEX conflict_sets_id_project;
-- squawk-ignore ban-drop-constraint
ALTER TABLE conflict_members DROP CONSTRAINT conflict_members_pkey,
    ADD CONSTRAINT conflict_members_pkey PRIMARY KEY USING INDEX conflict_members_id_project;

ALTER TABLE conflict_members
    ADD CONSTRAINT conflict_members_conflict_id_fkey FOREIGN KEY (conflict_id, project_id)
        REFERENCES conflict_sets (id, project_id) ON DELETE CASCADE NOT VALID,
    ADD CONSTRAINT conflict_members_fact_id_fkey FOREIGN KEY (fact_id, project_id)
        REFERENCES facts (id, project_id) NOT VALID;
ALTER TABLE conflict_sets
    ADD CONSTRAINT conflict_sets_winning_fact_id_fkey FOREIGN KEY (winning_fact_id, project_id)
        REFERENCES facts (id, project_id) NOT VALID;
ALTER TABLE facts
    ADD CONSTRAINT facts_superseded_by_fkey FOREIGN KEY (superseded_by, project_id)
        REFERENCES facts (id, project_id) NOT VALID;
