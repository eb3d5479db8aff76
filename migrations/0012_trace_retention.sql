-- depends: 0011_trace_rows_without_foreign_key
-- Trace retention without bloat (README "Running at scale", "Trace retention"): context_calls
-- and context_traces are partitioned by day on `created_at` (UTC days), and old days are
-- dropped whole (no DELETE, no vacuum) by `satchel_maintain_traces`, which each server runs at
-- start and then on a schedule; an advisory lock lets one replica at a time do it.
--
-- The existing tables become the partition "legacy" of their new parents, unchanged (no copy):
-- it holds every call up to the end of the day the migration ran (UTC), and is dropped with
-- that day. A decision row now carries its call's `created_at` (the partition key);
-- the decisions written before hold '-infinity', which the legacy partition covers.
--
-- Clients: the tables keep their names (the parents), so a server of the previous version
-- still running during a rolling upgrade reads and writes them as before; the decisions it
-- writes get `created_at` = now(), its call's (one statement, one transaction). The renames
-- and dropped keys below concern the legacy tables only, which nothing names; trace ids are
-- no longer unique alone but with `created_at` (the server makes them random, UUIDv7).
SET lock_timeout = '10s';

-- squawk-ignore renaming-table
ALTER TABLE context_calls RENAME TO context_calls_legacy;
-- squawk-ignore renaming-object
ALTER INDEX context_calls_pkey RENAME TO context_calls_legacy_pkey;
-- squawk-ignore renaming-object
ALTER INDEX context_calls_project RENAME TO context_calls_legacy_project;
DROP TRIGGER context_calls_delete_decisions ON context_calls_legacy;
-- squawk-ignore renaming-table
ALTER TABLE context_traces RENAME TO context_traces_legacy;
-- squawk-ignore renaming-object
ALTER INDEX context_traces_pkey RENAME TO context_traces_legacy_pkey;
-- A constant default: no rewrite (PostgreSQL 11+).
-- squawk-ignore adding-not-nullable-field
ALTER TABLE context_traces_legacy ADD COLUMN created_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE context_traces_legacy ALTER COLUMN created_at SET DEFAULT now();

CREATE TABLE context_calls (
    LIKE context_calls_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (trace_id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX context_calls_project ON context_calls (project_id, created_at DESC);

CREATE TABLE context_traces (
    LIKE context_traces_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (trace_id, created_at, sequence)
) PARTITION BY RANGE (created_at);

-- Every partition, by suffix ("legacy", "p20261204"): the days [starts, ends) it holds, and
-- when it was dropped (NULL: still there). The latest `ends` of a dropped one is the horizon
-- GetTrace reports "expired" before.
CREATE TABLE trace_partitions (
    suffix     text PRIMARY KEY,
    starts     timestamptz NOT NULL,
    ends       timestamptz NOT NULL,
    dropped_at timestamptz
);

-- A partition holds its parent's keys (built on attach): the legacy tables' own make way.
-- (The tables are locked already, by the renames: a concurrent drop would gain nothing.)
-- squawk-ignore ban-drop-constraint
ALTER TABLE context_calls_legacy DROP CONSTRAINT context_calls_legacy_pkey;
-- squawk-ignore require-concurrent-index-deletion
DROP INDEX context_calls_legacy_project;
-- squawk-ignore ban-drop-constraint
ALTER TABLE context_traces_legacy DROP CONSTRAINT context_traces_legacy_pkey;

-- The legacy partition ends where tomorrow (UTC) starts, or after the day of its newest row.
DO $$
DECLARE
    ends timestamptz := greatest(
        date_trunc('day', now(), 'UTC') + interval '1 day',
        (SELECT date_trunc('day', max(created_at), 'UTC') + interval '1 day'
         FROM context_calls_legacy));
BEGIN
    EXECUTE format('ALTER TABLE context_calls ATTACH PARTITION context_calls_legacy'
        ' FOR VALUES FROM (MINVALUE) TO (%L)', ends);
    EXECUTE format('ALTER TABLE context_traces ATTACH PARTITION context_traces_legacy'
        ' FOR VALUES FROM (MINVALUE) TO (%L)', ends);
    INSERT INTO trace_partitions (suffix, starts, ends) VALUES ('legacy', '-infinity', ends);
END
$$;

CREATE TRIGGER context_calls_delete_decisions
    AFTER DELETE ON context_calls
    REFERENCING OLD TABLE AS deleted_calls
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_delete_call_decisions();

-- One replica's maintenance: a partition for each day from `now_at`'s to `days_ahead` days
-- after it that none holds, and, when `retention_days` > 0, the drop of every partition that
-- ended `retention_days` days before `now_at` (a trace is kept `retention_days` to
-- `retention_days` + 1 days). Does nothing when another session holds the lock: it is doing
-- the same. Locks wait at most 5 s (a DROP queued behind a long read would queue context
-- calls behind it); the next run retries.
CREATE FUNCTION satchel_maintain_traces(
    retention_days integer, days_ahead integer, now_at timestamptz DEFAULT now(),
    OUT created integer, OUT dropped integer
) LANGUAGE plpgsql AS $$
DECLARE
    today timestamptz := date_trunc('day', now_at, 'UTC');
    day timestamptz;
    suffix text;
    old record;
BEGIN
    created := 0;
    dropped := 0;
    -- "satchltr" in ASCII: an arbitrary key, the same in every replica.
    IF NOT pg_try_advisory_xact_lock(x'73617463686c7472'::bigint) THEN
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', '5s', true);
    FOR day IN
        SELECT d FROM generate_series(today, today + make_interval(days => days_ahead),
            interval '1 day') AS d
        WHERE NOT EXISTS (SELECT 1 FROM trace_partitions p
            WHERE p.dropped_at IS NULL AND p.starts <= d AND p.ends > d)
    LOOP
        suffix := 'p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
        EXECUTE format('CREATE TABLE %I PARTITION OF context_calls FOR VALUES FROM (%L) TO (%L)',
            'context_calls_' || suffix, day, day + interval '1 day');
        EXECUTE format('CREATE TABLE %I PARTITION OF context_traces FOR VALUES FROM (%L) TO (%L)',
            'context_traces_' || suffix, day, day + interval '1 day');
        -- A day dropped before (a clock set back) is made again.
        INSERT INTO trace_partitions AS p (suffix, starts, ends)
            VALUES (suffix, day, day + interval '1 day')
            ON CONFLICT ON CONSTRAINT trace_partitions_pkey DO UPDATE SET dropped_at = NULL;
        created := created + 1;
    END LOOP;
    IF retention_days > 0 THEN
        FOR old IN
            SELECT p.suffix FROM trace_partitions p
            WHERE p.dropped_at IS NULL AND p.ends <= now_at - make_interval(days => retention_days)
            ORDER BY p.ends
        LOOP
            EXECUTE format('DROP TABLE %I, %I',
                'context_traces_' || old.suffix, 'context_calls_' || old.suffix);
            UPDATE trace_partitions p SET dropped_at = now() WHERE p.suffix = old.suffix;
            dropped := dropped + 1;
        END LOOP;
    END IF;
END
$$;

DO $$ BEGIN PERFORM satchel_maintain_traces(0, 3); END $$;
