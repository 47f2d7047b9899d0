"""Observability on real `tenure worker` processes: seed 000's experiment, a loop blocked for 3 claim TTLs,
and the Prometheus metrics a mixed run leaves at `/metrics`, scraped over HTTP.

Assertions compare relations (blocked vs offloaded, before vs after), never absolute speeds.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tenure.contracts.states import JobState
from tenure.contracts.types import Job
from tenure.local import LocalClient, connect
from tests.integration.procs import SWEEP, TTL, WorkerProc, eventually

pytestmark = pytest.mark.slow

APP = "tests.apps.obs_app:app"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.stop()


def spawn(workers: list[WorkerProc], url: str, tmp_path: Path, name: str, **kw: object) -> WorkerProc:
    w = WorkerProc(url, tmp_path, name, app=APP, args=("--metrics-port", "0"), **kw)  # type: ignore[arg-type]
    workers.append(w)
    return w


async def metrics_url(w: WorkerProc) -> str:
    async def port() -> str | None:
        found = re.search(r"metrics on (http://[0-9.]+:\d+/metrics)", w.log())
        return found.group(1) if found else None

    return await eventually(port, 20, f"worker {w.name} to serve /metrics")


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient() as http:
        response = await http.get(url, timeout=10)
    response.raise_for_status()
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def has(samples: Samples, name: str, **labels: str) -> bool:
    want = set(labels.items())
    return any(n == name and want <= ls for (n, ls) in samples)


async def terminal(client: LocalClient, job_id: str) -> Job | None:
    job = await client.job(job_id)
    return job if job.state.terminal else None


async def all_terminal(client: LocalClient, ids: list[str]) -> list[Job] | None:
    jobs = [await client.job(i) for i in ids]
    return jobs if all(j.state.terminal for j in jobs) else None


async def has_event(client: LocalClient, job_id: str, kind: str) -> bool:
    return kind in [e.type for e in await client.events(job_id)]


def lag_above(samples: Samples, worker_id: str, le: str = "0.1") -> float:
    """How many lag samples of this worker were above `le` seconds."""
    total = value(samples, "event_loop_lag_seconds_count", worker=worker_id)
    return total - value(samples, "event_loop_lag_seconds_bucket", worker=worker_id, le=le)


async def test_seed_000_blocking_on_the_loop_delays_an_unrelated_ticker_and_offloading_does_not(
    sqlite_database_url: str, workers: list[WorkerProc], tmp_path: Path
) -> None:
    w = spawn(workers, sqlite_database_url, tmp_path, "w", concurrency=8, env={"TENURE_STALL_THRESHOLD_S": "0.1"})
    url = await metrics_url(w)
    async with connect(APP, sqlite_database_url) as client:

        async def run(blocker: str, ticker_s: float) -> tuple[float, Samples]:
            # The ticker outlives the blockers (checked below) but not by much: on a shared machine every
            # extra second of ticking is one more chance to catch an unrelated scheduling hiccup.
            ticker_id = (await client.submit("ticker", {"seconds": ticker_s, "every": 0.02})).job.id
            await eventually(lambda: has_event(client, ticker_id, "ticking"), 20, "the ticker to tick")
            ids = [(await client.submit(blocker, {"seconds": 0.2})).job.id for _ in range(4)]
            blockers = await eventually(lambda: all_terminal(client, ids), 20, f"the {blocker} jobs")
            ticker = await eventually(lambda: terminal(client, ticker_id), 20, "the ticker to finish")
            assert ticker.state is JobState.SUCCEEDED, w.log()
            assert all(j.state is JobState.SUCCEEDED for j in blockers), w.log()
            # The experiment is valid only if every blocking call ran while the ticker was ticking.
            assert all(
                j.finished_at is not None and ticker.finished_at is not None and j.finished_at <= ticker.finished_at
                for j in blockers
            )
            return float(ticker.result["max_late_s"]), await scrape(url)

        before = await scrape(url)
        worker_id = next(dict(ls)["worker"] for (n, ls) in before if n == "event_loop_lag_max_seconds")
        late_on_loop, after_a = await run("block_on_loop", 2.0)  # 4 x 0.2 s in a row on the loop
        late_offloaded, after_b = await run("block_in_thread", 1.2)  # 4 x 0.2 s side by side

    # (a) 4 x 200 ms on the loop: the ticker is at least one whole blocking call late, and the lag sampler
    # (histogram, max gauge, stall counter and the WARNING with the stack) caught it.
    assert late_on_loop >= 0.150, w.log()
    assert value(after_a, "event_loop_lag_max_seconds", worker=worker_id) >= 0.150
    lagged_a = lag_above(after_a, worker_id) - lag_above(before, worker_id)
    assert lagged_a >= 1
    assert value(after_a, "tenure_loop_stalls_total", role="worker", worker=worker_id) >= 1
    log = w.log()
    assert "event loop blocked" in log and "block_on_loop" in log  # the culprit's task and stack
    # (b) the same calls through ctx.to_thread: the ticker stays on time, and the sampler saw less.
    assert late_offloaded < 0.050, w.log()
    assert late_offloaded < late_on_loop
    assert lag_above(after_b, worker_id) - lag_above(after_a, worker_id) < lagged_a
    assert value(after_b, "tenure_blocking_completed_total", adapter="worker", worker=worker_id) >= 4
    assert value(after_b, "tenure_external_seconds_count", agent="block_in_thread", kind="tool") == 4


async def test_a_loop_blocked_for_three_claim_ttls_never_runs_its_job_twice_at_once(
    sqlite_database_url: str, workers: list[WorkerProc], tmp_path: Path
) -> None:
    env = {"TENURE_DEGRADED_LAG_S": "0.5", "TENURE_DEGRADED_FOR_S": "1.0"}
    a = spawn(workers, sqlite_database_url, tmp_path, "a", concurrency=2, env=env)
    b = spawn(workers, sqlite_database_url, tmp_path, "b", concurrency=2, env=env)
    counter = tmp_path / "concurrency.json"
    hold_s = 3 * TTL
    async with connect(APP, sqlite_database_url) as client:
        await eventually(lambda: _registered(client, 2), 20, "both workers to register")
        job_id = (await client.submit("hold_loop", {"counter": str(counter), "seconds": hold_s})).job.id
        await eventually(lambda: has_event(client, job_id, "holding"), 20, "the job to start holding")
        owner = (await client.job(job_id)).owner
        assert owner is not None
        blocked, other = (a, b) if f":{a.pid}:" in owner else (b, a)
        seen: set[str] = set()

        async def watch_registry() -> None:
            while True:
                for wi in await client.workers(include_gone=True):
                    if wi.id == owner:
                        seen.add(wi.state.value)
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch_registry())
        try:
            job = await eventually(lambda: terminal(client, job_id), hold_s + TTL + 20, "the job to end")
            # After the freeze the worker reports itself degraded (lag-aware liveness) before recovering.
            await eventually(lambda: _true("degraded" in seen), 15, "the blocked worker to report degraded")
            await asyncio.sleep(TTL + 2 * SWEEP)  # time for any second execution to show up
        finally:
            watcher.cancel()
        assert job.state in (JobState.LOST, JobState.SUCCEEDED), blocked.log()
        executions = await client.store.list_executions(job_id)
        assert len(executions) == 1 and executions[0].worker_id == owner
        if job.state is JobState.LOST:
            assert [e.outcome for e in executions] == ["lost"]
        final = await client.job(job_id)
        assert final.state is job.state
        # The blocked worker is alive again (blocked is not dead) and its late heartbeat was noticed.
        await eventually(lambda: _state_of(client, owner, "active"), 15, "the blocked worker to recover")
    count = json.loads(counter.read_text())
    assert count["max"] == 1 and count["total"] == 1, count
    log = blocked.log()
    assert "heartbeat sent" in log and "late" in log
    assert "degraded" in log
    assert other.proc.poll() is None and blocked.proc.poll() is None


async def test_a_degraded_worker_claims_nothing_new_but_keeps_and_finishes_the_job_it_holds(
    sqlite_database_url: str, workers: list[WorkerProc], tmp_path: Path
) -> None:
    env = {"TENURE_DEGRADED_LAG_S": "0.3", "TENURE_DEGRADED_FOR_S": "1.0"}
    w = spawn(workers, sqlite_database_url, tmp_path, "w", concurrency=4, env=env)
    async with connect(APP, sqlite_database_url) as client:
        await eventually(lambda: _registered(client, 1), 20, "the worker to register")
        worker_id = (await client.workers())[0].id
        # 0.4 s of every 0.5 s on the loop for 4 s: each stall is shorter than the claim TTL, so heartbeats
        # still get through between them, but the loop is late most of the time.
        laggy_id = (await client.submit("laggy", {"blocks": 8, "block_s": 0.4, "gap_s": 0.1})).job.id
        await eventually(lambda: _state_of(client, worker_id, "degraded"), 15, "the worker to report degraded")
        fresh_id = (await client.submit("model_call", {})).job.id
        laggy = await eventually(lambda: terminal(client, laggy_id), 30, "the laggy job to finish")
        assert (await client.job(fresh_id)).owner is None  # nothing new was claimed while degraded
        fresh = await eventually(lambda: terminal(client, fresh_id), 20, "the new job, once the worker recovered")
    # Blocked is not dead: the job it held was never taken away, and it finished it.
    assert laggy.state is JobState.SUCCEEDED and laggy.epoch == 1, w.log()
    assert fresh.state is JobState.SUCCEEDED and fresh.owner is None
    assert laggy.finished_at is not None and fresh.execution_started_at is not None
    assert fresh.execution_started_at > laggy.finished_at  # claimed only after the lag went away
    assert "worker degraded" in w.log() and "worker active again" in w.log()


async def _registered(client: LocalClient, n: int) -> bool:
    return len(await client.workers()) >= n


async def _true(value: bool) -> bool:
    return value


async def _state_of(client: LocalClient, worker_id: str, state: str) -> bool:
    return any(w.id == worker_id and w.state.value == state for w in await client.workers(include_gone=True))


@pytest.fixture
async def mixed_client(database_url: str) -> AsyncIterator[LocalClient]:
    async with connect(APP, database_url) as c:
        yield c


async def test_metrics_of_a_mixed_run_are_served_at_slash_metrics_with_their_labels(
    database_url: str, mixed_client: LocalClient, workers: list[WorkerProc], tmp_path: Path
) -> None:
    w = spawn(workers, database_url, tmp_path, "w", concurrency=4)
    url = await metrics_url(w)
    client = mixed_client
    ids = [
        (await client.submit("model_call", {})).job.id,
        (await client.submit("block_in_thread", {"seconds": 0.05})).job.id,
        (await client.submit("fail_permanently", {})).job.id,
        (await client.submit("fail_once", {})).job.id,
    ]
    jobs = await eventually(lambda: all_terminal(client, ids), 30, "the mixed run to finish", interval=0.1)
    assert [j.state for j in jobs] == [JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED, JobState.SUCCEEDED], w.log()
    worker_id = jobs[0].owner or (await client.store.list_executions(ids[0]))[0].worker_id

    async def scraped_registry() -> Samples | None:
        s = await scrape(url)
        return s if has(s, "tenure_workers", state="active") else None

    s = await eventually(scraped_registry, 15, "the sweeper holder to export the registry", interval=0.2)
    # the four intervals, per agent
    assert value(s, "tenure_queue_wait_seconds_count", agent="model_call") == 1
    assert value(s, "tenure_dispatch_seconds_count", agent="model_call") == 1
    assert value(s, "tenure_first_event_seconds_count", agent="model_call") == 1
    assert value(s, "tenure_external_seconds_count", agent="model_call", kind="model") == 1
    assert value(s, "tenure_external_seconds_sum", agent="model_call", kind="model") >= 0.04
    assert value(s, "tenure_queue_wait_seconds_count", agent="fail_once") == 1  # first attempt only
    assert value(s, "tenure_dispatch_seconds_count", agent="fail_once") == 2  # one per execution
    # jobs and retries
    assert value(s, "tenure_jobs_finished_total", agent="model_call", state="succeeded") == 1
    assert value(s, "tenure_jobs_finished_total", agent="fail_permanently", state="failed") == 1
    assert value(s, "tenure_retries_total", agent="fail_once") == 1
    # the process: loop lag, heartbeats, its own state, the registry
    assert value(s, "event_loop_lag_seconds_count", role="worker", worker=worker_id) > 0
    assert has(s, "event_loop_lag_max_seconds", role="worker", worker=worker_id)
    assert value(s, "tenure_heartbeat_lateness_seconds_count", worker=worker_id) > 0
    assert value(s, "tenure_worker_state", worker=worker_id, state="active") == 1
    assert value(s, "tenure_workers", state="active") >= 1
    # store-wide gauges, exported every few seconds by the sweeper holder (so maybe from mid-run)
    assert 0 <= value(s, "tenure_queue_depth", scope="global") <= len(ids)
    assert has(s, "tenure_jobs", state="running") and has(s, "tenure_jobs", state="queued")
    # blocking adapters: the worker's, and on SQLite the store's connection thread (bound 1)
    assert value(s, "tenure_blocking_max_in_flight", adapter="worker", role="worker", worker=worker_id) >= 1
    assert value(s, "tenure_blocking_completed_total", adapter="worker", worker=worker_id) >= 1
    assert has(s, "tenure_blocking_queued", adapter="worker", worker=worker_id)
    assert has(s, "tenure_blocking_failed_closed_total", adapter="worker", worker=worker_id)
    if database_url.startswith("sqlite"):
        assert value(s, "tenure_blocking_max_in_flight", adapter="sqlite", worker=worker_id) == 1
        assert value(s, "tenure_blocking_completed_total", adapter="sqlite", worker=worker_id) > 0
    # Every state change is one JSON line with the job's identity.
    lines = [json.loads(line) for line in w.log().splitlines() if line.startswith("{")]
    done = [x for x in lines if x.get("job_id") == ids[2] and x.get("state") == "failed"]
    assert len(done) == 1, w.log()
    assert {"execution_id", "worker_id", "agent", "epoch", "duration_ms", "error_code"} <= done[0].keys()
    assert done[0]["error_code"]
