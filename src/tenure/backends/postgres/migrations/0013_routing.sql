-- Weighted routing (docs/routing.md): the worker admission preferred for a job, until when only it may claim the
-- job (its grace, TENURE_ROUTE_GRACE_MS), and the explanation of the choice (compact JSON, control/scoring.py).
ALTER TABLE jobs ADD COLUMN preferred_worker text;
ALTER TABLE jobs ADD COLUMN preferred_until timestamptz;
ALTER TABLE jobs ADD COLUMN route text;
