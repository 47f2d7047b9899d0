-- Tenure schema v3 for SQLite: the indexes of the dashboard's read side (contracts/insights.py, insights.sql).
-- Keyset pages of the jobs list per filter, newest first (the primary key serves the unfiltered list).
CREATE INDEX jobs_tenant_id ON jobs (tenant, id);
CREATE INDEX jobs_state_id ON jobs (state, id);
CREATE INDEX jobs_tenant_state_id ON jobs (tenant, state, id);
-- What finished in the last hour, per minute and state (and tenant), from the index alone.
CREATE INDEX jobs_finished ON jobs (finished_at, state, tenant) WHERE finished_at IS NOT NULL;
