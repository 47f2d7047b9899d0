-- The claimable jobs of each agent, in claim order (queries.sql claim_jobs and pg_temp.tenure_claim_start): the
-- claim reads the head of this index for each agent the worker serves, a LATERAL probe per agent, and merges the
-- heads. Before, it filtered `agent = ANY(...)` over jobs_ready, and the plan decided what a claim cost: walking
-- jobs_ready past every job of the agents it does not serve (generic plan: 207 ms at 100,000 queued of another
-- agent, 545 ms at 1,000,000; bench/backlog.py --explain), or reading every waiting job of its own agents through
-- jobs_waiting_agent and sorting them. The same predicate and order as jobs_ready (SQLite's 0012 is this index).
CREATE INDEX jobs_ready_agent ON jobs (agent, priority DESC, fair_at, id)
    WHERE state = 'queued' AND owner IS NULL AND NOT key_wait;
