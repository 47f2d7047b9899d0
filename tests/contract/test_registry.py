"""The broker's registry contract (docs/routing.md), on SQLite and PostgreSQL: the profile a worker registers and
heartbeats, drain requests read by the next heartbeat, and the agents (with their specs) of the live registry."""

from __future__ import annotations

import asyncio

import pytest

from tenure.contracts.errors import UnknownAgent
from tenure.contracts.profile import WorkerRecord, specs_from_json, specs_json
from tenure.contracts.states import WorkerState
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, AdmissionLimits, JobRequest
from tenure.control.directory import MISS_S, TTL_S, AgentDirectory

W1, W2 = "worker-1", "worker-2"
TTL = 30.0
SPECS = {
    "summarize": AgentSpec(
        "summarize", max_attempts=5, timeout_s=600.0, retry_safe=True, priority=7, budget=(("cost", 2.5), ("tokens", 500))
    )
}


def info(worker_id: str, agents: tuple[str, ...] = ("summarize",), **kw: object) -> WorkerInfo:
    return WorkerInfo(worker_id, "host-a", 42, 4, agents, **kw)  # type: ignore[arg-type]


async def test_the_profile_is_registered_and_heartbeated(store: Store) -> None:
    await store.register_worker(
        info(W1, capabilities=("text/*", "text/summarize"), features=("gpu", "long"), agent_specs=specs_json(SPECS))
    )
    (w,) = await store.list_workers()
    assert (w.capabilities, w.features, w.success_rate, w.latency_ms, w.consecutive_timeouts) == (
        ("text/*", "text/summarize"),
        ("gpu", "long"),
        None,
        None,
        0,
    )
    await store.heartbeat(W1, WorkerState.ACTIVE, 2, [], TTL, WorkerRecord(0.75, 120.5, 2))
    (w,) = await store.list_workers()
    assert (w.in_flight, w.success_rate, w.latency_ms, w.consecutive_timeouts) == (2, 0.75, 120.5, 2)
    # A heartbeat without a record keeps the one written before.
    await store.heartbeat(W1, WorkerState.ACTIVE, 0, [], TTL)
    (w,) = await store.list_workers()
    assert (w.in_flight, w.success_rate, w.latency_ms, w.consecutive_timeouts) == (0, 0.75, 120.5, 2)
    d = w.to_dict()
    assert d["features"] == ["gpu", "long"] and "agent_specs" not in d


async def test_a_drain_request_is_read_by_the_next_heartbeat(store: Store) -> None:
    await store.register_worker(info(W1))
    await store.register_worker(info(W2))
    reply = await store.heartbeat(W1, WorkerState.ACTIVE, 0, [], TTL)
    assert not reply.drain
    drained = await store.request_drain(W1, 12.5)
    assert drained is not None and drained.id == W1 and drained.state is WorkerState.DRAINING and drained.drain_requested
    reply = await store.heartbeat(W1, WorkerState.ACTIVE, 0, [], TTL)
    assert (reply.drain, reply.drain_timeout_s) == (True, 12.5)
    # That heartbeat was sent before the worker knew: the registry still shows the worker draining, never back to
    # active between the request and the worker's own switch.
    assert [w.state for w in await store.list_workers() if w.id == W1] == [WorkerState.DRAINING]
    other = await store.heartbeat(W2, WorkerState.ACTIVE, 0, [], TTL)
    assert not other.drain  # only the worker asked
    assert (await store.request_drain(W1, None)) is not None
    assert (await store.heartbeat(W1, WorkerState.DRAINING, 0, [], TTL)).drain_timeout_s is None


async def test_a_drain_request_for_an_unknown_or_gone_worker_matches_nothing(store: Store) -> None:
    assert await store.request_drain("nobody", None) is None
    await store.register_worker(info(W1))
    await store.set_worker_state(W1, WorkerState.GONE)
    assert await store.request_drain(W1, None) is None


async def test_registry_agents_are_those_of_live_workers_newest_first(store: Store) -> None:
    assert await store.registry_agents() == []
    await store.register_worker(info(W1, ("summarize", "ocr"), agent_specs=specs_json(SPECS)))
    await store.register_worker(info(W2, ("translate",)))
    rows = await store.registry_agents()
    assert {a for w in rows for a in w.agents} == {"summarize", "ocr", "translate"}
    specs = {}
    for w in reversed(rows):  # oldest first, so the newest worker's spec wins
        specs.update(specs_from_json(w.agent_specs, w.agents))
    assert specs["summarize"] == SPECS["summarize"]
    assert specs["ocr"] == AgentSpec("ocr")  # served, no spec recorded: the defaults
    await store.set_worker_state(W2, WorkerState.GONE)
    assert {a for w in await store.registry_agents() for a in w.agents} == {"summarize", "ocr"}


async def test_admission_knows_the_agents_of_live_workers(store: Store) -> None:
    """A producer without the workers' code: the app it holds defines no agent, the registry does."""
    door = Admission(store, {})
    with pytest.raises(UnknownAgent, match=r"unknown agent 'summarize'.*known agents: none.*--allow-unregistered"):
        await door.admit(JobRequest("summarize", {}))
    await store.register_worker(info(W1, ("summarize", "ocr"), agent_specs=specs_json(SPECS)))
    await asyncio.sleep(MISS_S)  # a miss reads the registry again after at most MISS_S
    job = (await door.admit(JobRequest("summarize", {"text": "x"}))).job
    # The worker's defaults, not the plain ones: attempts, timeout, retry safety, priority.
    assert (job.agent, job.max_attempts, job.timeout_s, job.retry_safe, job.priority) == ("summarize", 5, 600.0, True, 7)
    # ... and its default budget, under the job's own limits (limit by limit).
    assert (await store.read_budget(job.id)).limits == {"cost": 2.5, "tokens": 500}  # type: ignore[union-attr]
    own = (await door.admit(JobRequest("summarize", {}, budget={"tokens": 9, "tool_calls": 3}))).job
    assert (await store.read_budget(own.id)).limits == {"cost": 2.5, "tokens": 9, "tool_calls": 3}  # type: ignore[union-attr]
    with pytest.raises(UnknownAgent, match=r"known agents: ocr, summarize\)"):
        await door.admit(JobRequest("translate", {}))
    # Accepted for a worker not up yet: per request, or for the whole door.
    job = (await door.admit(JobRequest("translate", {}, allow_unregistered=True))).job
    assert (job.agent, job.max_attempts, job.retry_safe) == ("translate", 3, False)
    lenient = Admission(store, {}, AdmissionLimits(allow_unregistered=True))
    assert (await lenient.admit(JobRequest("translate", {}))).job.agent == "translate"
    # A worker that left takes its agents with it (once the cached snapshot is older than its TTL).
    await store.set_worker_state(W1, WorkerState.GONE)
    door.directory = AgentDirectory(store)
    with pytest.raises(UnknownAgent, match=r"known agents: none"):
        await door.admit(JobRequest("summarize", {}))


async def test_the_registry_is_read_at_most_once_per_ttl_for_known_agents(store: Store) -> None:
    await store.register_worker(info(W1, agent_specs=specs_json(SPECS)))
    now = [100.0]
    directory = AgentDirectory(store, clock=lambda: now[0])
    off = Admission(store, {"local": AgentSpec("local")}, AdmissionLimits(route_grace_ms=0), directory=directory)
    await off.admit(JobRequest("local", {}))
    assert directory.reads == 0  # without routing, the app's own agents never read the registry
    door = Admission(store, {"local": AgentSpec("local")}, directory=directory)
    await door.admit(JobRequest("local", {}))
    assert directory.reads == 1  # routing scores from the same snapshot: one read per TTL, whatever the agent
    for _ in range(5):
        await door.admit(JobRequest("summarize", {}))
    assert directory.reads == 1
    now[0] += TTL_S
    await door.admit(JobRequest("summarize", {}))
    assert directory.reads == 2
    for _ in range(3):  # an unknown name re-reads, but at most once per MISS_S
        with pytest.raises(UnknownAgent):
            await door.admit(JobRequest("nope", {}))
    assert directory.reads == 2
    now[0] += MISS_S
    with pytest.raises(UnknownAgent):
        await door.admit(JobRequest("nope", {}))
    assert directory.reads == 3


async def test_routings_snapshot_counts_the_jobs_a_worker_runs_now_not_its_last_heartbeat(store: Store) -> None:
    # Routing scores load from registry_agents (control/scoring.py): a job claimed since the worker's last
    # heartbeat must count, or a full worker looks free and its preferred jobs wait out the grace.
    from tests.contract.test_store import claim_one, start_one, submit

    await store.register_worker(WorkerInfo("w-1", "h", 1, 1, ("echo",), ()))
    (before,) = await store.registry_agents()
    assert before.in_flight == 0
    await submit(store)
    claim = await claim_one(store, worker="w-1")
    await start_one(store, claim, worker="w-1")  # no heartbeat since
    (now,) = await store.registry_agents()
    assert now.in_flight == 1
