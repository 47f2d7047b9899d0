"""`PostgresChannel`: the `Channel` protocol on LISTEN/NOTIFY, for deployments without Redis.

Used for the quota wake-ups (`quota:<key>`: a release handed slots to waiting tickets) when the leases live in
PostgreSQL: a waiter in another process hears of its slot at once instead of at its next poll. A topic is the
NOTIFY channel `<prefix><topic>`, or — when that is longer than PostgreSQL's 63-byte identifiers — `<prefix>`
plus a digest of the topic. NOTIFY channels are database-wide: two deployments sharing a database should use
different prefixes (they would only wake each other's waiters for nothing; waiters re-check the lease).

Like every channel it is fire-and-forget: a message sent while a subscriber reconnects is lost, and polling
stays the floor. Driver errors surface as `LeasesUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

import asyncpg

from tenure.backends.postgres._connections import DRIVER_ERRORS, dsn
from tenure.contracts.channel import Channel
from tenure.contracts.errors import LeasesUnavailable

DEFAULT_PREFIX = "tenure_chan:"
_MAX_NAME = 63  # NAMEDATALEN - 1
_ERRORS = DRIVER_ERRORS
_SETTINGS = {"application_name": "tenure-channel"}


class PostgresChannel:
    """Publish with `pg_notify` on one lazily opened connection; each `subscribe` LISTENs on its own."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, *, timeout_s: float = 5.0) -> None:
        self._dsn = dsn(url)
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def name(self, topic: str) -> str:
        """The NOTIFY channel of `topic`."""
        name = self._prefix + topic
        if len(name.encode()) <= _MAX_NAME:
            return name
        return self._prefix + hashlib.sha256(topic.encode()).hexdigest()[: _MAX_NAME - len(self._prefix.encode())]

    async def publish(self, topic: str, message: str) -> None:
        """NOTIFY the current listeners of `topic` (outside any transaction: delivered at once)."""
        async with self._lock:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(self._dsn, timeout=self._timeout_s, server_settings=_SETTINGS)
                await self._conn.execute("SELECT pg_notify($1, $2)", self.name(topic), message)
            except _ERRORS as exc:
                raise LeasesUnavailable(f"NOTIFY on {topic} failed: {exc}") from exc

    async def subscribe(
        self, topics: Sequence[str], on_subscribed: Callable[[], None] | None = None
    ) -> AsyncIterator[tuple[str, str]]:
        """Yield `(topic, message)` until the connection is lost (then `LeasesUnavailable`)."""
        by_name = {self.name(t): t for t in topics}
        queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()

        def on_notify(_conn: object, _pid: int, channel: str, payload: str) -> None:
            queue.put_nowait((by_name.get(channel, channel), payload))

        try:
            conn = await asyncpg.connect(self._dsn, timeout=self._timeout_s, server_settings=_SETTINGS)
        except _ERRORS as exc:
            raise LeasesUnavailable(f"LISTEN failed: {exc}") from exc
        try:
            conn.add_termination_listener(lambda *_: queue.put_nowait(None))
            try:
                for name in by_name:
                    await conn.add_listener(name, on_notify)
            except _ERRORS as exc:
                raise LeasesUnavailable(f"LISTEN failed: {exc}") from exc
            if on_subscribed is not None:
                on_subscribed()  # LISTEN took effect when its command returned
            while True:
                item = await queue.get()
                if item is None:
                    raise LeasesUnavailable("the LISTEN connection was lost")
                yield item
        finally:
            with contextlib.suppress(*_ERRORS):
                await asyncio.wait_for(conn.close(), 2)

    async def close(self) -> None:
        """Close the publishing connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._conn is not None and not self._conn.is_closed():
            with contextlib.suppress(*_ERRORS):
                await asyncio.wait_for(self._conn.close(), 2)


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Channel] = PostgresChannel
