-- Tenure schema v7: the worker profile of the broker (docs/routing.md). A worker records its features and the
-- admission defaults of its agents at registration (admission knows agents from the live registry), its own
-- record with every heartbeat (success rate, an EWMA of durations, hard timeouts in a row), and an operator's
-- drain request (`tenure drain`), which its next heartbeat reads.
ALTER TABLE workers
    ADD COLUMN features             text[] NOT NULL DEFAULT '{}',
    ADD COLUMN agent_specs          text NOT NULL DEFAULT '{}',
    ADD COLUMN success_rate         float8,
    ADD COLUMN latency_ms           float8,
    ADD COLUMN consecutive_timeouts integer NOT NULL DEFAULT 0,
    ADD COLUMN drain_requested_at   timestamptz,
    ADD COLUMN drain_timeout_s      float8;
