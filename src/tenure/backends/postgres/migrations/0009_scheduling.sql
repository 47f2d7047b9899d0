-- Tenure schema v9: scheduling (docs/scheduling.md). Concurrency keys: a keyed job holds one of its key's turns
-- or waits for one (`key_wait`), and a waiting job is outside `jobs_ready`, so the claim never reads it and its
-- common path is unchanged. Degradation: the mode a job asked for, the one it runs as, and why they differ.
ALTER TABLE jobs ADD COLUMN concurrency_key text;
ALTER TABLE jobs ADD COLUMN key_limit integer NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN key_wait boolean NOT NULL DEFAULT false;
ALTER TABLE jobs ADD COLUMN mode_requested text;
ALTER TABLE jobs ADD COLUMN mode_effective text;
ALTER TABLE jobs ADD COLUMN degraded_reason text;
-- Fair shares: a job's place among its priority's claimable jobs (start-time fair queuing across tenants).
ALTER TABLE jobs ADD COLUMN fair_at double precision NOT NULL DEFAULT 0;
-- Claimable jobs, in claim order (priority, then the tenants' turns, then age): a job waiting for its key's turn
-- is not one.
DROP INDEX jobs_ready;
CREATE INDEX jobs_ready ON jobs (priority DESC, fair_at, id) WHERE state = 'queued' AND owner IS NULL AND NOT key_wait;
-- A tenant's last turn per priority: where its next job's turn starts.
CREATE INDEX jobs_tenant_turn ON jobs (tenant, priority, fair_at)
    WHERE state = 'queued' AND owner IS NULL AND NOT key_wait;
-- The live jobs of a key, oldest first: what the key's lock holder reads to decide a turn.
CREATE INDEX jobs_keyed ON jobs (tenant, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'scheduled', 'running', 'waiting');
-- Jobs waiting for their key's turn: what the sweeper checks for keys whose turn was never passed on.
CREATE INDEX jobs_key_waiting ON jobs (tenant, concurrency_key, id) WHERE key_wait AND state = 'queued';
-- Admission caps per agent (max_queued) count queued and scheduled jobs of one agent.
CREATE INDEX jobs_waiting_agent ON jobs (agent) WHERE state IN ('queued', 'scheduled');
