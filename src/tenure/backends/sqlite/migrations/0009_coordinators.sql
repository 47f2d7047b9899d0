-- Coordinators (docs/coordinators.md), as PostgreSQL's 0012: a child job records the parent job and the parent
-- execution that spawned it; a parent's children are read by parent_job_id.
ALTER TABLE jobs ADD COLUMN parent_job_id TEXT;
ALTER TABLE jobs ADD COLUMN parent_execution_id TEXT;
CREATE INDEX jobs_parent ON jobs (parent_job_id, id) WHERE parent_job_id IS NOT NULL;
