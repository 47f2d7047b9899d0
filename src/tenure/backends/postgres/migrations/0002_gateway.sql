-- Tenure schema v2: what the gateway needs in the shared store.

-- Control commands (input, approve) for a job's owner, persisted before they are delivered.
CREATE TABLE job_commands (
    job_id     uuid NOT NULL,
    seq        integer NOT NULL,
    kind       text NOT NULL,
    payload    json,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- Circuit breaker windows: one row per counted failure (a timeout) of a key such as 'agent:NAME'. Counted by
-- every gateway in the shared store, so two gateways open the circuit after the same failures.
CREATE TABLE circuit_failures (
    key text NOT NULL,
    ts  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX circuit_failures_key_ts ON circuit_failures (key, ts);

-- Admission caps count queued and scheduled jobs per tenant.
CREATE INDEX jobs_waiting_tenant ON jobs (tenant) WHERE state IN ('queued', 'scheduled');

-- Live events: one NOTIFY per batch on `tenure_events`. The body is the batch's events as JSON when it fits
-- under NOTIFY's 8,000-byte limit, else a reference {"jobs": [...]} (readers go to the history), else
-- {"jobs": null} (every subscriber checks its history).
CREATE FUNCTION tenure_notify_events(p_events text, p_jobs text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body text;
BEGIN
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
