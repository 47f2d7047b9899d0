-- Tenure schema v11: per-tenant retention (TENURE_TENANT_RETENTION_DAYS, docs/retention.md). A tenant with its own
-- retention has its finished jobs read oldest first from this index, so its pass never steps over other
-- tenants' jobs (through jobs_finished a 7-day tenant's pass would read every job of every tenant between 7 and
-- 30 days old, on every sweep). Only finished jobs are in it: the claim path does not maintain it.
CREATE INDEX jobs_tenant_finished ON jobs (tenant, finished_at) INCLUDE (state) WHERE finished_at IS NOT NULL;
