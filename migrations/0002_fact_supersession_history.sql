-- depends: 0001_initial
-- satchel: keep what a superseded fact's record said before the supersession, so that
-- as-of reads return the facts valid at an instant *as recorded then*.
--
-- A supersession closes the old fact's validity (valid_to) at the successor's valid_from, or at
-- the time of the supersession. `superseded_at` is that transaction time and `prior_valid_to`
-- the valid_to the record held until then: an as-of read at t < superseded_at uses
-- prior_valid_to, at t >= superseded_at the closed valid_to.
ALTER TABLE facts
    ADD COLUMN superseded_at  timestamptz,
    ADD COLUMN prior_valid_to timestamptz;

-- A successor valid from before the old fact's valid_from replaces it entirely: the old fact's
-- validity becomes empty (valid_to = valid_from), never valid. Requests still need
-- valid_to > valid_from; only a supersession can produce an empty interval.
ALTER TABLE facts DROP CONSTRAINT facts_check;
ALTER TABLE facts ADD CONSTRAINT facts_valid_interval
    CHECK (valid_to IS NULL OR valid_from IS NULL OR valid_to >= valid_from);
