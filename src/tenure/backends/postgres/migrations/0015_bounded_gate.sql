-- The gate's counts stop one past the larger cap. tenure_admission_state counted every job waiting to start, so a
-- submit behind a backlog paid for the whole backlog (bench/backlog.py --gate: 42 ms per read behind 100,000
-- queued, 348 ms behind 1,000,000): now it counts up to the bound it is given, which is all the rule needs to
-- decide (0.5-0.8 ms at the default cap). tenure_enqueue passes the larger threshold + the batch's size + 1.

DROP FUNCTION tenure_admission_state(text, text, float8);

CREATE FUNCTION tenure_admission_state(p_tenant text, p_circuit_key text, p_window_s float8, p_upto int8)
RETURNS TABLE (total bigint, mine bigint, failures bigint, latest float8, now float8)
LANGUAGE plpgsql
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

CREATE OR REPLACE FUNCTION tenure_enqueue(
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
