-- Coordinators (docs/coordinators.md): a child job records the parent job and the parent execution that
-- spawned it (`ctx.spawn`); a parent's children are read by parent_job_id (GET /v1/jobs/{id}, gather, cancel).
ALTER TABLE jobs ADD COLUMN parent_job_id uuid;
ALTER TABLE jobs ADD COLUMN parent_execution_id uuid;
CREATE INDEX jobs_parent ON jobs (parent_job_id, id) WHERE parent_job_id IS NOT NULL;
