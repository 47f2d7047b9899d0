"""Submit and inspect jobs directly against the store, through the same admission door as the gateway:

    async with tenure.connect(app, "postgresql://...") as client:
        admitted = await client.submit("summarize", {"text": "..."}, idempotency_key="req-42")
        job = await client.wait(admitted.job)

`LocalClient` is a `JobsClient`: `tenure.client.Client` (over HTTP) answers with the same types.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from tenure.contracts.artifacts import ArtifactStore, stub_ref
from tenure.contracts.errors import NotFound, StoreUnavailable
from tenure.contracts.states import JobState
from tenure.contracts.store import JobStore
from tenure.contracts.types import DEFAULT_TENANT, ControlOutcome, Event, Job, JobFilter, WorkerInfo, parse_cursor
from tenure.control.admission import Admission, Admitted, JobRequest
from tenure.control.jobs import JobRef, JobsClient, JobsService, ref_id
from tenure.kernel.registry import Tenure
from tenure.settings import Settings


class LocalClient:
    """Submit and inspect jobs directly against the store (no gateway in between), through the same admission
    door as the gateway (caps and circuits included). A `JobsClient`: `tenure.client.Client` answers alike."""

    def __init__(self, store: JobStore, admission: Admission, artifacts: ArtifactStore | None = None) -> None:
        self.store = store
        self.admission = admission
        self.artifacts = artifacts  # results by reference (docs/artifacts.md)
        self.service = JobsService(store, admission)

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
        tenant: str = DEFAULT_TENANT,
        concurrency_key: str | None = None,
        multitask: str | None = None,
        mode: str | None = None,
        budget: Mapping[str, float] | None = None,
        allow_unregistered: bool = False,
        prefers: Sequence[str] = (),
        strict: bool = False,
    ) -> Admitted:
        """Admit one job: the job as admitted (the original one when the idempotency key was seen, `created`
        False). Over a queue cap raises `QueueFull`, while the agent's circuit is open `CircuitOpen`; a `reject`
        job of a busy concurrency key raises `KeyBusy` (docs/scheduling.md). An agent the app does not define is
        looked up in the live registry (`allow_unregistered`: accept it anyway)."""
        req = JobRequest(
            agent, input, priority, requires, deadline_s, max_attempts, idempotency_key, tenant,
            concurrency_key=concurrency_key, multitask=multitask, mode=mode, budget=budget,
            allow_unregistered=allow_unregistered, prefers=prefers, strict=strict,
        )  # fmt: skip
        return await self.service.submit(req)

    async def submit_many(self, requests: Sequence[JobRequest]) -> list[str]:
        """Admit a batch in one round trip and return the job ids; all are validated, and the caps checked for
        the whole batch, before any is written."""
        return [a.job.id for a in await self.service.submit_many(requests)]

    async def job(self, job_id: JobRef, tenant: str | None = None) -> Job:
        """One job, or `NotFound`."""
        return await self.service.job(ref_id(job_id), tenant)

    async def result(self, job_id: JobRef, tenant: str | None = None) -> Any:
        """A succeeded job's result, read from its artifact when the row holds a reference (docs/artifacts.md);
        `NotFound` for another state or a missing artifact. The whole result is read into memory."""
        job = await self.job(job_id, tenant)
        if job.state is not JobState.SUCCEEDED:
            raise NotFound(f"job {job.id} is {job.state.value}: only a succeeded job has a result")
        ref = stub_ref(job.result)
        if ref is None or ref.owner != job.id:
            return job.result
        blob = None if self.artifacts is None else await self.artifacts.open(ref.owner, ref.sha256)
        if blob is None:
            raise NotFound(f"the artifact {ref.ref} of job {job.id} is not in the artifact store")
        digest, parts = hashlib.sha256(), []
        async for chunk in blob.chunks:
            digest.update(chunk)
            parts.append(chunk)
        if digest.hexdigest() != ref.sha256:
            raise StoreUnavailable(f"the artifact {ref.ref} does not match its digest (damaged)")
        return json.loads(b"".join(parts))

    async def jobs(
        self,
        *,
        state: JobState | str | None = None,
        agent: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        before: str | None = None,
        tenant: str | None = None,
    ) -> list[Job]:
        """Jobs, newest first; `cursor` (or its older name `before`) is the id of the last job of the previous
        page."""
        state = JobState(state) if isinstance(state, str) else state
        return await self.service.jobs(JobFilter(tenant, state, agent, cursor or before, limit))

    async def events(self, job_id: JobRef, after: str | None = None, limit: int = 1000) -> list[Event]:
        """One page of the job's history after the cursor `after` (`EPOCH-SEQ`)."""
        return await self.service.events(ref_id(job_id), None, parse_cursor(after) if after else None, limit)

    async def cancel(self, job_id: JobRef, *, wait: float | None = None) -> ControlOutcome:
        """Cancel: `requested`, `accepted` or `already_finished` (`NotFound` for no such job)."""
        return _known(job_id, await self.service.cancel(ref_id(job_id), None, wait or 0.0))

    async def send_input(self, job_id: JobRef, input: Any) -> ControlOutcome:
        """Persist an input for the job's `ctx.next_input()` (`NotFound` for no such job)."""
        return _known(job_id, await self.service.send_input(ref_id(job_id), {"input": input}))

    async def approve(self, job_id: JobRef, approved: bool = True, comment: str | None = None) -> ControlOutcome:
        """Persist an approval for the job's `ctx.approval(prompt)` (`NotFound` for no such job)."""
        body = {"approved": approved, "comment": comment}
        return _known(job_id, await self.service.approve(ref_id(job_id), body))

    async def requeue(self, job_id: JobRef, **edit: Any) -> Job:
        """Put a finished job back in the queue (an operator's command); `requeue(id, input=...)` edits its
        input (recorded in the job's audit)."""
        return await self.service.requeue(ref_id(job_id), None, edit or None)

    async def workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        """The registry."""
        return await self.service.workers(include_gone)

    async def drain(self, worker_id: str, timeout_s: float | None = None) -> WorkerInfo:
        """Ask a live worker to drain (`tenure drain`); `NotFound` for a worker not registered or gone."""
        return await self.service.drain_worker(worker_id, timeout_s)

    async def wait(self, job_id: JobRef, timeout_s: float | None = None, poll_s: float = 0.05) -> Job:
        """Poll until the job reaches a terminal state (or raise TimeoutError)."""
        async with asyncio.timeout(timeout_s):
            while True:
                job = await self.job(job_id)
                if job.state.terminal:
                    return job
                await asyncio.sleep(poll_s)


if TYPE_CHECKING:  # mypy holds LocalClient to the one client shape

    def _is_a_jobs_client(client: LocalClient) -> JobsClient:
        return client


def _known(job_id: JobRef, outcome: ControlOutcome) -> ControlOutcome:
    if outcome is ControlOutcome.UNKNOWN:
        raise NotFound(f"no job {ref_id(job_id)}")
    return outcome


@asynccontextmanager
async def connect(
    app: Tenure | str | None = None, database_url: str | None = None, settings: Settings | None = None
) -> AsyncIterator[LocalClient]:
    """Open a `LocalClient` on the configured store. `app` (or `TENURE_APP`) defines the admissible agents; the
    caps and circuit breakers are those of the settings (`TENURE_MAX_QUEUED`, `TENURE_BREAKER_*`), as at the
    gateway."""
    from tenure.app import Runtime

    settings = settings or Settings.from_env()
    if database_url is not None:
        settings = settings.replace(database_url=database_url)
    async with Runtime.open(settings, app) as runtime:
        yield runtime.client()
