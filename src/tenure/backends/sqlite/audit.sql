-- SQLite queries of the audit chain and the effect journal (docs/audit.md, docs/journal.md). Every write runs
-- inside the store's write transaction, after the fence was checked in the same transaction (`fence_owns`).
-- `{now}` is replaced at load time by SQLite's clock in epoch seconds.

-- name: insert_record --
-- Append one audit record of an execution (a retried batch's duplicate is ignored).
INSERT INTO audit_records (job_id, epoch, seq, execution_id, kind, name, data, started_at, ended_at, ts)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {now})
ON CONFLICT (job_id, epoch, seq) DO NOTHING

-- name: read_records --
-- A job's audit records after a cursor (epoch, seq), in order.
SELECT job_id, epoch, seq, execution_id, kind, name, data, started_at, ended_at, ts FROM audit_records
 WHERE job_id = ?1 AND (epoch > ?2 OR (epoch = ?2 AND seq > ?3))
 ORDER BY epoch, seq LIMIT ?4

-- name: usage_records --
-- Every usage report of a job (for its totals).
SELECT data FROM audit_records WHERE job_id = ? AND kind = 'usage'

-- name: read_steps --
-- A job's journal, in the order its steps began.
SELECT job_id, key, state, epoch, execution_id, started_at, ended_at, result FROM journal_steps
 WHERE job_id = ? ORDER BY started_at, key

-- name: read_step --
-- One step of a job's journal.
SELECT job_id, key, state, epoch, execution_id, started_at, ended_at, result FROM journal_steps
 WHERE job_id = ? AND key = ?

-- name: begin_step --
-- Record that an execution begins a step, unless the job's journal has that key already.
INSERT INTO journal_steps (job_id, key, state, epoch, execution_id, started_at)
VALUES (?, ?, 'started', ?, ?, {now})
ON CONFLICT (job_id, key) DO NOTHING

-- name: end_step --
-- The step this execution began returned: its JSON result.
UPDATE journal_steps SET state = 'done', result = ?4, ended_at = {now}
 WHERE job_id = ?1 AND key = ?2 AND execution_id = ?3 AND state = 'started'

-- name: resolve_step --
-- A step an earlier execution began and never ended: the handler of a later one records its result.
UPDATE journal_steps SET state = 'resolved', result = ?3, ended_at = {now}
 WHERE job_id = ?1 AND key = ?2 AND state = 'started'

-- name: clear_step --
-- The step's function raised: forget its begin (the journal records completions only).
DELETE FROM journal_steps WHERE job_id = ?1 AND key = ?2 AND execution_id = ?3 AND state = 'started'

-- name: insert_budget --
-- A new job's budget (in the enqueue's transaction).
INSERT INTO job_budgets (job_id, budget) VALUES (?, ?) ON CONFLICT (job_id) DO NOTHING

-- name: read_budget --
-- A job's budget and what its executions used of it so far: tool calls, tokens, cost, and the run time of its
-- ended executions. Nothing for a job without a budget.
SELECT b.budget,
       (SELECT count(*) FROM audit_records WHERE job_id = ?1 AND kind = 'tool_call') AS tool_calls,
       (SELECT coalesce(sum(coalesce(json_extract(data, '$.input_tokens'), 0)
                            + coalesce(json_extract(data, '$.output_tokens'), 0)), 0)
          FROM audit_records WHERE job_id = ?1 AND kind = 'usage') AS tokens,
       (SELECT coalesce(sum(json_extract(data, '$.cost_usd')), 0)
          FROM audit_records WHERE job_id = ?1 AND kind = 'usage') AS cost,
       (SELECT coalesce(sum(ended_at - started_at), 0) FROM executions WHERE job_id = ?1) AS wall_s
  FROM job_budgets AS b WHERE b.job_id = ?1

-- name: edit_input --
-- A requeue with an edited input (in the requeue's transaction, after it matched): the new input, and an audit
-- record of the edit (the previous input and the new one) after the last record of the job's last epoch.
INSERT INTO audit_records (job_id, epoch, seq, execution_id, kind, name, data, ts)
SELECT id, epoch, coalesce((SELECT max(seq) FROM audit_records WHERE job_id = ?1 AND epoch = jobs.epoch), 0) + 1,
       NULL, 'requeue', 'input', json_object('previous_input', json(input), 'input', json(?2)), {now}
  FROM jobs WHERE id = ?1

-- name: set_input --
-- The edited input of a requeued job.
UPDATE jobs SET input = ?2 WHERE id = ?1

-- name: old_finished_jobs --
-- Retention: up to ?2 jobs finished more than ?1 seconds ago (finished_at is set only in a terminal state, and
-- cleared by a requeue), oldest first, through the jobs_finished index, of every tenant but those with a
-- retention of their own (?4, a JSON array: TENURE_TENANT_RETENTION_DAYS). Read-only: a pass that finds nothing
-- takes no write lock.
SELECT id, finished_at FROM jobs
 WHERE finished_at IS NOT NULL AND finished_at < {now} - ?1 AND state IN (SELECT value FROM json_each(?3))
   AND tenant NOT IN (SELECT value FROM json_each(?4))
 ORDER BY finished_at LIMIT ?2

-- name: old_finished_jobs_of_tenant --
-- Retention of one tenant with a retention of its own (?4): up to ?2 of its jobs finished more than ?1 seconds
-- ago, oldest first, through jobs_tenant_finished (never stepping over the other tenants' jobs).
SELECT id, finished_at FROM jobs
 WHERE tenant = ?4 AND finished_at IS NOT NULL AND finished_at < {now} - ?1
   AND state IN (SELECT value FROM json_each(?3))
 ORDER BY finished_at LIMIT ?2

-- name: purge_job --
-- Retention, inside the write transaction: delete the job row if it is still finished and old (a requeue in
-- between keeps it); its history goes with it (purge_history).
DELETE FROM jobs
 WHERE id = ?1 AND finished_at IS NOT NULL AND finished_at < {now} - ?2 AND state IN (SELECT value FROM json_each(?3))
RETURNING id

-- name: purge_history --
-- Retention: every row of a purged job's history (events, executions, audit, journal, budget, commands).
DELETE FROM events WHERE job_id = ?1;
DELETE FROM executions WHERE job_id = ?1;
DELETE FROM audit_records WHERE job_id = ?1;
DELETE FROM journal_steps WHERE job_id = ?1;
DELETE FROM job_budgets WHERE job_id = ?1;
DELETE FROM job_commands WHERE job_id = ?1

-- name: usage_report --
-- Usage reports between two times (?1 <= ts < ?2), optionally of one tenant (?4), summed per group: ?3 is
-- 'tenant', 'agent' or 'model'.
SELECT CASE ?3 WHEN 'tenant' THEN j.tenant WHEN 'agent' THEN j.agent ELSE a.name END AS k,
       count(*) AS reports,
       coalesce(sum(json_extract(a.data, '$.input_tokens')), 0) AS input_tokens,
       coalesce(sum(json_extract(a.data, '$.output_tokens')), 0) AS output_tokens,
       coalesce(sum(json_extract(a.data, '$.cost_usd')), 0) AS cost_usd
  FROM audit_records AS a JOIN jobs AS j ON j.id = a.job_id
 WHERE a.kind = 'usage' AND a.ts >= ?1 AND a.ts < ?2 AND (?4 IS NULL OR j.tenant = ?4)
 GROUP BY k ORDER BY k
