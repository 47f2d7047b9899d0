-- Weighted routing (docs/routing.md), as PostgreSQL's 0013: the preferred worker, the end of its grace (epoch
-- seconds) and the explanation of the choice (compact JSON).
ALTER TABLE jobs ADD COLUMN preferred_worker TEXT;
ALTER TABLE jobs ADD COLUMN preferred_until REAL;
ALTER TABLE jobs ADD COLUMN route TEXT;
