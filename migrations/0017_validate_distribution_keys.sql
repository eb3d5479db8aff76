-- depends: 0016_trace_distribution_keys
-- Keys a distributed PostgreSQL can shard by project, part 4 of 4 (see 0014): the foreign keys
-- 0015 added NOT VALID are checked against the rows written before, which reads the tables
-- without blocking their writes (SHARE UPDATE EXCLUSIVE).
SET lock_timeout = '10s';
ALTER TABLE conflict_members VALIDATE CONSTRAINT conflict_members_conflict_id_fkey;
ALTER TABLE conflict_members VALIDATE CONSTRAINT conflict_members_fact_id_fkey;
ALTER TABLE conflict_sets VALIDATE CONSTRAINT conflict_sets_winning_fact_id_fkey;
ALTER TABLE facts VALIDATE CONSTRAINT facts_superseded_by_fkey;
