-- Tenure schema v6: the indexes of the dashboard's read side (contracts/insights.py, insights.sql).
-- Keyset pages of the jobs list per filter, newest first: by tenant, by state, by both (the primary key serves
-- the unfiltered list). Each costs one index entry per non-HOT update of a job; CREATE INDEX (not CONCURRENTLY:
-- migrations run in a transaction) blocks writes to jobs while it builds, a few seconds per million rows.
CREATE INDEX jobs_tenant_id ON jobs (tenant, id);
CREATE INDEX jobs_state_id ON jobs (state, id);
CREATE INDEX jobs_tenant_state_id ON jobs (tenant, state, id);
-- What finished in the last hour, per minute and state (and tenant), as an index-only scan.
CREATE INDEX jobs_finished ON jobs (finished_at) INCLUDE (state, tenant) WHERE finished_at IS NOT NULL;
