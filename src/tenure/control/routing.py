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
from collections.abc import Callable, Sequence

from tenure.contracts.errors import AgentQueueFull
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, Enqueued, NewJob
from tenure.control.directory import AgentDirectory
from tenure.control.gate import QueueFull
from tenure.control.scoring import Decision, decide, limit_ms_of, strict_requires

QUIET_DECISIONS = 256
"""The most routing decisions without a preference an admission door remembers (`RouteChooser.choose`)."""


def routed_requires(requires: frozenset[str], prefers: frozenset[str], strict: bool) -> frozenset[str]:
    """A job's whole requirement: a strict job's preferred features join it as `feature:NAME`, which the claim
    then enforces unchanged (a worker claims with `feature:F` for each feature it offers; docs/routing.md)."""
    return requires | strict_requires(prefers) if strict else requires


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

    def choose(
        self, spec: AgentSpec, requires: frozenset[str], prefers: frozenset[str], strict: bool
    ) -> tuple[str | None, float | None, str | None]:
        """(preferred worker, its grace in seconds, the explanation) for a job whose whole requirement is
        `requires`. Off (all None) when the grace is 0."""
        if self.grace_ms <= 0:
            return None, None, None
        directory = self.directory
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

    async def enqueue(self, jobs: Sequence[NewJob]) -> tuple[list[NewJob], list[Enqueued]]:
        """Enqueue `jobs` (all or nothing), degrading a job whose agent's queue is full, as often as needed."""
        todo = [self.capped(j) for j in jobs]
        tried = {j.id: [j.agent] for j in todo}
        while True:
            try:
                return todo, await self.store.enqueue(todo)
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
