"""`PostgresStore`: the `JobStore` protocol on PostgreSQL with asyncpg.

Its connections (`_connections.StoreConnections`): a small pool for the conditional updates, shared with the
process's `PostgresLeases`, and one connection reserved for claims, with `synchronous_commit = off` (see
there why that is safe, and how `claim_and_start` still commits durably). Batches travel as parallel arrays in
job id order (`_batches.py`); rows come back by column name (`backends/_rows.py`).

The wake-ups a write causes are NOTIFYs its own SQL sends inside the transaction (see `signals.py` for why);
with `notify=False` (TENURE_REDIS_URL set) the sessions set `tenure.notify_events = off`, so
`tenure_notify_events` writes no NOTIFY, and neither do cancels and commands: those hints are then published
over Redis after the commit (`backends/signals.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import asyncpg

from tenure.backends import _rows, _rules
from tenure.backends._queries import load_migrations, load_queries
from tenure.backends.postgres import _batches, _registry, keys
from tenure.backends.postgres._children import ChildReads
from tenure.backends.postgres._connections import StoreConnections
from tenure.backends.postgres._gate import enqueue_gated
from tenure.backends.postgres.audit import AuditWrites, edit_input
from tenure.contracts.errors import IllegalTransition, NotFound, StoreUnavailable
from tenure.contracts.profile import WorkerRecord
from tenure.contracts.reports import AdmissionState, CircuitState, GateAsk, StoreHealth
from tenure.contracts.states import REQUEUEABLE, JobState, WorkerState
from tenure.contracts.store import JobStore
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
    is_uuid,
    new_id,
    new_token,
)

Q = load_queries("tenure.backends.postgres")
MIGRATION_TIMEOUT_S = 24 * 3600.0
"""A migration (an index built on a big table) or the wait for another process's may take long: not bounded by
the store's command timeout."""
MIGRATIONS = load_migrations("tenure.backends.postgres")  # read at import, never on the event loop
_REQUEUEABLE = sorted(s.value for s in REQUEUEABLE)
T = TypeVar("T")


def _session_settings(notify: bool) -> dict[str, str]:
    """Session settings of every connection: without NOTIFY for live hints, `tenure_notify_events` sends none
    (the hints are published after the commit instead)."""
    return {} if notify else {"tenure.notify_events": "off"}


class PostgresStore(keys.SchedulingReads, AuditWrites, _registry.RegistryOps, ChildReads):
    """The Tenure job store on PostgreSQL. Create with `await PostgresStore.connect(url)`."""

    dialect = "postgres"
    claim_carries_finishes = False  # the finish runs on the pool and the claim on its own connection
    offload = None  # asyncpg never blocks the loop

    def __init__(self, conns: StoreConnections, notify: bool = True) -> None:
        self._db = conns
        self._notify = notify

    @classmethod
    async def connect(
        cls, url: str, pool_size: int = 4, *, notify: bool = True, command_timeout_s: float | None = 30.0
    ) -> PostgresStore:
        """Open the pool and the claim connection. Does not migrate (see `migrate`). With `notify=False` the
        store's transactions NOTIFY no events and no commands (their hints travel over a channel).
        `command_timeout_s` (`TENURE_PG_COMMAND_TIMEOUT_S`) bounds each statement; migrations are not bounded."""
        conns = await StoreConnections.open(
            url, pool_size, _session_settings(notify), Q["claim_start_function"], command_timeout_s
        )
        return cls(conns, notify)

    @property
    def pool(self) -> asyncpg.Pool:
        """The connection pool; `PostgresLeases(store.pool)` leases on it (closed with the store)."""
        return self._db.pool

    async def close(self) -> None:
        await self._db.close()

    async def _events_changed(self, conn: asyncpg.Connection, job_ids: list[str]) -> None:
        """Inside a transaction: NOTIFY that these histories grew (delivered at commit), unless the store sends
        no NOTIFY for live hints (`notify=False`)."""
        if self._notify:
            await conn.execute(Q["notify_events_of"], job_ids)

    async def _control_sent(self, conn: asyncpg.Connection, job_id: str) -> None:
        """Inside a transaction: NOTIFY the owner's control listener, unless `notify=False`."""
        if self._notify:
            await conn.execute(Q["notify_control"], [job_id])

    async def run_between_transactions(self, fn: Callable[[], T]) -> T:
        """Run `fn` at once, on the loop's thread: PostgreSQL has no database-wide write lock, so a process frozen
        with a transaction open holds at most that transaction's row locks (what a frozen worker always did)."""
        return fn()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def schema_version(self) -> int:
        async with self._db.pooled("schema_version") as conn:
            exists = await conn.fetchval("SELECT to_regclass('tenure_migrations') IS NOT NULL")
            if not exists:
                return 0
            return int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM tenure_migrations"))

    async def migrate(self) -> int:
        async with self._db.pooled("migrate") as conn, conn.transaction():
            # One migrator at a time across every process that starts together.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('tenure_migrate', 0))", timeout=MIGRATION_TIMEOUT_S
            )
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS tenure_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())",
                timeout=MIGRATION_TIMEOUT_S,
            )
            current = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM tenure_migrations"))
            for migration in _rules.pending_migrations(current, MIGRATIONS):
                version, name, sql = migration
                try:
                    await conn.execute(sql, timeout=MIGRATION_TIMEOUT_S)
                except asyncpg.PostgresError as exc:
                    raise _rules.migration_failed(migration, exc) from exc
                await conn.execute("INSERT INTO tenure_migrations (version, name) VALUES ($1, $2)", version, name)
            return len(MIGRATIONS)

    async def server_time(self) -> float:
        async with self._db.pooled("server_time") as conn:
            return float(await conn.fetchval(Q["server_time"]))

    async def server_version(self) -> str:
        """The PostgreSQL server's version (for `tenure doctor`)."""
        async with self._db.pooled("server_version") as conn:
            return str(await conn.fetchval("SHOW server_version"))

    def latest_schema_version(self) -> int:
        return len(MIGRATIONS)

    # -- admission ---------------------------------------------------------------------------------------------
    async def enqueue(self, jobs: Sequence[NewJob], gate: GateAsk | None = None) -> list[Enqueued]:
        if not jobs:
            return []
        if any(keys.locked(j) for j in jobs):
            return await keys.enqueue_mixed(self._db, jobs, self._notify, gate)
        async with self._db.pooled("enqueue") as conn:
            rows = await enqueue_gated(conn, jobs, gate)
            created = {r["id"]: _rows.job(r) for r in rows}
            missing = [j for j in jobs if j.id not in created]
            existing: dict[tuple[str, bytes], tuple[Job, bytes]] = {}
            if missing:
                by_tenant: dict[str, list[bytes]] = {}
                for j in missing:
                    assert j.idem_digest is not None  # only a key conflict skips a row
                    by_tenant.setdefault(j.tenant, []).append(j.idem_digest)
                for tenant, digests in by_tenant.items():
                    for r in await conn.fetch(Q["jobs_by_idem"], tenant, digests):
                        existing[(tenant, bytes(r["idem_digest"]))] = (_rows.job(r), bytes(r["request_fingerprint"]))
            # The insert committed without waiting for its flush; nothing is accepted until it is durable. This
            # also covers a replayed key whose original commit this session saw before it was flushed.
            await conn.fetchval(Q["flush_barrier"])
        out: list[Enqueued] = []
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
            check_replay(job.id, fingerprint, j.request_fingerprint)
            out.append(Enqueued(job, False))
        return out

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job | None:
        if not is_uuid(job_id):
            return None
        async with self._db.pooled("get_job") as conn:
            row = await conn.fetchrow(Q["get_job"], job_id, tenant)
        return None if row is None else _rows.job(row)

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        async with self._db.pooled("list_jobs") as conn:
            rows = await conn.fetch(
                Q["list_jobs"],
                flt.tenant,
                flt.state.value if flt.state else None,
                flt.agent,
                flt.before,
                flt.limit,
            )
        return [_rows.job(r) for r in rows]

    async def requeue(self, job_id: str, tenant: str | None = None, input_json: str | None = None) -> Job:
        # One transaction: the answer is the job as this requeue left it, before any worker can claim it.
        ev = _rules.requeued_event(input_json is not None)
        async with self._db.pooled("requeue") as conn, conn.transaction():
            row = await conn.fetchrow(Q["requeue_job"], job_id, tenant, _REQUEUEABLE, ev.type, ev.payload_json)
            if row is not None and input_json is not None:
                await edit_input(conn, job_id, input_json)
            job = await conn.fetchrow(Q["get_job"], job_id, tenant)
            if row is not None:
                await self._events_changed(conn, [job_id])
        if row is not None and job is not None and job["concurrency_key"] is not None:
            async with self._db.pooled("requeue_key") as conn:
                await keys.pass_turns(conn, [(job["tenant"], job["concurrency_key"])])
                job = await conn.fetchrow(Q["get_job"], job_id, tenant)
        if job is None:
            raise NotFound(f"no job {job_id}")
        if row is None:
            raise IllegalTransition(f"job {job_id} is {job['state']}; only a finished, unsuccessful job can be requeued")
        return _rows.job(job)

    # -- ownership -----------------------------------------------------------------------------------------------
    async def claim(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[Claim]:
        if limit <= 0:
            return []
        token = new_token()
        async with self._db.claim("claim") as conn:
            rows = await conn.fetch(Q["claim_jobs"], worker_id, list(agents), list(capabilities), limit, ttl_s, token)
        return [_rows.claim(r, token) for r in rows]

    async def claim_and_start(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[tuple[Claim, Started]]:
        if limit <= 0:
            return []
        if not self._db.claim_function:
            claims = await self.claim(worker_id, agents, capabilities, limit, ttl_s)
            by_job = {c.fence.job_id: c for c in claims}
            started = await self.start(worker_id, [Start(c.fence, new_id()) for c in claims])
            return [(by_job[s.fence.job_id], s) for s in started]
        token = new_token()
        executions = [new_id() for _ in range(limit)]
        async with self._db.claim("claim_and_start") as conn:
            rows = await conn.fetch(
                Q["claim_and_start"], worker_id, list(agents), list(capabilities), limit, ttl_s, token, executions
            )
        out = []
        for r in rows:
            # The start added one attempt to the claim's count.
            claim = _rows.claim(r, token, attempts=r["attempts"] - 1)
            out.append((claim, _rows.started(r, claim.fence, r["execution_id"])))
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
        by_job = {s.fence.job_id: s for s in starts}
        async with self._db.pooled("start") as conn:
            rows = await conn.fetch(Q["start_executions"], worker_id, *_batches.starts(starts))
        out = []
        for r in rows:
            s = by_job[r["id"]]
            out.append(_rows.started(r, s.fence, s.execution_id))
        return out

    async def finish(self, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
        if not finishes:
            return []
        async with self._db.pooled("finish") as conn:
            rows = await conn.fetch(Q["finish_executions"], *_batches.finishes(finishes), worker_id)
            ended = [(r["tenant"], r["passes_key"]) for r in rows if r["passes_key"] is not None]
            if ended:  # their keys' turns pass on (a crash before this: the sweeper passes them)
                await keys.pass_turns(conn, ended)
        return [r["id"] for r in rows]

    async def append_events(self, events: Sequence[NewEvent]) -> set[str]:
        if not events:
            return set()
        async with self._db.pooled("append_events") as conn:
            rows = await conn.fetch(Q["append_events"], *_batches.events(events))
            written = {r["job_id"] for r in rows}
            fences = {e.fence.job_id: e.fence for e in events if e.fence.job_id not in written}
            if not fences:
                return set()
            # Nothing of these jobs was inserted: either the fence lost, or every event was a duplicate of a
            # retried append that had committed. Ask the jobs table which.
            owning = await conn.fetch(Q["owning_fences"], *_batches.fences(fences.values()))
        return set(fences) - {r["id"] for r in owning}

    async def release_claims(self, worker_id: str, fences: Sequence[Fence]) -> list[str]:
        if not fences:
            return []
        async with self._db.pooled("release") as conn:
            rows = await conn.fetch(Q["release_claims"], worker_id, *_batches.fences(fences))
        return [r["id"] for r in rows]

    async def heartbeat(
        self, worker_id: str, state: WorkerState, in_flight: int, held: Sequence[Fence], ttl_s: float,
        record: WorkerRecord | None = None,
    ) -> HeartbeatReply:  # fmt: skip
        rec = _rules.record_params(record)
        async with self._db.heartbeat("heartbeat") as conn:  # its own connection: never behind job traffic
            rows = await conn.fetch(Q["heartbeat"], worker_id, state.value, in_flight, *_batches.fences(held), ttl_s, *rec)
        return _registry.heartbeat_reply(rows)

    # -- history ------------------------------------------------------------------------------------------------
    async def read_events(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[Event]:
        epoch, seq = after if after is not None else (-1, -1)
        async with self._db.pooled("read_events") as conn:
            rows = await conn.fetch(Q["read_events"], job_id, epoch, seq, limit)
        return [_rows.event(r, job_id) for r in rows]

    async def read_events_many(self, cursors: Sequence[tuple[str, tuple[int, int] | None]], limit: int) -> list[Event]:
        valid = [(j, c if c is not None else (-1, -1)) for j, c in cursors if is_uuid(j)]
        if not valid:
            return []
        async with self._db.pooled("read_events_many") as conn:
            rows = await conn.fetch(
                Q["read_events_many"],
                [j for j, _ in valid],
                [c[0] for _, c in valid],
                [c[1] for _, c in valid],
                limit,
            )
        return [_rows.event(r) for r in rows]

    async def list_executions(self, job_id: str) -> list[Execution]:
        async with self._db.pooled("list_executions") as conn:
            rows = await conn.fetch(Q["list_executions"], job_id)
        return [_rows.execution(r) for r in rows]

    # -- sweeper ---------------------------------------------------------------------------------------------------
    async def sweep(self, worker_ttl_s: float) -> SweepReport:
        report = SweepReport()
        buckets = {JobState.LOST: report.lost, JobState.QUEUED: report.requeued, JobState.DEAD: report.dead}
        expired = _rules.EXPIRED_EVENT
        async with self._db.pooled("sweep") as conn:
            report.released = [r["id"] for r in await conn.fetch(Q["sweep_release_expired"])]
            async with conn.transaction():
                locked = await conn.fetch(Q["sweep_lock_lost"])
                if locked:
                    states = [_rules.lost_outcome(r["retry_safe"], r["attempts"], r["max_attempts"]) for r in locked]
                    lost_events = [_rules.lost_event(s, r["owner"]) for s, r in zip(states, locked, strict=True)]
                    ids = [r["id"] for r in locked]
                    marked = await conn.fetch(Q["sweep_mark_lost"], ids, [s.value for s in states])
                    await conn.execute(
                        Q["sweep_lost_records"],
                        ids,
                        [r["epoch"] for r in locked],
                        [r["execution_id"] for r in locked],
                        [r["owner"] for r in locked],
                        [r["started_at"] for r in locked],
                        [e.type for e in lost_events],
                        [e.payload_json for e in lost_events],
                    )
                    for r in marked:
                        buckets[JobState(r["state"])].append(r["id"])
            report.expired = [r["id"] for r in await conn.fetch(Q["sweep_expire"], expired.type, expired.payload_json)]
            report.due = [r["id"] for r in await conn.fetch(Q["sweep_due"])]
            report.workers_gone = [r["id"] for r in await conn.fetch(Q["sweep_workers_gone"], worker_ttl_s)]
            report.due += await keys.pass_stalled(conn)  # claimable now, like jobs due again
            changed = report.lost + report.requeued + report.dead + report.expired
            if changed:  # their histories grew (job.lost, job.expired...): one NOTIFY for the sweep
                await self._events_changed(conn, changed)
        return report

    # -- metrics -----------------------------------------------------------------------------------------------------
    async def count_live_jobs(self) -> JobCounts:
        async with self._db.pooled("count_live_jobs") as conn:
            rows = await conn.fetch(Q["count_live_jobs"])
        return JobCounts.from_rows([(r["kind"], r["tenant"], r["n"]) for r in rows])

    async def health(self) -> StoreHealth:
        async with self._db.pooled("health") as conn:
            horizon = await conn.fetchrow(Q["health_xmin_horizon"])
            tables = await conn.fetch(Q["health_tables"])
        return _rules.store_health(horizon, tables)

    # -- the gateway's side ------------------------------------------------------------------------------------------
    async def queue_depth(self, tenant: str) -> tuple[int, int]:
        async with self._db.pooled("queue_depth") as conn:
            row = await conn.fetchrow(Q["queue_depth"], tenant)
        return int(row["total"]), int(row["mine"])

    async def find_idempotent(self, tenant: str, idem_digest: bytes) -> tuple[str, bytes] | None:
        async with self._db.pooled("find_idempotent") as conn:
            row = await conn.fetchrow(Q["find_by_idem"], tenant, [idem_digest])
        return None if row is None else (row["id"], bytes(row["request_fingerprint"]))

    async def record_circuit_failure(self, key: str) -> None:
        async with self._db.pooled("record_circuit_failure") as conn:
            await conn.execute(Q["circuit_record"], key, _rules.CIRCUIT_KEEP_S)

    async def circuit_state(self, key: str, threshold: int, window_s: float, open_s: float) -> CircuitState:
        async with self._db.pooled("circuit_state") as conn:
            row = await conn.fetchrow(Q["circuit_window"], key, window_s)
        return CircuitState.from_window(row["failures"], row["latest"], row["now"], threshold, open_s)

    async def admission_state(
        self, tenant: str, circuit_key: str, threshold: int, window_s: float, open_s: float, upto: int | None = None
    ) -> AdmissionState:
        async with self._db.pooled("admission_state") as conn:
            row = await conn.fetchrow(Q["admission_state"], tenant, circuit_key, window_s, upto)
        circuit = CircuitState.from_window(row["failures"], row["latest"], row["now"], threshold, open_s)
        return AdmissionState(int(row["total"]), int(row["mine"]), circuit)

    async def cancel(self, job_id: str, tenant: str | None = None) -> ControlOutcome:
        if not is_uuid(job_id):
            return ControlOutcome.UNKNOWN
        ev = _rules.CANCELLED_EVENT
        async with self._db.pooled("cancel") as conn, conn.transaction():
            outcome = await conn.fetchval(Q["cancel_job"], job_id, tenant, ev.type, ev.payload_json)
            if outcome == "accepted":
                await self._events_changed(conn, [job_id])
            elif outcome == "requested":  # the owner's fast path; its heartbeat reply is the floor
                await self._control_sent(conn, job_id)
        if outcome == "accepted":
            async with self._db.pooled("cancel_key") as conn:
                await keys.pass_after_cancel(conn, job_id)
        return ControlOutcome.UNKNOWN if outcome is None else ControlOutcome(outcome)

    async def send_command(self, job_id: str, tenant: str | None, kind: str, payload_json: str) -> ControlOutcome:
        if not is_uuid(job_id):
            return ControlOutcome.UNKNOWN
        async with self._db.pooled("send_command") as conn, conn.transaction():
            state = await conn.fetchval(Q["job_state"], job_id, tenant)
            if state is None:
                return ControlOutcome.UNKNOWN
            if JobState(state).terminal:
                return ControlOutcome.ALREADY_FINISHED
            await conn.execute(Q["insert_command"], job_id, kind, payload_json)
            await self._control_sent(conn, job_id)
        return ControlOutcome.REQUESTED

    async def read_commands(self, job_id: str, after_seq: int) -> list[Command]:
        async with self._db.pooled("read_commands") as conn:
            rows = await conn.fetch(Q["read_commands"], job_id, after_seq)
        return [_rows.command(r, job_id) for r in rows]

    async def set_waiting(self, event: NewEvent, waiting: bool) -> bool:
        f = event.fence
        to, expected = ("waiting", "running") if waiting else ("running", "waiting")
        async with self._db.pooled("set_waiting") as conn:
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
        return row is not None

    async def control_state(self, job_ids: Sequence[str]) -> tuple[frozenset[str], dict[str, int]]:
        ids = [j for j in job_ids if is_uuid(j)]
        if not ids:
            return frozenset(), {}
        async with self._db.pooled("control_state") as conn:
            cancel = await conn.fetch(Q["control_cancel"], ids)
            seqs = await conn.fetch(Q["control_last_command"], ids)
        return frozenset(r["id"] for r in cancel), {r["job_id"]: int(r["last_seq"]) for r in seqs}


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[JobStore] = PostgresStore
