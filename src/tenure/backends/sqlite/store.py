"""`Store` and `Leases` on SQLite, for one machine and any number of processes.

The database runs in WAL mode; every write is a `BEGIN IMMEDIATE` transaction, so SQLite's file lock makes
writers take turns across processes and each conditional update sees one consistent database. sqlite3 calls
block, so each store owns one connection on one dedicated thread and runs a whole transaction per hop:
the event loop never waits on the database.

Wake-up is adaptive polling: a waiting worker checks `PRAGMA data_version` (which changes when another
connection commits) every few milliseconds after activity, backing off while idle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from tenure.backends._queries import load_migrations, load_queries
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
from tenure.contracts.store import LeaseRef
from tenure.contracts.types import (
    Claim,
    Enqueued,
    Event,
    Execution,
    Fence,
    Finish,
    HeartbeatReply,
    Job,
    JobFilter,
    NewEvent,
    NewJob,
    Start,
    Started,
    SweepReport,
    WorkerInfo,
    new_token,
)

log = logging.getLogger("tenure.store.sqlite")

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
Q = load_queries("tenure.backends.sqlite", substitutions={"now": NOW})
MIGRATIONS = load_migrations("tenure.backends.sqlite")  # read at import, never on the event loop
_REQUEUEABLE = json.dumps(sorted(s.value for s in REQUEUEABLE))
T = TypeVar("T")

_POLL_MIN_S = 0.002
_POLL_MAX_S = 0.025


def sqlite_path(url: str) -> str:
    """The file path of a `sqlite:///relative.db` or `sqlite:////absolute.db` URL."""
    if not url.startswith("sqlite:///"):
        raise ConfigError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
    path = url[len("sqlite:///") :]
    if not path:
        raise ConfigError("the SQLite URL names no file")
    return path


def _job(r: sqlite3.Row | tuple[Any, ...]) -> Job:
    return Job(
        id=r[0], tenant=r[1], agent=r[2], input=json.loads(r[3]), priority=r[4],
        requires=tuple(t for t in r[5].split(",") if t), state=JobState(r[6]), owner=r[7], epoch=r[8],
        execution_id=r[9], attempts=r[10], max_attempts=r[11], timeout_s=r[12], retry_safe=bool(r[13]),
        result=None if r[14] is None else json.loads(r[14]), error_code=r[15], error_message=r[16],
        created_at=r[17], updated_at=r[18], claimed_at=r[19], claim_expires_at=r[20],
        execution_started_at=r[21], next_attempt_at=r[22], deadline=r[23], cancel_requested_at=r[24],
        finished_at=r[25],
    )


class SqliteStore:
    """The Tenure store on one SQLite file. Create with `await SqliteStore.connect(url)`."""

    dialect = "sqlite"

    def __init__(self, path: str, synchronous: str = "FULL") -> None:
        self._path = path
        self._synchronous = synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenure-sqlite")
        self._db: sqlite3.Connection | None = None
        self._seen_version = -1
        self._wake = asyncio.Event()
        self._closed = False

    @classmethod
    async def connect(cls, url: str, synchronous: str = "FULL") -> SqliteStore:
        """Open (creating if needed) the database file in WAL mode. Does not migrate (see `migrate`)."""
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigError(f"SQLite synchronous must be FULL or NORMAL, not {synchronous!r}")
        store = cls(sqlite_path(url), synchronous)
        await store._run(store._open)
        return store

    def _open(self) -> None:
        Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=30.0)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {self._synchronous}")
        db.execute("PRAGMA busy_timeout = 30000")
        self._db = db

    async def _run(self, fn: Callable[[], T], what: str = "query") -> T:
        if self._closed:
            raise StoreUnavailable("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite failed during {what}: {exc}") from exc

    async def run_between_transactions(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the connection thread, where no transaction of this store can be open. Fault
        injection uses it to freeze the process without holding SQLite's write lock (a process frozen
        mid-transaction would stall every writer on the machine until it resumes)."""
        return await self._run(fn, "run_between_transactions")

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one write transaction on the connection thread."""
        db = self._db
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        assert db is not None
        return fn(db)

    async def close(self) -> None:
        if self._closed:
            return

        def _close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

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
                    (j.id, j.tenant, j.agent, j.input_json, j.priority, ",".join(j.requires), j.idem_digest,
                     j.request_fingerprint, j.deadline_s, j.max_attempts, j.timeout_s, int(j.retry_safe)),
                )
                if cur.rowcount == 1:
                    out.append(Enqueued(j.id, True))
                    continue
                job_id, fingerprint = db.execute(Q["find_by_idem"], (j.tenant, j.idem_digest)).fetchone()
                if fingerprint != j.request_fingerprint:
                    raise IdempotencyConflict(
                        "this idempotency key was already used for a different request", existing_job_id=job_id
                    )
                out.append(Enqueued(job_id, False))
            return out

        out = await self._run(lambda: self._tx(fn), "enqueue")
        self._wake.set()  # workers of this process need not wait for their next poll
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
                raise IllegalTransition(
                    f"job {job_id} is {job[6]}; only a finished, unsuccessful job can be requeued"
                )
            return _job(job)

        job = await self._run(lambda: self._tx(fn), "requeue")
        self._wake.set()
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
            return self._tx(lambda db: db.execute(Q["claim_jobs"], args).fetchall())

        rows = await self._run(fn, "claim")
        return [Claim(Fence(r[0], r[1], token), r[2], r[3], r[4], r[5], r[6], bool(r[7]), r[8]) for r in rows]

    async def start(self, worker_id: str, starts: Sequence[Start]) -> list[Started]:
        if not starts:
            return []

        def fn(db: sqlite3.Connection) -> list[Started]:
            out = []
            for s in starts:
                f = s.fence
                row = db.execute(
                    Q["start_execution"], (f.job_id, worker_id, f.epoch, f.token, s.execution_id)
                ).fetchone()
                if row is None:
                    continue
                attempt, started_at = row
                payload = json.dumps({"worker_id": worker_id, "attempt": attempt})
                db.execute(Q["insert_event"], (f.job_id, f.epoch, 1, s.execution_id, "execution.started", payload))
                out.append(Started(f, s.execution_id, started_at, attempt))
            return out

        return await self._run(lambda: self._tx(fn), "start")

    async def finish(self, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
        if not finishes:
            return []

        def fn(db: sqlite3.Connection) -> list[str]:
            done = []
            for x in finishes:
                f = x.fence
                row = db.execute(
                    Q["finish_execution"],
                    (f.job_id, x.execution_id, f.epoch, f.token, x.state.value, x.result_json, x.error_code,
                     x.error_message, x.retry_delay_s),
                ).fetchone()
                if row is None:
                    continue
                retry = x.state is JobState.SCHEDULED
                payload = json.dumps({
                    "state": x.state.value,
                    "result": None if x.result_json is None else json.loads(x.result_json),
                    "error_code": x.error_code, "error": x.error_message, "next_attempt_at": row[0],
                })
                db.execute(
                    Q["insert_event"],
                    (f.job_id, f.epoch, x.seq, x.execution_id,
                     "execution.retrying" if retry else f"job.{x.state.value}", payload),
                )
                db.execute(
                    Q["insert_execution"],
                    (x.execution_id, f.job_id, f.epoch, worker_id, x.started_at,
                     "failed" if retry else x.state.value, x.usage_json),
                )
                done.append(f.job_id)
            return done

        return await self._run(lambda: self._tx(fn), "finish")

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

        return await self._run(lambda: self._tx(fn), "append_events")

    async def release_claims(self, worker_id: str, fences: Sequence[Fence]) -> list[str]:
        if not fences:
            return []

        def fn(db: sqlite3.Connection) -> list[str]:
            return [
                f.job_id for f in fences
                if db.execute(Q["release_claim"], (f.job_id, worker_id, f.epoch, f.token)).rowcount == 1
            ]

        out = await self._run(lambda: self._tx(fn), "release_claims")
        self._wake.set()
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
        args = (info.id, info.host, info.pid, info.concurrency, json.dumps(list(info.agents)),
                json.dumps(list(info.capabilities)), info.state.value)
        await self._run(lambda: self._tx(lambda db: db.execute(Q["register_worker"], args)), "register_worker")

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        args = (worker_id, state.value)
        await self._run(lambda: self._tx(lambda db: db.execute(Q["set_worker_state"], args)), "set_worker_state")

    async def list_workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        rows = await self._run(
            lambda: self._read(lambda db: db.execute(Q["list_workers"], (int(include_gone),)).fetchall())
        )
        return [
            WorkerInfo(
                id=r[0], host=r[1], pid=r[2], concurrency=r[3], agents=tuple(json.loads(r[4])),
                capabilities=tuple(json.loads(r[5])), state=WorkerState(r[6]), in_flight=r[7],
                started_at=r[8], last_heartbeat=r[9], jobs_held=tuple(json.loads(r[10])),
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

    async def list_executions(self, job_id: str) -> list[Execution]:
        rows = await self._run(
            lambda: self._read(lambda db: db.execute(Q["list_executions"], (job_id,)).fetchall())
        )
        return [
            Execution(r[0], r[1], r[2], r[3], r[4], r[5], r[6], None if r[7] is None else json.loads(r[7]))
            for r in rows
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
                db.execute(
                    Q["insert_execution"], (execution_id, job_id, epoch, owner, started_at, "lost", None)
                )
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
        if report.released or report.requeued or report.due:
            self._wake.set()
        return report

    # -- wake-up ----------------------------------------------------------------------------------------------------
    def _data_version(self) -> int:
        db = self._db
        assert db is not None
        return int(db.execute("PRAGMA data_version").fetchone()[0])

    async def wait_for_jobs(self, timeout_s: float) -> None:
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

    # -- cancellation ----------------------------------------------------------------------------------------------
    async def request_cancel(self, job_id: str) -> bool:
        rows = await self._run(lambda: self._tx(lambda db: db.execute(Q["request_cancel"], (job_id,)).fetchall()),
                               "request_cancel")
        return bool(rows)

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
        await self._lease_run(
            lambda: self._tx(lambda db: db.execute(Q["lease_release"], (key, holder))), "lease release"
        )

    async def holders(self, key: str) -> list[str]:
        rows = await self._lease_run(
            lambda: self._read(lambda db: db.execute(Q["lease_holders"], (key,)).fetchall()), "lease holders"
        )
        return [r[0] for r in rows]


def _check_lease_args(limit: int, ttl_s: float) -> None:
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")


def _split_sql(script: str) -> list[str]:
    """Split a migration file into statements (our migrations never put ';' inside a literal)."""
    body = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]
