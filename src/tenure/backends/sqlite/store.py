"""`Store` and `Leases` on SQLite, for one machine and any number of processes.

The database runs in WAL mode; every write is a `BEGIN IMMEDIATE` transaction, so SQLite's file lock makes
writers take turns across processes and each conditional update sees one consistent database. sqlite3 calls
block, so each store owns one connection on one dedicated thread and runs a whole transaction per hop:
the event loop never waits on the database.

Writers queue for a sidecar lock (`flock` on `<db>-tenure-lock`) before `BEGIN IMMEDIATE`: the kernel hands it
over the moment it is released. Left to SQLite's busy handler, a waiting writer sleeps 1, 2, 5, 10, ... 100 ms
between attempts while the lock goes back to the process that just released it (measured with two workers:
0.5 ms vs 1.9 ms mean wait, one worker doing two thirds of the work); retrying the sidecar lock every 50 µs-1 ms
instead of blocking on it lost the gain. The wait is bounded like `busy_timeout` (30 s, then
`StoreUnavailable`), so a writer stuck behind a frozen process still fails and its worker still fences itself.
The sidecar lock only orders writers: SQLite's own lock still guards every write, so a lapse in it costs speed,
never correctness. `busy_timeout` stays for writers that do not take it.

Wake-up is adaptive polling: a waiting worker checks `PRAGMA data_version` (which changes when another
connection commits) every few milliseconds after activity, backing off while idle. On Linux, doorbells
(`doorbell.py`) wake it at once: after a commit that made jobs claimable or sent a command, the store touches a
file next to the database that the waiters of every process watch with inotify. The poll stays as the floor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # not on POSIX: SQLite's busy handler alone orders the writers
    fcntl = None  # type: ignore[assignment]

from tenure.backends._queries import load_migrations, load_queries
from tenure.backends.signals import ChannelSignals
from tenure.backends.sqlite.doorbell import Bell, Watch, bell_path
from tenure.contracts.channel import Channel
from tenure.contracts.errors import (
    ConfigError,
    IdempotencyConflict,
    IllegalTransition,
    LeasesUnavailable,
    MigrationError,
    NotFound,
    StoreUnavailable,
)
from tenure.contracts.states import REQUEUEABLE, JobState, WorkerState
from tenure.contracts.store import LeaseRef, line_key, ticket_holder
from tenure.contracts.types import (
    AdmissionState,
    CircuitState,
    Claim,
    Command,
    ControlOutcome,
    Enqueued,
    Event,
    EventNotice,
    Execution,
    Fence,
    Finish,
    HeartbeatReply,
    Job,
    JobCounts,
    JobFilter,
    NewEvent,
    NewJob,
    Start,
    Started,
    SweepReport,
    WorkerInfo,
    new_id,
    new_token,
)

log = logging.getLogger("tenure.store.sqlite")

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
Q = load_queries("tenure.backends.sqlite", substitutions={"now": NOW})
MIGRATIONS = load_migrations("tenure.backends.sqlite")  # read at import, never on the event loop
_REQUEUEABLE = json.dumps(sorted(s.value for s in REQUEUEABLE))
T = TypeVar("T")

_BUSY_TIMEOUT_S = 30.0
_POLL_MIN_S = 0.002
_POLL_MAX_S = 0.025
_CONTROL_POLL_S = 0.1
# The gateway's event hub polls faster than workers do: its wake-up is a stream's latency, and a PRAGMA
# data_version on the connection thread costs microseconds.
_EVENTS_POLL_MAX_S = 0.005
_LOCK_SUFFIX = "-tenure-lock"  # the writers' sidecar lock, see the module docstring
_BELLS = ("jobs", "control")  # jobs: a job became claimable; control: a command or cancel was sent


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
        bell_path(path, name) for name in _BELLS
    ]


def _job(r: sqlite3.Row | tuple[Any, ...]) -> Job:
    return Job(
        id=r[0],
        tenant=r[1],
        agent=r[2],
        input=json.loads(r[3]),
        priority=r[4],
        requires=tuple(t for t in r[5].split(",") if t),
        state=JobState(r[6]),
        owner=r[7],
        epoch=r[8],
        execution_id=r[9],
        attempts=r[10],
        max_attempts=r[11],
        timeout_s=r[12],
        retry_safe=bool(r[13]),
        result=None if r[14] is None else json.loads(r[14]),
        error_code=r[15],
        error_message=r[16],
        created_at=r[17],
        updated_at=r[18],
        claimed_at=r[19],
        claim_expires_at=r[20],
        execution_started_at=r[21],
        next_attempt_at=r[22],
        deadline=r[23],
        cancel_requested_at=r[24],
        finished_at=r[25],
    )


class ConnectionThread:
    """The store's connection thread seen as a blocking adapter with a bound of 1, for the metrics.

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


class SqliteStore:
    """The Tenure store on one SQLite file. Create with `await SqliteStore.connect(url)`."""

    dialect = "sqlite"
    claim_carries_finishes = True

    def __init__(self, path: str, synchronous: str = "FULL", signals: ChannelSignals | None = None) -> None:
        self._path = path
        self._signals = signals
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenure-sqlite")
        self.offload = ConnectionThread()
        self._db: sqlite3.Connection | None = None
        self._turn: _WriterTurn | None = None  # the sidecar writer lock, see the module docstring
        self._seen_version = -1
        self._wake = asyncio.Event()
        self._closed = False
        # Live events on SQLite are a tail of the history: `data_version` tells of other connections' commits,
        # and this flag of our own (an inline worker shares the gateway's store).
        self._events_seen_version = -1
        self._events_local = asyncio.Event()
        self._control_seen_version = -1
        self._control_local = asyncio.Event()
        # Doorbells (see doorbell.py): rung after commits that waiters elsewhere act on, watched while waiting.
        self._bells: dict[str, Bell] = {}
        self._watch: Watch | None = None
        self._watched: set[str] = set()

    @classmethod
    async def connect(cls, url: str, synchronous: str = "FULL", channel: Channel | None = None) -> SqliteStore:
        """Open (creating if needed) the database file in WAL mode. Does not migrate (see `migrate`). With a
        `channel`, live hints travel over it instead of being polled (the store owns and closes it)."""
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigError(f"SQLite synchronous must be FULL or NORMAL, not {synchronous!r}")
        store = cls(sqlite_path(url), synchronous, None if channel is None else ChannelSignals(channel))
        await store._run(store._open)
        return store

    def _open(self) -> None:
        Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {self._synchronous}")
        db.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
        if fcntl is not None:
            self._turn = _WriterTurn(self._path + _LOCK_SUFFIX)
        for name in _BELLS:
            try:
                self._bells[name] = Bell(bell_path(self._path, name))
            except OSError as exc:  # e.g. a read-only directory: the other processes' waiters poll
                log.debug("no %s doorbell for %s: %s", name, self._path, exc)
        self._db = db

    async def _run(self, fn: Callable[[], T], what: str = "query") -> T:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        future = self._executor.submit(fn)
        self.offload.track(future)
        try:
            return await asyncio.wrap_future(future)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite failed during {what}: {exc}") from exc

    async def run_between_transactions(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the connection thread, where no transaction of this store can be open. Fault
        injection uses it to freeze the process without holding SQLite's write lock (a process frozen
        mid-transaction would stall every writer on the machine until it resumes)."""
        return await self._run(fn, "run_between_transactions")

    def _tx(self, fn: Callable[[sqlite3.Connection], T], durable: bool = True) -> T:
        """Run `fn` in one write transaction on the connection thread. `durable=False` (claims only) commits
        without waiting for the WAL fsync when `synchronous` is FULL, like the PostgreSQL claim connection's
        `synchronous_commit = off`: the WAL is written in order, so the claim becomes durable with the next
        synchronous commit of any connection at the latest, the start CAS among them; a claim lost in a power
        cut is harmless (its worker is gone too, and the job is simply unclaimed)."""
        db = self._db
        assert db is not None
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

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        assert db is not None
        return fn(db)

    async def close(self) -> None:
        if self._closed:
            return
        if self._signals is not None:
            await self._signals.close()

        def _close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._turn is not None:
                self._turn.close()
                self._turn = None
            for bell in self._bells.values():
                bell.close()

        if self._watch is not None:
            self._watch.close()
            self._watch = None
        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._closed = True
        self._executor.shutdown(wait=False)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def schema_version(self) -> int:
        def fn(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT name FROM sqlite_master WHERE name = 'tenure_migrations'").fetchone()
            if row is None:
                return 0
            return int(db.execute("SELECT coalesce(max(version), 0) FROM tenure_migrations").fetchone()[0])

        return await self._run(lambda: self._read(fn), "schema_version")

    async def migrate(self) -> int:
        migrations = MIGRATIONS

        def fn(db: sqlite3.Connection) -> int:
            db.execute(
                "CREATE TABLE IF NOT EXISTS tenure_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at REAL NOT NULL)"
            )
            current = int(db.execute("SELECT coalesce(max(version), 0) FROM tenure_migrations").fetchone()[0])
            if current > len(migrations):
                raise MigrationError(
                    f"the database schema is at version {current}, newer than this code knows "
                    f"({len(migrations)}); upgrade tenure"
                )
            for version, name, sql in migrations[current:]:
                for statement in _split_sql(sql):
                    try:
                        db.execute(statement)
                    except sqlite3.Error as exc:
                        raise MigrationError(f"migration {version:04d}_{name} failed: {exc}") from exc
                db.execute(
                    f"INSERT INTO tenure_migrations (version, name, applied_at) VALUES (?, ?, {NOW})",
                    (version, name),
                )
            return len(migrations)

        return await self._run(lambda: self._tx(fn), "migrate")

    async def server_version(self) -> str:
        """The SQLite library's version (for `tenure doctor`)."""
        return sqlite3.sqlite_version

    @staticmethod
    def latest_schema_version() -> int:
        """The schema version this code migrates to."""
        return len(MIGRATIONS)

    async def server_time(self) -> float:
        return await self._run(lambda: float(self._read(lambda db: db.execute(Q["server_time"]).fetchone()[0])))

    # -- admission ---------------------------------------------------------------------------------------------
    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Enqueued]:
        if not jobs:
            return []

        def fn(db: sqlite3.Connection) -> list[Enqueued]:
            out = []
            for j in jobs:
                cur = db.execute(
                    Q["insert_job"],
                    (
                        j.id,
                        j.tenant,
                        j.agent,
                        j.input_json,
                        j.priority,
                        ",".join(j.requires),
                        j.idem_digest,
                        j.request_fingerprint,
                        j.deadline_s,
                        j.max_attempts,
                        j.timeout_s,
                        int(j.retry_safe),
                    ),
                )
                row = cur.fetchone()
                if row is not None:
                    out.append(Enqueued(_job(row), True))
                    continue
                *columns, _digest, fingerprint = db.execute(Q["jobs_by_idem"], (j.tenant, j.idem_digest)).fetchone()
                existing = _job(tuple(columns))
                if fingerprint != j.request_fingerprint:
                    raise IdempotencyConflict(
                        "this idempotency key was already used for a different request", existing_job_id=existing.id
                    )
                out.append(Enqueued(existing, False))
            return out

        out = await self._run(lambda: self._tx(fn), "enqueue")
        self._jobs_changed()
        return out

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job | None:
        row = await self._run(lambda: self._read(lambda db: db.execute(Q["get_job"], (job_id, tenant)).fetchone()))
        return None if row is None else _job(row)

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        args = (flt.tenant, flt.state.value if flt.state else None, flt.agent, flt.before, flt.limit)
        rows = await self._run(lambda: self._read(lambda db: db.execute(Q["list_jobs"], args).fetchall()))
        return [_job(r) for r in rows]

    async def requeue(self, job_id: str, tenant: str | None = None) -> Job:
        def fn(db: sqlite3.Connection) -> Job:
            row = db.execute(Q["requeue_job"], (job_id, tenant, _REQUEUEABLE)).fetchone()
            if row is not None:
                db.execute(Q["insert_event_next"], (job_id, row[1], None, "job.requeued", "{}"))
            job = db.execute(Q["get_job"], (job_id, tenant)).fetchone()
            if job is None:
                raise NotFound(f"no job {job_id}")
            if row is None:
                raise IllegalTransition(f"job {job_id} is {job[6]}; only a finished, unsuccessful job can be requeued")
            return _job(job)

        job = await self._run(lambda: self._tx(fn), "requeue")
        self._jobs_changed()
        self._events_changed([job_id])
        return job

    # -- ownership -----------------------------------------------------------------------------------------------
    async def claim(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[Claim]:
        if limit <= 0:
            return []
        token = new_token()
        args = (worker_id, json.dumps(list(agents)), json.dumps(list(capabilities)), limit, ttl_s, token)

        def fn() -> list[Any]:
            db = self._db
            assert db is not None
            # Probe without the write lock first: an idle poll must not queue behind busy writers.
            if db.execute(Q["has_claimable"]).fetchone() is None:
                return []
            return self._tx(lambda db: db.execute(Q["claim_jobs"], args).fetchall(), durable=False)

        rows = await self._run(fn, "claim")
        return [Claim(Fence(r[0], r[1], token), r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8], r[9], r[10]) for r in rows]

    async def claim_and_start(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[tuple[Claim, Started]]:
        if limit <= 0:
            return []

        def fn() -> list[tuple[Claim, Started]]:
            db = self._db
            assert db is not None
            # Probe without the write lock first, as `claim` does.
            if db.execute(Q["has_claimable"]).fetchone() is None:
                return []
            return self._tx(lambda db: _claim_and_start_in(db, worker_id, agents, capabilities, limit, ttl_s))

        out = await self._run(fn, "claim_and_start")
        if out:
            self._events_changed(s.fence.job_id for _, s in out)
        return out

    async def finish_and_claim(
        self,
        worker_id: str,
        finishes: Sequence[Finish],
        agents: Sequence[str],
        capabilities: Sequence[str],
        limit: int,
        ttl_s: float,
    ) -> tuple[list[str], list[tuple[Claim, Started]]]:
        if not finishes:
            return [], await self.claim_and_start(worker_id, agents, capabilities, limit, ttl_s)
        if limit <= 0:
            return await self.finish(worker_id, finishes), []

        def tx(db: sqlite3.Connection) -> tuple[list[str], list[tuple[Claim, Started]]]:
            done = _finish_in(db, worker_id, finishes)
            return done, _claim_and_start_in(db, worker_id, agents, capabilities, limit, ttl_s)

        done, pairs = await self._run(lambda: self._tx(tx), "finish_and_claim")
        self._events_changed([*done, *(s.fence.job_id for _, s in pairs)])
        return done, pairs

    async def start(self, worker_id: str, starts: Sequence[Start]) -> list[Started]:
        if not starts:
            return []
        out = await self._run(lambda: self._tx(lambda db: _start_in(db, worker_id, starts)), "start")
        self._events_changed(s.fence.job_id for s in out)
        return out

    async def finish(self, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
        if not finishes:
            return []
        done = await self._run(lambda: self._tx(lambda db: _finish_in(db, worker_id, finishes)), "finish")
        self._events_changed(done)
        return done

    async def append_events(self, events: Sequence[NewEvent]) -> set[str]:
        if not events:
            return set()

        def fn(db: sqlite3.Connection) -> set[str]:
            owning: dict[str, bool] = {}
            rejected = set()
            for e in events:
                f = e.fence
                ok = owning.get(f.job_id)
                if ok is None:
                    ok = db.execute(Q["fence_owns"], (f.job_id, f.epoch, f.token)).fetchone() is not None
                    owning[f.job_id] = ok
                if not ok:
                    rejected.add(f.job_id)
                    continue
                db.execute(Q["insert_event"], (f.job_id, f.epoch, e.seq, e.execution_id, e.type, e.payload_json))
            return rejected

        rejected = await self._run(lambda: self._tx(fn), "append_events")
        self._events_changed({e.fence.job_id for e in events} - rejected)
        return rejected

    async def release_claims(self, worker_id: str, fences: Sequence[Fence]) -> list[str]:
        if not fences:
            return []

        def fn(db: sqlite3.Connection) -> list[str]:
            return [
                f.job_id
                for f in fences
                if db.execute(Q["release_claim"], (f.job_id, worker_id, f.epoch, f.token)).rowcount == 1
            ]

        out = await self._run(lambda: self._tx(fn), "release_claims")
        self._jobs_changed()
        return out

    async def heartbeat(
        self, worker_id: str, state: WorkerState, in_flight: int, held: Sequence[Fence], ttl_s: float
    ) -> HeartbeatReply:
        def fn(db: sqlite3.Connection) -> HeartbeatReply:
            db.execute(Q["heartbeat_worker"], (state.value, in_flight, worker_id))
            renewed, cancel = set(), set()
            for f in held:
                row = db.execute(Q["heartbeat_claim"], (f.job_id, worker_id, f.epoch, f.token, ttl_s)).fetchone()
                if row is not None:
                    renewed.add(f.job_id)
                    if row[0] is not None:
                        cancel.add(f.job_id)
            return HeartbeatReply(frozenset(renewed), frozenset(cancel))

        return await self._run(lambda: self._tx(fn), "heartbeat")

    # -- registry -----------------------------------------------------------------------------------------------
    async def register_worker(self, info: WorkerInfo) -> None:
        args = (
            info.id,
            info.host,
            info.pid,
            info.concurrency,
            json.dumps(list(info.agents)),
            json.dumps(list(info.capabilities)),
            info.state.value,
        )
        await self._run(lambda: self._tx(lambda db: db.execute(Q["register_worker"], args)), "register_worker")

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        args = (worker_id, state.value)
        await self._run(lambda: self._tx(lambda db: db.execute(Q["set_worker_state"], args)), "set_worker_state")

    async def list_workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        rows = await self._run(lambda: self._read(lambda db: db.execute(Q["list_workers"], (int(include_gone),)).fetchall()))
        return [
            WorkerInfo(
                id=r[0],
                host=r[1],
                pid=r[2],
                concurrency=r[3],
                agents=tuple(json.loads(r[4])),
                capabilities=tuple(json.loads(r[5])),
                state=WorkerState(r[6]),
                in_flight=r[7],
                started_at=r[8],
                last_heartbeat=r[9],
                jobs_held=tuple(json.loads(r[10])),
            )
            for r in rows
        ]

    # -- history ------------------------------------------------------------------------------------------------
    async def read_events(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[Event]:
        epoch, seq = after if after is not None else (-1, -1)
        rows = await self._run(
            lambda: self._read(lambda db: db.execute(Q["read_events"], (job_id, epoch, seq, limit)).fetchall())
        )
        return [Event(job_id, r[0], r[1], r[2], r[3], None if r[4] is None else json.loads(r[4]), r[5]) for r in rows]

    async def read_events_many(self, cursors: Sequence[tuple[str, tuple[int, int] | None]], limit: int) -> list[Event]:
        if not cursors:
            return []

        def fn(db: sqlite3.Connection) -> list[Event]:
            out = []
            for job_id, after in cursors:
                epoch, seq = after if after is not None else (-1, -1)
                for r in db.execute(Q["read_events_many"], (job_id, epoch, seq, limit)).fetchall():
                    out.append(Event(job_id, r[0], r[1], r[2], r[3], None if r[4] is None else json.loads(r[4]), r[5]))
            return out

        return await self._run(lambda: self._read(fn), "read_events_many")

    async def list_executions(self, job_id: str) -> list[Execution]:
        rows = await self._run(lambda: self._read(lambda db: db.execute(Q["list_executions"], (job_id,)).fetchall()))
        return [
            Execution(r[0], r[1], r[2], r[3], r[4], r[5], r[6], None if r[7] is None else json.loads(r[7])) for r in rows
        ]

    # -- sweeper ---------------------------------------------------------------------------------------------------
    async def sweep(self, worker_ttl_s: float) -> SweepReport:
        def fn(db: sqlite3.Connection) -> SweepReport:
            report = SweepReport()
            report.released = [r[0] for r in db.execute(Q["sweep_release_expired"]).fetchall()]
            for job_id, epoch, execution_id, owner, started_at, retry_safe, attempts, max_attempts in db.execute(
                Q["sweep_find_lost"]
            ).fetchall():
                if not retry_safe:
                    state, bucket, kind = "lost", report.lost, "job.lost"
                elif attempts < max_attempts:
                    state, bucket, kind = "queued", report.requeued, "execution.lost"
                else:
                    state, bucket, kind = "dead", report.dead, "job.dead"
                db.execute(Q["sweep_mark_lost"], (job_id, state))
                db.execute(Q["insert_execution"], (execution_id, job_id, epoch, owner, started_at, "lost", None))
                payload = json.dumps({"state": state, "error_code": "owner_lost", "worker_id": owner})
                db.execute(Q["insert_event_next"], (job_id, epoch, execution_id, kind, payload))
                bucket.append(job_id)
            for job_id, epoch in db.execute(Q["sweep_expire"]).fetchall():
                payload = json.dumps({"state": "expired", "error_code": "deadline_exceeded"})
                db.execute(Q["insert_event_next"], (job_id, epoch, None, "job.expired", payload))
                report.expired.append(job_id)
            report.due = [r[0] for r in db.execute(Q["sweep_due"]).fetchall()]
            report.workers_gone = [r[0] for r in db.execute(Q["sweep_workers_gone"], (worker_ttl_s,)).fetchall()]
            return report

        report = await self._run(lambda: self._tx(fn), "sweep")
        self._events_changed(report.lost + report.requeued + report.dead + report.expired)
        if report.released or report.requeued or report.due:
            self._jobs_changed()
        return report

    # -- metrics -----------------------------------------------------------------------------------------------------
    async def count_live_jobs(self) -> JobCounts:
        rows = await self._run(lambda: self._read(lambda db: db.execute(Q["count_live_jobs"]).fetchall()), "count")
        return JobCounts.from_rows(rows)

    # -- wake-up ----------------------------------------------------------------------------------------------------
    def _jobs_changed(self) -> None:
        """After a commit that made jobs claimable: this process's workers stop waiting at once, and the other
        processes' workers through the doorbell."""
        self._wake.set()
        self._ring("jobs")

    def _ring(self, name: str) -> None:
        """Ring on the connection thread (a file write, kept off the event loop), after the commit that called
        for it: the thread runs one call at a time, in order. Not awaited: a ring is a hint."""
        bell = self._bells.get(name)
        if bell is not None and not self._closed:
            self._executor.submit(bell.ring)

    def _watch_bell(self, name: str, event: asyncio.Event) -> None:
        """Let the `name` doorbell set `event` (once per store; nothing where inotify is missing)."""
        if name in self._watched:
            return
        self._watched.add(name)
        if self._watch is None:
            self._watch = Watch.open()
        if self._watch is not None:
            self._watch.add(bell_path(self._path, name), event)

    def _data_version(self) -> int:
        db = self._db
        assert db is not None
        return int(db.execute("PRAGMA data_version").fetchone()[0])

    async def wait_for_jobs(self, timeout_s: float) -> None:
        self._watch_bell("jobs", self._wake)
        deadline = time.monotonic() + timeout_s
        interval = _POLL_MIN_S
        while True:
            if self._wake.is_set():
                self._wake.clear()
                return
            version = await self._run(self._data_version, "poll")
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

    # -- the gateway's side ------------------------------------------------------------------------------------------
    async def queue_depth(self, tenant: str) -> tuple[int, int]:
        row = await self._run(lambda: self._read(lambda db: db.execute(Q["queue_depth"], (tenant,)).fetchone()))
        return int(row[0]), int(row[1])

    async def find_idempotent(self, tenant: str, idem_digest: bytes) -> tuple[str, bytes] | None:
        row = await self._run(lambda: self._read(lambda db: db.execute(Q["find_by_idem"], (tenant, idem_digest)).fetchone()))
        return None if row is None else (row[0], bytes(row[1]))

    async def record_circuit_failure(self, key: str) -> None:
        def fn(db: sqlite3.Connection) -> None:
            db.execute(Q["circuit_trim"], (key,))
            db.execute(Q["circuit_record"], (key,))

        await self._run(lambda: self._tx(fn), "record_circuit_failure")

    async def circuit_state(self, key: str, threshold: int, window_s: float, open_s: float) -> CircuitState:
        count, latest, now = await self._run(
            lambda: self._read(lambda db: db.execute(Q["circuit_window"], (key, window_s)).fetchone())
        )
        return CircuitState.from_window(count, latest, now, threshold, open_s)

    async def admission_state(
        self, tenant: str, circuit_key: str, threshold: int, window_s: float, open_s: float
    ) -> AdmissionState:
        args = (tenant, circuit_key, window_s)
        total, mine, failures, latest, now = await self._run(
            lambda: self._read(lambda db: db.execute(Q["admission_state"], args).fetchone())
        )
        return AdmissionState(int(total), int(mine), CircuitState.from_window(failures, latest, now, threshold, open_s))

    async def cancel(self, job_id: str, tenant: str | None = None) -> ControlOutcome:
        def fn(db: sqlite3.Connection) -> ControlOutcome:
            row = db.execute(Q["cancel_unstarted"], (job_id, tenant)).fetchone()
            if row is not None:
                payload = json.dumps({"state": "cancelled", "error_code": "cancelled"})
                db.execute(Q["insert_event_next"], (job_id, row[0], None, "job.cancelled", payload))
                return ControlOutcome.ACCEPTED
            if db.execute(Q["cancel_request"], (job_id, tenant)).fetchone() is not None:
                return ControlOutcome.REQUESTED
            if db.execute(Q["job_state"], (job_id, tenant)).fetchone() is None:
                return ControlOutcome.UNKNOWN
            return ControlOutcome.ALREADY_FINISHED

        out = await self._run(lambda: self._tx(fn), "cancel")
        if out is ControlOutcome.ACCEPTED:
            self._events_changed([job_id])
        elif out is ControlOutcome.REQUESTED:
            self._control_sent([job_id])
        return out

    async def send_command(self, job_id: str, tenant: str | None, kind: str, payload_json: str) -> ControlOutcome:
        def fn(db: sqlite3.Connection) -> ControlOutcome:
            row = db.execute(Q["job_state"], (job_id, tenant)).fetchone()
            if row is None:
                return ControlOutcome.UNKNOWN
            if JobState(row[0]).terminal:
                return ControlOutcome.ALREADY_FINISHED
            db.execute(Q["insert_command"], (job_id, kind, payload_json))
            return ControlOutcome.REQUESTED

        out = await self._run(lambda: self._tx(fn), "send_command")
        if out is ControlOutcome.REQUESTED:
            self._control_sent([job_id])
        return out

    async def read_commands(self, job_id: str, after_seq: int) -> list[Command]:
        rows = await self._run(lambda: self._read(lambda db: db.execute(Q["read_commands"], (job_id, after_seq)).fetchall()))
        return [Command(job_id, r[0], r[1], None if r[2] is None else json.loads(r[2]), r[3]) for r in rows]

    async def set_waiting(self, event: NewEvent, waiting: bool) -> bool:
        f = event.fence
        to, expected = ("waiting", "running") if waiting else ("running", "waiting")

        def fn(db: sqlite3.Connection) -> bool:
            args = (f.job_id, f.epoch, f.token, event.execution_id, to, expected)
            if db.execute(Q["set_waiting"], args).rowcount != 1:
                return False
            db.execute(Q["insert_event"], (f.job_id, f.epoch, event.seq, event.execution_id, event.type, event.payload_json))
            return True

        ok = await self._run(lambda: self._tx(fn), "set_waiting")
        if ok:
            self._events_changed([f.job_id])
        return ok

    # -- live hints: polled here, or over the channel -----------------------------------------------------------
    def _events_changed(self, job_ids: Iterable[str]) -> None:
        """After a commit: these jobs' histories grew (this process's readers learn at once, others from
        `data_version` — or all of them from the channel)."""
        if self._signals is not None:
            self._signals.events_changed(job_ids)
        else:
            self._events_local.set()

    def _control_sent(self, job_ids: Iterable[str]) -> None:
        if self._signals is not None:
            self._signals.control_sent(job_ids)
        else:
            self._control_local.set()
            self._ring("control")

    async def wait_for_control(self, timeout_s: float) -> frozenset[str] | None:
        if self._signals is not None:
            return await self._signals.wait_for_control(timeout_s)
        # SQLite has no NOTIFY: any commit by another connection may be a command. Polled at most every
        # _CONTROL_POLL_S, so an owner costs a few cheap reads a second, not one per commit; the control doorbell
        # wakes it at once when a command is sent.
        self._watch_bell("control", self._control_local)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._control_local.is_set():
                self._control_local.clear()
                return None
            version = await self._run(self._data_version, "poll")
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

    async def control_state(self, job_ids: Sequence[str]) -> tuple[frozenset[str], dict[str, int]]:
        def fn(db: sqlite3.Connection) -> tuple[frozenset[str], dict[str, int]]:
            rows = db.execute(Q["control_cancel"], (json.dumps(list(job_ids)),)).fetchall()
            return frozenset(r[0] for r in rows if r[1]), {r[0]: int(r[2]) for r in rows if r[2]}

        if not job_ids:
            return frozenset(), {}
        return await self._run(lambda: self._read(fn), "control_state")

    async def wait_for_events(self, timeout_s: float) -> list[EventNotice]:
        if self._signals is not None:
            return await self._signals.wait_for_events(timeout_s)
        deadline = time.monotonic() + timeout_s
        interval = _POLL_MIN_S
        while True:
            if self._events_local.is_set():
                self._events_local.clear()
                return [EventNotice(None)]
            version = await self._run(self._data_version, "poll")
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

    # -- leases -------------------------------------------------------------------------------------------------------
    async def _lease_run(self, fn: Callable[[], T], what: str) -> T:
        """Run a lease operation; its failures are `LeasesUnavailable` (the quota layer's fail policy keys on
        it), still a `StoreUnavailable` for callers that guard the whole store."""
        try:
            return await self._run(fn, what)
        except StoreUnavailable as exc:
            raise LeasesUnavailable(str(exc)) from (exc.__cause__ or exc)

    async def acquire(self, key: str, holder: str, limit: int, ttl_s: float) -> bool:
        _check_lease_args(limit, ttl_s)

        def fn(db: sqlite3.Connection) -> bool:
            db.execute(Q["lease_purge"], (key,))
            if db.execute(Q["lease_refresh"], (key, holder, ttl_s)).rowcount == 1:
                return True
            if db.execute(Q["lease_count"], (key,)).fetchone()[0] >= limit:
                return False
            db.execute(Q["lease_insert"], (key, holder, ttl_s))
            return True

        return await self._lease_run(lambda: self._tx(fn), "lease acquire")

    async def renew(self, held: Sequence[LeaseRef], ttl_s: float) -> list[LeaseRef]:
        _check_lease_args(0, ttl_s)
        if not held:
            return []

        def fn(db: sqlite3.Connection) -> list[LeaseRef]:
            return [h for h in held if db.execute(Q["lease_renew"], (h.key, h.holder, ttl_s)).rowcount != 1]

        return await self._lease_run(lambda: self._tx(fn), "lease renew")

    async def release(self, key: str, holder: str) -> None:
        await self._lease_run(lambda: self._tx(lambda db: db.execute(Q["lease_release"], (key, holder))), "lease release")

    async def acquire_in_line(self, key: str, ticket: str, limit: int, ttl_s: float) -> bool:
        _check_lease_args(limit, ttl_s)
        line, holder = line_key(key), ticket_holder(ticket)

        def fn(db: sqlite3.Connection) -> bool:
            db.execute(Q["lease_purge"], (key,))
            if db.execute(Q["lease_refresh"], (key, holder, ttl_s)).rowcount != 1:
                free = limit - db.execute(Q["lease_count"], (key,)).fetchone()[0]
                if free <= 0 or db.execute(Q["lease_line_ahead"], (line, ticket)).fetchone()[0] >= free:
                    db.execute(Q["lease_upsert"], (line, ticket, ttl_s))
                    return False
                db.execute(Q["lease_insert"], (key, holder, ttl_s))
            db.execute(Q["lease_release"], (line, ticket))
            return True

        return await self._lease_run(lambda: self._tx(fn), "lease acquire")

    async def release_and_hand_over(self, key: str, holder: str, limit: int, ttl_s: float) -> list[str]:
        _check_lease_args(limit, ttl_s)
        line = line_key(key)

        def fn(db: sqlite3.Connection) -> list[str]:
            db.execute(Q["lease_release"], (key, holder))
            db.execute(Q["lease_purge"], (key,))
            free = limit - db.execute(Q["lease_count"], (key,)).fetchone()[0]
            if free <= 0:
                return []
            served = db.execute(Q["lease_line_oldest"], (line, free)).fetchall()
            for ticket, ticket_expires_at in served:
                # Until the ticket's own expiry, not a fresh TTL: the waiter may have died since its last renewal
                # (see RELEASE_AND_HAND_OVER in backends/redis/_scripts.py).
                db.execute(Q["lease_hand_over"], (key, ticket_holder(ticket), ttl_s, ticket_expires_at))
                db.execute(Q["lease_release"], (line, ticket))
            return [ticket for ticket, _ in served]

        return await self._lease_run(lambda: self._tx(fn), "lease release")

    async def holders(self, key: str) -> list[str]:
        rows = await self._lease_run(
            lambda: self._read(lambda db: db.execute(Q["lease_holders"], (key,)).fetchall()), "lease holders"
        )
        return [r[0] for r in rows]


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


def _check_lease_args(limit: int, ttl_s: float) -> None:
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")


def _split_sql(script: str) -> list[str]:
    """Split a migration file into statements (our migrations never put ';' inside a literal)."""
    body = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def _finish_in(db: sqlite3.Connection, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
    """The finish CAS of each execution, inside the caller's write transaction; appends the finishing event and
    the execution record. Returns the job ids whose finish matched."""
    done = []
    for x in finishes:
        f = x.fence
        row = db.execute(
            Q["finish_execution"],
            (
                f.job_id,
                x.execution_id,
                f.epoch,
                f.token,
                x.state.value,
                x.result_json,
                x.error_code,
                x.error_message,
                x.retry_delay_s,
            ),
        ).fetchone()
        if row is None:
            continue
        retry = x.state is JobState.SCHEDULED
        payload = json.dumps(
            {
                "state": x.state.value,
                "result": None if x.result_json is None else json.loads(x.result_json),
                "error_code": x.error_code,
                "error": x.error_message,
                "next_attempt_at": row[0],
            }
        )
        db.execute(
            Q["insert_event"],
            (f.job_id, f.epoch, x.seq, x.execution_id, "execution.retrying" if retry else f"job.{x.state.value}", payload),
        )
        db.execute(
            Q["insert_execution"],
            (x.execution_id, f.job_id, f.epoch, worker_id, x.started_at, "failed" if retry else x.state.value, x.usage_json),
        )
        if x.error_code == "timeout":  # the agent's circuit breaker counts timeouts
            db.execute(Q["circuit_record_job_timeout"], (f.job_id,))
        done.append(f.job_id)
    return done


def _claim_and_start_in(
    db: sqlite3.Connection,
    worker_id: str,
    agents: Sequence[str],
    capabilities: Sequence[str],
    limit: int,
    ttl_s: float,
) -> list[tuple[Claim, Started]]:
    """The claim CAS and then the start CAS of each job it claimed, inside the caller's write transaction."""
    token = new_token()
    args = (worker_id, json.dumps(list(agents)), json.dumps(list(capabilities)), limit, ttl_s, token)
    claims = [
        Claim(Fence(r[0], r[1], token), r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8], r[9], r[10])
        for r in db.execute(Q["claim_jobs"], args).fetchall()
    ]
    by_job = {c.fence.job_id: c for c in claims}
    started = _start_in(db, worker_id, [Start(c.fence, new_id()) for c in claims])
    return [(by_job[s.fence.job_id], s) for s in started]


def _start_in(db: sqlite3.Connection, worker_id: str, starts: Sequence[Start]) -> list[Started]:
    """The start CAS of each claim, inside the caller's write transaction; appends `execution.started`."""
    out = []
    for s in starts:
        f = s.fence
        row = db.execute(Q["start_execution"], (f.job_id, worker_id, f.epoch, f.token, s.execution_id)).fetchone()
        if row is None:
            continue
        attempt, started_at = row
        payload = json.dumps({"worker_id": worker_id, "attempt": attempt})
        db.execute(Q["insert_event"], (f.job_id, f.epoch, 1, s.execution_id, "execution.started", payload))
        out.append(Started(f, s.execution_id, started_at, attempt))
    return out
