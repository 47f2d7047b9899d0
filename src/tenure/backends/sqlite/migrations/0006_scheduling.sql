-- Tenure schema v6 for SQLite: scheduling (docs/scheduling.md), as PostgreSQL's v9. A job waiting for its
-- concurrency key's turn (`key_wait`) is outside `jobs_ready`, so the claim never reads it.
ALTER TABLE jobs ADD COLUMN concurrency_key TEXT;
ALTER TABLE jobs ADD COLUMN key_limit INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN key_wait INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN mode_requested TEXT;
ALTER TABLE jobs ADD COLUMN mode_effective TEXT;
ALTER TABLE jobs ADD COLUMN degraded_reason TEXT;
ALTER TABLE jobs ADD COLUMN fair_at REAL NOT NULL DEFAULT 0;
DROP INDEX jobs_ready;
CREATE INDEX jobs_ready ON jobs (priority DESC, fair_at, id) WHERE state = 'queued' AND owner IS NULL AND key_wait = 0;
CREATE INDEX jobs_tenant_turn ON jobs (tenant, priority, fair_at) WHERE state = 'queued' AND owner IS NULL AND key_wait = 0;
CREATE INDEX jobs_keyed ON jobs (tenant, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'scheduled', 'running', 'waiting');
CREATE INDEX jobs_key_waiting ON jobs (tenant, concurrency_key, id) WHERE key_wait = 1 AND state = 'queued';
CREATE INDEX jobs_waiting_agent ON jobs (agent) WHERE state IN ('queued', 'scheduled');
