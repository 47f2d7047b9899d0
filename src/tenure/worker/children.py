"""The children of one execution (docs/coordinators.md): `ctx.spawn` and the wait of `handle.result()` and
`ctx.gather`, as the worker provides them to the handler's `Context`.

A spawn is an admission (control/coordinators.py builds the request): the child is a job like any other, on any
worker. A wait reads the parent's children from the store, never a worker's memory; while any awaited child is
unfinished the parent is `waiting` (`Execution.waiting`) and holds no worker slot and no quota lease, and re-reads
its children once per poll interval (50 ms growing to 1 s), woken early by a control command such as a cancel.
The coroutine of a waiting parent stays on its worker, with its claim renewed by the heartbeat: if that worker
dies, the parent's claim expires and (retry-safe) a new attempt on another worker spawns the same keys again and
gets the same children back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from tenure.contracts.errors import NotFound
from tenure.contracts.store import JobStore
from tenure.contracts.text import describe_error
from tenure.contracts.types import Claim, Job
from tenure.control.admission import Admission
from tenure.control.coordinators import cancel_children, child_request
from tenure.kernel.registry import Agent

log = logging.getLogger("tenure.worker")
T = TypeVar("T")


class _Env(Protocol):
    store: JobStore
    admission: Admission | None


class Execution(Protocol):
    """What of its execution the children need (worker/execution.py: its fence, waiting and polling)."""

    @property
    def env(self) -> _Env: ...

    claim: Claim
    agent: Agent
    execution_id: str

    def check(self) -> None: ...

    def waiting(self, why: dict[str, Any]) -> AbstractAsyncContextManager[dict[str, Any]]: ...

    async def poll(self, ready: Callable[[], Awaitable[T | None]]) -> T: ...


class ExecutionChildren:
    """Spawn and await the children of one execution (the `ChildrenPort` of its `Context`)."""

    def __init__(self, execution: Execution) -> None:
        self._ex = execution
        self.spawned: set[str] = set()

    def _admission(self) -> Admission:
        env = self._ex.env
        if env.admission is None:
            agents = {self._ex.agent.spec.name: self._ex.agent.spec}
            env.admission = Admission(env.store, agents)
        return env.admission

    async def spawn(self, agent: str, input: Any, key: str, options: dict[str, Any]) -> tuple[str, bool]:
        ex = self._ex
        ex.check()  # a stale or cancelled execution spawns nothing
        claim = ex.claim
        req = child_request(claim.fence, ex.execution_id, claim.tenant, agent, input, key, options)
        admitted = await self._admission().admit(req)
        self.spawned.add(admitted.id)
        return admitted.id, admitted.created

    async def wait(self, job_ids: Sequence[str]) -> list[Job]:
        ex = self._ex
        ex.check()
        ended = await self._ended(job_ids)
        if ended is None:
            why = {"for": "children", "children": list(job_ids)}
            async with ex.waiting(why) as resumed:
                ended = await ex.poll(lambda: self._ended(job_ids))
                resumed.update(children=len(ended))
        return ended

    async def _ended(self, job_ids: Sequence[str]) -> list[Job] | None:
        """The awaited children, once every one is terminal (one read of the parent's children per call, then one
        read of each awaited child once); None while any is not."""
        store = self._ex.env.store
        states = {c.id: c.state for c in await store.children(self._ex.claim.fence.job_id)}
        for job_id in job_ids:
            state = states.get(job_id)
            if state is None:
                raise NotFound(f"job {job_id} is not a child of job {self._ex.claim.fence.job_id}")
            if not state.terminal:
                return None
        out = []
        for job_id in job_ids:
            job = await store.get_job(job_id)
            if job is None:  # purged by retention after it ended
                raise NotFound(f"child job {job_id} is no longer in the store")
            out.append(job)
        return out

    async def cancel_unfinished(self) -> None:
        """After this execution ended `cancelled`: cancel its unfinished children (the cancel's own cascade may
        have read the children before one spawned here was committed). Logged, never raised."""
        if not self.spawned:
            return
        try:
            await cancel_children(self._ex.env.store, self._ex.claim.fence.job_id)
        except Exception as exc:
            log.warning("job %s: cancelling its children failed: %s", self._ex.claim.fence.job_id, describe_error(exc))
