"""Coordinator agents (docs/coordinators.md): `ctx.spawn` admits a child job and answers a `ChildHandle`;
`await handle.result()` and `await ctx.gather(*handles)` wait for children to end.

The handle is only a name: the child's truth is its row in the store (state, result), and the parent's context is
the store too, never a worker's memory. A retried parent that spawns with the same keys gets the same children
back (spawning is idempotent per parent job and key), so a coordinator is written as a plain function of its
input: spawn what it needs, gather, combine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tenure.contracts.errors import ChildFailed
from tenure.contracts.states import JobState
from tenure.contracts.types import Job


class ChildrenPort(Protocol):
    """What the worker provides to spawn and await children (part of the `ExecutionPort`)."""

    async def spawn(self, agent: str, input: Any, key: str, options: dict[str, Any]) -> tuple[str, bool]:
        """Admit the child `key` of this job (or find it, when this job spawned it before): (its id, created)."""
        ...

    async def wait_children(self, job_ids: Sequence[str]) -> list[Job]:
        """Wait until every one of these children is terminal and answer them, in order. While it waits the job
        is `waiting` and the execution holds no worker slot and no quota lease."""
        ...


@dataclass(frozen=True, slots=True)
class ChildHandle:
    """A child job spawned by `ctx.spawn`: `job_id`, `agent`, the spawn `key`, and `created` (False: an earlier
    attempt of the parent spawned it, and this one got it back)."""

    job_id: str
    agent: str
    key: str
    created: bool
    _port: ChildrenPort = field(repr=False, compare=False)

    async def result(self) -> Any:
        """Wait for the child to end and answer its result; raise `ChildFailed` if it ended otherwise."""
        (job,) = await self._port.wait_children([self.job_id])
        return outcome(job)

    async def job(self) -> Job:
        """Wait for the child to end and answer its whole record (state, result or error), whatever the state."""
        (job,) = await self._port.wait_children([self.job_id])
        return job


def outcome(job: Job) -> Any:
    """A terminal child's result, or `ChildFailed` raised for any other end than `succeeded`."""
    if job.state is JobState.SUCCEEDED:
        return job.result
    raise ChildFailed(job.id, job.agent, job.state.value, job.error_code, job.error_message)


async def gather(handles: Sequence[ChildHandle], return_exceptions: bool) -> list[Any]:
    """The results of `handles` in order, after one wait for all of them (see `Context.gather`)."""
    if not handles:
        return []
    ports = {id(h._port) for h in handles}
    if len(ports) != 1:
        raise ValueError("ctx.gather takes the handles this job's ctx.spawn answered")
    jobs = await handles[0]._port.wait_children([h.job_id for h in handles])
    out: list[Any] = []
    for job in jobs:
        try:
            out.append(outcome(job))
        except ChildFailed as exc:
            if not return_exceptions:
                raise
            out.append(exc)
    return out
