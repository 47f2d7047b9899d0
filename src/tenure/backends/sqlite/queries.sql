-- SQLite queries of the Tenure store. Every write runs inside BEGIN IMMEDIATE (one writer at a time across
-- processes), so a conditional update and the reads before it see one consistent database.
-- `{now}` is replaced at load time by SQLite's clock in epoch seconds.
-- The writes on the job path (the insert, the claim, the start, the finish) have no RETURNING clause: SQLite
-- (3.40) gives each statement with one an ephemeral table of its own. On this schema the finish's UPDATE with it
-- took 50-59 us, the same UPDATE and a read of the row by its key 20 us; the insert 101-104 us against 45-47
-- without (bench/README.md, session 17). They are read back by key instead (`changed` in _writes.py), as the
-- RETURNING clause would have answered: after the write, before anything else in the transaction.

-- name: insert_job --
-- Insert one job unless its (tenant, idempotency digest) exists; the caller reads the row as inserted back with
-- `get_job` when it changed one (no RETURNING: the header says why).
INSERT INTO jobs (id, tenant, agent, input, priority, requires, idem_digest, request_fingerprint, deadline,
                  max_attempts, timeout_s, retry_safe, created_at, updated_at, concurrency_key, key_limit, key_wait,
                  mode_requested, mode_effective, degraded_reason, parent_job_id, parent_execution_id,
                  preferred_worker, preferred_until, route, fair_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, {now} + ?9, ?10, ?11, ?12, {now}, {now}, ?13, ?14, ?15, ?16, ?17, ?18, ?20,
        ?21, ?22, {now} + ?23, ?24,
        -- fair_at (start-time fair queuing across tenants): one step (?19) after the tenant's last turn at this
        -- priority, never before the head of the line.
        max(coalesce((SELECT max(t.fair_at) FROM jobs AS t
                       WHERE t.tenant = ?2 AND t.priority = ?5 AND t.state = 'queued' AND t.owner IS NULL
                         AND t.key_wait = 0) + ?19, -1e308),
            coalesce((SELECT h.fair_at FROM jobs AS h
                       WHERE h.priority = ?5 AND h.state = 'queued' AND h.owner IS NULL AND h.key_wait = 0
                       ORDER BY h.priority DESC, h.fair_at, h.id LIMIT 1), 0)))
ON CONFLICT (tenant, idem_digest) WHERE idem_digest IS NOT NULL DO NOTHING

-- name: jobs_by_idem --
-- The existing job of a tenant with this idempotency digest, whole (the columns of `get_job`), with its digest
-- and request fingerprint: the answer an enqueue gives a replayed key.
SELECT id, tenant, agent, input, priority, requires, state, owner, epoch, execution_id, attempts, max_attempts,
       timeout_s, retry_safe, result, error_code, error_message, created_at, updated_at, claimed_at,
       claim_expires_at, execution_started_at, next_attempt_at, deadline, cancel_requested_at, finished_at,
          concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason, parent_job_id,
          parent_execution_id,
       idem_digest, request_fingerprint
  FROM jobs WHERE tenant = ? AND idem_digest = ?

-- name: find_by_idem --
-- The existing job of a tenant with this idempotency digest.
SELECT id, request_fingerprint FROM jobs WHERE tenant = ? AND idem_digest = ?

-- name: get_job --
-- One job, optionally restricted to a tenant.
SELECT id, tenant, agent, input, priority, requires, state, owner, epoch, execution_id, attempts, max_attempts,
       timeout_s, retry_safe, result, error_code, error_message, created_at, updated_at, claimed_at,
       claim_expires_at, execution_started_at, next_attempt_at, deadline, cancel_requested_at, finished_at,
          concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason, parent_job_id,
          parent_execution_id
  FROM jobs WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)

-- name: job_route --
-- What admission's routing recorded on one job, and the worker (and time) of its first execution.started.
SELECT j.preferred_worker, j.preferred_until, j.route,
       (SELECT json_extract(e.payload, '$.worker_id') FROM events AS e
         WHERE e.job_id = j.id AND e.seq = 1 AND e.type = 'execution.started' ORDER BY e.epoch LIMIT 1) AS claimed_by,
       (SELECT e.ts FROM events AS e
         WHERE e.job_id = j.id AND e.seq = 1 AND e.type = 'execution.started' ORDER BY e.epoch LIMIT 1) AS claimed_at,
       {now} AS now
  FROM jobs AS j WHERE j.id = ?1

-- name: list_jobs --
-- Jobs matching optional tenant / agent filters, newest first, before an id cursor (a state filter takes
-- list_jobs_state or list_jobs_tenant_state).
SELECT id, tenant, agent, input, priority, requires, state, owner, epoch, execution_id, attempts, max_attempts,
       timeout_s, retry_safe, result, error_code, error_message, created_at, updated_at, claimed_at,
       claim_expires_at, execution_started_at, next_attempt_at, deadline, cancel_requested_at, finished_at,
          concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason, parent_job_id,
          parent_execution_id
  FROM jobs
 WHERE (?1 IS NULL OR tenant = ?1) AND (?3 IS NULL OR agent = ?3) AND (?4 IS NULL OR id < ?4)
 ORDER BY id DESC LIMIT ?5

-- name: list_jobs_state --
-- The same of state ?2, on the state's partial index ({state_index}: _state_pages.py); ?1 is NULL.
SELECT id, tenant, agent, input, priority, requires, state, owner, epoch, execution_id, attempts, max_attempts,
       timeout_s, retry_safe, result, error_code, error_message, created_at, updated_at, claimed_at,
       claim_expires_at, execution_started_at, next_attempt_at, deadline, cancel_requested_at, finished_at,
          concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason, parent_job_id,
          parent_execution_id
  FROM jobs INDEXED BY {state_index}
 WHERE {state_served} AND lower(state) = ?2 AND ?1 IS NULL AND (?3 IS NULL OR agent = ?3) AND (?4 IS NULL OR id < ?4)
 ORDER BY id DESC LIMIT ?5

-- name: list_jobs_tenant_state --
-- The same of tenant ?1 in state ?2, on the state's partial index led by the tenant.
SELECT id, tenant, agent, input, priority, requires, state, owner, epoch, execution_id, attempts, max_attempts,
       timeout_s, retry_safe, result, error_code, error_message, created_at, updated_at, claimed_at,
       claim_expires_at, execution_started_at, next_attempt_at, deadline, cancel_requested_at, finished_at,
          concurrency_key, key_wait, mode_requested, mode_effective, degraded_reason, parent_job_id,
          parent_execution_id
  FROM jobs INDEXED BY {state_tenant_index}
 WHERE {state_served} AND tenant = ?1 AND lower(state) = ?2 AND (?3 IS NULL OR agent = ?3) AND (?4 IS NULL OR id < ?4)
 ORDER BY id DESC LIMIT ?5

-- name: claim_probe --
-- Read-only, before the claim takes the write lock: is anything claimable by this worker now (its agents ?2 and
-- capabilities ?3, and no job preferred to another worker in its grace; ?4 is the claim's limit)? The claim's own
-- candidates, so an idle poll, or a worker woken for a job preferred to another, never queues behind the writer.
SELECT 1 FROM ({candidates}) LIMIT 1

-- name: claim_candidates --
-- The candidates of a claim (claim_jobs, claim_and_start): up to ?4 claimable jobs best first (priority, tenant
-- turn, age) that worker ?1 may run (agents ?2, capabilities ?3, not preferred to another worker in its grace).
-- The index and the agent filter are filled in by _claims.py: a worker of a few agents reads the head of
-- jobs_ready_agent for each of them (`agent = json_extract(?2, '$[i]')`) and merges them, so a backlog of an agent
-- it does not serve costs it nothing; one of many agents reads the head of jobs_ready. Either is pinned (INDEXED
-- BY): left to itself, SQLite's planner picked a state index and sorted every queued job for each claim, 51 ms
-- per job behind 100,000 queued (bench/backlog.py).
SELECT id, priority, fair_at FROM jobs INDEXED BY {index}
         WHERE state = 'queued' AND owner IS NULL AND key_wait = 0
           AND {agent}
           AND (requires = '' OR NOT EXISTS (
                 SELECT 1 FROM json_each('["' || replace(requires, ',', '","') || '"]') AS r
                  WHERE r.value NOT IN (SELECT value FROM json_each(?3))
                    AND (instr(r.value, '/') = 0
                         OR substr(r.value, 1, instr(r.value, '/')) || '*' NOT IN (SELECT value FROM json_each(?3)))))
           AND (deadline IS NULL OR deadline > {now})
           AND (preferred_worker IS NULL OR preferred_worker = ?1 OR preferred_until <= {now})
 ORDER BY priority DESC, fair_at, id
 LIMIT ?4

-- name: claim_jobs --
-- The claim CAS, batched: take up to ?4 claimable jobs with epoch + 1 and the token. Its candidates are
-- claim_candidates, filled in per worker (_claims.py).
UPDATE jobs
   SET owner = ?1, claimed_at = {now}, claim_expires_at = {now} + ?5, epoch = epoch + 1, token = ?6,
       updated_at = {now}
 WHERE id IN (
        SELECT id FROM ({candidates}))
   AND state = 'queued' AND owner IS NULL AND key_wait = 0 AND claimed_at IS NULL AND execution_id IS NULL
   AND execution_started_at IS NULL

-- name: claimed_jobs --
-- The jobs one claim statement took (claim_jobs or claim_and_start), read back in its transaction: the worker's
-- owned jobs (?1) with the claim's token (?2, new for each statement).
SELECT id, epoch, agent, input, attempts, max_attempts, timeout_s, retry_safe, tenant, created_at, claimed_at,
       mode_effective AS mode, execution_id, execution_started_at AS started_at
  FROM jobs INDEXED BY jobs_owned WHERE owner = ?1 AND token = ?2

-- name: claim_and_start --
-- The claim CAS and the start CAS as one UPDATE (as PostgreSQL's tenure_claim_start): claim_jobs' candidates and
-- conditions, claim_jobs' and start_execution's SET; the start's own conditions (owner, epoch and token of an
-- unstarted claim) hold by construction for a row this statement claims. One row version per job instead of
-- two. ?7 is a JSON array of execution ids, one per candidate in the claim's order. Keep in step with claim_jobs
-- and start_execution (tests/unit/test_misc.py compares them).
WITH c AS (
    SELECT id, row_number() OVER (ORDER BY priority DESC, fair_at, id) - 1 AS n FROM ({candidates})
)
UPDATE jobs
   SET owner = ?1, claimed_at = {now}, claim_expires_at = {now} + ?5, epoch = epoch + 1, token = ?6,
       state = 'running', execution_id = json_extract(?7, '$[' || c.n || ']'), execution_started_at = {now},
       attempts = attempts + 1, updated_at = {now}
  FROM c
 WHERE jobs.id = c.id
   AND state = 'queued' AND owner IS NULL AND key_wait = 0 AND claimed_at IS NULL AND execution_id IS NULL
   AND execution_started_at IS NULL

-- name: start_execution --
-- The start CAS: owner, epoch and token must match an unstarted claim.
UPDATE jobs
   SET state = 'running', execution_id = ?5, execution_started_at = {now}, attempts = attempts + 1,
       updated_at = {now}
 WHERE id = ?1 AND state = 'queued' AND owner = ?2 AND claimed_at IS NOT NULL AND epoch = ?3 AND token = ?4
   AND execution_id IS NULL AND execution_started_at IS NULL

-- name: started_job --
-- What a matched start answers (read back after start_execution, in its transaction).
SELECT attempts, execution_started_at AS started_at FROM jobs WHERE id = ?1

-- name: insert_event --
-- Append one event (callers have checked the fence inside the same transaction).
INSERT INTO events (job_id, epoch, seq, execution_id, type, payload, ts) VALUES (?, ?, ?, ?, ?, ?, {now})
ON CONFLICT (job_id, epoch, seq) DO NOTHING

-- name: insert_event_next --
-- Append one event after the last one of its (job, epoch): for writers that are not the execution (sweeper).
INSERT INTO events (job_id, epoch, seq, execution_id, type, payload, ts)
VALUES (?1, ?2, COALESCE((SELECT max(seq) FROM events WHERE job_id = ?1 AND epoch = ?2), 0) + 1, ?3, ?4, ?5,
        {now})

-- name: finish_execution --
-- The finish CAS: execution id, epoch and token must match a running or waiting job. A retry ('scheduled')
-- returns the job to the unowned, unstarted shape the claim CAS expects.
UPDATE jobs
   SET state = ?5, result = ?6, error_code = ?7, error_message = ?8, owner = NULL, claim_expires_at = NULL,
       claimed_at = CASE WHEN ?5 = 'scheduled' THEN NULL ELSE claimed_at END,
       token = CASE WHEN ?5 = 'scheduled' THEN NULL ELSE token END,
       execution_id = CASE WHEN ?5 = 'scheduled' THEN NULL ELSE execution_id END,
       execution_started_at = CASE WHEN ?5 = 'scheduled' THEN NULL ELSE execution_started_at END,
       next_attempt_at = CASE WHEN ?5 = 'scheduled' THEN {now} + ?9 END,
       finished_at = CASE WHEN ?5 = 'scheduled' THEN NULL ELSE {now} END,
       updated_at = {now}
 WHERE id = ?1 AND execution_id = ?2 AND epoch = ?3 AND token = ?4 AND state IN ('running', 'waiting')

-- name: finished_job --
-- What a matched finish needs of its job (read back after finish_execution, in its transaction): when a retry is
-- due, its tenant, and the concurrency key whose turn passes on (none for a retry: it keeps its place).
SELECT next_attempt_at, tenant, CASE WHEN state <> 'scheduled' THEN concurrency_key END AS passes_key
  FROM jobs WHERE id = ?1

-- name: insert_execution --
-- The record of one attempt, written when it ends.
INSERT INTO executions (id, job_id, epoch, worker_id, started_at, ended_at, outcome, usage)
VALUES (?, ?, ?, ?, ?, {now}, ?, ?)

-- name: fence_owns --
-- Does this fence still own a running or waiting job?
SELECT 1 FROM jobs WHERE id = ? AND epoch = ? AND token = ? AND state IN ('running', 'waiting')

-- name: release_claim --
-- Give back one claim this worker never started.
UPDATE jobs SET owner = NULL, claimed_at = NULL, claim_expires_at = NULL, token = NULL, updated_at = {now}
 WHERE id = ? AND owner = ? AND epoch = ? AND token = ? AND state = 'queued' AND execution_started_at IS NULL

-- name: heartbeat_worker --
-- The worker is alive; its own record (?4..?6, docs/routing.md) rides along (NULLs keep the row's). Once a drain
-- was requested the row stays `draining`, even from a heartbeat sent before the worker learnt of the request.
UPDATE workers SET last_heartbeat = {now}, state = CASE WHEN drain_requested_at IS NULL THEN ?1 ELSE 'draining' END, in_flight = ?2, success_rate = coalesce(?4, success_rate),
       latency_ms = coalesce(?5, latency_ms), consecutive_timeouts = coalesce(?6, consecutive_timeouts)
 WHERE id = ?3
RETURNING drain_requested_at, drain_timeout_s

-- name: heartbeat_claim --
-- Extend one held claim if this fence still owns it; returns its cancel request time (NULL if none).
-- (Not `RETURNING x IS NOT NULL`: SQLite 3.40 evaluates that to 1 for a NULL here.)
UPDATE jobs SET claim_expires_at = {now} + ?5
 WHERE id = ?1 AND owner = ?2 AND epoch = ?3 AND token = ?4 AND state IN ('queued', 'running', 'waiting')
RETURNING cancel_requested_at

-- name: register_worker --
-- Insert (or refresh) one worker incarnation in the registry.
INSERT INTO workers (id, host, pid, concurrency, agents, capabilities, state, features, agent_specs, started_at,
                     last_heartbeat)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {now}, {now})
ON CONFLICT (id) DO UPDATE SET state = excluded.state, last_heartbeat = {now}

-- name: set_worker_state --
-- Record a worker's lifecycle state.
UPDATE workers SET state = ?2, last_heartbeat = {now} WHERE id = ?1

-- name: list_workers --
-- The registry, with the jobs each worker owns now.
SELECT w.id, w.host, w.pid, w.concurrency, w.agents, w.capabilities, w.state, w.in_flight, w.started_at,
       w.last_heartbeat,
       (SELECT json_group_array(j.id) FROM (SELECT id FROM jobs WHERE owner = w.id ORDER BY id) AS j) AS jobs_held,
       w.features, w.success_rate, w.latency_ms, w.consecutive_timeouts,
       w.drain_requested_at IS NOT NULL AS drain_requested, w.agent_specs
  FROM workers AS w
 WHERE (?1 OR w.state <> 'gone') AND (?2 IS NULL OR w.id = ?2)
 ORDER BY w.started_at, w.id

-- name: request_drain --
-- Ask a worker not gone to drain (its next heartbeat reads the request); the registry shows it draining now.
UPDATE workers SET drain_requested_at = {now}, drain_timeout_s = ?2, state = 'draining'
 WHERE id = ?1 AND state <> 'gone'

-- name: registry_agents --
-- Every worker not gone, with its agents, their recorded specs and its profile (the columns of list_workers, no
-- jobs held: admission's cached snapshot, routing's only read), the most recently started first. `in_flight` is
-- counted now from the jobs it runs (jobs_owned), not the heartbeat's: as PostgreSQL's, which says why.
SELECT w.id, w.host, w.pid, w.concurrency, w.agents, w.capabilities, w.state,
       (SELECT count(*) FROM jobs AS j INDEXED BY jobs_owned WHERE j.owner = w.id AND j.state = 'running') AS in_flight,
       w.started_at, w.last_heartbeat, '[]' AS jobs_held, w.features, w.success_rate, w.latency_ms,
       w.consecutive_timeouts, w.drain_requested_at IS NOT NULL AS drain_requested, w.agent_specs
  FROM workers AS w WHERE w.state <> 'gone' ORDER BY w.started_at DESC, w.id

-- name: read_events --
-- A job's history after a cursor (epoch, seq), in cursor order.
SELECT execution_id, epoch, seq, type, payload, ts FROM events
 WHERE job_id = ?1 AND (epoch > ?2 OR (epoch = ?2 AND seq > ?3))
 ORDER BY epoch, seq LIMIT ?4

-- name: list_executions --
-- Every recorded attempt of a job, oldest first.
SELECT id, job_id, epoch, worker_id, started_at, ended_at, outcome, usage FROM executions
 WHERE job_id = ? ORDER BY epoch

-- name: requeue_job --
-- Put a terminal job back in the queue with fresh attempts (a keyed one waits for its key's turn again: the store
-- then passes the turn, backends/sqlite/keys.py).
UPDATE jobs
   SET state = 'queued', attempts = 0, owner = NULL, claimed_at = NULL, claim_expires_at = NULL, token = NULL,
       execution_id = NULL, execution_started_at = NULL, next_attempt_at = NULL, cancel_requested_at = NULL,
       result = NULL, error_code = NULL, error_message = NULL, finished_at = NULL, deadline = NULL,
       key_wait = concurrency_key IS NOT NULL, updated_at = {now}
 WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2) AND state IN (SELECT value FROM json_each(?3))
RETURNING id, epoch, tenant, concurrency_key

-- name: sweep_release_expired --
-- Release pre-start claims whose owner stopped heartbeating (the next claim bumps the epoch).
UPDATE jobs SET owner = NULL, claimed_at = NULL, claim_expires_at = NULL, token = NULL, updated_at = {now}
 WHERE state = 'queued' AND owner IS NOT NULL AND execution_started_at IS NULL AND claim_expires_at < {now}
RETURNING id

-- name: sweep_find_lost --
-- Running or waiting jobs whose claim expired: their owner is gone.
SELECT id, epoch, execution_id, owner, execution_started_at AS started_at, retry_safe, attempts, max_attempts
  FROM jobs
 WHERE owner IS NOT NULL AND state IN ('running', 'waiting') AND claim_expires_at < {now}
 ORDER BY id LIMIT 100

-- name: sweep_mark_lost --
-- Declare one job lost, or (retry-safe with attempts left) put it back unowned and unstarted, or dead.
UPDATE jobs
   SET state = ?2, owner = NULL, claim_expires_at = NULL,
       claimed_at = CASE WHEN ?2 = 'queued' THEN NULL ELSE claimed_at END,
       token = CASE WHEN ?2 = 'queued' THEN NULL ELSE token END,
       execution_id = CASE WHEN ?2 = 'queued' THEN NULL ELSE execution_id END,
       execution_started_at = CASE WHEN ?2 = 'queued' THEN NULL ELSE execution_started_at END,
       finished_at = CASE WHEN ?2 = 'queued' THEN NULL ELSE {now} END,
       error_code = 'owner_lost', error_message = 'the worker running this job stopped heartbeating',
       updated_at = {now}
 WHERE id = ?1 AND state IN ('running', 'waiting')

-- name: sweep_expire --
-- Queued (unowned) or scheduled jobs past their queue deadline become expired.
UPDATE jobs
   SET state = 'expired', finished_at = {now}, updated_at = {now}, error_code = 'deadline_exceeded',
       error_message = 'the job was not started before its queue deadline'
 WHERE ((state = 'queued' AND owner IS NULL) OR state = 'scheduled') AND deadline < {now}
RETURNING id, epoch

-- name: sweep_due --
-- Scheduled jobs whose backoff has passed go back to the queue.
UPDATE jobs SET state = 'queued', next_attempt_at = NULL, updated_at = {now}
 WHERE state = 'scheduled' AND next_attempt_at <= {now}
RETURNING id

-- name: sweep_workers_gone --
-- Workers silent for longer than the given seconds are marked gone.
UPDATE workers SET state = 'gone' WHERE state <> 'gone' AND last_heartbeat < {now} - ?
RETURNING id

-- name: lease_purge --
-- Drop expired holders of a key.
DELETE FROM leases WHERE key = ? AND expires_at <= {now}

-- name: lease_refresh --
-- Extend one holder's slot if it holds one (acquire is idempotent for the same holder).
UPDATE leases SET expires_at = {now} + ?3 WHERE key = ?1 AND holder = ?2

-- name: lease_count --
-- Current holders of a key (after the purge).
SELECT count(*) AS n FROM leases WHERE key = ?

-- name: lease_insert --
-- Take a slot.
INSERT INTO leases (key, holder, expires_at) VALUES (?1, ?2, {now} + ?3)

-- name: lease_renew --
-- Extend one held, unexpired lease.
UPDATE leases SET expires_at = {now} + ?3 WHERE key = ?1 AND holder = ?2 AND expires_at > {now}

-- name: lease_release --
-- Give back one slot; releasing a slot not held does nothing.
DELETE FROM leases WHERE key = ? AND holder = ?

-- name: lease_line_ahead --
-- Unexpired tickets of a waiting line older than the given one (tickets sort by their order prefix).
SELECT count(*) AS n FROM leases WHERE key = ?1 AND holder < ?2 AND expires_at > {now}

-- name: lease_upsert --
-- Take or refresh a lease whether or not it is held: a ticket joining its line or keeping its place.
INSERT INTO leases (key, holder, expires_at) VALUES (?1, ?2, {now} + ?3)
ON CONFLICT (key, holder) DO UPDATE SET expires_at = excluded.expires_at

-- name: lease_line_oldest --
-- The oldest unexpired tickets of a waiting line with their expiries, at most the given number.
SELECT holder, expires_at FROM leases WHERE key = ?1 AND expires_at > {now} ORDER BY holder LIMIT ?2

-- name: lease_hand_over --
-- Give a served ticket's holder a slot until the ticket's own expiry (at most now + TTL); never shortens a lease.
INSERT INTO leases (key, holder, expires_at) VALUES (?1, ?2, min({now} + ?3, ?4))
ON CONFLICT (key, holder) DO UPDATE SET expires_at = max(expires_at, excluded.expires_at)

-- name: lease_holders --
-- Unexpired holders of a key, soonest expiry first.
SELECT holder FROM leases WHERE key = ? AND expires_at > {now} ORDER BY expires_at, holder

-- name: server_time --
-- SQLite's clock.
SELECT {now} AS now

-- name: count_live_jobs --
-- Unfinished jobs as (state, tenant, count) through the partial indexes only, never a scan of history:
-- the ready queue (queued, unclaimed) per tenant, owned jobs by state (tenant ''), scheduled retries. The IN
-- term is jobs_waiting_tenant's condition, repeated so that SQLite may read it (a partial index is used only then).
SELECT 'ready' AS kind, tenant, count(*) AS n FROM jobs
 WHERE state IN ('queued', 'scheduled') AND state = 'queued' AND owner IS NULL GROUP BY tenant
UNION ALL
SELECT state, '', count(*) FROM jobs WHERE owner IS NOT NULL GROUP BY state
UNION ALL
SELECT 'scheduled', '', count(*) FROM jobs WHERE state = 'scheduled'

-- name: admission_state --
-- What admission's gate reads, in one statement: jobs waiting to start in all and of tenant ?1, each counted up to
-- ?4 (-1: no bound), and the failures of circuit ?2 within the last ?3 seconds with the latest one,
-- on the store's clock. Each count walks its partial index (pinned: the planner would take jobs_tenant_id and
-- filter the tenant's whole history) and stops at its bound, so a submit costs the same behind any backlog.
SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_waiting_state
                               WHERE state IN ('queued', 'scheduled') LIMIT ?4)) AS total,
       (SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_waiting_tenant
                               WHERE tenant = ?1 AND state IN ('queued', 'scheduled') LIMIT ?4)) AS mine,
       c.failures, c.latest, {now} AS now
  FROM (SELECT count(*) AS failures, max(ts) AS latest
          FROM circuit_failures WHERE key = ?2 AND ts > {now} - ?3) AS c

-- name: queue_depth --
-- Jobs waiting to start (queued or scheduled): all tenants, and one tenant.
SELECT count(*) AS total, coalesce(sum(tenant = ?1), 0) AS mine FROM jobs WHERE state IN ('queued', 'scheduled')

-- name: circuit_record --
-- Count one failure of a circuit key at the server's clock.
INSERT INTO circuit_failures (key, ts) VALUES (?, {now})

-- name: circuit_record_job_timeout --
-- Count one timeout of a job's agent (the finish of a timed-out execution).
INSERT INTO circuit_failures (key, ts) SELECT 'agent:' || agent, {now} FROM jobs WHERE id = ?

-- name: circuit_trim --
-- Forget failures older than the longest window we keep (_rules.CIRCUIT_KEEP_S).
DELETE FROM circuit_failures WHERE key = ?1 AND ts < {now} - ?2

-- name: circuit_window --
-- Failures of a key within the window, the latest one, and the server's clock.
SELECT count(*) AS failures, max(ts) AS latest, {now} AS now FROM circuit_failures
 WHERE key = ?1 AND ts > {now} - ?2

-- name: cancel_unstarted --
-- Cancel a job that has not started (queued, claimed or not, or waiting out a retry backoff) at once. A claim
-- it had is void: its owner's start CAS expects 'queued' and matches nothing, its heartbeat no longer renews it.
UPDATE jobs
   SET state = 'cancelled', cancel_requested_at = coalesce(cancel_requested_at, {now}), finished_at = {now},
       updated_at = {now}, error_code = 'cancelled', error_message = 'cancelled before it started',
       next_attempt_at = NULL, owner = NULL, claim_expires_at = NULL
 WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)
   AND ((state = 'queued' AND execution_id IS NULL) OR state = 'scheduled')
RETURNING epoch, tenant, concurrency_key

-- name: cancel_request --
-- Flag a started, unfinished job for cancellation; its owner acts on the flag.
UPDATE jobs SET cancel_requested_at = coalesce(cancel_requested_at, {now}), updated_at = {now}
 WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2) AND state IN ('running', 'waiting')
RETURNING id

-- name: job_state --
-- A job's state, optionally restricted to a tenant.
SELECT state FROM jobs WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)

-- name: insert_command --
-- Persist one control command after the job's last one.
INSERT INTO job_commands (job_id, seq, kind, payload, created_at)
VALUES (?1, coalesce((SELECT max(seq) FROM job_commands WHERE job_id = ?1), 0) + 1, ?2, ?3, {now})

-- name: read_commands --
-- A job's commands after a sequence number, oldest first.
SELECT seq, kind, payload, created_at FROM job_commands WHERE job_id = ?1 AND seq > ?2 ORDER BY seq

-- name: set_waiting --
-- Fenced running <-> waiting: epoch, token and execution must match, and the job must be in the expected state.
UPDATE jobs SET state = ?5, updated_at = {now}
 WHERE id = ?1 AND epoch = ?2 AND token = ?3 AND execution_id = ?4 AND state = ?6

-- name: read_events_many --
-- One job's history after a cursor (run once per job of a batch, all in one hop to the connection thread).
SELECT execution_id, epoch, seq, type, payload, ts FROM events
 WHERE job_id = ?1 AND (epoch > ?2 OR (epoch = ?2 AND seq > ?3))
 ORDER BY epoch, seq LIMIT ?4

-- name: control_cancel --
-- For a batch of jobs (a JSON array of ids): whether each has a cancel request, and its last command seq.
SELECT j.id, j.cancel_requested_at IS NOT NULL AS cancel,
       (SELECT coalesce(max(c.seq), 0) FROM job_commands AS c WHERE c.job_id = j.id) AS last_seq
  FROM jobs AS j WHERE j.id IN (SELECT value FROM json_each(?1))

-- Concurrency keys (backends/sqlite/keys.py; the decisions are _rules.key_plan and _rules.key_promotions). Every
-- write holds the database's write lock, which serialises the decisions about every key.

-- name: key_live --
-- The live jobs of a key, oldest first (jobs_keyed).
SELECT id, state, key_wait, key_limit, state IN ('running', 'waiting') AS started
  FROM jobs
 WHERE tenant = ?1 AND concurrency_key = ?2 AND state IN ('queued', 'scheduled', 'running', 'waiting')
 ORDER BY id

-- name: key_promote --
-- Give one waiting job its key's turn (it becomes claimable).
UPDATE jobs SET key_wait = 0, updated_at = {now} WHERE id = ?1 AND key_wait = 1 AND state = 'queued'

-- name: key_drop --
-- Cancel a not-yet-started job of a key that a drop_queued job replaces (?2: the reason); a claim it had is void.
UPDATE jobs
   SET state = 'cancelled', cancel_requested_at = coalesce(cancel_requested_at, {now}), finished_at = {now},
       updated_at = {now}, error_code = 'replaced', error_message = ?2, next_attempt_at = NULL, owner = NULL,
       claim_expires_at = NULL
 WHERE id = ?1 AND ((state = 'queued' AND execution_id IS NULL) OR state = 'scheduled')
RETURNING epoch

-- name: key_stalled --
-- Keys with a waiting job and a free turn (a holder ended and its turn was not passed on: swept, expired).
SELECT DISTINCT w.tenant, w.concurrency_key
  FROM jobs AS w
 WHERE w.key_wait = 1 AND w.state = 'queued'
   AND (SELECT count(*) FROM jobs AS h
         WHERE h.tenant = w.tenant AND h.concurrency_key = w.concurrency_key AND h.key_wait = 0
           AND h.state IN ('queued', 'scheduled', 'running', 'waiting')) < w.key_limit
 LIMIT 100

-- name: queued_of_agent --
-- Jobs of agent ?1 waiting to start (queued or scheduled; jobs_waiting_agent), of effective mode ?2 when given.
SELECT count(*) AS n FROM jobs
 WHERE agent = ?1 AND state IN ('queued', 'scheduled') AND (?2 IS NULL OR mode_effective = ?2)

-- name: queued_of_agent_upto --
-- queued_of_agent, counted up to ?3 (whether the agent's queue is at its cap, without counting past it).
SELECT count(*) AS n FROM (
    SELECT 1 FROM jobs WHERE agent = ?1 AND state IN ('queued', 'scheduled') AND (?2 IS NULL OR mode_effective = ?2)
     LIMIT ?3)

-- name: waiting_job --
-- A queued, unowned job's place: its priority and turn, its key and whether it waits for the key's turn, its agent
-- and mode.
SELECT id, priority, fair_at, tenant, concurrency_key, key_wait, agent, mode_effective FROM jobs
 WHERE id = ?1 AND state = 'queued' AND owner IS NULL

-- name: jobs_ahead --
-- Claimable jobs before (?1 id, ?2 priority, ?4 turn) in claim order (the head of jobs_ready), counted up to ?3
-- (n), and of those the jobs of tenants other than ?5 at priority ?2 (others: ahead by their tenants' turns).
SELECT count(*) AS n, count(CASE WHEN tenant <> ?5 AND priority = ?2 THEN 1 END) AS others FROM (
    SELECT tenant, priority FROM jobs
     WHERE state = 'queued' AND owner IS NULL AND key_wait = 0
       AND (priority > ?2 OR (priority = ?2 AND (fair_at < ?4 OR (fair_at = ?4 AND id < ?1))))
     LIMIT ?3)

-- name: job_children --
-- The children of a coordinator job (jobs_parent), oldest first: what gather, cancel's cascade and GET read.
SELECT id, agent, state FROM jobs WHERE parent_job_id = ?1 ORDER BY id

-- name: parent_owns --
-- Does a spawning parent's fence still own its running or waiting job? (Read in the enqueue's write transaction.)
SELECT 1 FROM jobs WHERE id = ?1 AND epoch = ?2 AND token = ?3 AND state IN ('running', 'waiting')
