-- Tenure schema v12: the claimable jobs of each agent, in claim order (backends/sqlite/_claims.py). A worker that
-- serves a few agents reads the head of this index for each of them instead of walking jobs_ready past every job
-- of the agents it does not serve (bench/backlog.py: 7.3 ms per job behind 100,000 jobs of another agent, before).
-- The same predicate and order as jobs_ready: the key rule and the fair shares hold for either.
CREATE INDEX jobs_ready_agent ON jobs (agent, priority DESC, fair_at, id) WHERE state = 'queued' AND owner IS NULL AND key_wait = 0;
