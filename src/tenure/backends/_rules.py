"""The store's domain rules, written once for every dialect: pure functions that both dialects call, or whose
result the SQL is given as a parameter.

What stays in each dialect's SQL is the shape of a conditional update (which row, which fence, which state it
expects, which columns a target state resets) and the values only the database knows at write time (its clock,
the attempt counter it increments). What is decided here is everything a reader would otherwise have to compare
across two files in two languages:

    check_lease_args     the argument errors of every `Leases` backend (SQLite, PostgreSQL, Redis)
    job_values           a new job's 24 insert parameters, in the order both enqueue statements take them
    CIRCUIT_KEEP_S       how long a circuit's failures are kept (the longest window)
    pending_migrations   which numbered migrations a database needs, or why it cannot be migrated
    lost_outcome         the sweeper's decision for an execution whose owner stopped heartbeating, and its event
    finish_effects       what a matched finish CAS writes besides the job row: the event, the execution record,
                         the circuit breaker's count
    waiting_info         why a queued job waits, from the rows both dialects read (jobs ahead, other tenants'
                         jobs ahead, its turn, its key's holders, its agent's waiting jobs)
    EXPIRED_EVENT, CANCELLED_EVENT, REQUEUED_EVENT   the events a store appends on its own (requeued_event: with
                         an edited input)

Two rules are used above the backends too, so they live in `contracts.types`: the idempotency answer
(`check_replay`) and the circuit breaker's arithmetic over the store's failure window
(`CircuitState.from_window`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tenure.contracts.errors import AgentQueueFull, MigrationError, OwnershipLost
from tenure.contracts.profile import WorkerRecord
from tenure.contracts.reports import StoreHealth, WaitingInfo
from tenure.contracts.states import JobState
from tenure.contracts.types import Finish, NewJob

# -- leases ------------------------------------------------------------------------------------------------------------


def check_lease_args(limit: int, ttl_s: float) -> None:
    """The `Leases` contract's argument errors, raised before any round trip (`limit` 0 where a call takes none)."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")


# -- the circuit breaker -------------------------------------------------------------------------------------------------

CIRCUIT_KEEP_S = 3600.0
"""Failures older than this are forgotten when a new one is counted: the longest window a circuit may use."""


# -- migrations ----------------------------------------------------------------------------------------------------------

Migration = tuple[int, str, str]
"""(version, name, sql), as `backends._queries.load_migrations` reads them."""


def pending_migrations(current: int, migrations: Sequence[Migration]) -> Sequence[Migration]:
    """The migrations a database at schema version `current` still needs, in order. Raises `MigrationError` for
    a database newer than this code (never migrate it down, never run against it)."""
    if current > len(migrations):
        raise MigrationError(
            f"the database schema is at version {current}, newer than this code knows ({len(migrations)}); upgrade tenure"
        )
    return migrations[current:]


def migration_failed(migration: Migration, exc: BaseException) -> MigrationError:
    """The error for a migration the database refused (raise it `from exc`)."""
    version, name, _ = migration
    return MigrationError(f"migration {version:04d}_{name} failed: {exc}")


# -- events a store writes on its own -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """An event a store appends by itself (the execution is gone or never started): its type and payload."""

    type: str
    payload_json: str


def _event(type: str, **payload: object) -> StoreEvent:
    return StoreEvent(type, json.dumps(payload))


def lost_outcome(retry_safe: bool, attempts: int, max_attempts: int) -> JobState:
    """The sweeper's decision for a running or waiting job whose owner stopped heartbeating: `lost` (its side
    effects may have happened), unless its agent is retry-safe — then `queued` again while attempts remain, else
    `dead`."""
    if not retry_safe:
        return JobState.LOST
    return JobState.QUEUED if attempts < max_attempts else JobState.DEAD


def lost_event(state: JobState, worker_id: str) -> StoreEvent:
    """The event the sweeper appends after the lost execution's last one, for the `lost_outcome` `state`."""
    kind = "execution.lost" if state is JobState.QUEUED else f"job.{state.value}"
    return _event(kind, state=state.value, error_code="owner_lost", worker_id=worker_id)


EXPIRED_EVENT = _event("job.expired", state="expired", error_code="deadline_exceeded")
"""A queued or scheduled job past its queue deadline."""

CANCELLED_EVENT = _event("job.cancelled", state="cancelled", error_code="cancelled")
"""A job cancelled before it started."""

REQUEUED_EVENT = StoreEvent("job.requeued", "{}")
"""A terminal job an operator put back in the queue."""


def requeued_event(input_edited: bool) -> StoreEvent:
    """The event of a requeue: `REQUEUED_EVENT`, or with `{"input_edited": true}` when the operator edited the
    input (the previous and the new input are then an audit record of kind `requeue`)."""
    return _event("job.requeued", input_edited=True) if input_edited else REQUEUED_EVENT


# -- the finish ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FinishEffects:
    """What a matched finish CAS writes besides the job row (in the same transaction): the finishing event's
    type, the execution record's outcome, and whether the finish counts in its agent's circuit breaker."""

    event_type: str
    outcome: str
    counts_in_circuit: bool


def finish_effects(finish: Finish) -> FinishEffects:
    """A retry (`scheduled`) is the execution failing, told as `execution.retrying`; any other state is the job's
    terminal event. A timed-out execution counts in its agent's circuit breaker window."""
    retry = finish.state is JobState.SCHEDULED
    return FinishEffects(
        event_type="execution.retrying" if retry else f"job.{finish.state.value}",
        outcome="failed" if retry else finish.state.value,
        counts_in_circuit=finish.error_code == "timeout",
    )


def finish_payload(finish: Finish, next_attempt_at: float | None) -> str:
    """The finishing event's payload, with the retry time the database computed (`None` unless a retry).
    PostgreSQL builds the same object inside its one-statement finish, where that time is known."""
    return json.dumps(
        {
            "state": finish.state.value,
            "result": None if finish.result_json is None else json.loads(finish.result_json),
            "error_code": finish.error_code,
            "error": finish.error_message,
            "next_attempt_at": next_attempt_at,
        }
    )


# -- concurrency keys --------------------------------------------------------------------------------------------------
# A keyed job either holds one of its key's `key_limit` turns (`key_wait` false: claimable like any job) or waits
# for one (`key_wait` true: outside the claim's index, so the claim never reads it). Every decision about a
# key is made here, under the key's lock (PostgreSQL: an advisory lock on the key; SQLite: the write lock), from
# the key's live jobs (`KeyedJob`, oldest first); each dialect only reads those rows and writes the outcome.


@dataclass(frozen=True, slots=True)
class KeyedJob:
    """One live (queued, scheduled, running, waiting) job of a concurrency key, as the key's lock holder reads it."""

    id: str
    state: str
    key_wait: bool
    key_limit: int
    started: bool
    """An execution of it has started (running or waiting): `drop_queued` may not replace it."""

    @property
    def holds(self) -> bool:
        return not self.key_wait


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """What the enqueue of a keyed job does, decided before its insert: `reject` (the id of a job holding the
    key: the enqueue raises `KeyBusy`), else insert with `wait`, then cancel the unstarted jobs `drop` (replaced)
    and ask the owners of `interrupt` to cancel."""

    reject: str | None = None
    wait: bool = False
    drop: tuple[str, ...] = ()
    interrupt: tuple[str, ...] = ()


def key_plan(multitask: str, limit: int, live: Sequence[KeyedJob]) -> KeyPlan:
    """The enqueue's plan for a new job of a key whose live jobs are `live` (oldest first).

    The key is busy when its holders fill `limit`. A new job waits when the key is busy or others already wait
    (turns pass in order). `reject` refuses a busy key; `interrupt` cancels every started holder (the cancellation
    protocol: a persisted flag its owner sees) and waits for its turn; `drop_queued` cancels the key's jobs that
    never started (they end `cancelled`, replaced) and takes their place."""
    holders = [j for j in live if j.holds]
    busy = len(holders) >= limit
    if multitask == "reject" and busy:
        running = [j for j in holders if j.started] or holders
        return KeyPlan(reject=running[0].id)
    if multitask == "drop_queued":
        drop = tuple(j.id for j in live if not j.started)
        left = [j for j in holders if j.started]
        return KeyPlan(wait=len(left) >= limit, drop=drop)
    waiting = any(j.key_wait for j in live)
    if multitask == "interrupt":
        return KeyPlan(wait=busy or waiting, interrupt=tuple(j.id for j in holders if j.started))
    return KeyPlan(wait=busy or waiting)


def key_promotions(live: Sequence[KeyedJob]) -> list[str]:
    """The waiting jobs of a key that take a turn now (oldest first): as many as the key's free turns, the limit
    being the oldest waiter's. Called under the key's lock after a holder ended (finish, cancel, sweep)."""
    waiting = [j for j in live if j.key_wait]
    if not waiting:
        return []
    free = waiting[0].key_limit - sum(1 for j in live if j.holds)
    return [j.id for j in waiting[: max(0, free)]]


def dropped_message(new_job_id: str) -> str:
    """The error message of a job a `drop_queued` job replaced."""
    return f"replaced by job {new_job_id} (multitask drop_queued) before it started"


DROPPED_EVENT = _event("job.cancelled", state="cancelled", error_code="replaced")
"""A not-yet-started job of a key, replaced by a `drop_queued` job."""


# -- per-agent queue caps ----------------------------------------------------------------------------------------------


def check_queue_cap(job_id: str, agent: str, cap: int | None, waiting: int) -> None:
    """Raise `AgentQueueFull` when `waiting` jobs of `agent` (counted under the agent's lock, this batch's own
    inserts included) already fill its cap."""
    if cap is not None and waiting >= cap:
        raise AgentQueueFull(
            f"agent {agent!r} has {waiting} jobs waiting to start; its limit (max_queued) is {cap}", job_id, agent, waiting
        )


# -- coordinators (docs/coordinators.md) ------------------------------------------------------------------------------


def check_parent_owns(job: NewJob, owns: bool) -> None:
    """A child (`ctx.spawn`) is admitted only while its parent's fence still owns a running or waiting job, in the
    enqueue's own transaction (a stale epoch admits nothing): else `OwnershipLost`, and nothing is written."""
    if job.parent_fence is not None and not owns:
        f = job.parent_fence
        raise OwnershipLost(f"job {f.job_id} is no longer owned by epoch {f.epoch}: it spawns no child")


# -- why a job waits ---------------------------------------------------------------------------------------------------


def waiting_info(ahead: Any, bound: int, turn: float, holders: Sequence[str], agent_waiting: int | None) -> WaitingInfo:
    """A `WaitingInfo` from the row of `jobs_ahead` (n: claimable jobs ahead, counted up to `bound`; others: of
    them, other tenants' jobs of the job's priority), the job's turn, its key's holders (a job waiting for its
    key's turn) and its agent's waiting jobs (`queued_of_agent_upto`, None without a cap)."""
    n = int(ahead["n"])
    return WaitingInfo(n, n >= bound, tuple(holders), int(ahead["others"] or 0), float(turn), agent_waiting)


# -- store health -----------------------------------------------------------------------------------------------------


def store_health(horizon: Any, tables: Sequence[Any]) -> StoreHealth:
    """A `StoreHealth` from the rows of `health_xmin_horizon` (age_s, holder; none when nothing holds the horizon)
    and `health_tables` (name, dead, live, bytes)."""
    age, holder = (0.0, None) if horizon is None else (max(0.0, float(horizon["age_s"])), horizon["holder"])
    return StoreHealth(
        age,
        holder,
        {r["name"]: int(r["dead"]) for r in tables},
        {r["name"]: int(r["live"]) for r in tables},
        {r["name"]: int(r["bytes"]) for r in tables},
    )


def record_params(record: WorkerRecord | None) -> tuple[float | None, float | None, int | None]:
    """The heartbeat's record parameters, in both dialects' order: success rate, latency EWMA (ms), hard timeouts
    in a row; all NULL without a record, so the row keeps its own (docs/routing.md)."""
    if record is None:
        return None, None, None
    return record.success_rate, record.latency_ms, record.consecutive_timeouts


def job_values(j: NewJob, key_wait: bool) -> tuple[Any, ...]:
    """The 24 parameters of a new job's insert, in the order both dialects' enqueue statements take them
    (PostgreSQL's `enqueue_jobs` as parallel arrays, SQLite's `insert_job` per row). `key_wait`: its concurrency key
    has no free turn (decided under the key's lock, one job at a time)."""
    return (
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
        j.concurrency_key,
        j.key_limit,
        key_wait,
        j.mode_requested,
        j.mode_effective,
        j.degraded_reason,
        j.fair_step,
        j.parent_job_id,
        j.parent_execution_id,
        j.preferred_worker,
        j.preferred_grace_s,
        j.route_json,
    )
