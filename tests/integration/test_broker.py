"""The broker's registry with real worker processes (docs/routing.md): the profile every reader sees (the store,
`tenure workers --json`, `GET /v1/workers`), and drain through the store (`tenure drain`, `POST
/v1/workers/{id}/drain`): the held job finishes (or ends `worker_shutdown` past the timeout and is retried
elsewhere), nothing new is claimed, the worker exits 0, another takes the rest, and `tenure up` does not restart
it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tenure.app import open_backends
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.store import Backends
from tenure.control.admission import Admission, JobRequest
from tenure.settings import Settings
from tests.acceptance.up import ADMIN_KEY, Up
from tests.conftest import PYTHON, ROOT
from tests.integration.procs import FAST, TenureProc, WorkerProc, eventually

pytestmark = pytest.mark.slow


@pytest.fixture
async def backends(database_url: str) -> AsyncIterator[Backends]:
    b = await open_backends(Settings.of(database_url=database_url))
    try:
        yield b
    finally:
        await b.close()


async def submit(b: Backends, agent: str, input: object = None) -> str:
    return (await Admission(b.jobs, {}).admit(JobRequest(agent, input))).job.id


async def finished(b: Backends, job_id: str, within_s: float = 30) -> JobState:
    async def check() -> JobState | None:
        job = await b.jobs.get_job(job_id)
        return job.state if job is not None and job.state.terminal else None

    return await eventually(check, within_s, f"job {job_id} to finish")


def cli(database_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update({"TENURE_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)})
    return subprocess.run([PYTHON, "-m", "tenure.cli", *argv], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)


async def only_worker(b: Backends) -> str:
    (w,) = await eventually(b.jobs.list_workers, 30, "the worker to register")
    return w.id


async def test_the_profile_is_kept_in_the_store_and_shown_by_every_reader(
    database_url: str, backends: Backends, tmp_path: Path
) -> None:
    worker = WorkerProc(
        database_url,
        tmp_path,
        "w",
        concurrency=2,
        args=("--capabilities", "text/summarize,text/*,gpu", "--features", "gpu,long"),
    )
    port = 18000 + os.getpid() % 1000
    gateway = TenureProc(database_url, tmp_path, "gw", ["gateway", "--port", str(port)], env={"TENURE_UI": "off"})
    try:
        worker_id = await only_worker(backends)
        # One after another, so the EWMAs are known: three successes, then a hard timeout (`hang`: 0.5 s, dead).
        for agent, input in [("echo", 1), ("echo", 2), ("echo", 3), ("hang", {"seconds": 5})]:
            await finished(backends, await submit(backends, agent, input))

        async def recorded() -> object:
            ws = await backends.jobs.list_workers()
            return ws if ws and ws[0].consecutive_timeouts == 1 else None

        (w,) = await eventually(recorded, 10, "the record to arrive with a heartbeat")  # type: ignore[misc]
        assert (w.id, w.state, w.in_flight, w.concurrency) == (worker_id, WorkerState.ACTIVE, 0, 2)
        assert w.capabilities == ("gpu", "text/*", "text/summarize") and w.features == ("gpu", "long")
        assert w.success_rate == pytest.approx(0.9)  # 1, 1, 1, then 0 at weight 0.1
        assert w.latency_ms is not None and w.latency_ms >= 0.2 * 500  # the hang's 0.5 s at weight 0.2
        fields = {"id", "host", "pid", "state", "capabilities", "features", "in_flight", "concurrency", "success_rate",
                  "latency_ms", "consecutive_timeouts", "last_heartbeat"}  # fmt: skip
        out = cli(database_url, "workers", "--json")
        assert out.returncode == 0, out.stderr
        (shown,) = json.loads(out.stdout)
        assert fields <= shown.keys() and shown["features"] == ["gpu", "long"] and shown["consecutive_timeouts"] == 1

        async def http_workers() -> list[dict[str, object]] | None:
            try:
                async with httpx.AsyncClient() as c:
                    r = await c.get(f"http://127.0.0.1:{port}/v1/workers", timeout=2)
                return r.json()["workers"] if r.status_code == 200 else None
            except httpx.HTTPError:
                return None

        (seen,) = await eventually(http_workers, 30, "the gateway to answer")
        assert fields <= seen.keys()
        assert {k: seen[k] for k in ("id", "success_rate", "consecutive_timeouts", "capabilities", "features")} == {
            "id": worker_id,
            "success_rate": w.success_rate,
            "consecutive_timeouts": 1,
            "capabilities": ["gpu", "text/*", "text/summarize"],
            "features": ["gpu", "long"],
        }
    finally:
        gateway.stop()
        worker.stop()


async def test_tenure_drain_lets_the_held_job_finish_claims_nothing_new_and_exits_0(
    database_url: str, backends: Backends, tmp_path: Path
) -> None:
    first = WorkerProc(database_url, tmp_path, "first", concurrency=1)
    second = None
    try:
        first_id = await only_worker(backends)
        long_job = await submit(backends, "sleep", {"seconds": 3, "every": 0.5})

        async def running() -> bool:
            job = await backends.jobs.get_job(long_job)
            return job is not None and job.state is JobState.RUNNING

        await eventually(running, 20, "the long job to run")
        rest = [await submit(backends, "echo", i) for i in range(3)]  # queued behind the one slot
        out = cli(database_url, "drain", first_id)
        assert out.returncode == 0 and "draining" in out.stdout, out.stderr
        (w,) = await backends.jobs.list_workers()
        assert w.state is WorkerState.DRAINING and w.drain_requested
        assert await asyncio.to_thread(first.wait, 30) == 0, first.log()
        assert await finished(backends, long_job) is JobState.SUCCEEDED  # it finished what it held
        for job_id in rest:  # and claimed nothing new
            job = await backends.jobs.get_job(job_id)
            assert job is not None and job.state is JobState.QUEUED and job.owner is None
        assert [w.state for w in await backends.jobs.list_workers(include_gone=True)] == [WorkerState.GONE]
        second = WorkerProc(database_url, tmp_path, "second", concurrency=2)
        for job_id in rest:
            assert await finished(backends, job_id) is JobState.SUCCEEDED
            (execution,) = await backends.jobs.list_executions(job_id)
            assert execution.worker_id != first_id
        # Drain again, for a worker that is gone: a clear error, exit 1.
        again = cli(database_url, "drain", first_id)
        assert again.returncode == 1 and "not_found" in again.stderr and "no live worker" in again.stderr
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_a_drain_timeout_shorter_than_the_job_ends_it_worker_shutdown_and_another_worker_retries_it(
    database_url: str, backends: Backends, tmp_path: Path
) -> None:
    first = WorkerProc(database_url, tmp_path, "first", concurrency=1)
    second = None
    try:
        first_id = await only_worker(backends)
        job_id = await submit(backends, "sleep", {"seconds": 4, "every": 0.5})

        async def running() -> bool:
            job = await backends.jobs.get_job(job_id)
            return job is not None and job.state is JobState.RUNNING

        await eventually(running, 20, "the job to run")
        out = cli(database_url, "drain", first_id, "--timeout", "0.5")
        assert out.returncode == 0, out.stderr
        assert await asyncio.to_thread(first.wait, 30) == 0, first.log()
        job = await backends.jobs.get_job(job_id)
        assert job is not None and job.error_code == "worker_shutdown" and not job.state.terminal, job
        second = WorkerProc(database_url, tmp_path, "second", concurrency=1)
        assert await finished(backends, job_id) is JobState.SUCCEEDED
        executions = await backends.jobs.list_executions(job_id)
        assert [e.worker_id == first_id for e in executions] == [True, False]
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_three_hard_timeouts_in_a_row_make_a_worker_unhealthy_until_its_cool_down_ends(
    database_url: str, backends: Backends, tmp_path: Path
) -> None:
    worker = WorkerProc(
        database_url, tmp_path, "w", concurrency=1, env={"TENURE_UNHEALTHY_COOLDOWN_S": "4", "TENURE_LOG_FORMAT": "json"}
    )
    try:
        await only_worker(backends)
        hangs = [await submit(backends, "hang", {"seconds": 30}) for _ in range(3)]  # 0.5 s timeout, 1 attempt
        waiting = await submit(backends, "echo", "after")  # queued behind them on the one slot
        for job_id in hangs:
            assert await finished(backends, job_id) is JobState.DEAD

        async def state() -> WorkerState:
            (w,) = await backends.jobs.list_workers()
            return w.state

        async def unhealthy() -> bool:
            return await state() is WorkerState.UNHEALTHY

        await eventually(unhealthy, 10, "the worker to be unhealthy")
        (w,) = await backends.jobs.list_workers()
        assert w.consecutive_timeouts == 3
        job = await backends.jobs.get_job(waiting)
        assert job is not None and job.state is JobState.QUEUED and job.owner is None, job
        assert await finished(backends, waiting) is JobState.SUCCEEDED  # claimed once the cool-down ended

        async def active() -> bool:
            return await state() is WorkerState.ACTIVE

        await eventually(active, 10, "the worker to be active again")
        lines = [json.loads(x) for x in worker.log().splitlines() if x.startswith("{")]
        (began,) = [x["ts"] for x in lines if "3 hard timeouts in a row: unhealthy" in x["msg"]]
        (ended,) = [x["ts"] for x in lines if x["msg"].startswith("cool-down over")]
        (execution,) = await backends.jobs.list_executions(waiting)
        assert ended - began >= 4.0  # the whole cool-down ...
        assert execution.started_at >= ended - 0.05  # ... before the queued job was claimed (same host clock)
        last_hang = (await backends.jobs.list_executions(hangs[-1]))[0]
        assert last_hang.ended_at is not None and began <= last_hang.ended_at + 0.05  # unhealthy at the 3rd
    finally:
        worker.stop()


async def soft_timeouts(url: str, agent: str) -> float:
    """`tenure_soft_timeouts_total{agent}` as the worker's /metrics says now (0 before its first)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(url, timeout=10)).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tenure_soft_timeouts_total" and s.labels.get("agent") == agent:
                return float(s.value)
    return 0.0


async def test_past_its_p95_a_job_is_counted_as_a_soft_timeout_and_succeeds_and_past_twice_its_p99_it_is_cancelled(
    database_url: str, backends: Backends, tmp_path: Path
) -> None:
    # `sleep` declares timeout=3600 (the ceiling); a floor of 2 s lets 2 x p99 of quick runs cut a hang at 2 s.
    env = {"TENURE_HARD_TIMEOUT_FLOOR_S": "2", "TENURE_LOG_FORMAT": "json"}
    worker = WorkerProc(database_url, tmp_path, "w", concurrency=1, env=env, args=("--metrics-port", "0"))
    try:
        await only_worker(backends)
        found = await eventually(lambda: _metrics_url(worker), 20, "the worker to serve /metrics")
        for _ in range(25):  # the window learns the agent's normal duration (a soft timeout needs 20)
            assert await finished(backends, await submit(backends, "sleep", {"seconds": 0.01})) is JobState.SUCCEEDED
        before = await soft_timeouts(found, "sleep")  # a quick run may have crossed an early p95 already
        slow = await submit(backends, "sleep", {"seconds": 0.6, "every": 1})
        assert await finished(backends, slow) is JobState.SUCCEEDED  # not interrupted
        assert await soft_timeouts(found, "sleep") == before + 1  # once for the execution
        events = await backends.jobs.read_events(slow, None, 100)
        (soft,) = [e for e in events if e.type == "execution.soft_timeout"]
        assert soft.payload["elapsed_s"] >= soft.payload["threshold_s"] and events[-1].type == "job.succeeded"
        lines = [json.loads(x) for x in worker.log().splitlines() if x.startswith("{")]
        (line,) = [x for x in lines if x.get("job_id") == slow and "soft timeout" in x["msg"]]
        assert line["agent"] == "sleep" and line["elapsed_s"] >= line["threshold_s"]

        hang = (await Admission(backends.jobs, {}).admit(JobRequest("sleep", {"seconds": 60}, max_attempts=1))).job.id
        assert await finished(backends, hang) is JobState.DEAD  # well before its timeout=3600
        job = await backends.jobs.get_job(hang)
        assert job is not None and job.error_code == "timeout", job
        hard = re.search(r"ran longer than ([0-9.]+)s", job.error_message or "")
        assert hard is not None and 2.0 <= float(hard.group(1)) < 3600, job  # 2 x p99 within the floor and ceiling

        async def counted() -> bool:  # the health path counts it like any hard timeout (sent with a heartbeat)
            (w,) = await backends.jobs.list_workers()
            return w.consecutive_timeouts == 1

        await eventually(counted, 10, "the worker's record to count the hard timeout")
    finally:
        worker.stop()


async def _metrics_url(w: WorkerProc) -> str | None:
    found = re.search(r"metrics on (http://[0-9.]+:\d+/metrics)", w.log())
    return found.group(1) if found else None


async def test_a_worker_warming_up_claims_nothing_until_its_warmups_ran(
    database_url: str, backends: Backends, tmp_path: Path
) -> None:
    worker = WorkerProc(database_url, tmp_path, "warm", app="tests.apps.warm_app:app", env={"WARM_APP_SECONDS": "3"})
    failing = None
    try:
        (w,) = await eventually(backends.jobs.list_workers, 30, "the worker to register")
        assert w.state is WorkerState.WARMING
        job_id = await submit(backends, "echo", "warm")  # known from the registry: this test has no warm_app
        while (await backends.jobs.list_workers())[0].state is WorkerState.WARMING:
            job = await backends.jobs.get_job(job_id)
            assert job is not None and job.state is JobState.QUEUED and job.owner is None
            await asyncio.sleep(0.1)
        assert await finished(backends, job_id) is JobState.SUCCEEDED
        assert (await backends.jobs.list_workers())[0].state is WorkerState.ACTIVE
        assert "warm-up done" in worker.log()
        worker.signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 30) == 0
        # A warm-up that raises: the worker takes no job, leaves the registry and exits 1.
        # No worker serves echo now: accepted for one not up yet.
        queued = (await Admission(backends.jobs, {}).admit(JobRequest("echo", "never", allow_unregistered=True))).job.id
        failing = WorkerProc(database_url, tmp_path, "fail", app="tests.apps.warm_app:app", env={"WARM_APP_FAIL": "1"})
        assert await asyncio.to_thread(failing.wait, 30) == 1, failing.log()
        assert "warmup_failed" in failing.log() and "the model file is missing" in failing.log()
        job = await backends.jobs.get_job(queued)
        assert job is not None and job.state is JobState.QUEUED and job.owner is None
        assert all(w.state is WorkerState.GONE for w in await backends.jobs.list_workers(include_gone=True))
    finally:
        worker.stop()
        if failing is not None:
            failing.stop()


async def test_post_drain_needs_the_admin_key_and_tenure_up_does_not_restart_the_drained_worker(
    database_url: str, tmp_path: Path
) -> None:
    up = await asyncio.to_thread(Up, database_url, tmp_path, workers=2)
    try:
        async with httpx.AsyncClient(base_url=up.url, timeout=5) as c:
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            workers = (await c.get("/v1/workers", headers=admin)).json()["workers"]
            target = workers[0]["id"]
            url = f"/v1/workers/{target}/drain"
            assert (await c.post(url, headers=up.headers("tenant-a"))).status_code == 403
            assert (await c.post("/v1/workers/nobody/drain", headers=admin)).status_code == 404
            bad = await c.post(url, headers=admin, json={"timeout_s": -1})
            assert bad.status_code == 422 and "drain timeout" in bad.json()["detail"]
            assert (await c.post(url, headers=admin, json={"timeout": 1})).status_code == 422
            r = await c.post(url, headers=admin, json={"timeout_s": 5})
            assert r.status_code == 202 and r.json()["state"] == "draining" and r.json()["id"] == target

            async def live() -> list[str]:
                return [w["id"] for w in (await c.get("/v1/workers", headers=admin)).json()["workers"]]

            async def drained() -> bool:
                return target not in await live()

            await eventually(drained, 20, "the drained worker to leave the registry")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3.0:  # a restart would come after 0.5-1 s
                assert len(await live()) == 1, up.log()
                await asyncio.sleep(0.2)
        assert "drained and exited 0: not restarting it" in up.log()
    finally:
        await asyncio.to_thread(up.stop)


assert FAST["TENURE_HEARTBEAT_S"] == "0.3"  # the drain is read within one heartbeat
