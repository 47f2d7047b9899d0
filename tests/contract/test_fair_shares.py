"""Fair shares across tenants within one priority (docs/scheduling.md#fair-shares), on both backends: the claim
serves tenants in turn, so one tenant's backlog does not delay another tenant's job by more than one claim round
per worker (measured in claims); weights share the turns; priority still wins over fairness."""

from __future__ import annotations

from collections import Counter

from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec
from tenure.control.admission import Admission, AdmissionLimits, JobRequest

AGENTS = {"echo": AgentSpec("echo")}
WORKERS = ("worker-1", "worker-2")
SLOTS = 4  # each worker claims up to this many at once


async def _enqueue(store: Store, admission: Admission, tenant: str, n: int, priority: int | None = None) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 1000):
        jobs = [admission.build(JobRequest("echo", i, priority, tenant=tenant)) for i in range(start, min(n, start + 1000))]
        ids += [e.job.id for e in await store.enqueue(jobs)]
    return ids


async def test_one_job_of_tenant_b_starts_within_one_claim_round_behind_20000_of_tenant_a(store: Store) -> None:
    admission = Admission(store, AGENTS)
    await _enqueue(store, admission, "a", 20_000)
    (b,) = await _enqueue(store, admission, "b", 1)
    claims = 0
    for worker in WORKERS:  # one claim round: each worker claims once
        claims += 1
        taken = [c.fence.job_id for c in await store.claim(worker, ["echo"], [], SLOTS, 30.0)]
        if b in taken:
            break
    else:
        raise AssertionError("tenant b's job was not claimed within one claim round of each worker")
    assert claims <= len(WORKERS)


async def test_tenants_take_turns_by_weight_and_priority_still_wins(store: Store) -> None:
    admission = Admission(store, AGENTS, AdmissionLimits(tenant_weights=(("a", 2.0), ("b", 1.0))))
    await _enqueue(store, admission, "a", 60)
    await _enqueue(store, admission, "b", 60)
    (urgent,) = await _enqueue(store, admission, "b", 1, priority=5)
    first = await store.claim(WORKERS[0], ["echo"], [], 1, 30.0)
    assert [c.fence.job_id for c in first] == [urgent]  # priority first
    taken = await store.claim(WORKERS[0], ["echo"], [], 30, 30.0)
    shares = Counter(c.tenant for c in taken)
    assert abs(shares["a"] - 20) <= 1 and abs(shares["b"] - 10) <= 1, shares
