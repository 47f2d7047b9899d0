-- Tenure schema v7: the dashboard's state indexes on lower(state), an expression no statement of the job path
-- uses, so no claim, start, finish or sweeper statement can choose them (SQLite's planner took jobs_state_id
-- for the claim before it was pinned to jobs_ready). The same design as PostgreSQL's 0010_state_index.sql.
DROP INDEX jobs_state_id;
DROP INDEX jobs_tenant_state_id;
CREATE INDEX jobs_state_id ON jobs (lower(state), id);
CREATE INDEX jobs_tenant_state_id ON jobs (tenant, lower(state), id);
-- The owned jobs led by their owner: the registry lists each worker's jobs (owner = w.id) from this small
-- partial index instead of a sequential scan of jobs per worker; the sweeper still finds expired claims in it.
DROP INDEX jobs_owned;
CREATE INDEX jobs_owned ON jobs (owner, claim_expires_at) WHERE owner IS NOT NULL;
