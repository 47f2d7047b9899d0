-- Tenure schema v2 for SQLite: what the gateway needs in the shared store (same semantics as PostgreSQL).

-- Control commands (input, approve) for a job's owner, persisted before they are delivered.
CREATE TABLE job_commands (
    job_id     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;

-- Circuit breaker windows: one row per counted failure (a timeout) of a key such as 'agent:NAME'.
CREATE TABLE circuit_failures (
    key TEXT NOT NULL,
    ts  REAL NOT NULL
);
CREATE INDEX circuit_failures_key_ts ON circuit_failures (key, ts);

-- Admission caps count queued and scheduled jobs per tenant.
CREATE INDEX jobs_waiting_tenant ON jobs (tenant) WHERE state IN ('queued', 'scheduled');
