"""The `Leases` operations on PostgreSQL's `leases` table, for `PostgresLeases` on the store's pool (the
`Backends` of a process) or on a pool of its own (e.g. one connection per contending process).

Every expiry is computed by the server (`now()`); acquire is one call of `tenure_lease_acquire` (schema.sql),
which serialises the acquirers of one key with a transaction-scoped advisory lock. Driver errors become
`LeasesUnavailable`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from tenure.backends._queries import load_queries
from tenure.backends._rules import check_lease_args as check_args
from tenure.backends.postgres._connections import DRIVER_ERRORS
from tenure.contracts.errors import LeasesUnavailable
from tenure.contracts.leases import InLine, LeaseRef

Q = load_queries("tenure.backends.postgres")


@contextlib.asynccontextmanager
async def _conn(pool: Any, what: str) -> AsyncIterator[asyncpg.Connection]:
    try:
        async with pool.acquire() as conn:
            yield conn
    except DRIVER_ERRORS as exc:
        raise LeasesUnavailable(f"PostgreSQL lease {what} failed: {exc}") from exc


async def acquire(pool: Any, key: str, holder: str, limit: int, ttl_s: float) -> bool:
    """Take one of `limit` slots of `key` for `holder` (idempotent for the holder); False when full."""
    check_args(limit, ttl_s)
    async with _conn(pool, "acquire") as conn:
        return bool(await conn.fetchval(Q["lease_acquire"], key, holder, limit, ttl_s))


async def renew(pool: Any, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
    """Extend every unexpired held lease in one statement; return the ones that were lost."""
    check_args(0, ttl_s)
    if not held:
        return []
    async with _conn(pool, "renew") as conn:
        rows = await conn.fetch(Q["lease_renew"], [h.key for h in held], [h.holder for h in held], ttl_s)
    renewed = {(r["key"], r["holder"]) for r in rows}
    return [h for h in held if (h.key, h.holder) not in renewed]


async def release(pool: Any, key: str, holder: str) -> None:
    """Delete the holder's lease; nothing happens when it holds none."""
    async with _conn(pool, "release") as conn:
        await conn.execute(Q["lease_release"], key, holder)


async def holders(pool: Any, key: str) -> list[str]:
    """The unexpired holders of `key`, soonest expiry first."""
    async with _conn(pool, "holders") as conn:
        return [r["holder"] for r in await conn.fetch(Q["lease_holders"], key)]


async def acquire_in_line(pool: Any, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
    """Take a slot for the ticket's holder in FIFO order, or queue the ticket in the key's line (serving the older
    tickets any free slot)."""
    check_args(limit, ttl_s)
    async with _conn(pool, "acquire") as conn:
        row = await conn.fetchrow(Q["lease_acquire_in_line"], key, ticket, limit, ttl_s)
    return InLine(bool(row["held"]), tuple(row["served"] or ()))


async def release_and_hand_over(pool: Any, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
    """Release the holder's slot and hand the free slots to the oldest tickets of the line (one call)."""
    check_args(limit, ttl_s)
    async with _conn(pool, "release") as conn:
        return [r["ticket"] for r in await conn.fetch(Q["lease_release_and_hand_over"], key, holder, limit, ttl_s)]


class PoolLeases:
    """The `Leases` methods over `self._pool` (`PostgresLeases`, on whichever pool it was given)."""

    _pool: Any

    async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
        """Take one of `limit` slots of `key` for `holder` until server now + `ttl_s`; False if full."""
        return await acquire(self._pool, key, holder, limit, ttl_s)

    async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
        """Extend every held lease in one statement; return the ones that were lost."""
        return await renew(self._pool, held, ttl_s)

    async def release(self, key: str, holder: str) -> None:
        """Give the slot back; harmless when not held."""
        await release(self._pool, key, holder)

    async def holders(self, key: str) -> list[str]:
        """The unexpired holders of `key`, soonest expiry first."""
        return await holders(self._pool, key)

    async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
        """Take a slot for the ticket's holder in FIFO order, or queue the ticket in `key`'s line (serving older
        tickets any free slot)."""
        return await acquire_in_line(self._pool, key, ticket, limit, ttl_s)

    async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
        """Release `holder`'s slot and hand the free slots to the oldest tickets of the line."""
        return await release_and_hand_over(self._pool, key, holder, limit, ttl_s)
