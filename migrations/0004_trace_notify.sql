-- depends: 0003_context_retrieval
-- WatchTraces across replicas: every committed context call is announced on the channel
-- `satchel_traces` with a JSON payload {"project_id", "subject_id", "trace_id"} (ids are at
-- most 200 characters: the payload stays far below NOTIFY's 8000-byte limit). PostgreSQL
-- delivers it only when the transaction commits, so a listener reads a complete trace.

CREATE FUNCTION satchel_notify_trace() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('satchel_traces', json_build_object(
        'project_id', NEW.project_id,
        'subject_id', NEW.subject_id,
        'trace_id', NEW.trace_id)::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER context_calls_notify AFTER INSERT ON context_calls
    FOR EACH ROW EXECUTE FUNCTION satchel_notify_trace();
