-- PostgreSQL queries of the audit chain and the effect journal (docs/audit.md, docs/journal.md). Every write
-- joins the job row it is fenced by (id, epoch, token, running or waiting) FOR SHARE, as `append_events` does:
-- a fence that lost writes nothing, and the sweeper cannot declare the job lost between the check and the write.

-- name: append_audit --
-- Fenced, batched: a worker's pending events ($1..$7, as `append_events`) and audit records ($8..$17) in one
-- statement and one commit; answers the fences that still own their jobs. One NOTIFY per batch for the events.
WITH j AS (
    SELECT id, epoch, token FROM jobs
     WHERE id = ANY($1::uuid[] || $8::uuid[]) AND state IN ('running', 'waiting')
     ORDER BY id FOR SHARE
), ins AS (
    INSERT INTO events (job_id, epoch, seq, execution_id, type, payload)
    SELECT x.job_id, x.epoch, x.seq, x.execution_id, x.type, x.payload::json
      FROM unnest($1::uuid[], $2::int4[], $3::int8[], $4::int4[], $5::uuid[], $6::text[], $7::text[])
           AS x(job_id, epoch, token, seq, execution_id, type, payload)
      JOIN j ON j.id = x.job_id AND j.epoch = x.epoch AND j.token = x.token
    ON CONFLICT (job_id, epoch, seq) DO NOTHING
    RETURNING job_id, epoch, seq, execution_id, type, payload, ts
), rec AS (
    INSERT INTO audit_records (job_id, epoch, seq, execution_id, kind, name, data, started_at, ended_at)
    SELECT r.job_id, r.epoch, r.seq, r.execution_id, r.kind, r.name, r.data::json, r.started_at, r.ended_at
      FROM unnest($8::uuid[], $9::int4[], $10::int8[], $11::int4[], $12::uuid[], $13::text[], $14::text[],
                  $15::text[], $16::float8[], $17::float8[])
           AS r(job_id, epoch, token, seq, execution_id, kind, name, data, started_at, ended_at)
      JOIN j ON j.id = r.job_id AND j.epoch = r.epoch AND j.token = r.token
    ON CONFLICT (job_id, epoch, seq) DO NOTHING
    RETURNING job_id
), wake AS (
    SELECT tenure_notify_appended(json_agg(ins)) FROM ins HAVING count(*) > 0
)
SELECT j.id::text AS id, j.epoch, j.token, (SELECT count(*) FROM wake) AS woke, (SELECT count(*) FROM rec) AS n
  FROM j

-- name: read_records --
-- A job's audit records after a cursor (epoch, seq), in order.
SELECT job_id::text, epoch, seq, execution_id::text, kind, name, data::text, started_at, ended_at,
       extract(epoch FROM ts)::float8 AS ts
  FROM audit_records
 WHERE job_id = $1::uuid AND (epoch, seq) > ($2, $3)
 ORDER BY epoch, seq
 LIMIT $4

-- name: usage_records --
-- Every usage report of a job (for its totals).
SELECT data::text FROM audit_records WHERE job_id = $1::uuid AND kind = 'usage'

-- name: read_steps --
-- A job's journal, in the order its steps began.
SELECT job_id::text, key, state, epoch, execution_id::text, extract(epoch FROM started_at)::float8 AS started_at,
       extract(epoch FROM ended_at)::float8 AS ended_at, result::text
  FROM journal_steps WHERE job_id = $1::uuid ORDER BY started_at, key

-- name: begin_step --
-- Fenced: record that an execution begins a step unless the journal has that key; answers the key's row (this
-- begin, or the one already there), nothing when the fence lost.
WITH j AS (
    SELECT id FROM jobs
     WHERE id = $1::uuid AND epoch = $2 AND token = $3 AND state IN ('running', 'waiting') FOR SHARE
), ins AS (
    INSERT INTO journal_steps (job_id, key, state, epoch, execution_id)
    SELECT j.id, $4, 'started', $2, $5::uuid FROM j
    ON CONFLICT (job_id, key) DO NOTHING
    RETURNING job_id, key, state, epoch, execution_id, started_at, ended_at, result
), row AS (
    SELECT * FROM ins
    UNION ALL
    SELECT s.job_id, s.key, s.state, s.epoch, s.execution_id, s.started_at, s.ended_at, s.result
      FROM journal_steps AS s
     WHERE s.job_id = $1::uuid AND s.key = $4 AND EXISTS (SELECT 1 FROM j) AND NOT EXISTS (SELECT 1 FROM ins)
)
SELECT job_id::text, key, state, epoch, execution_id::text, extract(epoch FROM started_at)::float8 AS started_at,
       extract(epoch FROM ended_at)::float8 AS ended_at, result::text
  FROM row

-- name: end_step --
-- Fenced: the step this execution began returned; its JSON result.
UPDATE journal_steps AS s SET state = 'done', result = $6::json, ended_at = now()
  FROM (SELECT id FROM jobs
         WHERE id = $1::uuid AND epoch = $2 AND token = $3 AND state IN ('running', 'waiting') FOR SHARE) AS j
 WHERE s.job_id = j.id AND s.key = $4 AND s.execution_id = $5::uuid AND s.state = 'started'
RETURNING s.key

-- name: resolve_step --
-- Fenced: a step an earlier execution began and never ended; the handler of a later one records its result.
UPDATE journal_steps AS s SET state = 'resolved', result = $5::json, ended_at = now()
  FROM (SELECT id FROM jobs
         WHERE id = $1::uuid AND epoch = $2 AND token = $3 AND state IN ('running', 'waiting') FOR SHARE) AS j
 WHERE s.job_id = j.id AND s.key = $4 AND s.state = 'started'
RETURNING s.key

-- name: clear_step --
-- Fenced: the step's function raised; forget its begin (the journal records completions only).
DELETE FROM journal_steps AS s
 USING (SELECT id FROM jobs
         WHERE id = $1::uuid AND epoch = $2 AND token = $3 AND state IN ('running', 'waiting') FOR SHARE) AS j
 WHERE s.job_id = j.id AND s.key = $4 AND s.execution_id = $5::uuid AND s.state = 'started'
RETURNING s.key

-- name: insert_budgets --
-- New jobs' budgets (in the enqueue's transaction), for the jobs the enqueue inserted.
INSERT INTO job_budgets (job_id, budget)
SELECT x.job_id, x.budget::json FROM unnest($1::uuid[], $2::text[]) AS x(job_id, budget)
ON CONFLICT (job_id) DO NOTHING

-- name: read_budget --
-- A job's budget and what its executions used of it so far: tool calls, tokens, cost, and the run time of its
-- ended executions. Nothing for a job without a budget.
SELECT b.budget::text,
       (SELECT count(*) FROM audit_records WHERE job_id = $1::uuid AND kind = 'tool_call') AS tool_calls,
       (SELECT coalesce(sum(coalesce((data->>'input_tokens')::float8, 0)
                            + coalesce((data->>'output_tokens')::float8, 0)), 0)
          FROM audit_records WHERE job_id = $1::uuid AND kind = 'usage') AS tokens,
       (SELECT coalesce(sum((data->>'cost_usd')::float8), 0)
          FROM audit_records WHERE job_id = $1::uuid AND kind = 'usage') AS cost,
       (SELECT coalesce(sum(extract(epoch FROM ended_at - started_at)), 0)::float8
          FROM executions WHERE job_id = $1::uuid) AS wall_s
  FROM job_budgets AS b WHERE b.job_id = $1::uuid

-- name: edit_input --
-- A requeue with an edited input (in the requeue's transaction, after it matched): an audit record of the edit
-- (the previous input and the new one) after the last record of the job's last epoch, and the new input.
WITH rec AS (
    INSERT INTO audit_records (job_id, epoch, seq, execution_id, kind, name, data)
    SELECT j.id, j.epoch,
           coalesce((SELECT max(a.seq) FROM audit_records AS a WHERE a.job_id = j.id AND a.epoch = j.epoch), 0) + 1,
           NULL, 'requeue', 'input', json_build_object('previous_input', j.input, 'input', $2::json)
      FROM jobs AS j WHERE j.id = $1::uuid
    RETURNING job_id
)
UPDATE jobs SET input = $2::json FROM rec WHERE jobs.id = rec.job_id

-- name: purge_finished --
-- Retention: up to $2 jobs finished longer ago than their tenant's retention, oldest first, deleted with their
-- whole history (events, executions, audit, journal, budget, commands) in one statement. $4 / $5: the tenants
-- with a retention of their own and its seconds (TENURE_TENANT_RETENTION_DAYS); every other tenant's is $1.
-- finished_at is set only in a terminal state ($3) and cleared by a requeue. The candidates are one bounded index
-- scan for the tenants on the default (jobs_finished, skipping those with their own) and one per tenant with its
-- own (jobs_tenant_finished), so a 7-day tenant's pass never reads the other tenants' jobs between 7 and 30
-- days old. Rows another transaction holds are skipped (the next pass takes them), and a locked row is checked
-- again, against its own tenant's cutoff, before it goes.
WITH own AS (
    SELECT * FROM unnest($4::text[], $5::float8[]) AS own(tenant, secs)
), pick AS (
    (SELECT id, finished_at FROM jobs
      WHERE finished_at IS NOT NULL AND finished_at < now() - make_interval(secs => $1)
        AND state = ANY($3::text[]) AND tenant <> ALL($4::text[])
      ORDER BY finished_at LIMIT $2)
    UNION ALL
    SELECT p.id, p.finished_at FROM own CROSS JOIN LATERAL (
        SELECT id, finished_at FROM jobs
         WHERE tenant = own.tenant AND finished_at IS NOT NULL AND finished_at < now() - make_interval(secs => own.secs)
           AND state = ANY($3::text[])
         ORDER BY finished_at LIMIT $2) AS p
), gone AS (
    DELETE FROM jobs
     WHERE id IN (SELECT j.id FROM jobs AS j
                   WHERE j.id IN (SELECT id FROM pick ORDER BY finished_at LIMIT $2)
                     AND j.finished_at IS NOT NULL AND j.state = ANY($3::text[])
                     AND j.finished_at < now() - make_interval(
                         secs => coalesce((SELECT own.secs FROM own WHERE own.tenant = j.tenant), $1))
                   FOR UPDATE SKIP LOCKED)
    RETURNING id
), e AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM gone)
), x AS (
    DELETE FROM executions WHERE job_id IN (SELECT id FROM gone)
), a AS (
    DELETE FROM audit_records WHERE job_id IN (SELECT id FROM gone)
), s AS (
    DELETE FROM journal_steps WHERE job_id IN (SELECT id FROM gone)
), b AS (
    DELETE FROM job_budgets WHERE job_id IN (SELECT id FROM gone)
), c AS (
    DELETE FROM job_commands WHERE job_id IN (SELECT id FROM gone)
)
SELECT id::text FROM gone

-- name: usage_report --
-- Usage reports between two times ($1 <= ts < $2, epoch seconds), optionally of one tenant ($4), summed per
-- group: $3 is 'tenant', 'agent' or 'model'.
SELECT CASE $3::text WHEN 'tenant' THEN j.tenant WHEN 'agent' THEN j.agent ELSE a.name END AS k,
       count(*) AS reports,
       coalesce(sum((a.data->>'input_tokens')::float8), 0) AS input_tokens,
       coalesce(sum((a.data->>'output_tokens')::float8), 0) AS output_tokens,
       coalesce(sum((a.data->>'cost_usd')::float8), 0) AS cost_usd
  FROM audit_records AS a JOIN jobs AS j ON j.id = a.job_id
 WHERE a.kind = 'usage' AND a.ts >= to_timestamp($1) AND a.ts < to_timestamp($2) AND ($4::text IS NULL OR j.tenant = $4)
 GROUP BY 1 ORDER BY 1
