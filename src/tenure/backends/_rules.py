"""The store's domain rules, written once for every dialect: pure functions that both dialects call, or whose
result the SQL is given as a parameter.

What stays in each dialect's SQL is the shape of a conditional update (which row, which fence, which state it
expects, which columns a target state resets) and the values only the database knows at write time (its clock,
the attempt counter it increments). What is decided here is everything a reader would otherwise have to compare
across two files in two languages:

    check_lease_args     the argument errors of every `Leases` backend (SQLite, PostgreSQL, Redis)
    CIRCUIT_KEEP_S       how long a circuit's failures are kept (the longest window)
    pending_migrations   which numbered migrations a database needs, or why it cannot be migrated
    lost_outcome         the sweeper's decision for an execution whose owner stopped heartbeating, and its event
    finish_effects       what a matched finish CAS writes besides the job row: the event, the execution record,
                         the circuit breaker's count
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

from tenure.contracts.errors import MigrationError
from tenure.contracts.profile import WorkerRecord
from tenure.contracts.states import JobState
from tenure.contracts.types import Finish, StoreHealth

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
