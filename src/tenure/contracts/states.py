"""The job state machine: one enum, one table of allowed transitions, one check.

    queued ──claim──▶ queued(owned) ──start CAS──▶ running ⇄ waiting
      │                  │ claim expired before start: released (epoch grows on the next claim)
      ├─▶ cancelled      ▼
      ├─▶ expired     running ──finish CAS──▶ succeeded | failed | cancelled | dead
      │               running ──retryable error, attempts left──▶ scheduled ──due──▶ queued
      │               running, owner lost ──▶ lost (or queued again when the agent is retry-safe)
    scheduled ─▶ cancelled | expired

Ownership (owner, epoch, token) is not a state: a queued job may be owned (claimed, not started).

The table governs: the contract suite logs every state change it makes in either backend (a test-only
trigger on `jobs`) and fails when one is not in `TRANSITIONS` (tests/contract/conftest.py).
"""

from __future__ import annotations

from enum import StrEnum

from tenure.contracts.errors import IllegalTransition


class JobState(StrEnum):
    """Lifecycle of a job."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"  # waiting out a retry backoff (next_attempt_at)
    RUNNING = "running"
    WAITING = "waiting"  # paused for input or approval; holds no worker slot
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    EXPIRED = "expired"
    DEAD = "dead"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST, JobState.EXPIRED, JobState.DEAD}
)
ACTIVE: frozenset[JobState] = frozenset({JobState.RUNNING, JobState.WAITING})
# Terminal states an operator may put back in the queue with `tenure requeue`.
REQUEUEABLE: frozenset[JobState] = TERMINAL - {JobState.SUCCEEDED}

_S = JobState
INITIAL: JobState = _S.QUEUED
"""Every job is admitted in this state."""
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.QUEUED: frozenset({_S.RUNNING, _S.CANCELLED, _S.EXPIRED}),
    _S.SCHEDULED: frozenset({_S.QUEUED, _S.CANCELLED, _S.EXPIRED}),
    _S.RUNNING: frozenset({_S.WAITING, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.DEAD, _S.SCHEDULED, _S.LOST, _S.QUEUED}),
    _S.WAITING: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.DEAD, _S.SCHEDULED, _S.LOST, _S.QUEUED}),
    **{s: frozenset({_S.QUEUED}) for s in REQUEUEABLE},
    _S.SUCCEEDED: frozenset(),
}
# The outcomes an execution may finish with (the finish CAS). SCHEDULED means "retry after a backoff".
FINISH_STATES: frozenset[JobState] = frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLED, _S.DEAD, _S.SCHEDULED})


def check_transition(current: JobState, target: JobState) -> None:
    """Raise `IllegalTransition` unless `current → target` is in the table."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"a job cannot go from {current.value} to {target.value}")


class WorkerState(StrEnum):
    """Lifecycle of a worker incarnation in the registry."""

    WARMING = "warming"  # running its app's warm-up functions: claims nothing yet
    ACTIVE = "active"
    UNHEALTHY = "unhealthy"  # hard timeouts in a row: claims nothing new until its cool-down ends
    DEGRADED = "degraded"  # loop lag over threshold: keeps its claims, claims nothing new
    DRAINING = "draining"
    GONE = "gone"
