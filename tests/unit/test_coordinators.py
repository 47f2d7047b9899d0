"""The coordinator API over a stand-in port (no I/O): what `handle.result()` and `ctx.gather` answer and raise, and
the spawn key rules (docs/coordinators.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from tenure import ChildFailed, ChildHandle, InvalidRequest
from tenure.contracts.states import JobState
from tenure.contracts.types import Fence, Job
from tenure.control.coordinators import MAX_SPAWN_KEY, child_request, spawn_idempotency_key
from tenure.kernel.children import gather

BASE = Job(
    id="c0", tenant="t", agent="leaf", input=None, priority=0, requires=(), state=JobState.SUCCEEDED, owner=None,
    epoch=1, execution_id=None, attempts=1, max_attempts=3, timeout_s=None, retry_safe=False, result=None,
    error_code=None, error_message=None, created_at=0.0, updated_at=0.0, claimed_at=None, claim_expires_at=None,
    execution_started_at=None, next_attempt_at=None, deadline=None, cancel_requested_at=None, finished_at=None,
)  # fmt: skip


class Port:
    """Answers every wait at once with the jobs it was given; counts the waits."""

    def __init__(self, jobs: dict[str, Job]) -> None:
        self.jobs = jobs
        self.waits: list[list[str]] = []

    async def spawn(self, agent: str, input: Any, key: str, options: dict[str, Any]) -> tuple[str, bool]:
        raise AssertionError("not used")

    async def wait_children(self, job_ids: Sequence[str]) -> list[Job]:
        self.waits.append(list(job_ids))
        return [self.jobs[j] for j in job_ids]


def handles(port: Port) -> list[ChildHandle]:
    return [ChildHandle(j, "leaf", f"k-{j}", True, port) for j in port.jobs]


def port_of(*states: JobState) -> Port:
    return Port({
        f"c{i}": replace(BASE, id=f"c{i}", state=s, result={"i": i} if s is JobState.SUCCEEDED else None,
                         error_code=None if s is JobState.SUCCEEDED else "boom", error_message="it broke")
        for i, s in enumerate(states)
    })  # fmt: skip


async def test_gather_waits_once_for_all_and_answers_results_in_order() -> None:
    port = port_of(JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.SUCCEEDED)
    assert await gather(handles(port), False) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert port.waits == [["c0", "c1", "c2"]]  # one wait, not one per child


async def test_gather_raises_the_first_failed_child_in_order() -> None:
    port = port_of(JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED)
    with pytest.raises(ChildFailed) as caught:
        await gather(handles(port), False)
    assert (caught.value.job_id, caught.value.state, caught.value.error_code) == ("c1", "dead", "boom")
    assert caught.value.code == "child_failed"


async def test_gather_with_return_exceptions_puts_each_failure_in_its_place() -> None:
    port = port_of(JobState.FAILED, JobState.SUCCEEDED)
    first, second = await gather(handles(port), True)
    assert isinstance(first, ChildFailed) and first.state == "failed" and second == {"i": 1}


async def test_a_handle_answers_its_result_or_raises_and_gather_of_nothing_is_empty() -> None:
    port = port_of(JobState.SUCCEEDED, JobState.LOST)
    ok, lost = handles(port)
    assert await ok.result() == {"i": 0}
    with pytest.raises(ChildFailed, match="ended lost"):
        await lost.result()
    assert (await lost.job()).state is JobState.LOST
    assert await gather([], False) == []


async def test_gather_refuses_handles_of_another_port() -> None:
    a, b = port_of(JobState.SUCCEEDED), port_of(JobState.SUCCEEDED)
    with pytest.raises(ValueError):
        await gather([*handles(a), *handles(b)], False)


def test_the_spawn_key_is_derived_from_the_parent_and_bounded() -> None:
    parent = "01900000-0000-7000-8000-000000000000"
    assert spawn_idempotency_key(parent, "part-1") == f"spawn:{parent}:part-1"
    assert spawn_idempotency_key(parent, "k") != spawn_idempotency_key("01900000-0000-7000-8000-000000000001", "k")
    with pytest.raises(InvalidRequest):
        spawn_idempotency_key(parent, "x" * (MAX_SPAWN_KEY + 1))
    with pytest.raises(InvalidRequest):
        spawn_idempotency_key(parent, "")
    req = child_request(Fence(parent, 2, 7), "e1", "tenant-a", "leaf", {"i": 1}, "part-1", {"priority": 5})
    assert (req.tenant, req.idempotency_key, req.parent, req.priority) == (
        "tenant-a", f"spawn:{parent}:part-1", Fence(parent, 2, 7), 5
    )  # fmt: skip
    with pytest.raises(InvalidRequest, match="not color"):
        child_request(Fence(parent, 2, 7), "e1", "t", "leaf", None, "k", {"color": "red"})
