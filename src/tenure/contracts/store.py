"""The store protocols the control plane, the gateway and the worker speak; backends implement them.

The store is three protocols, one concern each (as Oban splits its engine from its notifier, and River its
executor from its listener):

    JobStore   the durable truth: jobs, executions, events, commands, workers. Every method that changes a job
               is one conditional update (or a batch of them) that names the state and the fence it expects; a
               write that matches no row did not happen, and the caller is told which ones did.
    Signals    what wakes other processes after a commit (a job became claimable, a history grew, a command was
               sent) and the three waits that hear it. A hint, never a promise: every wait has a timeout, and the
               waiter re-reads the JobStore. One implementation per transport: PostgreSQL NOTIFY / LISTEN, SQLite
               `data_version` polling plus doorbells, Redis pub/sub (`backends/signals.py`).
    Leases     named, heartbeated, per-holder slots (quotas, the sweeper duty). The SQL stores implement it on a
               `leases` table with the database clock; Redis with a ZSET and Lua on Redis's own `TIME`.

`Backends` bundles the three as the composition root opens them (`tenure.app.open_backends`), to be closed once.
Its `jobs` is the JobStore every caller uses: each write of the dialect's store followed by the Signals call
that tells other processes of it (`backends/after_commit.py`), so what happens after a commit is written once,
above the dialects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from tenure.contracts.artifacts import ArtifactStore
from tenure.contracts.audit import AuditRecord, BudgetUse, StepRecord, StoredRecord
from tenure.contracts.children import ChildJob
from tenure.contracts.leases import WAIT_SUFFIX, LeaseRef, Leases, line_key, new_ticket, ticket_holder
from tenure.contracts.profile import JobRoute, WorkerRecord
from tenure.contracts.reports import AdmissionState, CircuitState, GateAsk, StoreHealth, WaitingInfo
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.types import (
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
)

__all__ = [  # the three protocols and their companions, named here; Leases and its key names live in leases.py
    "WAIT_SUFFIX", "Backends", "JobStore", "LeaseRef", "Leases", "OffloadStats", "Signals", "Store",
    "line_key", "new_ticket", "ticket_holder",
]  # fmt: skip

T = TypeVar("T")


class OffloadStats(Protocol):
    """A store's own blocking-call thread seen as a blocking adapter (seed 000), for the metrics: what
    `tenure.observability.metrics.watch_adapter` reads."""

    @property
    def name(self) -> str: ...
    @property
    def max_in_flight(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def completed(self) -> int: ...
    @property
    def failed_closed(self) -> int: ...
    @property
    def rejected_queue_full(self) -> int: ...
    @property
    def rejected_queue_timeout(self) -> int: ...


@runtime_checkable
class JobStore(Protocol):
    """The durable truth (SQLite or PostgreSQL). All times come from the database server's clock."""

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgres`."""
        ...

    @property
    def offload(self) -> OffloadStats | None:
        """The store's connection thread as a blocking adapter of bound 1 (SQLite), for the metrics; None for a
        store whose driver never blocks the loop (PostgreSQL)."""
        ...

    @property
    def claim_carries_finishes(self) -> bool:
        """True when `finish_and_claim` writes both in one commit (SQLite: one write transaction instead of two,
        on a store whose cost is commits and writer turns); the worker then hands its pending finishes to its
        next claim."""
        ...

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version now in place."""
        ...

    async def schema_version(self) -> int:
        """The schema version applied to the database (0 when empty)."""
        ...

    def latest_schema_version(self) -> int:
        """The schema version this code migrates to."""
        ...

    async def server_time(self) -> float:
        """The database server's clock, in seconds since the epoch."""
        ...

    async def server_version(self) -> str:
        """The database server's (or library's) version, for `tenure doctor`."""
        ...

    async def run_between_transactions(self, fn: Callable[[], T]) -> T:
        """Run `fn` (fault injection's freeze) where freezing the process stalls no other process's writes: on
        SQLite, on the connection thread between two transactions (a process frozen inside one would hold the
        database's write lock, stalling every writer on the machine until it resumes)."""
        ...

    async def close(self) -> None:
        """Release connections and background tasks. Idempotent."""
        ...

    # -- admission -----------------------------------------------------------------------------------------
    async def enqueue(self, jobs: Sequence[NewJob], gate: GateAsk | None = None) -> list[Enqueued]:
        """Insert jobs; answer each with the job as inserted. A job whose (tenant, idempotency digest) exists is
        not inserted: its answer is the existing job when the request fingerprint matches, else
        `IdempotencyConflict`. With `gate`, the admission state of its (tenant, agent) is read first, in the same
        round trip or transaction, and `gate.verdict` raises to refuse (nothing is written)."""
        ...

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job | None:
        """One job, or None if it does not exist (or belongs to another tenant when `tenant` is given)."""
        ...

    async def list_jobs(self, flt: JobFilter) -> list[Job]:
        """Jobs matching the filter, newest first."""
        ...

    async def job_route(self, job_id: str) -> JobRoute | None:
        """The routing admission recorded on a job and who started its first attempt (`GET /v1/jobs/{id}`'s
        `route`, docs/routing.md), or None when the job does not exist."""
        ...

    async def requeue(self, job_id: str, tenant: str | None = None, input_json: str | None = None) -> Job:
        """Put a terminal (not succeeded) job back in the queue with fresh attempts. Raises NotFound or
        IllegalTransition. With `input_json`, the job's input becomes it, in the same transaction, and the edit
        is recorded in its audit (a `requeue` record: the previous input and the new one) and its event
        (`job.requeued` with `input_edited`)."""
        ...

    # -- ownership: the three conditional updates -------------------------------------------------------------
    async def claim(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[Claim]:
        """Claim up to `limit` unowned, unstarted queued jobs (epoch + 1, a new token each)."""
        ...

    async def claim_and_start(
        self, worker_id: str, agents: Sequence[str], capabilities: Sequence[str], limit: int, ttl_s: float
    ) -> list[tuple[Claim, Started]]:
        """The claim CAS and then the start CAS of every job it claimed, in one transaction (one round trip,
        one durable commit): the same two conditional updates as `claim` followed by `start`, each with all
        its conditions, under a new execution id per job; appends `execution.started`. Returns each claim
        with its start. No claimed-but-unstarted state is left behind to release or recover."""
        ...

    async def finish_and_claim(
        self,
        worker_id: str,
        finishes: Sequence[Finish],
        agents: Sequence[str],
        capabilities: Sequence[str],
        limit: int,
        ttl_s: float,
    ) -> tuple[list[str], list[tuple[Claim, Started]]]:
        """`finish`, then `claim_and_start`, each unchanged; where `claim_carries_finishes`, in one transaction
        and one durable commit. Returns the job ids whose finish matched, and the claims with their starts."""
        ...

    async def start(self, worker_id: str, starts: Sequence[Start]) -> list[Started]:
        """The start CAS for each claim (owner, epoch, token must match); appends `execution.started`.
        Returns the starts that matched."""
        ...

    async def finish(self, worker_id: str, finishes: Sequence[Finish]) -> list[str]:
        """The finish CAS for each execution (execution id, epoch, token, running/waiting); appends the
        finishing event and the execution record. Returns the job ids whose finish matched."""
        ...

    async def append_events(self, events: Sequence[NewEvent]) -> set[str]:
        """Append events, each only while its fence still owns a running or waiting job.
        Returns the job ids whose events were rejected (their executions lost ownership)."""
        ...

    async def release_claims(self, worker_id: str, fences: Sequence[Fence]) -> list[str]:
        """Give back claims that were never started (drain). Returns the job ids released."""
        ...

    async def heartbeat(
        self, worker_id: str, state: WorkerState, in_flight: int, held: Sequence[Fence], ttl_s: float,
        record: WorkerRecord | None = None,
    ) -> HeartbeatReply:  # fmt: skip
        """One round trip: mark the worker alive (its state, and its `record` when given) and extend every held
        claim still owned by this fence. The reply carries a drain request: once one was made, the row stays
        `draining` whatever state the worker reports (until `gone`)."""
        ...

    # -- registry ------------------------------------------------------------------------------------------------
    async def register_worker(self, info: WorkerInfo) -> None:
        """Insert this worker incarnation into the registry."""
        ...

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        """Record a worker's lifecycle state (draining, gone)."""
        ...

    async def list_workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        """The registry, with the jobs each worker holds."""
        ...

    async def request_drain(self, worker_id: str, timeout_s: float | None) -> WorkerInfo | None:
        """Ask a live worker to drain (it learns of it at its next heartbeat) and mark it `draining`; None when
        no worker of this id is registered and not gone. Asking again replaces the timeout."""
        ...

    async def registry_agents(self) -> list[WorkerInfo]:
        """Every worker not gone, with its agents, their recorded specs (JSON text, contracts/profile.py) and its
        profile (`jobs_held` left empty), most recently started worker first: what admission knows without the
        workers' code, and what its routing scores (control/scoring.py)."""
        ...

    # -- history -------------------------------------------------------------------------------------------------
    async def read_events(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[Event]:
        """A job's history in cursor order, strictly after `after` (epoch, seq)."""
        ...

    async def read_events_many(self, cursors: Sequence[tuple[str, tuple[int, int] | None]], limit: int) -> list[Event]:
        """The histories of several jobs, each strictly after its own cursor, at most `limit` events per job,
        in cursor order within each job: one round trip for a gateway's many live streams."""
        ...

    async def list_executions(self, job_id: str) -> list[Execution]:
        """Every recorded attempt of a job."""
        ...

    # -- the sweeper duty -------------------------------------------------------------------------------------------
    async def sweep(self, worker_ttl_s: float) -> SweepReport:
        """Release expired pre-start claims, mark running jobs with expired claims lost (or requeue them when
        retry-safe), expire queued jobs past their deadline, move due scheduled jobs to queued, and mark
        workers silent for `worker_ttl_s` gone."""
        ...

    # -- metrics ---------------------------------------------------------------------------------------------------
    async def count_live_jobs(self) -> JobCounts:
        """Unfinished jobs by state and the ready queue by tenant, through indexes only (for metrics)."""
        ...

    async def health(self) -> StoreHealth:
        """What holds the store back: the oldest transaction holding back vacuum, dead rows and sizes of its tables
        (from the database's own statistics: a few catalog reads, never a scan of a table)."""
        ...

    # -- the gateway's side: admission counts, control commands ------------------------------------------------------
    async def admission_state(
        self, tenant: str, circuit_key: str, threshold: int, window_s: float, open_s: float, upto: int | None = None
    ) -> AdmissionState:
        """In one round trip, `queue_depth(tenant)` and `circuit_state(circuit_key, threshold, window_s, open_s)`;
        each count stops at `upto` when given (the gate's larger cap + 1: never a walk of the backlog past it)."""
        ...

    async def queue_depth(self, tenant: str) -> tuple[int, int]:
        """Jobs waiting to start (queued or scheduled), counted in the shared store: (all tenants, `tenant`)."""
        ...

    async def find_idempotent(self, tenant: str, idem_digest: bytes) -> tuple[str, bytes] | None:
        """The job a tenant created with this idempotency digest, and its request fingerprint, if any."""
        ...

    async def queued_of_agent(self, agent: str, mode: str | None = None) -> int:
        """Jobs of `agent` waiting to start (queued or scheduled), in the shared store; with `mode`, only those
        whose effective mode it is (the per-agent cap `max_queued`, docs/scheduling.md)."""
        ...

    async def waiting_info(
        self, job_id: str, bound: int, queue_cap: int | None = None, cap_per_mode: bool = False
    ) -> WaitingInfo | None:
        """Why a queued job waits: the claimable jobs ahead of it (counted up to `bound`; of them, other tenants'
        jobs of its priority), its turn, and, if it waits for its concurrency key's turn, the key's holders. With
        `queue_cap` (its agent's `max_queued`), also the jobs of its agent waiting to start (of its effective mode
        with `cap_per_mode`), counted up to the cap. None unless the job is queued and unowned."""
        ...

    async def record_circuit_failure(self, key: str) -> None:
        """Count one failure (a timeout) in the sliding window of circuit `key`, on the server's clock."""
        ...

    async def circuit_state(self, key: str, threshold: int, window_s: float, open_s: float) -> CircuitState:
        """Failures of `key` within the last `window_s`; the circuit is open for `open_s` after the failure that
        brought the count to `threshold` or more (open_for_s > 0 while open)."""
        ...

    async def cancel(self, job_id: str, tenant: str | None = None) -> ControlOutcome:
        """Cancel a job. A queued unowned (or scheduled) job is cancelled at once with its terminal event
        (`accepted`); an owned one gets `cancel_requested_at` (`requested`) for its owner to act on; a terminal
        one is `already_finished`; a missing one (or another tenant's) is `unknown`."""
        ...

    async def send_command(self, job_id: str, tenant: str | None, kind: str, payload_json: str) -> ControlOutcome:
        """Persist a command (`input`, `approve`) for a job that is not terminal (`requested`); else
        `already_finished` or `unknown`, and nothing is written."""
        ...

    async def read_commands(self, job_id: str, after_seq: int) -> list[Command]:
        """A job's commands after `after_seq`, oldest first."""
        ...

    async def set_waiting(self, event: NewEvent, waiting: bool) -> bool:
        """Fenced: move the job running → waiting (`waiting`) or waiting → running, appending `event` in the
        same transaction. False when the fence no longer owns the job in the expected state."""
        ...

    async def control_state(self, job_ids: Sequence[str]) -> tuple[frozenset[str], dict[str, int]]:
        """For these jobs: the ones with a cancel request, and the last command sequence number of each."""
        ...

    async def children(self, job_id: str) -> list[ChildJob]:
        """The jobs `ctx.spawn` admitted for coordinator `job_id` (their `parent_job_id`), oldest first: id, agent
        and state (docs/coordinators.md)."""
        ...

    # -- the audit chain and the effect journal (docs/audit.md, docs/journal.md) -----------------------------------
    async def append_audit(self, records: Sequence[AuditRecord], events: Sequence[NewEvent]) -> set[str]:
        """`append_events(events)` and the audit records, in one transaction: each written only while its fence
        owns a running or waiting job (a duplicate (job, epoch, seq) is ignored). Returns the job ids whose
        events or records were rejected (their executions lost ownership)."""
        ...

    async def read_audit(self, job_id: str, after: tuple[int, int] | None, limit: int) -> list[StoredRecord]:
        """A job's audit records in (epoch, seq) order, strictly after `after`."""
        ...

    async def audit_usage(self, job_id: str) -> dict[str, float]:
        """Every usage counter of a job's usage records, summed over all its executions."""
        ...

    async def read_budget(self, job_id: str) -> BudgetUse | None:
        """A job's budget (written with the job by `enqueue` from `NewJob.budget_json`) and what its executions
        used of it so far; None for a job without a budget."""
        ...

    async def purge_finished(
        self, older_than_s: float, limit: int, by_tenant: Mapping[str, float] | None = None
    ) -> list[str]:
        """Retention: delete up to `limit` jobs that finished (a terminal state) longer ago than their tenant's
        retention on the database clock — `by_tenant[tenant]` seconds for a tenant there, `older_than_s` for every
        other — oldest first, each with its whole history — events, executions, audit records, journal steps,
        budget, commands — in one transaction. Never a job that is not terminal (a requeued one is not). Reading
        the candidates costs one bounded index scan per tenant in `by_tenant` and one for the rest. Returns the
        ids deleted."""
        ...

    async def usage_report(self, from_s: float, to_s: float, group_by: str, tenant: str | None) -> list[dict[str, Any]]:
        """The usage records written in [from_s, to_s) (epoch seconds, database clock), of one tenant or all,
        summed per `group_by` (`tenant`, `agent` or `model`): `key`, `reports`, `input_tokens`, `output_tokens`,
        `cost_usd`, ordered by key."""
        ...

    async def read_steps(self, job_id: str) -> list[StepRecord]:
        """A job's journal, in the order its steps began."""
        ...

    async def begin_step(self, fence: Fence, execution_id: str, key: str) -> StepRecord | None:
        """Fenced: record that this execution begins step `key`, unless the job's journal has that key already.
        Returns the key's row after the write (this begin, or the one already there); None when the fence no
        longer owns the job (nothing was written)."""
        ...

    async def end_step(self, fence: Fence, execution_id: str, key: str, result_json: str) -> bool:
        """Fenced: the step this execution began is `done` with its result. False: nothing was written."""
        ...

    async def resolve_step(self, fence: Fence, key: str, result_json: str) -> bool:
        """Fenced: a step an earlier execution began and never ended is `resolved` with this result (the
        handler's decision). False: nothing was written."""
        ...

    async def clear_step(self, fence: Fence, execution_id: str, key: str) -> bool:
        """Fenced: forget the begin of a step whose function raised. False: nothing was written."""
        ...


@runtime_checkable
class Signals(Protocol):
    """What wakes other processes after a commit, and the waits that hear it.

    The publishing half (`jobs_changed`, `events_changed`, `control_sent`) is called once per committed write,
    after the commit, with what the write returned (`backends/after_commit.py`); it never blocks and never
    raises. An implementation whose transport rides inside the transaction (PostgreSQL's NOTIFY, sent by the
    SQL at commit) has nothing left to do there. The waiting half returns early on a hint or after `timeout_s`;
    a hint is never a promise, and a waiter always re-reads the JobStore."""

    def jobs_changed(self) -> None:
        """A commit made jobs claimable (enqueued, released, requeued, due again)."""
        ...

    def events_changed(self, job_ids: Iterable[str]) -> None:
        """A commit appended to these jobs' histories."""
        ...

    def control_sent(self, job_ids: Iterable[str]) -> None:
        """A commit gave these jobs a cancel request or a command for their owners."""
        ...

    async def wait_for_jobs(self, timeout_s: float) -> None:
        """Return when new work may be claimable (NOTIFY on Postgres, a change of the database on SQLite),
        or after `timeout_s`. A wake-up is a hint, never a promise."""
        ...

    async def wait_for_events(self, timeout_s: float) -> list[EventNotice]:
        """Return the notices of appended events since the last call, waiting up to `timeout_s` for one
        (an empty list on timeout). One consumer per instance (the gateway's event hub)."""
        ...

    async def wait_for_control(self, timeout_s: float) -> frozenset[str] | None:
        """Return the ids of jobs that got a control command (cancel request, input, approval) since the last
        call, waiting up to `timeout_s` (an empty set on timeout; None: any job may have, check them all).
        A hint for the owners' fast path; the heartbeat reply stays the floor. One consumer per instance."""
        ...

    async def close(self) -> None:
        """Stop listening and release connections. Idempotent."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class Backends:
    """The three store protocols of one process, opened together by the composition root
    (`tenure.app.open_backends`) and closed once with `close`.

    `jobs` already sends its writes' signals (see the module docstring): callers never call the publishing half
    of `signals` themselves, only its waits. `leases` is the store's own `leases` table (the sweeper duty, and
    quotas unless `TENURE_REDIS_URL` puts them on Redis, see `tenure.app.open_quotas`)."""

    jobs: JobStore
    signals: Signals
    leases: Leases
    artifacts: ArtifactStore | None = None
    """Results and evidence over the threshold (docs/artifacts.md); None: every result is inline (at most 1 MiB)."""

    async def close(self) -> None:
        """Close the signals (their listeners and outbox), then the leases, then the job store, which owns the
        connections the other two may share. Each close is idempotent, so this is too."""
        try:
            await self.signals.close()
        finally:
            try:
                await self.leases.close()
            finally:
                try:
                    if self.artifacts is not None:
                        await self.artifacts.close()
                finally:
                    await self.jobs.close()


Store = JobStore
"""The name callers used before the store was split in three; new code names `JobStore`."""


__all__ = [
    "WAIT_SUFFIX",
    "Backends",
    "JobState",
    "JobStore",
    "LeaseRef",
    "Leases",
    "OffloadStats",
    "Signals",
    "Store",
    "line_key",
    "new_ticket",
    "ticket_holder",
]
