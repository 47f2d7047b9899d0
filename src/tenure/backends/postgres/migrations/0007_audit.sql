-- The audit chain and the effect journal (docs/audit.md, docs/journal.md).
-- One audit per job across its attempts: an execution's records sit under its epoch, in its own seq order.
-- kind: tool_call (name: the tool), evidence (name: its kind), usage (name: the model or ''), and requeue
-- (name: 'input'): an operator's edit of the input, written by the store itself (no execution).
CREATE TABLE audit_records (
    job_id       uuid NOT NULL,
    epoch        integer NOT NULL,
    seq          integer NOT NULL,
    execution_id uuid,
    kind         text NOT NULL,
    name         text NOT NULL,
    data         json NOT NULL,
    started_at   double precision,
    ended_at     double precision,
    ts           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, epoch, seq)
);

-- The effect journal: one row per (job, step key), begun before the step's function runs and ended (with its
-- JSON result) before `ctx.step` returns. state: started | done | resolved.
CREATE TABLE journal_steps (
    job_id       uuid NOT NULL,
    key          text NOT NULL,
    state        text NOT NULL,
    epoch        integer NOT NULL,
    execution_id uuid NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    ended_at     timestamptz,
    result       json,
    PRIMARY KEY (job_id, key)
);

-- A job's budget (docs/budgets.md): written with the job by `enqueue`, read by its executions at their first
-- tool call or step. Only jobs submitted with a budget have a row.
CREATE TABLE job_budgets (
    job_id uuid PRIMARY KEY,
    budget json NOT NULL
);

-- Usage reports by time, for GET /v1/usage.
CREATE INDEX audit_records_usage ON audit_records (ts) WHERE kind = 'usage';
