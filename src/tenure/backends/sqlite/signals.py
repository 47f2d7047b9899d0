"""`SqliteSignals`: the `Signals` protocol on SQLite, which has no NOTIFY.

A waiter polls `PRAGMA data_version` (which changes when another connection commits) every few milliseconds
after activity, backing off while idle. This process's own commits do not change it (one connection, shared
with the `SqliteStore`), so the publishing half sets an in-process event for this process's waiters (an inline
worker shares the gateway's store). On Linux, doorbells (`doorbell.py`) wake other processes at once: after a
commit that made jobs claimable or sent a command, `jobs_changed` / `control_sent` touch a file next to the
database that the waiters of every process watch with inotify. The poll stays as the floor.

Live events on SQLite are a tail of the history: a notice never carries events, it says "read your history"
(`EventNotice(None)`), and the gateway's event hub reads every caught-up stream's history in one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tenure.backends.sqlite._connection import SqliteConnection
from tenure.backends.sqlite.doorbell import BELLS, Bell, Watch, bell_path
from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import Signals
from tenure.contracts.types import EventNotice

log = logging.getLogger("tenure.store.sqlite")

_POLL_MIN_S = 0.002
_POLL_MAX_S = 0.025
_CONTROL_POLL_S = 0.1
# The gateway's event hub polls faster than workers do: its wake-up is a stream's latency, and a PRAGMA
# data_version on the connection thread costs microseconds.
_EVENTS_POLL_MAX_S = 0.005


class SqliteSignals:
    """Wake-ups on one SQLite database, on the connection of this process's store. Create with
    `await SqliteSignals.open(connection)`; close it before the connection."""

    def __init__(self, conn: SqliteConnection) -> None:
        self._conn = conn
        self._seen_version = -1
        self._wake = asyncio.Event()
        self._events_seen_version = -1
        self._events_local = asyncio.Event()
        self._control_seen_version = -1
        self._control_local = asyncio.Event()
        # Doorbells (see doorbell.py): rung after commits that waiters elsewhere act on, watched while waiting.
        self._bells: dict[str, Bell] = {}
        self._watch: Watch | None = None
        self._watched: set[str] = set()
        self._closed = False

    @classmethod
    async def open(cls, conn: SqliteConnection) -> SqliteSignals:
        """Signals on `conn`, with the doorbell files opened (on the connection thread: they may be created)."""
        signals = cls(conn)
        await conn.run(signals._open_bells, "open doorbells")
        return signals

    def _open_bells(self) -> None:
        for name in BELLS:
            try:
                self._bells[name] = Bell(bell_path(self._conn.path, name))
            except OSError as exc:  # e.g. a read-only directory: the other processes' waiters poll
                log.debug("no %s doorbell for %s: %s", name, self._conn.path, exc)

    # -- publishing: after the commit --------------------------------------------------------------------------------
    def jobs_changed(self) -> None:
        """This process's workers stop waiting at once, and the other processes' workers through the doorbell."""
        self._wake.set()
        self._ring("jobs")

    def events_changed(self, job_ids: Iterable[str]) -> None:
        """This process's readers learn at once; the other processes' from `data_version`."""
        self._events_local.set()

    def control_sent(self, job_ids: Iterable[str]) -> None:
        self._control_local.set()
        self._ring("control")

    def _ring(self, name: str) -> None:
        """Ring on the connection thread (a file write, kept off the event loop), after the commit that called
        for it: the thread runs one call at a time, in order. Not awaited: a ring is a hint."""
        bell = self._bells.get(name)
        if bell is not None and not self._closed:
            self._conn.submit(bell.ring)

    # -- waiting -----------------------------------------------------------------------------------------------------
    def _watch_bell(self, name: str, event: asyncio.Event) -> None:
        """Let the `name` doorbell set `event` (once per instance; nothing where inotify is missing)."""
        if name in self._watched:
            return
        self._watched.add(name)
        if self._watch is None:
            self._watch = Watch.open()
        if self._watch is not None:
            self._watch.add(bell_path(self._conn.path, name), event)

    async def _data_version(self) -> int:
        return await self._conn.run(self._conn.data_version, "poll")

    async def wait_for_jobs(self, timeout_s: float) -> None:
        self._watch_bell("jobs", self._wake)
        deadline = time.monotonic() + timeout_s
        interval = _POLL_MIN_S
        while True:
            if self._wake.is_set():
                self._wake.clear()
                return
            version = await self._data_version()
            if version != self._seen_version:
                self._seen_version = version
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), min(interval, left))
            except TimeoutError:
                pass
            interval = min(interval * 2, _POLL_MAX_S)

    async def wait_for_control(self, timeout_s: float) -> frozenset[str] | None:
        # SQLite has no NOTIFY: any commit by another connection may be a command. Polled at most every
        # _CONTROL_POLL_S, so an owner costs a few cheap reads a second, not one per commit; the control doorbell
        # wakes it at once when a command is sent.
        self._watch_bell("control", self._control_local)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._control_local.is_set():
                self._control_local.clear()
                return None
            version = await self._data_version()
            if version != self._control_seen_version:
                first = self._control_seen_version == -1
                self._control_seen_version = version
                if not first:
                    return None
            left = deadline - time.monotonic()
            if left <= 0:
                return frozenset()
            try:
                await asyncio.wait_for(self._control_local.wait(), min(_CONTROL_POLL_S, left))
            except TimeoutError:
                pass

    async def wait_for_events(self, timeout_s: float) -> list[EventNotice]:
        deadline = time.monotonic() + timeout_s
        interval = _POLL_MIN_S
        while True:
            if self._events_local.is_set():
                self._events_local.clear()
                return [EventNotice(None)]
            version = await self._data_version()
            if version != self._events_seen_version:
                self._events_seen_version = version
                return [EventNotice(None)]
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            try:
                await asyncio.wait_for(self._events_local.wait(), min(interval, left))
            except TimeoutError:
                pass
            interval = min(interval * 2, _EVENTS_POLL_MAX_S)

    async def close(self) -> None:
        """Stop watching and close the bell files (after the rings already queued). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            self._watch.close()
            self._watch = None

        def close_bells() -> None:
            for bell in self._bells.values():
                bell.close()

        if self._conn.closed:
            close_bells()
        else:
            with contextlib.suppress(StoreUnavailable):
                await self._conn.run(close_bells, "close doorbells")


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Signals] = SqliteSignals
