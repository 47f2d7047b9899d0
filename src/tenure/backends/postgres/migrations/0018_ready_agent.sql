-- Claimable jobs of one agent, in claim order: the claim of a worker that serves a few agents reads the head of
-- this index for each of them (queries.sql claim_jobs and pg_temp.tenure_claim_start), so a backlog of an agent it
-- does not serve is never read. Walking jobs_ready with the agent as a filter, a worker of agent b read past every
-- queued job of agent a before it found its own: 30 ms per claim behind 100,000 (bench/backlog.py, session 12).
-- The same predicate and order as jobs_ready: the key rule and the fair shares hold for either. SQLite has had it
-- since its 0012.
CREATE INDEX jobs_ready_agent ON jobs (agent, priority DESC, fair_at, id)
    WHERE state = 'queued' AND owner IS NULL AND NOT key_wait;
