-- Tenure schema v1: jobs, executions, events, workers, leases.
-- Times are the server's clock (now()). JSON values are stored as `json` (validated text: the runtime
-- never queries inside them, and text avoids a parse-and-rebuild on every write).

CREATE TABLE jobs (
    id                   uuid PRIMARY KEY,
    tenant               text NOT NULL,
    agent                text NOT NULL,
    input                json NOT NULL,
    priority             smallint NOT NULL DEFAULT 0,
    requires             text[] NOT NULL DEFAULT '{}',
    idem_digest          bytea,
    request_fingerprint  bytea NOT NULL,
    deadline             timestamptz,
    state                text NOT NULL DEFAULT 'queued',
    owner                text,
    claimed_at           timestamptz,
    claim_expires_at     timestamptz,
    epoch                integer NOT NULL DEFAULT 0,
    token                bigint,
    execution_id         uuid,
    execution_started_at timestamptz,
    attempts             integer NOT NULL DEFAULT 0,
    max_attempts         integer NOT NULL,
    next_attempt_at      timestamptz,
    cancel_requested_at  timestamptz,
    timeout_s            double precision,
    retry_safe           boolean NOT NULL DEFAULT false,
    result               json,
    error_code           text,
    error_message        text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    finished_at          timestamptz,
    -- Scheduling (docs/scheduling.md): a keyed job holds one of its key's turns or waits for one (key_wait).
    concurrency_key      text,
    key_limit            integer NOT NULL DEFAULT 1,
    key_wait             boolean NOT NULL DEFAULT false,
    mode_requested       text,
    mode_effective       text,
    degraded_reason      text,
    fair_at              double precision NOT NULL DEFAULT 0,
    -- Coordinators (docs/coordinators.md): the parent job and execution that spawned this job (ctx.spawn).
    parent_job_id        uuid,
    parent_execution_id  uuid,
    -- Weighted routing (docs/routing.md): only the preferred worker may claim the job until preferred_until.
    preferred_worker     text,
    preferred_until      timestamptz,
    route                text
);
-- The idempotency answer lives on the job itself: one row per (tenant, key digest).
CREATE UNIQUE INDEX jobs_idem ON jobs (tenant, idem_digest) WHERE idem_digest IS NOT NULL;
-- Claimable jobs, in claim order (a job waiting for its key's turn is not one). Also scanned by the sweeper for
-- queue deadlines. Which index serves which filter of the claim: docs/durable-jobs.md.
CREATE INDEX jobs_ready ON jobs (priority DESC, fair_at, id) WHERE state = 'queued' AND owner IS NULL AND NOT key_wait;
-- The same, per agent: a worker of a few agents reads the head of this one for each of them (migration 0018).
CREATE INDEX jobs_ready_agent ON jobs (agent, priority DESC, fair_at, id)
    WHERE state = 'queued' AND owner IS NULL AND NOT key_wait;
-- A tenant's last turn per priority: where its next job's turn starts (fair shares, docs/scheduling.md).
CREATE INDEX jobs_tenant_turn ON jobs (tenant, priority, fair_at)
    WHERE state = 'queued' AND owner IS NULL AND NOT key_wait;
-- Owned jobs by owner and claim expiry: the jobs each worker holds (the registry), and what the sweeper checks
-- for dead owners.
CREATE INDEX jobs_owned ON jobs (owner, claim_expires_at) WHERE owner IS NOT NULL;
-- Jobs waiting out a retry backoff.
CREATE INDEX jobs_scheduled ON jobs (next_attempt_at) WHERE state = 'scheduled';

-- One row per real attempt, written when the attempt ends (by its owner, or by the sweeper when lost):
-- a running attempt is described by its job row, so a job costs one execution write, not two.
CREATE TABLE executions (
    id                  uuid PRIMARY KEY,
    job_id              uuid NOT NULL,
    epoch               integer NOT NULL,
    worker_id           text NOT NULL,
    started_at          timestamptz NOT NULL,
    ended_at            timestamptz NOT NULL DEFAULT now(),
    outcome             text NOT NULL,
    usage               json,
    parent_execution_id uuid
);
CREATE INDEX executions_job ON executions (job_id, epoch);

-- The durable history. (job_id, epoch) names one execution, so the key is unique per (execution, seq)
-- and is also the per-job cursor.
CREATE TABLE events (
    job_id       uuid NOT NULL,
    epoch        integer NOT NULL,
    seq          integer NOT NULL,
    execution_id uuid,
    type         text NOT NULL,
    payload      json,
    ts           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, epoch, seq)
);

CREATE TABLE workers (
    id             text PRIMARY KEY,
    host           text NOT NULL,
    pid            integer NOT NULL,
    concurrency    integer NOT NULL,
    agents         text[] NOT NULL DEFAULT '{}',
    capabilities   text[] NOT NULL DEFAULT '{}',
    state          text NOT NULL DEFAULT 'active',
    in_flight      integer NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now(),
    -- The profile (0008_broker, docs/routing.md).
    features             text[] NOT NULL DEFAULT '{}',
    agent_specs          text NOT NULL DEFAULT '{}',
    success_rate         float8,
    latency_ms           float8,
    consecutive_timeouts integer NOT NULL DEFAULT 0,
    drain_requested_at   timestamptz,
    drain_timeout_s      float8
);

-- Named, per-holder, heartbeated slots (quotas; the sweeper duty is the key 'duty:sweeper' with limit 1).
CREATE TABLE leases (
    key        text NOT NULL,
    holder     text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, holder)
);

-- Lease acquire in one round trip: the advisory lock serialises acquirers of one key, and each statement of a
-- volatile function takes a fresh snapshot, so the count below sees every acquire committed before us.
CREATE FUNCTION tenure_lease_acquire(p_key text, p_holder text, p_limit integer, p_ttl double precision)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    held integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tenure_lease:' || p_key, 0));
    DELETE FROM leases WHERE key = p_key AND expires_at <= now();
    UPDATE leases SET expires_at = now() + make_interval(secs => p_ttl)
     WHERE key = p_key AND holder = p_holder;
    IF FOUND THEN
        RETURN true;  -- idempotent for the same holder
    END IF;
    SELECT count(*) INTO held FROM leases WHERE key = p_key;
    IF held >= p_limit THEN
        RETURN false;
    END IF;
    INSERT INTO leases (key, holder, expires_at) VALUES (p_key, p_holder, now() + make_interval(secs => p_ttl));
    RETURN true;
END
$$;

-- Hand free slots of a key to the oldest tickets of its line (`<key>#wait`, whose holders are tickets
-- '<order>/<holder>'); the caller holds the key's advisory lock. Returns the tickets served, oldest first.
CREATE FUNCTION tenure_lease_serve_line(p_key text, p_free integer, p_ttl double precision)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_ticket record;
BEGIN
    -- The caller holds the key's advisory lock and purged the expired. A served holder's slot lasts until its
    -- ticket would have expired (at most now + TTL), not a fresh TTL: the ticket's last renewal is the last sign
    -- of life of its waiter, which may have died since.
    FOR v_ticket IN
        SELECT l.holder, l.expires_at FROM leases AS l WHERE l.key = p_key || '#wait'
         ORDER BY l.holder COLLATE "C" LIMIT greatest(p_free, 0)
    LOOP
        INSERT INTO leases AS l (key, holder, expires_at)
            VALUES (p_key, substr(v_ticket.holder, strpos(v_ticket.holder, '/') + 1),
                    least(now() + make_interval(secs => p_ttl), v_ticket.expires_at))
            ON CONFLICT (key, holder) DO UPDATE SET expires_at = greatest(l.expires_at, EXCLUDED.expires_at);
        DELETE FROM leases AS l WHERE l.key = p_key || '#wait' AND l.holder = v_ticket.holder;
        RETURN NEXT v_ticket.holder;
    END LOOP;
END
$$;

-- FIFO lease acquire through the key's waiting line, under the same advisory lock as tenure_lease_acquire. `held`
-- when the ticket's holder holds a slot (its ticket then leaves the line); otherwise the ticket waits in line
-- (inserted, or its expiry renewed), and free slots it may not take are handed to the older tickets now: `served`.
CREATE FUNCTION tenure_lease_acquire_in_line(p_key text, p_ticket text, p_limit integer, p_ttl double precision,
                                             OUT held boolean, OUT served text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_line   text := p_key || '#wait';
    v_holder text := substr(p_ticket, strpos(p_ticket, '/') + 1);
    v_free   integer;
    v_ahead  integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tenure_lease:' || p_key, 0));
    DELETE FROM leases WHERE key IN (p_key, v_line) AND expires_at <= now();
    served := '{}';
    UPDATE leases AS l SET expires_at = now() + make_interval(secs => p_ttl)
     WHERE l.key = p_key AND l.holder = v_holder;
    IF NOT FOUND THEN
        SELECT p_limit - count(*) INTO v_free FROM leases WHERE key = p_key;
        -- FIFO: a slot is free for this ticket only if fewer older tickets wait than there are free slots.
        SELECT count(*) INTO v_ahead FROM leases AS l WHERE l.key = v_line AND l.holder COLLATE "C" < p_ticket COLLATE "C";
        IF v_free <= 0 OR v_ahead >= v_free THEN
            IF v_free > 0 THEN
                -- The free slots belong to older tickets: hand them over now (all of the oldest v_free are older).
                served := ARRAY(SELECT tenure_lease_serve_line(p_key, v_free, p_ttl));
            END IF;
            INSERT INTO leases (key, holder, expires_at) VALUES (v_line, p_ticket, now() + make_interval(secs => p_ttl))
                ON CONFLICT (key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at;
            held := false;
            RETURN;
        END IF;
        INSERT INTO leases (key, holder, expires_at) VALUES (p_key, v_holder, now() + make_interval(secs => p_ttl));
    END IF;
    DELETE FROM leases AS l WHERE l.key = v_line AND l.holder = p_ticket;
    held := true;
END
$$;

-- Release a slot and hand every free slot to the oldest tickets of the key's line in the same transaction (under
-- the key's advisory lock, so an acquirer that found the key full and queued is seen). Returns the tickets served.
CREATE FUNCTION tenure_lease_release_and_hand_over(p_key text, p_holder text, p_limit integer, p_ttl double precision)
RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tenure_lease:' || p_key, 0));
    DELETE FROM leases AS l WHERE l.key = p_key AND l.holder = p_holder;
    DELETE FROM leases WHERE key IN (p_key, p_key || '#wait') AND expires_at <= now();
    RETURN QUERY SELECT tenure_lease_serve_line(p_key, p_limit - (SELECT count(*)::integer FROM leases WHERE key = p_key), p_ttl);
END
$$;

-- Control commands (input, approve) for a job's owner, persisted before they are delivered.
CREATE TABLE job_commands (
    job_id     uuid NOT NULL,
    seq        integer NOT NULL,
    kind       text NOT NULL,
    payload    json,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- Circuit breaker windows: one row per counted failure (a timeout) of a key such as 'agent:NAME'. Counted by
-- every gateway in the shared store, so two gateways open the circuit after the same failures.
CREATE TABLE circuit_failures (
    key text NOT NULL,
    ts  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX circuit_failures_key_ts ON circuit_failures (key, ts);

-- Admission caps count queued and scheduled jobs per tenant.
CREATE INDEX jobs_waiting_tenant ON jobs (tenant) WHERE state IN ('queued', 'scheduled');

-- Live events: one NOTIFY per batch on `tenure_events`. The body is the batch's events as JSON when it fits
-- under NOTIFY's 8,000-byte limit, else a reference {"jobs": [...]} (readers go to the history), else
-- {"jobs": null} (every subscriber checks its history). Nothing is sent by a session with
-- `tenure.notify_events = off` (hints over Redis pub/sub, backends/signals.py), nor while no process listens
-- for events: a store that LISTENs on `tenure_events` keeps a row in `event_listeners` (a 30 s lease renewed
-- every 10 s), and a NOTIFY wakes every listening backend of the database.
CREATE TABLE event_listeners (
    id         text PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

CREATE FUNCTION tenure_notify_events(p_events text, p_jobs text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    body text;
BEGIN
    IF current_setting('tenure.notify_events', true) = 'off'
       OR NOT EXISTS (SELECT 1 FROM event_listeners WHERE expires_at > now()) THEN
        RETURN;
    END IF;
    IF p_events IS NOT NULL AND octet_length(p_events) < 7900 THEN
        body := '{"events":' || p_events || '}';
    ELSE
        body := json_build_object('jobs', p_jobs)::text;
        IF octet_length(body) >= 7900 THEN
            body := '{"jobs":null}';
        END IF;
    END IF;
    PERFORM pg_notify('tenure_events', body);
END
$$;

-- The events one statement appended (`json_agg` of the inserted `events` rows), as one NOTIFY on
-- `tenure_events` in the body format of `tenure_notify_events`. The rows are reshaped only when a NOTIFY is
-- sent: the four writers that append events (start, claim_and_start, finish, append) share this one call.
CREATE FUNCTION tenure_notify_appended(p_rows json) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('tenure.notify_events', true) = 'off'
       OR NOT EXISTS (SELECT 1 FROM event_listeners WHERE expires_at > now()) THEN
        RETURN;
    END IF;
    PERFORM tenure_notify_events(
        (SELECT json_agg(json_build_object(
                    'j', r->>'job_id', 'x', r->>'execution_id', 'e', (r->>'epoch')::int4, 's', (r->>'seq')::int4,
                    't', r->>'type', 'p', r->'payload', 'ts', extract(epoch FROM (r->>'ts')::timestamptz)::float8)
                ORDER BY r->>'job_id' COLLATE "C", (r->>'epoch')::int4, (r->>'seq')::int4)::text
           FROM json_array_elements(p_rows) AS r),
        (SELECT array_agg(DISTINCT r->>'job_id') FROM json_array_elements(p_rows) AS r));
END
$$;

-- The dashboard's read side (contracts/insights.py, insights.sql): keyset pages of the jobs list per filter
-- (the primary key serves the unfiltered list), and what finished in the last hour as an index-only scan.
CREATE INDEX jobs_tenant_id ON jobs (tenant, id);
-- The state filters are on lower(state), an expression no statement of the job path uses, so that no claim,
-- start, finish or sweeper statement can choose them (migration 0010 / 0007 says what happened when they could).
CREATE INDEX jobs_state_id ON jobs (lower(state), id);
CREATE INDEX jobs_tenant_state_id ON jobs (tenant, lower(state), id);
CREATE INDEX jobs_finished ON jobs (finished_at) INCLUDE (state, tenant) WHERE finished_at IS NOT NULL;
-- Retention of a tenant with its own (TENURE_TENANT_RETENTION_DAYS): its finished jobs, oldest first.
CREATE INDEX jobs_tenant_finished ON jobs (tenant, finished_at) INCLUDE (state) WHERE finished_at IS NOT NULL;

-- Scheduling (docs/scheduling.md): the live jobs of a concurrency key (what the key's lock holder reads), the
-- jobs waiting for their key's turn (the sweeper's check for a turn never passed on), the per-agent admission cap.
CREATE INDEX jobs_keyed ON jobs (tenant, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'scheduled', 'running', 'waiting');
CREATE INDEX jobs_key_waiting ON jobs (tenant, concurrency_key, id) WHERE key_wait AND state = 'queued';
CREATE INDEX jobs_waiting_agent ON jobs (agent) WHERE state IN ('queued', 'scheduled');
-- A parent's children (docs/coordinators.md): gather, cancel's cascade, GET /v1/jobs/{id}.
CREATE INDEX jobs_parent ON jobs (parent_job_id, id) WHERE parent_job_id IS NOT NULL;

-- The audit chain and the effect journal (docs/audit.md, docs/journal.md).
-- One audit per job across its attempts: an execution's records sit under its epoch, in its own seq order.
-- kind: tool_call (name: the tool), evidence (name: its kind), usage (name: the model or ''), and requeue
-- (name: 'input'): an operator's edit of the input, written by the store itself (no execution).
CREATE TABLE audit_records (
    job_id       uuid NOT NULL,
    epoch        integer NOT NULL,
    seq          integer NOT NULL,
    execution_id uuid,
    kind         text NOT NULL,
    name         text NOT NULL,
    data         json NOT NULL,
    started_at   double precision,
    ended_at     double precision,
    ts           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, epoch, seq)
);

-- The effect journal: one row per (job, step key), begun before the step's function runs and ended (with its
-- JSON result) before `ctx.step` returns. state: started | done | resolved.
CREATE TABLE journal_steps (
    job_id       uuid NOT NULL,
    key          text NOT NULL,
    state        text NOT NULL,
    epoch        integer NOT NULL,
    execution_id uuid NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    ended_at     timestamptz,
    result       json,
    PRIMARY KEY (job_id, key)
);

-- A job's budget (docs/budgets.md): written with the job by `enqueue`, read by its executions at their first
-- tool call or step. Only jobs submitted with a budget have a row.
CREATE TABLE job_budgets (
    job_id uuid PRIMARY KEY,
    budget json NOT NULL
);

-- Usage reports by time, for GET /v1/usage.
CREATE INDEX audit_records_usage ON audit_records (ts) WHERE kind = 'usage';

-- The enqueue, planned once per session, and the gate's read it makes (migrations 0014 and 0016 say why;
-- queries.sql enqueue_jobs and admission_state call them).
CREATE FUNCTION tenure_admission_state(p_tenant text, p_circuit_key text, p_window_s float8, p_upto int8)
RETURNS TABLE (total bigint, mine bigint, failures bigint, latest float8, now float8)
LANGUAGE plpgsql
SET enable_seqscan = off  -- planned once per session: never a scan of every job (migration 0016)
AS $$
BEGIN
    -- Jobs waiting to start in all and of tenant p_tenant, each counted up to p_upto (NULL: no bound) on its
    -- partial index; and the failures of the circuit within the last p_window_s seconds with
    -- the latest one, on the server's clock.
    RETURN QUERY
    SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs AS j WHERE j.state IN ('queued', 'scheduled')
                                   LIMIT p_upto) AS a),
           (SELECT count(*) FROM (SELECT 1 FROM jobs AS j WHERE j.tenant = p_tenant
                                     AND j.state IN ('queued', 'scheduled') LIMIT p_upto) AS b),
           c.failures, c.latest, extract(epoch FROM now())::float8
      FROM (SELECT count(*) AS failures, extract(epoch FROM max(f.ts))::float8 AS latest
              FROM circuit_failures AS f
             WHERE f.key = p_circuit_key AND f.ts > now() - make_interval(secs => p_window_s)) AS c;
END
$$;

CREATE FUNCTION tenure_enqueue(
    p_id uuid[], p_tenant text[], p_agent text[], p_input text[], p_priority int2[], p_requires text[],
    p_idem_digest bytea[], p_fingerprint bytea[], p_deadline_s float8[], p_max_attempts int4[],
    p_timeout_s float8[], p_retry_safe bool[], p_ckey text[], p_key_limit int4[], p_key_wait bool[],
    p_mode_requested text[], p_mode_effective text[], p_degraded_reason text[], p_fair_step float8[],
    p_parent_job_id uuid[], p_parent_execution_id uuid[], p_preferred_worker text[], p_grace_s float8[],
    p_route text[], p_gate_tenant text, p_circuit_key text, p_window_s float8, p_threshold int4, p_open_s float8,
    p_total_max int8, p_tenant_max int8)
RETURNS TABLE (
    id text, tenant text, agent text, input text, priority int2, requires text[], state text, owner text,
    epoch int4, execution_id text, attempts int4, max_attempts int4, timeout_s float8, retry_safe bool,
    result text, error_code text, error_message text, created_at float8, updated_at float8, claimed_at float8,
    claim_expires_at float8, execution_started_at float8, next_attempt_at float8, deadline float8,
    cancel_requested_at float8, finished_at float8, concurrency_key text, key_wait bool, mode_requested text,
    mode_effective text, degraded_reason text, parent_job_id text, parent_execution_id text, woke bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    g record;
BEGIN
    IF p_circuit_key IS NOT NULL THEN
        -- Counted one past the larger cap (the thresholds leave room for the batch, whose size is the demand;
        -- GateAsk.count_upto): exact up to a cap, and never a walk over the backlog behind it.
        SELECT * INTO g FROM tenure_admission_state(
            p_gate_tenant, p_circuit_key, p_window_s, greatest(p_total_max, p_tenant_max) + cardinality(p_id) + 1);
        IF g.total > p_total_max OR g.mine > p_tenant_max
           OR (g.failures >= p_threshold AND g.latest + p_open_s > g.now) THEN
            RAISE EXCEPTION 'refused by the admission gate' USING ERRCODE = 'TNGAT',
                DETAIL = json_build_object('total', g.total, 'mine', g.mine, 'failures', g.failures,
                                           'latest', g.latest, 'now', g.now)::text;
        END IF;
    END IF;
    RETURN QUERY
    WITH x AS (
        SELECT u.*, row_number() OVER (PARTITION BY u.tenant, u.priority ORDER BY u.ord) - 1 AS nth
          FROM unnest(p_id, p_tenant, p_agent, p_input, p_priority, p_requires, p_idem_digest, p_fingerprint,
                      p_deadline_s, p_max_attempts, p_timeout_s, p_retry_safe, p_ckey, p_key_limit, p_key_wait,
                      p_mode_requested, p_mode_effective, p_degraded_reason, p_fair_step, p_parent_job_id,
                      p_parent_execution_id, p_preferred_worker, p_grace_s, p_route)
               WITH ORDINALITY
               AS u(id, tenant, agent, input, priority, requires, idem_digest, fingerprint, deadline_s,
                    max_attempts, timeout_s, retry_safe, ckey, key_limit, key_wait, mode_requested, mode_effective,
                    degraded_reason, fair_step, parent_job_id, parent_execution_id, preferred_worker, grace_s,
                    route, ord)
    ), turn AS MATERIALIZED (
        -- Where each (tenant, priority) of the batch starts its turns (start-time fair queuing): one step after
        -- the tenant's last turn among the claimable jobs of that priority, but never before the head of the line
        -- (a tenant that had nothing queued starts at the head). Two index probes per group, not per row:
        -- MATERIALIZED, or the planner inlines them into the insert's join, once per row, each probe walking back
        -- over the index entries of the rows this statement inserted before it (invisible to it: O(batch²)).
        SELECT g.tenant, g.priority, g.fair_step,
               greatest((SELECT max(t.fair_at) FROM jobs AS t
                          WHERE t.tenant = g.tenant AND t.priority = g.priority AND t.state = 'queued'
                            AND t.owner IS NULL AND NOT t.key_wait) + g.fair_step,
                        coalesce((SELECT h.fair_at FROM jobs AS h
                                   WHERE h.priority = g.priority AND h.state = 'queued' AND h.owner IS NULL
                                     AND NOT h.key_wait
                                   ORDER BY h.priority DESC, h.fair_at, h.id LIMIT 1), 0)) AS start
          FROM (SELECT x.tenant, x.priority, min(x.fair_step) AS fair_step FROM x GROUP BY x.tenant, x.priority) AS g
    ), ins AS (
        -- fair_at: the batch's jobs of one tenant follow one another from its group's start (nth).
        INSERT INTO jobs AS j (id, tenant, agent, input, priority, requires, idem_digest, request_fingerprint,
                               deadline, max_attempts, timeout_s, retry_safe, concurrency_key, key_limit, key_wait,
                               mode_requested, mode_effective, degraded_reason, parent_job_id, parent_execution_id,
                               fair_at, preferred_worker, preferred_until, route)
        SELECT x.id, x.tenant, x.agent, x.input::json, x.priority, string_to_array(x.requires, ','),
               x.idem_digest, x.fingerprint, now() + make_interval(secs => x.deadline_s),
               x.max_attempts, x.timeout_s, x.retry_safe, x.ckey, x.key_limit, x.key_wait, x.mode_requested,
               x.mode_effective, x.degraded_reason, x.parent_job_id, x.parent_execution_id,
               turn.start + x.nth * turn.fair_step,
               x.preferred_worker, now() + make_interval(secs => x.grace_s), x.route
          FROM x JOIN turn ON turn.tenant = x.tenant AND turn.priority = x.priority
        ON CONFLICT (tenant, idem_digest) WHERE idem_digest IS NOT NULL DO NOTHING
        RETURNING j.id::text, j.tenant, j.agent, j.input::text, j.priority, j.requires, j.state, j.owner, j.epoch,
                  j.execution_id::text, j.attempts, j.max_attempts, j.timeout_s, j.retry_safe, j.result::text,
                  j.error_code, j.error_message,
                  extract(epoch FROM j.created_at)::float8 AS created_at,
                  extract(epoch FROM j.updated_at)::float8 AS updated_at,
                  extract(epoch FROM j.claimed_at)::float8 AS claimed_at,
                  extract(epoch FROM j.claim_expires_at)::float8 AS claim_expires_at,
                  extract(epoch FROM j.execution_started_at)::float8 AS execution_started_at,
                  extract(epoch FROM j.next_attempt_at)::float8 AS next_attempt_at,
                  extract(epoch FROM j.deadline)::float8 AS deadline,
                  extract(epoch FROM j.cancel_requested_at)::float8 AS cancel_requested_at,
                  extract(epoch FROM j.finished_at)::float8 AS finished_at,
                  j.concurrency_key, j.key_wait, j.mode_requested, j.mode_effective, j.degraded_reason,
                  j.parent_job_id::text, j.parent_execution_id::text
    ), wake AS (
        SELECT pg_notify('tenure_jobs', ''), set_config('synchronous_commit', 'off', true)
          FROM (SELECT 1 FROM ins LIMIT 1) AS one
    )
    SELECT ins.*, (SELECT count(*) FROM wake) FROM ins;
END
$$;
