"""The PostgreSQL backend's edge: which driver errors mean "PostgreSQL failed", the connections a store holds
outside its pool, and the store's connections as a whole (`StoreConnections`).

A failover, a server restart, `idle_session_timeout` or a proxy all end a connection the way
`pg_terminate_backend` does. asyncpg's pool replaces a pooled connection it finds closed; a connection held
outside the pool (the claim connection, the LISTEN connections) has nobody to do that, so it is a
`DedicatedConnection`: opened on first use, dropped when a call finds it broken, and opened again on a later
use — never sooner than a growing, jittered delay after a failed attempt, so a database that is down is not
hammered by every worker at once, and a caller learns at once (`StoreUnavailable`) that it is down.

Every connection names its kind in `application_name` (`tenure-pool`, `tenure-claim`, `tenure-heartbeat`,
`tenure-listen`, `tenure-events`, `tenure-channel`), so an operator can tell them apart in `pg_stat_activity`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping

import asyncpg

from tenure.contracts.errors import StoreUnavailable

log = logging.getLogger("tenure.store.postgres")

DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,  # the server's errors, a terminated backend (AdminShutdownError) among them
    asyncpg.InterfaceError,  # the client's: a closed connection, a closing pool, a misuse of the protocol
    # The protocol's own state machine, e.g. "cannot switch to state 12; another operation (2) is in progress"
    # after a connection was lost mid-operation: not an InterfaceError, and it killed a worker's heartbeat.
    asyncpg.exceptions.InternalClientError,
    OSError,  # sockets: refused, reset, unreachable
    TimeoutError,  # connect and command timeouts
)
"""Every exception asyncpg raises for a failed round trip; the backend translates them to `StoreUnavailable`."""

CONNECT_TIMEOUT_S = 5.0


def dsn(url: str) -> str:
    """The asyncpg DSN of a database URL: asyncpg understands postgresql:// and postgres://; SQLAlchemy-style
    driver suffixes are accepted too, so every PostgreSQL backend takes the same URLs."""
    for prefix in ("postgresql+asyncpg://", "postgres+asyncpg://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


@contextlib.contextmanager
def translate(what: str) -> Iterator[None]:
    """Turn a driver error inside the block into `StoreUnavailable` (the cause kept)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise StoreUnavailable(f"PostgreSQL failed during {what}: {type(exc).__name__}: {exc}") from exc


def broken(conn: asyncpg.Connection, exc: BaseException) -> bool:
    """Whether `conn` must not be used again after `exc`: it is closed, or the error came from the client side
    (its protocol state is unknown). A server error on a live connection (a constraint, a serialization
    failure) leaves it usable."""
    return (
        conn.is_closed()
        or not isinstance(exc, asyncpg.PostgresError)
        or isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.exceptions.OperatorInterventionError)
    )


class DedicatedConnection:
    """One connection of a store's own, outside its pool (see the module docstring).

    `get()` answers the open connection, or opens one and runs `setup` on it; while the delay after a failed
    attempt runs it raises `StoreUnavailable` at once. `drop()` discards a connection a caller found broken
    (`broken()`), so the next `get()` opens a new one. Owned by one store; `close()` ends it."""

    def __init__(
        self,
        kind: str,
        dsn: str,
        *,
        server_settings: Mapping[str, str] | None = None,
        setup: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
        min_delay_s: float = 0.1,
        max_delay_s: float = 5.0,
        command_timeout_s: float | None = None,
    ) -> None:
        self.kind = kind
        self._command_timeout_s = command_timeout_s
        self._dsn = dsn
        self._settings = dict(server_settings or {}) | {"application_name": f"tenure-{kind}"}
        self._setup = setup
        self._min_delay_s = min_delay_s
        self._max_delay_s = max_delay_s
        self._conn: asyncpg.Connection | None = None
        self._delay_s = 0.0
        self._retry_at = 0.0
        self._closed = False
        self.reconnects = 0
        """Connections opened after the first one (after a loss)."""

    @property
    def connection(self) -> asyncpg.Connection | None:
        """The open connection, if there is one (no round trip)."""
        conn = self._conn
        return conn if conn is not None and not conn.is_closed() else None

    async def get(self) -> asyncpg.Connection:
        """The open connection, or a new one (see the class docstring)."""
        conn = self.connection
        if conn is not None:
            return conn
        if self._closed:
            raise StoreUnavailable(f"the {self.kind} connection is closed")
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            raise StoreUnavailable(f"the {self.kind} connection to PostgreSQL is down; reconnecting in {wait:.1f} s")
        first = self._conn is None and self.reconnects == 0 and self._delay_s == 0.0
        try:
            with translate(f"connect ({self.kind})"):
                conn = await asyncpg.connect(
                    self._dsn,
                    timeout=CONNECT_TIMEOUT_S,
                    command_timeout=self._command_timeout_s,
                    server_settings=self._settings,
                )
                try:
                    if self._setup is not None:
                        await self._setup(conn)
                except BaseException:
                    conn.terminate()
                    raise
        except StoreUnavailable as exc:
            self._delay_s = min(self._max_delay_s, max(self._min_delay_s, self._delay_s * 2))
            self._retry_at = time.monotonic() + self._delay_s * random.uniform(0.5, 1.0)
            log.warning("%s; next attempt in at most %.1f s", exc, self._delay_s)
            raise
        if not first:
            self.reconnects += 1
            log.info("the %s connection to PostgreSQL is back", self.kind)
        self._conn, self._delay_s, self._retry_at = conn, 0.0, 0.0
        return conn

    def drop(self) -> None:
        """Discard the current connection (found broken); the next `get()` opens another."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    def failed(self, conn: asyncpg.Connection, exc: BaseException) -> None:
        """A call on `conn` raised `exc`: drop the connection if it is `broken`."""
        if conn is self._conn and broken(conn, exc):
            self.drop()

    async def close(self) -> None:
        """Close the connection for good. Idempotent."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(*DRIVER_ERRORS):
                await conn.close(timeout=2)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset: nothing to undo. asyncpg's default sends `SELECT pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL` on every release, one extra round trip per start and per finish batch; pool
    connections here never LISTEN, SET, hold session advisory locks or cursors (LISTEN has its own connection,
    advisory locks are transaction-scoped). asyncpg still rolls back an open transaction before this runs."""


class StoreConnections:
    """The connections of one `PostgresStore`: a small pool for the conditional updates (shared with the
    process's `PostgresLeases`), and one connection reserved for claims.

    The claim connection runs with `synchronous_commit = off`: a claim lost in a server crash is harmless,
    because the start CAS (committed synchronously) re-checks owner, epoch and token and matches no row. Every
    other write waits for its commit to be durable, `claim_and_start` included: its function (created in
    `pg_temp` on the claim connection by `claim_setup`, see queries.sql) turns `synchronous_commit` on for its own
    transaction. Open with `await StoreConnections.open(...)`; `close` ends both."""

    def __init__(
        self,
        url: str,
        pool: asyncpg.Pool,
        settings: Mapping[str, str],
        claim_setup: str,
        command_timeout_s: float | None = None,
    ) -> None:
        self.pool = pool
        self._claim_setup = claim_setup
        # A connection outside the pool, re-opened with backoff after a loss (see DedicatedConnection).
        self._claim = DedicatedConnection(
            "claim",
            dsn(url),
            server_settings={**settings, "synchronous_commit": "off"},
            setup=self._setup_claim,
            command_timeout_s=command_timeout_s,
        )
        # Heartbeats travel on a connection of their own (seed 002, pitfall 2): never queued behind job traffic
        # on the pool. Opened by the first heartbeat, so a process that runs no worker never opens it.
        self._heartbeat = DedicatedConnection("heartbeat", dsn(url), server_settings=settings)
        self._heartbeat_lock = asyncio.Lock()
        self.claim_function = True
        """Whether each claim connection creates the session-local claim-and-start function (it cannot without
        the TEMP privilege; claims and starts then take two round trips)."""
        self._claim_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str,
        pool_size: int,
        settings: Mapping[str, str],
        claim_setup: str,
        command_timeout_s: float | None = None,
    ) -> StoreConnections:
        """Open the pool and the claim connection, with `settings` for every session. `command_timeout_s` bounds
        every statement on them at the client (None: unbounded): a reply that never comes — a silent network, a
        statement queued behind a lock — raises `StoreUnavailable` after it and the connection is replaced."""
        with translate("connect"):
            pool = await asyncpg.create_pool(
                dsn(url),
                min_size=1,
                max_size=pool_size,
                reset=_keep_session,
                timeout=CONNECT_TIMEOUT_S,
                command_timeout=command_timeout_s,
                server_settings={**settings, "application_name": "tenure-pool"},
            )
        conns = cls(url, pool, settings, claim_setup, command_timeout_s)
        try:
            await conns._claim.get()  # a wrong URL or a missing database fails here, at start-up
        except BaseException:
            await conns.close()
            raise
        return conns

    @property
    def claim_connection(self) -> asyncpg.Connection | None:
        """The open claim connection, if any (no round trip)."""
        return self._claim.connection

    async def _setup_claim(self, conn: asyncpg.Connection) -> None:
        """Each new claim connection creates its session-local claim-and-start function (queries.sql)."""
        if not self.claim_function:
            return
        try:
            await conn.execute(self._claim_setup)
        except asyncpg.PostgresError as exc:  # e.g. no TEMP privilege: claim and start in two round trips
            log.warning("pg_temp.tenure_claim_start not created, claiming and starting separately: %s", exc)
            self.claim_function = False

    @contextlib.asynccontextmanager
    async def claim(self, what: str) -> AsyncIterator[asyncpg.Connection]:
        """The claim connection, one caller at a time; a call that finds it broken drops it for a new one."""
        async with self._claim_lock:
            with translate(what):
                conn = await self._claim.get()
                try:
                    yield conn
                except DRIVER_ERRORS as exc:
                    self._claim.failed(conn, exc)
                    raise

    @contextlib.asynccontextmanager
    async def heartbeat(self, what: str) -> AsyncIterator[asyncpg.Connection]:
        """The heartbeat connection, one caller at a time; a call that finds it broken drops it for a new one.
        While it cannot be opened (the server refuses new connections, or the reconnect delay runs), a pool
        connection carries the heartbeat: one already open keeps a worker alive through it."""
        async with self._heartbeat_lock:
            try:
                conn: asyncpg.Connection | None = await self._heartbeat.get()
            except StoreUnavailable:
                conn = None
            if conn is None:
                async with self.pooled(what) as pooled:
                    yield pooled
                return
            with translate(what):
                try:
                    yield conn
                except DRIVER_ERRORS as exc:
                    self._heartbeat.failed(conn, exc)
                    raise

    @contextlib.asynccontextmanager
    async def pooled(self, what: str) -> AsyncIterator[asyncpg.Connection]:
        """A pool connection; one found broken is terminated rather than handed to the next caller."""
        with translate(what):
            async with self.pool.acquire() as conn:
                try:
                    yield conn
                except DRIVER_ERRORS as exc:
                    if broken(conn, exc):
                        # Its protocol state is unknown (an operation may still be "in progress" in it): the
                        # pool must open a new one rather than hand this one to the next caller.
                        conn.terminate()
                    raise

    async def close(self) -> None:
        """Close the claim connection and the pool (bounded). Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._claim.close()
        await self._heartbeat.close()
        with contextlib.suppress(*DRIVER_ERRORS):
            await asyncio.wait_for(self.pool.close(), 5)
