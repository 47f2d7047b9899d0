"""One SQLite connection on one dedicated thread, shared by a process's `SqliteStore`, `SqliteSignals` and
`SqliteLeases`.

The database runs in WAL mode; every write is a `BEGIN IMMEDIATE` transaction, so SQLite's file lock makes
writers take turns across processes and each conditional update sees one consistent database. sqlite3 calls
block, so the connection lives on one dedicated thread and a whole transaction runs per hop: the event loop
never waits on the database. One connection, not one per protocol: `PRAGMA data_version` (the signals' poll)
changes only for *other* connections' commits, and the leases' and the jobs' writes take turns on the same
thread anyway.

Writers queue for a sidecar lock (`flock` on `<db>-tenure-lock`) before `BEGIN IMMEDIATE`: the kernel hands it
over the moment it is released. Left to SQLite's busy handler, a waiting writer sleeps 1, 2, 5, 10, ... 100 ms
between attempts while the lock goes back to the process that just released it (measured with two workers:
0.5 ms vs 1.9 ms mean wait, one worker doing two thirds of the work); retrying the sidecar lock every 50 µs-1 ms
instead of blocking on it lost the gain. The wait is bounded like `busy_timeout` (30 s, then
`StoreUnavailable`), so a writer stuck behind a frozen process still fails and its worker still fences itself.
The sidecar lock only orders writers: SQLite's own lock still guards every write, so a lapse in it costs speed,
never correctness. `busy_timeout` stays for writers that do not take it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # not on POSIX: SQLite's busy handler alone orders the writers
    fcntl = None  # type: ignore[assignment]

from tenure.backends._queries import load_queries
from tenure.backends.sqlite.doorbell import BELLS, bell_path
from tenure.contracts.errors import ConfigError, StoreUnavailable

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
Q = load_queries("tenure.backends.sqlite", substitutions={"now": NOW})
T = TypeVar("T")

_BUSY_TIMEOUT_S = 30.0
_LOCK_SUFFIX = "-tenure-lock"  # the writers' sidecar lock, see the module docstring


def sqlite_path(url: str) -> str:
    """The file path of a `sqlite:///relative.db` or `sqlite:////absolute.db` URL."""
    if not url.startswith("sqlite:///"):
        raise ConfigError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
    path = url[len("sqlite:///") :]
    if not path:
        raise ConfigError("the SQLite URL names no file")
    return path


def database_files(path: str | os.PathLike[str]) -> list[str]:
    """Every file of a Tenure SQLite database, to delete it whole once no process has it open: the database,
    SQLite's own side files, the writers' sidecar lock and the doorbells."""
    path = os.fspath(path)
    return [path + suffix for suffix in ("", "-wal", "-shm", "-journal", _LOCK_SUFFIX)] + [
        bell_path(path, name) for name in BELLS
    ]


class ConnectionThread:
    """The connection thread seen as a blocking adapter with a bound of 1, for the metrics.

    Why a bound of 1 and not a `BlockingAdapter`: sqlite3 calls block, and one connection may be used by one
    thread at a time, so the store has exactly one executor thread; the thread *is* the slot, so no
    cancelled caller can free a phantom slot (seed 000's second promise holds by construction). Unlike the
    adapter, a call cancelled while still queued is dropped instead of shielded — right for a transaction
    whose caller is gone — and the queue needs no cap of its own: its callers are the worker's bounded
    loops and slots. What it lacked was visibility: these properties are read by
    `tenure.observability.metrics.watch_adapter` (any thread: the set is only copied, in one C call).
    """

    name = "sqlite"
    max_in_flight = 1
    failed_closed = 0
    rejected_queue_full = 0
    rejected_queue_timeout = 0

    def __init__(self) -> None:
        self._pending: set[Future[Any]] = set()
        self.completed = 0

    def track(self, future: Future[Any]) -> None:
        self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[Any]) -> None:
        self._pending.discard(future)
        self.completed += 1

    @property
    def in_flight(self) -> int:
        return sum(1 for f in tuple(self._pending) if f.running())

    @property
    def queued(self) -> int:
        return sum(1 for f in tuple(self._pending) if not f.running() and not f.done())


class SqliteConnection:
    """The connection and its thread. Open with `await SqliteConnection.open(url)`; `run` a function on the
    thread, and inside it `tx` (one write transaction) or `read`."""

    def __init__(self, path: str, synchronous: str = "FULL") -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigError(f"SQLite synchronous must be FULL or NORMAL, not {synchronous!r}")
        self.path = path
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenure-sqlite")
        self.offload = ConnectionThread()
        self._db: sqlite3.Connection | None = None
        self._turn: _WriterTurn | None = None  # the sidecar writer lock, see the module docstring
        self._closed = False

    @classmethod
    async def open(cls, url: str, synchronous: str = "FULL") -> SqliteConnection:
        """Open (creating if needed) the database file of `url` in WAL mode."""
        conn = cls(sqlite_path(url), synchronous)
        await conn.run(conn._open, "open")
        return conn

    def _open(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)
        db.row_factory = sqlite3.Row  # rows are read by column name, never by position
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {self._synchronous}")
        db.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        # Temporary tables and indices in memory: a claim's `IN (SELECT ...)` and every statement with a RETURNING
        # clause open one, and on a file they cost the job path's transaction 8% more CPU (bench/txn_cpu.py,
        # bench/README.md session 17). The store's reads are bounded (pinned indexes, LIMITs), so none grows large.
        db.execute("PRAGMA temp_store = MEMORY")
        if fcntl is not None:
            self._turn = _WriterTurn(self.path + _LOCK_SUFFIX)
        self._db = db

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def db(self) -> sqlite3.Connection:
        """The connection itself: use it on the connection thread only (inside `run`)."""
        db = self._db
        assert db is not None
        return db

    async def run(self, fn: Callable[[], T], what: str = "query") -> T:
        """Run `fn` on the connection thread; sqlite3 errors become `StoreUnavailable`."""
        if self._closed:
            raise StoreUnavailable("the store is closed")
        future = self._executor.submit(fn)
        self.offload.track(future)
        try:
            return await asyncio.wrap_future(future)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite failed during {what}: {exc}") from exc

    def submit(self, fn: Callable[[], None]) -> None:
        """Queue `fn` on the connection thread without waiting for it (after every call queued before it: the
        thread runs one call at a time, in order). Nothing happens once the connection is closed."""
        if not self._closed:
            self._executor.submit(fn)

    def tx(self, fn: Callable[[sqlite3.Connection], T], durable: bool = True) -> T:
        """Run `fn` in one write transaction on the connection thread. `durable=False` (claims only) commits
        without waiting for the WAL fsync when `synchronous` is FULL, like the PostgreSQL claim connection's
        `synchronous_commit = off`: the WAL is written in order, so the claim becomes durable with the next
        synchronous commit of any connection at the latest, the start CAS among them; a claim lost in a power
        cut is harmless (its worker is gone too, and the job is simply unclaimed)."""
        db = self.db
        relaxed = not durable and self._synchronous == "FULL"
        if relaxed:
            db.execute("PRAGMA synchronous = NORMAL")
        try:
            if self._turn is not None:
                self._turn.acquire(_BUSY_TIMEOUT_S)
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(db)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return out
            finally:
                if self._turn is not None:
                    self._turn.release()
        finally:
            if relaxed:  # restored whatever happened, or later durable commits would skip the fsync
                db.execute(f"PRAGMA synchronous = {self._synchronous}")

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` on the connection outside a write transaction (on the connection thread)."""
        return fn(self.db)

    def data_version(self) -> int:
        """`PRAGMA data_version`: changes when another connection commits (on the connection thread)."""
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    async def close(self) -> None:
        """Close the connection and stop its thread. Idempotent."""
        if self._closed:
            return

        def _close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._turn is not None:
                self._turn.close()
                self._turn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._closed = True
        self._executor.shutdown(wait=False)


class _WriterTurn:
    """The sidecar writer lock: a blocking `flock` (handed over by the kernel on release) with a bounded wait.

    `flock` cannot time out, so a contended acquire blocks on a helper thread while the connection thread waits
    for it at most `timeout`. A wait given up is marked abandoned under `_mu`; if the helper gets the lock later
    it gives it straight back. The lock belongs to the open file, not to a thread, so the connection thread holds
    what the helper took."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenure-sqlite-turn")
        self._mu = threading.Lock()
        self._abandoned = 0  # given-up waits still queued on the helper

    def acquire(self, timeout: float) -> None:
        with self._mu:
            abandoned = self._abandoned
        if not abandoned:  # otherwise queue behind them: one may hold the lock for an instant
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
        wait = _TurnWait()
        future = self._helper.submit(self._wait, wait)
        try:
            future.result(timeout)
            return
        except FutureTimeout:
            with self._mu:
                if wait.acquired:
                    return
                wait.abandoned = True
                self._abandoned += 1
        raise sqlite3.OperationalError(f"database is locked: no turn at the writer lock within {timeout:g} s")

    def _wait(self, wait: _TurnWait) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        with self._mu:
            if wait.abandoned:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                self._abandoned -= 1
            else:
                wait.acquired = True

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._helper.shutdown(wait=False, cancel_futures=True)
        os.close(self._fd)


class _TurnWait:
    __slots__ = ("abandoned", "acquired")

    def __init__(self) -> None:
        self.acquired = False
        self.abandoned = False


def split_sql(script: str) -> list[str]:
    """Split a migration file into statements (our migrations never put ';' inside a literal)."""
    body = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]
