"""`PostgresLeases`: the `Leases` protocol on PostgreSQL's `leases` table, on a small pool of its own.

`PostgresStore` implements `Leases` too, on the store's pool. This class exists for processes that need
leases and nothing else (a quota-only client, the contract suite's fifty contending processes, benchmarks):
one connection each instead of the store's pool plus its claim connection. The schema must already be
migrated (`PostgresStore.migrate`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import asyncpg

from tenure.backends.postgres import _lease_ops
from tenure.backends.postgres.store import _dsn
from tenure.contracts.errors import LeasesUnavailable
from tenure.contracts.store import LeaseRef, Leases


class PostgresLeases:
    """Named, heartbeated slots on PostgreSQL. Create with `await PostgresLeases.connect(url)`."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._closed = False

    @classmethod
    async def connect(cls, url: str, pool_size: int = 1) -> PostgresLeases:
        """Open a pool of `pool_size` connections (default one) to the database at `url`."""
        dsn = _dsn(url)  # the store's URL rules, so both accept the same URLs
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=pool_size)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            raise LeasesUnavailable(f"PostgreSQL lease backend could not connect: {exc}") from exc
        return cls(pool)

    async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
        """Take one of `limit` slots of `key` for `holder` until server now + `ttl_s`; False if full."""
        return await _lease_ops.acquire(self._pool, key, holder, limit, ttl_s)

    async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
        """Extend every held lease in one statement; return the ones that were lost."""
        return await _lease_ops.renew(self._pool, held, ttl_s)

    async def release(self, key: str, holder: str) -> None:
        """Give the slot back; harmless when not held."""
        await _lease_ops.release(self._pool, key, holder)

    async def holders(self, key: str) -> list[str]:
        """The unexpired holders of `key`, soonest expiry first."""
        return await _lease_ops.holders(self._pool, key)

    async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> bool:
        """Take a slot for the ticket's holder in FIFO order, or queue the ticket in `key`'s line."""
        return await _lease_ops.acquire_in_line(self._pool, key, ticket, limit, ttl_s)

    async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
        """Release `holder`'s slot and hand the free slots to the oldest tickets of the line."""
        return await _lease_ops.release_and_hand_over(self._pool, key, holder, limit, ttl_s)

    async def close(self) -> None:
        """Close the pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
            await self._pool.close()


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Leases] = PostgresLeases
