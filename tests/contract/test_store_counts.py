"""`count_live_jobs` on every backend: unfinished jobs by state and the ready queue by tenant."""

from __future__ import annotations

from tenure.contracts.states import JobState
from tenure.contracts.store import Store
from tenure.contracts.types import Finish, NewJob, Start, new_id


def _job(tenant: str) -> NewJob:
    return NewJob(new_id(), tenant, "echo", "{}", 0, (), 3, None, False, None, None, b"fp")


async def test_count_live_jobs_counts_the_ready_queue_by_tenant_and_owned_jobs_by_state(store: Store) -> None:
    assert (await store.count_live_jobs()).by_state == {}
    await store.enqueue([_job("acme"), _job("acme"), _job("beta"), _job("beta"), _job("beta")])
    claims = await store.claim("w1", ["echo"], [], 2, 30.0)
    started = await store.start("w1", [Start(claims[0].fence, new_id())])
    counts = await store.count_live_jobs()
    assert counts.ready == 3 and sum(counts.ready_by_tenant.values()) == 3
    assert counts.by_state == {"queued": 4, "running": 1}  # 3 ready + 1 claimed, unstarted
    s = started[0]
    await store.finish("w1", [Finish(s.fence, s.execution_id, s.started_at, JobState.SUCCEEDED, 2, "null")])
    counts = await store.count_live_jobs()
    assert counts.by_state == {"queued": 4}  # finished jobs are history, not counted
