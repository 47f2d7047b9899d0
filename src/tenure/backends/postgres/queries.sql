-- PostgreSQL queries of the Tenure store. Each is one round trip; batches travel as parallel arrays.
-- Times are the server's clock; times returned to Python are epoch seconds (float8).

-- name: enqueue_jobs --
-- Insert a batch of jobs (parallel arrays, _batches.jobs), skipping any whose (tenant, idempotency digest)
-- exists: the function of migration 0014, which says why the statement is a function and what it does; the caller
-- runs `flush_barrier` before it reports the jobs as accepted. $25..$31: the gate's read (`Gate.ask`), or NULLs.
SELECT * FROM tenure_enqueue($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int2[], $6::text[], $7::bytea[],
                             $8::bytea[], $9::float8[], $10::int4[], $11::float8[], $12::bool[], $13::text[],
                             $14::int4[], $15::bool[], $16::text[], $17::text[], $18::text[], $19::float8[],
                             $20::uuid[], $21::uuid[], $22::text[], $23::float8[], $24::text[], $25::text,
                             $26::text, $27::float8, $28::int4, $29::float8, $30::int8, $31::int8)

-- name: flush_barrier --
-- A transaction that writes one WAL record (a transactional logical message, prefix `tenure`, empty body; no
-- table is touched) and commits durably (the pool's synchronous_commit is on). Its commit returns only once the
-- WAL is flushed up to its commit record, so past every commit this session has seen, the enqueue's own
-- included (WAL is one sequence). A transaction that only took an xid would not do: PostgreSQL skips the flush
-- when the commit record is the transaction's only WAL. An enqueue returns only after this, so an accepted job
-- is durable; a job that was only seen (committed, not yet flushed) cannot outlive a crash in anything durable
-- either: the start that runs it commits durably after the insert, and so flushes the insert too.
SELECT pg_logical_emit_message(true, 'tenure', '')::text

-- name: jobs_by_idem --
-- The existing jobs of one tenant with these idempotency digests, whole (the columns of `get_job`), with their
-- digests and request fingerprints: the answer an enqueue gives a replayed key.
SELECT id::text, tenant, agent, input::text, priority, requires, state, owner, epoch, execution_id::text,
       attempts, max_attempts, timeout_s, retry_safe, result::text, error_code, error_message,
       extract(epoch FROM created_at)::float8 AS created_at,
       extract(epoch FROM updated_at)::float8 AS updated_at,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM claim_expires_at)::float8 AS claim_expires_at,
       extract(epoch FROM execution_started_at)::float8 AS execution_started_at,
       extract(epoch FROM next_attempt_at)::float8 AS next_attempt_at,
       extract(epoch FROM deadline)::float8 AS deadline,
       extract(epoch FROM cancel_requested_at)::float8 AS cancel_requested_at,
       extract(epoch FROM finished_at)::float8 AS finished_at,
       concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason,
       parent_job_id::text, parent_execution_id::text,
       idem_digest, request_fingerprint
  FROM jobs WHERE tenant = $1 AND idem_digest = ANY($2::bytea[])

-- name: find_by_idem --
-- The existing jobs of one tenant with these idempotency digests (the answer to a replayed key).
SELECT id::text, idem_digest, request_fingerprint FROM jobs WHERE tenant = $1 AND idem_digest = ANY($2::bytea[])

-- name: get_job --
-- One job, optionally restricted to a tenant.
SELECT id::text, tenant, agent, input::text, priority, requires, state, owner, epoch, execution_id::text,
       attempts, max_attempts, timeout_s, retry_safe, result::text, error_code, error_message,
       extract(epoch FROM created_at)::float8 AS created_at,
       extract(epoch FROM updated_at)::float8 AS updated_at,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM claim_expires_at)::float8 AS claim_expires_at,
       extract(epoch FROM execution_started_at)::float8 AS execution_started_at,
       extract(epoch FROM next_attempt_at)::float8 AS next_attempt_at,
       extract(epoch FROM deadline)::float8 AS deadline,
       extract(epoch FROM cancel_requested_at)::float8 AS cancel_requested_at,
       extract(epoch FROM finished_at)::float8 AS finished_at,
       concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason,
       parent_job_id::text, parent_execution_id::text
  FROM jobs WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2)

-- name: job_route --
-- What admission's routing recorded on one job, and the worker (and time) of its first execution.started.
SELECT j.preferred_worker, extract(epoch FROM j.preferred_until)::float8 AS preferred_until, j.route,
       e.payload->>'worker_id' AS claimed_by, extract(epoch FROM e.ts)::float8 AS claimed_at,
       extract(epoch FROM now())::float8 AS now
  FROM jobs AS j
  LEFT JOIN LATERAL (SELECT payload, ts FROM events
                      WHERE job_id = j.id AND seq = 1 AND type = 'execution.started'
                      ORDER BY epoch LIMIT 1) AS e ON true
 WHERE j.id = $1

-- name: list_jobs --
-- Jobs matching optional tenant / state / agent filters, newest first, before an id cursor (the state on
-- lower(state), as the dashboard: jobs_state_id serves a list of one state, as `GET /v1/jobs?state=dead`).
SELECT id::text, tenant, agent, input::text, priority, requires, state, owner, epoch, execution_id::text,
       attempts, max_attempts, timeout_s, retry_safe, result::text, error_code, error_message,
       extract(epoch FROM created_at)::float8 AS created_at,
       extract(epoch FROM updated_at)::float8 AS updated_at,
       extract(epoch FROM claimed_at)::float8 AS claimed_at,
       extract(epoch FROM claim_expires_at)::float8 AS claim_expires_at,
       extract(epoch FROM execution_started_at)::float8 AS execution_started_at,
       extract(epoch FROM next_attempt_at)::float8 AS next_attempt_at,
       extract(epoch FROM deadline)::float8 AS deadline,
       extract(epoch FROM cancel_requested_at)::float8 AS cancel_requested_at,
       extract(epoch FROM finished_at)::float8 AS finished_at,
       concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason,
       parent_job_id::text, parent_execution_id::text
  FROM jobs
 WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR lower(state) = $2)
   AND ($3::text IS NULL OR agent = $3) AND ($4::uuid IS NULL OR id < $4::uuid)
 ORDER BY id DESC LIMIT $5

-- name: claim_jobs --
-- The claim CAS, batched: lock up to $4 claimable jobs (SKIP LOCKED) and take them with epoch + 1 and a token.
-- The candidates are the heads of jobs_ready_agent, one LATERAL probe per agent of the worker ($2), merged in
-- claim order, so a backlog of an agent the worker does not serve is never read (bench/backlog.py). A worker of
-- several agents locks up to $4 heads of each for the statement and claims the best $4 of them. The UPDATE finds
-- each locked candidate by its tuple id (`ctid = ANY(...)`: a Tid Scan, whatever the statistics or the plan cache
-- say; joined to the candidates, a generic plan hashed them against the whole table, 11.8 ms per job behind
-- 100,000). A locked row cannot move, so its tuple id still names it; the id is checked as well. This statement
-- claims for the worker-quota path (claim, then start, a slot per claim) and for a claim connection that may not
-- create the claim function (no TEMP privilege, below): its plan is the planner's own, not pinned like the
-- function's.
WITH candidates AS (
    SELECT h.id, h.ctid FROM unnest($2::text[]) AS a(agent) CROSS JOIN LATERAL (
        SELECT id, ctid, priority, fair_at FROM jobs
         WHERE state = 'queued' AND owner IS NULL AND NOT key_wait
           AND agent = a.agent AND (requires <@ $3::text[] OR NOT EXISTS (
                 SELECT 1 FROM unnest(requires) AS r
                  WHERE r <> ALL($3::text[]) AND (strpos(r, '/') = 0 OR split_part(r, '/', 1) || '/*' <> ALL($3::text[]))))
           AND (deadline IS NULL OR deadline > now())
           AND (preferred_worker IS NULL OR preferred_worker = $1 OR preferred_until <= now())
         ORDER BY priority DESC, fair_at, id
         LIMIT $4
           FOR UPDATE SKIP LOCKED) AS h
     ORDER BY h.priority DESC, h.fair_at, h.id
     LIMIT $4
)
UPDATE jobs AS j
   SET owner = $1, claimed_at = now(), claim_expires_at = now() + make_interval(secs => $5),
       epoch = j.epoch + 1, token = $6, updated_at = now()
 WHERE j.ctid = ANY(ARRAY(SELECT ctid FROM candidates)) AND j.id = ANY(ARRAY(SELECT id FROM candidates))
   AND j.state = 'queued' AND j.owner IS NULL AND NOT j.key_wait AND j.claimed_at IS NULL
   AND j.execution_id IS NULL AND j.execution_started_at IS NULL
RETURNING j.id::text AS id, j.epoch, j.agent, j.input::text AS input, j.attempts, j.max_attempts, j.timeout_s,
          j.retry_safe, j.tenant, extract(epoch FROM j.created_at)::float8 AS created_at,
          extract(epoch FROM j.claimed_at)::float8 AS claimed_at, j.mode_effective AS mode

-- name: start_executions --
-- The start CAS, batched: owner, epoch and token must match an unstarted claim; appends execution.started (seq 1).
WITH x AS (
    SELECT * FROM unnest($2::uuid[], $3::int4[], $4::int8[], $5::uuid[]) AS x(job_id, epoch, token, execution_id)
), s AS (
    UPDATE jobs AS j
       SET state = 'running', execution_id = x.execution_id, execution_started_at = now(),
           attempts = j.attempts + 1, updated_at = now()
      FROM x
     WHERE j.id = x.job_id AND j.state = 'queued' AND j.owner = $1 AND j.claimed_at IS NOT NULL
       AND j.epoch = x.epoch AND j.token = x.token AND j.execution_id IS NULL AND j.execution_started_at IS NULL
    RETURNING j.id, j.epoch, j.execution_id, j.attempts, j.execution_started_at
), ev AS (
    INSERT INTO events (job_id, epoch, seq, execution_id, type, payload, ts)
    SELECT s.id, s.epoch, 1, s.execution_id, 'execution.started',
           json_build_object('worker_id', $1::text, 'attempt', s.attempts), s.execution_started_at
      FROM s
    RETURNING job_id, epoch, seq, execution_id, type, payload, ts
), wake AS (
    SELECT tenure_notify_appended(json_agg(ev)) FROM ev HAVING count(*) > 0
)
SELECT id::text, attempts, extract(epoch FROM execution_started_at)::float8 AS started_at,
       (SELECT count(*) FROM wake) AS woke
  FROM s

-- name: claim_start_function --
-- Created once on each claim connection: `pg_temp.tenure_claim_start`, the claim CAS and the start CAS as one
-- UPDATE. A session-local function (pg_temp) needs no migration and goes away with its connection. Its candidates
-- are claim_jobs' (up to p_limit unowned, unstarted queued jobs, the heads of jobs_ready_agent, locked SKIP
-- LOCKED), read into arrays; its SET is claim_jobs' (owner, epoch + 1, the token, the claim's expiry) and
-- start_executions' (running, the execution, attempts + 1). The start's own conditions (owner, epoch and token of
-- an unstarted claim) hold by construction for a row this same statement claims, so one row version is written
-- per job instead of two, and no second statement has to find the claimed rows again. Keep the conditions in step
-- with claim_jobs and the SET with both (tests/unit/test_misc.py compares them).
-- Its plans are made once per connection and kept (plan_cache_mode): planning the LATERAL read cost 0.95 ms per
-- call (auto_explain, session 12), more than running it. A generic plan does not know p_limit (the planner then
-- expects to read a tenth of the agent's queued jobs), so its cost grows with the queue: behind 1,000,000 queued
-- it passed jit_above_cost and every call compiled it (350 ms per claim); JIT is off here. With sorts, bitmap and
-- sequential scans, hash and merge joins off for this function, the only plan left for the read is each head in
-- index order, stopped after p_limit rows, whatever the statistics say (the outer merge of the heads still sorts,
-- at most p_limit rows per agent); the UPDATE is a Tid Scan of the arrays, index scans off for it (bench/backlog.py,
-- tests/integration/test_claim_plan.py). It sets synchronous_commit on for its transaction: the claim commits with
-- the start, durably.
CREATE OR REPLACE FUNCTION pg_temp.tenure_claim_start(
    p_worker text, p_agents text[], p_caps text[], p_limit int4, p_ttl float8, p_token int8, p_executions uuid[]
) RETURNS TABLE (o_id uuid, o_epoch int4, o_execution_id uuid, o_attempts int4, o_started_at timestamptz,
                 o_agent text, o_input text, o_max_attempts int4, o_timeout_s float8, o_retry_safe bool,
                 o_tenant text, o_created_at float8, o_claimed_at float8, o_mode text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_sort = off SET enable_bitmapscan = off
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off SET jit = off
SET enable_indexscan = on
AS $fn$
DECLARE
    v_ctids tid[];
    v_ids uuid[];
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    WITH candidates AS (
        SELECT h.id, h.ctid FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
            SELECT id, ctid, priority, fair_at FROM jobs
             WHERE state = 'queued' AND owner IS NULL AND NOT key_wait
               AND agent = a.agent AND (requires <@ p_caps OR NOT EXISTS (
                 SELECT 1 FROM unnest(requires) AS r
                  WHERE r <> ALL(p_caps) AND (strpos(r, '/') = 0 OR split_part(r, '/', 1) || '/*' <> ALL(p_caps))))
               AND (deadline IS NULL OR deadline > now())
               AND (preferred_worker IS NULL OR preferred_worker = p_worker OR preferred_until <= now())
             ORDER BY priority DESC, fair_at, id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) AS h
         ORDER BY h.priority DESC, h.fair_at, h.id
         LIMIT p_limit
    )
    SELECT array_agg(c.ctid), array_agg(c.id) INTO v_ctids, v_ids FROM candidates AS c;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    -- The UPDATE is planned with index scans off, so that its plan is the Tid Scan of v_ctids: its conditions imply
    -- the ready indexes' predicate, and on a table without statistics the planner took a whole scan of
    -- jobs_ready_agent for the cheaper (5,950 rows removed by filter per claim in a drain). The header's SET puts
    -- index scans back when the function returns; the read above keeps the plan it was made with.
    PERFORM set_config('enable_indexscan', 'off', true);
    -- One execution id each, by the job's place in the candidates.
    RETURN QUERY
    UPDATE jobs AS j
       SET owner = p_worker, claimed_at = now(), claim_expires_at = now() + make_interval(secs => p_ttl),
           epoch = j.epoch + 1, token = p_token,
           state = 'running', execution_id = p_executions[array_position(v_ids, j.id)], execution_started_at = now(),
           attempts = j.attempts + 1, updated_at = now()
     WHERE j.ctid = ANY(v_ctids) AND j.id = ANY(v_ids)
       AND j.state = 'queued' AND j.owner IS NULL AND NOT j.key_wait AND j.claimed_at IS NULL
       AND j.execution_id IS NULL AND j.execution_started_at IS NULL
    RETURNING j.id, j.epoch, j.execution_id, j.attempts, j.execution_started_at, j.agent, j.input::text,
              j.max_attempts, j.timeout_s, j.retry_safe, j.tenant, extract(epoch FROM j.created_at)::float8,
              extract(epoch FROM j.claimed_at)::float8, j.mode_effective;
END
$fn$

-- name: claim_and_start --
-- The claim CAS and the start CAS in one round trip (pg_temp.tenure_claim_start), appending execution.started.
WITH s AS (
    SELECT o_id AS id, o_epoch AS epoch, o_execution_id AS execution_id, o_attempts AS attempts,
           o_started_at AS execution_started_at, o_agent, o_input, o_max_attempts, o_timeout_s, o_retry_safe,
           o_tenant, o_created_at, o_claimed_at, o_mode
      FROM pg_temp.tenure_claim_start($1, $2::text[], $3::text[], $4, $5, $6, $7::uuid[])
), ev AS (
    INSERT INTO events (job_id, epoch, seq, execution_id, type, payload, ts)
    SELECT s.id, s.epoch, 1, s.execution_id, 'execution.started',
           json_build_object('worker_id', $1::text, 'attempt', s.attempts), s.execution_started_at
      FROM s
    RETURNING job_id, epoch, seq, execution_id, type, payload, ts
), wake AS (
    SELECT tenure_notify_appended(json_agg(ev)) FROM ev HAVING count(*) > 0
)
SELECT id::text AS id, epoch, o_agent AS agent, o_input AS input, attempts, o_max_attempts AS max_attempts,
       o_timeout_s AS timeout_s, o_retry_safe AS retry_safe, o_tenant AS tenant, o_created_at AS created_at,
       o_claimed_at AS claimed_at, o_mode AS mode, execution_id::text AS execution_id,
       extract(epoch FROM execution_started_at)::float8 AS started_at, (SELECT count(*) FROM wake) AS woke
  FROM s

-- name: finish_executions --
-- The finish CAS, batched: execution id, epoch and token must match a running or waiting job. Appends the
-- finishing event and the execution record, and counts a timeout in the agent's circuit (event type, outcome
-- and whether it counts are _rules.finish_effects, given as $13-$15). A retry (state 'scheduled') returns the
-- job to the unowned shape.
WITH x AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::int8[], $4::uuid[], $5::text[], $6::text[], $7::text[],
                         $8::text[], $9::float8[], $10::int4[], $11::float8[], $12::text[], $13::text[],
                         $14::text[], $15::bool[])
           AS x(job_id, epoch, token, execution_id, state, result, error_code, error_message, retry_delay_s,
                seq, started_at, usage, event_type, outcome, counts_in_circuit)
), f AS (
    UPDATE jobs AS j
       SET state = x.state, result = x.result::json, error_code = x.error_code, error_message = x.error_message,
           owner = NULL, claim_expires_at = NULL,
           claimed_at = CASE WHEN x.state = 'scheduled' THEN NULL ELSE j.claimed_at END,
           token = CASE WHEN x.state = 'scheduled' THEN NULL ELSE j.token END,
           execution_id = CASE WHEN x.state = 'scheduled' THEN NULL ELSE j.execution_id END,
           execution_started_at = CASE WHEN x.state = 'scheduled' THEN NULL ELSE j.execution_started_at END,
           next_attempt_at = CASE WHEN x.state = 'scheduled'
                                  THEN now() + make_interval(secs => x.retry_delay_s) END,
           finished_at = CASE WHEN x.state = 'scheduled' THEN NULL ELSE now() END,
           updated_at = now()
      FROM x
     WHERE j.id = x.job_id AND j.execution_id = x.execution_id AND j.epoch = x.epoch AND j.token = x.token
       AND j.state IN ('running', 'waiting')
    RETURNING j.id, j.next_attempt_at, j.agent, j.tenant, j.state, j.concurrency_key
), ev AS (
    INSERT INTO events (job_id, epoch, seq, execution_id, type, payload)
    SELECT x.job_id, x.epoch, x.seq, x.execution_id, x.event_type,
           json_build_object('state', x.state, 'result', x.result::json, 'error_code', x.error_code,
                             'error', x.error_message,
                             'next_attempt_at', extract(epoch FROM f.next_attempt_at)::float8)
      FROM x JOIN f ON f.id = x.job_id
    RETURNING job_id, epoch, seq, execution_id, type, payload, ts
), ex AS (
    INSERT INTO executions (id, job_id, epoch, worker_id, started_at, outcome, usage)
    SELECT x.execution_id, x.job_id, x.epoch, $16, to_timestamp(x.started_at), x.outcome, x.usage::json
      FROM x JOIN f ON f.id = x.job_id
), cb AS (
    -- A timed-out execution counts in its agent's circuit breaker window.
    INSERT INTO circuit_failures (key)
    SELECT 'agent:' || f.agent FROM x JOIN f ON f.id = x.job_id WHERE x.counts_in_circuit
), wake AS (
    SELECT tenure_notify_appended(json_agg(ev)) FROM ev HAVING count(*) > 0
)
SELECT id::text AS id, (SELECT count(*) FROM wake) AS woke, tenant,
       CASE WHEN state <> 'scheduled' THEN concurrency_key END AS passes_key
  FROM f

-- name: append_events --
-- Fenced append, batched: each event is written only while its (job, epoch, token) owns a running or waiting
-- job. FOR SHARE holds the job rows until commit so the sweeper cannot declare them lost in between.
-- One NOTIFY per batch on `tenure_events` carries the inserted events to live subscribers (or, over NOTIFY's
-- 8,000-byte limit, only the job ids: subscribers then read the history).
WITH ins AS (
    INSERT INTO events (job_id, epoch, seq, execution_id, type, payload)
    SELECT x.job_id, x.epoch, x.seq, x.execution_id, x.type, x.payload::json
      FROM unnest($1::uuid[], $2::int4[], $3::int8[], $4::int4[], $5::uuid[], $6::text[], $7::text[])
           AS x(job_id, epoch, token, seq, execution_id, type, payload)
      JOIN (SELECT id, epoch, token FROM jobs
             WHERE id = ANY($1::uuid[]) AND state IN ('running', 'waiting')
             ORDER BY id FOR SHARE) AS j
        ON j.id = x.job_id AND j.epoch = x.epoch AND j.token = x.token
    ON CONFLICT (job_id, epoch, seq) DO NOTHING
    RETURNING job_id, epoch, seq, execution_id, type, payload, ts
), wake AS (
    SELECT tenure_notify_appended(json_agg(ins)) FROM ins HAVING count(*) > 0
)
SELECT job_id::text, (SELECT count(*) FROM wake) AS woke FROM ins

-- name: owning_fences --
-- Which of these fences still own a running or waiting job (the slow path after an append inserted nothing).
SELECT j.id::text FROM jobs AS j
  JOIN unnest($1::uuid[], $2::int4[], $3::int8[]) AS x(job_id, epoch, token)
    ON j.id = x.job_id AND j.epoch = x.epoch AND j.token = x.token
 WHERE j.state IN ('running', 'waiting')

-- name: release_claims --
-- Give back claims this worker never started (drain); wakes other workers.
WITH r AS (
    UPDATE jobs AS j
       SET owner = NULL, claimed_at = NULL, claim_expires_at = NULL, token = NULL, updated_at = now()
      FROM unnest($2::uuid[], $3::int4[], $4::int8[]) AS x(job_id, epoch, token)
     WHERE j.id = x.job_id AND j.owner = $1 AND j.epoch = x.epoch AND j.token = x.token
       AND j.state = 'queued' AND j.execution_started_at IS NULL
    RETURNING j.id
), wake AS (
    SELECT pg_notify('tenure_jobs', '') FROM (SELECT 1 FROM r LIMIT 1) AS one
)
SELECT id::text, (SELECT count(*) FROM wake) AS woke FROM r

-- name: heartbeat --
-- One round trip per interval: the worker is alive, and every claim it still holds (by fence) is extended.
-- The held rows are locked in id order first, like the fenced append's FOR SHARE: two statements locking
-- overlapping rows in different orders (this one and a batch of appends) deadlocked.
WITH x AS (
    SELECT * FROM unnest($4::uuid[], $5::int4[], $6::int8[]) AS x(job_id, epoch, token)
), w AS (
    -- The worker's own record ($8..$10, docs/routing.md) rides along; NULLs (no record sent) keep the row's. Once
    -- a drain was requested the row stays `draining`, even from a heartbeat sent before the worker learnt of it.
    UPDATE workers SET last_heartbeat = now(), state = CASE WHEN drain_requested_at IS NULL THEN $2 ELSE 'draining' END, in_flight = $3, success_rate = coalesce($8, success_rate),
           latency_ms = coalesce($9, latency_ms), consecutive_timeouts = coalesce($10, consecutive_timeouts)
     WHERE id = $1
    RETURNING drain_requested_at IS NOT NULL AS drain, drain_timeout_s
), held AS (
    SELECT j.id FROM jobs AS j
      JOIN x ON j.id = x.job_id AND j.epoch = x.epoch AND j.token = x.token
     WHERE j.owner = $1 AND j.state IN ('queued', 'running', 'waiting')
     ORDER BY j.id
       FOR NO KEY UPDATE OF j
), r AS (
    UPDATE jobs AS j SET claim_expires_at = now() + make_interval(secs => $7)
      FROM held
     WHERE j.id = held.id
    RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel
)
SELECT id::text, cancel, false AS drain, NULL::float8 AS drain_timeout_s FROM r
UNION ALL
SELECT NULL, NULL, true, w.drain_timeout_s FROM w WHERE w.drain

-- name: register_worker --
-- Insert (or refresh) one worker incarnation in the registry.
INSERT INTO workers (id, host, pid, concurrency, agents, capabilities, state, features, agent_specs)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, last_heartbeat = now()

-- name: set_worker_state --
-- Record a worker's lifecycle state.
UPDATE workers SET state = $2, last_heartbeat = now() WHERE id = $1

-- name: list_workers --
-- The registry, with the jobs each worker owns now (jobs_owned, led by the owner: without it, a sequential
-- scan of jobs per worker).
SELECT w.id, w.host, w.pid, w.concurrency, w.agents, w.capabilities, w.state, w.in_flight,
       extract(epoch FROM w.started_at)::float8 AS started_at,
       extract(epoch FROM w.last_heartbeat)::float8 AS last_heartbeat,
       ARRAY(SELECT j.id::text FROM jobs AS j WHERE j.owner = w.id ORDER BY j.id) AS jobs_held,
       w.features, w.success_rate, w.latency_ms, w.consecutive_timeouts,
       w.drain_requested_at IS NOT NULL AS drain_requested, w.agent_specs
  FROM workers AS w
 WHERE $1::bool OR w.state <> 'gone'
 ORDER BY w.started_at, w.id

-- name: request_drain --
-- Ask a worker not gone to drain (its next heartbeat reads the request); the registry shows it draining now.
UPDATE workers SET drain_requested_at = now(), drain_timeout_s = $2, state = 'draining'
 WHERE id = $1 AND state <> 'gone'
RETURNING id, host, pid, concurrency, agents, capabilities, state, in_flight,
          extract(epoch FROM started_at)::float8 AS started_at,
          extract(epoch FROM last_heartbeat)::float8 AS last_heartbeat,
          ARRAY(SELECT j.id::text FROM jobs AS j WHERE j.owner = $1 ORDER BY j.id) AS jobs_held,
          features, success_rate, latency_ms, consecutive_timeouts, true AS drain_requested, agent_specs

-- name: registry_agents --
-- Every worker not gone, with its agents, their recorded specs and its profile (the columns of list_workers, no
-- jobs held: admission's cached snapshot, routing's only read), the most recently started first. `in_flight` is
-- counted now from the jobs it runs (jobs_owned, led by the owner: a probe per worker), not the heartbeat's
-- (up to TENURE_HEARTBEAT_S old): a job it claimed since its last heartbeat must not let routing prefer a full
-- worker, whose preferred jobs would wait out the grace.
SELECT w.id, w.host, w.pid, w.concurrency, w.agents, w.capabilities, w.state,
       (SELECT count(*) FROM jobs AS j WHERE j.owner = w.id AND j.state = 'running')::int4 AS in_flight,
       extract(epoch FROM w.started_at)::float8 AS started_at,
       extract(epoch FROM w.last_heartbeat)::float8 AS last_heartbeat, '{}'::text[] AS jobs_held,
       w.features, w.success_rate, w.latency_ms, w.consecutive_timeouts,
       w.drain_requested_at IS NOT NULL AS drain_requested, w.agent_specs
  FROM workers AS w WHERE w.state <> 'gone' ORDER BY w.started_at DESC, w.id

-- name: read_events --
-- A job's history after a cursor (epoch, seq), in cursor order.
SELECT execution_id::text, epoch, seq, type, payload::text, extract(epoch FROM ts)::float8 AS ts
  FROM events
 WHERE job_id = $1::uuid AND (epoch, seq) > ($2, $3)
 ORDER BY epoch, seq
 LIMIT $4

-- name: list_executions --
-- Every recorded attempt of a job, oldest first.
SELECT id::text, job_id::text, epoch, worker_id, extract(epoch FROM started_at)::float8 AS started_at,
       extract(epoch FROM ended_at)::float8 AS ended_at, outcome, usage::text
  FROM executions WHERE job_id = $1::uuid ORDER BY epoch

-- name: requeue_job --
-- Put a terminal job back in the queue with fresh attempts (a keyed one waits for its key's turn again: the store
-- then passes the turn, backends/postgres/keys.py); appends its event ($4, $5: _rules.requeued_event)
-- after its last one.
WITH u AS (
    UPDATE jobs
       SET state = 'queued', attempts = 0, owner = NULL, claimed_at = NULL, claim_expires_at = NULL,
           token = NULL, execution_id = NULL, execution_started_at = NULL, next_attempt_at = NULL,
           cancel_requested_at = NULL, result = NULL, error_code = NULL, error_message = NULL,
           finished_at = NULL, deadline = NULL, key_wait = concurrency_key IS NOT NULL, updated_at = now()
     WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2) AND state = ANY($3::text[])
    RETURNING id, epoch
), ev AS (
    INSERT INTO events (job_id, epoch, seq, type, payload)
    SELECT u.id, u.epoch,
           COALESCE((SELECT max(e.seq) FROM events AS e WHERE e.job_id = u.id AND e.epoch = u.epoch), 0) + 1,
           $4, $5::json
      FROM u
), wake AS (
    SELECT pg_notify('tenure_jobs', '') FROM (SELECT 1 FROM u LIMIT 1) AS one
)
SELECT id::text, (SELECT count(*) FROM wake) AS woke FROM u

-- name: sweep_release_expired --
-- Release pre-start claims whose owner stopped heartbeating (the next claim bumps the epoch); wakes workers.
WITH r AS (
    UPDATE jobs SET owner = NULL, claimed_at = NULL, claim_expires_at = NULL, token = NULL, updated_at = now()
     WHERE state = 'queued' AND owner IS NOT NULL AND execution_started_at IS NULL AND claim_expires_at < now()
    RETURNING id
), wake AS (
    SELECT pg_notify('tenure_jobs', '') FROM (SELECT 1 FROM r LIMIT 1) AS one
)
SELECT id::text, (SELECT count(*) FROM wake) AS woke FROM r

-- name: sweep_lock_lost --
-- Lock running jobs whose claim expired (their owner is gone), from jobs_owned (a claim with an expiry always
-- has an owner: every write that clears the owner clears the expiry). SKIP LOCKED also skips rows a zombie is
-- appending to right now; they are taken on the next sweep.
SELECT id, epoch, execution_id, owner, extract(epoch FROM execution_started_at)::float8 AS started_at,
       retry_safe, attempts, max_attempts
  FROM jobs
 WHERE owner IS NOT NULL AND state IN ('running', 'waiting') AND claim_expires_at < now()
 ORDER BY id LIMIT 100
   FOR UPDATE SKIP LOCKED

-- name: sweep_mark_lost --
-- Move locked jobs to the state _rules.lost_outcome chose for each ($2): lost or dead, or queued again in the
-- unowned, unstarted shape the claim CAS expects.
UPDATE jobs AS j
   SET state = x.state, owner = NULL, claim_expires_at = NULL,
       claimed_at = CASE WHEN x.state = 'queued' THEN NULL ELSE j.claimed_at END,
       token = CASE WHEN x.state = 'queued' THEN NULL ELSE j.token END,
       execution_id = CASE WHEN x.state = 'queued' THEN NULL ELSE j.execution_id END,
       execution_started_at = CASE WHEN x.state = 'queued' THEN NULL ELSE j.execution_started_at END,
       finished_at = CASE WHEN x.state = 'queued' THEN NULL ELSE now() END,
       error_code = 'owner_lost', error_message = 'the worker running this job stopped heartbeating',
       updated_at = now()
  FROM unnest($1::uuid[], $2::text[]) AS x(id, state)
 WHERE j.id = x.id AND j.state IN ('running', 'waiting')
RETURNING j.id::text AS id, j.state

-- name: sweep_lost_records --
-- For jobs just declared lost: the execution record, and one event (_rules.lost_event) after the execution's
-- last one.
WITH x AS (
    SELECT * FROM unnest($1::uuid[], $2::int4[], $3::uuid[], $4::text[], $5::float8[], $6::text[], $7::text[])
           AS x(job_id, epoch, execution_id, worker_id, started_at, type, payload)
), ex AS (
    INSERT INTO executions (id, job_id, epoch, worker_id, started_at, outcome)
    SELECT x.execution_id, x.job_id, x.epoch, x.worker_id, to_timestamp(x.started_at), 'lost' FROM x
)
INSERT INTO events (job_id, epoch, seq, execution_id, type, payload)
SELECT x.job_id, x.epoch,
       COALESCE((SELECT max(e.seq) FROM events AS e WHERE e.job_id = x.job_id AND e.epoch = x.epoch), 0) + 1,
       x.execution_id, x.type, x.payload::json
  FROM x

-- name: sweep_expire --
-- Queued (unowned) or scheduled jobs past their queue deadline become expired, with their terminal event
-- ($1, $2: _rules.EXPIRED_EVENT).
WITH u AS (
    UPDATE jobs
       SET state = 'expired', finished_at = now(), updated_at = now(), error_code = 'deadline_exceeded',
           error_message = 'the job was not started before its queue deadline'
     WHERE ((state = 'queued' AND owner IS NULL) OR state = 'scheduled') AND deadline < now()
    RETURNING id, epoch
), ev AS (
    INSERT INTO events (job_id, epoch, seq, type, payload)
    SELECT u.id, u.epoch,
           COALESCE((SELECT max(e.seq) FROM events AS e WHERE e.job_id = u.id AND e.epoch = u.epoch), 0) + 1,
           $1, $2::json
      FROM u
)
SELECT id::text AS id FROM u

-- name: sweep_due --
-- Scheduled jobs whose backoff has passed go back to the queue; wakes workers.
WITH u AS (
    UPDATE jobs SET state = 'queued', next_attempt_at = NULL, updated_at = now()
     WHERE state = 'scheduled' AND next_attempt_at <= now()
    RETURNING id
), wake AS (
    SELECT pg_notify('tenure_jobs', '') FROM (SELECT 1 FROM u LIMIT 1) AS one
)
SELECT id::text, (SELECT count(*) FROM wake) AS woke FROM u

-- name: sweep_workers_gone --
-- Workers silent for longer than the given seconds are marked gone.
UPDATE workers SET state = 'gone'
 WHERE state <> 'gone' AND last_heartbeat < now() - make_interval(secs => $1)
RETURNING id

-- name: lease_acquire --
-- Take one slot of a named limit for a holder (idempotent), or refuse when full.
SELECT tenure_lease_acquire($1, $2, $3, $4)

-- name: lease_renew --
-- Extend every held lease still unexpired; returns the ones renewed.
UPDATE leases AS l SET expires_at = now() + make_interval(secs => $3)
  FROM unnest($1::text[], $2::text[]) AS x(key, holder)
 WHERE l.key = x.key AND l.holder = x.holder AND l.expires_at > now()
RETURNING l.key, l.holder

-- name: lease_release --
-- Give back one slot; releasing a slot not held does nothing.
DELETE FROM leases WHERE key = $1 AND holder = $2

-- name: lease_acquire_in_line --
-- Take a slot in FIFO order or wait in the key's line, serving older tickets any free slot: (held, served).
SELECT held, served FROM tenure_lease_acquire_in_line($1, $2, $3, $4)

-- name: lease_release_and_hand_over --
-- Release a slot and hand the free slots to the oldest tickets of the line; returns the tickets served.
SELECT tenure_lease_release_and_hand_over($1, $2, $3, $4) AS ticket

-- name: lease_holders --
-- Unexpired holders of a key, soonest expiry first.
SELECT holder FROM leases WHERE key = $1 AND expires_at > now() ORDER BY expires_at, holder

-- name: server_time --
-- The server's clock.
SELECT extract(epoch FROM clock_timestamp())::float8

-- name: count_live_jobs --
-- Unfinished jobs as (state, tenant, count) through the partial indexes only, never a scan of history:
-- the ready queue (queued, unclaimed) per tenant, owned jobs by state (tenant ''), scheduled retries.
SELECT 'ready' AS kind, tenant, count(*) AS n FROM jobs WHERE state = 'queued' AND owner IS NULL GROUP BY tenant
UNION ALL
SELECT state, '', count(*) FROM jobs WHERE owner IS NOT NULL GROUP BY state
UNION ALL
SELECT 'scheduled', '', count(*) FROM jobs WHERE state = 'scheduled'

-- name: notify_events_of --
-- Tell live subscribers that these jobs' histories grew (writers outside the execution: sweeper, cancel).
SELECT tenure_notify_events(NULL, $1::text[])

-- name: admission_state --
-- What admission's gate reads, in one statement (migration 0015's function, which the enqueue calls too): jobs
-- waiting to start in all and of tenant $1 (each counted up to $4; NULL: no bound), and the failures of circuit $2
-- within the last $3 seconds with the latest one, on the server's clock.
SELECT * FROM tenure_admission_state($1, $2, $3, $4)

-- name: queue_depth --
-- Jobs waiting to start (queued or scheduled): all tenants, and one tenant.
SELECT count(*) AS total, count(*) FILTER (WHERE tenant = $1) AS mine FROM jobs
 WHERE state IN ('queued', 'scheduled')

-- name: circuit_record --
-- Count one failure of a circuit key at the server's clock, forgetting failures older than $2 seconds
-- (_rules.CIRCUIT_KEEP_S).
WITH trim AS (
    DELETE FROM circuit_failures WHERE key = $1 AND ts < now() - make_interval(secs => $2)
)
INSERT INTO circuit_failures (key) VALUES ($1)

-- name: circuit_window --
-- Failures of a key within the window, the latest one, and the server's clock.
SELECT count(*) AS failures, extract(epoch FROM max(ts))::float8 AS latest, extract(epoch FROM now())::float8 AS now
  FROM circuit_failures WHERE key = $1 AND ts > now() - make_interval(secs => $2)

-- name: cancel_job --
-- Cancel: a job that has not started (queued, claimed or not, or scheduled) is cancelled at once with its terminal
-- event, and a claim it had is void (its owner's start CAS expects 'queued' and matches nothing); a running or
-- waiting one is flagged for its owner. Returns what happened, or nothing when the job is unknown. The event is
-- $3, $4 (_rules.CANCELLED_EVENT).
WITH j AS (
    SELECT id, state, owner, execution_id, epoch FROM jobs
     WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2) FOR UPDATE
), direct AS (
    UPDATE jobs AS t
       SET state = 'cancelled', cancel_requested_at = coalesce(t.cancel_requested_at, now()),
           finished_at = now(), updated_at = now(), error_code = 'cancelled',
           error_message = 'cancelled before it started', next_attempt_at = NULL, owner = NULL,
           claim_expires_at = NULL
      FROM j
     WHERE t.id = j.id AND ((j.state = 'queued' AND j.execution_id IS NULL) OR j.state = 'scheduled')
    RETURNING t.id, t.epoch
), flagged AS (
    UPDATE jobs AS t SET cancel_requested_at = coalesce(t.cancel_requested_at, now()), updated_at = now()
      FROM j
     WHERE t.id = j.id AND j.state IN ('running', 'waiting')
    RETURNING t.id
), ev AS (
    INSERT INTO events (job_id, epoch, seq, type, payload)
    SELECT d.id, d.epoch,
           COALESCE((SELECT max(e.seq) FROM events AS e WHERE e.job_id = d.id AND e.epoch = d.epoch), 0) + 1,
           $3, $4::json
      FROM direct AS d
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM direct) THEN 'accepted'
            WHEN EXISTS (SELECT 1 FROM flagged) THEN 'requested'
            ELSE 'already_finished' END
  FROM j

-- name: job_state --
-- A job's state, optionally restricted to a tenant, locked until the end of the transaction.
SELECT state FROM jobs WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2) FOR UPDATE

-- name: insert_command --
-- Persist one control command after the job's last one (the caller holds the job's row lock).
INSERT INTO job_commands (job_id, seq, kind, payload)
VALUES ($1::uuid, coalesce((SELECT max(seq) FROM job_commands WHERE job_id = $1::uuid), 0) + 1, $2, $3::json)

-- name: read_commands --
-- A job's commands after a sequence number, oldest first.
SELECT seq, kind, payload::text AS payload, extract(epoch FROM created_at)::float8 AS created_at FROM job_commands
 WHERE job_id = $1::uuid AND seq > $2 ORDER BY seq

-- name: set_waiting --
-- Fenced running <-> waiting, appending the event in the same statement; returns the job id when it matched.
WITH u AS (
    UPDATE jobs SET state = $5, updated_at = now()
     WHERE id = $1::uuid AND epoch = $2 AND token = $3 AND execution_id = $4::uuid AND state = $6
    RETURNING id, epoch
), ev AS (
    INSERT INTO events (job_id, epoch, seq, execution_id, type, payload)
    SELECT u.id, u.epoch, $7, $4::uuid, $8, $9::json FROM u
    RETURNING job_id
), wake AS (
    SELECT tenure_notify_events(NULL, ARRAY[job_id::text]) FROM ev
)
SELECT id::text, (SELECT count(*) FROM wake) AS woke FROM u

-- name: read_events_many --
-- Several jobs' histories, each after its own cursor and at most $4 events per job, in one round trip.
SELECT x.job_id::text, e.execution_id::text, e.epoch, e.seq, e.type, e.payload::text,
       extract(epoch FROM e.ts)::float8 AS ts
  FROM unnest($1::uuid[], $2::int4[], $3::int4[]) AS x(job_id, epoch, seq)
 CROSS JOIN LATERAL (
        SELECT * FROM events AS ev
         WHERE ev.job_id = x.job_id AND (ev.epoch, ev.seq) > (x.epoch, x.seq)
         ORDER BY ev.epoch, ev.seq LIMIT $4) AS e
 ORDER BY x.job_id, e.epoch, e.seq

-- name: control_cancel --
-- Which of these jobs have a cancel request.
SELECT id::text FROM jobs WHERE id = ANY($1::uuid[]) AND cancel_requested_at IS NOT NULL

-- name: control_last_command --
-- The last command sequence number of each of these jobs that has commands.
SELECT job_id::text AS job_id, max(seq) AS last_seq FROM job_commands WHERE job_id = ANY($1::uuid[]) GROUP BY job_id

-- name: notify_control --
-- Tell the owners' control listeners that these jobs got a command (a hint; the store is the truth).
SELECT pg_notify('tenure_control', array_to_string($1::text[], ','))

-- name: event_listener_renew --
-- This store listens on tenure_events: writers NOTIFY while some listener's lease runs (tenure_notify_events).
-- Also forgets listeners that died more than a minute ago.
WITH gone AS (
    DELETE FROM event_listeners WHERE expires_at < now() - interval '1 minute'
)
INSERT INTO event_listeners (id, expires_at) VALUES ($1, now() + make_interval(secs => $2))
ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at

-- name: event_listener_leave --
-- This store stops listening (closed): writers stop notifying once no other listener's lease runs.
DELETE FROM event_listeners WHERE id = $1

-- Concurrency keys (backends/postgres/keys.py; the decisions are _rules.key_plan and _rules.key_promotions).

-- name: key_lock --
-- Serialise every decision about one key (tenant $1, key $2) until the end of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('tenure_key:' || $1 || '|' || $2, 0))

-- name: cap_lock --
-- Serialise the count and the insert of jobs of one capped agent (max_queued; $1 is 'agent|mode', the mode empty for
-- an agent without modes) until the end of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('tenure_cap:' || $1, 0))

-- name: key_live --
-- The live jobs of a key, oldest first (jobs_keyed), read under the key's lock.
SELECT id::text AS id, state, key_wait, key_limit, state IN ('running', 'waiting') AS started
  FROM jobs
 WHERE tenant = $1 AND concurrency_key = $2 AND state IN ('queued', 'scheduled', 'running', 'waiting')
 ORDER BY id

-- name: key_promote --
-- Give these waiting jobs their key's turn (they become claimable); wakes workers.
WITH u AS (
    UPDATE jobs SET key_wait = false, updated_at = now()
     WHERE id = ANY($1::uuid[]) AND key_wait AND state = 'queued'
    RETURNING id
), wake AS (
    SELECT pg_notify('tenure_jobs', '') FROM (SELECT 1 FROM u LIMIT 1) AS one
)
SELECT id::text, (SELECT count(*) FROM wake) AS woke FROM u

-- name: key_drop --
-- Cancel a not-yet-started job of a key that a drop_queued job replaces ($2: the reason; $3, $4: the event,
-- _rules.DROPPED_EVENT); a claim it had is void, as in cancel_job.
WITH d AS (
    UPDATE jobs
       SET state = 'cancelled', cancel_requested_at = coalesce(cancel_requested_at, now()), finished_at = now(),
           updated_at = now(), error_code = 'replaced', error_message = $2, next_attempt_at = NULL, owner = NULL,
           claim_expires_at = NULL
     WHERE id = $1::uuid AND ((state = 'queued' AND execution_id IS NULL) OR state = 'scheduled')
    RETURNING id, epoch
)
INSERT INTO events (job_id, epoch, seq, type, payload)
SELECT d.id, d.epoch,
       COALESCE((SELECT max(e.seq) FROM events AS e WHERE e.job_id = d.id AND e.epoch = d.epoch), 0) + 1, $3, $4::json
  FROM d

-- name: key_of_job --
-- A job's tenant and concurrency key (after a cancel: whose key's turn may pass).
SELECT tenant, concurrency_key FROM jobs WHERE id = $1::uuid AND concurrency_key IS NOT NULL

-- name: key_stalled --
-- Keys with a waiting job and a free turn (a holder ended and its turn was not passed on: the process died
-- between its finish and the pass, or the holder was swept, expired or cancelled). The sweeper passes them.
SELECT DISTINCT w.tenant, w.concurrency_key
  FROM jobs AS w
 WHERE w.key_wait AND w.state = 'queued'
   AND (SELECT count(*) FROM jobs AS h
         WHERE h.tenant = w.tenant AND h.concurrency_key = w.concurrency_key AND NOT h.key_wait
           AND h.state IN ('queued', 'scheduled', 'running', 'waiting')) < w.key_limit
 LIMIT 100

-- name: queued_of_agent --
-- Jobs of agent $1 waiting to start (queued or scheduled; jobs_waiting_agent), of effective mode $2 when given.
SELECT count(*) FROM jobs
 WHERE agent = $1 AND state IN ('queued', 'scheduled') AND ($2::text IS NULL OR mode_effective = $2)

-- name: waiting_job --
-- A queued, unowned job's place: its priority and turn, its key and whether it waits for the key's turn, its agent
-- and mode.
SELECT id::text AS id, priority, fair_at, tenant, concurrency_key, key_wait, agent, mode_effective FROM jobs
 WHERE id = $1::uuid AND state = 'queued' AND owner IS NULL

-- name: jobs_ahead --
-- Claimable jobs before ($1 id, $2 priority, $4 turn) in claim order (the head of jobs_ready), counted up to $3
-- (n), and of those the jobs of tenants other than $5 at priority $2 (others: ahead by their tenants' turns).
SELECT count(*) AS n, count(*) FILTER (WHERE ahead.tenant <> $5 AND ahead.priority = $2) AS others FROM (
    SELECT tenant, priority FROM jobs
     WHERE state = 'queued' AND owner IS NULL AND NOT key_wait
       AND (priority > $2 OR (priority = $2 AND (fair_at, id) < ($4, $1::uuid)))
     LIMIT $3) AS ahead

-- name: queued_of_agent_upto --
-- queued_of_agent, counted up to $3 (whether the agent's queue is at its cap, without counting past it).
SELECT count(*) FROM (
    SELECT 1 FROM jobs
     WHERE agent = $1 AND state IN ('queued', 'scheduled') AND ($2::text IS NULL OR mode_effective = $2)
     LIMIT $3) AS waiting

-- name: health_xmin_horizon --
-- The oldest transaction holding back vacuum of this database: a session's snapshot or transaction (in this
-- database, or a standby's feedback through a WAL sender), or a prepared transaction; its age in seconds and who
-- it is; no row when nothing holds it. (Replication slots hold it too but carry no start time: see
-- docs/operations.md.) Without pg_read_all_stats, other roles' sessions are hidden from this view.
SELECT age_s, holder FROM (
    SELECT extract(epoch FROM clock_timestamp() - coalesce(xact_start, backend_start))::float8 AS age_s,
           format('pid %s (%s, %s)', pid, coalesce(nullif(application_name, ''), backend_type), state) AS holder
      FROM pg_stat_activity
     WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()
       AND (datname = current_database() OR datname IS NULL)
    UNION ALL
    SELECT extract(epoch FROM clock_timestamp() - prepared)::float8, format('prepared transaction %s', gid)
      FROM pg_prepared_xacts WHERE database = current_database()
) AS holders
ORDER BY age_s DESC LIMIT 1

-- name: health_tables --
-- Dead and live rows (the statistics' estimates) and bytes with indexes of Tenure's tables in this schema.
SELECT c.relname AS name, coalesce(s.n_dead_tup, 0) AS dead, coalesce(s.n_live_tup, 0) AS live,
       pg_total_relation_size(c.oid) AS bytes
  FROM pg_class AS c
  JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname = current_schema()
  LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
 WHERE c.relkind = 'r' AND c.relname = ANY(ARRAY['jobs', 'events', 'executions', 'job_commands', 'leases', 'workers'])
 ORDER BY c.relname

-- name: job_children --
-- The children of a coordinator job (jobs_parent), oldest first: what gather, cancel's cascade and GET read.
SELECT id::text, agent, state FROM jobs WHERE parent_job_id = $1::uuid ORDER BY id

-- name: parent_owns --
-- Does a spawning parent's fence still own its running or waiting job? FOR SHARE: no claim, sweep or finish
-- changes its epoch or state before the child's insert commits in the same transaction.
SELECT 1 FROM jobs WHERE id = $1::uuid AND epoch = $2 AND token = $3 AND state IN ('running', 'waiting') FOR SHARE
