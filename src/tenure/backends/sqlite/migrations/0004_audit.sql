-- Tenure schema v4 for SQLite: the audit chain and the effect journal (docs/audit.md, docs/journal.md).
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
