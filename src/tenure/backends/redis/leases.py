"""Named, heartbeated lease slots on one Redis server: a sorted set per key, one Lua script per operation.

See `tenure.backends.redis._scripts` for the key layout and the scripts, and docs/quotas.md for the contract.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, TypeVar

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tenure.backends._rules import check_lease_args
from tenure.backends.redis import _scripts
from tenure.backends.redis._client import client_identity
from tenure.contracts.errors import LeasesUnavailable
from tenure.contracts.leases import InLine
from tenure.contracts.store import LeaseRef, Leases, line_key

_T = TypeVar("_T")
log = logging.getLogger("tenure.leases")


def _discard(call: Awaitable[object]) -> None:
    """Close a command coroutine that will never be awaited (no "never awaited" warning)."""
    if asyncio.iscoroutine(call):
        call.close()


def _ms(seconds: float) -> int:
    """A duration in whole milliseconds, rounded up so a tiny positive TTL never becomes zero."""
    return max(1, math.ceil(seconds * 1000))


def _text(member: bytes | str) -> str:
    return member.decode() if isinstance(member, bytes) else str(member)


class RedisLeases:
    """The `Leases` protocol on a single Redis server (no Redis Cluster: `renew` touches many keys in one
    script, which Cluster would refuse across hash slots; Sentinel fail-over may lose the newest leases,
    because replication is asynchronous).

    Every expiry is computed inside Lua from Redis's `TIME`, never from this process's clock. Each operation
    is one round trip. Driver failures surface as `LeasesUnavailable`, with the redis-py error as the cause.
    After Redis loses its leases (a FLUSHALL, a restart without persistence) no new lease is granted for one TTL,
    until every old holder has learnt at a renewal that its lease is gone (see `_scripts`, docs/quotas.md).

    Build it from a URL (it then owns a bounded connection pool and `close()` closes it) or wrap a client you
    own with `RedisLeases.from_client`.
    """

    def __init__(
        self,
        url: str,
        prefix: str = _scripts.DEFAULT_PREFIX,
        *,
        max_connections: int = 16,
        timeout_s: float = 5.0,
        announce_prefix: str | None = None,
    ) -> None:
        """Connect lazily to the Redis at `url` (`redis://host:port/db`).

        With `announce_prefix`, `release_and_hand_over` and `acquire_in_line` also publish the tickets they served
        (comma-separated) on the pub/sub channel `<announce_prefix><key>`, inside the same script.

        `max_connections` bounds the pool: callers beyond it wait up to `timeout_s` for a connection rather
        than opening one socket each. `timeout_s` also bounds connecting and every reply, so a dead Redis
        turns into `LeasesUnavailable` within seconds instead of a hang (the quota layer's fail-closed /
        fail-open decision needs an answer).
        """
        # A plain pool behind a semaphore of our own rather than redis-py's BlockingConnectionPool: that one
        # takes a Condition and arms a timeout for every command, even when a connection is free (about a
        # fifth of a bare EVALSHA round trip, measured); the semaphore costs nothing unless callers must wait.
        pool = ConnectionPool.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # Retrying is safe because every operation is idempotent for its holder (acquire refreshes,
            # renew re-extends, release removes nothing twice); keep it short so failure is reported fast.
            # Only a broken connection is retried (a restarted Redis, a reset socket): a reply that did not come
            # within `timeout_s` (a silent partition, a frozen server) is reported at once, so the quota layer
            # decides fail-closed / fail-open after one timeout, not three (was ~20 s with the default 5 s).
            retry=Retry(
                ExponentialWithJitterBackoff(base=0.01, cap=0.2), retries=2, supported_errors=(RedisConnectionError,)
            ),
            # Left to itself, redis-py reads its version from the package metadata (file I/O) for every new
            # connection, on the event loop; naming it once here keeps connecting non-blocking.
            **client_identity(),
        )
        self._setup(Redis.from_pool(pool), prefix, owns_client=True, announce_prefix=announce_prefix)
        self._connections: asyncio.Semaphore | None = asyncio.Semaphore(max_connections)
        self._wait_s = timeout_s

    @classmethod
    def from_client(
        cls, client: Redis, prefix: str = _scripts.DEFAULT_PREFIX, *, announce_prefix: str | None = None
    ) -> RedisLeases:
        """Use an existing redis.asyncio client. The caller keeps owning it: `close()` leaves it open."""
        leases = cls.__new__(cls)
        leases._setup(client, prefix, owns_client=False, announce_prefix=announce_prefix)
        return leases

    def _setup(self, client: Redis, prefix: str, *, owns_client: bool, announce_prefix: str | None) -> None:
        self._client = client
        self._connections = None  # a caller's client: its own pool decides
        self._wait_s = 0.0
        self._prefix = prefix
        self._generation = _scripts.generation_key(prefix)
        self._quiet_reported_at = -math.inf
        self._announce_prefix = announce_prefix
        self._owns_client = owns_client
        self._closed = False
        self._acquire = client.register_script(_scripts.ACQUIRE)
        self._renew = client.register_script(_scripts.RENEW)
        self._holders = client.register_script(_scripts.HOLDERS)
        self._acquire_in_line = client.register_script(_scripts.ACQUIRE_IN_LINE)
        self._release_and_hand_over = client.register_script(_scripts.RELEASE_AND_HAND_OVER)

    @property
    def prefix(self) -> str:
        """The key prefix of this instance's sorted sets."""
        return self._prefix

    @property
    def announces_hand_overs(self) -> bool:
        """Whether `release_and_hand_over` publishes the tickets it served itself (see `announce_prefix`)."""
        return self._announce_prefix is not None

    async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
        """Take one of `limit` slots of `key` for `holder` until server now + `ttl_s`. False if all are held, or
        if Redis lost its lease state (or is new) less than `ttl_s` ago: the old holders may still be running.

        Acquiring again as a current holder refreshes the expiry and never takes a second slot.
        """
        check_lease_args(limit, ttl_s)
        ttl_ms = _ms(ttl_s)
        keys = [_scripts.lease_key(self._prefix, key), self._generation]
        args: list[str | int] = [holder, limit, ttl_ms, ttl_ms * _scripts.KEY_TTL_FACTOR]
        answer = await self._call(self._acquire(keys=keys, args=args), "acquire", key)
        return self._granted(int(answer), key, ttl_s)

    async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
        """Extend every lease in `held` to server now + `ttl_s`, all keys in one script call.

        Returns the leases that were lost: released from outside, or already expired (an expired lease is
        never brought back, even when nobody has taken its slot yet).
        """
        check_lease_args(0, ttl_s)
        ttl_ms = _ms(ttl_s)
        if not held:
            return []
        keys = [_scripts.lease_key(self._prefix, ref.key) for ref in held]
        keys.append(self._generation)
        args: list[str | int] = [ttl_ms, ttl_ms * _scripts.KEY_TTL_FACTOR]
        args.extend(ref.holder for ref in held)
        lost = await self._call(self._renew(keys=keys, args=args), "renew", f"{len(held)} leases")
        return [held[int(index) - 1] for index in lost]

    async def release(self, key: str, holder: str) -> None:
        """Give the slot back. Releasing a slot that is not held (twice, or after expiry) does nothing."""
        # A single ZREM is atomic and needs no clock, so it needs no script.
        await self._call(self._client.zrem(_scripts.lease_key(self._prefix, key), holder), "release", key)

    async def holders(self, key: str) -> list[str]:
        """The unexpired holders of `key`, soonest expiry first (expired ones are purged on the way)."""
        keys = [_scripts.lease_key(self._prefix, key)]
        members = await self._call(self._holders(keys=keys), "holders", key)
        return [_text(m) for m in members]

    async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
        """Take a slot for the ticket's holder in FIFO order, or queue the ticket in `key`'s line, serving older
        tickets the free slots it may not take (see `Leases`)."""
        keys, args = self._line_call(key, ticket, limit, ttl_s)
        code, *served = await self._call(self._acquire_in_line(keys=keys, args=args), "acquire", key)
        return InLine(self._granted(int(code), key, ttl_s), tuple(_text(t) for t in served))

    async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
        """Release `holder`'s slot and hand the free slots to the oldest tickets of the line (see `Leases`)."""
        keys, args = self._line_call(key, holder, limit, ttl_s)
        served = await self._call(self._release_and_hand_over(keys=keys, args=args), "release", key)
        return [_text(t) for t in served]

    def _line_call(self, key: str, who: str, limit: int, ttl_s: float) -> tuple[list[str], list[str | int]]:
        """KEYS and ARGV of the two scripts of a waiting line: (slots, line, generation), (ticket or holder, limit,
        ttl, keep, the channel that hears of hand-overs or '')."""
        check_lease_args(limit, ttl_s)
        ttl_ms = _ms(ttl_s)
        keys = [_scripts.lease_key(self._prefix, key), _scripts.lease_key(self._prefix, line_key(key)), self._generation]
        announce = "" if self._announce_prefix is None else self._announce_prefix + key
        return keys, [who, limit, ttl_ms, ttl_ms * _scripts.KEY_TTL_FACTOR, announce]

    def _granted(self, answer: int, key: str, ttl_s: float) -> bool:
        """Turn a script's answer into the protocol's bool, saying once per TTL why slots are being refused after
        Redis lost its lease state (an operator sees quotas stall for a TTL and should know why)."""
        if answer == _scripts.REFUSED_QUIET:
            now = time.monotonic()
            if now - self._quiet_reported_at >= ttl_s:
                self._quiet_reported_at = now
                log.warning(
                    "Redis has no lease state under %r (restarted without persistence, flushed, or new): no new "
                    "lease of %s or any key for %g s, until every earlier holder has learnt its lease is gone",
                    self._prefix,
                    key,
                    ttl_s,
                )
        return answer == 1

    async def ping(self) -> None:
        """Check that Redis answers; raise `LeasesUnavailable` if it does not."""
        await self._call(self._client.ping(), "ping", "server")

    async def server_info(self) -> tuple[str, float]:
        """Redis's version and its clock (`TIME`, seconds since the epoch), for `tenure doctor`."""
        info = await self._call(self._client.info("server"), "info", "server")
        seconds, micros = await self._call(self._client.time(), "time", "server")
        return str(info.get("redis_version", "?")), float(seconds) + float(micros) / 1e6

    async def close(self) -> None:
        """Close the connection pool if this instance created it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            try:
                await self._client.aclose()
            except RedisError as exc:
                raise LeasesUnavailable(f"closing the Redis lease client failed: {exc}") from exc

    async def _call(self, call: Awaitable[_T], operation: str, subject: str) -> _T:
        """Await one Redis call (at most `max_connections` at once), translating driver errors at this edge."""
        gate = self._connections
        if gate is not None:
            if gate.locked():  # every connection is busy: wait for one, at most `timeout_s`
                try:
                    async with asyncio.timeout(self._wait_s):
                        await gate.acquire()
                except TimeoutError:
                    _discard(call)
                    raise LeasesUnavailable(
                        f"Redis lease {operation} for {subject}: no connection free within {self._wait_s:g} s"
                    ) from None
                except BaseException:
                    _discard(call)
                    raise
            else:
                await gate.acquire()  # free: returns without suspending
        try:
            return await call
        except RedisError as exc:
            raise LeasesUnavailable(f"Redis lease {operation} failed for {subject}: {exc}") from exc
        finally:
            if gate is not None:
                gate.release()

    def __repr__(self) -> str:
        return f"RedisLeases(prefix={self._prefix!r})"


if TYPE_CHECKING:
    # mypy proves here that RedisLeases satisfies the protocol, method by method.
    _PROTOCOL_CHECK: type[Leases] = RedisLeases
