"""Routing at admission: the preferred worker of each job (`RouteChooser`, docs/routing.md), and (docs/scheduling.md)
per-agent queue caps (`max_queued`, counted in the store, so every
gateway and `tenure submit` see the same count) and degradation to a fallback agent, in seed 002's order: route,
else queue, else degrade, else reject. `Admission.admit` (the one door) calls it for every job.

The cap is counted and the job inserted in one transaction under a lock on the agent (`JobStore.enqueue` of a
job carrying `queue_cap`), so it holds across gateways and processes; the gate's global and per-tenant caps are
still a count and then an insert.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from tenure.contracts.errors import AgentQueueFull
from tenure.contracts.profile import offers
from tenure.contracts.reports import GateAsk
from tenure.contracts.states import WorkerState
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, Enqueued, NewJob
from tenure.control.directory import AgentDirectory
from tenure.control.gate import QueueFull
from tenure.control.scoring import DEFAULT_WEIGHTS, Decision, decide, limit_ms_of, strict_requires

QUIET_DECISIONS = 256
"""The most routing decisions without a preference an admission door remembers (`RouteChooser.choose`)."""


def routed_requires(requires: frozenset[str], prefers: frozenset[str], strict: bool) -> frozenset[str]:
    """A job's whole requirement: a strict job's preferred features join it as `feature:NAME`, which the claim
    then enforces unchanged (a worker claims with `feature:F` for each feature it offers; docs/routing.md)."""
    return requires | strict_requires(prefers) if strict else requires


class InlineWorker(Protocol):
    """What the local fast path reads of a gateway's in-process worker (`tenure up --inline`; worker.Worker)."""

    id: str

    @property
    def agents(self) -> Sequence[str]: ...

    @property
    def state(self) -> WorkerState: ...

    def free_slots(self) -> int: ...

    def claim_tags(self) -> Sequence[str]: ...


class LocalPath:
    """Seed 000's local fast path: a gateway whose in-process worker serves the agent, offers what the job
    requires, is `active` and has a slot free that no job routed to it is already waiting for prefers that worker
    for the job it admits, before any score (docs/routing.md). The job is then its for the grace, so no other
    worker's claim wins the race; the worker is woken in process. Jobs routed to it count against its free slots
    until it claims them (`claimed`, called by the worker) or their grace ends."""

    def __init__(self, worker: InlineWorker, concurrency: int) -> None:
        self.worker = worker
        self.concurrency = concurrency
        self.agents = frozenset(worker.agents)
        self.tags = tuple(worker.claim_tags())
        self.pending: dict[str, float] = {}  # job id → end of its grace (monotonic)
        self.routed = 0
        """Jobs routed to the inline worker so far (for tests and the docs)."""

    def take(self, agent: str, requires: frozenset[str], job_id: str, grace_s: float) -> bool:
        """Route `job_id` to the inline worker if it can start it now."""
        w = self.worker
        if agent not in self.agents or w.state is not WorkerState.ACTIVE or not offers(self.tags, requires):
            return False
        now = time.monotonic()
        if self.pending:
            for stale in [j for j, until in self.pending.items() if until <= now]:
                del self.pending[stale]
        if w.free_slots() - len(self.pending) <= 0:
            return False
        self.pending[job_id] = now + grace_s
        self.routed += 1
        return True

    def claimed(self, job_id: str) -> None:
        """The inline worker claimed `job_id`: it holds a slot of its own now."""
        self.pending.pop(job_id, None)


class RouteChooser:
    """Admission's choice of a preferred worker for each job (docs/routing.md), scored (control/scoring.py) from the
    directory's registry snapshot: no I/O per job. `grace_ms` 0 turns it off."""

    def __init__(self, directory: AgentDirectory, grace_ms: int) -> None:
        self.directory = directory
        self.grace_ms = grace_ms
        # Decisions without a preference, by (agent, requires, prefers, strict), valid for one registry snapshot
        # while `directory.routed` is unchanged.
        self._quiet: dict[tuple[str, frozenset[str], frozenset[str], bool], str] = {}
        self._quiet_reads = -1
        self.local: LocalPath | None = None
        """The gateway's inline worker, when it has one (serve.py): preferred first while it has room."""

    def choose(
        self, spec: AgentSpec, requires: frozenset[str], prefers: frozenset[str], strict: bool, job_id: str = ""
    ) -> tuple[str | None, float | None, str | None]:
        """(preferred worker, its grace in seconds, the explanation) for job `job_id` whose whole requirement is
        `requires`. Off (all None) when the grace is 0."""
        if self.grace_ms <= 0:
            return None, None, None
        directory = self.directory
        local = self.local
        if local is not None:
            wid = local.worker.id
            if local.take(spec.name, requires, job_id, self.grace_ms / 1000.0):
                directory.routed[wid] = directory.routed.get(wid, 0) + 1
                self._quiet.clear()  # `routed` changed (see below)
                w = spec.route_weights or DEFAULT_WEIGHTS
                d = Decision(wid, "local", (), (w[0], w[1], w[2]), limit_ms_of(spec.timeout_s),
                             tuple(sorted(prefers)), strict)  # fmt: skip
                return wid, self.grace_ms / 1000.0, d.to_json()
            if directory.routed.get(wid, 0) < local.concurrency:
                # Its own slots are known here, not a heartbeat old: without room it is full for the score too,
                # until the next snapshot (it takes jobs by the path above again as soon as it has room).
                directory.routed[wid] = local.concurrency
                self._quiet.clear()
        if self._quiet_reads != directory.reads:  # a new snapshot: every remembered decision is stale
            self._quiet.clear()
            self._quiet_reads = directory.reads
        key = (spec.name, requires, prefers, strict)
        quiet = self._quiet.get(key)
        if quiet is not None:
            return None, None, quiet
        routed = directory.routed
        d = decide(directory.workers, spec.name, requires, prefers, strict, spec.route_weights,
                   limit_ms_of(spec.timeout_s), routed)  # fmt: skip
        if d.preferred is None:
            # The same job decides the same while neither the snapshot nor `routed` changed: remembered, the
            # common single-worker path (one candidate, no preference) pays a dict lookup, not a ranking.
            if len(self._quiet) >= QUIET_DECISIONS:
                self._quiet.clear()
            self._quiet[key] = explained = d.to_json()
            return None, None, explained
        routed[d.preferred] = routed.get(d.preferred, 0) + 1
        self._quiet.clear()  # `routed` changed: a load in a remembered explanation may have
        return d.preferred, self.grace_ms / 1000.0, d.to_json()

    def preview(self, spec: AgentSpec, requires: frozenset[str], prefers: frozenset[str], strict: bool) -> Decision:
        """The decision `choose` would make now, listing every candidate; nothing is counted or remembered."""
        return decide(self.directory.workers, spec.name, requires, prefers, strict, spec.route_weights,
                      limit_ms_of(spec.timeout_s), self.directory.routed, keep=None)  # fmt: skip


class Router:
    """Seed 002's order for jobs whose agent declares `max_queued`: route to the agent, else queue there while its
    waiting jobs are under the cap, else degrade to its `degrade_to` (the same rule along the chain), else refuse
    with `QueueFull` (429 with Retry-After). The cap is the store's: each capped job carries it (`queue_cap`) and
    the store counts and inserts under a lock on the agent, refusing with `AgentQueueFull` (the batch is rolled
    back), so it holds across gateways. A job routed to a fallback records `mode_requested` (the agent asked for),
    `mode_effective` (the one it runs as) and `degraded_reason` ("queue_full"). An agent with modes caps each
    mode's queue, and a job of a full mode first runs as the agent's next enabled mode (deep → fast). Agents
    without a cap cost nothing: their jobs take the plain enqueue."""

    def __init__(
        self,
        store: Store,
        spec_of: Callable[[str], AgentSpec | None],
        retry_after_s: int,
        disabled_modes: frozenset[str] = frozenset(),
    ) -> None:
        """`spec_of(name)`: the agent's spec, from the app or the live registry (`Admission`'s one lookup)."""
        self.store = store
        self.spec_of = spec_of
        self.retry_after_s = retry_after_s
        self.disabled_modes = disabled_modes

    def capped(self, job: NewJob) -> NewJob:
        """The job with its agent's cap (per mode for an agent with modes), for the store to enforce."""
        spec = self._spec(job.agent)
        if spec.max_queued is None:
            return job
        return dataclasses.replace(job, queue_cap=spec.max_queued, queue_cap_mode=job.mode_effective if spec.modes else None)

    async def enqueue(self, jobs: Sequence[NewJob], gate: GateAsk | None = None) -> tuple[list[NewJob], list[Enqueued]]:
        """Enqueue `jobs` (all or nothing), degrading a job whose agent's queue is full, as often as needed; `gate`
        (`Gate.ask`) is checked by the enqueue itself."""
        todo = [self.capped(j) for j in jobs]
        tried = {j.id: [j.agent] for j in todo}
        while True:
            try:
                return todo, await self.store.enqueue(todo, gate)
            except AgentQueueFull as full:
                i = next(n for n, j in enumerate(todo) if j.id == full.job_id)
                todo[i] = self._fallback(todo[i], full, tried[full.job_id])

    def _spec(self, name: str) -> AgentSpec:
        # Admission checked the name; one known to neither (admitted with allow_unregistered) has the defaults.
        return self.spec_of(name) or AgentSpec(name)

    def _fallback(self, job: NewJob, full: AgentQueueFull, tried: list[str]) -> NewJob:
        spec = self._spec(job.agent)
        if spec.modes and job.mode_effective in spec.modes:  # deep → fast: the next mode of the same agent
            later = spec.modes[spec.modes.index(job.mode_effective) + 1 :]
            enabled = [m for m in later if f"{spec.name}:{m}" not in self.disabled_modes]
            if enabled:
                return self.capped(
                    dataclasses.replace(job, mode_effective=enabled[0], degraded_reason="queue_full", queue_cap=None)
                )
        fallback = self.spec_of(spec.degrade_to) if spec.degrade_to else None
        if fallback is None or fallback.name in tried:
            first = tried[0]
            raise QueueFull(str(full) + ("" if first == job.agent else f" (degraded from {first!r})"), self.retry_after_s)
        tried.append(fallback.name)
        return self.capped(
            dataclasses.replace(
                job,
                agent=fallback.name,
                requires=tuple(sorted(set(job.requires) | fallback.requires)),
                timeout_s=fallback.timeout_s,
                retry_safe=fallback.retry_safe,
                key_limit=fallback.key_limit,
                mode_requested=job.mode_requested or tried[0],  # the mode asked for, else the agent
                mode_effective=fallback.name,
                degraded_reason="queue_full",
                queue_cap=None,
                # The preference was chosen among the first agent's workers: the fallback's may be others.
                preferred_worker=None,
                preferred_grace_s=None,
            )
        )
