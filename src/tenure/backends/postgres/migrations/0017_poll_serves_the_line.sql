-- A poll of the waiting line serves the line. A slot that comes free by expiry (a dead holder's) has no release to
-- hand it over: until now it waited for one of the oldest waiters to poll, and a younger waiter's poll that found
-- it free only queued again behind them — up to one poll interval of every oldest waiter, longer when their
-- processes were starved (a loaded CI run saw three slots stay free 2.5 s after a dead worker's leases were gone;
-- quiet runs, 0.5-0.9 s with seven live tickets in line). Now any poll that finds free slots it may not take hands
-- them to the oldest tickets in the same step, the way a release does (one function, tenure_lease_serve_line, for
-- both), and answers the tickets it served, so that its process tells their waiters (tests/contract/test_leases.py,
-- tests/integration/test_quota_recovery.py).
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

CREATE OR REPLACE FUNCTION tenure_lease_release_and_hand_over(p_key text, p_holder text, p_limit integer, p_ttl double precision)
RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tenure_lease:' || p_key, 0));
    DELETE FROM leases AS l WHERE l.key = p_key AND l.holder = p_holder;
    DELETE FROM leases WHERE key IN (p_key, p_key || '#wait') AND expires_at <= now();
    RETURN QUERY SELECT tenure_lease_serve_line(p_key, p_limit - (SELECT count(*)::integer FROM leases WHERE key = p_key), p_ttl);
END
$$;

DROP FUNCTION tenure_lease_acquire_in_line(text, text, integer, double precision);
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
