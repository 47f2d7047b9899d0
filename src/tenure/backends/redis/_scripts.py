"""Every Redis key name and Lua script of the lease backend, in one place.

Layout: one sorted set per lease key, named `<prefix><key>` (default prefix `tenure:lease:`).
Member = holder id, score = the lease's expiry in milliseconds since the epoch **on Redis's own clock**.
Beside them, one string per prefix, `<prefix>#generation`: when (Redis ms) this Redis's lease state began.

A Redis without persistence that restarts, or a FLUSHALL, loses every lease while their holders still run: the
old holders learn it only at their next renewal. A script that finds the generation key missing therefore takes it
as a loss (Redis cannot tell a new server from an emptied one), writes it, and no script creates a new lease for
one TTL after that: by then every old holder has been told at a renewal that its lease is gone, or has fenced
itself for want of one (docs/quotas.md, "When Redis loses its leases").

Every script reads the time with `redis.call('TIME')` inside the script, so expiries never depend on a
client's clock: two workers whose clocks disagree by a minute still agree on who holds a slot. Since Redis 5
a script may write after reading `TIME` because it is replicated by its effects; `redis.replicate_commands()`
asks for that on Redis 5/6 and is a no-op on 7+.

The scripts are evaluated with EVALSHA (redis-py's `register_script` reloads them on NOSCRIPT).
"""

from __future__ import annotations

DEFAULT_PREFIX = "tenure:lease:"
"""Key prefix of the lease sorted sets unless the caller chooses another."""

KEY_TTL_FACTOR = 2
"""An idle key lives this many lease TTLs after its last write, so an abandoned key (every holder dead)
vanishes on its own. The key's expiry is only ever extended, never shortened: a holder with a short TTL must
not make the key, and with it a long-lived holder's lease, disappear early."""


def lease_key(prefix: str, key: str) -> str:
    """The Redis key of the sorted set that holds the leases of `key`."""
    return prefix + key


def generation_key(prefix: str) -> str:
    """The Redis key holding when the lease state of `prefix` began (a lease key never contains `#generation`:
    quota keys cannot contain `#`, and a line key ends in `#wait`)."""
    return prefix + "#generation"


# `now` in ms from the server clock. TIME answers {seconds, microseconds} as strings.
_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Extend (never shorten) the life of the whole key to `keep` ms from now, when it would otherwise end before the
# lease just written (`ttl` ms): the key then outlives every lease in it (each write ensured that for its own
# lease, and both clocks run down together), and most calls skip the PEXPIRE.
_KEEP = """
local function keep_key(key, ttl, keep)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, keep) end
end
"""

# Whether new leases must wait: the lease state began (or was lost) less than one TTL ago. A missing generation key
# means the state was lost (or never existed: Redis cannot tell), so it is written now and the wait begins.
# Existing leases are refreshed and renewed as usual; only new ones wait.
_QUIET = """
local function quiet(gen, ttl)
  local born = redis.call('GET', gen)
  if not born then
    redis.call('SET', gen, now)
    return true
  end
  return now < tonumber(born) + ttl
end
"""

# Hand `free` slots of the lease zset `lease` (purged) to the oldest unexpired tickets of its line `line`; returns
# the tickets served, oldest first, and publishes them on `announce` when it is not empty. RELEASE_AND_HAND_OVER
# and ACQUIRE_IN_LINE (a poll that finds slots free for older tickets) both serve the line through it.
_SERVE = """
local function serve(lease, line_zset, free, ttl, keep, announce)
  local served = {}
  if free <= 0 then return served end
  local flat = redis.call('ZRANGE', line_zset, 0, -1, 'WITHSCORES')
  local line = {}
  for i = 1, #flat, 2 do line[#line + 1] = {flat[i], tonumber(flat[i + 1])} end
  -- Oldest ticket first (fixed-width hex orders: byte order in any locale).
  table.sort(line, function(a, b) return a[1] < b[1] end)
  for _, entry in ipairs(line) do
    if free <= 0 then break end
    local ticket = entry[1]
    local holder = string.sub(ticket, (string.find(ticket, '/', 1, true) or 0) + 1)
    -- The slot lives as long as the ticket would have, not a fresh TTL: the ticket's last renewal is the last sign
    -- of life of its waiter, which may have died since. A dead waiter's slot then comes back when the waiter's
    -- own leases do (one TTL after its death), not one TTL after the hand-over.
    local expiry = math.min(now + ttl, entry[2])
    local score = redis.call('ZSCORE', lease, holder)
    if not score then
      redis.call('ZADD', lease, expiry, holder)
      free = free - 1
    elseif tonumber(score) < expiry then
      -- A holder granted twice (never expected) takes one slot only, and its lease is never shortened.
      redis.call('ZADD', lease, expiry, holder)
    end
    redis.call('ZREM', line_zset, ticket)
    served[#served + 1] = ticket
  end
  if #served > 0 then
    keep_key(lease, ttl, keep)
    if announce ~= '' then redis.call('PUBLISH', announce, table.concat(served, ',')) end
  end
  return served
end
"""

REFUSED_QUIET = 2
"""What ACQUIRE and ACQUIRE_IN_LINE answer instead of 0 when they refused only because the state is too young."""

ACQUIRE = (
    _NOW
    + _KEEP
    + _QUIET
    + """
-- KEYS[1] = lease zset, KEYS[2] = generation; ARGV = holder, limit, ttl_ms, keep_ms.
-- Returns 1 if the holder holds a slot, 0 if every slot is held, 2 if refused within a TTL of a loss.
local holder = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local keep = tonumber(ARGV[4])
-- Purge the dead before counting: a lease whose expiry is not in the future no longer takes a slot.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- Idempotent for one holder: a retried acquire (lost reply, double call) refreshes, never takes two slots.
if redis.call('ZSCORE', KEYS[1], holder) then
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  keep_key(KEYS[1], ttl, keep)
  return 1
end
if quiet(KEYS[2], ttl) then return 2 end
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  keep_key(KEYS[1], ttl, keep)
  return 1
end
return 0
"""
)
"""Purge expired leases, then refresh the holder's lease or take a free slot; 1 if held, 0 if full, 2 if refused
because the lease state began less than a TTL ago."""

RENEW = (
    _NOW
    + _KEEP
    + _QUIET
    + """
-- KEYS[i] = lease zset of the i-th held lease, then the generation last; ARGV = ttl_ms, keep_ms, holder_1 .. holder_n.
-- Returns the 1-based indexes of the leases that were no longer held (lost).
local ttl = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
-- Renewals come every heartbeat, so they are often the first to find the state lost: start the wait now.
quiet(KEYS[#KEYS], ttl)
local lost = {}
for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  local holder = ARGV[i + 2]
  local score = redis.call('ZSCORE', key, holder)
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', now + ttl, holder)
    keep_key(key, ttl, keep)
  else
    -- An expired lease nobody has purged yet is lost all the same: whether it comes back to life must not
    -- depend on whether another caller happened to touch the key in between.
    if score then redis.call('ZREM', key, holder) end
    lost[#lost + 1] = i
  end
end
return lost
"""
)
"""Extend every (key, holder) pair still held in one call; return the indexes of those that were lost."""

ACQUIRE_IN_LINE = (
    _NOW
    + _KEEP
    + _QUIET
    + _SERVE
    + """
-- KEYS[1] = lease zset, KEYS[2] = its waiting line (zset: member = ticket '<order>/<holder>', score = expiry),
-- KEYS[3] = generation; ARGV = ticket, limit, ttl_ms, keep_ms, announce channel. Returns {1} if the ticket's holder
-- holds a slot, {0, served...} if it waits in line (the older tickets it handed free slots to follow, published on
-- the channel when it is not empty), {2} if it waits in line because the lease state began less than a TTL ago.
local ticket = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local keep = tonumber(ARGV[4])
local holder = string.sub(ticket, (string.find(ticket, '/', 1, true) or 0) + 1)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- Already a holder (a hand-over granted it while the waiter slept, or a retry): refresh, leave the line.
local held = redis.call('ZSCORE', KEYS[1], holder)
local answer = {0}
if not held and quiet(KEYS[3], ttl) then
  -- Queue (keeping the ticket's place) but take nothing: the line is served once the wait is over.
  answer = {2}
elseif not held then
  local free = limit - redis.call('ZCARD', KEYS[1])
  if free > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    -- FIFO: a slot is free for this ticket only if fewer older tickets wait than there are free slots.
    -- Orders are fixed-width lowercase hex, so Lua's string order is their byte order in any locale.
    local ahead = 0
    if redis.call('ZCARD', KEYS[2]) >= free then
      for _, t in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
        if t < ticket then ahead = ahead + 1 end
      end
    end
    held = ahead < free
    if not held then
      -- The free slots belong to older tickets (all of the oldest `free` are older): serve them now. A slot that
      -- came free by expiry has no release to hand it over; any waiter's poll does.
      for _, t in ipairs(serve(KEYS[1], KEYS[2], free, ttl, keep, ARGV[5])) do answer[#answer + 1] = t end
    end
  end
end
if held then
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  keep_key(KEYS[1], ttl, keep)
  redis.call('ZREM', KEYS[2], ticket)
  return {1}
end
redis.call('ZADD', KEYS[2], now + ttl, ticket)
keep_key(KEYS[2], ttl, keep)
return answer
"""
)
"""Take a slot for the ticket's holder if one is free for it in FIFO order, else queue (or keep) the ticket, serving
older tickets the free slots it may not take."""

RELEASE_AND_HAND_OVER = (
    """
-- KEYS[1] = lease zset, KEYS[2] = its waiting line, KEYS[3] = generation; ARGV = holder, limit, ttl_ms, keep_ms,
-- announce channel.
-- Returns the tickets whose holders were handed a slot, oldest first. When the channel is not empty, they are
-- also published on it, comma-separated, so that waiters of other processes hear of it as soon as the
-- releaser does (not one more hop and round trip later).
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- Nobody waits: a plain release, no clock needed.
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {}
end
"""
    + _NOW
    + _KEEP
    + _QUIET
    + _SERVE
    + """
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local keep = tonumber(ARGV[4])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
-- A hand-over creates leases: none within a TTL of a loss (the waiters are served by their polls afterwards).
if quiet(KEYS[3], ttl) then return {} end
return serve(KEYS[1], KEYS[2], limit - redis.call('ZCARD', KEYS[1]), ttl, keep, ARGV[5])
"""
)
"""Release a slot and hand every free slot to the oldest tickets of the line, in one atomic step."""

HOLDERS = (
    _NOW
    + """
-- KEYS[1] = lease zset. Returns the unexpired holders, soonest expiry first.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
)
"""Purge expired leases and list the remaining holders."""
