"""Why a queued job waits (docs/scheduling.md#why-a-job-waits), on both backends: its agent's queue at its cap
(`queue_cap`) and its tenant's turn (`tenant_turn`), beside the plain place in line."""

from __future__ import annotations

from typing import Any

from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, JobRequest
from tenure.control.jobs import JobsService

AGENTS = {
    "fast": AgentSpec("fast", max_queued=3),
    "diagnose": AgentSpec("diagnose", modes=("deep", "fast"), max_queued=2),
    "chat": AgentSpec("chat"),
}


async def _setup(store: Store) -> tuple[Admission, JobsService]:
    admission = Admission(store, AGENTS)
    await store.register_worker(WorkerInfo("w1", "h", 1, 4, tuple(AGENTS)))  # a capable worker: no other reason
    return admission, JobsService(store, admission)


async def _reason(service: JobsService, job_id: str) -> dict[str, Any]:
    reason = await service.waiting_reason(await service.job(job_id))
    assert reason is not None
    return reason


async def test_a_job_in_a_queue_at_its_agents_cap_says_so(store: Store) -> None:
    admission, service = await _setup(store)
    first = await admission.admit(JobRequest("fast"))
    second = await admission.admit(JobRequest("fast"))
    below = await _reason(service, second.id)  # 2 of 3: room left, so the plain line
    assert below["kind"] == "place_in_line" and below["jobs_ahead"] == 1
    third = await admission.admit(JobRequest("fast"))
    for job, ahead in ((first, 0), (second, 1), (third, 2)):  # the queue is full: every job in it says so
        reason = await _reason(service, job.id)
        assert {k: reason[k] for k in ("kind", "agent", "mode", "queued", "max_queued", "jobs_ahead")} == {
            "kind": "queue_cap", "agent": "fast", "mode": None, "queued": 3, "max_queued": 3, "jobs_ahead": ahead,
        }  # fmt: skip
        assert "max_queued" in reason["detail"] and "degraded or refused" in reason["detail"]
    await store.claim_and_start("w1", ["fast"], [], 1, 30.0)  # one leaves the queue: under the cap again
    assert (await _reason(service, third.id))["kind"] == "place_in_line"


async def test_a_cap_per_mode_counts_the_jobs_of_the_jobs_mode(store: Store) -> None:
    admission, service = await _setup(store)
    deep = [await admission.admit(JobRequest("diagnose", mode="deep")) for _ in range(2)]  # deep: 2 of 2
    fast = await admission.admit(JobRequest("diagnose", mode="fast"))  # fast: 1 of 2
    reason = await _reason(service, deep[1].id)
    assert (reason["kind"], reason["mode"], reason["queued"], reason["max_queued"]) == ("queue_cap", "deep", 2, 2)
    assert "(mode 'deep')" in reason["detail"]
    assert (await _reason(service, fast.id))["kind"] == "place_in_line"  # its own mode's queue has room
    await admission.admit(JobRequest("diagnose", mode="fast"))
    reason = await _reason(service, fast.id)
    assert (reason["kind"], reason["mode"], reason["queued"]) == ("queue_cap", "fast", 2)


async def test_a_job_behind_other_tenants_turns_waits_for_its_tenants_turn(store: Store) -> None:
    admission, service = await _setup(store)
    a = [(await admission.admit(JobRequest("chat", i, tenant="a"))).id for i in range(3)]  # turns 0, 1, 2
    own = await _reason(service, a[2])  # only its own tenant's jobs ahead: its place in line
    assert (own["kind"], own["jobs_ahead"]) == ("place_in_line", 2)
    b = (await admission.admit(JobRequest("chat", 0, tenant="b"))).id  # turn 0, the head's: a0, b0, a1, a2
    head = await _reason(service, a[0])
    assert (head["kind"], head["jobs_ahead"]) == ("place_in_line", 0)
    turn = await _reason(service, b)
    assert {k: turn[k] for k in ("kind", "other_tenants_jobs_ahead", "jobs_ahead", "tenant_turn")} == {
        "kind": "tenant_turn", "other_tenants_jobs_ahead": 1, "jobs_ahead": 1, "tenant_turn": 0.0,
    }  # fmt: skip
    assert "other tenants" in turn["detail"]
    last = await _reason(service, a[2])  # behind a0, a1 (its own tenant's) and b0 (tenant b's turn)
    assert (last["kind"], last["other_tenants_jobs_ahead"], last["jobs_ahead"], last["tenant_turn"]) == (
        "tenant_turn", 1, 3, 2.0,
    )  # fmt: skip
    middle = await _reason(service, a[1])  # behind a0 and b0
    assert (middle["kind"], middle["other_tenants_jobs_ahead"], middle["jobs_ahead"]) == ("tenant_turn", 1, 2)


async def test_a_higher_priority_of_another_tenant_is_a_place_in_line_not_a_turn(store: Store) -> None:
    admission, service = await _setup(store)
    mine = await admission.admit(JobRequest("chat", 0, tenant="a"))
    await admission.admit(JobRequest("chat", 1, 5, tenant="c"))  # priority wins over fairness
    reason = await _reason(service, mine.id)
    assert (reason["kind"], reason["jobs_ahead"]) == ("place_in_line", 1)
