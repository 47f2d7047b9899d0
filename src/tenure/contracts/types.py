"""Plain data that crosses layers: jobs, claims, fences, executions, events, workers.

Times are seconds since the Unix epoch as read from the *database server's* clock (never a worker's).
JSON values (inputs, results, payloads) cross the store boundary as JSON text: the store never parses them,
and whoever needs the value decodes it once.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from tenure.contracts.children import ChildJob
from tenure.contracts.errors import IdempotencyConflict
from tenure.contracts.states import JobState, WorkerState

DEFAULT_TENANT = "default"


_id_lock = threading.Lock()
_id_last = [0, 0]  # last millisecond, last 12-bit counter


def new_id() -> str:
    """A time-ordered UUID (version 7, RFC 9562 with a 12-bit counter): ids made by one process are strictly
    increasing, and ids sort by creation, so B-tree inserts stay append-only and pages are stable."""
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, counter = _id_last
        if ms <= last_ms:
            ms, counter = last_ms, counter + 1
            if counter > 0xFFF:  # more than 4,096 ids in one millisecond: borrow the next one
                ms, counter = ms + 1, 0
        else:
            counter = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count up
        _id_last[0], _id_last[1] = ms, counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | (0x7 << 76) | counter << 64 | (0b10 << 62) | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_uuid(text: str) -> bool:
    """Whether `text` is a UUID in any of its usual spellings (job and execution ids are)."""
    try:
        uuid.UUID(text)
    except (ValueError, AttributeError, TypeError):
        return False
    return True


def new_token() -> int:
    """A fencing token: 63 random bits, bound to one claim."""
    return int.from_bytes(os.urandom(8), "big") >> 1


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What the control plane knows about an agent: enough to admit, retry and sweep its jobs."""

    name: str
    max_attempts: int = 3
    timeout_s: float | None = None
    retry_safe: bool = False
    requires: frozenset[str] = frozenset()
    priority: int = 0
    worker_quota: str | None = None
    """A global quota whose slot a worker must hold *before* it claims a job of this agent (seed 003 §3.1)."""
    # Scheduling (docs/scheduling.md): jobs of one concurrency key holding its turn at once, the default strategy
    # of a job of a busy key (`MULTITASK`), the cap on waiting jobs (None: none; per mode with modes), the agent a
    # job goes to when it is full, and the modes a job may ask for, best first.
    key_limit: int = 1
    multitask: str = "enqueue"
    max_queued: int | None = None
    degrade_to: str | None = None
    modes: tuple[str, ...] = ()
    budget: tuple[tuple[str, float], ...] = ()
    """The default budget of its jobs, (limit, amount) pairs; a job's own budget overrides it limit by limit
    (`contracts.audit.job_budget`, docs/budgets.md)."""
    # Timeouts a worker applies on its own (worker/timeouts.py, docs/routing.md): seconds; None, the defaults
    # learned from the agent's recent durations on that worker (soft: p95; hard: 2 x p99 within the floor and the
    # job's `timeout_s`); False, none (soft) or only the job's `timeout_s` (hard).
    soft_timeout_s: float | Literal[False] | None = None
    hard_timeout_s: float | Literal[False] | None = None
    prefers: frozenset[str] = frozenset()  # routing (docs/routing.md): features its jobs prefer, merged with theirs
    route_weights: tuple[float, float, float] | None = None  # the score's (load, success, latency); None: default


MULTITASK = ("enqueue", "reject", "interrupt", "drop_queued")
"""The strategies of a job whose concurrency key is busy (docs/scheduling.md): wait for the key's turn, refuse
(409 with the running job's id), cancel the key's running job and take the next turn, or cancel the key's
not-yet-started jobs and take their place."""


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job, ready to insert. Built by `control.admission`, never by a client directly."""

    id: str
    tenant: str
    agent: str
    input_json: str
    priority: int
    requires: tuple[str, ...]
    max_attempts: int
    timeout_s: float | None
    retry_safe: bool
    deadline_s: float | None
    idem_digest: bytes | None
    request_fingerprint: bytes
    # Scheduling (docs/scheduling.md): the concurrency key (per tenant), its limit and the job's `multitask`; the
    # mode asked for, the one it runs in and why they differ; its tenant's step (1 / weight) for fair shares; and
    # its agent's `max_queued` (per `queue_cap_mode` with modes), which the store checks with the insert under a
    # lock on the agent (`AgentQueueFull`), so the cap holds across gateways.
    concurrency_key: str | None = None
    key_limit: int = 1
    multitask: str = "enqueue"
    mode_requested: str | None = None
    mode_effective: str | None = None
    degraded_reason: str | None = None
    fair_step: float = 1.0
    queue_cap_mode: str | None = None
    queue_cap: int | None = None
    budget_json: str | None = None  # the job's limits (docs/budgets.md), written beside the job
    # Coordinators (docs/coordinators.md): the job and execution whose `ctx.spawn` admitted this one.
    parent_job_id: str | None = None
    parent_execution_id: str | None = None
    parent_fence: Fence | None = None  # the spawning execution's fence: checked in the enqueue's transaction
    # Routing (docs/routing.md): the preferred worker, its grace (s from the insert), the explanation (JSON).
    preferred_worker: str | None = None
    preferred_grace_s: float | None = None
    route_json: str | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The answer to one enqueue: the job as the store holds it (the row just inserted, or for a replayed
    idempotency key the existing job), and whether it was created now. Admission answers a client from it,
    without reading the job again."""

    job: Job
    created: bool
    interrupted: tuple[str, ...] = ()  # jobs of its key it asked to cancel (interrupt): signalled after the commit

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self.job.id


def check_replay(existing_job_id: str, existing_fingerprint: bytes, request_fingerprint: bytes) -> None:
    """A request whose idempotency key names an existing job is answered with that job only when it is the same
    request (equal fingerprints); else it is an `IdempotencyConflict`, never a silent reuse. The one rule every
    door applies: the stores' enqueue, admission's replay under a refusal, the in-process placeholder."""
    if existing_fingerprint != request_fingerprint:
        raise IdempotencyConflict(
            "this idempotency key was already used for a different request", existing_job_id=existing_job_id
        )


@dataclass(frozen=True, slots=True)
class Fence:
    """The identity every write of an execution carries: (job, epoch, fencing token)."""

    job_id: str
    epoch: int
    token: int


@dataclass(frozen=True, slots=True)
class Claim:
    """A job this worker owns but has not started. Its fence must match for `start` to succeed."""

    fence: Fence
    agent: str
    input_json: str
    attempts: int  # executions started before this one
    max_attempts: int
    timeout_s: float | None
    retry_safe: bool
    tenant: str
    # Database-clock times for the queue-wait and dispatch metrics (additive; None from older stores).
    created_at: float | None = None
    claimed_at: float | None = None
    mode: str | None = None
    """The mode it runs in (`mode_effective`), for an agent that declares modes (`ctx.mode`)."""


@dataclass(frozen=True, slots=True)
class Start:
    """Ask to move a claimed job to running under a new execution id."""

    fence: Fence
    execution_id: str


@dataclass(frozen=True, slots=True)
class Started:
    """A start that matched: the execution now owns the job. `seq` 1 is its `execution.started` event."""

    fence: Fence
    execution_id: str
    started_at: float
    attempt: int


@dataclass(frozen=True, slots=True)
class Finish:
    """The finish CAS of one execution. `state` is the job's next state (terminal, or SCHEDULED to retry).

    `seq` is the sequence number of the event this finish appends (one past the execution's last event).
    """

    fence: Fence
    execution_id: str
    started_at: float
    state: JobState
    seq: int
    result_json: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    retry_delay_s: float = 0.0
    usage_json: str | None = None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event an execution wants appended; written only while `fence` still owns the job."""

    fence: Fence
    execution_id: str
    seq: int
    type: str
    payload_json: str


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a job's durable history. Its cursor `(epoch, seq)` orders the job's events."""

    job_id: str
    execution_id: str | None
    epoch: int
    seq: int
    type: str
    payload: Any
    ts: float

    @property
    def cursor(self) -> str:
        return f"{self.epoch}-{self.seq}"

    def __getitem__(self, key: str) -> Any:
        """`event["id"]` is `event.to_dict()["id"]` (the cursor): what `tenure.client.Client` answered before it
        returned `Event`s (0.1 gave dicts). Deprecated: use the attributes."""
        return self.to_dict()[key]

    def to_dict(self) -> dict[str, Any]:
        """The event as the HTTP API sends it, with its cursor as `id`."""
        return {
            "id": self.cursor,
            "job_id": self.job_id,
            "execution_id": self.execution_id,
            "epoch": self.epoch,
            "seq": self.seq,
            "type": self.type,
            "payload": self.payload,
            "ts": self.ts,
        }


def parse_cursor(text: str) -> tuple[int, int]:
    """Parse an event cursor `EPOCH-SEQ`; raises ValueError on anything else."""
    epoch, sep, seq = text.partition("-")
    if not sep or not epoch.isdigit() or not seq.isdigit():
        raise ValueError(f"bad event cursor {text!r}: expected EPOCH-SEQ, e.g. 1-42")
    return int(epoch), int(seq)


@dataclass(frozen=True, slots=True)
class Job:
    """The full record of a job as stored."""

    id: str
    tenant: str
    agent: str
    input: Any
    priority: int
    requires: tuple[str, ...]
    state: JobState
    owner: str | None
    epoch: int
    execution_id: str | None
    attempts: int
    max_attempts: int
    timeout_s: float | None
    retry_safe: bool
    result: Any
    error_code: str | None
    error_message: str | None
    created_at: float
    updated_at: float
    claimed_at: float | None
    claim_expires_at: float | None
    execution_started_at: float | None
    next_attempt_at: float | None
    deadline: float | None
    cancel_requested_at: float | None
    finished_at: float | None
    concurrency_key: str | None = None
    key_wait: bool = False
    """Queued behind its concurrency key: not claimable until the key's turn passes to it."""
    mode_requested: str | None = None
    mode_effective: str | None = None
    degraded_reason: str | None = None
    parent_job_id: str | None = None
    """The coordinator job that spawned this one (`ctx.spawn`, docs/coordinators.md), else None."""
    parent_execution_id: str | None = None
    """The coordinator's execution that spawned it (the first one: a retried parent reuses its children)."""
    children: tuple[ChildJob, ...] | None = None
    """The jobs it spawned (id, agent, state), read for one job (`GET /v1/jobs/{id}`, `tenure job`); None in lists."""

    def to_dict(self) -> dict[str, Any]:
        """The job as the HTTP API answers it (JSON types: `state` its value, `requires` a list)."""
        out = dataclasses.asdict(self)
        out["state"] = self.state.value
        out["requires"] = list(self.requires)
        out["children"] = None if self.children is None else [c.to_dict() for c in self.children]
        return out

    def __getitem__(self, key: str) -> Any:
        """`job["state"]` is `job.to_dict()["state"]`: what `tenure.client.Client` answered before it returned
        `Job`s (0.1 gave dicts). Deprecated: use the attributes."""
        return self.to_dict()[key]


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What `list_jobs` selects. `before` is an exclusive cursor on job id (ids sort by creation)."""

    tenant: str | None = None
    state: JobState | None = None
    agent: str | None = None
    before: str | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class Execution:
    """One real attempt at a job. Written when the attempt ends (by its owner, or by the sweeper if lost)."""

    id: str
    job_id: str
    epoch: int
    worker_id: str
    started_at: float
    ended_at: float | None
    outcome: str | None
    usage: Any = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker incarnation in the registry."""

    id: str
    host: str
    pid: int
    concurrency: int
    agents: tuple[str, ...]
    capabilities: tuple[str, ...] = ()
    state: WorkerState = WorkerState.ACTIVE
    in_flight: int = 0
    started_at: float | None = None
    last_heartbeat: float | None = None
    jobs_held: tuple[str, ...] = ()
    # The profile (contracts/profile.py, docs/routing.md): features, the worker's own record, a drain request.
    features: tuple[str, ...] = ()
    success_rate: float | None = None
    latency_ms: float | None = None
    consecutive_timeouts: int = 0
    drain_requested: bool = False
    agent_specs: str = "{}"
    """Written at registration (contracts/profile.py `specs_json`); not part of `to_dict`."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["agent_specs"]
        out["state"] = self.state.value
        out["agents"] = list(self.agents)
        out["capabilities"] = list(self.capabilities)
        out["features"] = list(self.features)
        out["jobs_held"] = list(self.jobs_held)
        return out


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """What one heartbeat learned: which held jobs are still ours, and which of them have a cancel request."""

    renewed: frozenset[str]
    cancel_requested: frozenset[str]
    drain: bool = False
    """An operator asked this worker to drain (`tenure drain`), within `drain_timeout_s` (None: its own)."""
    drain_timeout_s: float | None = None

    def lost(self, held: Sequence[Fence]) -> list[Fence]:
        return [f for f in held if f.job_id not in self.renewed]


@dataclass(frozen=True, slots=True)
class JobCounts:
    """Unfinished jobs right now (for metrics): by state, and the ready queue (queued, unclaimed) by tenant.

    Finished jobs are not counted here (that would scan all history); their counters are in the metrics.
    """

    by_state: Mapping[str, int]
    ready_by_tenant: Mapping[str, int]

    @property
    def ready(self) -> int:
        return sum(self.ready_by_tenant.values())

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[str, str, int]]) -> JobCounts:
        """Build from `count_live_jobs` rows: ('ready', tenant, n) | (state, '', n)."""
        by_state: dict[str, int] = {}
        ready: dict[str, int] = {}
        for kind, tenant, n in rows:
            if not n:
                continue
            if kind == "ready":
                ready[tenant] = ready.get(tenant, 0) + int(n)
                kind = "queued"
            by_state[kind] = by_state.get(kind, 0) + int(n)
        return cls(by_state, ready)


@dataclass(slots=True)
class SweepReport:
    """What one sweep did, by job id."""

    released: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    due: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    workers_gone: list[str] = field(default_factory=list)

    def total(self) -> int:
        return sum(len(v) for v in dataclasses.asdict(self).values())

    def as_dict(self) -> Mapping[str, list[str]]:
        return dataclasses.asdict(self)


class ControlOutcome(StrEnum):
    """The answer to a control command (cancel, input, approve) once it is persisted.

    `requested`: written to the job; its owner learns of it from the live channel or its next heartbeat.
    `accepted`: the command took effect (a queued, unowned job was cancelled by the store itself, or the owner
    acted on it while the caller waited). `already_finished`: the job is terminal, nothing was written.
    `unknown`: no such job (or it belongs to another tenant), nothing was written.
    """

    REQUESTED = "requested"
    ACCEPTED = "accepted"
    ALREADY_FINISHED = "already_finished"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Command:
    """A persisted control command for a job's owner: `input` (payload = the input) or `approve`
    (payload = {"approved": bool, ...}). `seq` orders a job's commands from 1."""

    job_id: str
    seq: int
    kind: str
    payload: Any
    ts: float


@dataclass(frozen=True, slots=True)
class EventNotice:
    """A hint that a job's history grew. `events` carries the appended events when the live channel could
    (Postgres NOTIFY under its size limit); otherwise it is empty and readers catch up from history.
    `job_ids` None means "any job may have changed" (SQLite polling, a re-established listener)."""

    job_ids: frozenset[str] | None
    events: tuple[Event, ...] = ()
