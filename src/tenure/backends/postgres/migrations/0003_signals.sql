-- Live hints over Redis: a session that set `tenure.notify_events = off` (a store whose hints travel over
-- Redis pub/sub, backends/signals.py) sends no NOTIFY on `tenure_events`; NOTIFY takes a cluster-wide lock at
-- commit, which every notifying transaction then waits for.
CREATE OR REPLACE FUNCTION tenure_notify_events(p_events text, p_jobs text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body text;
BEGIN
    IF current_setting('tenure.notify_events', true) = 'off' THEN
        RETURN;
    END IF;
    IF p_events IS NOT NULL AND octet_length(p_events) < 7900 THEN
        body := '{"events":' || p_events || '}';
    ELSE
        body := json_build_object('jobs', p_jobs)::text;
        IF octet_length(body) >= 7900 THEN
            body := '{"jobs":null}';
        END IF;
    END IF;
    PERFORM pg_notify('tenure_events', body);
END
$$;
