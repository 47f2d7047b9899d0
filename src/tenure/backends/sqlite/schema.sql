-- Tenure schema v1 for SQLite: the same tables and semantics as PostgreSQL.
-- Times are REAL seconds since the epoch from SQLite's clock; JSON values are TEXT; `requires` is a
-- comma-separated list of capability tags (tags never contain a comma).

CREATE TABLE jobs (
    id                   TEXT PRIMARY KEY,
    tenant               TEXT NOT NULL,
    agent                TEXT NOT NULL,
    input                TEXT NOT NULL,
    priority             INTEGER NOT NULL DEFAULT 0,
    requires             TEXT NOT NULL DEFAULT '',
    idem_digest          BLOB,
    request_fingerprint  BLOB NOT NULL,
    deadline             REAL,
    state                TEXT NOT NULL DEFAULT 'queued',
    owner                TEXT,
    claimed_at           REAL,
    claim_expires_at     REAL,
    epoch                INTEGER NOT NULL DEFAULT 0,
    token                INTEGER,
    execution_id         TEXT,
    execution_started_at REAL,
    attempts             INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER NOT NULL,
    next_attempt_at      REAL,
    cancel_requested_at  REAL,
    timeout_s            REAL,
    retry_safe           INTEGER NOT NULL DEFAULT 0,
    result               TEXT,
    error_code           TEXT,
    error_message        TEXT,
    created_at           REAL NOT NULL,
    updated_at           REAL NOT NULL,
    finished_at          REAL
, concurrency_key TEXT, key_limit INTEGER NOT NULL DEFAULT 1, key_wait INTEGER NOT NULL DEFAULT 0, mode_requested TEXT, mode_effective TEXT, degraded_reason TEXT, fair_at REAL NOT NULL DEFAULT 0, parent_job_id TEXT, parent_execution_id TEXT, preferred_worker TEXT, preferred_until REAL, route TEXT) WITHOUT ROWID;
CREATE UNIQUE INDEX jobs_idem ON jobs (tenant, idem_digest) WHERE idem_digest IS NOT NULL;
-- (the columns after finished_at were added by migrations 0006, 0009 and 0011, whose ALTER TABLE wrote them on one line)
CREATE INDEX jobs_ready ON jobs (priority DESC, fair_at, id) WHERE state = 'queued' AND owner IS NULL AND key_wait = 0;
-- The same per agent: a worker of a few agents reads each one's head (_claims.py, migration 0012).
CREATE INDEX jobs_ready_agent ON jobs (agent, priority DESC, fair_at, id) WHERE state = 'queued' AND owner IS NULL AND key_wait = 0;
CREATE INDEX jobs_tenant_turn ON jobs (tenant, priority, fair_at) WHERE state = 'queued' AND owner IS NULL AND key_wait = 0;
CREATE INDEX jobs_owned ON jobs (owner, claim_expires_at) WHERE owner IS NOT NULL;
CREATE INDEX jobs_scheduled ON jobs (next_attempt_at) WHERE state = 'scheduled';

CREATE TABLE executions (
    id                  TEXT PRIMARY KEY,
    job_id              TEXT NOT NULL,
    epoch               INTEGER NOT NULL,
    worker_id           TEXT NOT NULL,
    started_at          REAL NOT NULL,
    ended_at            REAL NOT NULL,
    outcome             TEXT NOT NULL,
    usage               TEXT,
    parent_execution_id TEXT
) WITHOUT ROWID;
CREATE INDEX executions_job ON executions (job_id, epoch);

CREATE TABLE events (
    job_id       TEXT NOT NULL,
    epoch        INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    execution_id TEXT,
    type         TEXT NOT NULL,
    payload      TEXT,
    ts           REAL NOT NULL,
    PRIMARY KEY (job_id, epoch, seq)
) WITHOUT ROWID;

CREATE TABLE workers (
    id             TEXT PRIMARY KEY,
    host           TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    concurrency    INTEGER NOT NULL,
    agents         TEXT NOT NULL DEFAULT '[]',
    capabilities   TEXT NOT NULL DEFAULT '[]',
    state          TEXT NOT NULL DEFAULT 'active',
    in_flight      INTEGER NOT NULL DEFAULT 0,
    started_at     REAL NOT NULL,
    last_heartbeat REAL NOT NULL
    -- 0005_broker: the profile (docs/routing.md). Written as ALTER TABLE ADD COLUMN leaves it, so that this file
    -- and the migrations give the same table (tests/migration).
    , features TEXT NOT NULL DEFAULT '[]', agent_specs TEXT NOT NULL DEFAULT '{}', success_rate REAL,
    latency_ms REAL, consecutive_timeouts INTEGER NOT NULL DEFAULT 0, drain_requested_at REAL,
    drain_timeout_s REAL) WITHOUT ROWID;

CREATE TABLE leases (
    key        TEXT NOT NULL,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key, holder)
) WITHOUT ROWID;

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

-- Admission caps count queued and scheduled jobs per tenant; the dashboard lists them by tenant and state.
CREATE INDEX jobs_waiting_tenant ON jobs (tenant, lower(state), id) WHERE state IN ('queued', 'scheduled');

-- The dashboard's read side (contracts/insights.py, insights.sql): keyset pages of the jobs list per filter
-- (the primary key serves the unfiltered list), and what finished in the last hour from the index alone.
CREATE INDEX jobs_tenant_id ON jobs (tenant, id);
-- A state filter reads the partial index of its kind (insights.py STATE_PAGES; migration 0010): no index holds
-- every job's state, so no transition writes one. On lower(state), an expression no statement of the job path
-- uses, so no claim, start, finish or sweeper statement can choose them (migration 0007).
CREATE INDEX jobs_done_state ON jobs (lower(state), id) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_done_tenant_state ON jobs (tenant, lower(state), id) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_waiting_state ON jobs (lower(state), id) WHERE state IN ('queued', 'scheduled');
CREATE INDEX jobs_paused_state ON jobs (lower(state), id) WHERE state = 'waiting';
CREATE INDEX jobs_paused_tenant_state ON jobs (tenant, lower(state), id) WHERE state = 'waiting';
CREATE INDEX jobs_finished ON jobs (finished_at, state, tenant) WHERE finished_at IS NOT NULL;
-- Retention of a tenant with its own (TENURE_TENANT_RETENTION_DAYS): its finished jobs, oldest first.
CREATE INDEX jobs_tenant_finished ON jobs (tenant, finished_at, state) WHERE finished_at IS NOT NULL;

-- Scheduling (docs/scheduling.md): the live jobs of a concurrency key, the jobs waiting for their key's turn, and
-- the per-agent admission cap.
CREATE INDEX jobs_keyed ON jobs (tenant, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'scheduled', 'running', 'waiting');
CREATE INDEX jobs_key_waiting ON jobs (tenant, concurrency_key, id) WHERE key_wait = 1 AND state = 'queued';
CREATE INDEX jobs_waiting_agent ON jobs (agent) WHERE state IN ('queued', 'scheduled');
-- A parent's children (docs/coordinators.md): gather, cancel's cascade, GET /v1/jobs/{id}.
CREATE INDEX jobs_parent ON jobs (parent_job_id, id) WHERE parent_job_id IS NOT NULL;

-- One audit per job across its attempts: an execution's records sit under its epoch, in its own seq order.
-- kind: tool_call (name: the tool), evidence (name: its kind), usage (name: the model or ''), and requeue
-- (name: 'input'): an operator's edit of the input, written by the store itself (no execution).
CREATE TABLE audit_records (
    job_id       TEXT NOT NULL,
    epoch        INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    execution_id TEXT,
    kind         TEXT NOT NULL,
    name         TEXT NOT NULL,
    data         TEXT NOT NULL,
    started_at   REAL,
    ended_at     REAL,
    ts           REAL NOT NULL,
    PRIMARY KEY (job_id, epoch, seq)
) WITHOUT ROWID;

-- The effect journal: one row per (job, step key), begun before the step's function runs and ended (with its
-- JSON result) before `ctx.step` returns. state: started | done | resolved.
CREATE TABLE journal_steps (
    job_id       TEXT NOT NULL,
    key          TEXT NOT NULL,
    state        TEXT NOT NULL,
    epoch        INTEGER NOT NULL,
    execution_id TEXT NOT NULL,
    started_at   REAL NOT NULL,
    ended_at     REAL,
    result       TEXT,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;

-- A job's budget (docs/budgets.md): written with the job by `enqueue`, read by its executions at their first
-- tool call or step. Only jobs submitted with a budget have a row.
CREATE TABLE job_budgets (
    job_id TEXT PRIMARY KEY,
    budget TEXT NOT NULL
) WITHOUT ROWID;

-- Usage reports by time, for GET /v1/usage.
CREATE INDEX audit_records_usage ON audit_records (ts) WHERE kind = 'usage';
