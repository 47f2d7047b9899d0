"""`PostgresLeases`: the `Leases` protocol on PostgreSQL's `leases` table.

On the store's pool (`PostgresLeases(store.pool)`: the `Backends` of a process, closed with the store), or on a
small pool of its own (`PostgresLeases.connect(url)`) for processes that need leases and nothing else (a
quota-only client, the contract suite's fifty contending processes, benchmarks): one connection each instead of
the store's pool plus its claim connection. The schema must already be migrated (`PostgresStore.migrate`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import asyncpg

from tenure.backends.postgres import _lease_ops
from tenure.backends.postgres._connections import dsn
from tenure.contracts.errors import LeasesUnavailable
from tenure.contracts.store import Leases


class PostgresLeases(_lease_ops.PoolLeases):
    """Named, heartbeated slots on PostgreSQL. Create with `await PostgresLeases.connect(url)`."""

    def __init__(self, pool: Any, *, owns_pool: bool = False) -> None:
        self._pool = pool
        self._owns_pool = owns_pool
        self._closed = False

    @classmethod
    async def connect(cls, url: str, pool_size: int = 1) -> PostgresLeases:
        """Open a pool of `pool_size` connections (default one) to the database at `url`."""
        try:
            pool = await asyncpg.create_pool(dsn(url), min_size=1, max_size=pool_size)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            raise LeasesUnavailable(f"PostgreSQL lease backend could not connect: {exc}") from exc
        return cls(pool, owns_pool=True)

    async def close(self) -> None:
        """Close the pool if this instance opened it (a store's pool is the store's to close). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._owns_pool:
            return
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
            await self._pool.close()


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Leases] = PostgresLeases
