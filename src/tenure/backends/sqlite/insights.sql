-- Tenure's read side on SQLite (contracts/insights.py): the same questions and names as PostgreSQL's.
-- Each filter combination has a query of its own, so each is planned for the index that serves it
-- (jobs_tenant_id, the primary key, and for a state the partial index of its kind: `{state_index}` and its
-- condition `{state_served}` are filled in per kind by insights.py, STATE_PAGES); see migrations/0003_insights.sql
-- and 0010_state_pages.sql.

-- name: job_page --
-- Newest jobs of every tenant before a cursor (the primary key, backwards).
-- The window is the next ?2 ids before ?1 on the index (the caller passes the greatest id for the first page, so
-- the cursor is always a range of the index); the agent (?3, optional) filters inside it only.
WITH w AS (
    SELECT id FROM jobs
     WHERE id < ?1
     ORDER BY id DESC LIMIT ?2
)
SELECT j.id, j.tenant, j.agent, j.state, j.priority, j.epoch, j.attempts, j.max_attempts, j.owner,
       coalesce(j.owner, e.worker_id) AS worker, j.execution_id,
       j.error_code, substr(j.error_message, 1, 300) AS error_message,
       j.created_at, j.updated_at, j.finished_at
  FROM w JOIN jobs AS j ON j.id = w.id LEFT JOIN executions AS e ON e.id = j.execution_id
 WHERE (?3 IS NULL OR j.agent = ?3)
 ORDER BY j.id DESC LIMIT ?4

-- name: job_page_edge --
-- The oldest id of the window of job_page and its size (where a short page with an agent filter stopped).
SELECT min(id), count(*) FROM (
    SELECT id FROM jobs
     WHERE id < ?1
     ORDER BY id DESC LIMIT ?2
)

-- name: job_page_tenant --
-- Newest jobs of tenant ?5 before a cursor (jobs_tenant_id).
-- The window is the next ?2 ids before ?1 on the index (the caller passes the greatest id for the first page, so
-- the cursor is always a range of the index); the agent (?3, optional) filters inside it only.
WITH w AS (
    SELECT id FROM jobs
     WHERE id < ?1
       AND tenant = ?5
     ORDER BY id DESC LIMIT ?2
)
SELECT j.id, j.tenant, j.agent, j.state, j.priority, j.epoch, j.attempts, j.max_attempts, j.owner,
       coalesce(j.owner, e.worker_id) AS worker, j.execution_id,
       j.error_code, substr(j.error_message, 1, 300) AS error_message,
       j.created_at, j.updated_at, j.finished_at
  FROM w JOIN jobs AS j ON j.id = w.id LEFT JOIN executions AS e ON e.id = j.execution_id
 WHERE (?3 IS NULL OR j.agent = ?3)
 ORDER BY j.id DESC LIMIT ?4

-- name: job_page_tenant_edge --
-- The oldest id of the window of job_page_tenant and its size (where a short page with an agent filter stopped).
SELECT min(id), count(*) FROM (
    SELECT id FROM jobs
     WHERE id < ?1
       AND tenant = ?3
     ORDER BY id DESC LIMIT ?2
)

-- name: job_page_state --
-- Newest jobs in state ?5 before a cursor (the state's index).
-- The window is the next ?2 ids before ?1 on the index (the caller passes the greatest id for the first page, so
-- the cursor is always a range of the index); the agent (?3, optional) filters inside it only.
WITH w AS (
    SELECT id FROM jobs INDEXED BY {state_index}
     WHERE id < ?1
       AND {state_served} AND lower(state) = ?5
     ORDER BY id DESC LIMIT ?2
)
SELECT j.id, j.tenant, j.agent, j.state, j.priority, j.epoch, j.attempts, j.max_attempts, j.owner,
       coalesce(j.owner, e.worker_id) AS worker, j.execution_id,
       j.error_code, substr(j.error_message, 1, 300) AS error_message,
       j.created_at, j.updated_at, j.finished_at
  FROM w JOIN jobs AS j ON j.id = w.id LEFT JOIN executions AS e ON e.id = j.execution_id
 WHERE (?3 IS NULL OR j.agent = ?3)
 ORDER BY j.id DESC LIMIT ?4

-- name: job_page_state_edge --
-- The oldest id of the window of job_page_state and its size (where a short page with an agent filter stopped).
SELECT min(id), count(*) FROM (
    SELECT id FROM jobs INDEXED BY {state_index}
     WHERE id < ?1
       AND {state_served} AND lower(state) = ?3
     ORDER BY id DESC LIMIT ?2
)

-- name: job_page_tenant_state --
-- Newest jobs of tenant ?5 in state ?6 before a cursor (the state's tenant index).
-- The window is the next ?2 ids before ?1 on the index (the caller passes the greatest id for the first page, so
-- the cursor is always a range of the index); the agent (?3, optional) filters inside it only.
WITH w AS (
    SELECT id FROM jobs INDEXED BY {state_tenant_index}
     WHERE id < ?1
       AND {state_served} AND tenant = ?5 AND lower(state) = ?6
     ORDER BY id DESC LIMIT ?2
)
SELECT j.id, j.tenant, j.agent, j.state, j.priority, j.epoch, j.attempts, j.max_attempts, j.owner,
       coalesce(j.owner, e.worker_id) AS worker, j.execution_id,
       j.error_code, substr(j.error_message, 1, 300) AS error_message,
       j.created_at, j.updated_at, j.finished_at
  FROM w JOIN jobs AS j ON j.id = w.id LEFT JOIN executions AS e ON e.id = j.execution_id
 WHERE (?3 IS NULL OR j.agent = ?3)
 ORDER BY j.id DESC LIMIT ?4

-- name: job_page_tenant_state_edge --
-- The oldest id of the window of job_page_tenant_state and its size (where a short page with an agent filter stopped).
SELECT min(id), count(*) FROM (
    SELECT id FROM jobs INDEXED BY {state_tenant_index}
     WHERE id < ?1
       AND {state_served} AND tenant = ?3 AND lower(state) = ?4
     ORDER BY id DESC LIMIT ?2
)

-- name: job_id_range --
-- Jobs whose id lies in [?1, ?2] (a search by id prefix), optionally of tenant ?3, newest first.
SELECT j.id, j.tenant, j.agent, j.state, j.priority, j.epoch, j.attempts, j.max_attempts, j.owner,
       coalesce(j.owner, e.worker_id) AS worker, j.execution_id,
       j.error_code, substr(j.error_message, 1, 300) AS error_message,
       j.created_at, j.updated_at, j.finished_at
  FROM jobs AS j LEFT JOIN executions AS e ON e.id = j.execution_id
 WHERE j.id >= ?1 AND j.id <= ?2 AND (?3 IS NULL OR j.tenant = ?3)
 ORDER BY j.id DESC LIMIT ?4

-- name: jobs_by_idempotency --
-- The job made under one (tenant ?1, idempotency digest ?2) pair (jobs_idem); called once per pair.
SELECT j.id, j.tenant, j.agent, j.state, j.priority, j.epoch, j.attempts, j.max_attempts, j.owner,
       coalesce(j.owner, e.worker_id) AS worker, j.execution_id,
       j.error_code, substr(j.error_message, 1, 300) AS error_message,
       j.created_at, j.updated_at, j.finished_at
  FROM jobs AS j LEFT JOIN executions AS e ON e.id = j.execution_id
 WHERE j.tenant = ?1 AND j.idem_digest = ?2

-- name: jobs_by_execution --
-- Owned jobs whose current execution is in the JSON array ?1 (through jobs_owned: owned jobs are few).
SELECT j.id, j.tenant, j.agent, j.state, j.priority, j.epoch, j.attempts, j.max_attempts, j.owner,
       coalesce(j.owner, e.worker_id) AS worker, j.execution_id,
       j.error_code, substr(j.error_message, 1, 300) AS error_message,
       j.created_at, j.updated_at, j.finished_at
  FROM jobs AS j LEFT JOIN executions AS e ON e.id = j.execution_id
 WHERE j.owner IS NOT NULL AND j.execution_id IN (SELECT value FROM json_each(?1))

-- name: count_by_state --
-- Jobs in state ?2, the count stopping at ?1 (the state's index; count_by_state runs it per state).
SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY {state_index} WHERE {state_served} AND lower(state) = ?2 LIMIT ?1)

-- name: count_by_state_tenant --
-- Jobs of tenant ?3 in state ?2, the count stopping at ?1 (the state's tenant index).
SELECT count(*) FROM (
    SELECT 1 FROM jobs INDEXED BY {state_tenant_index}
     WHERE {state_served} AND tenant = ?3 AND lower(state) = ?2 LIMIT ?1)

-- name: finished_since --
-- Jobs finished since ?1 per minute and state (jobs_finished covers the query).
SELECT CAST(finished_at / 60 AS INTEGER) * 60 AS minute, state, count(*) AS n
  FROM jobs WHERE finished_at >= ?1 GROUP BY 1, 2 ORDER BY 1, 2

-- name: finished_since_tenant --
-- Jobs of tenant ?2 finished since ?1 per minute and state (jobs_finished covers the query).
SELECT CAST(finished_at / 60 AS INTEGER) * 60 AS minute, state, count(*) AS n
  FROM jobs WHERE finished_at >= ?1 AND tenant = ?2 GROUP BY 1, 2 ORDER BY 1, 2

-- name: latency_sample --
-- Queue wait and dispatch of the newest ?2 claimed jobs with an id from ?1 on (ids sort by creation time).
SELECT claimed_at - created_at, execution_started_at - claimed_at
  FROM jobs WHERE id >= ?1 AND claimed_at IS NOT NULL ORDER BY id DESC LIMIT ?2

-- name: latency_sample_tenant --
-- The same for tenant ?3 (jobs_tenant_id).
SELECT claimed_at - created_at, execution_started_at - claimed_at
  FROM jobs WHERE tenant = ?3 AND id >= ?1 AND claimed_at IS NOT NULL ORDER BY id DESC LIMIT ?2

-- name: circuit_failures --
-- Each circuit key with failures since ?1, their number and the last one.
SELECT key, count(*), max(ts) FROM circuit_failures WHERE ts >= ?1 GROUP BY key ORDER BY key

-- name: tenants --
-- The distinct tenants of jobs by a loose index scan of jobs_tenant_id (one probe per tenant, not per job).
WITH RECURSIVE t(tenant) AS (
    SELECT min(tenant) FROM jobs
    UNION ALL
    SELECT (SELECT min(j.tenant) FROM jobs AS j WHERE j.tenant > t.tenant) FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT ?1
