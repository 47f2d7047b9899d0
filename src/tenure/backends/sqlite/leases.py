"""`SqliteLeases`: the `Leases` protocol on SQLite's `leases` table, each operation one write transaction.

On the connection of this process's `SqliteStore` (so leases and jobs take turns on one thread and one writer
lock), or on a connection of its own (`SqliteLeases.connect`, for lease-only processes). Every expiry is the
database clock; failures are `LeasesUnavailable` (the quota layer's fail policy keys on it), still a
`StoreUnavailable` for callers that guard the whole store. The schema must already be migrated.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from tenure.backends._rules import check_lease_args
from tenure.backends.sqlite._connection import Q, SqliteConnection
from tenure.contracts.errors import LeasesUnavailable, StoreUnavailable
from tenure.contracts.leases import InLine
from tenure.contracts.store import LeaseRef, Leases, line_key, ticket_holder

T = TypeVar("T")


class SqliteLeases:
    """Named, heartbeated slots in one SQLite database."""

    def __init__(self, conn: SqliteConnection, *, owns_connection: bool = False) -> None:
        self._conn = conn
        self._owns_connection = owns_connection

    @classmethod
    async def connect(cls, url: str, synchronous: str = "FULL") -> SqliteLeases:
        """Leases on a connection of their own to the database at `url` (closed with them)."""
        return cls(await SqliteConnection.open(url, synchronous), owns_connection=True)

    async def close(self) -> None:
        """Close the connection if this instance opened it; a store's connection is the store's to close."""
        if self._owns_connection:
            await self._conn.close()

    async def _lease_run(self, fn: Callable[[], T], what: str) -> T:
        """Run a lease operation; its failures are `LeasesUnavailable` (the quota layer's fail policy keys on
        it), still a `StoreUnavailable` for callers that guard the whole store."""
        try:
            return await self._conn.run(fn, what)
        except StoreUnavailable as exc:
            raise LeasesUnavailable(str(exc)) from (exc.__cause__ or exc)

    async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
        check_lease_args(limit, ttl_s)

        def fn(db: sqlite3.Connection) -> bool:
            db.execute(Q["lease_purge"], (key,))
            if db.execute(Q["lease_refresh"], (key, holder, ttl_s)).rowcount == 1:
                return True
            if db.execute(Q["lease_count"], (key,)).fetchone()["n"] >= limit:
                return False
            db.execute(Q["lease_insert"], (key, holder, ttl_s))
            return True

        return await self._lease_run(lambda: self._conn.tx(fn), "lease acquire")

    async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
        check_lease_args(0, ttl_s)
        if not held:
            return []

        def fn(db: sqlite3.Connection) -> list[LeaseRef]:
            return [h for h in held if db.execute(Q["lease_renew"], (h.key, h.holder, ttl_s)).rowcount != 1]

        return await self._lease_run(lambda: self._conn.tx(fn), "lease renew")

    async def release(self, key: str, holder: str) -> None:
        await self._lease_run(
            lambda: self._conn.tx(lambda db: db.execute(Q["lease_release"], (key, holder))), "lease release"
        )

    async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> InLine:
        check_lease_args(limit, ttl_s)
        line, holder = line_key(key), ticket_holder(ticket)

        def fn(db: sqlite3.Connection) -> InLine:
            db.execute(Q["lease_purge"], (key,))
            if db.execute(Q["lease_refresh"], (key, holder, ttl_s)).rowcount != 1:
                free = limit - db.execute(Q["lease_count"], (key,)).fetchone()["n"]
                if free <= 0 or db.execute(Q["lease_line_ahead"], (line, ticket)).fetchone()["n"] >= free:
                    # The free slots belong to older tickets (all of the oldest `free` are older): serve them now.
                    served = _serve_line(db, key, free, ttl_s)
                    db.execute(Q["lease_upsert"], (line, ticket, ttl_s))
                    return InLine(False, served)
                db.execute(Q["lease_insert"], (key, holder, ttl_s))
            db.execute(Q["lease_release"], (line, ticket))
            return InLine(True)

        return await self._lease_run(lambda: self._conn.tx(fn), "lease acquire")

    async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
        check_lease_args(limit, ttl_s)

        def fn(db: sqlite3.Connection) -> list[str]:
            db.execute(Q["lease_release"], (key, holder))
            db.execute(Q["lease_purge"], (key,))
            return list(_serve_line(db, key, limit - db.execute(Q["lease_count"], (key,)).fetchone()["n"], ttl_s))

        return await self._lease_run(lambda: self._conn.tx(fn), "lease release")

    async def holders(self, key: str) -> list[str]:
        rows = await self._lease_run(
            lambda: self._conn.read(lambda db: db.execute(Q["lease_holders"], (key,)).fetchall()), "lease holders"
        )
        return [r["holder"] for r in rows]


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Leases] = SqliteLeases


def _serve_line(db: sqlite3.Connection, key: str, free: int, ttl_s: float) -> tuple[str, ...]:
    """Hand `free` slots of `key` (purged) to the oldest tickets of its line; the tickets served, oldest first."""
    if free <= 0:
        return ()
    line = line_key(key)
    served = db.execute(Q["lease_line_oldest"], (line, free)).fetchall()
    for r in served:
        # Until the ticket's own expiry, not a fresh TTL: the waiter may have died since its last renewal
        # (see RELEASE_AND_HAND_OVER in backends/redis/_scripts.py).
        db.execute(Q["lease_hand_over"], (key, ticket_holder(r["holder"]), ttl_s, r["expires_at"]))
        db.execute(Q["lease_release"], (line, r["holder"]))
    return tuple(r["holder"] for r in served)
