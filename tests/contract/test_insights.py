"""The Insights contract (the dashboard's read side): one suite, run against SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from tenure.app import open_insights
from tenure.backends._queries import load_queries
from tenure.contracts.insights import Insights, JobQuery, id_floor
from tenure.contracts.states import JobState
from tenure.contracts.store import Store
from tenure.contracts.types import JobFilter, NewEvent, new_id
from tenure.control.admission import idem_digest
from tenure.settings import Settings
from tests.contract.test_store import W1, claim_one, finish, start_one, submit


@pytest.fixture
async def insights(store: Store, database_url: str) -> AsyncIterator[Insights]:
    i = await open_insights(Settings.of(database_url=database_url))
    try:
        yield i
    finally:
        await i.close()


def test_both_dialects_define_the_same_insight_queries_each_with_a_description() -> None:
    pg = load_queries("tenure.backends.postgres", "insights.sql")
    lite = load_queries("tenure.backends.sqlite", "insights.sql")
    assert sorted(pg) == sorted(lite) and len(pg) > 10
    for name, sql in {**pg, **lite}.items():
        assert sql.startswith("--"), f"{name} lacks its one-line description"


async def test_job_pages_are_keyset_pages_newest_first_without_gap_or_duplicate(store: Store, insights: Insights) -> None:
    ids = [await submit(store, input=i) for i in range(7)]
    seen: list[str] = []
    before = None
    for _ in range(5):
        page = await insights.job_page(JobQuery(limit=3, before=before))
        seen += [j.id for j in page.jobs]
        before = page.next_before
        if before is None:
            break
    assert seen == ids[::-1]
    first = (await insights.job_page(JobQuery(limit=1))).jobs[0]
    assert (first.state, first.agent, first.tenant, first.epoch) == (JobState.QUEUED, "echo", "default", 0)
    assert first.worker is None


async def test_a_tenant_sees_only_its_own_jobs_and_filters_combine(store: Store, insights: Insights) -> None:
    a = [await submit(store, tenant="a") for _ in range(3)]
    b = await submit(store, tenant="b")
    claim = await claim_one(store)  # the oldest job: a[0]
    assert claim.fence.job_id == a[0]
    execution = await start_one(store, claim)
    page = await insights.job_page(JobQuery(tenant="a"))
    assert [j.id for j in page.jobs] == a[::-1] and page.next_before is None
    assert [j.id for j in (await insights.job_page(JobQuery(tenant="b"))).jobs] == [b]
    running = await insights.job_page(JobQuery(tenant="a", state=JobState.RUNNING))
    assert [(j.id, j.worker, j.epoch) for j in running.jobs] == [(a[0], W1, 1)]
    assert (await insights.job_page(JobQuery(tenant="b", state=JobState.RUNNING))).jobs == []
    assert [j.id for j in (await insights.job_page(JobQuery(state=JobState.QUEUED))).jobs] == [b, a[2], a[1]]
    assert [j.id for j in await insights.jobs_by_execution([execution, new_id(), "not-an-id"])] == [a[0]]


async def test_an_agent_filter_looks_through_a_bounded_window_and_says_where_it_stopped(
    store: Store, insights: Insights
) -> None:
    safe = await submit(store, "safe")
    for _ in range(5):
        await submit(store)
    for tenant, state in ((None, None), ("default", None), (None, JobState.QUEUED), ("default", JobState.QUEUED)):
        q = JobQuery(tenant, state, "safe", limit=10, agent_window=3)
        page = await insights.job_page(q)
        assert page.jobs == [] and page.scanned_to is not None and page.next_before == page.scanned_to
        rest = await insights.job_page(JobQuery(tenant, state, "safe", page.next_before, 10, agent_window=3))
        assert [j.id for j in rest.jobs] == [safe] and rest.next_before is None and rest.scanned_to is None


async def test_search_by_id_range_and_by_idempotency_key(store: Store, insights: Insights) -> None:
    mine = await submit(store, tenant="a", idempotency_key="order-42")
    other = await submit(store, tenant="b", idempotency_key="order-42")
    lo = mine[:8] + "-0000-0000-0000-000000000000"
    hi = mine[:8] + "-ffff-ffff-ffff-ffffffffffff"
    found = await insights.job_page(JobQuery(tenant="a", id_from=lo, id_to=hi))
    assert [j.id for j in found.jobs] == [mine]
    assert [j.id for j in (await insights.job_page(JobQuery(tenant="b", id_from=mine, id_to=mine))).jobs] == []
    by_key = await insights.jobs_by_idempotency([("a", idem_digest("a", "order-42"))])
    assert [j.id for j in by_key] == [mine]
    both = await insights.jobs_by_idempotency([(t, idem_digest(t, "order-42")) for t in ("a", "b")])
    assert sorted(j.id for j in both) == sorted([mine, other])
    assert await insights.tenants() == ["a", "b"]


async def test_counts_by_state_stop_at_the_cap(store: Store, insights: Insights) -> None:
    for _ in range(4):
        await submit(store, tenant="a")
    await submit(store, tenant="b")
    counts = await insights.count_by_state(None)
    assert set(counts) == {s.value for s in JobState} and counts["queued"] == 5 and counts["dead"] == 0
    assert (await insights.count_by_state("a", cap=3))["queued"] == 3
    assert (await insights.count_by_state("b"))["queued"] == 1


async def test_the_hours_finishes_and_latencies_come_from_the_store(store: Store, insights: Insights) -> None:
    since = time.time() - 60
    job = await submit(store, tenant="a")
    claim = await claim_one(store)
    execution = await start_one(store, claim)
    assert await store.finish(W1, [finish(claim.fence, execution)]) == [job]
    await submit(store, tenant="a")  # not claimed: not in the latency sample
    buckets = await insights.finished_since("a", since)
    assert [(b.state, b.count) for b in buckets] == [("succeeded", 1)]
    assert abs(buckets[0].minute - time.time()) < 120 and buckets[0].minute % 60 == 0
    assert await insights.finished_since("b", since) == []
    (sample,) = await insights.latency_sample(None, since, 100)
    assert sample.queue_wait_s is not None and 0 <= sample.queue_wait_s < 5
    assert sample.dispatch_s is not None and 0 <= sample.dispatch_s < 5
    assert await insights.latency_sample("b", since, 100) == []
    assert await insights.latency_sample(None, time.time() + 3600, 100) == []
    assert id_floor(since) < job


async def test_circuit_failures_are_counted_per_key(store: Store, insights: Insights) -> None:
    since = time.time() - 60
    for _ in range(2):
        await store.record_circuit_failure("agent:echo")
    await store.record_circuit_failure("agent:safe")
    rows = await insights.circuit_failures(since)
    assert [(r.key, r.failures) for r in rows] == [("agent:echo", 2), ("agent:safe", 1)]
    assert abs(rows[0].last_failure_at - time.time()) < 5
    assert await insights.circuit_failures(time.time() + 60) == []


async def test_every_state_is_listed_and_counted_per_tenant_and_overall(store: Store, insights: Insights) -> None:
    # A job in each state the indexes tell apart (SQLite reads a partial index per kind: _state_pages.py), in two
    # tenants: each state's page, count and `list_jobs` find exactly its jobs, and a job that moves on leaves them.
    want: dict[tuple[str, JobState], str] = {}
    for tenant in ("a", "b"):
        for state in (JobState.RUNNING, JobState.WAITING, JobState.SCHEDULED, JobState.SUCCEEDED, JobState.FAILED):
            job_id = await submit(store, tenant=tenant, max_attempts=2)
            claim = await claim_one(store)
            assert claim.fence.job_id == job_id
            execution_id = await start_one(store, claim)
            if state is JobState.WAITING:
                assert await store.set_waiting(NewEvent(claim.fence, execution_id, 2, "job.waiting", "{}"), True)
            elif state is not JobState.RUNNING:
                assert len(await store.finish(W1, [finish(claim.fence, execution_id, state, delay=3600)])) == 1
            want[tenant, state] = job_id
    for tenant in ("a", "b"):
        want[tenant, JobState.QUEUED] = await submit(store, tenant=tenant)
    for state in JobState:
        mine = {t: [want[t, state]] if (t, state) in want else [] for t in ("a", "b")}
        both = sorted(mine["a"] + mine["b"], reverse=True)
        assert [j.id for j in (await insights.job_page(JobQuery(state=state))).jobs] == both, state
        assert [j.id for j in await store.list_jobs(JobFilter(state=state))] == both, state
        assert (await insights.count_by_state(None))[state.value] == len(both), state
        for t in ("a", "b"):
            assert [j.id for j in (await insights.job_page(JobQuery(tenant=t, state=state))).jobs] == mine[t]
            assert [j.id for j in await store.list_jobs(JobFilter(tenant=t, state=state))] == mine[t]
            assert (await insights.count_by_state(t))[state.value] == len(mine[t])
    # The queued job of a starts: it leaves the queued page and count and joins the running ones.
    claim = await claim_one(store)
    await start_one(store, claim)
    assert [j.id for j in (await insights.job_page(JobQuery(tenant="a", state=JobState.QUEUED))).jobs] == []
    running = await insights.job_page(JobQuery(tenant="a", state=JobState.RUNNING))
    assert sorted(j.id for j in running.jobs) == sorted([want["a", JobState.RUNNING], want["a", JobState.QUEUED]])
    assert (await insights.count_by_state(None))["queued"] == 1
