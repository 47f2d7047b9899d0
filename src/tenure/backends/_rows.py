"""Rows to domain types, by column name, for both dialects (asyncpg's `Record` and `sqlite3.Row` both answer
`row["name"]`). Never by position: a column added to a query, or two swapped, cannot shift the meaning of the
others. The queries name every column these read (`AS name` where an expression has none).

Where the dialects store a value differently the caller says how to decode it: lists of names are arrays on
PostgreSQL, and on SQLite comma-separated text (`jobs.requires`) or a JSON array (`workers.agents`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tenure.backends._rules import KeyedJob
from tenure.contracts.audit import StoredRecord
from tenure.contracts.profile import JobRoute
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.types import Claim, Command, Event, Execution, Fence, Job, Started, WorkerInfo

Names = Callable[[Any], tuple[str, ...]]
"""How a dialect stores a list of names."""


class Row(Protocol):
    """A database row read by column name."""

    def __getitem__(self, key: str, /) -> Any: ...


def array(value: Sequence[str]) -> tuple[str, ...]:
    """A driver array (PostgreSQL `text[]`)."""
    return tuple(value)


def comma_list(value: str) -> tuple[str, ...]:
    """Comma-separated text (SQLite's `jobs.requires`; tags never contain a comma)."""
    return tuple(t for t in value.split(",") if t)


def json_list(value: str) -> tuple[str, ...]:
    """A JSON array in text (SQLite's `workers.agents`, `workers.capabilities`, `jobs_held`)."""
    return tuple(json.loads(value))


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def job(r: Row, tags: Names = array) -> Job:
    """A `jobs` row as `get_job` and `list_jobs` select it."""
    return Job(
        id=r["id"],
        tenant=r["tenant"],
        agent=r["agent"],
        input=json.loads(r["input"]),
        priority=r["priority"],
        requires=tags(r["requires"]),
        state=JobState(r["state"]),
        owner=r["owner"],
        epoch=r["epoch"],
        execution_id=r["execution_id"],
        attempts=r["attempts"],
        max_attempts=r["max_attempts"],
        timeout_s=r["timeout_s"],
        retry_safe=bool(r["retry_safe"]),
        result=_json(r["result"]),
        error_code=r["error_code"],
        error_message=r["error_message"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        claimed_at=r["claimed_at"],
        claim_expires_at=r["claim_expires_at"],
        execution_started_at=r["execution_started_at"],
        next_attempt_at=r["next_attempt_at"],
        deadline=r["deadline"],
        cancel_requested_at=r["cancel_requested_at"],
        finished_at=r["finished_at"],
        concurrency_key=r["concurrency_key"],
        key_wait=bool(r["key_wait"]),
        mode_requested=r["mode_requested"],
        mode_effective=r["mode_effective"],
        degraded_reason=r["degraded_reason"],
        parent_job_id=r["parent_job_id"],
        parent_execution_id=r["parent_execution_id"],
    )


def keyed(r: Row) -> KeyedJob:
    """A live job of a concurrency key as `key_live` reads it."""
    return KeyedJob(r["id"], r["state"], bool(r["key_wait"]), r["key_limit"], bool(r["started"]))


def claim(r: Row, token: int, attempts: int | None = None) -> Claim:
    """A claimed job as the claim CAS returns it (`attempts`: executions started before this claim, when the row
    counts the start that followed it)."""
    return Claim(
        fence=Fence(r["id"], r["epoch"], token),
        agent=r["agent"],
        input_json=r["input"],
        attempts=r["attempts"] if attempts is None else attempts,
        max_attempts=r["max_attempts"],
        timeout_s=r["timeout_s"],
        retry_safe=bool(r["retry_safe"]),
        tenant=r["tenant"],
        created_at=r["created_at"],
        claimed_at=r["claimed_at"],
        mode=r["mode"],
    )


def started(r: Row, fence: Fence, execution_id: str) -> Started:
    """A start CAS that matched: `attempts` counts this one, `started_at` is the database clock."""
    return Started(fence, execution_id, r["started_at"], r["attempts"])


def event(r: Row, job_id: str | None = None) -> Event:
    """An `events` row (`job_id` given when the query does not select it)."""
    return Event(
        job_id=r["job_id"] if job_id is None else job_id,
        execution_id=r["execution_id"],
        epoch=r["epoch"],
        seq=r["seq"],
        type=r["type"],
        payload=_json(r["payload"]),
        ts=r["ts"],
    )


def execution(r: Row) -> Execution:
    """An `executions` row."""
    return Execution(
        id=r["id"],
        job_id=r["job_id"],
        epoch=r["epoch"],
        worker_id=r["worker_id"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        outcome=r["outcome"],
        usage=_json(r["usage"]),
    )


def command(r: Row, job_id: str) -> Command:
    """A `job_commands` row."""
    return Command(job_id, r["seq"], r["kind"], _json(r["payload"]), r["created_at"])


def worker(r: Row, names: Names = array) -> WorkerInfo:
    """A `workers` row with the jobs the worker holds."""
    return WorkerInfo(
        id=r["id"],
        host=r["host"],
        pid=r["pid"],
        concurrency=r["concurrency"],
        agents=names(r["agents"]),
        capabilities=names(r["capabilities"]),
        state=WorkerState(r["state"]),
        in_flight=r["in_flight"],
        started_at=r["started_at"],
        last_heartbeat=r["last_heartbeat"],
        jobs_held=names(r["jobs_held"]),
        features=names(r["features"]),
        success_rate=r["success_rate"],
        latency_ms=r["latency_ms"],
        consecutive_timeouts=r["consecutive_timeouts"],
        drain_requested=bool(r["drain_requested"]),
        agent_specs=r["agent_specs"],
    )


def job_route(r: Row) -> JobRoute:
    """A `job_route` row."""
    return JobRoute(r["preferred_worker"], r["preferred_until"], r["route"], r["claimed_by"], r["claimed_at"], r["now"])


def stored_record(r: Row) -> StoredRecord:
    """An audit record as read back (`read_records`)."""
    return StoredRecord(
        r["job_id"],
        r["epoch"],
        r["seq"],
        r["execution_id"],
        r["kind"],
        r["name"],
        json.loads(r["data"]),
        r["started_at"],
        r["ended_at"],
        r["ts"],
    )
