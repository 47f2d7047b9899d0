-- Tenure schema v4 for SQLite: the worker profile of the broker (docs/routing.md; the PostgreSQL migration
-- says what each column is for).
ALTER TABLE workers ADD COLUMN features TEXT NOT NULL DEFAULT '[]';
ALTER TABLE workers ADD COLUMN agent_specs TEXT NOT NULL DEFAULT '{}';
ALTER TABLE workers ADD COLUMN success_rate REAL;
ALTER TABLE workers ADD COLUMN latency_ms REAL;
ALTER TABLE workers ADD COLUMN consecutive_timeouts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN drain_requested_at REAL;
ALTER TABLE workers ADD COLUMN drain_timeout_s REAL;
