"""`Insights`: the read side the dashboard needs, beside the `Store` and never inside it.

The store's protocol is what runs jobs (conditional updates, fenced writes); these are the questions a person
asks of the fleet: a keyset page of jobs under filters, counts by state, what finished in the last hour, how
long jobs waited, which circuits failed, which jobs hold or wait for a quota's leases. Each backend answers them
with named queries of its own (`backends/<dialect>/insights.sql`), on connections of their own, so a person
paging through a million rows never queues behind a worker's claim.

Every answer is bounded by construction, whatever the table's size: pages are keyset pages on an index (no
OFFSET), counts stop at a cap (`count_by_state(cap=...)`: a count equal to the cap means "at least"), a filter
that no index serves (the agent) looks at a bounded window of jobs and says where it stopped, and the hour's
latencies are read from a bounded sample of the newest jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tenure.contracts.states import JobState

COUNT_CAP = 100_000
"""Counts by state stop here: the jobs page shows "100,000+" rather than scan a table of history."""

AGENT_WINDOW = 20_000
"""Jobs an agent filter looks through per page before it says where it stopped (no index serves it)."""


def id_floor(ts: float) -> str:
    """The smallest job id (a UUIDv7, see `new_id`) that can have been made at or after `ts`: ids sort by their
    creation time, so "jobs made since `ts`" is a range of the primary key."""
    ms = max(0, int(ts * 1000))
    value = (ms & ((1 << 48) - 1)) << 80
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True, slots=True)
class JobQuery:
    """One page of the jobs list: newest first, strictly older than `before` (a job id), at most `limit` rows.

    `tenant` None means every tenant (the admin). `id_from`..`id_to` (inclusive) is a range of ids (a search by
    id prefix). `agent` is looked for among the next `agent_window` jobs only (see `JobPage.scanned_to`)."""

    tenant: str | None = None
    state: JobState | None = None
    agent: str | None = None
    before: str | None = None
    limit: int = 50
    id_from: str | None = None
    id_to: str | None = None
    agent_window: int = AGENT_WINDOW


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A row of the jobs list: what a person scans for, without the input and the result."""

    id: str
    tenant: str
    agent: str
    state: JobState
    priority: int
    epoch: int
    attempts: int
    max_attempts: int
    owner: str | None
    worker: str | None
    """The worker of the job's current or last execution (its owner while it is owned)."""
    execution_id: str | None
    error_code: str | None
    error_message: str | None
    created_at: float
    updated_at: float
    finished_at: float | None


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of jobs. `next_before` continues the list (None at its end). With an agent filter a short page may
    stop before the end: `scanned_to` is then the oldest id looked at, and `next_before` starts after it."""

    jobs: list[JobSummary]
    next_before: str | None
    scanned_to: str | None = None


@dataclass(frozen=True, slots=True)
class FinishedBucket:
    """Jobs that finished in one minute (`minute` = its start, seconds since the epoch), in one state."""

    minute: int
    state: str
    count: int


@dataclass(frozen=True, slots=True)
class LatencySample:
    """One job's queue wait (admitted → claimed) and dispatch (claimed → started), database clock; None when the
    job has not got that far."""

    queue_wait_s: float | None
    dispatch_s: float | None


@dataclass(frozen=True, slots=True)
class CircuitFailures:
    """Failures counted for one circuit key since the time asked for, and the last one."""

    key: str
    failures: int
    last_failure_at: float


@runtime_checkable
class Insights(Protocol):
    """Read-only questions about the fleet, each one bounded (see the module docstring)."""

    async def job_page(self, q: JobQuery) -> JobPage:
        """A keyset page of the jobs list."""
        ...

    async def jobs_by_idempotency(self, keys: Sequence[tuple[str, bytes]]) -> list[JobSummary]:
        """The jobs made under these (tenant, idempotency digest) pairs."""
        ...

    async def jobs_by_execution(self, execution_ids: Sequence[str]) -> list[JobSummary]:
        """The owned jobs whose current execution is one of these (quota holders and waiters are executions)."""
        ...

    async def count_by_state(self, tenant: str | None, cap: int = COUNT_CAP) -> Mapping[str, int]:
        """Jobs per state (every state present, 0 included), each count stopping at `cap`."""
        ...

    async def finished_since(self, tenant: str | None, since: float) -> list[FinishedBucket]:
        """Jobs that reached a terminal state since `since`, per minute and state."""
        ...

    async def latency_sample(self, tenant: str | None, since: float, limit: int) -> list[LatencySample]:
        """Queue wait and dispatch of the newest `limit` claimed jobs admitted since `since`."""
        ...

    async def circuit_failures(self, since: float) -> list[CircuitFailures]:
        """Every circuit key with a failure since `since`."""
        ...

    async def tenants(self, limit: int = 1000) -> list[str]:
        """The tenants that have jobs, in order (at most `limit`)."""
        ...

    async def close(self) -> None:
        """Release the connections. Idempotent."""
        ...


__all__ = [
    "AGENT_WINDOW",
    "COUNT_CAP",
    "CircuitFailures",
    "FinishedBucket",
    "Insights",
    "JobPage",
    "JobQuery",
    "JobSummary",
    "LatencySample",
    "id_floor",
]
