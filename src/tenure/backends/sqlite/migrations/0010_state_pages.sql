-- Tenure schema v10: the dashboard's state filters without an index over every job's state.
-- jobs_state_id and jobs_tenant_state_id held every job and moved each one at every transition (queued →
-- running → finished: five index writes per job per index), a quarter of a no-op drain's throughput. A list or a
-- count of one state now reads the partial index of its kind (backends/sqlite/insights.py, `STATE_PAGES`):
--   finished states     jobs_done_state / jobs_done_tenant_state (written once, at the finish)
--   queued, scheduled   jobs_waiting_state / jobs_waiting_tenant (written at admission, left at the claim)
--   running             jobs_owned (the owned jobs, as many as the fleet has slots)
--   waiting             jobs_paused_state / jobs_paused_tenant_state (only jobs that pause are ever in them)
DROP INDEX jobs_state_id;
DROP INDEX jobs_tenant_state_id;
CREATE INDEX jobs_done_state ON jobs (lower(state), id) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_done_tenant_state ON jobs (tenant, lower(state), id) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_waiting_state ON jobs (lower(state), id) WHERE state IN ('queued', 'scheduled');
DROP INDEX jobs_waiting_tenant;
CREATE INDEX jobs_waiting_tenant ON jobs (tenant, lower(state), id) WHERE state IN ('queued', 'scheduled');
CREATE INDEX jobs_paused_state ON jobs (lower(state), id) WHERE state = 'waiting';
CREATE INDEX jobs_paused_tenant_state ON jobs (tenant, lower(state), id) WHERE state = 'waiting';
