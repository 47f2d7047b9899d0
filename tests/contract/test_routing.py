"""Weighted routing's contract (docs/routing.md), on every backend: admission records a preferred worker with a
grace; the claim (claim_jobs and claim-and-start alike) gives the job only to that worker until the grace ended,
then to any capable worker; a strict job's preferred features are enforced by the claim itself."""

from __future__ import annotations

import asyncio

from tenure.contracts.profile import WorkerRecord, claim_tags
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, AdmissionLimits, JobRequest
from tenure.control.directory import TTL_S, AgentDirectory
from tenure.control.jobs import JobsService

A, B = "worker-a", "worker-b"  # B's record is worse (door): A is preferred
AGENTS = {"echo": AgentSpec("echo")}
TTL = 30.0
GRACE_MS = 300


async def door(store: Store, *workers: WorkerInfo) -> Admission:
    for w in workers or (WorkerInfo(A, "h", 1, 2, ("echo",)), WorkerInfo(B, "h", 2, 4, ("echo",))):
        await store.register_worker(w)
    if not workers:  # alike, neither would be preferred (ROUTE_MARGIN): B fails a fifth of its jobs
        await store.heartbeat(B, WorkerState.ACTIVE, 0, [], TTL, WorkerRecord(0.8, None, 0))
    return Admission(store, AGENTS, AdmissionLimits(route_grace_ms=GRACE_MS))


async def grace_over(store: Store, job_id: str) -> None:
    """Wait until the store's clock passed the job's grace (no wall-clock assertion: the store decides)."""
    route = await store.job_route(job_id)
    assert route is not None and route.preferred_until is not None
    while await store.server_time() <= route.preferred_until:
        await asyncio.sleep(0.05)


async def test_a_job_preferred_to_a_is_not_claimed_by_b_before_its_grace_ends_and_is_after(store: Store) -> None:
    admission = await door(store)
    job_id = (await admission.admit(JobRequest("echo", {}))).job.id
    route = await store.job_route(job_id)
    assert route is not None and route.preferred_worker == A
    assert await store.claim(B, ["echo"], [], 5, TTL) == []
    assert await store.claim_and_start(B, ["echo"], [], 5, TTL) == []
    await grace_over(store, job_id)
    pairs = await store.claim_and_start(B, ["echo"], [], 5, TTL)
    assert [c.fence.job_id for c, _ in pairs] == [job_id]
    view = await JobsService(store, admission).route(await store.get_job(job_id))  # type: ignore[arg-type]
    assert view is not None and view["claimed_by"] == B
    assert view["why"] == f"grace ended; claimed by {B} (preferred worker was {A})"


async def test_the_preferred_worker_claims_its_job_within_the_grace(store: Store) -> None:
    admission = await door(store)
    job_id = (await admission.admit(JobRequest("echo", {}))).job.id
    other = (await admission.admit(JobRequest("echo", {}))).job.id  # routed to B: A's load counts the first
    claims = await store.claim(A, ["echo"], [], 5, TTL)
    assert [c.fence.job_id for c in claims] == [job_id]
    assert [c.fence.job_id for c in await store.claim(B, ["echo"], [], 5, TTL)] == [other]


async def test_a_single_candidate_gets_no_preference_and_a_job_of_no_candidate_waits_for_any(store: Store) -> None:
    admission = await door(store, WorkerInfo(A, "h", 1, 4, ("echo",)))
    job_id = (await admission.admit(JobRequest("echo", {}))).job.id
    route = await store.job_route(job_id)
    assert route is not None and route.preferred_worker is None and '"only_candidate"' in (route.route_json or "")
    assert [c.fence.job_id for c in await store.claim(B, ["echo"], [], 5, TTL)] == [job_id]


async def test_a_strict_job_is_claimed_only_by_a_worker_offering_its_preferred_features(store: Store) -> None:
    gpu = WorkerInfo(B, "h", 2, 4, ("echo",), features=("gpu",))
    admission = await door(store, WorkerInfo(A, "h", 1, 4, ("echo",)), gpu)
    job = (await admission.admit(JobRequest("echo", {}, prefers=["gpu"], strict=True))).job
    assert "feature:gpu" in job.requires
    await grace_over_or_none(store, job.id)
    assert await store.claim(A, ["echo"], claim_tags((), ()), 5, TTL) == []  # even after any grace
    claims = await store.claim(B, ["echo"], claim_tags((), ("gpu",)), 5, TTL)
    assert [c.fence.job_id for c in claims] == [job.id]
    loose = (await admission.admit(JobRequest("echo", {}, prefers=["gpu"]))).job
    assert "feature:gpu" not in loose.requires
    route = await store.job_route(loose.id)
    assert route is not None and route.preferred_worker == B  # the bonus outweighs B's load of one
    got = await store.get_job(loose.id)
    assert got is not None and got.state is JobState.QUEUED


async def grace_over_or_none(store: Store, job_id: str) -> None:
    route = await store.job_route(job_id)
    if route is not None and route.preferred_until is not None:
        await grace_over(store, job_id)


async def test_a_decision_without_preference_is_remembered_only_for_its_snapshot(store: Store) -> None:
    await store.register_worker(WorkerInfo(A, "h", 1, 4, ("echo",)))
    now = [100.0]
    directory = AgentDirectory(store, clock=lambda: now[0])
    admission = Admission(store, AGENTS, AdmissionLimits(route_grace_ms=GRACE_MS), directory=directory)
    first = (await admission.admit(JobRequest("echo", {}))).job.id
    await store.register_worker(WorkerInfo(B, "h", 2, 4, ("echo",)))  # not in the snapshot yet
    second = (await admission.admit(JobRequest("echo", {}))).job.id
    routes = [await store.job_route(j) for j in (first, second)]
    assert all(r is not None and r.preferred_worker is None for r in routes)
    assert routes[0].route_json == routes[1].route_json  # type: ignore[union-attr]
    now[0] += TTL_S  # the next admit reads the registry again: B is a candidate, the decision is made anew
    third = await store.job_route((await admission.admit(JobRequest("echo", {}))).job.id)
    assert third is not None and directory.reads == 2 and third.route_json != routes[0].route_json
    assert '"near_tie"' in (third.route_json or "")  # two alike candidates: still no preference
