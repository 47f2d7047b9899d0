-- Tenure schema v10: the dashboard's state indexes on lower(state), an expression no statement of the job path
-- uses, so the claim, start, finish and sweeper statements can never choose them. On (state, id) they could: a
-- planner without statistics (autovacuum off, or a burst before autoanalyze ran) estimated "state = 'queued'"
-- at 14 rows and read every queued job through a bitmap of jobs_state_id for each batched start CAS, O(backlog)
-- per claim (a no-op drain of 10,000 jobs: 0.20 ms of server CPU per job against 0.09 before the dashboard).
-- The dashboard's queries (insights.sql) filter on lower(state); states are lower-case names, so the rows
-- found are the same.
DROP INDEX jobs_state_id;
DROP INDEX jobs_tenant_state_id;
CREATE INDEX jobs_state_id ON jobs (lower(state), id);
CREATE INDEX jobs_tenant_state_id ON jobs (tenant, lower(state), id);
-- The owned jobs led by their owner: the registry lists each worker's jobs (owner = w.id) from this small
-- partial index instead of a sequential scan of jobs per worker; the sweeper still finds expired claims in it.
DROP INDEX jobs_owned;
CREATE INDEX jobs_owned ON jobs (owner, claim_expires_at) WHERE owner IS NOT NULL;
