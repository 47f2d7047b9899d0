"""Routing at admission (docs/scheduling.md): per-agent queue caps (`max_queued`, counted in the store, so every
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
from tenure.control.gate import QueueFull


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
