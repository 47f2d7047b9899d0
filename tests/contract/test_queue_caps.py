"""Per-agent queue caps and degradation (docs/scheduling.md), on both backends, through the admission door:
a full `max_queued` routes to the agent's `degrade_to` (recorded on the job) or refuses with 429's QueueFull;
and `waiting_reason` says why a queued job waits."""

from __future__ import annotations

import asyncio

import pytest

from tenure.contracts.errors import InvalidRequest
from tenure.contracts.states import JobState
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, AdmissionLimits, JobRequest
from tenure.control.gate import QueueFull
from tenure.control.jobs import JobsService

AGENTS = {
    "deep": AgentSpec("deep", max_queued=2, degrade_to="fast"),
    "fast": AgentSpec("fast", max_queued=3),
    "solo": AgentSpec("solo", max_queued=1),
    "gpu": AgentSpec("gpu", requires=frozenset({"gpu"})),
    "chat": AgentSpec("chat"),
    "diagnose": AgentSpec("diagnose", modes=("deep", "fast"), max_queued=1),
}


def door(store: Store, degraded: list[tuple[str, str]] | None = None) -> Admission:
    return Admission(store, AGENTS, on_degraded=None if degraded is None else lambda a, r: degraded.append((a, r)))


async def test_a_full_queue_degrades_to_the_fallback_and_records_why(store: Store) -> None:
    seen: list[tuple[str, str]] = []
    admission = door(store, seen)
    plain = [await admission.admit(JobRequest("deep")) for _ in range(2)]
    assert all(a.job.agent == "deep" and a.job.degraded_reason is None for a in plain)
    third = await admission.admit(JobRequest("deep"))
    job = await store.get_job(third.id)
    assert job is not None and job.agent == "fast"
    assert (job.mode_requested, job.mode_effective, job.degraded_reason) == ("deep", "fast", "queue_full")
    assert seen == [("deep", "queue_full")]
    # The fallback's own cap holds too: 3 of `fast`, then nothing left to degrade to.
    await admission.admit(JobRequest("deep"))
    await admission.admit(JobRequest("deep"))
    with pytest.raises(QueueFull, match=r"'fast' has 3 jobs waiting.*degraded from 'deep'") as err:
        await admission.admit(JobRequest("deep"))
    assert err.value.retry_after_s >= 1
    assert await store.queued_of_agent("fast") == 3 and await store.queued_of_agent("deep") == 2


async def test_a_full_queue_without_fallback_refuses_and_writes_nothing(store: Store) -> None:
    admission = door(store)
    await admission.admit(JobRequest("solo"))
    with pytest.raises(QueueFull, match="max_queued"):
        await admission.admit(JobRequest("solo"))
    with pytest.raises(QueueFull):  # a batch is refused whole
        await admission.admit_many([JobRequest("chat"), JobRequest("solo")])
    assert await store.queued_of_agent("solo") == 1 and await store.queued_of_agent("chat") == 0


async def test_the_cap_holds_under_concurrent_admissions(store: Store) -> None:
    admission = door(store)
    results = await asyncio.gather(*(admission.admit(JobRequest("solo")) for _ in range(8)), return_exceptions=True)
    assert sum(1 for r in results if not isinstance(r, BaseException)) == 1
    assert all(isinstance(r, QueueFull) for r in results if isinstance(r, BaseException))


async def test_waiting_reason_names_the_key_holder_the_line_or_the_missing_worker(store: Store) -> None:
    admission = door(store)
    service = JobsService(store, admission)
    first = await admission.admit(JobRequest("chat", concurrency_key="t"))
    second = await admission.admit(JobRequest("chat", concurrency_key="t"))
    gpu = await admission.admit(JobRequest("gpu"))
    await store.register_worker(WorkerInfo("w1", "h", 1, 4, ("chat", "gpu")))
    reason = await service.waiting_reason(await service.job(second.id))
    assert reason is not None and reason["kind"] == "concurrency_key" and reason["running_job_ids"] == [first.id]
    line = await service.waiting_reason(await service.job(gpu.id))
    assert line is not None and line == {**line, "kind": "no_capable_worker"}  # w1 lacks the gpu capability
    await store.register_worker(WorkerInfo("w2", "h", 2, 4, ("chat", "gpu"), ("gpu",)))
    line = await service.waiting_reason(await service.job(gpu.id))
    assert line is not None and line["kind"] == "place_in_line" and line["jobs_ahead"] == 1  # `first` is ahead
    assert await service.waiting_reason(await service.job(first.id)) == {
        **(await service.waiting_reason(await service.job(first.id)) or {}),
        "jobs_ahead": 0,
    }
    await store.cancel(first.id)
    done = await service.job(first.id)
    assert done.state is JobState.CANCELLED and await service.waiting_reason(done) is None


async def test_modes_degrade_when_disabled_or_full_and_the_claim_carries_the_mode(store: Store) -> None:
    admission = door(store)
    deep = await admission.admit(JobRequest("diagnose"))  # the first mode by default
    assert (deep.job.mode_requested, deep.job.mode_effective, deep.job.degraded_reason) == ("deep", "deep", None)
    full = await admission.admit(JobRequest("diagnose", mode="deep"))  # deep's queue (max_queued=1) is full
    assert (full.job.mode_effective, full.job.degraded_reason) == ("fast", "queue_full")
    with pytest.raises(QueueFull):  # fast's queue is full too, and no agent to fall back to
        await admission.admit(JobRequest("diagnose", mode="deep"))
    pairs = await store.claim_and_start("w", ["diagnose"], [], 10, 30.0)  # running: out of the queue
    assert sorted(c.mode or "" for c, _ in pairs) == ["deep", "fast"]  # what the handler reads as ctx.mode
    off = Admission(store, AGENTS, AdmissionLimits(disabled_modes=frozenset({"diagnose:deep"})))
    job = (await off.admit(JobRequest("diagnose", mode="deep"))).job
    assert (job.mode_requested, job.mode_effective, job.degraded_reason) == ("deep", "fast", "mode_disabled")
    with pytest.raises(InvalidRequest, match="mode must be one of deep, fast"):
        await admission.admit(JobRequest("diagnose", mode="shallow"))
    plain = (await admission.admit(JobRequest("chat", mode="deep"))).job  # no modes: one way to run
    assert (plain.mode_requested, plain.mode_effective, plain.degraded_reason) == (None, None, None)
