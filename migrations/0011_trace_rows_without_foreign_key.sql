-- depends: 0010_pinned_talents
-- A call's decisions are written by the statement that writes the call (storage/context.py,
-- save_trace), so the foreign key from context_traces to context_calls checked what that
-- statement already guarantees, once per decision row: 0.6 ms of every context call's 1.7 ms
-- trace write (55 decisions). Deleting a call still deletes its decisions, through a trigger
-- that costs nothing on insert.
ALTER TABLE context_traces DROP CONSTRAINT context_traces_trace_id_fkey;

CREATE FUNCTION satchel_delete_call_decisions() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM context_traces t USING deleted_calls d WHERE t.trace_id = d.trace_id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER context_calls_delete_decisions
    AFTER DELETE ON context_calls
    REFERENCING OLD TABLE AS deleted_calls
    FOR EACH STATEMENT EXECUTE FUNCTION satchel_delete_call_decisions();
