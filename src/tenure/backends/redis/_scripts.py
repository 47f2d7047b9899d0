"""Every Redis key name and Lua script of the lease backend, in one place.

Layout: one sorted set per lease key, named `<prefix><key>` (default prefix `tenure:lease:`).
Member = holder id, score = the lease's expiry in milliseconds since the epoch **on Redis's own clock**.

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


# `now` in ms from the server clock. TIME answers {seconds, microseconds} as strings.
_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Extend (never shorten) the life of the whole key to `keep` ms from now.
_KEEP = """
local function keep_key(key, keep)
  local pttl = redis.call('PTTL', key)
  if pttl < keep then redis.call('PEXPIRE', key, keep) end
end
"""

ACQUIRE = (
    _NOW
    + _KEEP
    + """
-- KEYS[1] = lease zset; ARGV = holder, limit, ttl_ms, keep_ms. Returns 1 if the holder holds a slot.
local holder = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local keep = tonumber(ARGV[4])
-- Purge the dead before counting: a lease whose expiry is not in the future no longer takes a slot.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- Idempotent for one holder: a retried acquire (lost reply, double call) refreshes, never takes two slots.
if redis.call('ZSCORE', KEYS[1], holder) then
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  keep_key(KEYS[1], keep)
  return 1
end
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now + ttl, holder)
  keep_key(KEYS[1], keep)
  return 1
end
return 0
"""
)
"""Purge expired leases, then refresh the holder's lease or take a free slot; 1 if held, 0 if full."""

RENEW = (
    _NOW
    + _KEEP
    + """
-- KEYS[i] = lease zset of the i-th held lease; ARGV = ttl_ms, keep_ms, holder_1 .. holder_n.
-- Returns the 1-based indexes of the leases that were no longer held (lost).
local ttl = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
local lost = {}
for i, key in ipairs(KEYS) do
  local holder = ARGV[i + 2]
  local score = redis.call('ZSCORE', key, holder)
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', now + ttl, holder)
    keep_key(key, keep)
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

HOLDERS = (
    _NOW
    + """
-- KEYS[1] = lease zset. Returns the unexpired holders, soonest expiry first.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
)
"""Purge expired leases and list the remaining holders."""
