"""`PostgresLeases`: the `Leases` protocol on PostgreSQL's `leases` table, on a small pool of its own.

`PostgresStore` implements `Leases` too, on the store's pool. This class exists for processes that need
leases and nothing else (a quota-only client, the contract suite's fifty contending processes, benchmarks):
one connection each instead of the store's pool plus its claim connection. The schema must already be
migrated (`PostgresStore.migrate`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import asyncpg

from tenure.backends.postgres import _lease_ops
from tenure.backends.postgres.store import _dsn
from tenure.contracts.errors import LeasesUnavailable
from tenure.contracts.store import Leases


class PostgresLeases(_lease_ops.PoolLeases):
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

    async def close(self) -> None:
        """Close the pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError):
            await self._pool.close()


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Leases] = PostgresLeases
