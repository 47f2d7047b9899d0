"""`Store` and `Leases` on PostgreSQL with asyncpg.

Connections: a small pool for the conditional updates, one connection reserved for claims, and one for
LISTEN. With a `ChannelSignals` (TENURE_REDIS_URL set) the live hints — events appended, control commands —
travel over Redis pub/sub: the store's sessions set `tenure.notify_events = off`, so `tenure_notify_events`
writes no NOTIFY, and the store publishes job ids after each write commits.

The claim connection runs with `synchronous_commit = off`: a claim lost in a server crash is harmless, because
the start CAS (committed synchronously) re-checks owner, epoch and token and matches no row. Every other write
waits for its commit to be durable, `claim_and_start` included: its function (created in `pg_temp` on the claim
connection, see queries.sql) turns `synchronous_commit` on for its own transaction.
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
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import asyncpg

from tenure.backends._queries import load_migrations, load_queries
from tenure.backends.postgres import _lease_ops
from tenure.backends.postgres._connections import (
    CONNECT_TIMEOUT_S,
    DRIVER_ERRORS,
    DedicatedConnection,
    broken,
    translate,
)
from tenure.backends.signals import ChannelSignals
from tenure.contracts.channel import Channel
from tenure.contracts.errors import (
    IdempotencyConflict,
    IllegalTransition,
    MigrationError,
    NotFound,
    StoreUnavailable,
)
from tenure.contracts.states import REQUEUEABLE, JobState, WorkerState
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
    is_uuid,
    new_id,
    new_token,
)

log = logging.getLogger("tenure.store.postgres")

Q = load_queries("tenure.backends.postgres")
MIGRATIONS = load_migrations("tenure.backends.postgres")  # read at import, never on the event loop
_CHANNEL = "tenure_jobs"
_EVENTS_CHANNEL = "tenure_events"
_CONTROL_CHANNEL = "tenure_control"
_LISTENER_LEASE_S = 30.0
_LISTENER_RENEW_S = 10.0
_REQUEUEABLE = sorted(s.value for s in REQUEUEABLE)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset: nothing to undo. asyncpg's default sends `SELECT pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL` on every release, one extra round trip per start and per finish batch; pool
    connections here never LISTEN, SET, hold session advisory locks or cursors (LISTEN has its own connection,
    advisory locks are transaction-scoped). asyncpg still rolls back an open transaction before this runs."""


def _dsn(url: str) -> str:
    # asyncpg understands postgresql:// and postgres://; accept SQLAlchemy-style driver suffixes too.
    for prefix in ("postgresql+asyncpg://", "postgres+asyncpg://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


def _session_settings(channel: bool) -> dict[str, str]:
    """Session settings of every connection: with a channel for live hints, `tenure_notify_events` sends no
    NOTIFY (the store publishes after the commit instead)."""
    return {"tenure.notify_events": "off"} if channel else {}


def _job(row: asyncpg.Record) -> Job:
    return Job(
        id=row["id"],
        tenant=row["tenant"],
        agent=row["agent"],
        input=json.loads(row["input"]),
        priority=row["priority"],
        requires=tuple(row["requires"]),
        state=JobState(row["state"]),
        owner=row["owner"],
        epoch=row["epoch"],
        execution_id=row["execution_id"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        timeout_s=row["timeout_s"],
        retry_safe=row["retry_safe"],
        result=None if row["result"] is None else json.loads(row["result"]),
        error_code=row["error_code"],
        error_message=row["error_message"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        claimed_at=row["claimed_at"],
        claim_expires_at=row["claim_expires_at"],
        execution_started_at=row["execution_started_at"],
        next_attempt_at=row["next_attempt_at"],
        deadline=row["deadline"],
        cancel_requested_at=row["cancel_requested_at"],
        finished_at=row["finished_at"],
    )


def _fence_arrays(fences: Iterable[Fence]) -> tuple[list[str], list[int], list[int]]:
    # In job id order: every multi-row write locks its rows in the same order, so two of them never deadlock.
    ids, epochs, tokens = [], [], []
    for f in sorted(fences, key=lambda f: f.job_id):
        ids.append(f.job_id)
        epochs.append(f.epoch)
        tokens.append(f.token)
    return ids, epochs, tokens


class PostgresStore(_lease_ops.PoolLeases):
    """The Tenure store on PostgreSQL. Create with `await PostgresStore.connect(url)`."""

    dialect = "postgres"
    claim_carries_finishes = False  # the finish runs on the pool and the claim on its own connection

    def __init__(self, url: str, pool: asyncpg.Pool, signals: ChannelSignals | None = None) -> None:
        self._url = url
        self._signals = signals
        self._pool = pool
        settings = _session_settings(signals is not None)
        # Connections outside the pool, each re-opened with backoff after a loss (_connections.py).
        self._claim = DedicatedConnection(
            "claim", _dsn(url), server_settings=settings | {"synchronous_commit": "off"}, setup=self._setup_claim
        )
        self._claim_start = True  # pg_temp.tenure_claim_start can be created on the claim connection
        self._claim_lock = asyncio.Lock()
        self._listen = DedicatedConnection("listen", _dsn(url), server_settings=settings, setup=self._setup_listen)
        self._listen_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._closed = False
        self._events = DedicatedConnection("events", _dsn(url), server_settings=settings, setup=self._setup_events)
        # While it listens for events, this store holds a lease in `event_listeners` (writers NOTIFY only then).
        self._listener_id = f"{socket.gethostname()}:{os.getpid()}:{new_id()}"
        self._listener_renewed = -math.inf
        self._events_lock = asyncio.Lock()
        self._notices: list[EventNotice] = []
        self._notice_ready = asyncio.Event()
        self._control_wanted = False  # an owner waits for commands: the LISTEN connection hears tenure_control
        self._control_conn: asyncpg.Connection | None = None  # the connection that LISTENs on tenure_control
        self._control_jobs: set[str] | None = set()  # None: a listener was (re)established, check all
        self._control_ready = asyncio.Event()

    @classmethod
    async def connect(cls, url: str, pool_size: int = 4, channel: Channel | None = None) -> PostgresStore:
        """Open the pool and the claim connection. Does not migrate (see `migrate`). With a `channel`, live
        hints go over it instead of NOTIFY (the store owns and closes it)."""
        with translate("connect"):
            pool = await asyncpg.create_pool(
                _dsn(url),
                min_size=1,
                max_size=pool_size,
                reset=_keep_session,
                timeout=CONNECT_TIMEOUT_S,
                server_settings=_session_settings(channel is not None) | {"application_name": "tenure-pool"},
            )
        store = cls(url, pool, None if channel is None else ChannelSignals(channel))
        try:
            await store._claim.get()  # a wrong URL or a missing database fails here, at start-up
        except BaseException:
            await store.close()
            raise
        return store

    async def _setup_claim(self, conn: asyncpg.Connection) -> None:
        """Each new claim connection creates its session-local claim-and-start function (queries.sql)."""
        if not self._claim_start:
            return
        try:
            await conn.execute(Q["claim_start_function"])
        except asyncpg.PostgresError as exc:  # e.g. no TEMP privilege: claim and start in two round trips
            log.warning("pg_temp.tenure_claim_start not created, claiming and starting separately: %s", exc)
            self._claim_start = False

    @contextlib.asynccontextmanager
    async def _on_claim_conn(self, what: str) -> AsyncIterator[asyncpg.Connection]:
        """The claim connection, one caller at a time; a call that finds it broken drops it for a new one."""
        async with self._claim_lock:
            with translate(what):
                conn = await self._claim.get()
                try:
                    yield conn
                except DRIVER_ERRORS as exc:
                    self._claim.failed(conn, exc)
                    raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._signals is not None:
            await self._signals.close()
        if self._listener_renewed > -math.inf:
            with contextlib.suppress(*DRIVER_ERRORS):
                async with asyncio.timeout(2), self._pool.acquire() as conn:
                    await conn.execute(Q["event_listener_leave"], self._listener_id)
        for dedicated in (self._listen, self._events, self._claim):
            await dedicated.close()
        with contextlib.suppress(*DRIVER_ERRORS):
            await asyncio.wait_for(self._pool.close(), 5)

    @contextlib.asynccontextmanager
    async def _conn(self, what: str) -> AsyncIterator[asyncpg.Connection]:
        with translate(what):
            async with self._pool.acquire() as conn:
                try:
                    yield conn
                except DRIVER_ERRORS as exc:
                    if broken(conn, exc):
                        # Its protocol state is unknown (an operation may still be "in progress" in it): the
                        # pool must open a new one rather than hand this one to the next caller.
                        conn.terminate()
                    raise

    async def _events_changed(self, conn: asyncpg.Connection, job_ids: list[str]) -> None:
        """Inside a transaction: NOTIFY that these histories grew (delivered at commit). With a channel, nothing
        here: call `_publish_events` after the commit."""
        if self._signals is None:
            await conn.execute(Q["notify_events_of"], job_ids)

    def _publish_events(self, job_ids: Iterable[str]) -> None:
        if self._signals is not None:
            self._signals.events_changed(job_ids)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def schema_version(self) -> int:
        async with self._conn("schema_version") as conn:
            exists = await conn.fetchval("SELECT to_regclass('tenure_migrations') IS NOT NULL")
            if not exists:
                return 0
            return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM tenure_migrations"))

    async def migrate(self) -> int:
        migrations = MIGRATIONS
        async with self._conn("migrate") as conn, conn.transaction():
            # One migrator at a time across every process that starts together.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('tenure_migrate', 0))")
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS tenure_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            current = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM tenure_migrations"))
            if current > len(migrations):
                raise MigrationError(
                    f"the database schema is at version {current}, newer than this code knows "
                    f"({len(migrations)}); upgrade tenure"
                )
            for version, name, sql in migrations[current:]:
                try:
                    await conn.execute(sql)
                except asyncpg.PostgresError as exc:
                    raise MigrationError(f"migration {version:04d}_{name} failed: {exc}") from exc
                await conn.execute("INSERT INTO tenure_migrations (version, name) VALUES ($1, $2)", version, name)
            return len(migrations)

    async def server_time(self) -> float:
        async with self._conn("server_time") as conn:
            return float(await conn.fetchval(Q["server_time"]))

    async def server_version(self) -> str:
        """The PostgreSQL server's version (for `tenure doctor`)."""
        async with self._conn("server_version") as conn:
            return str(await conn.fetchval("SHOW server_version"))

    @staticmethod
    def latest_schema_version() -> int:
        """The schema version this code migrates to."""
        return len(MIGRATIONS)

    # -- admission ---------------------------------------------------------------------------------------------
    async def enqueue(self, jobs: Sequence[NewJob]) -> list[Enqueued]:
        if not jobs:
            return []
        cols: list[list[Any]] = [[] for _ in range(12)]
        for j in jobs:
            for i, v in enumerate(
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
                    j.retry_safe,
                )
            ):
                cols[i].append(v)
        async with self._conn("enqueue") as conn:
            rows = await conn.fetch(Q["enqueue_jobs"], *cols)
            created = {r["id"]: _job(r) for r in rows}
            out: list[Enqueued] = []
            missing = [j for j in jobs if j.id not in created]
            existing: dict[tuple[str, bytes], tuple[Job, bytes]] = {}
            if missing:
                by_tenant: dict[str, list[bytes]] = {}
                for j in missing:
                    assert j.idem_digest is not None  # only a key conflict skips a row
                    by_tenant.setdefault(j.tenant, []).append(j.idem_digest)
                for tenant, digests in by_tenant.items():
                    for r in await conn.fetch(Q["jobs_by_idem"], tenant, digests):
                        existing[(tenant, bytes(r["idem_digest"]))] = (_job(r), bytes(r["request_fingerprint"]))
            # The insert committed without waiting for its flush; nothing is accepted until it is durable. This
            # also covers a replayed key whose original commit this session saw before it was flushed.
            await conn.fetchval(Q["flush_barrier"])
        for j in jobs:
            job = created.get(j.id)
            if job is not None:
                out.append(Enqueued(job, True))
                continue
            assert j.idem_digest is not None
            found = existing.get((j.tenant, j.idem_digest))
            if found is None:  # the conflicting insert rolled back between our two statements: rare
                raise StoreUnavailable("idempotency key race: the original request rolled back; retry")
            job, fingerprint = found
            if fingerprint != j.request_fingerprint:
                raise IdempotencyConflict(
                    "this idempotency key was already used for a different request", existing_job_id=job.id
                )
            out.append(Enqueued(job, False))
        return out

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job | None:
        if not is_uuid(job_id):
            return None
        async with self._conn("get_job") as conn:
            row = await conn.fetchrow(Q["get_job"], job_id, tenant)
        return None if row is None else _job(row)

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        async with self._conn("list_jobs") as conn:
            rows = await conn.fetch(
                Q["list_jobs"],
                flt.tenant,
                flt.state.value if flt.state else None,
                flt.agent,
                flt.before,
                flt.limit,
            )
        return [_job(r) for r in rows]

    async def requeue(self, job_id: str, tenant: str | None = None) -> Job:
        # One transaction: the answer is the job as this requeue left it, before any worker can claim it.
        async with self._conn("requeue") as conn, conn.transaction():
            row = await conn.fetchrow(Q["requeue_job"], job_id, tenant, _REQUEUEABLE)
            job = await conn.fetchrow(Q["get_job"], job_id, tenant)
            if row is not None:
                await self._events_changed(conn, [job_id])
        if job is None:
            raise NotFound(f"no job {job_id}")
        if row is None:
            raise IllegalTransition(f"job {job_id} is {job['state']}; only a finished, unsuccessful job can be requeued")
        self._publish_events([job_id])
        return _job(job)

    # -- ownership -----------------------------------------------------------------------------------------------
    async def claim(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[Claim]:
        if limit <= 0:
            return []
        token = new_token()
        async with self._on_claim_conn("claim") as conn:
            rows = await conn.fetch(Q["claim_jobs"], worker_id, list(agents), list(capabilities), limit, ttl_s, token)
        return [Claim(Fence(r[0], r[1], token), r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]) for r in rows]

    async def claim_and_start(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[tuple[Claim, Started]]:
        if limit <= 0:
            return []
        if not self._claim_start:
            claims = await self.claim(worker_id, agents, capabilities, limit, ttl_s)
            by_job = {c.fence.job_id: c for c in claims}
            started = await self.start(worker_id, [Start(c.fence, new_id()) for c in claims])
            return [(by_job[s.fence.job_id], s) for s in started]
        token = new_token()
        executions = [new_id() for _ in range(limit)]
        async with self._on_claim_conn("claim_and_start") as conn:
            rows = await conn.fetch(
                Q["claim_and_start"], worker_id, list(agents), list(capabilities), limit, ttl_s, token, executions
            )
        out = []
        for r in rows:
            fence = Fence(r[0], r[1], token)
            # The start added one attempt to the claim's count.
            claim = Claim(fence, r[2], r[3], r[4] - 1, r[5], r[6], r[7], r[8], r[9], r[10])
            out.append((claim, Started(fence, r[11], r[12], r[4])))
        self._publish_events(r[0] for r in rows)
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
        done = await self.finish(worker_id, finishes)
        return done, await self.claim_and_start(worker_id, agents, capabilities, limit, ttl_s)

    async def start(self, worker_id: str, starts: Sequence[Start]) -> list[Started]:
        if not starts:
            return []
        starts = sorted(starts, key=lambda s: s.fence.job_id)  # the order _fence_arrays uses
        by_job = {s.fence.job_id: s for s in starts}
        ids, epochs, tokens = _fence_arrays(s.fence for s in starts)
        async with self._conn("start") as conn:
            rows = await conn.fetch(Q["start_executions"], worker_id, ids, epochs, tokens, [s.execution_id for s in starts])
        self._publish_events(r[0] for r in rows)
        out = []
        for job_id, attempt, started_at, _ in rows:
            s = by_job[job_id]
            out.append(Started(s.fence, s.execution_id, started_at, attempt))
        return out

    async def finish(self, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
        if not finishes:
            return []
        cols: list[list[Any]] = [[] for _ in range(12)]
        for f in sorted(finishes, key=lambda f: f.fence.job_id):  # rows locked in one order (see _fence_arrays)
            for i, v in enumerate(
                (
                    f.fence.job_id,
                    f.fence.epoch,
                    f.fence.token,
                    f.execution_id,
                    f.state.value,
                    f.result_json,
                    f.error_code,
                    f.error_message,
                    f.retry_delay_s,
                    f.seq,
                    f.started_at,
                    f.usage_json,
                )
            ):
                cols[i].append(v)
        async with self._conn("finish") as conn:
            rows = await conn.fetch(Q["finish_executions"], *cols, worker_id)
        done = [r[0] for r in rows]
        self._publish_events(done)
        return done

    async def append_events(self, events: Sequence[NewEvent]) -> set[str]:
        if not events:
            return set()
        cols: list[list[Any]] = [[] for _ in range(7)]
        for e in events:
            for i, v in enumerate(
                (e.fence.job_id, e.fence.epoch, e.fence.token, e.seq, e.execution_id, e.type, e.payload_json)
            ):
                cols[i].append(v)
        async with self._conn("append_events") as conn:
            rows = await conn.fetch(Q["append_events"], *cols)
            written = {r[0] for r in rows}
            self._publish_events(written)
            fences = {e.fence.job_id: e.fence for e in events if e.fence.job_id not in written}
            if not fences:
                return set()
            # Nothing of these jobs was inserted: either the fence lost, or every event was a duplicate of a
            # retried append that had committed. Ask the jobs table which.
            owning = await conn.fetch(Q["owning_fences"], *_fence_arrays(fences.values()))
        return set(fences) - {r[0] for r in owning}

    async def release_claims(self, worker_id: str, fences: Sequence[Fence]) -> list[str]:
        if not fences:
            return []
        async with self._conn("release") as conn:
            rows = await conn.fetch(Q["release_claims"], worker_id, *_fence_arrays(fences))
        return [r[0] for r in rows]

    async def heartbeat(
        self, worker_id: str, state: WorkerState, in_flight: int, held: Sequence[Fence], ttl_s: float
    ) -> HeartbeatReply:
        async with self._conn("heartbeat") as conn:
            rows = await conn.fetch(Q["heartbeat"], worker_id, state.value, in_flight, *_fence_arrays(held), ttl_s)
        return HeartbeatReply(frozenset(r[0] for r in rows), frozenset(r[0] for r in rows if r[1]))

    # -- registry -----------------------------------------------------------------------------------------------
    async def register_worker(self, info: WorkerInfo) -> None:
        async with self._conn("register_worker") as conn:
            await conn.execute(
                Q["register_worker"],
                info.id,
                info.host,
                info.pid,
                info.concurrency,
                list(info.agents),
                list(info.capabilities),
                info.state.value,
            )

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        async with self._conn("set_worker_state") as conn:
            await conn.execute(Q["set_worker_state"], worker_id, state.value)

    async def list_workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        async with self._conn("list_workers") as conn:
            rows = await conn.fetch(Q["list_workers"], include_gone)
        return [
            WorkerInfo(
                id=r["id"],
                host=r["host"],
                pid=r["pid"],
                concurrency=r["concurrency"],
                agents=tuple(r["agents"]),
                capabilities=tuple(r["capabilities"]),
                state=WorkerState(r["state"]),
                in_flight=r["in_flight"],
                started_at=r["started_at"],
                last_heartbeat=r["last_heartbeat"],
                jobs_held=tuple(r["jobs_held"]),
            )
            for r in rows
        ]

    # -- history ------------------------------------------------------------------------------------------------
    async def read_events(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[Event]:
        epoch, seq = after if after is not None else (-1, -1)
        async with self._conn("read_events") as conn:
            rows = await conn.fetch(Q["read_events"], job_id, epoch, seq, limit)
        return [Event(job_id, r[0], r[1], r[2], r[3], None if r[4] is None else json.loads(r[4]), r[5]) for r in rows]

    async def read_events_many(self, cursors: Sequence[tuple[str, tuple[int, int] | None]], limit: int) -> list[Event]:
        valid = [(j, c if c is not None else (-1, -1)) for j, c in cursors if is_uuid(j)]
        if not valid:
            return []
        async with self._conn("read_events_many") as conn:
            rows = await conn.fetch(
                Q["read_events_many"],
                [j for j, _ in valid],
                [c[0] for _, c in valid],
                [c[1] for _, c in valid],
                limit,
            )
        return [Event(r[0], r[1], r[2], r[3], r[4], None if r[5] is None else json.loads(r[5]), r[6]) for r in rows]

    async def list_executions(self, job_id: str) -> list[Execution]:
        async with self._conn("list_executions") as conn:
            rows = await conn.fetch(Q["list_executions"], job_id)
        return [
            Execution(r[0], r[1], r[2], r[3], r[4], r[5], r[6], None if r[7] is None else json.loads(r[7])) for r in rows
        ]

    # -- sweeper ---------------------------------------------------------------------------------------------------
    async def sweep(self, worker_ttl_s: float) -> SweepReport:
        report = SweepReport()
        async with self._conn("sweep") as conn:
            report.released = [r[0] for r in await conn.fetch(Q["sweep_release_expired"])]
            async with conn.transaction():
                locked = await conn.fetch(Q["sweep_lock_lost"])
                if locked:
                    marked = await conn.fetch(Q["sweep_mark_lost"], [r["id"] for r in locked])
                    state_of = {r[0]: r[1] for r in marked}
                    await conn.execute(
                        Q["sweep_lost_records"],
                        [r["id"] for r in locked],
                        [r["epoch"] for r in locked],
                        [r["execution_id"] for r in locked],
                        [r["owner"] for r in locked],
                        [r["started_at"] for r in locked],
                        [state_of[str(r["id"])] for r in locked],
                    )
                    for job_id, state in state_of.items():
                        {"lost": report.lost, "queued": report.requeued, "dead": report.dead}[state].append(job_id)
            report.expired = [r[0] for r in await conn.fetch(Q["sweep_expire"])]
            report.due = [r[0] for r in await conn.fetch(Q["sweep_due"])]
            report.workers_gone = [r[0] for r in await conn.fetch(Q["sweep_workers_gone"], worker_ttl_s)]
            changed = report.lost + report.requeued + report.dead + report.expired
            if changed:  # their histories grew (job.lost, job.expired...): one NOTIFY for the sweep
                await self._events_changed(conn, changed)
        self._publish_events(changed)
        return report

    # -- metrics -----------------------------------------------------------------------------------------------------
    async def count_live_jobs(self) -> JobCounts:
        async with self._conn("count_live_jobs") as conn:
            rows = await conn.fetch(Q["count_live_jobs"])
        return JobCounts.from_rows([(r[0], r[1], r[2]) for r in rows])

    # -- wake-up ----------------------------------------------------------------------------------------------------
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

    # -- the gateway's side ------------------------------------------------------------------------------------------
    async def queue_depth(self, tenant: str) -> tuple[int, int]:
        async with self._conn("queue_depth") as conn:
            row = await conn.fetchrow(Q["queue_depth"], tenant)
        return int(row[0]), int(row[1])

    async def find_idempotent(self, tenant: str, idem_digest: bytes) -> tuple[str, bytes] | None:
        async with self._conn("find_idempotent") as conn:
            row = await conn.fetchrow(Q["find_by_idem"], tenant, [idem_digest])
        return None if row is None else (row["id"], bytes(row["request_fingerprint"]))

    async def record_circuit_failure(self, key: str) -> None:
        async with self._conn("record_circuit_failure") as conn:
            await conn.execute(Q["circuit_record"], key)

    async def circuit_state(self, key: str, threshold: int, window_s: float, open_s: float) -> CircuitState:
        async with self._conn("circuit_state") as conn:
            count, latest, now = await conn.fetchrow(Q["circuit_window"], key, window_s)
        return CircuitState.from_window(count, latest, now, threshold, open_s)

    async def admission_state(
        self, tenant: str, circuit_key: str, threshold: int, window_s: float, open_s: float
    ) -> AdmissionState:
        async with self._conn("admission_state") as conn:
            row = await conn.fetchrow(Q["admission_state"], tenant, circuit_key, window_s)
        circuit = CircuitState.from_window(row["failures"], row["latest"], row["now"], threshold, open_s)
        return AdmissionState(int(row["total"]), int(row["mine"]), circuit)

    async def cancel(self, job_id: str, tenant: str | None = None) -> ControlOutcome:
        if not is_uuid(job_id):
            return ControlOutcome.UNKNOWN
        async with self._conn("cancel") as conn, conn.transaction():
            outcome = await conn.fetchval(Q["cancel_job"], job_id, tenant)
            if outcome == "accepted":
                await self._events_changed(conn, [job_id])
            elif outcome == "requested":  # the owner's fast path; its heartbeat reply is the floor
                await self._control_sent(conn, job_id)
        if outcome == "accepted":
            self._publish_events([job_id])
        elif outcome == "requested":
            self._publish_control(job_id)
        return ControlOutcome.UNKNOWN if outcome is None else ControlOutcome(outcome)

    async def send_command(self, job_id: str, tenant: str | None, kind: str, payload_json: str) -> ControlOutcome:
        if not is_uuid(job_id):
            return ControlOutcome.UNKNOWN
        async with self._conn("send_command") as conn, conn.transaction():
            state = await conn.fetchval(Q["job_state"], job_id, tenant)
            if state is None:
                return ControlOutcome.UNKNOWN
            if JobState(state).terminal:
                return ControlOutcome.ALREADY_FINISHED
            await conn.execute(Q["insert_command"], job_id, kind, payload_json)
            await self._control_sent(conn, job_id)
        self._publish_control(job_id)
        return ControlOutcome.REQUESTED

    async def read_commands(self, job_id: str, after_seq: int) -> list[Command]:
        async with self._conn("read_commands") as conn:
            rows = await conn.fetch(Q["read_commands"], job_id, after_seq)
        return [Command(job_id, r[0], r[1], None if r[2] is None else json.loads(r[2]), r[3]) for r in rows]

    async def set_waiting(self, event: NewEvent, waiting: bool) -> bool:
        f = event.fence
        to, expected = ("waiting", "running") if waiting else ("running", "waiting")
        async with self._conn("set_waiting") as conn:
            row = await conn.fetchrow(
                Q["set_waiting"],
                f.job_id,
                f.epoch,
                f.token,
                event.execution_id,
                to,
                expected,
                event.seq,
                event.type,
                event.payload_json,
            )
        if row is not None:
            self._publish_events([f.job_id])
        return row is not None

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
        """Keep this store's row in `event_listeners` while it listens (renewed every 10 s, a 30 s lease).
        The first one commits before anything is read, so every append after it is notified."""
        now = time.monotonic()
        if self._events.connection is None or now - self._listener_renewed < _LISTENER_RENEW_S:
            return
        try:
            async with self._conn("event_listener_renew") as conn:
                await conn.execute(Q["event_listener_renew"], self._listener_id, _LISTENER_LEASE_S)
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

    def _on_control(self, _conn: object, _pid: int, _channel: str, body: str) -> None:
        if self._control_jobs is not None:
            self._control_jobs.update(j for j in body.split(",") if j)
        self._control_ready.set()

    async def _control_sent(self, conn: asyncpg.Connection, job_id: str) -> None:
        """Inside a transaction: NOTIFY the owner's control listener; with a channel, `_publish_control` after
        the commit instead."""
        if self._signals is None:
            await conn.execute(Q["notify_control"], [job_id])

    def _publish_control(self, job_id: str) -> None:
        if self._signals is not None:
            self._signals.control_sent([job_id])

    async def wait_for_control(self, timeout_s: float) -> frozenset[str] | None:
        if self._signals is not None:
            return await self._signals.wait_for_control(timeout_s)
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

    async def control_state(self, job_ids: Sequence[str]) -> tuple[frozenset[str], dict[str, int]]:
        ids = [j for j in job_ids if is_uuid(j)]
        if not ids:
            return frozenset(), {}
        async with self._conn("control_state") as conn:
            cancel = await conn.fetch(Q["control_cancel"], ids)
            seqs = await conn.fetch(Q["control_last_command"], ids)
        return frozenset(r[0] for r in cancel), {r[0]: int(r[1]) for r in seqs}

    async def wait_for_events(self, timeout_s: float) -> list[EventNotice]:
        if self._signals is not None:
            return await self._signals.wait_for_events(timeout_s)
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
