"""`PostgresSignals`: the `Signals` protocol on PostgreSQL's LISTEN / NOTIFY.

The publishing half is a no-op, on purpose. PostgreSQL delivers a NOTIFY at commit, atomically with the write
that sent it, so the store's SQL sends its own inside the transaction: `pg_notify('tenure_jobs')` in the
statements that make jobs claimable (enqueue, release, requeue, a sweep's releases and due retries), the
events a statement appended through `tenure_notify_appended` / `tenure_notify_events` (schema.sql), and
`tenure_control` beside a cancel request or a command. Sent here instead, after the commit, each would cost
every write one more round trip (and a notifying transaction of its own, with the database-wide lock every
notifying commit takes). With `TENURE_REDIS_URL` set the events and control hints travel over Redis instead
(`backends/signals.py`): the store's sessions then send no NOTIFY for them (`PostgresStore(notify=False)`).

The waiting half holds two connections of its own (`_connections.DedicatedConnection`: re-opened with backoff
after a loss, polling as the floor meanwhile): one LISTENs on `tenure_jobs` and, once an owner waits for
commands, on `tenure_control` (one connection, not two: a NOTIFY on any channel wakes every listening backend);
the other, the gateway's, on `tenure_events`. While it listens for events this instance holds a lease in
`event_listeners` (writers NOTIFY events only while some lease runs), renewed on that same connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import asyncpg

from tenure.backends._queries import load_queries
from tenure.backends.postgres._connections import DRIVER_ERRORS, DedicatedConnection, dsn, translate
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import Signals
from tenure.contracts.types import Event, EventNotice, new_id

log = logging.getLogger("tenure.store.postgres")

Q = load_queries("tenure.backends.postgres")
_CHANNEL = "tenure_jobs"
_EVENTS_CHANNEL = "tenure_events"
_CONTROL_CHANNEL = "tenure_control"
_LISTENER_LEASE_S = 30.0
_LISTENER_RENEW_S = 10.0


class PostgresSignals:
    """LISTEN-side wake-ups of one process. Connections open on the first wait; `close` ends them."""

    def __init__(self, url: str) -> None:
        self._listen = DedicatedConnection("listen", dsn(url), setup=self._setup_listen)
        self._listen_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._closed = False
        self._events = DedicatedConnection("events", dsn(url), setup=self._setup_events)
        # While it listens for events, this instance holds a lease in `event_listeners` (writers NOTIFY only then).
        self._listener_id = f"{socket.gethostname()}:{os.getpid()}:{new_id()}"
        self._listener_renewed = -math.inf
        self._events_lock = asyncio.Lock()
        self._notices: list[EventNotice] = []
        self._notice_ready = asyncio.Event()
        self._control_wanted = False  # an owner waits for commands: the LISTEN connection hears tenure_control
        self._control_conn: asyncpg.Connection | None = None  # the connection that LISTENs on tenure_control
        self._control_jobs: set[str] | None = set()  # None: a listener was (re)established, check all
        self._control_ready = asyncio.Event()

    # -- publishing: the SQL already did (see the module docstring) ------------------------------------------------
    def jobs_changed(self) -> None:
        """Nothing to do: the statement that made jobs claimable sent `tenure_jobs` at its commit."""

    def events_changed(self, job_ids: Iterable[str]) -> None:
        """Nothing to do: the statement (or its transaction) sent `tenure_events` at its commit."""

    def control_sent(self, job_ids: Iterable[str]) -> None:
        """Nothing to do: the transaction sent `tenure_control` at its commit."""

    # -- jobs and control: one LISTEN connection ---------------------------------------------------------------------
    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    def _on_listen_lost(self, *_: object) -> None:
        # The LISTEN connection died: polling (the wait timeout) is the floor until the next wait reconnects,
        # and commands may have been missed meanwhile: the owner checks all its jobs.
        self._wake.set()
        if self._control_wanted:
            self._control_jobs = None
            self._control_ready.set()

    async def _setup_listen(self, conn: asyncpg.Connection) -> None:
        await conn.add_listener(_CHANNEL, self._on_notify)
        conn.add_termination_listener(self._on_listen_lost)
        if self._control_wanted:
            await self._listen_control(conn)

    async def _listen_control(self, conn: asyncpg.Connection) -> None:
        await conn.add_listener(_CONTROL_CHANNEL, self._on_control)
        self._control_conn = conn
        # Commands sent before this LISTEN took effect were not heard: the owner checks them all.
        self._control_jobs = None
        self._control_ready.set()

    async def _ensure_listening(self, control: bool = False) -> None:
        """A worker's one LISTEN connection: `tenure_jobs` (wake-ups), and `tenure_control` once it waits for
        commands. One connection, not two: a NOTIFY on any channel wakes every listening backend. A failure
        leaves the caller polling; the connection is tried again after its backoff (_connections.py)."""
        if control:
            self._control_wanted = True  # from now on every LISTEN connection hears commands too
        conn = self._listen.connection
        if conn is not None and (conn is self._control_conn or not self._control_wanted):
            return
        async with self._listen_lock:
            conn = self._listen.connection
            with contextlib.suppress(StoreUnavailable), translate("LISTEN"):
                if conn is None:
                    await self._listen.get()
                elif self._control_wanted and conn is not self._control_conn:
                    try:
                        await self._listen_control(conn)
                    except DRIVER_ERRORS as exc:
                        self._listen.failed(conn, exc)
                        raise

    async def wait_for_jobs(self, timeout_s: float) -> None:
        if not self._closed:
            await self._ensure_listening()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        except TimeoutError:
            return
        finally:
            self._wake.clear()

    def _on_control(self, _conn: object, _pid: int, _channel: str, body: str) -> None:
        if self._control_jobs is not None:
            self._control_jobs.update(j for j in body.split(",") if j)
        self._control_ready.set()

    async def wait_for_control(self, timeout_s: float) -> frozenset[str] | None:
        if not self._closed:
            await self._ensure_listening(control=True)
        if self._control_jobs is not None and not self._control_jobs:
            try:
                await asyncio.wait_for(self._control_ready.wait(), timeout_s)
            except TimeoutError:
                return frozenset()
        self._control_ready.clear()
        jobs, self._control_jobs = self._control_jobs, set()
        return None if jobs is None else frozenset(jobs)

    # -- events: the gateway's LISTEN connection -----------------------------------------------------------------------
    def _on_events(self, _conn: object, _pid: int, _channel: str, body: str) -> None:
        try:
            data = json.loads(body)
        except ValueError:
            data = {"jobs": None}
        if "events" in data:
            events = tuple(Event(e["j"], e["x"], e["e"], e["s"], e["t"], e["p"], e["ts"]) for e in data["events"])
            self._notices.append(EventNotice(frozenset(e.job_id for e in events), events))
        else:
            jobs = data.get("jobs")
            self._notices.append(EventNotice(None if jobs is None else frozenset(jobs)))
        self._notice_ready.set()

    async def _renew_listener_lease(self) -> None:
        """Keep this instance's row in `event_listeners` while it listens (renewed every 10 s, a 30 s lease).
        The first one commits before anything is read, so every append after it is notified."""
        now = time.monotonic()
        conn = self._events.connection
        if conn is None or now - self._listener_renewed < _LISTENER_RENEW_S:
            return
        try:
            with translate("event_listener_renew"):
                try:
                    await conn.execute(Q["event_listener_renew"], self._listener_id, _LISTENER_LEASE_S)
                except DRIVER_ERRORS as exc:
                    self._events.failed(conn, exc)
                    raise
        except StoreUnavailable as exc:
            log.warning("renewing the event listener lease failed (streams fall back to polling): %s", exc)
            return
        if now - self._listener_renewed >= _LISTENER_LEASE_S:
            # First lease, or one that had lapsed: appends committed before it was visible to their writers sent
            # no NOTIFY, so every subscriber reads its history once.
            self._notices.append(EventNotice(None))
            self._notice_ready.set()
        self._listener_renewed = now

    def _on_events_lost(self, *_: object) -> None:
        # Notifications may have been missed while the listener was down: every subscriber checks its history.
        self._notices.append(EventNotice(None))
        self._notice_ready.set()

    async def _setup_events(self, conn: asyncpg.Connection) -> None:
        await conn.add_listener(_EVENTS_CHANNEL, self._on_events)
        conn.add_termination_listener(self._on_events_lost)
        self._notices.append(EventNotice(None))  # anything appended before we listened
        self._notice_ready.set()

    async def _ensure_events_listener(self) -> None:
        """The gateway's LISTEN on `tenure_events`; while it is down (backoff), readers poll the history."""
        if self._events.connection is not None:
            return
        async with self._events_lock:
            with contextlib.suppress(StoreUnavailable):
                await self._events.get()

    async def wait_for_events(self, timeout_s: float) -> list[EventNotice]:
        if not self._closed:
            await self._ensure_events_listener()
            await self._renew_listener_lease()
        if not self._notices:
            try:
                await asyncio.wait_for(self._notice_ready.wait(), timeout_s)
            except TimeoutError:
                return []
        self._notice_ready.clear()
        out, self._notices = self._notices, []
        return out

    async def close(self) -> None:
        """Leave `event_listeners` (bounded) and close both connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        conn = self._events.connection
        if conn is not None and self._listener_renewed > -math.inf:
            with contextlib.suppress(*DRIVER_ERRORS):
                async with asyncio.timeout(2):
                    await conn.execute(Q["event_listener_leave"], self._listener_id)
        for dedicated in (self._listen, self._events):
            await dedicated.close()


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Signals] = PostgresSignals
