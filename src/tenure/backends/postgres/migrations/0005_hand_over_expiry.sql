-- Tenure schema v5: a slot handed over from a waiting line lasts until the served ticket would have expired (at
-- most now + TTL), not a fresh TTL, so a waiter that died in line gives its slot back one TTL after its death.

-- Release a slot and hand every free slot to the oldest tickets of the key's line in the same transaction (under
-- the key's advisory lock, so an acquirer that found the key full and queued is seen). Returns the tickets served.
-- A served holder's slot lasts until its ticket would have expired (at most now + TTL), not a fresh TTL: the
-- ticket's last renewal is the last sign of life of its waiter, which may have died since.
CREATE OR REPLACE FUNCTION tenure_lease_release_and_hand_over(p_key text, p_holder text, p_limit integer, p_ttl double precision)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_line   text := p_key || '#wait';
    v_free   integer;
    v_ticket record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tenure_lease:' || p_key, 0));
    DELETE FROM leases AS l WHERE l.key = p_key AND l.holder = p_holder;
    DELETE FROM leases WHERE key IN (p_key, v_line) AND expires_at <= now();
    SELECT p_limit - count(*) INTO v_free FROM leases WHERE key = p_key;
    IF v_free <= 0 THEN
        RETURN;
    END IF;
    FOR v_ticket IN
        SELECT l.holder, l.expires_at FROM leases AS l WHERE l.key = v_line ORDER BY l.holder COLLATE "C" LIMIT v_free
    LOOP
        INSERT INTO leases AS l (key, holder, expires_at)
            VALUES (p_key, substr(v_ticket.holder, strpos(v_ticket.holder, '/') + 1),
                    least(now() + make_interval(secs => p_ttl), v_ticket.expires_at))
            ON CONFLICT (key, holder) DO UPDATE SET expires_at = greatest(l.expires_at, EXCLUDED.expires_at);
        DELETE FROM leases AS l WHERE l.key = v_line AND l.holder = v_ticket.holder;
        RETURN NEXT v_ticket.holder;
    END LOOP;
END
$$;
