"""`SqliteStore`: the `JobStore` protocol on SQLite, for one machine and any number of processes.

Each method is one hop to the connection thread (`_connection.py`) running one transaction: a write is
`BEGIN IMMEDIATE` behind the writers' sidecar lock, so each conditional update sees one consistent database.
The store sends no signals: the `Backends` wrapper (`backends/after_commit.py`) calls `SqliteSignals` with what
each write returned, after it committed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from tenure.backends import _rows, _rules
from tenure.backends._queries import load_migrations
from tenure.backends.sqlite import keys
from tenure.backends.sqlite._children import ChildReads
from tenure.backends.sqlite._claims import claim_sql
from tenure.backends.sqlite._connection import NOW, Q, SqliteConnection, split_sql
from tenure.backends.sqlite._gate import admission_state_in, check_gate
from tenure.backends.sqlite._registry import RegistryOps
from tenure.backends.sqlite._state_pages import per_state
from tenure.backends.sqlite._writes import changed, claim_and_start_in, finish_in, insert_in, start_in
from tenure.backends.sqlite.audit import AuditWrites, edit_input, insert_budget
from tenure.contracts.errors import IllegalTransition, NotFound
from tenure.contracts.profile import WorkerRecord
from tenure.contracts.reports import AdmissionState, CircuitState, GateAsk, StoreHealth
from tenure.contracts.states import REQUEUEABLE, JobState, WorkerState
from tenure.contracts.store import JobStore, OffloadStats
from tenure.contracts.types import (
    Claim,
    Command,
    ControlOutcome,
    Enqueued,
    Event,
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
    check_replay,
    new_token,
)

MIGRATIONS = load_migrations("tenure.backends.sqlite")  # read at import, never on the event loop
_REQUEUEABLE = json.dumps(sorted(s.value for s in REQUEUEABLE))
T = TypeVar("T")

QS = per_state(Q, ("list_jobs_state", "list_jobs_tenant_state"))


class SqliteStore(keys.SchedulingReads, AuditWrites, RegistryOps, ChildReads):
    """The Tenure job store on one SQLite file. Create with `await SqliteStore.connect(url)`."""

    dialect = "sqlite"
    claim_carries_finishes = True

    def __init__(self, conn: SqliteConnection) -> None:
        self.connection = conn
        """The connection (and its thread) this store owns; `SqliteSignals` and `SqliteLeases` may share it."""

    @classmethod
    async def connect(cls, url: str, synchronous: str = "FULL") -> SqliteStore:
        """Open (creating if needed) the database file in WAL mode. Does not migrate (see `migrate`)."""
        return cls(await SqliteConnection.open(url, synchronous))

    @property
    def offload(self) -> OffloadStats:
        return self.connection.offload

    async def _write(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """One durable write transaction on the connection thread."""
        conn = self.connection
        return await conn.run(lambda: conn.tx(fn), what)

    async def _read(self, fn: Callable[[sqlite3.Connection], T], what: str = "query") -> T:
        conn = self.connection
        return await conn.run(lambda: conn.read(fn), what)

    async def run_between_transactions(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the connection thread, where no transaction of this store can be open."""
        return await self.connection.run(fn, "run_between_transactions")

    async def close(self) -> None:
        await self.connection.close()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def schema_version(self) -> int:
        def fn(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT name FROM sqlite_master WHERE name = 'tenure_migrations'").fetchone()
            if row is None:
                return 0
            return int(db.execute("SELECT coalesce(max(version), 0) AS v FROM tenure_migrations").fetchone()["v"])

        return await self._read(fn, "schema_version")

    async def migrate(self) -> int:
        def fn(db: sqlite3.Connection) -> int:
            db.execute(
                "CREATE TABLE IF NOT EXISTS tenure_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at REAL NOT NULL)"
            )
            current = int(db.execute("SELECT coalesce(max(version), 0) AS v FROM tenure_migrations").fetchone()["v"])
            for migration in _rules.pending_migrations(current, MIGRATIONS):
                version, name, sql = migration
                for statement in split_sql(sql):
                    try:
                        db.execute(statement)
                    except sqlite3.Error as exc:
                        raise _rules.migration_failed(migration, exc) from exc
                db.execute(
                    f"INSERT INTO tenure_migrations (version, name, applied_at) VALUES (?, ?, {NOW})",
                    (version, name),
                )
            return len(MIGRATIONS)

        return await self._write(fn, "migrate")

    async def server_version(self) -> str:
        """The SQLite library's version (for `tenure doctor`)."""
        return sqlite3.sqlite_version

    def latest_schema_version(self) -> int:
        return len(MIGRATIONS)

    async def server_time(self) -> float:
        return await self._read(lambda db: float(db.execute(Q["server_time"]).fetchone()["now"]))

    # -- admission ---------------------------------------------------------------------------------------------
    async def enqueue(self, jobs: Sequence[NewJob], gate: GateAsk | None = None) -> list[Enqueued]:
        if not jobs:
            return []

        def fn(db: sqlite3.Connection) -> list[Enqueued]:
            if gate is not None:  # the write lock makes the gate's read and the inserts one step
                check_gate(db, gate)
            out = []
            for j in jobs:
                if (f := j.parent_fence) is not None:  # BEGIN IMMEDIATE: the check and the insert are one step
                    _rules.check_parent_owns(
                        j, db.execute(Q["parent_owns"], (f.job_id, f.epoch, f.token)).fetchone() is not None
                    )
                plan = None
                if j.queue_cap is not None:  # the write lock makes the count and the insert one step
                    waiting = int(db.execute(Q["queued_of_agent"], (j.agent, j.queue_cap_mode)).fetchone()["n"])
                    _rules.check_queue_cap(j.id, j.agent, j.queue_cap, waiting)
                if j.concurrency_key is not None:  # a replay answers its original job and changes nothing
                    found = db.execute(Q["jobs_by_idem"], (j.tenant, j.idem_digest)).fetchone()
                    plan = None if found is not None else keys.plan(db, j)
                inserted = insert_in(db, j, key_wait=plan is not None and plan.wait)
                if inserted:
                    row = inserted[0]
                    if j.budget_json is not None:
                        insert_budget(db, j.id, j.budget_json)
                    flagged = () if plan is None else keys.apply(db, j, plan)
                    out.append(Enqueued(_rows.job(row, _rows.comma_list), True, flagged))
                    continue
                found = db.execute(Q["jobs_by_idem"], (j.tenant, j.idem_digest)).fetchone()
                check_replay(found["id"], found["request_fingerprint"], j.request_fingerprint)
                out.append(Enqueued(_rows.job(found, _rows.comma_list), False))
            return out

        return await self._write(fn, "enqueue")

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job | None:
        row = await self._read(lambda db: db.execute(Q["get_job"], (job_id, tenant)).fetchone())
        return None if row is None else _rows.job(row, _rows.comma_list)

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        args = (flt.tenant, flt.state.value if flt.state else None, flt.agent, flt.before, flt.limit)
        if flt.state is None:
            sql = Q["list_jobs"]
        else:
            sql = QS["list_jobs_state" if flt.tenant is None else "list_jobs_tenant_state", flt.state]
        rows = await self._read(lambda db: db.execute(sql, args).fetchall())
        return [_rows.job(r, _rows.comma_list) for r in rows]

    async def requeue(self, job_id: str, tenant: str | None = None, input_json: str | None = None) -> Job:
        def fn(db: sqlite3.Connection) -> Job:
            row = db.execute(Q["requeue_job"], (job_id, tenant, _REQUEUEABLE)).fetchone()
            if row is not None:
                if input_json is not None:
                    edit_input(db, job_id, input_json)
                ev = _rules.requeued_event(input_json is not None)
                db.execute(Q["insert_event_next"], (job_id, row["epoch"], None, ev.type, ev.payload_json))
                if row["concurrency_key"] is not None:
                    keys.pass_turns(db, [(row["tenant"], row["concurrency_key"])])
            job = db.execute(Q["get_job"], (job_id, tenant)).fetchone()
            if job is None:
                raise NotFound(f"no job {job_id}")
            if row is None:
                raise IllegalTransition(f"job {job_id} is {job['state']}; only a finished, unsuccessful job can be requeued")
            return _rows.job(job, _rows.comma_list)

        return await self._write(fn, "requeue")

    # -- ownership -----------------------------------------------------------------------------------------------
    async def claim(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[Claim]:
        if limit <= 0:
            return []
        token = new_token()
        args = (worker_id, json.dumps(list(agents)), json.dumps(list(capabilities)), limit, ttl_s, token)
        conn = self.connection

        def fn() -> list[Any]:
            # Probe without the write lock first: an idle poll must not queue behind busy writers.
            if conn.db.execute(claim_sql("claim_probe", len(agents)), args[:4]).fetchone() is None:
                return []
            claimed = claim_sql("claim_jobs", len(agents))
            return conn.tx(lambda db: changed(db, claimed, args, Q["claimed_jobs"], (worker_id, token)), durable=False)

        rows = await conn.run(fn, "claim")
        return [_rows.claim(r, token) for r in rows]

    async def claim_and_start(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[tuple[Claim, Started]]:
        if limit <= 0:
            return []
        conn = self.connection

        probe = (worker_id, json.dumps(list(agents)), json.dumps(list(capabilities)), limit)

        def fn() -> list[tuple[Claim, Started]]:
            # Probe without the write lock first, as `claim` does.
            if conn.db.execute(claim_sql("claim_probe", len(agents)), probe).fetchone() is None:
                return []
            return conn.tx(lambda db: claim_and_start_in(db, worker_id, agents, capabilities, limit, ttl_s))

        return await conn.run(fn, "claim_and_start")

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
            done = finish_in(db, worker_id, finishes)
            return done, claim_and_start_in(db, worker_id, agents, capabilities, limit, ttl_s)

        return await self._write(tx, "finish_and_claim")

    async def start(self, worker_id: str, starts: Sequence[Start]) -> list[Started]:
        if not starts:
            return []
        return await self._write(lambda db: start_in(db, worker_id, starts), "start")

    async def finish(self, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
        if not finishes:
            return []
        return await self._write(lambda db: finish_in(db, worker_id, finishes), "finish")

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

        return await self._write(fn, "append_events")

    async def release_claims(self, worker_id: str, fences: Sequence[Fence]) -> list[str]:
        if not fences:
            return []

        def fn(db: sqlite3.Connection) -> list[str]:
            return [
                f.job_id
                for f in fences
                if db.execute(Q["release_claim"], (f.job_id, worker_id, f.epoch, f.token)).rowcount == 1
            ]

        return await self._write(fn, "release_claims")

    async def heartbeat(
        self, worker_id: str, state: WorkerState, in_flight: int, held: Sequence[Fence], ttl_s: float,
        record: WorkerRecord | None = None,
    ) -> HeartbeatReply:  # fmt: skip
        def fn(db: sqlite3.Connection) -> HeartbeatReply:
            args = (state.value, in_flight, worker_id, *_rules.record_params(record))
            me = db.execute(Q["heartbeat_worker"], args).fetchone()
            renewed, cancel = set(), set()
            for f in held:
                row = db.execute(Q["heartbeat_claim"], (f.job_id, worker_id, f.epoch, f.token, ttl_s)).fetchone()
                if row is not None:
                    renewed.add(f.job_id)
                    if row["cancel_requested_at"] is not None:
                        cancel.add(f.job_id)
            drain = me is not None and me["drain_requested_at"] is not None
            return HeartbeatReply(frozenset(renewed), frozenset(cancel), drain, me["drain_timeout_s"] if drain else None)

        return await self._write(fn, "heartbeat")

    # -- history ------------------------------------------------------------------------------------------------
    async def read_events(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[Event]:
        epoch, seq = after if after is not None else (-1, -1)
        rows = await self._read(lambda db: db.execute(Q["read_events"], (job_id, epoch, seq, limit)).fetchall())
        return [_rows.event(r, job_id) for r in rows]

    async def read_events_many(self, cursors: Sequence[tuple[str, tuple[int, int] | None]], limit: int) -> list[Event]:
        if not cursors:
            return []

        def fn(db: sqlite3.Connection) -> list[Event]:
            out = []
            for job_id, after in cursors:
                epoch, seq = after if after is not None else (-1, -1)
                for r in db.execute(Q["read_events_many"], (job_id, epoch, seq, limit)).fetchall():
                    out.append(_rows.event(r, job_id))
            return out

        return await self._read(fn, "read_events_many")

    async def list_executions(self, job_id: str) -> list[Execution]:
        rows = await self._read(lambda db: db.execute(Q["list_executions"], (job_id,)).fetchall())
        return [_rows.execution(r) for r in rows]

    # -- sweeper ---------------------------------------------------------------------------------------------------
    async def sweep(self, worker_ttl_s: float) -> SweepReport:
        def fn(db: sqlite3.Connection) -> SweepReport:
            report = SweepReport()
            report.released = [r["id"] for r in db.execute(Q["sweep_release_expired"]).fetchall()]
            buckets = {JobState.LOST: report.lost, JobState.QUEUED: report.requeued, JobState.DEAD: report.dead}
            for r in db.execute(Q["sweep_find_lost"]).fetchall():
                state = _rules.lost_outcome(bool(r["retry_safe"]), r["attempts"], r["max_attempts"])
                ev = _rules.lost_event(state, r["owner"])
                job_id, epoch, execution_id = r["id"], r["epoch"], r["execution_id"]
                db.execute(Q["sweep_mark_lost"], (job_id, state.value))
                db.execute(Q["insert_execution"], (execution_id, job_id, epoch, r["owner"], r["started_at"], "lost", None))
                db.execute(Q["insert_event_next"], (job_id, epoch, execution_id, ev.type, ev.payload_json))
                buckets[state].append(job_id)
            expired = _rules.EXPIRED_EVENT
            for r in db.execute(Q["sweep_expire"]).fetchall():
                db.execute(Q["insert_event_next"], (r["id"], r["epoch"], None, expired.type, expired.payload_json))
                report.expired.append(r["id"])
            report.due = [r["id"] for r in db.execute(Q["sweep_due"]).fetchall()]
            report.workers_gone = [r["id"] for r in db.execute(Q["sweep_workers_gone"], (worker_ttl_s,)).fetchall()]
            report.due += keys.pass_stalled(db)  # claimable now, like jobs due again
            return report

        return await self._write(fn, "sweep")

    # -- metrics -----------------------------------------------------------------------------------------------------
    async def count_live_jobs(self) -> JobCounts:
        rows = await self._read(lambda db: db.execute(Q["count_live_jobs"]).fetchall(), "count")
        return JobCounts.from_rows([(r["kind"], r["tenant"], r["n"]) for r in rows])

    async def health(self) -> StoreHealth:
        # No MVCC, so no horizon and no dead rows: what SQLite keeps is free pages in the file (reused in place).
        pages, page_size, free = await self._read(
            lambda db: (db.execute("PRAGMA page_count").fetchone()[0], db.execute("PRAGMA page_size").fetchone()[0],
                        db.execute("PRAGMA freelist_count").fetchone()[0]),
            "health",
        )  # fmt: skip
        return StoreHealth(None, None, {}, {}, {"(file)": int(pages) * int(page_size), "(free)": int(free) * int(page_size)})

    # -- the gateway's side ------------------------------------------------------------------------------------------
    async def queue_depth(self, tenant: str) -> tuple[int, int]:
        row = await self._read(lambda db: db.execute(Q["queue_depth"], (tenant,)).fetchone())
        return int(row["total"]), int(row["mine"])

    async def find_idempotent(self, tenant: str, idem_digest: bytes) -> tuple[str, bytes] | None:
        row = await self._read(lambda db: db.execute(Q["find_by_idem"], (tenant, idem_digest)).fetchone())
        return None if row is None else (row["id"], bytes(row["request_fingerprint"]))

    async def record_circuit_failure(self, key: str) -> None:
        def fn(db: sqlite3.Connection) -> None:
            db.execute(Q["circuit_trim"], (key, _rules.CIRCUIT_KEEP_S))
            db.execute(Q["circuit_record"], (key,))

        await self._write(fn, "record_circuit_failure")

    async def circuit_state(self, key: str, threshold: int, window_s: float, open_s: float) -> CircuitState:
        row = await self._read(lambda db: db.execute(Q["circuit_window"], (key, window_s)).fetchone())
        return CircuitState.from_window(row["failures"], row["latest"], row["now"], threshold, open_s)

    async def admission_state(
        self, tenant: str, circuit_key: str, threshold: int, window_s: float, open_s: float, upto: int | None = None
    ) -> AdmissionState:
        return await self._read(lambda db: admission_state_in(db, tenant, circuit_key, threshold, window_s, open_s, upto))

    async def cancel(self, job_id: str, tenant: str | None = None) -> ControlOutcome:
        def fn(db: sqlite3.Connection) -> ControlOutcome:
            row = db.execute(Q["cancel_unstarted"], (job_id, tenant)).fetchone()
            if row is not None:
                ev = _rules.CANCELLED_EVENT
                db.execute(Q["insert_event_next"], (job_id, row["epoch"], None, ev.type, ev.payload_json))
                if row["concurrency_key"] is not None:
                    keys.pass_turns(db, [(row["tenant"], row["concurrency_key"])])
                return ControlOutcome.ACCEPTED
            if db.execute(Q["cancel_request"], (job_id, tenant)).fetchone() is not None:
                return ControlOutcome.REQUESTED
            if db.execute(Q["job_state"], (job_id, tenant)).fetchone() is None:
                return ControlOutcome.UNKNOWN
            return ControlOutcome.ALREADY_FINISHED

        return await self._write(fn, "cancel")

    async def send_command(self, job_id: str, tenant: str | None, kind: str, payload_json: str) -> ControlOutcome:
        def fn(db: sqlite3.Connection) -> ControlOutcome:
            row = db.execute(Q["job_state"], (job_id, tenant)).fetchone()
            if row is None:
                return ControlOutcome.UNKNOWN
            if JobState(row["state"]).terminal:
                return ControlOutcome.ALREADY_FINISHED
            db.execute(Q["insert_command"], (job_id, kind, payload_json))
            return ControlOutcome.REQUESTED

        return await self._write(fn, "send_command")

    async def read_commands(self, job_id: str, after_seq: int) -> list[Command]:
        rows = await self._read(lambda db: db.execute(Q["read_commands"], (job_id, after_seq)).fetchall())
        return [_rows.command(r, job_id) for r in rows]

    async def set_waiting(self, event: NewEvent, waiting: bool) -> bool:
        f = event.fence
        to, expected = ("waiting", "running") if waiting else ("running", "waiting")

        def fn(db: sqlite3.Connection) -> bool:
            args = (f.job_id, f.epoch, f.token, event.execution_id, to, expected)
            if db.execute(Q["set_waiting"], args).rowcount != 1:
                return False
            db.execute(Q["insert_event"], (f.job_id, f.epoch, event.seq, event.execution_id, event.type, event.payload_json))
            return True

        return await self._write(fn, "set_waiting")

    async def control_state(self, job_ids: Sequence[str]) -> tuple[frozenset[str], dict[str, int]]:
        def fn(db: sqlite3.Connection) -> tuple[frozenset[str], dict[str, int]]:
            rows = db.execute(Q["control_cancel"], (json.dumps(list(job_ids)),)).fetchall()
            return frozenset(r["id"] for r in rows if r["cancel"]), {
                r["id"]: int(r["last_seq"]) for r in rows if r["last_seq"]
            }

        if not job_ids:
            return frozenset(), {}
        return await self._read(fn, "control_state")


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[JobStore] = SqliteStore
