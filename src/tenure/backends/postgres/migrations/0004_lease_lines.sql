-- Tenure schema v4: FIFO waiting lines of lease keys, served in the same transaction as a release.

-- FIFO lease acquire through the key's waiting line (`<key>#wait`, whose holders are tickets '<order>/<holder>'),
-- under the same advisory lock as tenure_lease_acquire. True when the ticket's holder holds a slot (its ticket
-- then leaves the line); false when the ticket waits in line (inserted, or its expiry renewed).
CREATE FUNCTION tenure_lease_acquire_in_line(p_key text, p_ticket text, p_limit integer, p_ttl double precision)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_line   text := p_key || '#wait';
    v_holder text := substr(p_ticket, strpos(p_ticket, '/') + 1);
    v_free   integer;
    v_ahead  integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tenure_lease:' || p_key, 0));
    DELETE FROM leases WHERE key IN (p_key, v_line) AND expires_at <= now();
    UPDATE leases AS l SET expires_at = now() + make_interval(secs => p_ttl)
     WHERE l.key = p_key AND l.holder = v_holder;
    IF NOT FOUND THEN
        SELECT p_limit - count(*) INTO v_free FROM leases WHERE key = p_key;
        -- FIFO: a slot is free for this ticket only if fewer older tickets wait than there are free slots.
        SELECT count(*) INTO v_ahead FROM leases AS l WHERE l.key = v_line AND l.holder COLLATE "C" < p_ticket COLLATE "C";
        IF v_free <= 0 OR v_ahead >= v_free THEN
            INSERT INTO leases (key, holder, expires_at) VALUES (v_line, p_ticket, now() + make_interval(secs => p_ttl))
                ON CONFLICT (key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at;
            RETURN false;
        END IF;
        INSERT INTO leases (key, holder, expires_at) VALUES (p_key, v_holder, now() + make_interval(secs => p_ttl));
    END IF;
    DELETE FROM leases AS l WHERE l.key = v_line AND l.holder = p_ticket;
    RETURN true;
END
$$;

-- Release a slot and hand every free slot to the oldest tickets of the key's line in the same transaction (under
-- the key's advisory lock, so an acquirer that found the key full and queued is seen). Returns the tickets served.
CREATE FUNCTION tenure_lease_release_and_hand_over(p_key text, p_holder text, p_limit integer, p_ttl double precision)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_line   text := p_key || '#wait';
    v_free   integer;
    v_ticket text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tenure_lease:' || p_key, 0));
    DELETE FROM leases AS l WHERE l.key = p_key AND l.holder = p_holder;
    DELETE FROM leases WHERE key IN (p_key, v_line) AND expires_at <= now();
    SELECT p_limit - count(*) INTO v_free FROM leases WHERE key = p_key;
    IF v_free <= 0 THEN
        RETURN;
    END IF;
    FOR v_ticket IN
        SELECT l.holder FROM leases AS l WHERE l.key = v_line ORDER BY l.holder COLLATE "C" LIMIT v_free
    LOOP
        INSERT INTO leases (key, holder, expires_at)
            VALUES (p_key, substr(v_ticket, strpos(v_ticket, '/') + 1), now() + make_interval(secs => p_ttl))
            ON CONFLICT (key, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at;
        DELETE FROM leases AS l WHERE l.key = v_line AND l.holder = v_ticket;
        RETURN NEXT v_ticket;
    END LOOP;
END
$$;
