"""`JobsService`: what a client may do with jobs, written once for every door — the gateway's HTTP routes and
WebSocket frames, and `LocalClient` (`tenure.connect`, the CLI without `--url`, the demo).

Every call is scoped to a tenant (`None`: the admin, or a local caller, who sees every tenant): another tenant's
job is answered exactly like a missing one. Bodies of control commands are validated here, by the models of
`control.models`, so an `input` or `approve` is refused alike whichever door it came through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from tenure.contracts.children import ChildJob
from tenure.contracts.errors import InvalidRequest, NotFound
from tenure.contracts.profile import claim_tags, offers
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.store import Store
from tenure.contracts.text import dumps
from tenure.contracts.types import ControlOutcome, Event, Job, JobFilter, WorkerInfo, is_uuid
from tenure.control.admission import Admission, Admitted, JobRequest
from tenure.control.coordinators import cancel_children
from tenure.control.models import ApprovalBody, InputBody, RequeueBody, shown, validated
from tenure.control.scoring import expand, explain

AHEAD_BOUND = 10_000
"""How far `waiting_reason` counts the jobs ahead of a queued one (the count reads the head of the ready index)."""
MAX_WAIT_S = 30.0
MAX_DRAIN_S = 86400.0
"""The longest drain timeout an operator may give (`tenure drain --timeout`, `POST /v1/workers/{id}/drain`)."""
"""The longest a cancel waits for the owner to finish the job (`POST /v1/jobs/{id}/cancel?wait=`)."""


def job_id_of(text: Any) -> str | None:
    """A job id in its canonical form, or None when `text` is not a UUID (no job has that id)."""
    return str(uuid.UUID(text)) if is_uuid(text) else None


class JobsService:
    """Jobs over one store, admitted through one `Admission`."""

    def __init__(self, store: Store, admission: Admission) -> None:
        self.store = store
        self.admission = admission

    # -- admission ---------------------------------------------------------------------------------------------------
    async def submit(self, req: JobRequest) -> Admitted:
        """Admit one job (`Admission.admit`)."""
        return await self.admission.admit(req)

    async def submit_many(self, reqs: Iterable[JobRequest]) -> list[Admitted]:
        """Admit a batch in one enqueue, all or nothing (`Admission.admit_many`)."""
        return await self.admission.admit_many(reqs)

    # -- reads -------------------------------------------------------------------------------------------------------
    async def job(self, job_id: str, tenant: str | None = None) -> Job:
        """One job, or `NotFound` (also for another tenant's)."""
        jid = job_id_of(job_id)
        job = None if jid is None else await self.store.get_job(jid, tenant)
        if job is None:
            raise NotFound(f"no job {shown(job_id)}" + ("" if jid is not None else " (job ids are UUIDs)"))
        return job

    async def waiting_reason(self, job: Job) -> dict[str, Any] | None:
        """Why a job that has not started waits (docs/scheduling.md#why-a-job-waits), or None for any other job,
        the first that applies: behind its concurrency key (naming the jobs holding it), a retry backoff, no
        capable worker (no active worker serves its agent with its capabilities), its agent's queue at its cap
        (`max_queued`: the job is in a full queue; new jobs of the agent are degraded or refused), its tenant's
        turn (other tenants' jobs of its priority are ahead of it by fair shares), or its place in line (claimable
        jobs ahead of it, counted up to `AHEAD_BOUND`)."""
        if job.state is JobState.SCHEDULED:
            return {"kind": "retry_backoff", "next_attempt_at": job.next_attempt_at,
                    "detail": "waiting out the backoff before its next attempt"}  # fmt: skip
        if job.state is not JobState.QUEUED or job.owner is not None:
            return None
        spec = self.admission.spec(job.agent)
        cap = None if spec is None else spec.max_queued
        per_mode = spec is not None and bool(spec.modes)
        info = await self.store.waiting_info(job.id, AHEAD_BOUND, cap, per_mode)
        if info is None:  # claimed (or started) meanwhile
            return None
        if job.key_wait:
            holders = list(info.key_holders)
            return {
                "kind": "concurrency_key",
                "concurrency_key": job.concurrency_key,
                "running_job_ids": holders,
                "detail": f"waiting for the turn of concurrency key {job.concurrency_key!r}, held by "
                + (", ".join(holders) or "no job (its turn passes at the next sweep)"),
            }
        workers = await self.store.list_workers()
        capable = [
            w for w in workers
            if w.state is not WorkerState.GONE and job.agent in w.agents
            and offers(claim_tags(w.capabilities, w.features), job.requires)
        ]  # fmt: skip
        if not capable:
            needs = f" with capabilities {', '.join(job.requires)}" if job.requires else ""
            return {"kind": "no_capable_worker", "detail": f"no live worker serves agent {job.agent!r}{needs}"}
        least = "at least " if info.ahead_capped else ""
        line = {"jobs_ahead": info.ahead, "jobs_ahead_capped": info.ahead_capped}
        in_line = f"{least}{info.ahead} claimable jobs ahead of it in claim order (priority, tenant turn, age)"
        if cap is not None and info.agent_waiting is not None and info.agent_waiting >= cap:
            mode = job.mode_effective if per_mode else None
            queue = f"agent {job.agent!r}" + (f" (mode {mode!r})" if mode else "")
            return {
                "kind": "queue_cap",
                "agent": job.agent,
                "mode": mode,
                "queued": info.agent_waiting,
                "max_queued": cap,
                **line,
                "detail": f"in a full queue: {queue} has {info.agent_waiting} jobs waiting to start, its limit "
                f"(max_queued) is {cap}, so new ones are degraded or refused; {in_line}",
            }
        if info.other_tenants_ahead > 0:
            return {
                "kind": "tenant_turn",
                "tenant_turn": info.turn,
                "other_tenants_jobs_ahead": info.other_tenants_ahead,
                **line,
                "detail": f"waiting for its tenant's turn: {least}{info.other_tenants_ahead} jobs of other tenants at "
                f"its priority take their turns first (fair shares); {in_line}",
            }
        return {"kind": "place_in_line", **line, "detail": in_line}

    async def route(self, job: Job) -> dict[str, Any] | None:
        """The `route` of `GET /v1/jobs/{id}` (docs/routing.md): the preferred worker and the end of its grace,
        every candidate's score by factor and the weights, as admission recorded them, and why the job went where
        it went, worked out now from who started its first attempt. None: admitted without routing."""
        got = await self.store.job_route(job.id)
        if got is None or got.route_json is None:
            return None
        try:
            recorded = expand(json.loads(got.route_json), got.preferred_worker)
        except (ValueError, TypeError, KeyError):
            return None  # not an explanation this version wrote
        return recorded | {
            "grace_ends_at": got.preferred_until,
            "claimed_by": got.claimed_by,
            "claimed_at": got.claimed_at,
            "why": explain(recorded, got.preferred_until, got.claimed_by, got.claimed_at, got.now),
        }

    async def route_preview(
        self, agent: str, requires: Sequence[str] = (), prefers: Sequence[str] = (), strict: bool = False
    ) -> dict[str, Any]:
        """What routing would decide for a job not yet submitted (`tenure route`): the `route` table, from the
        live registry, through the same score."""
        return (await self.admission.preview_route(agent, requires, prefers, strict)).to_dict()

    async def children(self, job: Job) -> list[ChildJob]:
        """The children a coordinator job spawned (`ctx.spawn`, docs/coordinators.md), oldest first."""
        return await self.store.children(job.id)

    async def job_detail(self, job_id: str, tenant: str | None = None) -> Job:
        """One job with its `children` (`GET /v1/jobs/{id}`, `tenure job ID`), or `NotFound`."""
        job = await self.job(job_id, tenant)
        return dataclasses.replace(job, children=tuple(await self.children(job)))

    async def jobs(self, flt: JobFilter) -> list[Job]:
        """Jobs matching `flt`, newest first."""
        return await self.store.list_jobs(flt)

    async def events(
        self, job_id: str, tenant: str | None = None, after: tuple[int, int] | None = None, limit: int = 1000
    ) -> list[Event]:
        """One page of a job's history after a cursor (`NotFound` for a job the tenant cannot see)."""
        job = await self.job(job_id, tenant)
        return await self.store.read_events(job.id, after, limit)

    async def workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        """The registry."""
        return await self.store.list_workers(include_gone)

    async def drain_worker(self, worker_id: str, timeout_s: float | None = None) -> WorkerInfo:
        """Ask a live worker to drain (docs/routing.md): it learns of it at its next heartbeat, claims nothing
        new, finishes what it holds within `timeout_s` (None: its own TENURE_DRAIN_TIMEOUT_S), fails the rest
        with `worker_shutdown` and exits 0. `NotFound` for a worker not registered or gone."""
        number = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
        if timeout_s is not None and not (number and 0 <= timeout_s <= MAX_DRAIN_S):
            raise InvalidRequest(f"the drain timeout must be a number of seconds from 0 to {MAX_DRAIN_S:g}")
        if not isinstance(worker_id, str) or not 0 < len(worker_id) <= 200 or not worker_id.isprintable():
            raise NotFound(f"no live worker {worker_id!r} (`tenure workers` lists them)")
        drained = await self.store.request_drain(worker_id, None if timeout_s is None else float(timeout_s))
        if drained is None:
            raise NotFound(f"no live worker {worker_id!r} (`tenure workers` lists them)")
        return drained

    # -- control -----------------------------------------------------------------------------------------------------
    async def cancel(self, job_id: str, tenant: str | None = None, wait_s: float = 0.0) -> ControlOutcome:
        """Cancel a job; with `wait_s` (at most `MAX_WAIT_S`), wait for a running job's owner to finish it."""
        jid = job_id_of(job_id)
        if jid is None:
            return ControlOutcome.UNKNOWN
        outcome = await self.store.cancel(jid, tenant)
        if outcome in (ControlOutcome.ACCEPTED, ControlOutcome.REQUESTED):
            await cancel_children(self.store, jid)  # a coordinator's unfinished children (docs/coordinators.md)
        if wait_s and outcome is ControlOutcome.REQUESTED:
            outcome = await self._await_cancel(jid, tenant, wait_s)
        return outcome

    async def send_input(self, job_id: str, body: Any, tenant: str | None = None) -> ControlOutcome:
        """Persist an `input` command (`body` is `{"input": <any JSON>}`), then signal the owner."""
        payload = validated(InputBody, body).input
        return await self._send(job_id, tenant, "input", payload)

    async def approve(self, job_id: str, body: Any, tenant: str | None = None) -> ControlOutcome:
        """Persist an `approve` command (`body` is `{"approved": bool, "comment": str}`, both optional)."""
        approval = validated(ApprovalBody, body)
        return await self._send(job_id, tenant, "approve", approval.model_dump())

    async def requeue(self, job_id: str, tenant: str | None = None, body: Any = None) -> Job:
        """Put a dead, failed, lost, expired or cancelled job back in the queue (an operator's command). `body`:
        `{"input": ...}` replaces the job's input (validated as at admission; the edit is in the job's audit),
        `{}` or None keeps it."""
        edited = None
        if body is not None:
            requeue = validated(RequeueBody, body)
            if "input" in requeue.model_fields_set:
                edited = self.admission.input_of(requeue.input)
        jid = job_id_of(job_id)
        if jid is None:
            raise NotFound(f"no job {shown(job_id)} (job ids are UUIDs)")
        return await self.store.requeue(jid, tenant, edited)

    async def _send(self, job_id: str, tenant: str | None, kind: str, payload: Any) -> ControlOutcome:
        jid = job_id_of(job_id)
        if jid is None:
            return ControlOutcome.UNKNOWN
        return await self.store.send_command(jid, tenant, kind, dumps(payload))

    async def _await_cancel(self, job_id: str, tenant: str | None, wait_s: float) -> ControlOutcome:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait_s, MAX_WAIT_S)
        while loop.time() < deadline:
            job = await self.job(job_id, tenant)
            if job.state.terminal:
                return ControlOutcome.ACCEPTED if job.state is JobState.CANCELLED else ControlOutcome.ALREADY_FINISHED
            await asyncio.sleep(0.05)
        return ControlOutcome.REQUESTED


JobRef = str | Job | Admitted
"""A job named by its id, or by a `Job` / `Admitted` a client got back (`await client.wait(await client.submit(...))`)."""


def ref_id(job: JobRef) -> str:
    """The id of a `JobRef`."""
    return job if isinstance(job, str) else job.id


class JobsClient(Protocol):
    """One client shape, two implementations that answer with the same types: `tenure.app.LocalClient` (over
    the store, through `JobsService`: `tenure.connect`, the CLI without `--url`) and `tenure.client.Client` (over
    the gateway's HTTP API). Code written against it runs unchanged against either."""

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        priority: int | None = None,
        requires: Sequence[str] = (),
        deadline_s: float | None = None,
        max_attempts: int | None = None,
        budget: Mapping[str, float] | None = None,
    ) -> Admitted:
        """Admit one job: the job as admitted, and whether it is new (False: a replayed idempotency key).
        `budget`: limits of the job (`tool_calls`, `tokens`, `cost`, `wall_s`; docs/budgets.md)."""
        ...

    async def job(self, job_id: JobRef) -> Job:
        """One job (`NotFound` locally, `GatewayError` 404 over HTTP)."""
        ...

    async def jobs(
        self, *, state: JobState | str | None = None, agent: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> list[Job]:
        """Jobs, newest first; `cursor` is the id of the last job of the previous page."""
        ...

    async def events(self, job_id: JobRef, after: str | None = None, limit: int = 1000) -> list[Event]:
        """One page of the job's history after the cursor `after` (`EPOCH-SEQ`)."""
        ...

    async def wait(self, job_id: JobRef, timeout_s: float | None = None) -> Job:
        """Poll until the job is terminal (or raise TimeoutError)."""
        ...

    async def cancel(self, job_id: JobRef, *, wait: float | None = None) -> ControlOutcome:
        """Cancel: `requested`, `accepted` or `already_finished`; `wait` seconds for a running job's owner."""
        ...

    async def send_input(self, job_id: JobRef, input: Any) -> ControlOutcome:
        """Send an input to a job waiting in `ctx.next_input()`."""
        ...

    async def approve(self, job_id: JobRef, approved: bool = True, comment: str | None = None) -> ControlOutcome:
        """Answer a job waiting in `ctx.approval(prompt)`."""
        ...
